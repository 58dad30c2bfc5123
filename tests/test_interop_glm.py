"""GLM, GLM-4 and GLM-4-MoE (redline/interop/glm.py) beyond the parity tables of test_interop.py: the Hub's configs
read as transformers reads them, the multi-token prediction layers left unread, and each refusal one line."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.interop.families import export_family
from redline.interop.glm import glm4_model_config, glm4_moe_model_config, glm_model_config
from redline.model import ModelConfig
from redline.training.checkpoint import load_for_inference
from tests.interop_models import hf_folder
from tests.test_interop import TOKENS, imported, run_cli

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# GLM-4.5-Air's config.json as the Hub has it (the sizes that matter here)
AIR = {"model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"], "vocab_size": 151552, "hidden_size": 4096,
       "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 46, "num_attention_heads": 96,
       "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 131072,
       "rms_norm_eps": 1e-05, "rope_theta": 1000000, "partial_rotary_factor": 0.5, "attention_bias": True,
       "use_qk_norm": False, "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 8,
       "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
       "routed_scaling_factor": 1.0, "num_nextn_predict_layers": 1, "tie_word_embeddings": False}
# GLM-4-9B-0414's (its partial_rotary_factor at the top level; head_dim given)
GLM4_9B = {"model_type": "glm4", "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696,
           "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
           "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
           "partial_rotary_factor": 0.5, "attention_bias": True, "tie_word_embeddings": False}


def test_the_hubs_configs_read_as_transformers_reads_them():
    air = glm4_moe_model_config(AIR)
    assert (air.head_dim, air.rope_dims, air.rope_theta) == (128, 64, 1e6)
    assert (air.moe_experts, air.moe_top_k, air.hidden_dim, air.moe_shared_hidden, air.moe_shared_gate) == \
        (128, 8, 1408, 1408, False)
    assert (air.moe_dense_layers, air.moe_dense_hidden, air.moe_gating, air.moe_expert_bias) == \
        (1, 10944, "sigmoid", True)
    assert air.has_qkv_bias and not air.bias and not air.qk_norm and air.moe_norm_eps == 1e-20
    big = glm4_moe_model_config({**AIR, "num_hidden_layers": 92, "first_k_dense_replace": 3, "n_routed_experts": 160,
                                 "use_qk_norm": True, "routed_scaling_factor": 2.5})
    assert big.qk_norm and big.moe_scale == 2.5 and big.moe_dense_layers == 3
    dense = glm4_model_config(GLM4_9B)
    assert dense.norm_position == "sandwich" and dense.rope_dims == 64 and dense.has_qkv_bias
    # what the configs leave out, at transformers' defaults: half of each head rotated, head_dim 128 (not
    # hidden_size / heads) for GLM and GLM-4, biases on q/k/v, GLM's tiny RMSNorm eps
    bare = {k: v for k, v in GLM4_9B.items() if k not in ("partial_rotary_factor", "head_dim", "attention_bias",
                                                          "rms_norm_eps")}
    cfg = glm_model_config({**bare, "hidden_size": 1024, "num_attention_heads": 16})
    assert (cfg.head_dim, cfg.rope_dims, cfg.has_qkv_bias, cfg.norm_eps) == (128, 64, True, 1.5625e-07)
    assert cfg.norm_position == "pre"
    assert glm4_moe_model_config({**AIR, "head_dim": None, "hidden_size": 1024, "num_attention_heads": 16}).head_dim \
        == 64  # GLM-4-MoE's head width where none is given: hidden_size / heads


@pytest.mark.parametrize("read, hf, fragment", [
    (glm4_model_config, {**GLM4_9B, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "RoPE scaling 'yarn' on a glm4 model is not supported"),
    (glm4_model_config, {**GLM4_9B, "partial_rotary_factor": 0.4}, "partial_rotary_factor=0.4 rotates 51"),
    (glm4_moe_model_config, {**AIR, "first_k_dense_replace": 46}, "first_k_dense_replace=46 with"),
    (glm_model_config, {**GLM4_9B, "hidden_act": "gelu"}, "hidden_act='gelu'"),
    (glm4_moe_model_config, {**AIR, "n_shared_experts": 0}, "n_shared_experts=0"),
])
def test_import_refuses_what_redline_cannot_express(read, hf, fragment):
    with pytest.raises(UserError, match=fragment):
        read(hf)


def test_multi_token_prediction_layers_are_left_unread(tmp_path, capsys):
    """GLM-4.5's files hold its next-token-prediction layer as model.layers.<num_hidden_layers>: the import leaves it
    out (transformers ignores it too), and still reports any other tensor it does not use."""
    from safetensors.torch import load_file, save_file

    hf = hf_folder("glm4_moe-air", tmp_path / "hf")
    path = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(path)
    mtp = {"model.layers.2.eh_proj.weight": torch.zeros(64, 128), "model.layers.2.enorm.weight": torch.ones(64),
           "model.layers.2.self_attn.q_proj.weight": torch.zeros(64, 64)}
    save_file({**tensors, **mtp}, path, metadata={"format": "pt"})
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    save_file({**tensors, "model.stray.weight": torch.zeros(3)}, path, metadata={"format": "pt"})
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt2")], capsys)
    assert code == 2 and "model.stray.weight" in err, err


BASE = dict(vocab_size=100, context_len=32, n_layer=2, n_embd=32, n_head=4, n_kv_head=2)
MOE = dict(rope_dims=4, qkv_bias=True, moe_experts=4, moe_top_k=2, mlp_hidden=8, moe_gating="sigmoid",
           moe_expert_bias=True, moe_norm_eps=1e-20, moe_shared_hidden=8, moe_shared_gate=False)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(norm_position="sandwich", rope_dims=4, qk_norm=True), "model.qk_norm: GLM-4 has no QK-norm"),
    (dict(norm_position="sandwich", rope_dims=4, sliding_window=8), "model.sliding_window with GLM-4's options"),
    (dict(norm_position="sandwich", rope_dims=4, moe_experts=4), "model.moe_experts with norm_position=sandwich: "
                                                                 "GLM-4"),
    (dict(rope_dims=4, qkv_bias=True, qk_norm=True), "model.qk_norm: GLM has no QK-norm"),
    ({**MOE, "moe_norm_eps": 1e-6}, "set model.moe_norm_eps=1e-20"),
    ({**MOE, "moe_shared_gate": True}, "GLM-4-MoE has ungated shared experts"),
    ({**MOE, "moe_shared_hidden": 12}, "model.moe_shared_hidden=12"),
    ({**MOE, "norm_position": "sandwich"}, "model.norm_position=sandwich: GLM-4-MoE's norms are pre-norms"),
    ({**MOE, "moe_groups": 2, "moe_topk_groups": 1, "rope_scaling": "linear", "rope_factor": 2.0},
     "model.rope_scaling=linear: redline writes GLM-4-MoE unscaled"),
])
def test_export_refuses_what_glm_has_not(overrides, fragment):
    cfg = replace(ModelConfig(**BASE), **overrides)
    with pytest.raises(UserError, match=fragment):
        export_family(cfg)


def test_grouped_routing_without_glms_partial_rope_goes_elsewhere():
    """GLM-4-MoE takes grouped routing only where the model is GLM's (sigmoid scores, part of each head rotated); with
    whole heads rotated and experts on every layer it is Solar Open's, with dense first layers and no per-head
    QK-norm Sarvam MoE's (dots.llm1's attention has the QK-norm)."""
    cfg = replace(ModelConfig(**BASE), **{**MOE, "rope_dims": 0, "moe_groups": 2})
    assert export_family(cfg).name == "solar_open"
    assert export_family(replace(cfg, moe_dense_layers=1, moe_dense_hidden=16)).name == "sarvam_moe"


@pytest.mark.parametrize("layer", ["blocks.0.mlp.fc", "blocks.1.mlp.shared.fc", "blocks.1.mlp.shared.proj",
                                   "blocks.1.mlp.router"])
def test_glm4_moe_adapters_on_mlps_are_refused_by_name(layer):
    """PEFT moves a GLM-4-MoE's gate_proj / up_proj / down_proj adapters onto its experts as it loads them: the
    export refuses adapters on the dense and shared MLPs (test_lora_export.py checks the attention's with PEFT)."""
    from redline.interop.peft_adapter import _parts

    cfg = replace(ModelConfig(**BASE), **MOE, moe_dense_layers=1)
    with pytest.raises(UserError, match=f"the adapter on {layer} would be .* which PEFT moves onto GLM-4-MoE's"):
        _parts(layer, 16, cfg, export_family(cfg))


@pytest.mark.parametrize("kind, name", [("glm", "GLM")])  # GLM-4 and GLM-4-MoE: test_interop_gguf_more.py, _moe.py
def test_not_written_as_gguf(kind, name, tmp_path, capsys):
    _, _, _, ckpt = imported(kind, tmp_path, capsys)
    out = tmp_path / "x.gguf"
    code, _, err = run_cli(["export", str(ckpt), "--format", "gguf", "--out", str(out)], capsys)
    assert code == 2 and f"{name} models are not written as GGUF" in err and not out.exists(), err


def test_glm4_moe_layers_train():
    """An imported GLM-4-MoE's layers (grouped sigmoid routing, routing bias, shared experts, a dense first layer,
    QK-norm, q/k/v biases, partial RoPE) are differentiable: every trained tensor gets a gradient, and a few AdamW
    steps on one batch lower its loss."""
    cfg = replace(ModelConfig(**BASE), **{**MOE, "moe_experts": 8}, n_layer=3, qk_norm=True, moe_groups=4,
                  moe_topk_groups=2, moe_scale=2.5, moe_dense_layers=1, moe_dense_hidden=48)
    from redline.model import GPT

    torch.manual_seed(0)
    model = GPT(cfg).train()
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    loss = model(idx, idx)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    for name in ("blocks.1.mlp.router.weight", "blocks.1.mlp.fc", "blocks.1.mlp.shared.fc.weight",
                 "blocks.0.mlp.fc.weight", "blocks.2.attn.qkv.bias", "blocks.2.attn.q_norm.weight"):
        assert model.get_parameter(name).grad.abs().sum() > 0, name
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = loss.item()
    for _ in range(5):
        opt.zero_grad()
        loss = model(idx, idx)
        loss.backward()
        opt.step()
    assert loss.item() < first


def test_moe_norm_eps_is_checked():
    with pytest.raises(UserError, match="model.moe_norm_eps=-1.0 must be in"):
        ModelConfig(**BASE, moe_experts=4, moe_norm_eps=-1.0).validate()
