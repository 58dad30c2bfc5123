"""Inkling's layers: its attention's relative-position bias (model.rel_bias_dim, rel_bias_extent) and its keys' and
values' short convolutions (model.kv_conv), and its experts' router (model.moe_sink_experts). One attention layer
equals transformers' InklingAttention on full and windowed layers, one mixture its InklingMoE; the engine's prefill,
chunked prefill, decode and DecodeBatch give the full recompute's tokens past the bias's extent; training reaches the
new weights; what the fused kernels cannot compute is refused by name. The Inkling family itself stays refused
(families.NOT_READ: its blocks' convolutions of the sublayers' outputs)."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine
from redline.model import GPT, ModelConfig
from tests.engine_checks import (assert_decode_batch_parks_rows, assert_decode_batch_serves_like_generate,
                                 assert_freed_row_refills, assert_scores_equal_full_forward)
from tests.test_diffllama import assert_engine_decodes_as_full_recompute
from tests.test_latent_attention import sharp

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

REL = ModelConfig(vocab_size=96, context_len=64, n_layer=2, n_embd=48, n_head=4, n_kv_head=2, mlp_hidden=64,
                  qk_norm=True, pos_emb="none", fused_qkv=False, rel_bias_dim=4, rel_bias_extent=8, kv_conv=4)


def rel_model(cfg: ModelConfig = REL) -> GPT:
    """sharp's model with the bias's weights drawn wide, so that it moves the scores by several units, and the
    convolutions off their zero (identity) init."""
    model = sharp(cfg)
    with torch.no_grad():
        for block in model.blocks:
            if cfg.rel_bias_dim:
                block.attn.rel_profiles.normal_(0, 3.0)
                block.attn.rel_proj.weight.mul_(10)
            if cfg.kv_conv:
                block.attn.k_conv.normal_(0, 0.5)
                block.attn.v_conv.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("layer, window", [(1, 0), (0, 5)], ids=["full", "windowed"])
def test_attention_equals_transformers_inkling(layer, window):
    """A full layer (extent rel_extent) and a windowed one (extent its window), fp32, over 12 tokens: past both
    extents, so the bias's zeros beyond them count too; the convolutions' kernels random."""
    from transformers import InklingTextConfig
    from transformers.models.inkling.modeling_inkling import InklingAttention

    hub = InklingTextConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8, swa_num_attention_heads=4, swa_num_key_value_heads=2,
                            swa_head_dim=8, sliding_window_size=5, d_rel=4, rel_extent=7,
                            layer_types=["hybrid_sliding", "hybrid"], rms_norm_eps=1e-6)
    hub._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = InklingAttention(hub, layer).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.3)
        theirs.rel_logits_proj.proj.normal_(0, 2.0)
    cfg = replace(REL, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, head_size=8, attn_scale=1 / 8, norm_eps=1e-6,
                  rel_bias_extent=7, sliding_window=5, window_layers=(0,))
    ours = GPT(cfg).blocks[layer].attn.eval()
    assert ours.rel_extent == (window or 7)
    with torch.no_grad():
        for mine, hf in ((ours.q, theirs.q_proj), (ours.k, theirs.k_proj), (ours.v, theirs.v_proj),
                         (ours.proj, theirs.o_proj), (ours.rel_proj, theirs.r_proj)):
            mine.weight.copy_(hf.weight)
        ours.q_norm.weight.copy_(theirs.q_norm.weight)
        ours.k_norm.weight.copy_(theirs.k_norm.weight)
        ours.rel_profiles.copy_(theirs.rel_logits_proj.proj)
        ours.k_conv.copy_(theirs.k_sconv.conv1d.weight[:, 0])  # (KV*D, 1, K) -> (KV*D, K)
        ours.v_conv.copy_(theirs.v_sconv.conv1d.weight[:, 0])
    T = 12
    x = torch.randn(2, T, 32)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= i) & ((i - j < window) if window else True)
    hf_mask = torch.zeros(T, T).masked_fill(~allowed, float("-inf"))[None, None]
    with torch.no_grad():
        expected, _ = theirs(x, attention_mask=hf_mask)
        got = ours(x, None, GPT(cfg).attention_mask(T, x.device, window=window))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("parts", [dict(), dict(kv_conv=0), dict(rel_bias_dim=0, rel_bias_extent=0)],
                         ids=["both", "bias", "conv"])
@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_as_full_recompute(chunk, window, parts):
    """Prompts up to 11 tokens then 10 new ones: past the extent (8) and the window."""
    windows = dict(sliding_window=window, window_layers=(0,)) if window else {}
    assert_engine_decodes_as_full_recompute(rel_model(replace(REL, **windows, **parts)), chunk)


def test_engine_scores_and_decode_batch():
    model = rel_model(replace(REL, sliding_window=5, window_layers=(0,)))
    assert_scores_equal_full_forward(model, REL.vocab_size)
    model = rel_model()
    assert_freed_row_refills(assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model), model)
    assert_decode_batch_serves_like_generate(rel_model(), [list(range(1, 12)), [5, 6], [40, 41, 42],
                                                           list(range(20, 33))])


def test_each_part_moves_the_logits_and_training_reaches_it():
    """Zeroing the profiles or the kernels changes the logits (each part is live), and their weights take
    gradients (rel_model draws them all off their init)."""
    idx = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(0))
    for part in ("rel_profiles", "k_conv", "v_conv"):
        model = rel_model()
        with torch.no_grad():
            before = model(idx)
            for block in model.blocks:
                getattr(block.attn, part).zero_()
            assert (model(idx) - before).abs().max() > 0.1, part
    model = rel_model().train()
    model(idx, idx).backward()
    for block in model.blocks:
        for name, p in (("rel_proj", block.attn.rel_proj.weight), ("rel_profiles", block.attn.rel_profiles),
                        ("k_conv", block.attn.k_conv), ("v_conv", block.attn.v_conv)):
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_sink_experts_equal_transformers_inkling_moe():
    """model.moe_sink_experts: InklingMoE's routed experts and its shared ones, weighted by sigmoid scores normalized
    together over the chosen and the shared (its router's global_scale folded into the experts' output projections,
    a factor on every weight), fp32."""
    from transformers import InklingTextConfig
    from transformers.models.inkling.modeling_inkling import InklingMoE

    from redline.model import MoE

    hub = InklingTextConfig(hidden_size=32, moe_intermediate_size=16, n_routed_experts=6, num_experts_per_tok=2,
                            n_shared_experts=2, route_scale=2.5, num_hidden_layers=1)
    torch.manual_seed(0)
    theirs = InklingMoE(hub).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.3)
        theirs.gate.global_scale.fill_(1.3)
        theirs.gate.e_score_correction_bias.normal_(0, 0.5)
    cfg = ModelConfig(vocab_size=96, n_layer=1, n_embd=32, n_head=4, mlp="swiglu", mlp_hidden=16, moe_experts=8,
                      moe_top_k=2, moe_gating="sigmoid", moe_norm_eps=0.0, moe_expert_bias=True, moe_scale=2.5,
                      moe_sink_experts=2)
    ours = MoE(cfg)
    shared = theirs.shared_experts
    with torch.no_grad():
        ours.router.weight.copy_(theirs.gate.weight)  # (6 routed + 2 shared, C)
        ours.expert_bias.zero_()[:6] = theirs.gate.e_score_correction_bias
        ours.fc.copy_(torch.cat([theirs.experts.gate_up_proj, torch.cat([shared.gate_proj, shared.up_proj], 1)]))
        ours.proj.copy_(torch.cat([theirs.experts.down_proj, shared.down_proj]) * theirs.gate.global_scale)
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


def test_packed_documents_equal_each_document_alone():
    """Documents packed into one row with doc_ids see only themselves: the mask keeps the bias's distances within a
    document, the convolutions read none of the previous document's keys and values."""
    model = rel_model(replace(REL, sliding_window=5, window_layers=(0,)))
    a, b = torch.randint(0, 96, (1, 7)), torch.randint(0, 96, (1, 5))
    doc_ids = torch.tensor([[0] * 7 + [1] * 5])
    positions = torch.tensor([list(range(7)) + list(range(5))])
    with torch.no_grad():
        together = model(torch.cat([a, b], dim=1), positions=positions, doc_ids=doc_ids)
        torch.testing.assert_close(together[:, :7], model(a), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(together[:, 7:], model(b), atol=1e-5, rtol=1e-5)


def test_refusals():
    from redline.inference.kernels.fused_block import unsupported
    from redline.inference.plan import _triton_attention_unsupported

    for bad in (dict(rel_bias_extent=0), dict(attn_sinks=True), dict(pos_emb="alibi"), dict(doc_attention="flex")):
        with pytest.raises(UserError, match="model.rel_bias_dim"):
            replace(REL, kv_conv=0, **bad).validate()
    for bad in (dict(kv_conv=1), dict(pos_emb="rope"), dict(fused_qkv=True), dict(qk_norm_scope="all")):
        with pytest.raises(UserError, match="model.kv_conv"):
            replace(REL, **bad).validate()
    from redline.interop.families import export_family

    for cfg in (REL, replace(REL, rel_bias_dim=0, rel_bias_extent=0)):  # a Llama config but for them
        with pytest.raises(UserError, match="model.rel_bias_dim|model.kv_conv"):
            export_family(cfg)
    with pytest.raises(UserError, match="model.moe_sink_experts"):
        export_family(ModelConfig(n_embd=32, n_head=4, mlp="swiglu", moe_experts=8, moe_top_k=2, moe_gating="sigmoid",
                                  moe_sink_experts=2))
    with pytest.raises(UserError, match="model.moe_sink_experts"):
        ModelConfig(n_embd=32, n_head=4, mlp="swiglu", moe_experts=4, moe_top_k=2, moe_gating="sigmoid",
                    moe_sink_experts=3).validate()
    assert "model.kv_conv" in _triton_attention_unsupported(replace(REL, rel_bias_dim=0, rel_bias_extent=0),
                                                            torch.device("cuda"), torch.bfloat16)
    assert "model.kv_conv" in unsupported(replace(REL, rel_bias_dim=0, rel_bias_extent=0))
    bias_alone = replace(REL, kv_conv=0)
    assert "model.rel_bias_dim" in _triton_attention_unsupported(bias_alone, torch.device("cuda"), torch.bfloat16)
    assert "model.rel_bias_dim" in unsupported(bias_alone)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and the profiles' gradients match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    model = rel_model(replace(REL, n_embd=128, vocab_size=512, context_len=128, sliding_window=16,
                              window_layers=(0,))).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[0].attn.rel_profiles)
