"""FP8 under FSDP2: with the tensorwise recipe the converted weights are all-gathered in FP8 (torchao's
enable_fsdp_float8_all_gather), a tied head keeps the BF16 all-gather, and the loop precomputes the weights'
scales after every optimizer step. The wiring is checked on one CPU process; a 2-rank FSDP2 run with emulated
FP8 (tests/sharded_checkpoint_worker.py) checks the numbers. Real FP8 GEMMs need a GPU (tests/test_float8.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from redline.distributed import DistInfo
from redline.errors import UserError
from redline.model import GPT
from redline.presets import get_preset
from redline.training import checkpoint as ckpt_io
from redline.training import float8 as f8
from tests.test_float8 import CUDA, fake_gpu  # noqa: F401  (pretends a GPU of a given capability is present)
from tests.test_sharded_checkpoint import torchrun
from tests.test_train import config, dataset  # noqa: F401  (the session-scoped prepared corpus)


@pytest.fixture(autouse=True)
def need_torchao():
    pytest.importorskip("torchao.float8")


def small_model(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(replace(get_preset("tiny"), n_layer=2, n_embd=64, n_head=4, n_kv_head=2, vocab_size=256,
                       context_len=32, **overrides))


def weight_wrapper():
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    return WeightWithDynamicFloat8CastTensor


def test_config_has_the_flag_only_when_asked():
    assert f8._float8_config("tensorwise", emulate=False, fsdp_float8_all_gather=True).enable_fsdp_float8_all_gather
    assert not f8._float8_config("tensorwise", emulate=False).enable_fsdp_float8_all_gather
    config = f8._float8_config("tensorwise", emulate=True, fsdp_float8_all_gather=True)
    assert config.emulate and config.enable_fsdp_float8_all_gather
    with pytest.raises(UserError, match="needs fp8_recipe=tensorwise"):
        f8.convert_linears(small_model(), {"blocks.0.mlp.fc"}, "rowwise", fsdp_float8_all_gather=True)


@pytest.mark.parametrize("recipe, fsdp, all_gather", [
    ("tensorwise", True, True), ("tensorwise", False, False), ("rowwise", True, False),
])
def test_apply_float8_all_gathers_in_fp8_under_fsdp2_with_tensorwise(fake_gpu, recipe, fsdp, all_gather):  # noqa: F811
    fake_gpu(9, 0, "NVIDIA H100 80GB HBM3")  # the conversion itself runs anywhere; only the gate asks the GPU
    model = small_model(tie_embeddings=True)
    said: list[str] = []
    summary = f8.apply_float8(model, "all", recipe, CUDA, 64, warmup_steps=5, say=said.append, fsdp=fsdp)
    assert summary["fsdp_float8_all_gather"] is all_gather and model.redline_fp8_all_gather is all_gather
    assert "lm_head" in summary["layers"] and "blocks.0.attn.qkv" in summary["layers"]
    qkv = model.get_submodule("blocks.0.attn.qkv")
    assert isinstance(qkv.weight, weight_wrapper()) is all_gather
    assert qkv.config.enable_fsdp_float8_all_gather is all_gather
    # the tied head keeps the BF16 all-gather, so it stays the embedding's parameter
    assert model.lm_head.weight is model.wte.weight
    assert not model.lm_head.config.enable_fsdp_float8_all_gather
    assert not f8.float8_enabled(model)  # the BF16 warm-up still comes first
    assert any("all-gathers their weights in FP8" in line for line in said) is all_gather


def test_an_untied_head_all_gathers_in_fp8_too(fake_gpu):  # noqa: F811
    fake_gpu(9, 0)
    model = small_model(tie_embeddings=False)
    before = model.lm_head.weight
    f8.apply_float8(model, "all", "tensorwise", CUDA, 64, warmup_steps=0, say=lambda _: None, fsdp=True)
    assert isinstance(model.lm_head.weight, weight_wrapper()) and model.lm_head.weight is not before
    # checkpoints store the plain tensor inside the wrapper (the weight as it was), so they load without torchao
    assert f8.plain_weight(model.lm_head.weight) is before
    assert f8.plain_weight(model.wte.weight) is model.wte.weight


@pytest.mark.parametrize("parallel, world_size, fsdp", [("fsdp2", 2, True), ("ddp", 2, False), ("fsdp2", 1, False)])
def test_wrap_model_tells_the_converter_about_fsdp2(monkeypatch, parallel, world_size, fsdp):
    """The converter runs before FSDP2 wraps the model (wrap.py's fixed order) and is told it will be sharded."""
    from redline.config import TrainConfig
    from redline.training import wrap

    seen = {}

    def fake_apply_float8(model, mode, recipe, device, tokens, warmup, say, compiled=True, fsdp=False):
        seen["fsdp"] = fsdp
        return {"mode": "off", "recipe": recipe, "layers": [], "fsdp_float8_all_gather": False}

    monkeypatch.setattr(f8, "apply_float8", fake_apply_float8)
    monkeypatch.setattr(wrap, "apply_data_parallel", lambda model, *args, **kwargs: model)
    cfg = replace(TrainConfig(), parallel=parallel, compile=False, batch_size=2, seq_len=32)
    wrap.wrap_model(small_model(), cfg, torch.device("cpu"), DistInfo(rank=0, world_size=world_size))
    assert seen["fsdp"] is fsdp


def test_scales_are_precomputed_only_for_fp8_all_gather(monkeypatch):
    import torchao.float8

    calls = []
    monkeypatch.setattr(torchao.float8, "precompute_float8_dynamic_scale_for_fsdp", calls.append)
    model = small_model()
    f8.precompute_fsdp_float8_scales(model)  # no FP8 all-gather: nothing to do
    assert calls == []
    model.redline_fp8_all_gather = True
    f8.precompute_fsdp_float8_scales(model)
    assert calls == [model]


def test_the_loop_precomputes_after_every_optimizer_step(dataset, monkeypatch, tmp_path):  # noqa: F811
    import redline.training.loop as loop_mod

    steps = []
    real_set_lr = loop_mod.set_lr
    monkeypatch.setattr(loop_mod, "set_lr", lambda opts, m: (steps.append("lr"), real_set_lr(opts, m)))
    monkeypatch.setattr(loop_mod, "precompute_fsdp_float8_scales", lambda model: steps.append("scales"))
    loop_mod.train(config(dataset, tmp_path, "max_steps=3"))
    assert steps == ["lr", "scales"] * 3  # after each step's update, before the next step


@pytest.mark.slow
def test_fsdp2_float8_all_gather_on_two_ranks(tmp_path):
    """2 ranks, FSDP2, emulated tensorwise FP8 with the FP8 all-gather: the worker checks an FP8 step against one
    process (equal up to rounding), a BF16 step (from FP8-rounded weights: close), the precomputed scales; the
    sharded checkpoint it writes holds plain tensors that one process loads without torchao's subclass."""
    torchrun(2, "fp8", tmp_path)
    reference = torch.load(tmp_path / "reference.pt", weights_only=False)
    model, _, _ = ckpt_io.load_for_inference(tmp_path)
    for name, value in reference["model"].items():
        assert type(model.state_dict()[name]) is torch.Tensor and torch.equal(model.state_dict()[name], value), name


@pytest.mark.slow
def test_fsdp2_float8_all_gather_compiled_bf16_and_fp8_steps(tmp_path):
    """Compiled, the BF16 path of a layer whose weight FSDP2 gathers in FP8 (warm-up steps, evaluation) used to
    fail inside torchao while tracing; the worker checks BF16, FP8 and evaluation losses against eager."""
    torchrun(2, "fp8-compiled", tmp_path)
