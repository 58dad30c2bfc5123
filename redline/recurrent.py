"""Recurrent token mixers' sequence kernels: the gated delta rule of model.delta_layers (Qwen3.5's linear attention)
and Mamba-2's scan, computed chunk by chunk in PyTorch, and Mamba-1's selective scan (a state per channel); RWKV-4's
WKV (wkv) and xLSTM's mLSTM cell (mlstm), each chunk at once in a log-scaled form, the chunks in turn. The
gated delta rule's sequential chunk-to-chunk part is an opaque op inside torch.compile's graphs (the inference
engine compiles whole graphs): unrolled, it would make their compile time grow with the sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _chunk_states_loop(S, end, last, U, W):
    before = []
    for n in range(end.shape[2]):
        before.append(S)
        S = end[:, :, n, :, None] * S + last[:, :, n] @ (U[:, :, n] - W[:, :, n] @ S)
    return torch.stack(before, dim=2), S


# An opaque op, so that the loop is neither unrolled into torch.compile's graphs (their compile time would grow with
# the sequence; a few small products a chunk run as well uncompiled) nor a graph break, which the inference engine's
# whole-graph compile refuses. Its backward is the loop run in reverse, by hand, over the states it returned.
@torch.library.custom_op("redline::delta_chunk_states", mutates_args=())
def _chunk_states(S: torch.Tensor, end: torch.Tensor, last: torch.Tensor, U: torch.Tensor,
                  W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gated_delta_rule's one sequential part: the state before each of N chunks, S_{n+1} = end_n·S_n + last_n·(U_n −
    W_n·S_n), end_n scaling the state's rows. S (B, H, Dk, Dv); end (B, H, N, 1) (a decay a head) or (B, H, N, Dk) (one
    a key channel); last (B, H, N, Dk, L); U (B, H, N, L, Dv); W (B, H, N, L, Dk) -> ((B, H, N, Dk, Dv), the final
    state)."""
    return _chunk_states_loop(S, end, last, U, W)


@_chunk_states.register_fake
def _(S, end, last, U, W):
    B, H, Dk, Dv = S.shape
    return S.new_empty(B, H, end.shape[2], Dk, Dv), torch.empty_like(S)


@torch.library.custom_op("redline::delta_chunk_states_backward", mutates_args=())
def _chunk_states_backward(before: torch.Tensor, end: torch.Tensor, last: torch.Tensor, U: torch.Tensor,
                           W: torch.Tensor, d_before: torch.Tensor, d_final: torch.Tensor) -> list[torch.Tensor]:
    """Gradients of (S, end, last, U, W) from those of _chunk_states' outputs, chunk N − 1 down to 0: with R_n =
    U_n − W_n·S_n and G = dS_{n+1}: d end_n = Σ G∘S_n (over each row, or all of it for a decay a head),
    d last_n = G·R_nᵀ, dU_n = last_nᵀ·G, dW_n = −dU_n·S_nᵀ, dS_n = end_n·G − W_nᵀ·dU_n + d before_n."""
    d_end, d_last, d_U, d_W = (torch.empty_like(t) for t in (end, last, U, W))
    G = d_final
    for n in reversed(range(end.shape[2])):
        S = before[:, :, n]
        dU = last[:, :, n].transpose(-1, -2) @ G
        d_end[:, :, n] = (G * S).sum(-1).sum(-1, keepdim=True) if end.shape[-1] == 1 else (G * S).sum(-1)
        d_last[:, :, n] = G @ (U[:, :, n] - W[:, :, n] @ S).transpose(-1, -2)
        d_U[:, :, n] = dU
        d_W[:, :, n] = -dU @ S.transpose(-1, -2)
        G = end[:, :, n, :, None] * G - W[:, :, n].transpose(-1, -2) @ dU + d_before[:, :, n]
    return [G, d_end, d_last, d_U, d_W]


@_chunk_states_backward.register_fake
def _(before, end, last, U, W, d_before, d_final):
    return [torch.empty_like(d_final), torch.empty_like(end), torch.empty_like(last), torch.empty_like(U),
            torch.empty_like(W)]


