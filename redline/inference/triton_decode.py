"""A fused decode-attention kernel in Triton: one query token per row against the static KV cache.

The compiled "matmul" decode step spends three kernels per layer on attention (q·Kᵀ, the masked softmax, ·V)
and reads the attended width of the cache twice; at batch 1 the step is latency-bound, so kernels count. Here
attention is two kernels whatever the width, in the split-K ("flash-decoding") layout:

1. `_split_kernel`, grid (B · KV, ceil(W / split)): each program takes one row's kv head, all H/KV query
   heads that share it (packed as the rows of one small matrix product, so the cache is read once per kv
   head), and one span of `split` cache slots (64 or 128) loaded whole; it writes the span's unnormalised
   softmax · V, its max and its sum.
2. `_combine_kernel`, grid (B · H): rescales the spans' partial results to a common max and normalises.

The mask is computed in the kernel from the row's left padding, the current slot and the sliding window, so
no mask tensor is built or read; the loads depend on nothing loaded, so they are issued at once. Scores and softmax are
fp32; the probabilities are cast to the cache's dtype for the product with V, as FlashAttention does.

Registered as `torch.ops.redline.decode_attention` through torch.library.triton_op, so torch.compile places
the kernels inside its generated code and CUDA graphs capture them like any other kernel.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

SPLIT_ONE_ROW = 64  # cache slots per program of the split kernel at batch 1 (more programs, shorter each)
SPLIT_MANY_ROWS = 128  # and at larger batches, where rows and kv heads already fill the GPU


@triton.jit
def _split_kernel(Q, K, V, Pad, Slot, Op, Mp, Lp,
                  sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
                  n_kv, n_splits, width, window, qk_scale,
                  G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr):
    bk = tl.program_id(0)
    split = tl.program_id(1)
    b = bk // n_kv
    kv = bk % n_kv
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    n = split * SPLIT + tl.arange(0, SPLIT)
    # the loads depend on nothing loaded: they go out at once, beside the loads of the slot and the padding
    inside = (n < width)[:, None]
    q = tl.load(Q + b * sq_b + (kv * G + g)[:, None] * sq_h + d[None, :], mask=(g < G)[:, None], other=0.0)
    k = tl.load(K + b * sk_b + kv * sk_h + n[:, None] * sk_s + d[None, :], mask=inside, other=0.0)
    v = tl.load(V + b * sv_b + kv * sv_h + n[:, None] * sv_s + d[None, :], mask=inside, other=0.0)
    slot = tl.load(Slot).to(tl.int32)
    lo = tl.load(Pad + b).to(tl.int32)
    if window > 0:
        lo = tl.maximum(lo, slot - window + 1)
    valid = (n >= lo) & (n <= slot)

    if Q.dtype.element_ty == tl.float32:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    m = tl.max(s, 1)
    p = tl.exp2(s - tl.where(m == float("-inf"), 0.0, m)[:, None])  # a span with no slot to attend: p = 0
    l = tl.sum(p, 1)
    if Q.dtype.element_ty == tl.float32:
        acc = tl.dot(p, v, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v)

    part = (bk * n_splits + split) * G + g  # (B·KV, splits, G) layout; padding rows are not written
    tl.store(Mp + part, m, mask=g < G)
    tl.store(Lp + part, l, mask=g < G)
    tl.store(Op + part[:, None] * D + d[None, :], acc, mask=(g < G)[:, None])


@triton.jit
def _combine_kernel(Op, Mp, Lp, Out, so_b, so_h, n_heads, n_splits, G: tl.constexpr, D: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // n_heads
    h = bh % n_heads
    first = ((b * (n_heads // G) + h // G) * n_splits) * G + h % G  # (row, kv head, split 0, g)
    m = tl.load(Mp + first)
    for s in range(1, n_splits):  # an empty span has max -inf; the slot itself is in some span, so m is finite
        m = tl.maximum(m, tl.load(Mp + first + s * G))
    d = tl.arange(0, D)
    l = tl.zeros([1], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for s in range(0, n_splits):
        w = tl.exp2(tl.load(Mp + first + s * G) - m)
        l += w * tl.load(Lp + first + s * G)
        acc += w * tl.load(Op + (first + s * G) * D + d)
    tl.store(Out + b * so_b + h * so_h + d, (acc / l).to(Out.dtype.element_ty))


@triton_op("redline::decode_attention", mutates_args=())
def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pad: torch.Tensor,
                     slot: torch.Tensor, window: int, split: int = 0) -> torch.Tensor:
    """q (B, H, D); caches (B, KV, W, D) (views of the buffers are fine); pad (B,) and slot (1,) int64 on the
    device; window: the sliding window (0: none). Row b attends to slots max(pad_b, slot - window + 1)..slot.
    split: cache slots per program, a power of two >= 16 (0: SPLIT_ONE_ROW at batch 1, else SPLIT_MANY_ROWS).
    -> (B, H, D) in q's dtype. Query head h uses kv head h // (H/KV)."""
    B, H, D = q.shape
    KV, W = k_cache.shape[1], k_cache.shape[2]
    if q.stride(-1) != 1:
        q = q.contiguous()
    G = H // KV
    if not split:  # under torch.compile a batch of one is a static 1, larger batches are symbolic: no guard
        split = SPLIT_ONE_ROW if isinstance(B, int) and B == 1 else SPLIT_MANY_ROWS
    n_splits = (W + split - 1) // split
    parts = torch.empty((B * KV * n_splits * G, D), dtype=torch.float32, device=q.device)
    maxes = torch.empty((B * KV * n_splits * G,), dtype=torch.float32, device=q.device)
    sums = torch.empty_like(maxes)
    out = torch.empty((B, H, D), dtype=q.dtype, device=q.device)
    qk_scale = D ** -0.5 * math.log2(math.e)  # exp2 in the kernel
    wrap_triton(_split_kernel)[(B * KV, n_splits)](
        q, k_cache, v_cache, pad, slot, parts, maxes, sums,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        KV, n_splits, W, window, qk_scale,
        G=G, G_PAD=max(16, triton.next_power_of_2(G)), D=D, SPLIT=split,
    )
    wrap_triton(_combine_kernel)[(B * H,)](parts, maxes, sums, out, out.stride(0), out.stride(1), H, n_splits,
                                           G=G, D=D)
    return out


def check_supported(head_dim: int) -> str | None:
    """Why this kernel cannot run for the model (None: it can)."""
    if head_dim < 16 or head_dim & (head_dim - 1):
        return (f"decode_attention triton needs a power-of-two head_dim of at least 16, and this model's is "
                f"{head_dim}; use matmul")
    return None
