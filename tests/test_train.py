"""The training loop end to end on CPU: loss falls, exact resume, signals, non-finite losses, bad input."""

import copy
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from redline import cli
from redline.config import TrainConfig, parse
from redline.errors import UserError
from redline.training import checkpoint as ckpt_io
from redline.training.loop import train

WORDS = ("the model reads tokens and predicts the next one while the loss falls slowly over many steps "
         "a kernel schedules threads on every core and the dictionary defines each word with care").split()


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> Path:
    """~120 KB of word salad in 40 documents, prepared with the byte tokenizer."""
    from redline.data.prepare import prepare
    from redline.tokenizer import load_tokenizer

    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    texts = root / "texts"
    texts.mkdir()
    for i in range(40):
        (texts / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(500)) + ".\n")
    out = root / "shards"
    prepare([str(texts)], out, load_tokenizer("bytes"), val_fraction=0.1, num_workers=1)
    return out


def config(dataset: Path, tmp_path: Path, *extra: str) -> TrainConfig:
    argv = [f"data.path={dataset}", f"out_dir={tmp_path / 'runs'}", "run_name=t", "model.n_layer=2",
            "model.n_embd=64", "model.n_head=4", "model.n_kv_head=2", "model.context_len=64", "batch_size=4",
            "seq_len=32", "max_steps=12", "eval_every=0", "eval_batches=2", "log_every=3", "sample_tokens=0",
            "tensorboard=False", "optim.warmup_steps=2", *extra]
    return parse(TrainConfig, argv, prog="t", description="t")


def train_losses(run_dir: Path) -> dict[int, float]:
    losses = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "train":
            losses[record["step"]] = record["loss"]
    return losses


def test_loss_falls_and_run_dir_is_complete(dataset, tmp_path):
    result = train(config(dataset, tmp_path, "max_steps=40", "optim.lr=3e-3", "tensorboard=True",
                          "sample_tokens=20", "eval_every=20"))
    assert result.status == "completed" and result.step == 40
    losses = train_losses(result.run_dir)
    assert sorted(losses) == list(range(1, 41))  # every step recorded
    assert sum(list(losses.values())[-5:]) / 5 < sum(list(losses.values())[:5]) / 5 - 0.5
    for name in ("config.json", "environment.json", "metrics.jsonl", "tokenizer"):
        assert (result.run_dir / name).exists(), name
    assert any((result.run_dir / "tensorboard").iterdir())
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [20, 40]
    assert evals[-1]["bpb"] < evals[0]["bpb"] and 0 < evals[-1]["bpb"] < 8
    assert result.sample is not None and len(result.sample) > 0
    env = json.loads((result.run_dir / "environment.json").read_text())
    assert env["torch"] == torch.__version__
    assert ckpt_io.list_checkpoints(result.run_dir)[-1].name == "step_00000040"


def test_profile_steps_records_kernel_time_without_changing_training(dataset, tmp_path, capsys):
    """profile_steps=2 after 3 steps: a `profile` record of steps 4-5 (kernel time by kind, here the operators'
    CPU time), each process's trace and summary under profile/; the losses are those of the same run unprofiled.
    A run that ends inside its profiled steps reports the ones it ran."""
    from redline.bench.profile import GROUP_NAMES

    plain = train(config(dataset, tmp_path / "plain", "max_steps=6"))
    result = train(config(dataset, tmp_path / "profiled", "max_steps=6", "profile_from=3", "profile_steps=2"))
    assert train_losses(result.run_dir) == train_losses(plain.run_dir)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    (profile,) = [r for r in records if r["kind"] == "profile"]
    assert (profile["first_step"], profile["step"], profile["steps"]) == (4, 5, 2)
    assert set(profile["groups_ms_per_step"]) == set(GROUP_NAMES) and profile["groups_ms_per_step"]["gemm"] > 0
    assert (result.run_dir / "profile" / "trace-rank0.json.gz").stat().st_size > 0
    assert json.loads((result.run_dir / "profile" / "rank0.json").read_text())["steps"] == 2
    assert "profile of steps 4-5" in capsys.readouterr().out

    cut = train(config(dataset, tmp_path / "cut", "max_steps=4", "profile_from=3", "profile_steps=5"))
    records = [json.loads(line) for line in (cut.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["first_step"], r["step"], r["steps"]) for r in records if r["kind"] == "profile"] == [(4, 4, 1)]


