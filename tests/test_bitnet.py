"""BitNet b1.58 (model.bitlinear, model.sub_norms, mlp=relu2_glu): checkpoints of each quantization_config transformers
loads (the master weights quantized on the fly, the packed ternary weights, ternary weights with a multiplying
scale) import with transformers' logits and greedy tokens, export back to them, train (the master weights) or refuse
to (the ternary ones), and what redline cannot compute is refused by name. The unquantized layout runs in the shared
tables (tests/interop_models.py "bitnet", REDLINE_EXPORTS, test_lora_export.ARCHS)."""

import json
from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.interop import bitnet
from redline.model import GPT, ModelConfig, int8_activations, ternary_weights
from tests.interop_models import VOCAB, hf_folder
from tests.test_interop import TOKENS, run_cli

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

QUANTIZED = {  # quantization_config as each kind of checkpoint has it
    "online": dict(linear_class="autobitlinear", quantization_mode="online"),  # bitnet-b1.58-2B-4T-bf16's
    "packed": dict(linear_class="bitlinear", quantization_mode="offline"),  # packed uint8, product / weight_scale
    "offline": dict(linear_class="autobitlinear", quantization_mode="offline"),  # packed, product · weight_scale
}


@pytest.fixture(autouse=True)
def eager_transformers():
    """transformers' BitNet layers are torch.compile'd functions: run them eagerly (minutes of CPU compiling)."""
    before = torch._dynamo.config.disable
    torch._dynamo.config.disable = True
    yield
    torch._dynamo.config.disable = before


