"""Recurrent layers (model.delta_layers: Qwen3.5's gated delta nets, Granite 4.0's Mamba-2 layers and Mamba-1's):
the chunked gated delta rule and Mamba-2's and Mamba-1's chunked scans against their token-by-token recurrences,
packed documents kept apart in training, the inference engine's cache (each row's state, each token's convolution
input in its slot) against full recompute, prefilled whole, in chunks and through a decode batch whose other rows
decode meanwhile (Falcon-H1's layers, Mamba-2 beside attention, holding a KV cache besides), the refusals. Parity with transformers' Qwen3.5,
Granite 4.0, Falcon-H1, Mamba and Falcon-Mamba is in tests/test_interop.py (the FAMILIES table)."""

import math
import re
from dataclasses import replace
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.model import GPT, ModelConfig, apply_rope
from redline.recurrent import _chunk_states, gated_delta_rule, selective_scan, ssd

from tests.engine_checks import (assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches,
                                 assert_decode_batch_parks_rows, assert_freed_row_refills, full_recompute)
from tests.test_short_conv import assert_documents_apart

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

CFG = ModelConfig(vocab_size=96, context_len=64, n_layer=3, n_embd=32, n_head=4, n_kv_head=2, qk_norm=True,
                  norm_unit_offset=True, attn_gate="element", rope_dims=4, delta_layers=(0, 2), delta_heads=4,
                  delta_key_heads=2, delta_key_dim=8, delta_value_dim=8)
# Granite 4.0's hybrid: Mamba-2 layers (4 heads of 16, 2 groups of B and C of 8, a conv bias) around attention
# without positions
MAMBA = replace(CFG, qk_norm=False, norm_unit_offset=False, attn_gate="none", rope_dims=0, pos_emb="none",
                delta_rule="mamba2", delta_value_dim=16, delta_conv_bias=True)
# Nemotron-H's: blocks of one sublayer each (Mamba-2, an MLP alone, attention alone, Mamba-2)
NEMOTRON_H = replace(MAMBA, n_layer=4, delta_layers=(0, 3), mlp_free_layers=(0, 2, 3), mixer_free_layers=(1,),
                     mlp="relu2", delta_dt_min=0.001)
# Falcon-H1's: every layer Mamba-2 beside RoPE attention on the same normed input (model.delta_parallel), the
# mixer's output gated without a norm (mamba_rms_norm=False)
FALCON_H1 = replace(MAMBA, pos_emb="rope", delta_layers=(0, 1, 2), delta_parallel=True, delta_gate_norm="none")
# Mamba-1 layers (an inner width of 64 channels, a state of 8 each, dt of rank 2, biases on the convolution and
# the projections) around attention without positions
MAMBA1 = replace(MAMBA, delta_rule="mamba1", delta_heads=64, delta_key_heads=1, delta_key_dim=8, delta_value_dim=1,
                 delta_dt_rank=2, delta_proj_bias=True)
# Falcon-Mamba's: every layer a Mamba-1 mixer alone, B, C and dt RMS-normalized without weights
FALCON_MAMBA = replace(MAMBA1, delta_layers=(0, 1, 2), mlp_free_layers=(0, 1, 2), delta_proj_bias=False,
                       delta_bcdt_norm_eps=1e-6)
# Jamba's: Mamba-1 layers with weighted dt, B and C norms around attention without positions, experts (top 2 of 4,
# unrenormalized) on the middle layer alone
JAMBA = replace(MAMBA1, delta_proj_bias=False, delta_bcdt_norm_eps=1e-5, delta_bcdt_norm_weight=True, moe_experts=4,
                moe_top_k=2, moe_norm_topk=False, moe_layers=(1,))
# Zamba2's: every layer a Mamba-2 mixer alone, layers 1 and 2 first calling one shared block (RoPE attention from
# 2·32 channels in heads of 16, GQA, a GeGLU MLP), each call with its own adapters on q, k, v and gate_up, its own
# KV cache and its own output projection (model.shared_attn_layers)
ZAMBA2 = replace(MAMBA, pos_emb="rope", delta_layers=(0, 1, 2), mlp_free_layers=(0, 1, 2), shared_attn_layers=(1, 2),
                 shared_attn_adapter_rank=4, shared_attn_qkv_adapters=True, head_size=16, attn_scale=8 ** -0.5,
                 mlp="geglu", mlp_hidden=48, delta_norm_eps=1e-5, delta_dt_min=0.001)