def train_stopped_at(cfg, step: int, monkeypatch):
    """train(cfg) stopped by a real SIGTERM during step `step` (it finishes the step, saves, and exits) -> its
    result, checked to be interrupted there."""
    import redline.training.step as step_mod

    real_set_lr, calls = step_mod.set_lr, {"n": 0}

    def set_lr_then_signal(optimizers, multiplier):
        real_set_lr(optimizers, multiplier)
        calls["n"] += 1
        if calls["n"] == step:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(step_mod, "set_lr", set_lr_then_signal)
    try:
        result = train(cfg)
    finally:
        monkeypatch.setattr(step_mod, "set_lr", real_set_lr)
    assert result.status == "interrupted" and result.step == step
    return result


@pytest.mark.parametrize("extra", [(), ("optim.name=muon", "tokens_per_step=256", "model.dropout=0.1"),
                                   ("batch_ramp_steps=9", "batch_ramp_multiple=1"),  # resumed mid-ramp
                                   ("seq_ramp_steps=9", "seq_ramp_start=8"),
                                   ("fp8_head=True", "fp8_warmup_steps=8")])  # FP8 from step 8: amaxes from before the stop
def test_exact_resume(dataset, tmp_path, extra, monkeypatch):
    straight = train(config(dataset, tmp_path / "a", *extra))
    # the same run, stopped by a real SIGTERM during step 6 (it finishes the step, saves, and exits)
    first = train_stopped_at(config(dataset, tmp_path / "b", *extra), 6, monkeypatch)
    # the second half: the same config (max_steps=12) resumed from the step-6 checkpoint
    second = train(config(dataset, tmp_path / "b", *extra), resume_from=ckpt_io.list_checkpoints(first.run_dir)[-1])
    assert second.step == 12
    a, b = train_losses(straight.run_dir), train_losses(second.run_dir)
    assert a == b  # bit-for-bit equal on CPU


def _cli_run(dataset, out_dir, max_steps: int) -> list[str]:
    """`redline train` arguments of a one-layer run named r under out_dir."""
    return [f"data.path={dataset}", f"out_dir={out_dir}", "run_name=r", "model.n_layer=1", "model.n_embd=32",
            "model.n_head=2", "model.context_len=32", "batch_size=2", "seq_len=16", f"max_steps={max_steps}",
            "eval_batches=1", "sample_tokens=0", "tensorboard=False"]


def test_resume_through_cli_uses_saved_config(dataset, tmp_path, capsys):
    base = _cli_run(dataset, tmp_path, 4)
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", *base])
    assert exc.value.code == 0
    # resume with a larger budget; the model options are not repeated and come from the checkpoint
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "--resume", f"out_dir={tmp_path}", "run_name=r", "max_steps=6"])
    assert exc.value.code == 0
    losses = train_losses(tmp_path / "r")
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert "resumed from" in capsys.readouterr().out


def test_resume_with_another_architecture_names_the_settings(dataset, tmp_path, capsys):
    base = _cli_run(dataset, tmp_path, 2)
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", *base])
    assert exc.value.code == 0
    metrics = (tmp_path / "r" / "metrics.jsonl").read_text()
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "--resume", f"out_dir={tmp_path}", "run_name=r", "max_steps=4", "model.n_layer=2",
                  "model.n_embd=48", "model.dropout=0.1"])  # dropout changes no weight: not named
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "model.n_layer (checkpoint 1, now 2), model.n_embd (checkpoint 32, now 48)" in err and "dropout" not in err
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == metrics  # the run is untouched
    assert [p.name for p in ckpt_io.list_checkpoints(tmp_path / "r")] == ["step_00000002"]


