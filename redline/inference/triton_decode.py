"""A fused decode-attention kernel in Triton: one query token per row against the static KV cache.

The compiled "matmul" decode step spends three kernels per layer on attention (q·Kᵀ, the masked softmax, ·V)
and reads the attended width of the cache twice. Here each program takes one row's kv head and all H/KV query
heads that share it, packed as the rows of one small matrix product, so the cache is read once per kv head:

- `_whole_kernel`, grid (B · KV): one kernel; each program runs an online softmax over the whole width, 64
  slots a step. Used when there are enough (row, kv head) pairs to fill the GPU: batches above one.
- `_split_kernel` + `_combine_kernel` (split-K, "flash-decoding"): at batch 1 there are only KV programs, so
  the width is cut into spans of 128 slots, one program each, loaded whole; each writes its span's
  unnormalised softmax · V, max and sum, and the combine kernel (grid B · H) rescales the spans to a common
  max and normalises.

The mask is computed in the kernels from the row's left padding, the current slot and the sliding window, so
no mask tensor is read, and the cache loads depend on nothing loaded. Scores and softmax are fp32;
the probabilities are cast to the cache's dtype for the product with V, as FlashAttention does.

Registered as `torch.ops.redline.decode_attention` through torch.library.triton_op, so torch.compile places
the kernels inside its generated code and CUDA graphs capture them like any other kernel.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

SPLIT_SLOTS = 128  # cache slots per program of the split kernel
WHOLE_FROM_PROGRAMS = 32  # from this many (row, kv head) pairs on, one program per pair over the whole width
WHOLE_BLOCK = 64  # cache slots per step of the whole-width kernel's loop


@triton.jit
def _attended_range(Pad, Slot, b, window):
    """(lo, slot): row b attends to cache slots lo..slot."""
    slot = tl.load(Slot).to(tl.int32)
    lo = tl.load(Pad + b).to(tl.int32)
    if window > 0:
        lo = tl.maximum(lo, slot - window + 1)
    return lo, slot


@triton.jit
def _dot(a, b):
    """a · b with fp32 accumulation; fp32 inputs exactly (no TF32), others with a cast to b's dtype."""
    if b.dtype == tl.float32:
        out = tl.dot(a.to(tl.float32), b, input_precision="ieee")
    else:
        out = tl.dot(a.to(b.dtype), b)
    return out


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
    lo, slot = _attended_range(Pad, Slot, b, window)
    valid = (n >= lo) & (n <= slot)

    s = _dot(q, tl.trans(k))
    s = tl.where(valid[None, :], (s * qk_scale).to(tl.float32), float("-inf"))
    m = tl.max(s, 1)
    p = tl.exp2(s - tl.where(m == float("-inf"), 0.0, m)[:, None])  # a span with no slot to attend: p = 0
    l = tl.sum(p, 1)
    acc = _dot(p, v)

    part = (bk * n_splits + split) * G + g  # (B·KV, splits, G) layout; padding rows are not written
    tl.store(Mp + part, m, mask=g < G)
    tl.store(Lp + part, l, mask=g < G)
    tl.store(Op + part[:, None] * D + d[None, :], acc, mask=(g < G)[:, None])


@triton.jit
def _whole_kernel(Q, K, V, Pad, Slot, Out,
                  sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h,
                  n_kv, width, window, qk_scale,
                  G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
    bk = tl.program_id(0)
    b = bk // n_kv
    kv = bk % n_kv
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    q = tl.load(Q + b * sq_b + (kv * G + g)[:, None] * sq_h + d[None, :], mask=(g < G)[:, None], other=0.0)
    lo, slot = _attended_range(Pad, Slot, b, window)
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    for n0 in range(0, width, BLOCK):  # online softmax over the width, tile by tile (Triton pipelines the loads)
        n = n0 + tl.arange(0, BLOCK)
        inside = (n < width)[:, None]
        k = tl.load(K + b * sk_b + kv * sk_h + n[:, None] * sk_s + d[None, :], mask=inside, other=0.0)
        v = tl.load(V + b * sv_b + kv * sv_h + n[:, None] * sv_s + d[None, :], mask=inside, other=0.0)
        s = _dot(q, tl.trans(k))
        s = tl.where(((n >= lo) & (n <= slot))[None, :], (s * qk_scale).to(tl.float32), float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no slot attended yet: keep p = 0, not NaN
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p, v)
        m = m_new
    out = acc / l[:, None]
    tl.store(Out + b * so_b + (kv * G + g)[:, None] * so_h + d[None, :], out.to(Out.dtype.element_ty),
             mask=(g < G)[:, None])


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
    split: cache slots per program of the split kernel, a power of two >= 16; -1: the whole-width kernel; 0: the
    split kernel for a batch of one (or any batch of fewer than WHOLE_FROM_PROGRAMS row · kv head pairs outside
    torch.compile), else the whole-width kernel.
    -> (B, H, D) in q's dtype. Query head h uses kv head h // (H/KV)."""
    B, H, D = q.shape
    KV, W = k_cache.shape[1], k_cache.shape[2]
    if q.stride(-1) != 1:
        q = q.contiguous()
    G = H // KV
    G_PAD = max(16, triton.next_power_of_2(G))
    out = torch.empty((B, H, D), dtype=q.dtype, device=q.device)
    qk_scale = D ** -0.5 * math.log2(math.e)  # exp2 in the kernels
    q_strides = (q.stride(0), q.stride(1))
    kv_strides = (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                  v_cache.stride(0), v_cache.stride(1), v_cache.stride(2))
    if split < 0 or (not split and not (isinstance(B, int) and B * KV < WHOLE_FROM_PROGRAMS)):
        # enough (row, kv head) programs to fill the GPU: one kernel, each program over the whole width
        wrap_triton(_whole_kernel)[(B * KV,)](
            q, k_cache, v_cache, pad, slot, out, *q_strides, *kv_strides, out.stride(0), out.stride(1),
            KV, W, window, qk_scale, G=G, G_PAD=G_PAD, D=D, BLOCK=WHOLE_BLOCK,
        )
        return out
    split = split or SPLIT_SLOTS
    n_splits = (W + split - 1) // split
    parts = torch.empty((B * KV * n_splits * G, D), dtype=torch.float32, device=q.device)
    maxes = torch.empty((B * KV * n_splits * G,), dtype=torch.float32, device=q.device)
    sums = torch.empty_like(maxes)
    wrap_triton(_split_kernel)[(B * KV, n_splits)](
        q, k_cache, v_cache, pad, slot, parts, maxes, sums, *q_strides, *kv_strides,
        KV, n_splits, W, window, qk_scale, G=G, G_PAD=G_PAD, D=D, SPLIT=split,
    )
    wrap_triton(_combine_kernel)[(B * H,)](parts, maxes, sums, out, out.stride(0), out.stride(1), H, n_splits,
                                           G=G, D=D)
    return out


def check_supported(head_dim: int, device: torch.device) -> str | None:
    """Why this kernel cannot run for the model on this GPU (None: it can)."""
    if torch.cuda.get_device_capability(device) < (8, 0):
        return "decode_attention triton needs a GPU of compute capability 8.0 or newer; use matmul"
    if head_dim < 16 or head_dim & (head_dim - 1):
        return (f"decode_attention triton needs a power-of-two head_dim of at least 16, and this model's is "
                f"{head_dim}; use matmul")
    return None