# Kimi Linear's: Kimi Delta Attention (decays per key channel, gates through rank 8) around NoPE latent attention
KDA = replace(CFG, qk_norm=False, norm_unit_offset=False, attn_gate="none", pos_emb="none", n_kv_head=4,
              kv_lora_rank=16, head_size=12, rope_dims=4, v_head_dim=8, delta_decay="channel",
              delta_gate_rank=8)
# Ling 3's: KDA with full-rank gates and its decay bounded in (-5, 0), beside RoPE latent attention whose heads are
# gated
LING3 = replace(KDA, pos_emb="rope", attn_gate="head", delta_decay="bounded", delta_decay_floor=-5.0,
                delta_gate_rank=0)
# MiniMax's: lightning attention (fixed decays a head, no convolution) around RoPE attention, experts (top 2 of 4)
# on every layer, each sublayer's normed input the stream its scaled output joins (model.normed_residual)
LIGHTNING = replace(CFG, qk_norm=False, norm_unit_offset=False, attn_gate="none", rope_dims=0, delta_rule="lightning",
                    delta_key_heads=4, delta_norm_eps=1e-6, moe_experts=4, moe_top_k=2,
                    normed_residual=(1.0, 0.9, 1.1, 0.7, 0.8, 1.2))
RULES = pytest.mark.parametrize("cfg", [CFG, MAMBA, NEMOTRON_H, FALCON_H1, MAMBA1, FALCON_MAMBA, JAMBA, ZAMBA2, KDA,
                                        LING3, LIGHTNING],
                                ids=["gated_delta", "mamba2", "nemotron_h", "falcon_h1", "mamba1", "falcon_mamba",
                                     "jamba", "zamba2", "kda", "ling3", "lightning"])


def recurrence(q, k, v, g, beta, state=None, starts=None):
    """The rule token by token: S ← diag(exp(g_t))·S (g_t a head's or a key channel's), S ← S + k_t (β_t (v_t −
    Sᵀk_t))ᵀ, o_t = Sᵀq_t (zeroed at a start)."""
    B, T, H, Dk = k.shape
    S = torch.zeros(B, H, Dk, v.shape[-1]) if state is None else state.clone()
    out = []
    for t in range(T):
        if starts is not None:
            S = S * (~starts[:, t]).float()[:, None, None, None]
        S = S * (g[:, t].exp()[..., None] if g.dim() == 4 else g[:, t].exp()[..., None, None])
        delta = (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t])) * beta[:, t][..., None]
        S = S + k[:, t][..., None] * delta[..., None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(out, 1), S


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_chunked_rule_is_the_recurrence(chunk, per_channel):
    """Outputs and final state, with a state carried in and documents starting mid-chunk, equal the token loop's;
    decays one a head (Gated DeltaNet's) or one a key channel (Kimi Delta Attention's), some fast enough that
    e^{−Γ} over a chunk would overflow fp32."""
    gen = torch.Generator().manual_seed(0)
    B, T, H, Dk, Dv = 2, 23, 3, 8, 5
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, Dv, generator=gen)
    g = -torch.rand(B, T, H, *(Dk,) * per_channel, generator=gen)
    if per_channel:
        g[..., 0] *= 60.0  # a channel that forgets within a token
    beta = torch.rand(B, T, H, generator=gen)
    state = torch.randn(B, H, Dk, Dv, generator=gen)
    starts = torch.zeros(B, T, dtype=torch.bool)
    starts[0, 7], starts[1, 3], starts[1, 16] = True, True, True
    for s0, st in ((None, None), (state, starts)):
        want_o, want_s = recurrence(q, k, v, g, beta, s0, st)
        got_o, got_s = gated_delta_rule(q, k, v, g, beta, s0, st, chunk=chunk)
        torch.testing.assert_close(got_o, want_o, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_s, want_s, rtol=1e-5, atol=1e-5)


