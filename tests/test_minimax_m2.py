"""MiniMax-M2 beyond the shared tables (tests/test_interop.py: import, engine, export, its redline export and
refusals): GGUF both ways as llama.cpp's minimax-m2, read back by redline and by transformers' GGUF loader with
transformers' logits; the config options redline cannot express refused by name at import; MiniMax-Text-01 (model_type
minimax) refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from redline.errors import UserError
from tests.interop_models import hf_folder
from tests.test_interop import TOKENS, run_cli
from tests.test_interop_gguf import assert_gguf_export_refused, export_gguf, import_gguf
from tests.test_interop_commands import check_import_refuses

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
transformers = pytest.importorskip("transformers")


def test_minimax_m2_gguf_read_back_by_redline_and_transformers(tmp_path, capsys):
    """minimax-m2 as llama.cpp's converter writes it: rope.dimension_count the rotated part of each head, heads
    attention.key_length wide, the experts' width, sigmoid gating (2), the routing bias as blk.N.exp_probs_b.bias, the
    whole-projection QK-norm as attn_q_norm (H·D,) / attn_k_norm (KV·D,)."""
    gguf = pytest.importorskip("gguf")
    hf, path = export_gguf("minimax_m2", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    fields = {name: f.contents() for name, f in reader.fields.items() if name.startswith("minimax-m2.")}
    assert reader.fields["general.architecture"].contents() == "minimax-m2"
    assert (fields["minimax-m2.rope.dimension_count"], fields["minimax-m2.attention.key_length"]) == (8, 16)
    assert fields["minimax-m2.expert_feed_forward_length"] == 32 and fields["minimax-m2.expert_gating_func"] == 2
    assert (fields["minimax-m2.expert_count"], fields["minimax-m2.expert_used_count"]) == (4, 2)
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape.tolist())) for t in reader.tensors}
    assert shapes["blk.1.exp_probs_b.bias"] == (4,) and shapes["blk.0.ffn_gate_exps.weight"] == (4, 32, 64)
    assert shapes["blk.0.attn_q_norm.weight"] == (64,) and shapes["blk.0.attn_k_norm.weight"] == (32,)
    with torch.no_grad():
        expected = hf(TOKENS).logits
    model, _, _ = import_gguf(path, tmp_path / "back", capsys)
    back = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(back(TOKENS).logits, expected, rtol=1e-5, atol=1e-5)


def test_minimax_m2_gguf_refuses_rope_scaling(tmp_path, capsys):
    from redline.model import ModelConfig
    from tests.interop_models import VOCAB

    cfg = ModelConfig(vocab_size=VOCAB - 8, context_len=64, n_layer=2, n_embd=64, n_head=4, n_kv_head=2,
                      mlp_hidden=32, qk_norm=True, qk_norm_scope="all", rope_dims=8, moe_experts=4, moe_top_k=2,
                      moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=0.0, rope_scaling="linear",
                      rope_factor=2.0)
    assert_gguf_export_refused(cfg, "model.rope_scaling=linear on a MiniMax-M2 model", tmp_path, capsys)


@pytest.mark.parametrize("change, fragment", [
    (dict(output_router_logits=True), "output_router_logits=true"),
    (dict(router_jitter_noise=0.1), "router_jitter_noise=0.1"),
    (dict(quantization_config={"quant_method": "fp8", "weight_block_size": [64, 64]}),
     "quantization_config (quant_method='fp8', weight_block_size=[64, 64]"),
    (dict(quantization_config={"quant_method": "gptq"}), "quantization_config (quant_method='gptq'"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(scoring_func="softmax"), "scoring_func='softmax'"),
    (dict(rotary_dim=7, rope_parameters={"rope_type": "default", "rope_theta": 500.0}), "rotates 7 of each head's 16"),
])
def test_minimax_m2_import_refuses_what_redline_cannot_express(change, fragment, tmp_path, capsys):
    check_import_refuses("minimax_m2", change, fragment, tmp_path, capsys)


def test_minimax_m2_reads_rotary_dim_and_stacked_experts():
    """MiniMax's own configs give rotary_dim (no partial_rotary_factor); transformers' in-memory layout stacks the
    experts as mlp.experts.gate_up_proj / down_proj with the bias as mlp.e_score_correction_bias."""
    from redline.interop.families import TensorSource
    from redline.interop.minimax_m2 import model_config, to_redline

    hf = dict(vocab_size=64, hidden_size=32, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, head_dim=16, num_local_experts=4, num_experts_per_tok=2, rotary_dim=4,
              rope_theta=500.0)
    cfg = model_config(hf)
    assert (cfg.rope_dims, cfg.rope_theta, cfg.qk_norm_scope, cfg.moe_norm_eps) == (4, 500.0, "all", 0.0)
    torch.manual_seed(0)
    tensors = {"model.embed_tokens.weight": torch.randn(64, 32), "model.norm.weight": torch.randn(32),
               "lm_head.weight": torch.randn(64, 32)}
    p = "model.layers.0."
    tensors.update({p + "input_layernorm.weight": torch.randn(32), p + "post_attention_layernorm.weight":
                    torch.randn(32), p + "self_attn.q_proj.weight": torch.randn(32, 32),
                    p + "self_attn.k_proj.weight": torch.randn(16, 32), p + "self_attn.v_proj.weight":
                    torch.randn(16, 32), p + "self_attn.o_proj.weight": torch.randn(32, 32),
                    p + "self_attn.q_norm.weight": torch.randn(32), p + "self_attn.k_norm.weight": torch.randn(16),
                    p + "mlp.gate.weight": torch.randn(4, 32), p + "mlp.experts.gate_up_proj": torch.randn(4, 32, 32),
                    p + "mlp.experts.down_proj": torch.randn(4, 32, 16),
                    p + "mlp.e_score_correction_bias": torch.randn(4)})
    src = TensorSource(tensors, tensors.__getitem__, "test")
    state = to_redline(src, cfg)
    assert not src.unused(lambda n: False)
    assert torch.equal(state["blocks.0.mlp.fc"], tensors[p + "mlp.experts.gate_up_proj"])
    assert torch.equal(state["blocks.0.mlp.expert_bias"], tensors[p + "mlp.e_score_correction_bias"])
    with pytest.raises(UserError, match="num_local_experts"):
        model_config({**hf, "num_local_experts": None})


def test_minimax_m2_fp8_checkpoint_dequantizes(tmp_path, capsys):
    """The released fp8 checkpoints: the attention's and experts' weights e4m3 with a weight_scale_inv a 128 x 128
    block (here one block a matrix, the scale its absolute maximum over 448), the router, its bias, norms, embedding
    and head as they are: the import gives the logits of the same model with every weight dequantized (weight times
    its block's scale, deepseek.dequantize_fp8)."""
    from safetensors.torch import load_file, save_file

    from redline.training.checkpoint import load_for_inference

    original_model = hf_folder("minimax_m2", tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    dequantized = dict(weights)
    for name in list(weights):
        if name.endswith(("proj.weight", "w1.weight", "w2.weight", "w3.weight")):
            w = weights[name]
            scale = (w.abs().amax() / 448.0).reshape(1, 1)
            weights[name] = (w / scale).to(torch.float8_e4m3fn)
            weights[name + "_scale_inv"] = scale
            dequantized[name] = weights[name].float() * scale
    assert sum(n.endswith("_scale_inv") for n in weights) > 10
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "float8_e4m3fn", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    reference = transformers.MiniMaxM2ForCausalLM(transformers.MiniMaxM2Config(
        **{k: v for k, v in config.items() if k not in ("quantization_config", "architectures", "dtype",
                                                         "transformers_version")})).eval()
    original = {n: t.clone() for n, t in reference.state_dict().items()}
    reference.load_state_dict({**original, **_in_memory(dequantized, reference.config)})
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), reference(TOKENS).logits, rtol=1e-5, atol=1e-5)
        assert (reference(TOKENS).logits - original_model(TOKENS).logits).abs().max() > 1e-3  # fp8's rounding


