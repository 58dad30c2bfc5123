"""FP8 converter: hardware gating, clear errors, layer choice, conversion, the BF16/FP8 switch, its state.

FP8 arithmetic runs on a CPU through torchao's emulation (emulate=True); real FP8 GEMMs are in the gpu tests."""

from __future__ import annotations

import copy
import sys
from dataclasses import replace

import pytest
import torch

from redline.converters import build_converters
from redline.converters import float8 as f8
from redline.converters import float8_auto as auto
from redline.errors import UserError
from redline.model import GPT
from redline.presets import get_preset

CUDA = torch.device("cuda", 0)


def small_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    cfg = replace(get_preset("tiny"), n_layer=2, n_embd=64, n_head=4, n_kv_head=2, vocab_size=256, context_len=32,
                  **overrides)
    return GPT(cfg)


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (2, 33), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend a CUDA GPU of a given compute capability is present (only the queries the gating makes)."""

    def set_capability(major: int, minor: int, name: str = "NVIDIA Test GPU"):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)

    return set_capability


# ----------------------------------------------------------------------------------------------------
# where FP8 can run


def test_cpu_refuses_all_and_auto_falls_back():
    cpu = torch.device("cpu")
    assert f8.resolve_mode("off", "tensorwise", cpu) == "off"
    with pytest.raises(UserError, match="fp8=all: FP8 training needs a CUDA GPU"):
        f8.resolve_mode("all", "tensorwise", cpu)
    said = []
    assert f8.resolve_mode("auto", "tensorwise", cpu, say=said.append, fallback="float32") == "off"
    assert said == ["fp8=auto: FP8 training needs a CUDA GPU; training in float32"]


@pytest.mark.parametrize("precision, trains_in", [("auto", "float32"), ("bf16", "BF16")])
def test_auto_on_a_cpu_names_the_precision_it_really_trains_in(precision, trains_in):
    """fp8=auto falls back to the run's own precision: float32 on a CPU unless bf16 is asked for."""
    from redline.config import TrainConfig

    cfg = TrainConfig(fp8="auto", precision=precision, batch_size=2, seq_len=16)
    said: list[str] = []
    converters = build_converters(cfg, torch.device("cpu"), say=said.append)
    assert said == [f"fp8=auto: FP8 training needs a CUDA GPU; training in {trains_in}"]
    assert converters.describe()["fp8"]["mode"] == "off"
    model = small_model()
    converters.convert(model)
    assert not f8.fp8_layers(model)


def test_old_gpu_is_told_fp8_is_unsupported(fake_gpu):
    fake_gpu(8, 0, "NVIDIA A100-SXM4-80GB")
    reason = f8.unsupported_reason("tensorwise", CUDA)
    assert "not supported on this GPU" in reason and "8.0" in reason and "8.9" in reason
    with pytest.raises(UserError, match="not supported on this GPU"):
        f8.resolve_mode("all", "tensorwise", CUDA)
    said = []
    assert f8.resolve_mode("auto", "tensorwise", CUDA, say=said.append) == "off"
    assert "training in BF16" in said[0]


@pytest.mark.parametrize("capability, recipe, supported", [
    ((8, 9), "tensorwise", True), ((8, 9), "rowwise", False), ((9, 0), "rowwise", True),
    ((9, 0), "mxfp8", False), ((9, 0), "nvfp4", False), ((10, 0), "mxfp8", True), ((12, 0), "tensorwise", True),
])
def test_recipe_capabilities(fake_gpu, capability, recipe, supported):
    fake_gpu(*capability)
    reason = f8.unsupported_reason(recipe, CUDA)
    assert (reason is None) == supported
    if not supported:
        assert f"fp8_recipe={recipe} is not supported on this GPU" in reason


def test_mx_recipes_on_hopper_say_so_instead_of_crashing(fake_gpu):
    fake_gpu(9, 0, "NVIDIA H100 80GB HBM3")
    for recipe in ("mxfp8", "nvfp4"):
        with pytest.raises(UserError, match="needs 10.0 or newer"):
            f8.resolve_mode("all", recipe, CUDA)


def test_nvfp4_on_blackwell_is_refused_as_not_implemented(fake_gpu):
    fake_gpu(10, 0, "NVIDIA B200")
    with pytest.raises(UserError, match="nvfp4 is not implemented"):
        f8.resolve_mode("auto", "nvfp4", CUDA)