def test_chunk_state_op_gradients_and_whole_graph_compile():
    """The chunk-to-chunk op's hand-written backward against finite differences (fp64; ends a head's or a key
    channel's), and the rule compiled as one graph (as the inference engine compiles its steps), with decays a head
    and a key channel, equal to eager, gradients included."""
    gen = torch.Generator().manual_seed(0)
    B, H, N, L, Dk, Dv = 1, 2, 3, 4, 3, 2
    for ends in (1, Dk):  # a decay a head, or one a key channel
        ins = [torch.randn(B, H, Dk, Dv, generator=gen), torch.rand(B, H, N, ends, generator=gen),
               0.3 * torch.randn(B, H, N, Dk, L, generator=gen), torch.randn(B, H, N, L, Dv, generator=gen),
               0.3 * torch.randn(B, H, N, L, Dk, generator=gen)]
        assert torch.autograd.gradcheck(_chunk_states, [t.double().requires_grad_() for t in ins])
    B, T, H, Dk, Dv = 2, 21, 2, 4, 3
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, Dv, generator=gen, requires_grad=True)
    beta = torch.rand(B, T, H, generator=gen)
    compiled = torch.compile(gated_delta_rule, fullgraph=True, dynamic=False)
    for g in (-torch.rand(B, T, H, generator=gen), -torch.rand(B, T, H, Dk, generator=gen)):  # a head's, a channel's
        (o, s), (o_c, s_c) = (f(q, k, v, g, beta, chunk=8) for f in (gated_delta_rule, compiled))
        torch.testing.assert_close(o_c, o, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(s_c, s, rtol=1e-5, atol=1e-5)
        grad, grad_c = (torch.autograd.grad((out * out).sum() + st.sum(), v)[0] for out, st in ((o, s), (o_c, s_c)))
        torch.testing.assert_close(grad_c, grad, rtol=1e-5, atol=1e-5)


def test_per_channel_gradients_are_the_recurrences():
    """Kimi Delta Attention's chunked rule (decays per key channel, documents and a state carried in) trains as the
    token loop does: the gradients of every input equal the loop's."""
    gen = torch.Generator().manual_seed(1)
    B, T, H, Dk, Dv = 2, 11, 2, 4, 3
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=gen), dim=-1) for _ in range(2))
    ins = [q, k, torch.randn(B, T, H, Dv, generator=gen), -torch.rand(B, T, H, Dk, generator=gen),
           torch.rand(B, T, H, generator=gen), torch.randn(B, H, Dk, Dv, generator=gen)]
    starts = torch.zeros(B, T, dtype=torch.bool)
    starts[1, 6] = True
    grads = []
    for rule in (recurrence, partial(gated_delta_rule, chunk=4)):
        leaves = [t.clone().requires_grad_() for t in ins]
        o, s = rule(*leaves, starts=starts)
        grads.append(torch.autograd.grad((o * o).sum() + (s * s).sum(), leaves))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def ssd_recurrence(x, dt, A, B, C, state=None, starts=None):
    """Mamba-2 token by token: S ← exp(dt_t·A)·S + B_t (dt_t·x_t)ᵀ, y_t = Sᵀ C_t (S zeroed at a start)."""
    Bt, T, H, P = x.shape
    S = torch.zeros(Bt, H, B.shape[-1], P) if state is None else state.clone()
    out = []
    for t in range(T):
        if starts is not None:
            S = S * (~starts[:, t]).float()[:, None, None, None]
        S = S * torch.exp(dt[:, t] * A)[..., None, None]
        S = S + B[:, t][..., None] * (dt[:, t, :, None] * x[:, t])[..., None, :]
        out.append(torch.einsum("bhnp,bhn->bhp", S, C[:, t]))
    return torch.stack(out, 1), S


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_chunked_scan_is_the_recurrence(chunk):
    """Mamba-2's scan: outputs and final state, with a state carried in and documents starting mid-chunk, equal the
    token loop's; gradients stay finite where a start resets the state."""
    gen = torch.Generator().manual_seed(0)
    Bt, T, H, P, N = 2, 23, 3, 4, 5
    x = torch.randn(Bt, T, H, P, generator=gen)
    B, C = torch.randn(Bt, T, H, N, generator=gen), torch.randn(Bt, T, H, N, generator=gen)
    dt, A = torch.rand(Bt, T, H, generator=gen), -2 * torch.rand(H, generator=gen)
    state = torch.randn(Bt, H, N, P, generator=gen)
    starts = torch.zeros(Bt, T, dtype=torch.bool)
    starts[0, 7], starts[1, 3], starts[1, 16] = True, True, True
    for s0, st in ((None, None), (state, starts)):
        want_y, want_s = ssd_recurrence(x, dt, A, B, C, s0, st)
        got_y, got_s = ssd(x, dt, A, B, C, s0, st, chunk=chunk)
        torch.testing.assert_close(got_y, want_y, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_s, want_s, rtol=1e-5, atol=1e-5)
    leaves = [t.clone().requires_grad_() for t in (x, dt, B, C)]
    y, s = ssd(leaves[0], leaves[1], A, leaves[2], leaves[3], state, starts, chunk=chunk)
    for grad in torch.autograd.grad(y.square().sum() + s.sum(), leaves):
        assert torch.isfinite(grad).all()