def test_sigterm_saves_checkpoint_and_resume_finishes(dataset, tmp_path):
    args = [sys.executable, "-m", "redline", "train", f"data.path={dataset}", f"out_dir={tmp_path}", "run_name=s",
            "model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.context_len=64", "batch_size=4",
            "seq_len=32", "max_steps=100000", "log_every=1", "eval_batches=1", "sample_tokens=0", "tensorboard=False"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    metrics = tmp_path / "s" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size > 0):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out  # as an interrupted shell command: `redline train ... && next` stops
    assert "checkpoint saved" in out
    saved = ckpt_io.list_checkpoints(tmp_path / "s")
    assert len(saved) == 1
    step = json.loads((saved[0] / "meta.json").read_text())["step"]
    assert step > 0
    end = [json.loads(line) for line in metrics.read_text().splitlines()][-1]
    assert end["event"] == "end" and end["status"] == "interrupted"


@pytest.mark.parametrize("fused,optimizer", [(False, "adamw"), (True, "adamw"), (True, "muon")],
                         ids=["host-check", "fused-adamw-on-device", "muon-and-fused-adamw-on-device"])
def test_nonfinite_losses_are_skipped_then_stop(dataset, tmp_path, monkeypatch, capsys, fused, optimizer):
    """For-each AdamW: the host checks every step. Fused AdamW (the GPU default; on the CPU too), and Muon beside
    it: the update is skipped on the device and the host reads the flags at log / checkpoint steps (log_every=3,
    checkpoint_every=2: steps 2, 3, 4, 6, 8, ...), so the run stops at the same step."""
    from redline.model import GPT
    from redline.training.optim import skips_on_device

    cfg = config(dataset, tmp_path, "max_steps=20", "checkpoint_every=2", "max_bad_steps=3", f"optim.fused={fused}",
                 f"optim.name={optimizer}")
    checked = []
    real_skips = skips_on_device
    monkeypatch.setattr("redline.training.step.skips_on_device", lambda opts: checked.append(real_skips(opts)) or checked[-1])
    real_forward = GPT.forward
    calls = {"n": 0}

    def poisoned(self, idx, targets=None, reduction="mean"):
        out = real_forward(self, idx, targets, reduction)
        if targets is not None and self.training:
            calls["n"] += 1
            if calls["n"] == 3 or calls["n"] >= 6:  # one isolated bad step, then bad for good
                return out * float("nan")
        return out

    monkeypatch.setattr(GPT, "forward", poisoned)
    result = train(cfg)
    assert result.status == "diverged"
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    bad = [r["step"] for r in records if r.get("event") == "nonfinite_loss"]
    assert bad == [3, 6, 7, 8]
    assert result.step == 8
    # the last good checkpoint (step 4; step 6 and later were bad, and nothing was saved after) is intact
    last = ckpt_io.list_checkpoints(result.run_dir)[-1]
    assert last.name == "step_00000004"
    ckpt_io.verify_checkpoint(last)
    assert "non-finite losses in a row" in capsys.readouterr().out
    assert checked == [fused]


def test_full_disk_while_saving_leaves_previous_checkpoint(dataset, tmp_path, monkeypatch):
    import errno

    first = train(config(dataset, tmp_path, "max_steps=2"))
    previous = ckpt_io.list_checkpoints(first.run_dir)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt_io.torch, "save", full)
    with pytest.raises(UserError, match="disk full"):
        train(config(dataset, tmp_path, "max_steps=4"), resume_from=previous[-1])
    assert ckpt_io.list_checkpoints(first.run_dir) == previous
    assert not list((first.run_dir / "checkpoints").glob(".tmp-*"))
    ckpt_io.verify_checkpoint(previous[-1])


def test_corrupted_checkpoint_is_refused(dataset, tmp_path):
    result = train(config(dataset, tmp_path, "max_steps=2"))
    ckpt = ckpt_io.list_checkpoints(result.run_dir)[-1]
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(UserError, match="corrupted"):
        train(config(dataset, tmp_path, "max_steps=4"), resume_from=ckpt)
    weights.write_bytes(bytes(data[:100]))  # truncated
    with pytest.raises(UserError, match="corrupted"):
        ckpt_io.load_for_inference(ckpt)


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (("data.path=/nonexistent/corpus",), "does not exist"),
        (("tokens_per_step=1000",), "not a multiple"),
        (("max_steps=0",), "no budget"),
    ],
)
def test_bad_input(dataset, tmp_path, extra, fragment):
    with pytest.raises(UserError, match=fragment):
        train(config(dataset, tmp_path, *extra))


