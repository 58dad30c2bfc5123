"""FP8 under FSDP2: with the tensorwise recipe the converted weights are all-gathered in FP8 (torchao's
enable_fsdp_float8_all_gather), a tied head keeps the BF16 all-gather, and the converter precomputes the weights'
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
from redline.converters import float8 as f8
from tests.test_float8 import CUDA, fake_gpu  # noqa: F401  (pretends a GPU of a given capability is present)
from tests.test_sharded_checkpoint import torchrun


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


def converter(fake_gpu, recipe: str = "tensorwise", fsdp: bool = True, warmup_steps: int = 5,  # noqa: F811
              said: list | None = None) -> f8.Float8Converter:
    fake_gpu(9, 0, "NVIDIA H100 80GB HBM3")  # the conversion itself runs anywhere; only the gate asks the GPU
    return f8.Float8Converter("all", recipe, CUDA, tokens=64, warmup_steps=warmup_steps, fsdp=fsdp,
                              say=(said.append if said is not None else lambda _: None))


@pytest.mark.parametrize("recipe, fsdp, all_gather", [
    ("tensorwise", True, True), ("tensorwise", False, False), ("rowwise", True, False),
])
def test_the_converter_all_gathers_in_fp8_under_fsdp2_with_tensorwise(fake_gpu, recipe, fsdp, all_gather):  # noqa: F811
    model = small_model(tie_embeddings=True)
    said: list[str] = []
    conv = converter(fake_gpu, recipe, fsdp, said=said)
    conv.convert(model)
    assert conv.all_gather is all_gather and conv.describe()["fsdp_float8_all_gather"] is all_gather
    assert "lm_head" in conv.layer_names and "blocks.0.attn.qkv" in conv.layer_names
    qkv = model.get_submodule("blocks.0.attn.qkv")
    assert isinstance(qkv.weight, weight_wrapper()) is all_gather
    assert qkv.config.enable_fsdp_float8_all_gather is all_gather
    # the tied head keeps the BF16 all-gather, so it stays the embedding's parameter
    assert model.lm_head.weight is model.wte.weight
    assert not model.lm_head.config.enable_fsdp_float8_all_gather
    assert not f8.float8_enabled(model)  # the BF16 warm-up still comes first
    assert any("all-gathers their weights in FP8" in line for line in said) is all_gather


def test_an_untied_head_all_gathers_in_fp8_too(fake_gpu):  # noqa: F811
    model = small_model(tie_embeddings=False)
    before = model.lm_head.weight
    converter(fake_gpu, warmup_steps=0).convert(model)
    assert isinstance(model.lm_head.weight, weight_wrapper()) and model.lm_head.weight is not before
    # checkpoints store the plain tensor inside the wrapper (the weight as it was), so they load without torchao
    assert f8.plain_weight(model.lm_head.weight) is before
    assert f8.plain_weight(model.wte.weight) is model.wte.weight


@pytest.mark.parametrize("parallel, world_size, fsdp", [("fsdp2", 2, True), ("ddp", 2, False), ("fsdp2", 1, False)])
def test_the_converter_is_told_about_fsdp2_and_converts_before_it(monkeypatch, parallel, world_size, fsdp):
    """build_converters tells the FP8 converter whether the model will be sharded, and wrap.py converts before
    FSDP2 wraps the model (its fixed order)."""
    from redline.config import TrainConfig
    from redline.converters import build_converters
    from redline.training import wrap

    order = []

    class Recording:
        name = "fp8"

        def __init__(self, mode, recipe, device, *, fsdp, **kwargs):
            order.append(("built", fsdp))

        def convert(self, model):
            order.append("convert")

        def describe(self):
            return {}

    monkeypatch.setattr(f8, "Float8Converter", Recording)
    monkeypatch.setattr(wrap, "apply_data_parallel", lambda model, *args, **kwargs: order.append("parallel") or model)
    cfg = replace(TrainConfig(), parallel=parallel, compile=False, batch_size=2, seq_len=32, fp8="all")
    info = DistInfo(rank=0, world_size=world_size)
    converters = build_converters(cfg, torch.device("cpu"), info)
    wrap.wrap_model(small_model(), cfg, torch.device("cpu"), info, converters)
    assert order == [("built", fsdp), "convert", "parallel"]


@pytest.mark.parametrize("fsdp", [False, True])
def test_scales_are_precomputed_after_each_optimizer_step_only_for_fp8_all_gather(fake_gpu, monkeypatch, fsdp):  # noqa: F811
    import torchao.float8

    calls = []
    monkeypatch.setattr(torchao.float8, "precompute_float8_dynamic_scale_for_fsdp", calls.append)
    model = small_model()
    conv = converter(fake_gpu, fsdp=fsdp, warmup_steps=0)
    conv.convert(model)
    for step in range(3):
        conv.before_step(step)
        assert conv.after_optimizer_step(step) is None
    assert calls == ([model] * 3 if fsdp else [])


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