def selective_recurrence(x, dt, A, B, C, state=None, starts=None):
    """Mamba-1 token by token: h ← exp(dt_t·A)∘h + (dt_t·x_t) B_t, y_t = h·C_t (h zeroed at a start)."""
    Bt, T, I = x.shape
    h = torch.zeros(Bt, I, A.shape[-1]) if state is None else state.clone()
    out = []
    for t in range(T):
        if starts is not None:
            h = h * (~starts[:, t]).float()[:, None, None]
        h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * x[:, t])[..., None] * B[:, t, None, :]
        out.append((h * C[:, t, None, :]).sum(-1))
    return torch.stack(out, 1), h


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_selective_scan_is_the_recurrence(chunk):
    """Mamba-1's scan: outputs and final state, with a state carried in and documents starting mid-chunk, equal the
    token loop's, decays of up to ~60 nats a token included (a chunk's total far past fp32's exp range); one-token
    steps, token after token, too; gradients stay finite where a start resets the state."""
    gen = torch.Generator().manual_seed(0)
    Bt, T, I, N = 2, 23, 6, 5
    x, dt = torch.randn(Bt, T, I, generator=gen), 3 * torch.rand(Bt, T, I, generator=gen)
    A = -20 * torch.rand(I, N, generator=gen)
    B, C = torch.randn(Bt, T, N, generator=gen), torch.randn(Bt, T, N, generator=gen)
    state = torch.randn(Bt, I, N, generator=gen)
    starts = torch.zeros(Bt, T, dtype=torch.bool)
    starts[0, 7], starts[1, 3], starts[1, 16] = True, True, True
    for s0, st in ((None, None), (state, starts)):
        want_y, want_s = selective_recurrence(x, dt, A, B, C, s0, st)
        got_y, got_s = selective_scan(x, dt, A, B, C, s0, st, chunk=chunk)
        torch.testing.assert_close(got_y, want_y, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_s, want_s, rtol=1e-5, atol=1e-5)
    s, steps = state, []
    for t in range(T):
        y, s = selective_scan(x[:, t:t + 1], dt[:, t:t + 1], A, B[:, t:t + 1], C[:, t:t + 1], s)
        steps.append(y)
    want_y, want_s = selective_recurrence(x, dt, A, B, C, state)
    torch.testing.assert_close(torch.cat(steps, 1), want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, want_s, rtol=1e-5, atol=1e-5)
    leaves = [t.clone().requires_grad_() for t in (x, dt, B, C)]
    y, s = selective_scan(leaves[0], leaves[1], A, leaves[2], leaves[3], state, starts, chunk=chunk)
    for grad in torch.autograd.grad(y.square().sum() + s.sum(), leaves):
        assert torch.isfinite(grad).all()