def test_unknown_recipe():
    with pytest.raises(UserError, match="fp8_recipe must be one of"):
        f8.unsupported_reason("fp4", torch.device("cpu"))


def test_missing_torchao_says_how_to_install(monkeypatch, fake_gpu):
    fake_gpu(9, 0)
    monkeypatch.setitem(sys.modules, "torchao", None)  # makes `import torchao` raise ImportError
    with pytest.raises(UserError, match="pip install torchao"):
        f8.require_torchao()
    with pytest.raises(UserError, match="pip install torchao"):
        f8.resolve_mode("auto", "tensorwise", CUDA)


# ----------------------------------------------------------------------------------------------------
# which layers


def test_candidates_include_the_head_and_skip_odd_sizes():
    model = small_model()
    names = set(f8.candidate_linears(model))
    assert "lm_head" in names
    assert {"blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.fc", "blocks.0.mlp.proj"} <= names
    odd = small_model(mlp_hidden=72)  # 72 is a multiple of 8, not of 16
    odd_names = set(f8.candidate_linears(odd))
    assert "blocks.0.mlp.proj" not in odd_names and "blocks.0.mlp.fc" in odd_names  # fc: 64 -> 144 = 9·16
    assert "blocks.0.mlp.fc" not in f8.candidate_linears(odd, "mxfp8")  # mxfp8 needs multiples of 32


def test_gemm_shape():
    model = small_model()
    assert auto.gemm_shape(model.lm_head, 4096) == (4096, 64, model.cfg.padded_vocab, False)


def test_auto_selects_only_layers_that_pay():
    model = small_model()
    shapes = {name: auto.gemm_shape(lin, 1024) for name, lin in f8.candidate_linears(model).items()}
    head = shapes["lm_head"]
    timings = {s: {"bf16_ms": 1.0, "fp8_ms": 1.25, "speedup": 0.8} for s in shapes.values()}
    timings[head] = {"bf16_ms": 1.3, "fp8_ms": 1.0, "speedup": 1.3}
    chosen, table = auto.select_layers(shapes, timings)
    assert chosen == {"lm_head"}
    row = next(r for r in table if (r["M"], r["K"], r["N"], r["bias"]) == head)
    assert row["fp8"] and row["layers"] == ["lm_head"]
    # a layer that merely breaks even stays in BF16
    timings[head] = {"bf16_ms": 1.02, "fp8_ms": 1.0, "speedup": 1.02}
    assert auto.select_layers(shapes, timings)[0] == set()


def test_benchmark_results_are_cached_per_gpu_and_shape(monkeypatch, tmp_path, fake_gpu):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    fake_gpu(9, 0, "NVIDIA H100 80GB HBM3")
    calls = []

    def fake_benchmark(shape, recipe, device, reps=20, compiled=True):
        calls.append(shape)
        return {"bf16_ms": 2.0, "fp8_ms": 1.0, "speedup": 2.0}

    monkeypatch.setattr(auto, "benchmark_shape", fake_benchmark)
    shapes = [(1024, 64, 256, False), (1024, 64, 256, False), (1024, 256, 64, False)]
    first = auto.benchmark_shapes(shapes, "tensorwise", CUDA, say=lambda m: None)
    assert calls == [(1024, 64, 256, False), (1024, 256, 64, False)]  # each distinct shape once
    assert {r["source"] for r in first.values()} == {"measured"}
    second = auto.benchmark_shapes(shapes, "tensorwise", CUDA, say=lambda m: None)
    assert len(calls) == 2 and {r["source"] for r in second.values()} == {"cache"}
    assert auto.cache_path().parent == tmp_path
    fake_gpu(9, 0, "NVIDIA H200")  # another GPU: measured again
    auto.benchmark_shapes(shapes[:1], "tensorwise", CUDA, say=lambda m: None)
    assert len(calls) == 3


def test_a_failed_measurement_keeps_that_shape_in_bf16(monkeypatch, tmp_path, fake_gpu):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    fake_gpu(9, 0)

    def broken(shape, recipe, device, reps=20, compiled=True):
        raise RuntimeError("triton compile failed\nlong traceback")

    monkeypatch.setattr(auto, "benchmark_shape", broken)
    said = []
    result = auto.benchmark_shapes([(1024, 64, 256, False)], "tensorwise", CUDA, say=said.append)
    (entry,) = result.values()
    assert entry["speedup"] == 0.0 and entry["source"] == "failed" and "triton compile failed" in entry["error"]
    assert "stays BF16" in said[-1]
    assert not auto.cache_path().exists() or "1024" not in auto.cache_path().read_text()  # failures are not cached


