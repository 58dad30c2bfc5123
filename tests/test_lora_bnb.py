"""QLoRA with bitsandbytes as the NF4 library (lora.nf4_backend=bitsandbytes, redline/converters/lora.py): its
forward and backward against a dequantized reference, what trains, its NF4 against torchao's, the merged model
against the adapted one, exact resume, the PEFT export, and the one-line errors. bitsandbytes runs on a CPU
(its default backend); without it installed these tests skip, except those of the errors it gives."""

import json
import sys

import pytest
import torch
import torch.nn as nn

from redline.config import TrainConfig, from_dict, parse
from redline.converters import lora as lora_mod
from redline.converters.lora import LoRAConverter, LoRALinear, dequantize, lora_layers, to_nf4
from redline.errors import UserError
from redline.model import GPT, ModelConfig
from tests.test_lora import assert_matches_reference
from redline.training import adapters
from redline.training import checkpoint as ckpt_io
from redline.training.loop import train
from tests.test_lora import base_checkpoint  # noqa: F401 (a fixture)
from tests.test_lora_posttrain import chat_base  # noqa: F401 (a fixture)
from tests.test_train import config, dataset, train_losses, train_stopped_at  # noqa: F401 (dataset is a fixture)

TINY = ModelConfig(vocab_size=96, context_len=32, n_layer=2, n_embd=64, n_head=4, n_kv_head=2)
BNB = ("lora.enabled=True", "lora.rank=4", "lora.quantize=nf4", "lora.nf4_backend=bitsandbytes")


@pytest.fixture
def bnb():
    return pytest.importorskip("bitsandbytes")


def pair(dtype: torch.dtype, bias: bool = True) -> tuple[LoRALinear, LoRALinear]:
    """(the bitsandbytes NF4 layer, a plain layer holding its dequantized weight), same non-zero adapters."""
    torch.manual_seed(0)
    linear = nn.Linear(128, 192, bias=bias)
    q = LoRALinear.from_linear(linear, 8, 16.0, 0.0, dtype, "nf4", "q", nf4_backend="bitsandbytes")
    ref = LoRALinear.from_linear(linear, 8, 16.0, 0.0, torch.float32, "none", "ref")
    with torch.no_grad():
        q.lora_B.normal_(0, 0.1)
        ref.weight.copy_(dequantize(q.weight).float())
        if bias:
            ref.bias.copy_(q.bias.float())
        ref.lora_A.copy_(q.lora_A)
        ref.lora_B.copy_(q.lora_B)
    return q, ref


def test_forward_and_backward_match_a_dequantized_reference(bnb):
    q, ref = pair(torch.float32)
    assert isinstance(q.weight, bnb.nn.Params4bit) and q.weight.dtype == torch.uint8  # packed: 2 codes a byte
    assert q.weight.numel() == 192 * 128 and "nf4 (bitsandbytes)" in repr(q)
    assert_matches_reference(q, ref)
    assert q.weight.grad is None and q.bias.grad is None
    with pytest.raises(UserError, match="NF4 base cannot take the adapters"):
        q.merge()