def test_one_token_steps_are_the_recurrence():
    """A decode step (one token, the recurrence itself rather than the chunked form) of either rule, a state carried
    in, token after token, equals the token loop over the whole sequence; and keeps v's dtype."""
    gen = torch.Generator().manual_seed(0)
    Bt, T, H, Dk, Dv = 2, 5, 3, 4, 6
    q, k = (torch.nn.functional.normalize(torch.randn(Bt, T, H, Dk, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(Bt, T, H, Dv, generator=gen)
    g, beta = -torch.rand(Bt, T, H, generator=gen), torch.rand(Bt, T, H, generator=gen)
    dt, A = torch.rand(Bt, T, H, generator=gen), -torch.rand(H, generator=gen)
    s_delta, s_ssd = torch.randn(Bt, H, Dk, Dv, generator=gen), torch.randn(Bt, H, Dk, Dv, generator=gen)
    want_delta, want_ssd = recurrence(q, k, v, g, beta, s_delta), ssd_recurrence(v, dt, A, k, q, s_ssd)
    got_delta, got_ssd = [], []
    for t in range(T):
        o, s_delta = gated_delta_rule(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], beta[:, t:t + 1],
                                      s_delta)
        y, s_ssd = ssd(v[:, t:t + 1], dt[:, t:t + 1], A, k[:, t:t + 1], q[:, t:t + 1], s_ssd)
        got_delta.append(o)
        got_ssd.append(y)
    for got, (want, state), final in ((got_delta, want_delta, s_delta), (got_ssd, want_ssd, s_ssd)):
        torch.testing.assert_close(torch.cat(got, 1), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(final, state, rtol=1e-5, atol=1e-5)
    half = gated_delta_rule(q[:, :1], k[:, :1], v[:, :1].bfloat16(), g[:, :1], beta[:, :1])[0]
    assert half.dtype == torch.bfloat16
    g = -torch.rand(Bt, T, H, Dk, generator=gen)  # Kimi Delta Attention's decays, one a key channel
    want, state = recurrence(q, k, v, g, beta, s_ssd)
    steps, s = [], s_ssd
    for t in range(T):
        o, s = gated_delta_rule(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], beta[:, t:t + 1], s)
        steps.append(o)
    torch.testing.assert_close(torch.cat(steps, 1), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, state, rtol=1e-5, atol=1e-5)


@RULES
def test_packed_documents_do_not_see_each_other(cfg):
    """The state and the convolution restart at a packed document's first token."""
    torch.manual_seed(0)
    assert_documents_apart(long_memory(GPT(cfg)))


def long_memory(model: GPT) -> GPT:
    """The model with its recurrent layers' decay slow (A = 0.02: a state that lasts hundreds of tokens, where GPT's
    initial A of 1..16 forgets within a few) and their outputs and the logits scaled up, so that a state that took a
    wrong token, or missed one, changes the greedy tokens."""
    with torch.no_grad():
        for block in model.blocks:
            mixer = block.mamba or block.attn  # a Mamba-2 mixer beside attention (model.delta_parallel) or alone
            kind = mixer.__class__.__name__
            if kind in ("GatedDeltaNet", "Mamba2", "Mamba1"):
                mixer.A_log.fill_(-3.9)
                mixer.proj.weight.mul_(8)
            if kind in ("Mamba2", "Mamba1"):  # x, B and C of order 1 (GPT's init makes them ~1e-3), no skip: what
                mixer.conv.mul_(50)  # the layer gives is the state's
                mixer.D.zero_()
            if kind == "Mamba1":  # B and C come from x through x_proj
                mixer.x_proj.weight.mul_(50)
                for weight in (mixer.dt_norm, mixer.B_norm, mixer.C_norm):  # Jamba's norm weights away from one
                    if weight is not None:
                        weight.uniform_(0.5, 1.5)
            if kind == "Lightning":  # its decays are fixed (slow on the last layers): its output scaled up alone
                mixer.out_proj.weight.mul_(8)
        model.lm_head.weight.mul_(10)
    return model.eval()


@RULES
@pytest.mark.parametrize("chunk", [32768, 4, 1])
def test_engine_decodes_as_full_recompute(chunk, cfg):
    """Prompts of different lengths in one batch (the shorter ones' padding passing their states by), prefilled
    whole or in chunks of `chunk` tokens (each chunk starting from the rows' states and the convolution's inputs
    before it), then decoded one token at a time."""
    torch.manual_seed(0)
    model = long_memory(GPT(cfg))
    prompts = [list(range(1, 12)), [5, 6], [40]]
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=chunk)
    got = [r.tokens for r in engine.generate(prompts, 10, SamplingParams(temperature=0))]
    assert got == [full_recompute(model, p, 10) for p in prompts]
    # fp32: one attention layer's k and v (2 kv heads of 8), two recurrent layers' convolution inputs (q, k, v:
    # 2·2·8 + 4·8; Mamba-2's x, B, C: 4·16 + 2·2·8; Mamba-1's x: 64); Falcon-H1's three layers hold both,
    # Falcon-Mamba's three only the recurrent part; Zamba2's two callers of the shared block hold k and v of 2 heads
    # of 16 besides their mixers' part; Kimi Linear's latent attention one head of its latent and shared key part
    # (16 + 4) as k and as v; lightning attention no convolution, nothing a token
    attention, recurrent = (3, 3) if cfg is FALCON_H1 else (0, 3) if cfg is FALCON_MAMBA else (1, 2)
    if cfg is ZAMBA2:
        attention, recurrent = 2 * 2, 3
    width = {"mamba2": 96, "lightning": 0}.get(cfg.delta_rule, 64)
    keys = 2 * (16 + 4) if cfg in (KDA, LING3) else 2 * attention * 2 * 8
    assert engine.kv_bytes_per_token() == (keys + recurrent * width) * 4


@RULES
def test_decode_batch_rows_keep_their_states(cfg):
    """A server's batch: one row decodes while another's prompt goes in over two spans, the decoding steps between
    them leaving the parked row's state as it is; then both decode, and a freed row is refilled from a fresh state.
    Each row's tokens are the full recompute's; no prefix is reused (a state is not held in slots)."""
    torch.manual_seed(0)
    model = long_memory(GPT(cfg))
    batch = assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model)
    batch.free(0)
    assert batch.match(list(range(3, 14))) == (-1, 0)
    assert_freed_row_refills(batch, model)