# ----------------------------------------------------------------------------------------------------
# conversion and the switch (emulated FP8 on the CPU)


@pytest.fixture
def need_torchao():
    pytest.importorskip("torchao.float8")


def test_conversion_keeps_parameters_and_names(need_torchao):
    model = small_model()
    params = {name: p for name, p in model.named_parameters()}
    keys = list(model.state_dict())
    converted = f8.convert_linears(model, {"lm_head", "blocks.1.mlp.fc"}, emulate=True)
    assert converted == ["blocks.1.mlp.fc", "lm_head"]
    assert list(model.state_dict()) == keys
    assert all(params[name] is p for name, p in model.named_parameters())
    assert type(model.lm_head).__name__ == "SwitchableFloat8Linear"
    plain = small_model(seed=3)
    plain.load_state_dict(model.state_dict())  # checkpoints of an FP8 run load into a plain model


def test_switch_off_is_exactly_bf16_and_on_is_close(need_torchao):
    plain = small_model()
    fp8 = copy.deepcopy(plain)
    f8.convert_linears(fp8, set(f8.candidate_linears(fp8)), emulate=True)
    x, y = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = plain(x, y)
        f8.set_float8_enabled(fp8, False)
        off = fp8(x, y)
        f8.set_float8_enabled(fp8, True)
        on = fp8(x, y)
    assert torch.equal(ref, off)
    assert not torch.equal(ref, on)  # FP8 rounding changes the numbers a little...
    assert abs(on.item() - ref.item()) < 0.05 * ref.item()  # ...but not the loss


def converter(fake_gpu, mode: str = "all", warmup_steps: int = 3, **kwargs) -> f8.Float8Converter:
    """An FP8 converter that passes the GPU gate on this CPU (the conversion runs anywhere; FP8 is emulated)."""
    fake_gpu(9, 0, "NVIDIA H100 80GB HBM3")
    return f8.Float8Converter(mode, "tensorwise", CUDA, tokens=64, warmup_steps=warmup_steps, emulate=True,
                              say=lambda message: None, **kwargs)


def test_warmup_switch_turns_fp8_on_once(need_torchao, fake_gpu):
    model = small_model()
    attributes = set(vars(model))
    conv = converter(fake_gpu)
    conv.convert(model)
    assert conv.layer_names == sorted(f8.candidate_linears(model)) and not f8.float8_enabled(model)
    events = [conv.before_step(step) for step in range(6)]
    assert [e["event"] if e else None for e in events] == [None, None, None, "fp8_on", None, None]
    assert "FP8 on" in events[3]["message"] and f8.float8_enabled(model)
    with conv.disabled():
        assert not f8.float8_enabled(model)
        assert conv.before_step(6) is None and not f8.float8_enabled(model)  # a step inside stays BF16
    assert f8.float8_enabled(model)
    assert set(vars(model)) == attributes  # the converter's state lives on the converter, not on the model


