"""The one training step: its batch plan, the config it is built from (resolved copies, never the caller's), the
converter protocol around each step, objectives with their own batches and metrics, and the fit probe and
batch_size=auto on top of it."""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import replace

import pytest
import torch

from redline import converters as conv_mod
from redline.config import TrainConfig, parse
from redline.distributed import DistInfo
from redline.errors import UserError
from redline.training import checkpoint as ckpt_io
from redline.training.loop import train
from redline.training.step import BatchPlan, TrainStep, plan_batches, resolve_batch_size, with_vocab_size
from tests.test_train import config, dataset, train_losses  # noqa: F401  (the session-scoped prepared corpus)

CPU = torch.device("cpu")


def tiny(*extra: str) -> TrainConfig:
    return parse(TrainConfig, ["--preset", "tiny", "model.n_layer=2", "model.n_embd=64", "model.n_head=4",
                               "model.n_kv_head=2", "model.vocab_size=256", "batch_size=2", "seq_len=16",
                               "compile=False", *extra], prog="t", description="t")


def random_batches(n: int, vocab: int = 256, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        tokens = torch.randint(0, vocab, (2, 17), generator=g)
        yield tokens[:, :-1], tokens[:, 1:]


# ----------------------------------------------------------------------------------------------------
# the batch plan


def test_tokens_per_step_is_the_global_batch():
    plan = plan_batches(tiny("tokens_per_step=256"), world_size=2)
    assert plan == BatchPlan(micro_batch=2, seq_len=16, accum=4, world_size=2)
    assert plan.tokens_per_micro_step == 32 and plan.tokens_per_step == 256
    assert plan_batches(tiny(), world_size=4).tokens_per_step == 2 * 16 * 4  # 0: one micro-batch per process
    with pytest.raises(UserError, match=r"not a multiple of batch_size × seq_len × world_size = 64; use 256"):
        plan_batches(tiny("tokens_per_step=250"), world_size=2)
    with pytest.raises(UserError, match="must be resolved"):
        plan_batches(tiny("batch_size=auto"), world_size=1)


def test_resolved_configs_are_copies():
    cfg = tiny("batch_size=auto", "tokens_per_step=96")
    before = copy.deepcopy(cfg)
    seen = []

    def search(probe_cfg, device):
        seen.append(probe_cfg.batch_size)
        return 5  # 96 tokens = 6 sequences of 16: the largest divisor of 6 up to 5 is 3

    resolved = resolve_batch_size(with_vocab_size(cfg, 300), CPU, DistInfo(), search)
    assert resolved.batch_size == 3 and resolved.model.vocab_size == 300
    assert seen == [1]  # the search builds its probe at a micro-batch of 1, never at "auto"
    assert cfg == before  # the caller's config is untouched
    numbered = tiny()
    assert resolve_batch_size(numbered, CPU, search=lambda c, d: 1 / 0) is numbered  # a number needs no search
    with pytest.raises(UserError, match="not even a micro-batch of 1 fits"):
        resolve_batch_size(cfg, CPU, search=lambda c, d: None)
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        resolve_batch_size(cfg, CPU)  # the real search measures GPU memory


def test_train_with_batch_size_auto_builds_nothing_with_auto(dataset, tmp_path, monkeypatch):  # noqa: F811
    """batch_size=auto is resolved before anything is built: the fit search's real probe (training steps on the
    CPU, a fake memory model standing in for the GPU's) and the run itself only ever see numbers."""
    from redline.training import fit, wrap
    from tests.test_fit import GIB, FakeGPU

    widths = []
    real_wrap = wrap.wrap_model

    def recording_wrap(model, cfg, *args, **kwargs):
        widths.append(cfg.batch_size)
        return real_wrap(model, cfg, *args, **kwargs)

    monkeypatch.setattr(wrap, "wrap_model", recording_wrap)
    monkeypatch.setattr("redline.training.step.wrap_model", recording_wrap)

    def search(cfg, device):
        probe = fit.TrainingStepProbe(cfg, device, steps=1)
        gpu = FakeGPU(base=GIB, per_sequence=GIB, capacity=5 * GIB)  # up to 4 sequences fit

        def run(batch):
            probe(batch)  # real steps at this micro-batch
            return gpu.run(batch)

        try:
            return fit.search_max_batch(run, 5 * GIB, fit.batch_grid(8), gpu.free).batch_size
        finally:
            probe.close()

    cfg = config(dataset, tmp_path, "batch_size=auto", "tokens_per_step=384", "max_steps=2")
    result = train(cfg, batch_search=search)
    assert result.status == "completed" and cfg.batch_size == "auto"
    assert widths and all(isinstance(w, int) for w in widths), widths
    saved = json.loads((result.run_dir / "config.json").read_text())
    assert saved["batch_size"] == 4 and saved["tokens_per_step"] == 384  # 12 sequences of 32: 4 × 3 accumulation


def test_train_leaves_the_callers_config_alone(dataset, tmp_path):  # noqa: F811
    cfg = config(dataset, tmp_path, "max_steps=1")
    before = copy.deepcopy(cfg)
    result = train(cfg)
    assert cfg == before  # the data's vocabulary went into a copy
    assert json.loads((result.run_dir / "config.json").read_text())["model"]["vocab_size"] != before.model.vocab_size


# ----------------------------------------------------------------------------------------------------
# the converter protocol


class Recording:
    """A converter that records its hooks: the protocol as the step drives it."""

    name = "recording"

    def __init__(self, calls: list):
        self.calls, self.state, self.off = calls, {"seen": 0}, False

    def convert(self, model):
        self.calls.append("convert")
        self.model = model

    def before_step(self, step):
        self.calls.append(("before", step))
        return {"event": "recorded", "step": step, "message": f"before step {step}"} if step == 1 else None

    def after_optimizer_step(self, step):
        self.calls.append(("after", step))
        self.state["seen"] += 1
        return None

    @contextlib.contextmanager
    def disabled(self):
        self.off = True
        try:
            yield
        finally:
            self.off = False

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.calls.append(("loaded", state))
        self.state = dict(state)

    def describe(self):
        return {"seen": self.state["seen"]}


@pytest.fixture
def recording(monkeypatch):
    calls: list = []
    built: list[Recording] = []

    def factory(cfg, context):
        built.append(Recording(calls))
        return built[-1]

    monkeypatch.setitem(conv_mod.REGISTRY, "recording", factory)
    return calls, built


def test_the_step_drives_the_converters_around_each_optimizer_step(recording):
    calls, built = recording
    step = TrainStep(tiny("tokens_per_step=64"), CPU)
    (opt,) = step.optimizers
    real_step = opt.step
    opt.step = lambda *a, **k: (calls.append("optimizer"), real_step(*a, **k))[1]
    assert step.wrapped.decisions["converters"] == {"recording": {"seen": 0}}
    batches = random_batches(4)
    outputs = [step.step(batches, 1.0) for _ in range(2)]  # accumulation 2: the iterable is read 2 at a time
    assert calls == ["convert", ("before", 0), "optimizer", ("after", 0), ("before", 1), "optimizer", ("after", 1)]
    assert outputs[0].events == [] and outputs[1].events[0]["event"] == "recorded"
    assert all(o.loss.shape == () and o.skipped.item() == 0.0 for o in outputs)
    with step.evaluation() as model:
        assert built[0].off and not model.training
    assert not built[0].off and step.model.training
    assert step.state_dict()["converters"] == {"recording": {"seen": 2}} and step.state_dict()["steps_done"] == 2
    with pytest.raises(ValueError, match="takes 2 micro-batches"):
        step.step(random_batches(1), 1.0)


def test_the_converters_state_goes_through_checkpoints(dataset, tmp_path, recording):  # noqa: F811
    calls, built = recording
    first = train(config(dataset, tmp_path, "max_steps=3"))
    state = ckpt_io.load_state(ckpt_io.list_checkpoints(first.run_dir)[-1])
    assert state["train_step"]["converters"] == {"recording": {"seen": 3}}
    train(config(dataset, tmp_path, "max_steps=5"), resume_from=ckpt_io.list_checkpoints(first.run_dir)[-1])
    assert ("loaded", {"seen": 3}) in calls and built[-1].state == {"seen": 5}
    records = [json.loads(line) for line in (first.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("event") == "recorded"] == [1]  # the hooks' events are logged


def test_a_checkpoint_of_the_old_layout_resumes(dataset, tmp_path):  # noqa: F811
    """state.pt from before the step had its own state: the step count and fp8=auto's verdict at the top level."""
    first = train(config(dataset, tmp_path, "max_steps=2"))
    ckpt = ckpt_io.list_checkpoints(first.run_dir)[-1]
    state = ckpt_io.load_state(ckpt)
    state["fp8_auto_check"] = state.pop("train_step")["converters"].get("fp8")
    torch.save(state, ckpt / "state.pt")
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["sha256"]["state.pt"] = ckpt_io._sha256(ckpt / "state.pt")
    (ckpt / "meta.json").write_text(json.dumps(meta))
    second = train(config(dataset, tmp_path, "max_steps=4"), resume_from=ckpt)
    assert second.step == 4 and sorted(train_losses(second.run_dir)) == [1, 2, 3, 4]


# ----------------------------------------------------------------------------------------------------
# objectives


class MaskedObjective:
    """An objective of another shape: dict batches, a loss over the tokens a mask keeps, and a metric."""

    name = "masked"

    def __init__(self):
        self.attached = None

    def attach(self, step):
        self.attached = step

    def compute(self, model, batch):
        logits = model(batch["inputs"])  # (B, T, vocab)
        per_token = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), batch["targets"],
                                                      reduction="none")  # (B, T)
        mask = batch["mask"].float()
        return (per_token * mask).sum() / mask.sum(), {"kept_tokens": mask.sum()}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_clipping_folded_into_the_update_equals_clipping_the_gradients(optimizer):
    """With fused AdamW and with Muon the step clips by handing the optimizers the clip's factor (grad_scale), not
    by a pass of clip_grad_norm_ over the gradients: the same weights, steps that clip and steps that do not."""
    args = ("optim.fused=True", f"optim.name={optimizer}", "optim.grad_clip=0.5", "optim.lr=1e-3")
    torch.manual_seed(0)
    folded = TrainStep(tiny(*args), CPU)
    torch.manual_seed(0)
    plain = TrainStep(tiny(*args), CPU)
    assert folded.fold_clip
    plain.fold_clip = False
    for opt in folded.optimizers + plain.optimizers:  # Muon's iteration in float32: bf16 would amplify one ulp
        opt.ns_dtype = torch.float32
    norms = []
    for batch in zip(random_batches(6), random_batches(6)):
        a, b = folded.step(iter([batch[0]]), 1.0), plain.step(iter([batch[1]]), 1.0)
        torch.testing.assert_close(a.grad_norm, b.grad_norm)
        norms.append(float(a.grad_norm))
    for p, q in zip(folded.model.parameters(), plain.model.parameters()):
        torch.testing.assert_close(p, q)
    assert max(norms) > 0.5  # some step was clipped: the factor mattered