def quantized_folder(kind: str, path):
    """A tiny BitNet folder as a `kind` checkpoint is stored, and transformers' model loaded from it."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.bitnet import pack_weights

    hf_folder("bitnet", path)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitnet", **QUANTIZED[kind]}
    (path / "config.json").write_text(json.dumps(config))
    if kind != "online":  # each projection's weights ternary, packed four rows a byte, and their scale
        state = load_file(path / "model.safetensors")
        for name in [n for n in state if n.endswith("_proj.weight")]:
            w = state[name]
            scale = 1.0 / w.abs().mean()
            state[name] = pack_weights((w * scale).round().clamp(-1, 1))
            state[name.replace(".weight", ".weight_scale")] = (scale if kind == "packed" else 1 / scale).reshape(1)
        save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


@pytest.mark.parametrize("kind", list(QUANTIZED))
def test_quantized_checkpoints_import_and_export_with_transformers_logits(kind, tmp_path, capsys):
    from redline.inference import InferenceEngine, SamplingParams
    from redline.training.checkpoint import load_for_inference

    hf = quantized_folder(kind, tmp_path / "hf")
    assert type(hf.model.layers[0].mlp.down_proj).__name__ == ("BitLinear" if kind == "packed" else "AutoBitLinear")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    assert model.cfg.bitlinear == ("online" if kind == "online" else "offline") and model.cfg.sub_norms
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
    prompts = [TOKENS[0, :9].tolist(), TOKENS[1, :4].tolist()]
    results = InferenceEngine(model, compile=False).generate(prompts, 8, SamplingParams(temperature=0))
    hf.generation_config.eos_token_id = None
    for prompt, result in zip(prompts, results):
        reference = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert result.tokens == reference[0, len(prompt):].tolist()
    # export: the master weights as autobitlinear online, ternary ones unpacked as autobitlinear offline
    code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "exported")], capsys)
    assert code == 0, err
    written = json.loads((tmp_path / "exported" / "config.json").read_text())["quantization_config"]
    assert written["quantization_mode"] == model.cfg.bitlinear and written["linear_class"] == "autobitlinear"
    back, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(TOKENS).logits, expected, rtol=1e-5, atol=1e-5)


def test_unpacking_is_transformers():
    from transformers.integrations.bitnet import pack_weights, unpack_weights

    ternary = torch.randint(-1, 2, (12, 5), generator=torch.Generator().manual_seed(0))
    packed = pack_weights(ternary.clone())
    assert torch.equal(bitnet.unpack_ternary(packed).long(), ternary)
    assert torch.equal(bitnet.unpack_ternary(packed).float(), unpack_weights(packed, torch.float32))


def _tiny(**fields) -> ModelConfig:
    return ModelConfig(vocab_size=VOCAB, context_len=64, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, mlp="relu2_glu",
                       sub_norms=True, fused_qkv=False, fused_mlp=False, **fields)


def test_online_trains_through_the_straight_through_estimator():
    w = torch.randn(8, 16, requires_grad=True)
    x = torch.randn(3, 16, requires_grad=True)
    g = torch.randn(3, 8)
    (torch.nn.functional.linear(int8_activations(x), ternary_weights(w)) * g).sum().backward()
    q_x, q_w = int8_activations(x.detach()), ternary_weights(w.detach())
    assert set(q_w.div(w.abs().mean()).round().unique().tolist()) <= {-1.0, 0.0, 1.0}
    torch.testing.assert_close(w.grad, g.t() @ q_x)  # the rounding passes the gradient on as if absent
    torch.testing.assert_close(x.grad, g @ q_w)
    torch.manual_seed(0)
    model = GPT(_tiny(bitlinear="online")).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = TOKENS[:, :16]
    first = model(tokens[:, :-1], tokens[:, 1:])
    for _ in range(10):
        opt.zero_grad()
        model(tokens[:, :-1], tokens[:, 1:]).backward()
        opt.step()
    assert model(tokens[:, :-1], tokens[:, 1:]) < first - 0.1


def test_offline_refuses_training_and_options_it_cannot_run():
    model = GPT(_tiny(bitlinear="offline")).train()
    with pytest.raises(UserError, match="model.bitlinear=offline"):
        model(TOKENS[:, :8], TOKENS[:, 1:9])
    with pytest.raises(UserError, match="fused_qkv=false"):
        ModelConfig(bitlinear="online").validate()
    with pytest.raises(UserError, match="moe_experts"):
        _tiny(moe_experts=4).validate()
    from redline.inference.kernels.fused_block import unsupported

    assert "model.bitlinear" in unsupported(_tiny(bitlinear="online"))
    assert "model.sub_norms" in unsupported(ModelConfig(sub_norms=True, mlp="relu2_glu"))


_HUB = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, hidden_act="relu2", max_position_embeddings=64, rms_norm_eps=1e-5)


@pytest.mark.parametrize("change, fragment", [
    (dict(hidden_act="silu"), "hidden_act='silu'"),
    (dict(attention_bias=True), "attention_bias=true"),
    (dict(quantization_config={"quant_method": "bitnet", "use_rms_norm": True}), "quantization_config.use_rms_norm"),
    (dict(quantization_config={"quant_method": "bitnet", "modules_to_not_convert": ["model.layers.0.mlp.down_proj"]}),
     "quantization_config.modules_to_not_convert"),
    (dict(quantization_config={"quant_method": "gptq"}), "quantization_config.quant_method='gptq'"),
])
def test_import_refuses_what_redline_cannot_compute(change, fragment):
    with pytest.raises(UserError, match=fragment.replace("[", r"\[").replace(".", r"\.")):
        bitnet.model_config({**_HUB, **change})


def test_import_reads_the_hubs_configs():
    cfg = bitnet.model_config(_HUB)
    assert (cfg.rope_theta, cfg.bitlinear, cfg.mlp, cfg.sub_norms) == (500000.0, "off", "relu2_glu", True)
    quantized = {"quant_method": "bitnet", "linear_class": "bitlinear", "quantization_mode": "online",
                 "modules_to_not_convert": ["lm_head"]}  # BitLinear is packed whatever the mode says
    assert bitnet.model_config({**_HUB, "quantization_config": quantized}).bitlinear == "offline"


def test_offline_export_refuses_weights_that_are_not_ternary():
    w = torch.tensor([[0.5, -0.5, 0.0], [0.5, 0.0, 0.25]])
    with pytest.raises(UserError, match="not ternary"):
        bitnet.ternary_parts(w, "blocks.0.attn.q.weight")
    ternary, scale = bitnet.ternary_parts(w[:1], "blocks.0.attn.q.weight")
    assert ternary.tolist() == [[1.0, -1.0, 0.0]] and scale.tolist() == [0.5]


def test_fp8_leaves_bitnets_projections_alone():
    from redline.converters.float8 import candidate_linears

    names = set(candidate_linears(GPT(_tiny(bitlinear="online"))))
    assert names == {"lm_head"}  # every block projection rounds its own input and weights


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_engine_decodes_as_full_recompute(mode):
    """Prefill whole and in chunks, decode, a server's batch: the full recompute's tokens (each token's 8-bit input
    rounding is its own, whichever path computes it)."""
    from redline.inference import InferenceEngine
    from tests.engine_checks import assert_decode_batch_parks_rows
    from tests.test_diffllama import assert_engine_decodes_as_full_recompute
    from tests.test_latent_attention import sharp

    model = sharp(_tiny(bitlinear=mode))
    for chunk in (32768, 3):
        assert_engine_decodes_as_full_recompute(model, chunk)
    assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model)


def test_lora_refuses_bitnets_projections():
    from redline.converters.lora import LoRAConverter

    for fields, target in ((dict(), "attn.*"), (dict(bitlinear="online"), "attn.q")):
        with pytest.raises(UserError, match=r"lora.targets match blocks.0.attn.(proj|q), a BitNet projection"):
            LoRAConverter(rank=4, alpha=8.0, dropout=0.0, targets=(target,)).convert(GPT(_tiny(**fields)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["online", "offline"])
def test_gpu_compiled_engine_and_training_step(mode):
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    with the master weights, the compiled training step's loss and gradients match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy

    torch.manual_seed(0)
    model = GPT(replace(_tiny(bitlinear=mode), n_embd=128, context_len=128)).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    if mode == "offline":
        return
    model.train()
    idx = torch.randint(0, VOCAB, (4, 96), device="cuda")
    weight = model.blocks[0].attn.q.weight
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx, idx)
    grad = torch.autograd.grad(loss, weight)[0]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss_c = torch.compile(model)(idx, idx)
    grad_c = torch.autograd.grad(loss_c, weight)[0]
    torch.testing.assert_close(loss_c, loss, rtol=1e-2, atol=1e-2)
    assert (grad_c - grad).norm() / grad.norm() < 0.05
