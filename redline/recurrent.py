"""Recurrent token mixers' sequence kernels: the gated delta rule of model.delta_layers (Qwen3.5's linear attention)
and Mamba-2's scan, computed chunk by chunk in PyTorch, and Mamba-1's selective scan (a state per channel). The
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