def _chunk_states_setup(ctx, inputs, output):
    _, end, last, U, W = inputs
    ctx.save_for_backward(output[0], end, last, U, W)


def _chunk_states_grad(ctx, d_before, d_final):
    return tuple(_chunk_states_backward(*ctx.saved_tensors, d_before, d_final))


_chunk_states.register_autograd(_chunk_states_grad, setup_context=_chunk_states_setup)


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor | None = None, starts: torch.Tensor | None = None,
                     chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule (Yang, Kautz and Hatamizadeh 2024, "Gated Delta Networks"), a (Dk, Dv) state S a head:
    for each token t in turn, S ← diag(exp(g_t))·S, δ_t = β_t·(v_t − Sᵀk_t), S ← S + k_t δ_tᵀ, o_t = Sᵀq_t; g_t one
    log decay a head (Gated DeltaNet's), or one a key channel, scaling each row of S (Kimi Delta Attention's, Kimi
    Team 2025, "Kimi Linear").

    Computed in chunks of `chunk` tokens (the WY form of DeltaNet's chunked algorithm, Yang et al. 2024), all in
    fp32. With Γ the cumulative log decay within a chunk and S₀ the state before it, δ solves the unit
    lower-triangular system δ_t + Σ_{s<t} β_t (k_t·e^{Γ_t−Γ_s}∘k_s) δ_s = β_t (v_t − S₀ᵀ(e^{Γ_t}∘k_t)), so
    δ = U − W·S₀ with U and W solved for every chunk at once; then only S₀ passes from chunk to chunk (two small
    products each), and o_t = S₀ᵀ(e^{Γ_t}∘q_t) + Σ_{s≤t} (q_t·e^{Γ_t−Γ_s}∘k_s) δ_s for every chunk at once again.
    Per-channel decays take their pairs' products over (L, L, Dk) decays, each e^{Γ_t−Γ_s} ≤ 1 (never the
    factors e^{Γ_t}·e^{−Γ_s}, which overflow fp32 on fast-decaying channels), in chunks of at most 16 tokens to
    bound that memory.
    q, k (B, T, H, Dk), v (B, T, H, Dv), beta (B, T, H), g (≤ 0) (B, T, H) or (B, T, H, Dk); state (B, H, Dk, Dv) or
    None (zeros); starts (B, T) bool or None: a packed document begins at token t, the state before it zeroed.
    -> o (B, T, H, Dv) in v's dtype, the final state (B, H, Dk, Dv) fp32."""
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    per_channel = g.dim() == 4
    if T == 1 and starts is None:  # a decode step: the recurrence itself, a few small products
        S = q.new_zeros(B, H, Dk, Dv, dtype=torch.float32) if state is None else state.float()
        dtype = v.dtype
        q, k, v, g, beta = (t[:, 0].float() for t in (q, k, v, g, beta))  # (B, H, ·)
        S = S * (g.exp()[..., :, None] if per_channel else g.exp()[..., None, None])
        delta = beta[..., None] * (v - (k[..., None, :] @ S)[..., 0, :])  # (B, H, Dv)
        S = S + k[..., :, None] * delta[..., None, :]
        return (q[..., None, :] @ S).transpose(1, 2).to(dtype), S
    if not per_channel:
        g = g[..., None]  # (B, T, H, 1): one decay for every key channel
    L = min(chunk, 16 if per_channel else chunk, T)
    pad = -T % L  # padding tokens with β = 0 and g = 0 leave the state as it is
    q, k, v, g, beta = (F.pad(t.float().transpose(1, 2), (0, 0, 0, pad) if t.dim() == 4 else (0, pad))
                        for t in (q, k, v, g, beta))  # (B, H, T + pad, ...)
    N = (T + pad) // L
    q, k, v, g = (t.reshape(B, H, N, L, -1) for t in (q, k, v, g))
    beta = beta.reshape(B, H, N, L)
    gamma = g.cumsum(-2)  # (B, H, N, L, Dk or 1)
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    first = torch.ones_like(beta)
    if starts is not None:  # the chunk's documents: token pairs of one document interact, S₀ reaches the first
        seg = F.pad(starts, (0, pad)).reshape(B, 1, N, L).long().cumsum(-1)  # 0 until the chunk's first start
        causal = causal & (seg[..., :, None] == seg[..., None, :])
        first = (seg == 0).float().expand_as(beta)
    # e^{Γ_t−Γ_s} of each channel (B, H, N, L, L, Dk or 1), zero across documents and above the diagonal
    decay = torch.where(causal[..., None], gamma[..., :, None, :] - gamma[..., None, :, :], float("-inf")).exp()

    def pairs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """(B, H, N, L, Dk) twice -> (B, H, N, L, L): Σ_d a_t[d] e^{Γ_t[d]−Γ_s[d]} b_s[d]."""
        if per_channel:
            return torch.einsum("...tsd,...td,...sd->...ts", decay, a, b)
        return decay[..., 0] * (a @ b.transpose(-1, -2))

    carried = gamma.exp() * first[..., None]  # e^{Γ_t} where S₀ still counts (B, H, N, L, Dk or 1)
    A = beta[..., None] * pairs(k, k).tril(-1)
    eye = torch.eye(L, device=q.device)
    U = torch.linalg.solve_triangular(eye + A, beta[..., None] * v, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(eye + A, beta[..., None] * carried * k, upper=False, unitriangular=True)
    last = (k * decay[..., -1, :, :]).transpose(-1, -2)  # (B, H, N, Dk, L): e^{Γ_L−Γ_s}∘k_s of the last document
    S = q.new_zeros(B, H, Dk, Dv) if state is None else state.float()
    S0, S = _chunk_states(S, carried[..., -1, :].contiguous(), last, U, W)  # (B, H, N, Dk, Dv), the final state
    delta = U - W @ S0
    o = (carried * q) @ S0 + pairs(q, k) @ delta  # (B, H, N, L, Dv)
    return o.reshape(B, H, N * L, Dv)[:, :, :T].transpose(1, 2).to(v.dtype), S


def _segment_sums(a: torch.Tensor) -> torch.Tensor:
    """a (..., L) -> (..., L, L): entry (t, s) = Σ_{s<j≤t} a_j for s ≤ t, −inf above the diagonal. Summed, never
    differenced, so that an a_j of −inf (a state reset) zeroes exactly the pairs it separates."""
    L = a.shape[-1]
    x = a[..., None, :].expand(*a.shape, L).transpose(-1, -2)  # (..., t, s) = a_t
    x = x.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=a.device).tril(-1), 0).cumsum(-2)
    return x.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=a.device).tril(), float("-inf"))


def ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
        state: torch.Tensor | None = None, starts: torch.Tensor | None = None,
        chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba-2's selective state space scan (Dao and Gu 2024, "Transformers are SSMs"), an (N, P) state S a head: for
    each token t in turn, S ← exp(dt_t·A)·S + B_t (dt_t·x_t)ᵀ, y_t = Sᵀ C_t — linear attention with keys B, queries
    C, values dt·x and a scalar decay a head.

    Computed in chunks of `chunk` tokens by its state space duality (the "SSD minimal" form of the paper): within a
    chunk the masked products (C_t·B_s) e^{Σ_{s<j≤t} a_j}; between chunks the states at their ends, each chunk's
    start state a decayed sum over every earlier chunk's (one (N_chunks + 1)² product, no loop), read by the queries.
    x (B, T, H, P), dt (B, T, H) (≥ 0), A (H,) (≤ 0), B and C (B, T, H, N); state (B, H, N, P) or None (zeros);
    starts (B, T) bool or None: a packed document begins at token t, the state before it zeroed. All in fp32.
    -> y (B, T, H, P) fp32 (without Mamba-2's D·x skip), the final state (B, H, N, P) fp32."""
    Bt, T, H, P = x.shape
    N = B.shape[-1]
    if T == 1 and starts is None:  # a decode step: the recurrence itself
        S = x.new_zeros(Bt, H, N, P, dtype=torch.float32) if state is None else state.float()
        x, dt, B, C = (t[:, 0].float() for t in (x, dt, B, C))  # (B, H, ·)
        S = S * (dt * A.float()).exp()[..., None, None] + B[..., :, None] * (dt[..., None] * x)[..., None, :]
        return (C[..., None, :] @ S).transpose(1, 2), S
    L = min(chunk, T)
    pad = -T % L  # padding tokens with dt = 0: no decay, no input
    a = dt.float() * A.float()  # (B, T, H) log decay
    if starts is not None:
        a = a.masked_fill(starts[..., None], float("-inf"))
    xd = x.float() * dt.float()[..., None]
    xd, B, C = (F.pad(t.float().transpose(1, 2), (0, 0, 0, pad)) for t in (xd, B, C))  # (B, H, T + pad, ·)
    a = F.pad(a.transpose(1, 2), (0, pad))
    n = (T + pad) // L
    xd, B, C = (t.reshape(Bt, H, n, L, -1) for t in (xd, B, C))
    a = a.reshape(Bt, H, n, L)
    seg = _segment_sums(a)  # (B, H, n, L, L)
    y = ((C @ B.transpose(-1, -2)) * seg.exp()) @ xd  # within chunks
    ends = (B * seg[..., -1, :, None].exp()).transpose(-1, -2) @ xd  # (B, H, n, N, P): each chunk's own end state
    S0 = x.new_zeros(Bt, H, 1, N, P, dtype=torch.float32) if state is None else state.float()[:, :, None]
    totals = _segment_sums(F.pad(a.sum(-1), (1, 0)))  # (B, H, n + 1, n + 1): decay from chunk end to chunk end
    states = torch.einsum("bhcz,bhznp->bhcnp", totals.exp(), torch.cat([S0, ends], dim=2))  # (B, H, n + 1, N, P)
    y = y + a.cumsum(-1).exp()[..., None] * (C @ states[:, :, :-1])  # what each chunk's start state gives
    return y.reshape(Bt, H, n * L, P)[:, :, :T].transpose(1, 2), states[:, :, -1]


def _linear_scan(a: torch.Tensor, b: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence h_t = a_t·h_{t−1} + b_t along `dim` from h = 0, by recursive doubling (Hillis and Steele
    1986): after the step of distance d, position t holds the composition of the tokens (t − 2d, t]. log2(length)
    elementwise steps; only products of the a's, so decays in [0, 1] never overflow.
    -> (the cumulative products Π_{s≤t} a_s, h_t), each a's shape."""
    n, d = a.shape[dim], 1
    while d < n:
        a_tail, b_tail = a.narrow(dim, d, n - d), b.narrow(dim, d, n - d)
        b = torch.cat([b.narrow(dim, 0, d), b_tail + a_tail * b.narrow(dim, 0, n - d)], dim)
        a = torch.cat([a.narrow(dim, 0, d), a_tail * a.narrow(dim, 0, n - d)], dim)
        d *= 2
    return a, b


def selective_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   state: torch.Tensor | None = None, starts: torch.Tensor | None = None,
                   chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba-1's selective scan (Gu and Dao 2023, "Mamba", Algorithm 2; transformers' mamba_selective_scan), an
    N-wide state h a channel, its own decay per (channel, state) entry: for each token t in turn,
    h_t = exp(dt_t·A)∘h_{t−1} + (dt_t·x_t) B_t, y_t = h_t·C_t.

    Computed in chunks of `chunk` tokens, in fp32: within every chunk at once the recurrence from a zero state by
    recursive doubling (_linear_scan: log2(chunk) elementwise steps), giving each token's state h⁰_t and decay
    product P_t since the chunk's start; then the chunks' end states by the same doubling over the chunks, the
    state carried in added with the decay since the start; each token's state is h⁰_t + P_t∘S_c with S_c its
    chunk's start state. Decays are multiplied, never divided (the exp(cumA_t)·Σ exp(−cumA_s) form overflows fp32
    once a chunk decays by more than ~88 nats, which trained Mamba channels do).
    x and dt (B, T, I) (dt ≥ 0), A (I, N) (≤ 0), B and C (B, T, N); state (B, I, N) or None (zeros); starts (B, T)
    bool or None: a packed document begins at token t, the state before it zeroed.
    -> y (B, T, I) fp32 (without Mamba's D·x skip), the final state (B, I, N) fp32."""
    Bt, T, I = x.shape
    N = A.shape[-1]
    x, dt, A, B, C = (t.float() for t in (x, dt, A, B, C))
    if T == 1 and starts is None:  # a decode step: the recurrence itself
        S = x.new_zeros(Bt, I, N) if state is None else state.float()
        S = S * (dt[:, 0, :, None] * A).exp() + (dt[:, 0] * x[:, 0])[..., None] * B[:, 0, None, :]
        return (S @ C[:, 0, :, None])[:, None, :, 0], S  # (B, 1, I)
    L = min(chunk, T)
    pad = -T % L  # padding tokens: decay 1, no input
    a = (dt[..., None] * A).exp()  # (B, T, I, N)
    if starts is not None:
        a = a.masked_fill(starts[..., None, None], 0.0)
    b = (dt * x)[..., None] * B[:, :, None, :]  # (B, T, I, N)
    n = (T + pad) // L
    a = F.pad(a, (0, 0, 0, 0, 0, pad), value=1.0).reshape(Bt, n, L, I, N)
    b = F.pad(b, (0, 0, 0, 0, 0, pad)).reshape(Bt, n, L, I, N)
    P, h = _linear_scan(a, b, 2)  # within the chunks, each from a zero state
    ends_P, ends = _linear_scan(P[:, :, -1], h[:, :, -1], 1)  # (B, n, I, N): the chunks' end states from zero
    if state is not None:
        ends = ends + ends_P * state.float()[:, None]
    start = torch.cat([x.new_zeros(Bt, 1, I, N) if state is None else state.float()[:, None], ends[:, :-1]], 1)
    h = h + P * start[:, :, None]  # (B, n, L, I, N)
    C = F.pad(C, (0, 0, 0, pad)).reshape(Bt, n, L, 1, N)
    y = (h * C).sum(-1).reshape(Bt, n * L, I)[:, :T]
    return y, ends[:, -1]


WKV_EMPTY = -1e38  # the log scale of an empty WKV state (transformers' rwkv_linear_attention_cpu starts there)


def _wkv_add(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The sum of two WKV states (num, den, m) of one shape, each standing for (num·e^m, den·e^m), on the larger
    scale (at least WKV_EMPTY: two empty states give an empty one); the scale detached, as wkv's are."""
    m = torch.maximum(a[2], b[2]).clamp_min(WKV_EMPTY).detach()
    ea, eb = (a[2] - m).exp(), (b[2] - m).exp()
    return ea * a[0] + eb * b[0], ea * a[1] + eb * b[1], m


def _wkv_scan(decay: torch.Tensor, sums: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The chunks' maps S -> e^decay·S + sums composed from the first, along dim 1, by recursive doubling (as
    _linear_scan, in log space): decay (B, N, A) (−inf: the map forgets S) and sums (num, den, m) (B, N, A) each ->
    (the summed decays, the sums of each prefix of maps applied to an empty state)."""
    n, d = decay.shape[1], 1
    while d < n:
        early, late = decay[:, :n - d], decay[:, d:]
        # late ∘ early: the early sums decayed by the late map, plus the late sums
        num, den, m = _wkv_add((sums[0][:, :n - d], sums[1][:, :n - d], sums[2][:, :n - d] + late),
                               tuple(t[:, d:] for t in sums))
        sums = tuple(torch.cat([t[:, :d], new], 1) for t, new in zip(sums, (num, den, m)))
        decay = torch.cat([decay[:, :d], late + early], 1)
        d *= 2
    return decay, sums


def wkv(k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, u: torch.Tensor, state: torch.Tensor | None = None,
        starts: torch.Tensor | None = None, valid: torch.Tensor | None = None,
        chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """RWKV-4's WKV recurrence (Peng et al. 2023; transformers' rwkv_linear_attention_cpu), a state a channel: token t
    reads (N_{t−1} + e^{u + k_t}·v_t) / (D_{t−1} + e^{u + k_t}), where N_t = e^{−w}·N_{t−1} + e^{k_t}·v_t and D_t the
    same sums of 1 in place of v.

    The sums are kept as (num, den, m), the real ones num·e^m and den·e^m, so that no exponential overflows however
    large the keys: the same stable form as transformers' loop, which renormalizes by a running maximum every token.
    Computed in chunks of `chunk` tokens, all at once: within each chunk every token's softmax-weighted mean over the
    chunk's earlier tokens i (log weight k_i − (t − 1 − i)·w) and itself (u + k_t), and the chunk's own sums at its
    end; then the state before each chunk by recursive doubling over the chunks (_wkv_scan: log2 of their count
    steps, no loop over the sequence); last each token's mean joined by the state before its chunk (log weight m −
    j·w, j the tokens since the chunk's start). The stabilizing maxima are detached: the result does not depend on
    them, so neither does its gradient.
    k and v (B, T, A); w (A,) > 0, the decay rate (exp of transformers' time_decay); u (A,) (time_first); state
    (B, 3, A) (num, den, m) or None (empty); starts (B, T) bool or None: a packed document begins at token t, the
    state before it emptied; valid (B, T) bool or None: a False token is padding, which neither decays the state nor
    joins it. -> out (B, T, A) fp32 (fp64 for fp64 inputs), the final state (B, 3, A) alike."""
    B, T, A = k.shape
    dtype = torch.promote_types(k.dtype, torch.float32)  # fp32, or fp64 where given (the engine's scoring)
    k, v, w, u = k.to(dtype), v.to(dtype), w.to(dtype), u.to(dtype)
    if state is None:
        state = torch.stack([k.new_zeros(B, A), k.new_zeros(B, A), k.new_full((B, A), WKV_EMPTY)], 1)
    initial = tuple(state.to(dtype).unbind(1))
    L = min(chunk, T)
    pad = -T % L  # padding tokens past the end: invalid, so they change nothing
    N = (T + pad) // L
    ok = k.new_ones(B, T, dtype=torch.bool) if valid is None else valid
    ok = F.pad(ok, (0, pad), value=False).view(B, N, L)
    kc, vc = (F.pad(t, (0, 0, 0, pad)).view(B, N, L, A) for t in (k, v))
    # each token's document, counted in the row (0 before the first start), and that of the token before its chunk
    seg = k.new_zeros(B, N, L, dtype=torch.long)
    if starts is not None:
        seg = F.pad(starts, (0, pad), value=False).long().cumsum(1).view(B, N, L)
    seg_before = F.pad(seg[:, :-1, -1], (1, 0))[..., None]  # (B, N, 1)
    counts = ok.long().cumsum(2)  # (B, N, L): the real tokens of the chunk up to and including each
    before = counts - ok.long()  # those before each
    # within the chunks: pairs (t, i), i before t, of the same document, weight e^{k_i − (real tokens between)·w}
    pairs = (torch.ones(L, L, dtype=torch.bool, device=k.device).tril(-1) & ok[:, :, None, :]
             & (seg[..., :, None] == seg[..., None, :]))  # (B, N, L, L)
    gap = (before[..., :, None] - counts[..., None, :]).to(dtype)  # (B, N, L, L)
    logit = torch.where(pairs[..., None], kc[:, :, None] - gap[..., None] * w, float("-inf"))  # (B, N, L, L, A)
    own = u + kc  # (B, N, L, A)
    top = torch.maximum(own, logit.amax(3)).detach()
    e_pair, e_own = (logit - top[..., None, :]).exp(), (own - top).exp()
    numer = torch.einsum("bntia,bnia->bnta", e_pair, vc) + e_own * vc
    denom = e_pair.sum(3) + e_own
    # each chunk's own sums at its end (its last token's document alone), and its decay of the state before it
    # (−inf where a document starts in it)
    total = counts[..., -1:]  # (B, N, 1)
    last = ok & (seg == seg[..., -1:])
    tok = torch.where(last[..., None], kc - (total - counts)[..., None].to(dtype) * w, float("-inf"))  # (B, N, L, A)
    m_own = tok.amax(2).clamp_min(WKV_EMPTY).detach()  # (B, N, A)
    e_tok = (tok - m_own[:, :, None]).exp()
    sums = ((e_tok * vc).sum(2), e_tok.sum(2), m_own)
    stays = seg[..., -1:] == seg_before  # (B, N, 1)
    decay = torch.where(stays, -total.to(dtype) * w, float("-inf"))  # (B, N, A)
    decays, sums = _wkv_scan(decay, sums)
    # the state after each chunk: the initial one decayed by every chunk up to it, plus their sums
    after = _wkv_add((initial[0][:, None], initial[1][:, None], initial[2][:, None] + decays), sums)
    num, den, m = (torch.cat([s0[:, None], t[:, :-1]], 1) for s0, t in zip(initial, after))  # before each chunk
    # each token joined by the state before its chunk, where no document starts in the chunk up to it
    keep = seg == seg_before  # (B, N, L)
    carried = torch.where(keep[..., None], m[:, :, None] - before[..., None].to(dtype) * w, float("-inf"))
    top2 = torch.maximum(top, carried).detach()
    e_local, e_carried = (top - top2).exp(), (carried - top2).exp()
    out = (numer * e_local + num[:, :, None] * e_carried) / (denom * e_local + den[:, :, None] * e_carried)
    final = torch.stack([t[:, -1] for t in after], 1)
    return out.reshape(B, N * L, A)[:, :T], final


def mlstm(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: torch.Tensor, f: torch.Tensor,
          state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, starts: torch.Tensor | None = None,
          valid: torch.Tensor | None = None, eps: float = 1e-6,
          chunk: int = 32) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """xLSTM's mLSTM cell (Beck et al. 2024, "xLSTM"; transformers' mlstm_recurrent_step_native and its chunkwise
    form), a matrix memory a head: for each token t in turn, with the log forget gate F_t = logsigmoid(f_t),
    m_t = max(F_t + m_{t−1}, i_t); C_t = e^{F_t + m_{t−1} − m_t}·C_{t−1} + e^{i_t − m_t}·k_t v_tᵀ, n_t the same sums
    of k_t; h_t = (q̂_t C_t) / (max(|q̂_t·n_t|, e^{−m_t}) + eps), q̂ = q·Dk^-0.5. C and n are kept scaled by e^{−m},
    m the running maximum of the log gates, which also sets the denominator's floor: so m is computed as the
    recurrence defines it, max(F-sum + m_before, max_s (i_s + F-sum since s)), never shifted.

    Computed in chunks of `chunk` tokens, as transformers' chunkwise kernel is: within every chunk at once the log
    weights b_t − b_s + i_s (b the cumulative log forget gates in the chunk) and each chunk's own memory at its end;
    then the memory before each chunk, chunk by chunk (a few products a chunk: mlstm_chunkwise_recurrent_fw_C's
    loop); last every token's output from the memory before its chunk (log weight b_t + m) and the chunk's tokens.
    q and k (B, T, H, Dk), v (B, T, H, Dv); i and f (B, T, H) the gates' preactivations; state (C (B, H, Dk, Dv), n
    (B, H, Dk), m (B, H)) or None (zeros, transformers' initial state); starts (B, T) bool or None: a packed
    document begins at token t, the state before it the initial one; valid (B, T) bool or None: a False token is
    padding, which neither decays the state nor joins it. -> h (B, T, H, Dv) fp32 (fp64 for fp64 inputs), the final
    state alike."""
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    dtype = torch.promote_types(q.dtype, torch.float32)  # fp32, or fp64 where given (the engine's scoring)
    q, k, v, i, f = (t.to(dtype) for t in (q, k, v, i, f))
    if state is None:
        C, n, m = q.new_zeros(B, H, Dk, Dv), q.new_zeros(B, H, Dk), q.new_zeros(B, H)
    else:
        C, n, m = (s.to(dtype) for s in state)
    L = min(chunk, T)
    pad = -T % L  # padding tokens past the end: invalid, so they change nothing
    N = (T + pad) // L
    ok = q.new_ones(B, T, dtype=torch.bool) if valid is None else valid
    ok = F.pad(ok, (0, pad), value=False)
    logf = F.logsigmoid(f) * ok[:, :T, None]  # padding: no decay, no input
    i = i.masked_fill(~ok[:, :T, None], float("-inf"))
    # (B, H, N, L) gates; (B, H, N, L, D) q (scaled), k, v
    lf, ii = (F.pad(t.transpose(1, 2), (0, pad), value=fill).view(B, H, N, L)
              for t, fill in ((logf, 0.0), (i, float("-inf"))))
    qh, kh, vh = (F.pad(t, (0, 0, 0, 0, 0, pad)).view(B, N, L, H, -1).permute(0, 3, 1, 2, 4) for t in (q, k, v))
    qh = qh * Dk ** -0.5
    b = lf.cumsum(-1)
    # the last document start at or before each token in its chunk (-1: none), and the log forget sum before it
    pos = torch.arange(L, device=q.device)
    first = torch.full((B, N, L), -1, dtype=torch.long, device=q.device)
    if starts is not None:
        first = torch.where(F.pad(starts, (0, pad), value=False).view(B, N, L), pos, -1).cummax(-1).values
    keep = (first < 0)[:, None]  # (B, 1, N, L): the memory before the chunk reaches the token
    at = first.clamp_min(0)[:, None].expand(B, H, N, L)
    fresh = b - (b.gather(-1, at) - lf.gather(-1, at))  # a token after a start: the initial state's b_t − b_start-1
    pairs = (pos[:, None] >= pos[None, :]) & (pos[None, None, None, :] >= first[..., None])  # (B, N, L, L)
    logd = torch.where(pairs[:, None], b[..., :, None] - b[..., None, :] + ii[..., None, :], float("-inf"))
    # each chunk's own memory at its end (its last token's document): log weights, their maximum, the sums
    end = logd[..., -1, :]  # (B, H, N, L)
    m_own = end.amax(-1)  # (B, H, N), −inf where no real token of that document is in the chunk
    w = (end - m_own.clamp_min(-1e38)[..., None]).exp()  # (B, H, N, L)
    C_own = (kh * w[..., None]).transpose(-1, -2) @ vh  # (B, H, N, Dk, Dv)
    n_own = (kh * w[..., None]).sum(-2)  # (B, H, N, Dk)
    # the memory before each chunk, chunk by chunk: transformers' mlstm_chunkwise_recurrent_fw_C
    befores = []
    for c in range(N):
        befores.append((C, n, m))
        carried = torch.where(keep[:, :, c, -1], b[..., c, -1] + m, fresh[..., c, -1])  # (B, H)
        top = torch.maximum(carried, m_own[..., c])
        g = (carried - top).exp() * keep[:, :, c, -1]  # the memory before's weight (0 after a start)
        o = (m_own[..., c] - top).exp()
        C = g[..., None, None] * C + o[..., None, None] * C_own[:, :, c]
        n = g[..., None] * n + o[..., None] * n_own[:, :, c]
        m = top
    C0, n0, m0 = (torch.stack(t, 2) for t in zip(*befores))  # (B, H, N, ...)
    # every token: m_t from the memory before its chunk and the chunk's tokens, then h_t
    carried = torch.where(keep, b + m0[..., None], fresh)  # (B, H, N, L)
    top = torch.maximum(carried, logd.amax(-1))
    d = (logd - top[..., None]).exp()  # (B, H, N, L, L)
    g = (carried - top).exp() * keep  # (B, H, N, L)
    mix = (qh @ kh.transpose(-1, -2)) * d
    q_carried = qh * g[..., None]
    numer = q_carried @ C0 + mix @ vh  # (B, H, N, L, Dv)
    denom = (q_carried @ n0[..., None])[..., 0] + mix.sum(-1)  # (B, H, N, L)
    h = numer / (torch.maximum(denom.abs(), (-top).exp()) + eps)[..., None]
    return h.permute(0, 2, 3, 1, 4).reshape(B, N * L, H, Dv)[:, :T], (C, n, m)