def test_an_objective_brings_its_own_batches_and_metrics():
    objective = MaskedObjective()
    step = TrainStep(tiny("tokens_per_step=64"), CPU, objective=objective)
    assert objective.attached is step
    batches = []
    for i, (x, y) in enumerate(random_batches(2)):
        mask = torch.zeros_like(y)
        mask[:, : 4 * (i + 1)] = 1  # 8 tokens kept in the first micro-batch, 16 in the second
        batches.append({"inputs": x, "targets": y, "mask": mask})
    out = step.step(batches, 1.0)
    assert torch.isfinite(out.loss) and out.metrics["kept_tokens"].item() == pytest.approx(12.0)  # averaged


# ----------------------------------------------------------------------------------------------------
# fit on top of the step


def test_the_fit_probe_measures_fp8_when_asked(monkeypatch):
    """`redline fit fp8=all` probes FP8 steps: the converter is on from the probe's first step (FP8 emulated on
    this CPU; the GPU gate is passed by hand)."""
    pytest.importorskip("torchao.float8")
    from redline.converters import float8 as f8
    from redline.training.fit import TrainingStepProbe

    monkeypatch.setattr(f8, "unsupported_reason", lambda recipe, device: None)
    real_convert = f8.convert_linears
    monkeypatch.setattr(f8, "convert_linears", lambda *a, **k: real_convert(*a, **{**k, "emulate": True}))
    probe = TrainingStepProbe(tiny("fp8=all", "precision=bf16"), CPU, steps=2)
    assert f8.fp8_layers(probe.model)
    seen = []
    probe.model.lm_head.register_forward_hook(lambda module, args, out: seen.append(module.fp8_enabled))
    peak, tokens_per_second = probe(2)
    assert seen == [True, True] and tokens_per_second > 0
    probe.close()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_train_with_batch_size_auto_on_a_gpu(dataset, tmp_path, capsys):  # noqa: F811
    """The real path of batch_size=auto (issue: the string "auto" reached the attention-backend timing and ended in
    a torch.randn TypeError): `redline train` on CUDA with the fit search measuring real GPU memory, the SDPA
    backends timed at start-up (attn_autotune, model.attn_backend=auto) and torch.compile on, as a user runs it."""
    from redline import cli

    argv = ["train", f"data.path={dataset}", f"out_dir={tmp_path / 'runs'}", "run_name=auto", "device=cuda",
            "batch_size=auto", "tokens_per_step=4096", "seq_len=64", "model.context_len=64", "model.n_layer=2",
            "model.n_embd=128", "model.n_head=4", "model.n_kv_head=2", "max_steps=3", "eval_every=0",
            "eval_batches=1", "sample_tokens=0", "tensorboard=False", "memory_fraction=0.5"]
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    assert exc.value.code == 0, out.err
    run = tmp_path / "runs" / "auto"
    saved = json.loads((run / "config.json").read_text())
    batch = saved["batch_size"]
    assert isinstance(batch, int) and batch >= 1 and saved["tokens_per_step"] == 4096
    assert 4096 % (batch * 64) == 0  # whole micro-batches, gradient accumulation making up the rest
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps and steps[-1] == 3 and ckpt_io.list_checkpoints(run)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_warm_step_never_waits_for_the_device(optimizer):
    """Fused AdamW and Muon skip a non-finite update on the device, so a step (forward, backward, clipping, the
    optimizer, two micro-steps) makes no call that waits for the device once compiled (torch's sync debug mode
    raises on one): a wait would let the device idle while the host launches the next step."""
    cuda = torch.device("cuda")
    step = TrainStep(tiny("tokens_per_step=64", f"optim.name={optimizer}", "compile=True"), cuda)
    batches = iter([(x.to(cuda), y.to(cuda)) for x, y in random_batches(6)])  # on the device before the check
    for _ in range(2):  # compiles (and Muon's update per shape)
        step.step(batches, 1.0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = step.step(batches, 1.0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out.loss) and out.skipped.item() == 0.0