def test_refusals():
    with pytest.raises(UserError, match="kv_cache_dtype=fp8 with short-convolution or recurrent layers"):
        InferenceEngine(GPT(CFG), compile=False, kv_cache_dtype="fp8")
    for bad in (dict(delta_layers=(2, 0)), dict(delta_layers=(3,)), dict(delta_heads=3),
                dict(conv_layers=(0,)), dict(delta_key_heads=0)):
        with pytest.raises(UserError, match="model.delta_layers"):
            replace(CFG, **bad).validate()
    with pytest.raises(UserError, match="they take model.delta_rule=mamba2"):
        replace(CFG, delta_conv_bias=True).validate()
    with pytest.raises(UserError, match="model.delta_dt_min=0.1 is Mamba-2's least time step"):
        replace(CFG, delta_dt_min=0.1).validate()
    for bad, fragment in ((dict(delta_value_dim=2), "set model.delta_value_dim=1 .not 2."),
                          (dict(delta_key_heads=2, delta_heads=64, delta_bcdt_norm_eps=1e-6),
                           "no dt, B and C norms with more than one"),  # Zamba's heads have none
                          (dict(delta_norm_eps=1e-5), "Mamba-1 .model.delta_rule=mamba1. has no output norm"),
                          (dict(delta_beta_scale=2.0), "Mamba .model.delta_rule=mamba1. has none"),
                          (dict(delta_dt_rank=-1), "model.delta_dt_rank=-1 is Mamba-1's dt rank"),
                          (dict(delta_bcdt_norm_eps=-1.0), "model.delta_bcdt_norm_eps=-1.0 is Falcon-Mamba's"),
                          (dict(delta_rule="mamba3"), "model.delta_rule='mamba3': one of"),
                          (dict(delta_bcdt_norm_weight=True), "model.delta_bcdt_norm_weight puts weights on "
                                                              "Mamba-1's dt, B and C norms: it takes the norms")):
        with pytest.raises(UserError, match=fragment):
            replace(MAMBA1, **bad).validate()
    for bad, fragment in ((dict(delta_dt_rank=4), "with model.delta_rule=mamba1"),
                          (dict(delta_bcdt_norm_eps=1e-6), "with model.delta_rule=mamba1")):
        with pytest.raises(UserError, match=fragment):
            replace(MAMBA, **bad).validate()
    assert replace(MAMBA1, delta_dt_rank=0).dt_rank == 2  # Mamba's "auto": ceil(32 / 16)
    for bad, fragment in ((dict(delta_decay="channel", delta_rule="mamba2"), "delta_decay=channel is Kimi Delta"),
                          (dict(delta_gate_rank=4), "model.delta_gate_rank=4 is Kimi Delta Attention's gate rank"),
                          (dict(delta_decay="bounded"), "model.delta_decay_floor=0.0 bounds a KDA decay"),
                          (dict(delta_decay_floor=-5.0), "model.delta_decay_floor=-5.0 bounds a KDA decay"),
                          (dict(delta_decay="fast"), "model.delta_decay='fast': one of head, channel, bounded")):
        with pytest.raises(UserError, match=fragment):
            replace(CFG, **bad).validate()
    with pytest.raises(UserError, match="takes no QK-norm, routed or softplus attn_gate"):
        replace(KDA, attn_gate="head", attn_gate_fn="softplus").validate()
    for bad, fragment in ((dict(mixer_free_layers=(0,)), "names a layer that has a token mixer"),
                          (dict(mixer_free_layers=(1,), mlp_free_layers=(1,)), "would have nothing at all"),
                          (dict(mlp_free_layers=(4,)), r"model.mlp_free_layers=\(4,\) must name distinct layers"),
                          (dict(mlp_free_layers=(1,), norm_position="output"), "take pre-norm blocks")):
        with pytest.raises(UserError, match=fragment):
            replace(MAMBA, **bad).validate()


def test_parallel_refusals():
    for bad in (dict(delta_layers=()), dict(delta_rule="gated_delta", delta_conv_bias=False),
                dict(norm_position="output"), dict(parallel_residual=True), dict(mlp_free_layers=(1,))):
        with pytest.raises(UserError, match="model.delta_parallel runs Mamba-2 beside attention"):
            replace(FALCON_H1, **bad).validate()
    with pytest.raises(UserError, match="model.delta_gate_norm=before_gate places Mamba-2's output norm"):
        replace(CFG, delta_gate_norm="before_gate").validate()


