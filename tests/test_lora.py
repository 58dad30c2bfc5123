"""LoRA and QLoRA (redline/converters/lora.py, redline/training/adapters.py): what trains, merging, NF4 numerics
against a dequantized reference, checkpoints that hold the adapters alone, exact resume, and one-line errors."""

import json

import pytest
import torch
import torch.nn as nn

from redline.config import TrainConfig, from_dict, parse
from redline.converters.lora import LoRAConverter, LoRALinear, dequantize, lora_layers, nf4_block_sizes, to_nf4
from redline.errors import UserError
from redline.model import GPT, ModelConfig
from redline.training import checkpoint as ckpt_io
from redline.training.loop import train
from tests.test_train import config, dataset, train_losses, train_stopped_at  # noqa: F401 (dataset is a fixture)

TINY = ModelConfig(vocab_size=96, context_len=32, n_layer=2, n_embd=64, n_head=4, n_kv_head=2)


def adapted(quantize="none", rank=4, **kw) -> tuple[GPT, LoRAConverter]:
    torch.manual_seed(0)
    model = GPT(TINY)
    converter = LoRAConverter(rank, 8.0, 0.0, ("attn.*", "mlp.*"), quantize, say=lambda m: None, **kw)
    converter.convert(model)
    with torch.no_grad():  # B starts at zero: give the adapters something to add
        for layer in lora_layers(model).values():
            layer.lora_B.normal_(0, 0.05)
    return model, converter


def test_only_adapters_and_train_modules_get_gradients():
    model, _ = adapted(train_modules=("wte",))
    idx = torch.randint(0, 96, (2, 16))
    model(idx, idx).backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == {n for n, _ in model.named_parameters() if n.endswith(("lora_A", "lora_B"))} | {"wte.weight"}
    assert all(not p.requires_grad for n, p in model.named_parameters()
               if not n.endswith(("lora_A", "lora_B")) and n != "wte.weight")
    assert len(lora_layers(model)) == 2 * 4  # per block: attention's qkv and proj, the MLP's fc and proj
    assert isinstance(model.blocks[0].attn.qkv, LoRALinear) and isinstance(model.blocks[0].mlp.fc, nn.Linear)


