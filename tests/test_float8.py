"""FP8 converter: hardware gating, clear errors, layer choice, conversion, the BF16/FP8 switch.

FP8 arithmetic runs on a CPU through torchao's emulation (emulate=True); real FP8 GEMMs are in the gpu tests."""

from __future__ import annotations

import copy
import sys
from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.model import GPT
from redline.presets import get_preset
from redline.training import float8 as f8

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
    assert f8.resolve_mode("auto", "tensorwise", cpu, say=said.append) == "off"
    assert said == ["fp8=auto: FP8 training needs a CUDA GPU; training in BF16"]


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
    assert f8.gemm_shape(model.lm_head, 4096) == (4096, 64, model.cfg.padded_vocab, False)


def test_auto_selects_only_layers_that_pay():
    model = small_model()
    shapes = {name: f8.gemm_shape(lin, 1024) for name, lin in f8.candidate_linears(model).items()}
    head = shapes["lm_head"]
    timings = {s: {"bf16_ms": 1.0, "fp8_ms": 1.25, "speedup": 0.8} for s in shapes.values()}
    timings[head] = {"bf16_ms": 1.3, "fp8_ms": 1.0, "speedup": 1.3}
    chosen, table = f8.select_layers(shapes, timings)
    assert chosen == {"lm_head"}
    row = next(r for r in table if (r["M"], r["K"], r["N"], r["bias"]) == head)
    assert row["fp8"] and row["layers"] == ["lm_head"]
    # a layer that merely breaks even stays in BF16
    timings[head] = {"bf16_ms": 1.02, "fp8_ms": 1.0, "speedup": 1.02}
    assert f8.select_layers(shapes, timings)[0] == set()


def test_benchmark_results_are_cached_per_gpu_and_shape(monkeypatch, tmp_path, fake_gpu):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    fake_gpu(9, 0, "NVIDIA H100 80GB HBM3")
    calls = []

    def fake_benchmark(shape, recipe, device, reps=20, compiled=True):
        calls.append(shape)
        return {"bf16_ms": 2.0, "fp8_ms": 1.0, "speedup": 2.0}

    monkeypatch.setattr(f8, "benchmark_shape", fake_benchmark)
    shapes = [(1024, 64, 256, False), (1024, 64, 256, False), (1024, 256, 64, False)]
    first = f8.benchmark_shapes(shapes, "tensorwise", CUDA, say=lambda m: None)
    assert calls == [(1024, 64, 256, False), (1024, 256, 64, False)]  # each distinct shape once
    assert {r["source"] for r in first.values()} == {"measured"}
    second = f8.benchmark_shapes(shapes, "tensorwise", CUDA, say=lambda m: None)
    assert len(calls) == 2 and {r["source"] for r in second.values()} == {"cache"}
    assert f8.cache_path().parent == tmp_path
    fake_gpu(9, 0, "NVIDIA H200")  # another GPU: measured again
    f8.benchmark_shapes(shapes[:1], "tensorwise", CUDA, say=lambda m: None)
    assert len(calls) == 3


def test_a_failed_measurement_keeps_that_shape_in_bf16(monkeypatch, tmp_path, fake_gpu):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    fake_gpu(9, 0)

    def broken(shape, recipe, device, reps=20, compiled=True):
        raise RuntimeError("triton compile failed\nlong traceback")

    monkeypatch.setattr(f8, "benchmark_shape", broken)
    said = []
    result = f8.benchmark_shapes([(1024, 64, 256, False)], "tensorwise", CUDA, say=said.append)
    (entry,) = result.values()
    assert entry["speedup"] == 0.0 and entry["source"] == "failed" and "triton compile failed" in entry["error"]
    assert "stays BF16" in said[-1]
    assert not f8.cache_path().exists() or "1024" not in f8.cache_path().read_text()  # failures are not cached


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
        with f8.float8_disabled(fp8):
            off = fp8(x, y)
        on = fp8(x, y)
    assert torch.equal(ref, off)
    assert not torch.equal(ref, on)  # FP8 rounding changes the numbers a little...
    assert abs(on.item() - ref.item()) < 0.05 * ref.item()  # ...but not the loss