@pytest.mark.parametrize("gate_norm", ["after_gate", "before_gate", "none"])
def test_parallel_layers_and_gate_norms(gate_norm):
    """model.delta_parallel (Falcon-H1's layers): x + attn(norm1(x)) + mamba(norm1(x)), then x + mlp(norm2(x)), each
    block computed by hand from its own modules; model.delta_gate_norm's three outputs by hand from the mixer's
    scan (D·x included) and gate, the norm's weight made uneven so that its place shows."""
    torch.manual_seed(0)
    model = long_memory(GPT(replace(FALCON_H1, delta_gate_norm=gate_norm)))
    blocks = model.blocks
    assert all(type(b.attn).__name__ == "Attention" and type(b.mamba).__name__ == "Mamba2" for b in blocks)
    assert model.cfg.attention_layers == [0, 1, 2]
    assert (blocks[0].mamba.norm is None) == (gate_norm == "none")
    idx = torch.randint(0, 96, (2, 12))
    with torch.no_grad():
        x, rope = model.embed(idx)
        for block in blocks:
            u = block.norm1(x)
            x = x + block.attn(u, rope) + block.mamba(u)
            x = x + block.mlp(block.norm2(x))
        torch.testing.assert_close(model(idx), model.logits(model.norm_f(x))[..., :96])
        mixer = blocks[1].mamba
        if mixer.norm is not None:
            mixer.norm.copy_(torch.rand(mixer.inner) + 0.5)
        mixer.D.fill_(0.7)
        mixer.proj = torch.nn.Identity()  # the output before out_proj (2, 12, inner)
        h = torch.randn(2, 12, 32)
        gate = F.silu(mixer.in_proj(h)[..., :mixer.inner])
        got = mixer(h)
        mixer.gate_norm = "none"
        gated = mixer(h)  # y·silu(z)
        y = gated / gate  # the scan's output plus D·x, before the gate (fp32: the quotient is exact to rounding)

        def group_norm(t):  # RMSNorm in the G groups of the inner width, times the weight
            g = t.view(2, 12, mixer.key_heads, -1)
            return mixer.norm * (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + mixer.eps)).view(2, 12, -1)

        expected = {"none": lambda: gated, "after_gate": lambda: group_norm(gated),
                    "before_gate": lambda: group_norm(y) * gate}[gate_norm]()
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        if gate_norm != "none":  # the two places differ
            assert (group_norm(gated) - group_norm(y) * gate).abs().max() > 0.1


def test_shared_block_calls():
    """model.shared_attn_layers (Zamba2's): the shared block's weights are stored once and its callers' adapters and
    output projections apart; each caller computes x + mixer(norm1(x + shared_in(block(cat(x, x0))))); training
    reaches the block (through both calls), the adapters and the mixers; the options the block cannot have are
    refused by name."""
    torch.manual_seed(0)
    model = GPT(replace(ZAMBA2, shared_attn_layers=(0, 1, 2), shared_attn_blocks=2))
    names = [n for n, _ in model.named_parameters()]
    assert sum(n.startswith("shared_blocks.") for n in names) == 2 * 6
    assert not any("bound" in n for n in model.state_dict())
    assert model.blocks[0].attn.bound[0] is model.blocks[2].attn.bound[0] is model.shared_blocks[0]
    idx = torch.randint(0, 96, (2, 9))
    # layer 1 by hand, from the stream entering it
    x, rope = model.embed(idx)
    x0 = x
    h = model.blocks[0](x, rope, ple=x0)
    call, block = model.blocks[1].attn, model.shared_blocks[1]
    u = block.norm1(torch.cat([h, x0], dim=-1))
    q, k, v = (w + call.adapters[f"{n}_b"](call.adapters[f"{n}_a"](u))
               for n, w in zip("qkv", block.qkv(u).split(call.widths, -1)))
    q, k = (apply_rope(t.view(2, 9, -1, 16).transpose(1, 2), *rope[:2]) for t in (q, k))
    y = F.scaled_dot_product_attention(q, k, v.view(2, 9, -1, 16).transpose(1, 2), is_causal=True,
                                       scale=8 ** -0.5, enable_gqa=True).transpose(1, 2).reshape(2, 9, -1)
    a = block.norm2(block.proj(y))
    gate, up = (block.mlp_fc(a) + call.adapters["fc_b"](call.adapters["fc_a"](a))).chunk(2, dim=-1)
    t = call.shared_in(block.mlp_proj(F.gelu(gate, approximate="tanh") * up))
    expected = h + model.blocks[1].mamba(model.blocks[1].norm1(h + t))
    torch.testing.assert_close(model.blocks[1](h, rope, ple=x0), expected)
    model(idx, targets=idx).backward()
    for name in ("shared_blocks.0.qkv.weight", "shared_blocks.1.mlp_fc.weight", "blocks.2.attn.adapters.q_a.weight",
                 "blocks.1.attn.adapters.fc_b.weight", "blocks.0.attn.shared_in.weight",
                 "blocks.1.mamba.in_proj.weight"):
        assert model.get_parameter(name).grad.abs().sum() > 0, name
    for overrides, fragment in ((dict(shared_attn_layers=(1,), mlp_free_layers=(0, 2)), "shared_attn_layers=(1,)"),
                                (dict(qk_norm=True), "QK-norm"),
                                (dict(shared_attn_blocks=3, shared_attn_layers=(1, 2)), "shared_attn_blocks=3"),
                                (dict(shared_attn_adapter_rank=0), "shared_attn_adapter_rank=0")):
        with pytest.raises(UserError, match=re.escape(fragment)):
            replace(ZAMBA2, **overrides).validate()