def _in_memory(hub: dict, config) -> dict:
    """The Hub's MiniMax-M2 tensors (block_sparse_moe.*, one tensor per expert) in transformers' in-memory names."""
    out = {}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        moe = p + "block_sparse_moe."
        experts = range(config.num_local_experts)
        out[p + "mlp.gate.weight"] = hub.pop(moe + "gate.weight")
        out[p + "mlp.e_score_correction_bias"] = hub.pop(moe + "e_score_correction_bias")
        out[p + "mlp.experts.gate_up_proj"] = torch.stack([torch.cat([hub.pop(f"{moe}experts.{j}.w1.weight"),
                                                                      hub.pop(f"{moe}experts.{j}.w3.weight")])
                                                           for j in experts])
        out[p + "mlp.experts.down_proj"] = torch.stack([hub.pop(f"{moe}experts.{j}.w2.weight") for j in experts])
    return {**hub, **out}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones."""
    from redline.model import GPT, ModelConfig
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=512, context_len=128, n_embd=128, n_layer=2, n_head=4, n_kv_head=2, qk_norm=True,
                      qk_norm_scope="all", rope_dims=8, mlp_hidden=32, moe_experts=4, moe_top_k=2,
                      moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=0.0)
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[0].attn.qkv.weight)


def test_train_init_from_resumes_and_exports(tmp_path, capsys):
    """`redline train --init-from` an imported MiniMax-M2 (whole-projection QK-norm, partial RoPE, sigmoid experts
    chosen with a bias): the first step's loss is transformers', --resume goes on, and the trained run exports back
    with its logits (the check tests/test_interop_commands.py runs on a Llama)."""
    from tests.test_interop_commands import check_train_init_from

    check_train_init_from("minimax_m2", tmp_path, capsys)