def test_empty_data_folder(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = parse(TrainConfig, [f"data.path={empty}", f"out_dir={tmp_path}", "max_steps=1"], prog="t", description="t")
    with pytest.raises(UserError):
        train(cfg)


def test_eval_and_sample_commands(dataset, tmp_path, capsys):
    result = train(config(dataset, tmp_path, "max_steps=3"))
    with pytest.raises(SystemExit) as exc:
        cli.main(["eval", "--checkpoint", str(result.run_dir), "--batches", "2", "--batch-size", "2"])
    assert exc.value.code == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    record = json.loads(last)
    assert record["bpb"] > 0 and record["perplexity"] > 1 and "kv_cache" not in record
    # the same split scored token by token through the KV-cache engine, with the model's-dtype cache and an FP8 one
    with pytest.raises(SystemExit) as exc:
        cli.main(["eval", "--checkpoint", str(result.run_dir), "--batches", "1", "--batch-size", "2",
                  "--kv-cache-dtypes", "auto", "fp8", "--kv-batches", "1", "--decode-from", "5"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    auto, fp8 = json.loads(out.strip().splitlines()[-1])["kv_cache"]
    assert auto["kv_cache_dtype"] == "auto" and auto["tokens"] == fp8["tokens"] == 2 * (32 - 5)  # seq_len 32
    # the cached path of the model's own dtype (fp32 here) is the full forward, up to float rounding
    assert abs(auto["loss_increase"]) < 1e-4 and auto["top1_agreement"] == 1.0
    assert abs(fp8["loss_full_forward"] - auto["loss_full_forward"]) < 1e-9
    assert fp8["loss"] != auto["loss"] and abs(fp8["loss_increase"]) < 0.05 and fp8["top1_agreement"] > 0.9
    assert fp8["kv_bytes_per_token"] < auto["kv_bytes_per_token"] / 3  # fp8 against fp32, plus the scales
    assert "same next token as the full forward" in out
    with pytest.raises(SystemExit) as exc:
        cli.main(["sample", "--checkpoint", str(result.run_dir), "--prompt", "the", "--num-samples", "2",
                  "--max-new-tokens", "8"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.count("--- sample") == 2


@pytest.mark.slow
def test_embedded_default_end_to_end(tmp_path, monkeypatch):
    """`redline train` with no data: the embedded corpus, a trained tokenizer, falling loss, a sample."""
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    cfg = parse(TrainConfig, [f"out_dir={tmp_path}", "max_steps=30", "eval_every=15", "sample_tokens=30",
                              "log_every=5"], prog="t", description="t")
    assert cfg.preset == "tiny"
    result = train(cfg)
    losses = list(train_losses(result.run_dir).values())
    assert result.status == "completed"
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    assert result.sample and result.sample.startswith("The")


@pytest.mark.parametrize("fused", [False, True])
def test_step_if_finite_skips_the_whole_update(fused):
    """A non-finite step leaves weights, moments and the step count as they were, on either path."""
    from redline.training.optim import step_if_finite

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1, weight_decay=0.1, fused=fused)

    def one_step(scale: float) -> torch.Tensor:
        loss = lin(torch.randn(5, 4)).square().mean() * scale
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(lin.parameters(), 1.0)
        bad = step_if_finite([opt], loss.detach(), norm)
        opt.zero_grad(set_to_none=True)
        return bad

    assert one_step(1.0).item() == 0.0
    before = copy.deepcopy(lin.state_dict()), copy.deepcopy(opt.state_dict()["state"])
    assert one_step(float("nan")).item() == 1.0
    after = lin.state_dict(), opt.state_dict()["state"]
    for name, value in before[0].items():
        assert torch.equal(after[0][name], value)
    for key, state in before[1].items():
        for name, value in state.items():
            assert torch.equal(after[1][key][name], value), name
    assert one_step(1.0).item() == 0.0
    assert not torch.equal(lin.weight, before[0]["weight"])
