"""PhiMoE beyond the shared tables (tests/test_interop.py: import, engine, export): SparseMixer's routing against
transformers' own function in eval and in training (its random draws replayed from one seed: the same choices,
weights and gradients), the mixture's training forward and backward against PhimoeSparseMoeBlock's, the refusals."""

from __future__ import annotations


import pytest
import torch

from redline.errors import UserError
from redline.model import MoE, ModelConfig, sparsemixer
from tests.test_moe import assert_training_mixture_matches
from tests.test_interop_commands import check_import_refuses

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
transformers = pytest.importorskip("transformers")
phimoe = pytest.importorskip("transformers.models.phimoe.modeling_phimoe")


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("eps", [0.01, 0.3, 2.0])
def test_sparsemixer_equals_transformers(training, eps):
    torch.manual_seed(0)
    logits = torch.randn(64, 6) * 0.7  # some tokens with several experts inside the threshold, some with one
    theirs_in, ours_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    upstream = torch.randn(64, 2)
    torch.manual_seed(1)
    weights, experts = phimoe.sparsemixer(theirs_in, jitter_eps=eps, training=training)
    torch.manual_seed(1)
    got_weights, got_experts = sparsemixer(ours_in, eps, training)
    assert torch.equal(got_experts, experts)
    torch.testing.assert_close(got_weights, weights, rtol=1e-6, atol=1e-7)
    (weights * upstream).sum().backward()
    (got_weights * upstream).sum().backward()
    torch.testing.assert_close(ours_in.grad, theirs_in.grad, rtol=1e-5, atol=1e-7)
    if eps == 0.3:  # the threshold decides something here: the second weights are not all 1
        assert (weights[:, 1] < 0.999).any() and (weights[:, 1] > 0.999).any()


def test_moe_training_forward_and_backward_equal_phimoe_block():
    """Training mode: the input scaled by noise twice, each choice sampled, its weight scaled by 1 or 1/3 with the
    gradient of the unscaled weight; redline's MoE and transformers' block draw the same numbers from one seed."""
    config = transformers.PhimoeConfig(hidden_size=32, intermediate_size=16, num_local_experts=4,
                                       router_jitter_noise=0.2, input_jitter_noise=0.1)
    torch.manual_seed(0)
    block = phimoe.PhimoeSparseMoeBlock(config)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
    cfg = ModelConfig(vocab_size=64, context_len=16, n_layer=1, n_embd=32, n_head=4, mlp_hidden=16, moe_experts=4,
                      moe_top_k=2, moe_gating="sparsemixer", moe_norm_topk=False, moe_jitter_eps=0.2,
                      moe_input_jitter=0.1)
    ours = MoE(cfg)
    with torch.no_grad():
        ours.router.weight.copy_(block.router.weight)
        ours.fc.copy_(block.experts.gate_up_proj)
        ours.proj.copy_(block.experts.down_proj)
    assert_training_mixture_matches(block, ours, [(ours.router.weight, block.router.weight),
                                                  (ours.fc, block.experts.gate_up_proj)])


@pytest.mark.parametrize("change, fragment", [
    (dict(num_experts_per_tok=3), "num_experts_per_tok=3"),
    (dict(output_router_logits=True), "output_router_logits=true"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}), "RoPE scaling 'linear'"),
])
def test_phimoe_import_refuses_what_redline_cannot_express(change, fragment, tmp_path, capsys):
    check_import_refuses("phimoe-plain", change, fragment, tmp_path, capsys)


def test_phimoe_longrope_holds_to_the_original_context():
    """transformers' PhiMoE keeps the short factors past the original context and switches only the tables' scale,
    which redline's LongRoPE does not compute: the import's context stops there and a longer one is refused."""
    from dataclasses import replace

    from redline.interop.phimoe import model_config

    hf = dict(vocab_size=64, hidden_size=32, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
              num_local_experts=4, max_position_embeddings=128,
              rope_parameters={"rope_type": "longrope", "rope_theta": 500.0, "short_factor": [1.5] * 8,
                               "long_factor": [3.0] * 8, "short_mscale": 1.25, "long_mscale": 1.5,
                               "original_max_position_embeddings": 32})
    cfg = model_config(hf)
    assert (cfg.context_len, cfg.rope_attention_factor, cfg.rope_long_pair_factors) == (32, 1.25, ())
    with pytest.raises(UserError, match="rope_long_pair_factors"):
        replace(cfg, context_len=64).validate()


def test_sparsemixer_options_are_checked():
    base = dict(vocab_size=64, context_len=16, n_layer=1, n_embd=32, n_head=4, moe_experts=4, moe_top_k=2,
                moe_gating="sparsemixer", moe_norm_topk=False)
    with pytest.raises(UserError, match="moe_top_k=2 and moe_norm_topk=false"):
        ModelConfig(**{**base, "moe_top_k": 3}).validate()
    with pytest.raises(UserError, match="needs model.moe_gating=sparsemixer"):
        ModelConfig(**{**base, "moe_gating": "softmax", "moe_jitter_eps": 0.01}).validate()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones in scale (training samples its routes)."""
    from redline.model import GPT, ModelConfig
    from tests.engine_checks import assert_compiled_engine_stays_greedy

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=512, context_len=128, n_embd=128, n_layer=2, n_head=4, n_kv_head=2, norm="layernorm",
                      bias=True, head_bias=True, mlp_hidden=32, moe_experts=4, moe_top_k=2, moe_gating="sparsemixer",
                      moe_norm_topk=False, moe_jitter_eps=0.3, moe_input_jitter=0.01)
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    model.train()
    idx = torch.randint(0, cfg.vocab_size, (4, 96), device="cuda")
    weight = model.blocks[0].attn.qkv.weight
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx, idx)
    grad = torch.autograd.grad(loss, weight)[0]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss_c = torch.compile(model)(idx, idx)
    grad_c = torch.autograd.grad(loss_c, weight)[0]
    # SparseMixer samples its choices in training (Gumbel noise): the compiled step draws other numbers, so it is
    # held to a finite loss near the eager one and gradients of the same scale
    assert torch.isfinite(loss_c) and abs(loss_c.item() - loss.item()) < 0.5
    assert 0.2 < grad_c.norm() / grad.norm() < 5