def test_warmup_switch_turns_fp8_on_once(need_torchao):
    model = small_model()
    f8.convert_linears(model, {"lm_head", "blocks.0.attn.qkv"}, emulate=True, enabled=False)
    assert not f8.float8_enabled(model)
    switched = [f8.set_float8_for_step(model, step, warmup_steps=3) for step in range(6)]
    assert switched == [False, False, False, True, False, False]
    assert f8.float8_enabled(model)
    with f8.float8_disabled(model):
        assert not f8.float8_enabled(model)
    assert f8.float8_enabled(model)
    assert f8.set_float8_for_step(small_model(), 10, 3) is False  # no FP8 layers: nothing to do


def test_auto_step_check_verdict_and_revert(need_torchao):
    """fp8=auto keeps FP8 only when the whole step got faster; a reverted run (or one resumed from a checkpoint
    that holds that verdict) stays in BF16 past the warm-up."""
    assert f8.step_verdict(100.0, 90.0)["kept"] and f8.step_verdict(100.0, 90.0)["speedup"] == pytest.approx(100 / 90)
    assert not f8.step_verdict(100.0, 106.0)["kept"]
    assert not f8.step_verdict(100.0, 100.0)["kept"]  # breaking even is not paying
    assert "turned back off" in f8.describe_verdict(f8.step_verdict(100.0, 106.0))

    model = small_model()
    f8.convert_linears(model, {"lm_head"}, emulate=True, enabled=False)
    check = f8.StepCheck(model, "auto", warmup_steps=3, device=torch.device("cpu"))
    assert not check.active  # the timing needs CUDA events
    check.restore(f8.step_verdict(100.0, 106.0))
    assert [f8.set_float8_for_step(model, step, warmup_steps=3) for step in range(6)] == [False] * 6
    assert not f8.float8_enabled(model)

    kept = small_model()
    f8.convert_linears(kept, {"lm_head"}, emulate=True, enabled=False)
    f8.StepCheck(kept, "auto", 3, torch.device("cpu")).restore(f8.step_verdict(100.0, 90.0))
    assert f8.set_float8_for_step(kept, 3, warmup_steps=3) and f8.float8_enabled(kept)


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


def test_apply_float8_off_and_on_cpu_change_nothing():
    model = small_model()
    said = []
    summary = f8.apply_float8(model, "auto", "tensorwise", torch.device("cpu"), 1024, 100, say=said.append)
    assert summary["mode"] == "off" and summary["layers"] == []
    assert not f8.fp8_layers(model)
    assert f8.apply_float8(model, "off", "tensorwise", torch.device("cpu"), 1024, 100)["mode"] == "off"


# ----------------------------------------------------------------------------------------------------
# GPU


@pytest.mark.parametrize("chunk", [0, 64])
def test_chunked_loss_keeps_the_head_out_of_fp8(need_torchao, monkeypatch, chunk):
    """With model.ce_chunk_tokens the loss computes the head itself: fp8 must not convert it (the conversion only
    is checked here; FP8 kernels need a GPU)."""
    monkeypatch.setattr(f8, "unsupported_reason", lambda recipe, device: None)
    torch.manual_seed(0)
    model = GPT(replace(get_preset("tiny"), n_layer=2, ce_chunk_tokens=chunk))
    said = []
    summary = f8.apply_float8(model, "all", "tensorwise", torch.device("cpu"), 1024, 100, say=said.append)
    assert ("lm_head" in summary["layers"]) == (chunk == 0) and len(summary["layers"]) > 1
    assert any("head stays BF16" in line for line in said) == (chunk > 0)


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
    summary = f8.apply_float8(model, "all", "tensorwise", device, 8 * 256, warmup_steps=0)
    assert summary["layers"]
    x = torch.randint(0, 4096, (8, 256), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.compile(model)(x, x)
    loss.backward()
    assert torch.isfinite(loss)