def test_blocks_of_one_sublayer():
    """model.mlp_free_layers and mixer_free_layers (Nemotron-H's blocks, Mamba-2's): x + mixer(norm1(x)) and
    x + mlp(norm2(x)), each block computed by hand from its own modules; the absent sublayers hold no weights and a
    block without a mixer no cache. delta_dt_min floors dt: a layer whose time steps all fall below it computes
    another output."""
    torch.manual_seed(0)
    model = GPT(NEMOTRON_H).eval()
    blocks = model.blocks
    assert blocks[0].mlp is None and blocks[0].norm2 is None and blocks[1].attn is None and blocks[1].norm1 is None
    assert not any(name.startswith(("blocks.1.attn", "blocks.0.mlp", "blocks.2.mlp")) for name in model.state_dict())
    idx = torch.randint(0, 96, (2, 12))
    with torch.no_grad():
        x, _ = model.embed(idx)
        x = x + blocks[0].attn(blocks[0].norm1(x))
        x = x + blocks[1].mlp(blocks[1].norm2(x))
        x = x + blocks[2].attn(blocks[2].norm1(x), None)
        x = x + blocks[3].attn(blocks[3].norm1(x))
        torch.testing.assert_close(model(idx), model.logits(model.norm_f(x))[..., :96])
        engine = InferenceEngine(model, compile=False, dtype=torch.float64)
        engine.generate([[1, 2, 3]], 4)
        cache = engine._state.cache
        assert cache.k[1] is None and cache.read(1, slice(0, 1), 3, torch.float64) == (None, None)
        assert cache.k[2] is not None and set(cache.states) == {0, 3}
        # dt's rows of in_proj zeroed: dt = softplus(dt_bias), one per head. Under a floor (softplus(-20) ~ 2e-9)
        # it is the floor, as a dt_bias that gives the floor itself without one
        mixer, x = blocks[0].attn, torch.randn(2, 12, 32)
        mixer.in_proj.weight[-mixer.heads:] = 0.0
        mixer.conv.mul_(50.0)  # x, B and C of order one, and no D·x: the scan's output is all there is
        mixer.D.zero_()
        mixer.dt_bias.fill_(-20.0)
        mixer.dt_min = 0.5
        floored = mixer(x)
        mixer.dt_min = 0.0
        unfloored = mixer(x)
        mixer.dt_bias.fill_(math.log(math.expm1(0.5)))
        torch.testing.assert_close(floored, mixer(x), rtol=1e-4, atol=1e-6)
        assert (floored - unfloored).abs().max() > 0.01


@RULES
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step(cfg):
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones."""
    torch.manual_seed(0)
    cfg = replace(cfg, n_embd=128, vocab_size=512, context_len=128, delta_key_dim=32,
                  delta_value_dim=1 if cfg.delta_rule == "mamba1" else 32)
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    mixer = model.blocks[0].mamba or model.blocks[0].attn
    assert_compiled_training_step_matches(model, (mixer.qkv_proj if cfg.delta_rule == "lightning" else
                                                  mixer.in_proj).weight)

