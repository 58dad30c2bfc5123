"""DBRX beyond the shared tables (tests/test_interop.py: import, engine, export, its redline exports and refusals):
the mixture's training forward and backward (the router's input noise) against transformers' DbrxFFN, q/k/v clamped
in separate projections as in the fused one, the config options redline cannot express refused by name."""

from __future__ import annotations


import pytest
import torch

from redline.model import GPT, MoE, ModelConfig
from tests.test_moe import assert_training_mixture_matches
from tests.test_interop_commands import check_import_refuses

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
transformers = pytest.importorskip("transformers")
dbrx = pytest.importorskip("transformers.models.dbrx.modeling_dbrx")


def test_moe_training_forward_and_backward_equal_dbrx_ffn():
    """Training mode: the router scales the mixture's input by uniform noise (moe_jitter_eps), which the experts see
    too; redline's MoE draws the same numbers from one seed."""
    config = transformers.DbrxConfig(d_model=32, n_heads=4, n_layers=1, attn_config={"rope_theta": 500.0},
                                     ffn_config={"ffn_hidden_size": 16, "moe_num_experts": 4, "moe_top_k": 2,
                                                 "moe_jitter_eps": 0.2})
    torch.manual_seed(0)
    ffn = dbrx.DbrxFFN(config)
    with torch.no_grad():
        for p in ffn.parameters():
            p.normal_(0, 0.3)
    cfg = ModelConfig(vocab_size=64, context_len=16, n_layer=1, n_embd=32, n_head=4, mlp_hidden=16, moe_experts=4,
                      moe_top_k=2, moe_input_jitter=0.2)
    ours = MoE(cfg)
    E, F_, C = 4, 16, 32
    mlp = ffn.experts.mlp
    with torch.no_grad():
        ours.router.weight.copy_(ffn.router.layer.weight)
        ours.fc.copy_(torch.cat([mlp.w1.view(E, F_, C), mlp.v1.view(E, F_, C)], dim=1))
        ours.proj.copy_(mlp.w2.view(E, F_, C).transpose(1, 2))
    assert_training_mixture_matches(ffn, ours, [(ours.router.weight, ffn.router.layer.weight)])
    x = torch.randn(2, 9, 32)
    with torch.no_grad():  # the noise is training's alone
        ours.eval(), ffn.eval()
        torch.testing.assert_close(ours(x), ffn(x * 1.0), rtol=1e-5, atol=1e-6)


def test_qkv_clip_clamps_separate_projections_as_the_fused_one():
    torch.manual_seed(0)
    fused = GPT(ModelConfig(vocab_size=64, context_len=16, n_layer=1, n_embd=32, n_head=4, n_kv_head=2,
                            qkv_clip=0.05)).eval()
    apart = GPT(ModelConfig(vocab_size=64, context_len=16, n_layer=1, n_embd=32, n_head=4, n_kv_head=2,
                            qkv_clip=0.05, fused_qkv=False)).eval()
    state = dict(fused.state_dict())
    q, k, v = state.pop("blocks.0.attn.qkv.weight").split([32, 16, 16])
    state.update({"blocks.0.attn.q.weight": q, "blocks.0.attn.k.weight": k, "blocks.0.attn.v.weight": v})
    apart.load_state_dict(state)
    tokens = torch.randint(0, 64, (2, 9))
    unclamped = GPT(ModelConfig(vocab_size=64, context_len=16, n_layer=1, n_embd=32, n_head=4, n_kv_head=2)).eval()
    unclamped.load_state_dict(fused.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(apart(tokens), fused(tokens))
        assert not torch.allclose(unclamped(tokens), fused(tokens))  # the clamp bites at this bound


@pytest.mark.parametrize("change, fragment", [
    (dict(ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2,
                      "moe_normalize_expert_weights": 2.0}), "moe_normalize_expert_weights=2.0"),
    (dict(ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2, "ffn_act_fn": {"name": "gelu"}}),
     "ffn_config.ffn_act_fn='gelu'"),
    (dict(attn_config={"kv_n_heads": 2, "clip_qkv": 0.15, "rope_theta": 500000.0}), "attn_config.rope_theta=500000.0"),
    (dict(resid_pdrop=0.1), "resid_pdrop=0.1"),
    (dict(output_router_logits=True), "output_router_logits=true"),
])
def test_dbrx_import_refuses_what_redline_cannot_express(change, fragment, tmp_path, capsys):
    check_import_refuses("dbrx", change, fragment, tmp_path, capsys)


def test_dbrx_hub_config_without_rope_parameters():
    """The Hub's configs give RoPE's base in attn_config alone; transformers 5 then runs at its default 10000: read
    where the two agree, refused by name where they do not."""
    from redline.errors import UserError
    from redline.interop.dbrx import model_config

    hf = dict(vocab_size=64, d_model=32, n_heads=4, n_layers=1, max_seq_len=32,
              attn_config={"kv_n_heads": 1, "clip_qkv": 8, "rope_theta": 10000},
              ffn_config={"ffn_hidden_size": 16, "moe_num_experts": 4, "moe_top_k": 2, "moe_jitter_eps": 0.01})
    cfg = model_config(hf)
    assert (cfg.rope_theta, cfg.qkv_clip, cfg.moe_input_jitter, cfg.n_kv_head, cfg.moe_norm_topk) == (
        10000.0, 8.0, 0.01, 1, True)
    with pytest.raises(UserError, match="add rope_parameters"):
        model_config({**hf, "attn_config": {**hf["attn_config"], "rope_theta": 500000}})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones."""
    from redline.model import GPT, ModelConfig
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=512, context_len=128, n_embd=128, n_layer=2, n_head=4, n_kv_head=2, norm="layernorm",
                      norm_bias=False, qkv_clip=0.3, mlp_hidden=32, moe_experts=4, moe_top_k=2)
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[0].attn.qkv.weight)


def test_train_init_from_resumes_and_exports(tmp_path, capsys):
    """`redline train --init-from` an imported DBRX (clamped q/k/v, LayerNorm experts): the first step's loss is
    transformers', --resume goes on, and the trained run exports back with its logits (the check
    tests/test_interop_commands.py runs on a Llama)."""
    from tests.test_interop_commands import check_train_init_from

    check_train_init_from("dbrx", tmp_path, capsys)