def test_merged_equals_unmerged_and_disabled_is_the_base():
    torch.manual_seed(0)
    base = GPT(TINY)
    model, converter = adapted()
    model.load_state_dict(base.state_dict(), strict=False)  # same base weights as `base`
    idx = torch.randint(0, 96, (2, 16))
    with torch.no_grad():
        unmerged = model(idx)
        converter.merge()
        merged = model(idx)
        converter.unmerge()
        again = model(idx)
        with converter.disabled():
            off = model(idx)
    torch.testing.assert_close(merged, unmerged, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(again, unmerged, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(off, base(idx).detach())
    assert (unmerged - off).abs().max() > 1e-3  # the adapters do change the model


def test_nf4_round_trip_error_bound_and_block_sizes():
    torch.manual_seed(0)
    w = torch.randn(576, 576)  # 5184 blocks of 64: torchao's default scale group of 256 does not divide it
    assert nf4_block_sizes((576, 576)) == (64, 216)
    back = dequantize(to_nf4(w))
    assert back.shape == w.shape
    err = (back - w).abs().view(-1, 64)
    absmax = w.abs().view(-1, 64).amax(dim=1, keepdim=True)
    # the widest gap between NF4 levels is 1 - 0.723 of the block's absmax (half of it: 0.139), and the block's
    # scale itself is stored in int8 around the mean of its group (double quantization): within 0.16 in all
    assert (err <= 0.16 * absmax).all()
    assert (back - w).pow(2).mean().sqrt() < 0.1 * w.std()


def assert_matches_reference(q: LoRALinear, ref: LoRALinear) -> None:
    """An NF4-based adapted layer against its reference on the dequantized weight: output, input and adapter
    gradients of a (4, 10, 128) input."""
    x = torch.randn(4, 10, 128, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    out, out_ref = q(x), ref(x_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    out_ref.backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(q.lora_A.grad, ref.lora_A.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(q.lora_B.grad, ref.lora_B.grad, atol=1e-5, rtol=1e-5)


def test_qlora_forward_and_backward_match_a_dequantized_reference():
    torch.manual_seed(0)
    linear = nn.Linear(128, 192)
    q = LoRALinear.from_linear(linear, 8, 16.0, 0.0, torch.float32, "nf4", "q")
    ref = LoRALinear.from_linear(linear, 8, 16.0, 0.0, torch.float32, "none", "ref")
    with torch.no_grad():
        ref.weight.copy_(dequantize(q.weight))
        q.lora_B.normal_(0, 0.1)
        ref.lora_A.copy_(q.lora_A)
        ref.lora_B.copy_(q.lora_B)
    assert_matches_reference(q, ref)
    assert q.weight.grad is None
    with pytest.raises(UserError, match="NF4 base cannot take the adapters"):
        q.merge()


@pytest.mark.parametrize("extra, fragment", [
    (("lora.enabled=True", "init_from=x", "lora.rank=0"), "lora.rank must be a positive integer"),
    (("lora.quantize=nf4",), "NF4 pretraining is not possible"),
    (("lora.enabled=True",), "give its checkpoint with init_from"),
])
def test_bad_config_one_line(extra, fragment):
    with pytest.raises(UserError, match=fragment) as e:
        parse(TrainConfig, list(extra), prog="t", description="t")
    assert "\n" not in str(e.value)


def test_bad_targets_and_nf4_shapes_one_line():
    with pytest.raises(UserError, match="match no Linear layer") as e:
        LoRAConverter(4, 8.0, 0.0, ("attention.*",), say=lambda m: None).convert(GPT(TINY))
    assert "\n" not in str(e.value) and "blocks.0.attn.qkv" in str(e.value)
    # a typo beside a pattern that matches: named, not silently left out
    with pytest.raises(UserError, match="'mlp.down_proj' matches no Linear layer"):
        LoRAConverter(4, 8.0, 0.0, ("attn.qkv", "mlp.down_proj"), say=lambda m: None).convert(GPT(TINY))
    with pytest.raises(UserError, match="'lmhead' matches no module"):
        LoRAConverter(4, 8.0, 0.0, ("attn.*",), train_modules=("wte", "lmhead"), say=lambda m: None).convert(GPT(TINY))
    odd = nn.Sequential(nn.Linear(36, 20))  # 720 weights: not whole blocks of 64
    with pytest.raises(UserError, match="not a multiple of NF4's block of 64") as e:
        LoRAConverter(4, 8.0, 0.0, ("0",), "nf4", say=lambda m: None).convert(odd)
    assert "\n" not in str(e.value)



def test_a_tied_head_stays_tied_on_a_base_built_in_host_memory():
    """A LoRA run builds its base on the meta device and materialises it with to_empty() (training/loop.py's
    new_model), which gives each module's parameter its own tensor: a tied head (SmolLM2, Qwen3-0.6B, the gpt2
    presets) came out an uninitialised copy that loading wte did not fill, and the run trained on garbage logits."""
    from dataclasses import replace

    from redline.training.loop import new_model

    cfg = TrainConfig(model=replace(TINY, tie_embeddings=True))
    model = new_model(cfg, torch.device("cpu"), on_host=True)
    assert model.lm_head.weight is model.wte.weight
    LoRAConverter(4, 8.0, 0.0, ("attn.*", "mlp.*"), "none", say=lambda m: None, device=torch.device("cpu")
                  ).convert(model)
    assert model.lm_head.weight is model.wte.weight
    assert model.num_params() == sum(p.numel() for p in GPT(cfg.model).parameters()) + sum(
        p.numel() for n, p in model.named_parameters() if "lora_" in n)

@pytest.fixture(scope="module")
def base_checkpoint(dataset, tmp_path_factory):  # noqa: F811
    return train(config(dataset, tmp_path_factory.mktemp("base"), "max_steps=2")).checkpoint


@pytest.mark.parametrize("quantize", ["none", "nf4"])
def test_lora_run_saves_adapters_alone_and_loads_merged(dataset, base_checkpoint, tmp_path, quantize):  # noqa: F811
    result = train(config(dataset, tmp_path, f"init_from={base_checkpoint}", "lora.enabled=True", "lora.rank=4",
                          f"lora.quantize={quantize}", "max_steps=3", "eval_batches=1"))
    ckpt = result.checkpoint
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["lora_base"]["path"] == str(base_checkpoint.resolve())
    from safetensors.torch import load_file

    saved = load_file(str(ckpt / "model.safetensors"))
    assert saved and all(k.endswith(("lora_A", "lora_B")) for k in saved)
    # the merged model (what eval, generate and export load) gives the loss the run measured with its adapters
    model, tokenizer, cfg = ckpt_io.load_for_inference(ckpt)
    assert type(model.blocks[0].attn.qkv) is nn.Linear  # a plain model: merged
    base_model, _, _ = ckpt_io.load_for_inference(base_checkpoint)
    delta = (model.blocks[0].attn.qkv.weight - base_model.blocks[0].attn.qkv.weight).abs().max()
    assert delta > 0
    assert result.final_eval["loss"] == pytest.approx(_val_loss(model, dataset, cfg), rel=1e-4)


def test_a_lora_run_trains_its_adapters_with_adamw_where_muon_is_asked(dataset, base_checkpoint, tmp_path,  # noqa: F811
                                                                       capsys):
    """Muon (the modern presets' default, or a Muon-trained base's) is for whole matrices: a LoRA run says it uses
    AdamW for its rank-r factors and records that in its config, so a resume keeps it."""
    result = train(config(dataset, tmp_path, f"init_from={base_checkpoint}", "lora.enabled=True", "lora.rank=2",
                          "optim.name=muon", "max_steps=1", "eval_batches=1"))
    assert "LoRA trains its adapters with AdamW" in capsys.readouterr().err
    saved = json.loads((result.checkpoint.parent.parent / "config.json").read_text())
    assert saved["optim"]["name"] == "adamw"


def _val_loss(model, dataset, cfg) -> float:  # noqa: F811
    from redline.data.loader import TokenLoader

    loader = TokenLoader(dataset, "val", cfg.batch_size, cfg.effective_seq_len, prefetch=False)
    (x, y), = list(loader.eval_batches(1))
    with torch.no_grad():
        return float(model(x, y))


@pytest.mark.parametrize("quantize", ["none", pytest.param("nf4", marks=pytest.mark.slow)])
def test_lora_resume_is_exact(dataset, base_checkpoint, tmp_path, monkeypatch, quantize):  # noqa: F811
    extra = (f"init_from={base_checkpoint}", "lora.enabled=True", "lora.rank=4", "lora.dropout=0.1", "max_steps=4",
             f"lora.quantize={quantize}")
    straight = train(config(dataset, tmp_path / "a", *extra))
    first = train_stopped_at(config(dataset, tmp_path / "b", *extra), 2, monkeypatch)
    last = ckpt_io.list_checkpoints(first.run_dir)[-1]
    saved = from_dict(TrainConfig, ckpt_io.load_config_dict(last))  # as `redline train --resume` does
    second = train(saved, resume_from=last)
    assert second.step == 4
    assert train_losses(straight.run_dir) == train_losses(second.run_dir)


def test_moved_base_is_a_one_line_error(dataset, base_checkpoint, tmp_path):  # noqa: F811
    import shutil

    base = tmp_path / "base"
    shutil.copytree(base_checkpoint, base)
    result = train(config(dataset, tmp_path, f"init_from={base}", "lora.enabled=True", "lora.rank=2", "max_steps=1"))
    shutil.rmtree(base)
    with pytest.raises(UserError, match="which is not there") as e:
        ckpt_io.load_for_inference(result.checkpoint)
    assert "\n" not in str(e.value)


def test_resume_with_other_lora_setting_is_a_one_line_error(dataset, base_checkpoint, tmp_path):  # noqa: F811
    result = train(config(dataset, tmp_path, f"init_from={base_checkpoint}", "lora.enabled=True", "lora.rank=2",
                          "max_steps=1"))
    saved = from_dict(TrainConfig, ckpt_io.load_config_dict(result.checkpoint))
    saved.lora.enabled, saved.max_steps = False, 2
    with pytest.raises(UserError, match="is from a LoRA run and this run has lora.enabled=False") as e:
        train(saved, resume_from=result.checkpoint)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="fp8 with lora.enabled is not supported"):
        parse(TrainConfig, ["lora.enabled=True", "init_from=x", "fp8=all"], prog="t", description="t")


@pytest.mark.parametrize("quantize", ["none", "nf4"])
def test_bf16_base_under_autocast_as_on_a_gpu(quantize):
    """The GPU path: the frozen weight in bf16 (or NF4 from bf16), computed under bf16 autocast; outside autocast
    (sampling without it) the layer still takes and returns fp32."""
    torch.manual_seed(0)
    linear = nn.Linear(128, 64)
    layer = LoRALinear.from_linear(linear, 8, 16.0, 0.0, torch.bfloat16, quantize, "l")
    ref = LoRALinear.from_linear(linear, 8, 16.0, 0.0, torch.float32, "none", "ref")
    with torch.no_grad():
        layer.lora_B.normal_(0, 0.1)
        ref.weight.copy_(dequantize(layer.weight).float())
        ref.bias.copy_(layer.bias.float())
        ref.lora_A.copy_(layer.lora_A)
        ref.lora_B.copy_(layer.lora_B)
    x = torch.randn(3, 128)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    expected = ref(x)
    torch.testing.assert_close(out.float(), expected, atol=0.05, rtol=0.02)
    assert layer.lora_A.grad is not None and layer.lora_A.grad.dtype == torch.float32
    plain = layer(x)  # no autocast: fp32 in, fp32 out
    assert plain.dtype == torch.float32
    torch.testing.assert_close(plain, expected.detach(), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("quantize", ["none", "nf4"])
def test_adapted_layer_traces_as_one_graph(quantize):
    """torch.compile (on by default on GPUs) takes the adapted layer whole, NF4 dequantization included."""
    torch.manual_seed(0)
    layer = LoRALinear.from_linear(nn.Linear(128, 64), 8, 16.0, 0.0, torch.float32, quantize, "l")
    with torch.no_grad():
        layer.lora_B.normal_(0, 0.1)
    x = torch.randn(4, 128)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)  # fullgraph: a graph break is an error
    torch.testing.assert_close(compiled(x), layer(x))