def test_auto_converts_what_pays_and_its_step_verdict_reverts(need_torchao, fake_gpu, monkeypatch):
    """fp8=auto converts only the layers measured faster, and keeps FP8 only when the whole step got faster; a
    run resumed from a checkpoint that holds the verdict stays in BF16 past the warm-up (or switches, if kept)."""
    assert auto.step_verdict(100.0, 90.0)["kept"] and auto.step_verdict(100.0, 90.0)["speedup"] == pytest.approx(100 / 90)
    assert not auto.step_verdict(100.0, 106.0)["kept"]
    assert not auto.step_verdict(100.0, 100.0)["kept"]  # breaking even is not paying
    assert "turned back off" in auto.describe_verdict(auto.step_verdict(100.0, 106.0))

    def timings(shapes, recipe, device, say, compiled):
        return {s: {"bf16_ms": 2.0, "fp8_ms": 1.0 if s[2] == 256 else 4.0, "speedup": 2.0 if s[2] == 256 else 0.5,
                    "source": "measured"} for s in shapes}

    monkeypatch.setattr(auto, "benchmark_shapes", timings)
    model = small_model()
    conv = converter(fake_gpu, "auto")
    conv.convert(model)
    assert conv.layer_names == ["lm_head"]  # the only shape with N = 256 (the padded vocabulary)
    assert conv.check is None  # the whole-step timing needs CUDA events and a warm-up of CHECK_STEPS
    verdict = conv.decide([100.0] * 8, [106.0] * 8)
    assert not verdict["kept"] and conv.reverted
    assert [conv.before_step(step) for step in range(6)] == [None] * 6 and not f8.float8_enabled(model)
    state = conv.state_dict()

    resumed = converter(fake_gpu, "auto")
    resumed_model = small_model()
    resumed.convert(resumed_model)
    resumed.load_state_dict(state)
    assert [resumed.before_step(step) for step in range(6)] == [None] * 6
    assert not f8.float8_enabled(resumed_model)

    kept = converter(fake_gpu, "auto")
    kept_model = small_model()
    kept.convert(kept_model)
    kept.load_state_dict({"verdict": auto.step_verdict(100.0, 90.0)})
    assert kept.before_step(3)["event"] == "fp8_on" and f8.float8_enabled(kept_model)
    assert kept.describe()["auto_check"]["kept"]


def test_step_check_times_either_side_of_the_switch():
    check = auto.StepCheck(warmup_steps=10, steps=3)
    assert list(check.windows["bf16"]) == [7, 8, 9] and list(check.windows["fp8"]) == [11, 12, 13]


def test_emulated_fp8_training_learns(need_torchao):
    model = small_model()
    f8.convert_linears(model, set(f8.candidate_linears(model)), emulate=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = batch()
    losses = []
    for _ in range(15):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.5  # memorising one batch


def test_emulated_mxfp8_conversion_runs(need_torchao):
    pytest.importorskip("torchao.prototype.moe_training.mxfp8_linear")
    model = small_model()
    assert f8.convert_linears(model, {"lm_head"}, "mxfp8", emulate=True) == ["lm_head"]
    x, y = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x, y)
    loss.backward()
    assert torch.isfinite(loss) and model.lm_head.weight.grad is not None


def test_tied_head_stays_tied(need_torchao):
    model = small_model(tie_embeddings=True)
    f8.convert_linears(model, {"lm_head"}, emulate=True)
    assert model.lm_head.weight is model.wte.weight


def test_fp8_off_builds_no_converter():
    from redline.config import TrainConfig

    assert build_converters(TrainConfig(batch_size=2, seq_len=16), torch.device("cpu")).items == []


# ----------------------------------------------------------------------------------------------------
# GPU


@pytest.mark.parametrize("chunk", [0, 64])
def test_chunked_loss_keeps_the_head_out_of_fp8(need_torchao, fake_gpu, chunk):
    """With model.ce_chunk_tokens the loss computes the head itself: fp8 must not convert it (the conversion only
    is checked here; FP8 kernels need a GPU)."""
    from redline.config import TrainConfig

    fake_gpu(9, 0)
    cfg = TrainConfig(model=replace(get_preset("tiny"), n_layer=2, ce_chunk_tokens=chunk), fp8="all", batch_size=2,
                      seq_len=16)
    said = []
    converters = build_converters(cfg, CUDA, say=said.append)
    torch.manual_seed(0)
    converters.convert(GPT(cfg.model))
    layers = converters.describe()["fp8"]["layers"]
    assert ("lm_head" in layers) == (chunk == 0) and len(layers) > 1
    assert any("lm_head stays BF16" in line for line in said) == (chunk > 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_fp8_step_on_gpu(need_torchao):
    device = torch.device("cuda")
    if f8.unsupported_reason("tensorwise", device):
        pytest.skip("this GPU has no FP8")
    torch.manual_seed(0)
    cfg = replace(get_preset("tiny"), n_layer=2, vocab_size=4096, context_len=256)
    with device:
        model = GPT(cfg)
    conv = f8.Float8Converter("all", "tensorwise", device, tokens=8 * 256, warmup_steps=0)
    conv.convert(model)
    assert conv.layer_names and f8.float8_enabled(model)
    x = torch.randint(0, 4096, (8, 256), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.compile(model)(x, x)
    loss.backward()
    assert torch.isfinite(loss)