def test_bf16_base_under_autocast_as_on_a_gpu(bnb):
    """The GPU path: quantized from bf16, computed under bf16 autocast; without autocast fp32 in, fp32 out."""
    q, ref = pair(torch.bfloat16)
    assert q.weight.quant_state.dtype == torch.bfloat16
    x = torch.randn(3, 128)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = q(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    expected = ref(x)
    torch.testing.assert_close(out.float(), expected, atol=0.05, rtol=0.02)
    assert q.lora_A.grad is not None and q.lora_A.grad.dtype == torch.float32
    plain = q(x)
    assert plain.dtype == torch.float32
    torch.testing.assert_close(plain, expected.detach(), atol=0.05, rtol=0.02)


def test_only_adapters_get_gradients_and_counts_are_the_models(bnb):
    torch.manual_seed(0)
    model = GPT(TINY)
    plain_params = model.num_params()
    converter = LoRAConverter(4, 8.0, 0.0, ("attn.*", "mlp.*"), "nf4", say=lambda m: None,
                              nf4_backend="bitsandbytes")
    converter.convert(model)
    assert converter.nf4_backend == "bitsandbytes" and converter.describe()["nf4_backend"] == "bitsandbytes"
    adapter_params = sum(p.numel() for n, p in model.named_parameters() if n.endswith(("lora_A", "lora_B")))
    # the packed weights count as the (out, in) weights they store: FLOPs per token and MFU stay the model's
    assert model.num_params() == plain_params + adapter_params
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.normal_(0, 0.05)
    idx = torch.randint(0, 96, (2, 16))
    model(idx, idx).backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == {n for n, _ in model.named_parameters() if n.endswith(("lora_A", "lora_B"))}
    assert all(lora_mod.is_bnb_nf4(layer.weight) for layer in lora_layers(model).values())


@pytest.mark.parametrize("shape", [(576, 576), (192, 128)])
def test_bitsandbytes_and_torchao_nf4_agree(bnb, shape):
    """Both are NF4 in blocks of 64 with double-quantized scales; only the scales' storage differs (torchao: int8
    per group of scales, bitsandbytes: an 8-bit dynamic code per 256 around their mean)."""
    torch.manual_seed(0)
    w = torch.randn(shape)
    ours, theirs = dequantize(to_nf4(w, "w", "bitsandbytes")), dequantize(to_nf4(w, "w", "torchao"))
    absmax = w.abs().view(-1, 64).amax(dim=1, keepdim=True)
    for back in (ours, theirs):  # the round-trip bound of tests/test_lora.py, for each library
        assert back.shape == w.shape and back.dtype == w.dtype
        assert ((back - w).abs().view(-1, 64) <= 0.16 * absmax).all()
    assert (ours - theirs).norm() < 0.01 * w.norm()  # the same codes, scales within their rounding
    assert ((ours - theirs).abs() > 0.05 * w.std()).float().mean() < 0.01  # codes differ at level edges only


def test_takes_a_shape_torchao_cannot(bnb):
    """720 weights are not whole blocks of 64 (torchao refuses them); bitsandbytes' last block is partial."""
    torch.manual_seed(0)
    odd = nn.Sequential(nn.Linear(36, 20))
    reference = odd[0].weight.detach().clone()
    LoRAConverter(4, 8.0, 0.0, ("0",), "nf4", say=lambda m: None, nf4_backend="bitsandbytes").convert(odd)
    back = dequantize(odd[0].weight)
    assert back.shape == (20, 36) and (back - reference).abs().max() <= 0.16 * reference.abs().max()
    x = torch.randn(5, 36)
    torch.testing.assert_close(odd(x), x @ back.t() + odd[0].bias, atol=1e-5, rtol=1e-5)


def test_compiles_as_one_graph(bnb):
    """torch.compile (on by default on GPUs) takes the layer whole, matmul_4bit included."""
    q, _ = pair(torch.float32)
    x = torch.randn(4, 128)
    compiled = torch.compile(q, backend="aot_eager", fullgraph=True)  # fullgraph: a graph break is an error
    torch.testing.assert_close(compiled(x), q(x))


def adapted_from_checkpoint(ckpt, backend: str) -> GPT:
    """The adapted model of an adapter checkpoint as its run computed it: base, NF4 of `backend`, adapters."""
    meta = ckpt_io.read_meta(ckpt)
    cfg = from_dict(TrainConfig, ckpt_io.load_config_dict(ckpt))
    model = GPT(cfg.model)
    adapters.load_base(meta, ckpt, model)
    LoRAConverter(cfg.lora.rank, cfg.lora.alpha, 0.0, cfg.lora.targets, "nf4", say=lambda m: None,
                  nf4_backend=backend).convert(model)
    adapters.load_adapters(ckpt, model)
    return model.eval()


def test_run_saves_adapters_and_the_merged_model_equals_the_adapted_one(bnb, dataset, base_checkpoint,  # noqa: F811
                                                                       tmp_path):
    result = train(config(dataset, tmp_path, f"init_from={base_checkpoint}", *BNB, "max_steps=3"))
    ckpt = result.checkpoint
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["lora_base"]["nf4_backend"] == "bitsandbytes"
    from safetensors.torch import load_file

    assert all(k.endswith(("lora_A", "lora_B")) for k in load_file(str(ckpt / "model.safetensors")))
    merged, _, _ = ckpt_io.load_for_inference(ckpt)  # what eval, generate and export --merge load
    assert type(merged.blocks[0].attn.qkv) is nn.Linear
    idx = torch.randint(0, TINY.vocab_size, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(merged(idx), adapted_from_checkpoint(ckpt, "bitsandbytes")(idx),
                                   atol=1e-4, rtol=1e-4)
        # the other library's NF4 is another (close) model: the merge used the run's own
        other = adapted_from_checkpoint(ckpt, "torchao")(idx)
    assert (merged(idx) - other).abs().max() > 1e-6


@pytest.mark.slow
def test_resume_is_exact_and_needs_the_same_library(bnb, dataset, base_checkpoint, tmp_path, monkeypatch):  # noqa: F811
    extra = (f"init_from={base_checkpoint}", *BNB, "lora.dropout=0.1", "max_steps=4")
    straight = train(config(dataset, tmp_path / "a", *extra))
    first = train_stopped_at(config(dataset, tmp_path / "b", *extra), 2, monkeypatch)
    last = ckpt_io.list_checkpoints(first.run_dir)[-1]
    saved = from_dict(TrainConfig, ckpt_io.load_config_dict(last))
    saved.lora.nf4_backend = "torchao"
    with pytest.raises(UserError, match="resume with lora.nf4_backend=bitsandbytes") as e:
        train(saved, resume_from=last)
    assert "\n" not in str(e.value)
    second = train(from_dict(TrainConfig, ckpt_io.load_config_dict(last)), resume_from=last)
    assert second.step == 4
    assert train_losses(straight.run_dir) == train_losses(second.run_dir)


@pytest.mark.slow
def test_peft_loads_the_adapter_of_a_bitsandbytes_run(bnb, tmp_path, capsys):
    """The adapter export does not depend on the NF4 library: peft loads it onto the exported base with the
    logits of redline's adapters on that base, and onto the base through bitsandbytes' NF4 and back with the
    logits of the QLoRA run's merged model."""
    pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    import peft

    from redline.config import to_dict
    from redline.tokenizer import load_tokenizer
    from tests.interop_models import byte_level_tokenizer
    from tests.test_lora_export import TOKENS, export, lora_run

    base, ckpt = lora_run(tmp_path, "LlamaForCausalLM")  # separate q/k/v and gate/up: the same matrices in HF
    run_cfg = ckpt_io.load_config_dict(ckpt)  # as a bitsandbytes QLoRA run writes it
    run_cfg["lora"] |= {"quantize": "nf4", "nf4_backend": "bitsandbytes"}
    (ckpt / "config.json").write_text(json.dumps(run_cfg))
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["lora_base"]["nf4_backend"] = "bitsandbytes"
    meta["sha256"]["config.json"] = ckpt_io._sha256(ckpt / "config.json")
    (ckpt / "meta.json").write_text(json.dumps(meta))
    cfg = from_dict(TrainConfig, run_cfg)
    on_full_base = GPT(cfg.model)
    ckpt_io.load_weights(base, on_full_base)
    nf4_base = GPT(cfg.model)  # what the run trained against: each adapted weight through NF4 and back
    nf4_base.load_state_dict(on_full_base.state_dict())
    with torch.no_grad():
        for name, module in nf4_base.named_modules():
            if type(module) is nn.Linear and lora_mod.matches(name, cfg.lora.targets):
                module.weight.copy_(dequantize(to_nf4(module.weight, name, "bitsandbytes")))
    tokenizer = load_tokenizer(byte_level_tokenizer(tmp_path / "tok2"))
    (tmp_path / "nf4-base").mkdir()
    ckpt_io.write_weights_checkpoint(tmp_path / "nf4-base", ckpt_io.model_weights(nf4_base),
                                     to_dict(TrainConfig(model=cfg.model)), tokenizer, {})
    for folder in ("base", "nf4-base"):
        assert export(str(tmp_path / folder), "--out", str(tmp_path / f"{folder}-hf")) == 0
    assert export(str(ckpt), "--adapter", str(tmp_path / "adapter")) == 0
    LoRAConverter(4, 8.0, 0.0, cfg.lora.targets, say=lambda m: None).convert(on_full_base)
    adapters.load_adapters(ckpt, on_full_base)
    merged, _, _ = ckpt_io.load_for_inference(ckpt)  # the QLoRA run's model: its NF4 base, merged
    with torch.no_grad():
        for folder, ours in (("base", on_full_base.eval()(TOKENS)), ("nf4-base", merged(TOKENS))):
            hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / f"{folder}-hf").eval()
            theirs = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()(TOKENS).logits
            torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
        assert (merged(TOKENS) - on_full_base(TOKENS)).abs().max() > 1e-3  # NF4 is another base


def test_equals_transformers_4bit_model_with_the_peft_adapter(bnb, tmp_path, capsys):
    """The well-known QLoRA: transformers' BitsAndBytesConfig (NF4, double quantization) with peft's adapter on
    top gives the logits of redline's bitsandbytes QLoRA model, the same packed weights and the same matmul."""
    pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    import peft

    from tests.test_lora_export import TOKENS, export, lora_run

    base, ckpt = lora_run(tmp_path, "LlamaForCausalLM")  # separate q/k/v and gate/up: the same matrices in HF
    assert export(str(base), "--out", str(tmp_path / "base-hf")) == 0
    assert export(str(ckpt), "--adapter", str(tmp_path / "adapter")) == 0
    nf4 = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base-hf", quantization_config=nf4,
                                                           device_map="cpu", dtype=torch.float32)
    assert isinstance(hf.model.layers[0].self_attn.q_proj, bnb.nn.Linear4bit)
    for module in hf.modules():  # on a CPU with AVX512-BF16, bitsandbytes' inference forward repacks the weight
        if isinstance(module, bnb.nn.Linear4bit):  # and computes in bf16: the matmul compared here is matmul_4bit's
            module.support_avx512bf16_for_cpu = False
    theirs = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    cfg = from_dict(TrainConfig, ckpt_io.load_config_dict(ckpt))
    ours = GPT(cfg.model)
    ckpt_io.load_weights(base, ours)
    LoRAConverter(4, 8.0, 0.0, cfg.lora.targets, "nf4", say=lambda m: None, nf4_backend="bitsandbytes").convert(ours)
    adapters.load_adapters(ckpt, ours)
    assert torch.equal(ours.blocks[0].attn.q.weight.data, hf.model.layers[0].self_attn.q_proj.weight.data)
    with torch.no_grad():
        torch.testing.assert_close(theirs(TOKENS).logits, ours.eval()(TOKENS), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compiled", [False, True])
def test_on_a_gpu_as_training_runs(bnb, compiled):
    """bitsandbytes' CUDA kernels: quantized from bf16 on the GPU, run under bf16 autocast (compiled too, as
    training is by default): forward and adapter gradients as a plain layer holding the dequantized weight, and
    close to torchao's NF4 of the same weight."""
    torch.manual_seed(0)
    linear = nn.Linear(1024, 768, bias=False)
    layers = {backend: LoRALinear.from_linear(linear, 16, 32.0, 0.0, torch.bfloat16, "nf4", backend,
                                              torch.device("cuda"), backend) for backend in ("bitsandbytes", "torchao")}
    q = layers["bitsandbytes"]
    ref = LoRALinear.from_linear(linear, 16, 32.0, 0.0, torch.float32, "none", "ref", torch.device("cuda"))
    with torch.no_grad():
        q.lora_B.normal_(0, 0.02)
        ref.weight.copy_(dequantize(q.weight).float())
        for layer in (ref, layers["torchao"]):
            layer.lora_A.copy_(q.lora_A)
            layer.lora_B.copy_(q.lora_B)
    assert q.weight.is_cuda and q.weight.quant_state.absmax.is_cuda
    x = torch.randn(4, 256, 1024, device="cuda")
    outs = {}
    for name, layer in (*layers.items(), ("ref", ref)):
        run = torch.compile(layer) if compiled else layer
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = run(x)
        out.float().pow(2).mean().backward()
        outs[name] = (out.float(), layer.lora_A.grad.clone(), layer.lora_B.grad.clone())
    scale = outs["ref"][0].abs().max()
    for name, tol in (("bitsandbytes", 0.02), ("torchao", 0.05)):
        out, grad_a, grad_b = outs[name]
        assert (out - outs["ref"][0]).abs().max() < tol * scale, name
        for got, want in ((grad_a, outs["ref"][1]), (grad_b, outs["ref"][2])):
            assert (got - want).norm() < 4 * tol * want.norm(), name


@pytest.mark.slow
@pytest.mark.parametrize("command", ["sft", "dpo", "grpo"])
def test_post_training_commands_take_the_bitsandbytes_base(bnb, chat_base, tmp_path, command):  # noqa: F811
    """sft, dpo and grpo with lora.nf4_backend=bitsandbytes: DPO's reference and GRPO's KL reference (the base
    with the adapters off) start equal to the policy, and the checkpoint loads merged through bitsandbytes."""
    from tests.test_lora_posttrain import SFT
    from tests.test_posttrain_cli import records
    from tests.test_sft import _cli

    own = {"sft": SFT,
           "dpo": ["--data", "task:arithmetic", "dpo.max_pairs=24", "seq_len=128", "batch_size=4"],
           "grpo": ["--task", "arithmetic", "grpo.prompts_per_step=2", "grpo.group_size=3", "grpo.max_new_tokens=4",
                    "grpo.eval_examples=3", "grpo.kl_coef=0.1", "batch_size=3"]}[command]
    assert _cli([command, "--from", str(chat_base), *own, *BNB, "eval_batches=1", "log_every=1", "max_steps=2",
                 "tensorboard=False", f"out_dir={tmp_path}", "run_name=q"]) == 0
    ckpt = ckpt_io.resolve_checkpoint(tmp_path / "q")
    assert json.loads((ckpt / "meta.json").read_text())["lora_base"]["nf4_backend"] == "bitsandbytes"
    first = records(tmp_path / "q", "train")[0]
    if command == "dpo":
        assert first["loss"] == pytest.approx(0.693147, abs=1e-5)  # -log σ(0): the policy is the reference
    if command == "grpo":
        assert first["kl"] == pytest.approx(0.0, abs=1e-6)
    merged, _, _ = ckpt_io.load_for_inference(ckpt)
    assert type(merged.blocks[0].attn.qkv) is nn.Linear


def test_missing_bitsandbytes_is_one_line_before_any_work(dataset, base_checkpoint, tmp_path,  # noqa: F811
                                                          monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import bitsandbytes raises ImportError
    monkeypatch.setattr(lora_mod, "_BNB", None)
    with pytest.raises(UserError, match=r"pip install 'redline\[qlora-bnb\]'") as e:
        train(config(dataset, tmp_path, f"init_from={base_checkpoint}", *BNB, "max_steps=1"))
    assert "\n" not in str(e.value) and "lora.nf4_backend=bitsandbytes needs bitsandbytes" in str(e.value)
    assert not (tmp_path / "runs").exists()  # no run directory was made
    with pytest.raises(UserError, match="qlora-bnb"):
        LoRAConverter(4, 8.0, 0.0, ("attn.*",), "nf4", say=lambda m: None, nf4_backend="bitsandbytes")


def test_nf4_backend_without_nf4_is_one_line():
    with pytest.raises(UserError, match="add lora.quantize=nf4") as e:
        parse(TrainConfig, ["lora.enabled=True", "init_from=x", "lora.nf4_backend=bitsandbytes"], prog="t",
              description="t")
    assert "\n" not in str(e.value)


def test_a_sweep_checks_for_the_nf4_library_first(monkeypatch):
    """A sweep's preflight (redline/experiments/preflight.py) names the library each run's NF4 needs."""
    import importlib.util

    from redline.experiments.preflight import OPTIONAL, needed_modules

    def needs(backend: str) -> set[str]:
        cfg = parse(TrainConfig, ["lora.enabled=True", "init_from=x", "lora.quantize=nf4",
                                  f"lora.nf4_backend={backend}"], prog="t", description="t")
        return needed_modules(cfg, cuda=False)

    assert needs("bitsandbytes") == {"bitsandbytes"} and OPTIONAL["bitsandbytes"][0] == "qlora-bnb"
    assert needs("torchao") == {"torchao"}
    real_find_spec = importlib.util.find_spec
    for installed, chosen in (({"torchao", "bitsandbytes"}, "torchao"), ({"bitsandbytes"}, "bitsandbytes"),
                              (set(), "torchao")):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, ok=installed: (
            real_find_spec(name, *a) if name not in ("torchao", "bitsandbytes") else object() if name in ok else None))
        assert needs("auto") == {chosen}
