"""A fused decode-attention kernel in Triton: this step's token against the static KV cache, from the qkv
projection's output to the attention's output in one launch per layer.

The compiled decode step otherwise spends about six kernels per layer between the qkv projection and the output
projection: QK-norm + RoPE of the query, QK-norm + RoPE of the key with its cache write, the value's cache
write, and the attention itself (q·Kᵀ, masked softmax, ·V). Here one kernel takes the fused qkv projection's
output as it is and, in each program:

- applies QK-norm (RMSNorm over head_dim, rounded to the model's dtype as nn.RMSNorm does) and RoPE (each
  row's cos/sin, the pairs being (first half, second half) as in model.apply_rope) to the query heads and to
  this step's key;
- writes the key and value into the current slot of the layer's cache (the program whose span holds that
  slot), and uses them from registers, so no program depends on another's write;
- attends: one row's kv head with all H/KV query heads that share it, packed as the rows of one small matrix
  product, so the cache is read once per kv head. The mask is computed from the row's slot and the
  sliding window, so no mask tensor is read. Scores and softmax are fp32; for a tensor-core product
  with V the probabilities are cast to the cache's dtype, as FlashAttention does.

Two layouts:
- `_whole_kernel`, grid (B · KV): each program starts an online softmax at the new token (from registers) and
  runs it over the cache slots before it, 128 a step: the tiles go from memory to the products as loaded.
  Used when there are enough (row, kv head) pairs to fill the GPU: batches above one. A kv head with a single
  query head (GPT-2's) would leave 15 of a tensor-core product's 16 rows empty: there each of the tile's slot
  lanes keeps an online softmax of its own, in registers, and the lanes are merged once at the end.
- `_split_kernel`, grid (B · KV, spans) (split-K, "flash-decoding"): at batch 1 there are only KV programs, so
  the width is cut into spans (of 128 slots in bf16: split_slots), one program each, loaded whole. Each
  program writes its span's unnormalised softmax · V, max and sum, then counts itself done on an atomic counter
  of its (row, kv head); the last one to finish rescales the spans to a common max, normalises and writes the
  output, and puts the counter back to zero. No second kernel is launched.

An FP8 cache (float8_e4m3fn, with an fp32 scale per (row, kv head, slot): the vector's absolute maximum times
fp32(1/448)) is read as it is, half of bf16's bytes per element plus the scales: the tile is converted to the
compute dtype in registers (the whole-width kernel's keys to fp16, against a query scaled into fp16's range), q·k
is scaled by each slot's key scale, and the probabilities by each slot's value scale before the product with V. The new key and value are quantised in the kernel exactly as quantize_kv does it, and
the step attends to what it stored (so it and every later step see the same cache).

Registered as `torch.ops.redline.decode_attention` (and `decode_attention_fp8`), opaque custom ops that launch the
kernels themselves (with programmatic dependent launch on Hopper and newer: kernels/launch.py), so
torch.compile calls them as they are and CUDA graphs capture them like any other kernel.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from redline.inference.kernels.launch import shared_memory, start_dependents_then_wait, use_pdl

# The split kernel's span: each program loads its span of keys and of values whole, up to SPLIT_BYTES each in the
# compute dtype and SPLIT_MAX_SLOTS slots (in bf16: 128 slots at head_dim 64 and at 128), with SPLIT_WIDE_WARPS warps
# where a span holds SPLIT_BYTES (head_dim 128 in bf16), else 4: the fastest spans and warps of whole models decoding
# at batch 1 (BENCHMARKS.md, "The decode kernels alone": at head_dim 128, 128-slot spans were slower than 64-slot
# ones with 4 warps, faster with 8; 32-slot spans were slower at either head_dim).
SPLIT_BYTES, SPLIT_MAX_SLOTS, SPLIT_WIDE_WARPS = 128 * 128 * 2, 128, 8


def split_slots(head_dim: int, element_size: int) -> int:
    """Cache slots per program of the split kernel at this head_dim and compute dtype's element size (a power of
    two, at least 16)."""
    return max(16, min(SPLIT_MAX_SLOTS, SPLIT_BYTES // (head_dim * element_size)))


def split_warps(slots: int, head_dim: int, element_size: int) -> int:
    """Warps per program of the split kernel for spans of `slots` slots."""
    return SPLIT_WIDE_WARPS if slots * head_dim * element_size >= SPLIT_BYTES else 4


WHOLE_FROM_PROGRAMS = 32  # from this many (row, kv head) pairs on, one program per pair over the whole width
# The whole-width kernel's tile: cache slots per step of its loop, warps per program, pipeline stages (2 for one
# query head per kv head with a bf16 cache, else 3): the fastest of a sweep with
# scripts/gpu/decode_attention_bench.py --configs (BENCHMARKS.md, decode attention).
WHOLE_BLOCK, WHOLE_WARPS, WHOLE_STAGES, WHOLE_STAGES_ONE_HEAD = 128, 4, 3, 2
# Its tile for one query head per kv head, without tensor cores (_lanes_loop): slots per step (its lanes), warps,
# stages of the loop (the sweep's --lanes-configs).
WHOLE_LANES_BLOCK, WHOLE_LANES_WARPS, WHOLE_LANES_STAGES = 32, 2, 3
# Query heads per kv head from which q·Kᵀ and p·V run on tensor cores (padded to 16 rows). Below it (only 1 can
# be: a head of its own, GPT-2's) a 16-row product would be 15/16 padding, so they run in registers: the split
# kernel as products and sums, the whole-width one as an online softmax per slot lane.
SPLIT_MMA_FROM_GROUP, WHOLE_MMA_FROM_GROUP = 2, 2
INV_FP8_MAX = tl.constexpr(1.0 / 448.0)  # 1 / the largest float8_e4m3fn, rounded to fp32 where used


# Shared memory a program keeps free of the whole-width kernel's pipelined cache tiles (Triton's own buffers: the
# products' operands in their layouts).
SMEM_HEADROOM = 32 * 1024


def fit_tile(block: int, stages: int, slot_bytes: int, smem: int) -> tuple[int, int]:
    """(BLOCK, stages) of the whole-width kernel whose pipelined tiles (stages · BLOCK slots of slot_bytes, a key
    and a value) leave SMEM_HEADROOM of a program's `smem` bytes: fewer stages first (down to 2), then narrower
    tiles (a head_dim-128 fp32 cache would need 384 KiB at the bf16 tile)."""
    while stages * block * slot_bytes > smem - SMEM_HEADROOM and (stages > 2 or block > 16):
        if stages > 2:
            stages -= 1
        else:
            block //= 2
    return block, stages


def counters_needed(n_kv_head: int) -> int:
    """Length of the int32 zeros buffer `counts` the op needs for any batch (the split kernel runs only below
    WHOLE_FROM_PROGRAMS (row, kv head) pairs, and at batch 1)."""
    return max(WHOLE_FROM_PROGRAMS, n_kv_head)


@triton.jit
def _attended_range(Slot, b, window):
    """(lo, slot): row b writes cache slot `slot` and attends to slots lo..slot (lo 0, or the window's start)."""
    slot = tl.load(Slot + b).to(tl.int32)
    lo = tl.maximum(slot - window + 1, 0) if window > 0 else 0
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
def _scores(q, k, MMA: tl.constexpr):
    """q (G_PAD, D) · k (BLOCK, D)ᵀ -> (G_PAD, BLOCK) fp32: on tensor cores (MMA: G_PAD >= 16, padding rows
    included), or for a single query row (G_PAD 1) as products and a sum over D in registers."""
    if MMA:
        out = _dot(q, tl.trans(k))
    else:
        q_row = tl.reshape(q, [q.shape[1]]).to(k.dtype).to(tl.float32)
        out = tl.sum(k.to(tl.float32) * q_row[None, :], 1)[None, :]
    return out


@triton.jit
def _weighted(p, v, MMA: tl.constexpr):
    """p (G_PAD, BLOCK) fp32 · v (BLOCK, D) -> (G_PAD, D) fp32, p rounded to v's dtype (as FlashAttention does)."""
    if MMA:
        out = _dot(p, v)
    else:
        p_row = tl.reshape(p, [p.shape[1]]).to(v.dtype).to(tl.float32)
        out = tl.sum(p_row[:, None] * v.to(tl.float32), 0)[None, :]
    return out


@triton.jit
def _norm_rope(X, W, Cos, Sin, rows, eps, D: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr):
    """Head vectors at X + rows · D (rows: (R, 1), masked where negative) -> QK-norm and RoPE applied, (R, D) in
    X's dtype. RoPE needs each element's partner in the other half, so the heads are also loaded with their halves
    swapped (the same bytes: a second load from cache, not from memory)."""
    dtype = X.dtype.element_ty
    d = tl.arange(0, D)[None, :]
    x = tl.load(X + rows * D + d, mask=rows >= 0, other=0.0).to(tl.float32)
    if NORM or ROPE:
        swap = (d + D // 2) % D
        xs = tl.load(X + rows * D + swap, mask=rows >= 0, other=0.0).to(tl.float32)
        if NORM:  # nn.RMSNorm: normalise in fp32, round, then scale by the weight and round again
            r = tl.rsqrt(tl.sum(x * x, 1) / D + eps)[:, None]
            x = ((x * r).to(dtype).to(tl.float32) * tl.load(W + d).to(tl.float32)).to(dtype).to(tl.float32)
            xs = ((xs * r).to(dtype).to(tl.float32) * tl.load(W + swap).to(tl.float32)).to(dtype).to(tl.float32)
        if ROPE:  # (x1, x2) -> (x1·cos - x2·sin, x1·sin + x2·cos), in fp32
            half = d % (D // 2)
            sign = tl.where(d < D // 2, -1.0, 1.0)
            x = x * tl.load(Cos + half) + sign * xs * tl.load(Sin + half)
    return x.to(dtype)


@triton.jit
def _new_token(QKV, QW, KW, Cos, Sin, b, kv, s_b, sc_b, n_kv, eps,
               G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr):
    """This step's G query heads of kv head `kv` as (G_PAD, D) (padding rows zero), and its key and value
    (1, D), QK-norm and RoPE applied. Row b of QKV holds the H query heads, then the KV keys, then the values."""
    row = QKV + b * s_b
    g = tl.arange(0, G_PAD)[:, None]
    q = _norm_rope(row, QW, Cos + b * sc_b, Sin + b * sc_b, tl.where(g < G, kv * G + g, -1), eps, D, NORM, ROPE)
    key = tl.full([1, 1], 0, tl.int32) + n_kv * G + kv  # the head index of kv head `kv`'s key in the row
    k = _norm_rope(row, KW, Cos + b * sc_b, Sin + b * sc_b, key, eps, D, NORM, ROPE)
    v = tl.load(row + (n_kv * (G + 1) + kv) * D + tl.arange(0, D)[None, :])
    return q, k, v


@triton.jit
def _rescale(m, m_new):
    """The online softmax's step to a new running max: (m_safe, alpha), exponents are taken against m_safe (0
    while nothing is attended, so that p = 0 rather than NaN), and alpha rescales what was summed against m."""
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_safe, tl.exp2(m - m_safe)


@triton.jit
def _quantize(x, S, store, QUANT: tl.constexpr):
    """x (1, D) -> what the cache holds for it, as x's dtype, and its scale (1,) (1.0 for a cache of x's dtype),
    storing the scale at S when QUANT and `store`. float8: scale = max|x| · fp32(1/448) (at least the smallest
    normal fp32), x / scale rounded to e4m3; the division rounded to nearest, as torch divides (quantize_kv)."""
    if QUANT:
        xf = x.to(tl.float32)
        amax = tl.max(tl.abs(xf), 1)
        scale = tl.maximum(amax * INV_FP8_MAX, 1.1754943508222875e-38)
        x = tl.math.div_rn(xf, tl.broadcast_to(scale[:, None], xf.shape)).to(tl.float8e4nv).to(x.dtype)
        if store:
            tl.store(S + tl.zeros([1], tl.int32), scale)
    else:
        scale = tl.full([1], 1.0, tl.float32)
    return x, scale


@triton.jit
def _scales(KS, VS, at, inside, N: tl.constexpr, QUANT: tl.constexpr):
    """An FP8 cache's key and value scales (N,) at offsets `at` (ones for a cache in the compute dtype)."""
    if QUANT:
        k_scale = tl.load(KS + at, mask=inside, other=0.0)
        v_scale = tl.load(VS + at, mask=inside, other=0.0)
    else:
        k_scale = tl.full([N], 1.0, tl.float32)
        v_scale = tl.full([N], 1.0, tl.float32)
    return k_scale, v_scale


@triton.jit
def _with_new(c, scale, here, new, new_scale):
    """A loaded cache tile c (BLOCK, D) as the new value's dtype with the slot's old value replaced by `new` where
    `here` (BLOCK,) (the slot this step writes), and its scales (BLOCK,) likewise."""
    return tl.where(here[:, None], new, c.to(new.dtype)), tl.where(here, new_scale, scale)


@triton.jit
def _combine(Op, Mp, Lp, Out, bk, b, kv, n_splits, so_b, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr):
    """Merge the spans' partial results of (row b, kv head kv) and write its G heads' output: one pass with an
    online rescaling, unrolled so that several spans' loads are in flight at once (each is a round trip to L2,
    and this runs after every other program of the pair has finished: it is the kernel's critical path)."""
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    rows = g < G
    first = bk * n_splits * G + g  # (B·KV, splits, G) layout
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    for s in tl.range(n_splits, loop_unroll_factor=4):
        # ".cg": read from L2, where the other programs' writes are, never from this SM's L1
        m_s = tl.load(Mp + first + s * G, mask=rows, other=float("-inf"), cache_modifier=".cg")
        l_s = tl.load(Lp + first + s * G, mask=rows, other=0.0, cache_modifier=".cg")
        o_s = tl.load(Op + (first + s * G)[:, None] * D + d[None, :], mask=rows[:, None], other=0.0,
                      cache_modifier=".cg")
        m_new = tl.maximum(m, m_s)  # an empty span has max -inf; the slot's own span makes it finite
        m_safe, alpha = _rescale(m, m_new)  # (no attended span yet, or a padding row: m_safe 0)
        w = tl.exp2(m_s - m_safe)
        l = l * alpha + w * l_s
        acc = acc * alpha[:, None] + w[:, None] * o_s
        m = m_new
    out = acc / tl.where(rows, l, 1.0)[:, None]
    tl.store(Out + b * so_b + (kv * G + g)[:, None] * D + d[None, :], out.to(Out.dtype.element_ty),
             mask=rows[:, None])


@triton.jit
def _split_kernel(QKV, QW, KW, Cos, Sin, K, V, KS, VS, Slot, Counts, Op, Mp, Lp, Out,
                  s_b, sc_b, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, ss_b, ss_h, so_b,
                  n_kv, n_splits, width, window, qk_scale, eps,
                  G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr,
                  NORM: tl.constexpr, ROPE: tl.constexpr, QUANT: tl.constexpr, MMA: tl.constexpr,
                  PDL: tl.constexpr):
    bk = tl.program_id(0)
    split = tl.program_id(1)
    b = bk // n_kv
    kv = bk % n_kv
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)[None, :]
    n = split * SPLIT + tl.arange(0, SPLIT)
    scales = b * ss_b + kv * ss_h
    # the span's loads depend on nothing loaded: they go out first, beside the loads of the new token
    inside = (n < width)[:, None]
    k = tl.load(K + b * sk_b + kv * sk_h + n[:, None] * sk_s + d, mask=inside, other=0.0)
    v = tl.load(V + b * sv_b + kv * sv_h + n[:, None] * sv_s + d, mask=inside, other=0.0)
    k_scale, v_scale = _scales(KS, VS, scales + n, n < width, SPLIT, QUANT)
    # (the cache is written by no kernel of this step before this one: its loads go out before the wait; the
    # output projection may start now and load its weights beside this kernel, which measured faster than letting
    # it in once the spans are stored: docs/results/h100-2026-11-27j/)
    start_dependents_then_wait(PDL)
    lo, slot = _attended_range(Slot, b, window)
    q, k_new, v_new = _new_token(QKV, QW, KW, Cos, Sin, b, kv, s_b, sc_b, n_kv, eps, G, G_PAD, D, NORM, ROPE)
    mine = (slot >= split * SPLIT) & (slot < split * SPLIT + SPLIT)  # this span holds the slot: it writes the cache
    k_new, k_new_scale = _quantize(k_new, KS + scales + slot, mine, QUANT)
    v_new, v_new_scale = _quantize(v_new, VS + scales + slot, mine, QUANT)
    if mine:
        tl.store(K + b * sk_b + kv * sk_h + slot * sk_s + d, k_new.to(K.dtype.element_ty))
        tl.store(V + b * sv_b + kv * sv_h + slot * sv_s + d, v_new.to(V.dtype.element_ty))
    here = n == slot  # what was loaded there is the old value: use the new one
    k, k_scale = _with_new(k, k_scale, here, k_new, k_new_scale)
    v, v_scale = _with_new(v, v_scale, here, v_new, v_new_scale)
    valid = (n >= lo) & (n <= slot)

    s = _scores(q, k, MMA)
    if QUANT:
        s = s * k_scale[None, :]
    s = tl.where(valid[None, :], (s * qk_scale).to(tl.float32), float("-inf"))
    m = tl.max(s, 1)
    p = tl.exp2(s - tl.where(m == float("-inf"), 0.0, m)[:, None])  # a span with no slot to attend: p = 0
    l = tl.sum(p, 1)
    if QUANT:
        p = p * v_scale[None, :]
    acc = _weighted(p, v, MMA)

    part = (bk * n_splits + split) * G + g  # (B·KV, splits, G) layout; padding rows are not written
    tl.store(Mp + part, m, mask=g < G)
    tl.store(Lp + part, l, mask=g < G)
    tl.store(Op + part[:, None] * D + d, acc, mask=(g < G)[:, None])
    # every thread's stores come before the count (the barrier), and the count releases them to the GPU and
    # acquires the others' (acq_rel): the last program of this (row, kv head) sees every span
    tl.debug_barrier()
    if tl.atomic_add(Counts + bk, 1, sem="acq_rel") == n_splits - 1:
        _combine(Op, Mp, Lp, Out, bk, b, kv, n_splits, so_b, G, G_PAD, D)
        tl.atomic_xchg(Counts + bk, 0)  # zero again for the next call


@triton.jit
def _cache_tile(KB, VB, KS, VS, scales, n, lo, slot, sk_s, sv_s, D: tl.constexpr, BLOCK: tl.constexpr,
                QUANT: tl.constexpr):
    """The whole-width kernel's cache tile at slots n (BLOCK,): (k, v, k_scale, v_scale, valid), valid the slots
    lo..slot-1 it attends to, the others loaded as zeros (scales: ones for a cache in the compute dtype)."""
    d = tl.arange(0, D)[None, :]
    valid = (n >= lo) & (n < slot)
    k = tl.load(KB + n[:, None] * sk_s + d, mask=valid[:, None], other=0.0)
    v = tl.load(VB + n[:, None] * sv_s + d, mask=valid[:, None], other=0.0)
    k_scale, v_scale = _scales(KS, VS, scales + n, valid, BLOCK, QUANT)
    return k, v, k_scale, v_scale, valid


@triton.jit
def _tiles_loop(q, m, l, acc, KB, VB, KS, VS, scales, lo, slot, sk_s, sv_s, qk_scale,
                G_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, QUANT: tl.constexpr):
    """The whole-width kernel's online softmax over slots lo..slot-1 on tensor cores, tile by tile, from the new
    token's (m, l, acc): q·Kᵀ and p·V as (G_PAD, BLOCK) and (G_PAD, D) products. -> the output (G_PAD, D) fp32."""
    # An FP8 tile converts to fp16 in one instruction per two values (to bf16 it takes three) and e4m3 fits fp16
    # exactly, so a half-precision query is scaled to at most 1 (fp16's range) and made fp16, its scale folded
    # into the scores'. An fp32 query stays fp32 (the tile converts to it).
    KEYS_F16: tl.constexpr = QUANT and q.dtype != tl.float32
    if KEYS_F16:
        q_max = tl.maximum(tl.max(tl.abs(q.to(tl.float32)), 1), 1e-30)
        q_dot = (q.to(tl.float32) / q_max[:, None]).to(tl.float16)
        row_scale = q_max * qk_scale
    else:
        q_dot = q
        row_scale = tl.full([G_PAD], 1.0, tl.float32) * qk_scale
    for n0 in range(lo - lo % BLOCK, slot, BLOCK):  # online softmax over slots lo..slot-1, tile by tile
        k, v, k_scale, v_scale, valid = _cache_tile(KB, VB, KS, VS, scales, n0 + tl.arange(0, BLOCK), lo, slot,
                                                    sk_s, sv_s, D, BLOCK, QUANT)
        if QUANT:
            s = _scores(q_dot, k.to(q_dot.dtype), True) * k_scale[None, :]
        else:
            s = _scores(q_dot, k, True)
        s = tl.where(valid[None, :], s * row_scale[:, None], float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        if QUANT:
            acc = acc * alpha[:, None] + _weighted(p * v_scale[None, :], v.to(q.dtype), True)
        else:
            acc = acc * alpha[:, None] + _weighted(p, v, True)
        m = m_new
    return acc / l[:, None]


@triton.jit
def _lanes_loop(q, m_new_token, v_new_token, KB, VB, KS, VS, scales, lo, slot, sk_s, sv_s, qk_scale,
                D: tl.constexpr, BLOCK: tl.constexpr, QUANT: tl.constexpr, LANES_STAGES: tl.constexpr):
    """The whole-width kernel's softmax over slots lo..slot-1 for a single query row (a kv head of its own, as
    GPT-2's), without tensor cores (whose 16-row products would be 15/16 padding): each of the tile's BLOCK slot
    lanes runs an online softmax of its own over every BLOCK-th slot, in fp32 registers, so a step has no
    reduction across slots; the lanes and the new token (score m_new_token, weight 1, value v_new_token) are
    merged once, at the end. -> the output (1, D) fp32."""
    q_row = tl.reshape(q, [D]).to(tl.float32)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, D], tl.float32)
    for n0 in tl.range(lo - lo % BLOCK, slot, BLOCK, num_stages=LANES_STAGES):
        k, v, k_scale, v_scale, valid = _cache_tile(KB, VB, KS, VS, scales, n0 + tl.arange(0, BLOCK), lo, slot,
                                                    sk_s, sv_s, D, BLOCK, QUANT)
        s = tl.sum(k.to(tl.float32) * q_row[None, :], 1) * (k_scale * qk_scale)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m, s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a lane with nothing attended yet: p = 0
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe)
        l = l * alpha + p
        acc = acc * alpha[:, None] + (p * v_scale)[:, None] * v.to(tl.float32)
        m = m_new
    m_all = tl.maximum(tl.max(m, 0), m_new_token)  # (1,): the new token's score is finite
    w = tl.exp2(m - m_all)  # lanes that attended nothing: 0
    w_new = tl.exp2(m_new_token - m_all)
    total = tl.sum(l * w, 0) + w_new
    out = tl.sum(acc * w[:, None], 0)[None, :] + w_new[:, None] * v_new_token
    return out / total[:, None]


@triton.jit
def _whole_kernel(QKV, QW, KW, Cos, Sin, K, V, KS, VS, Slot, Out,
                  s_b, sc_b, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, ss_b, ss_h, so_b,
                  n_kv, window, qk_scale, eps,
                  G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                  NORM: tl.constexpr, ROPE: tl.constexpr, QUANT: tl.constexpr, MMA: tl.constexpr,
                  LANES_STAGES: tl.constexpr, PDL: tl.constexpr):
    bk = tl.program_id(0)
    b = bk // n_kv
    kv = bk % n_kv
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)[None, :]
    scales = b * ss_b + kv * ss_h
    start_dependents_then_wait(PDL)
    q, k_new, v_new = _new_token(QKV, QW, KW, Cos, Sin, b, kv, s_b, sc_b, n_kv, eps, G, G_PAD, D, NORM, ROPE)
    lo, slot = _attended_range(Slot, b, window)
    k_new, k_new_scale = _quantize(k_new, KS + scales + slot, True, QUANT)
    v_new, v_new_scale = _quantize(v_new, VS + scales + slot, True, QUANT)
    tl.store(K + b * sk_b + kv * sk_h + slot * sk_s + d, k_new.to(K.dtype.element_ty))
    tl.store(V + b * sv_b + kv * sv_h + slot * sv_s + d, v_new.to(V.dtype.element_ty))
    # The new token first, from registers: the online softmax starts at its score (p = 1, so l = 1 and acc = its
    # value), and the loop reads only the cache slots before it, so the tiles go from memory to the products as
    # they are loaded (no slot of them to replace).
    # (qk_scale arrives as fp64 from torch.compile's launcher: every use is made fp32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    m = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), 1) * (k_new_scale * qk_scale)  # (G_PAD,), log2 units
    l = tl.full([G_PAD], 1.0, tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32) + v_new.to(tl.float32) * v_new_scale[:, None]
    kb, vb = K + b * sk_b + kv * sk_h, V + b * sv_b + kv * sv_h
    if MMA:
        out = _tiles_loop(q, m, l, acc, kb, vb, KS, VS, scales, lo, slot, sk_s, sv_s, qk_scale, G_PAD, D, BLOCK,
                          QUANT)
    else:
        out = _lanes_loop(q, m, acc, kb, vb, KS, VS, scales, lo, slot, sk_s, sv_s, qk_scale, D, BLOCK, QUANT,
                          LANES_STAGES)
    tl.store(Out + b * so_b + (kv * G + g)[:, None] * D + d, out.to(Out.dtype.element_ty), mask=(g < G)[:, None])


# Opaque custom ops (not torch.library.triton_op), as the product kernels' (see kernels/linear.py): Triton
# launches the kernels itself, with programmatic dependent launch where the GPU has it.
@torch.library.custom_op("redline::decode_attention", mutates_args={"k_cache", "v_cache", "counts"})
def decode_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot: torch.Tensor,
                     counts: torch.Tensor,
                     width: int, window: int, eps: float, q_norm: torch.Tensor | None = None,
                     k_norm: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                     sin: torch.Tensor | None = None, split: int = 0, scale: float = 0.0) -> torch.Tensor:
    """One decode step of attention for a layer, from the projections to the attention output.

    qkv (B, (H + 2·KV)·D): this step's projections as the fused qkv layer writes them, the H query heads, then
    the KV keys, then the KV values (the row stride is free, the rest contiguous); q_norm, k_norm (D,): the
    QK-norm weights (None: no QK-norm; eps its epsilon); cos, sin (B, D/2) fp32: each row's RoPE angles at its
    position (None: no RoPE). k_cache, v_cache (B, KV, S, D): the layer's whole cache buffers, in qkv's dtype (an
    FP8 cache: decode_attention_fp8); row b's new key and value are written into its slot slot_b (slot: (B,) int64
    on the device) and it attends to slots max(0, slot_b - window + 1)..slot_b of the first `width` (window 0: no
    sliding window; every slot_b < width). counts: int32 zeros, at least counters_needed(KV) long (B · KV for an
    explicit split above that); the split kernel counts in it and leaves it zero.
    split: cache slots per program of the split kernel, a power of two >= 16; -1: the whole-width kernel; 0: the
    split kernel for fewer than WHOLE_FROM_PROGRAMS (row, kv head) pairs (a batch of one), else the whole-width
    kernel. scale: the scores' scale (0: 1 / sqrt(D)).
    -> (B, H·D) in qkv's dtype. Query head h uses kv head h // (H/KV)."""
    return _attend(qkv, k_cache, v_cache, None, None, slot, counts, width, window, eps, q_norm, k_norm, cos, sin,
                   split, scale)


@decode_attention.register_fake
def _(qkv, k_cache, v_cache, slot, counts, width, window, eps, q_norm=None, k_norm=None, cos=None, sin=None,
      split=0, scale=0.0):
    return _output_like(qkv, k_cache)


def _output_like(qkv: torch.Tensor, k_cache: torch.Tensor) -> torch.Tensor:
    """The attention output for qkv: (B, H·D)."""
    _, KV, _, D = k_cache.shape
    return qkv.new_empty(qkv.shape[0], qkv.shape[1] - 2 * KV * D)


# An op of its own, not optional scales on the one above: torch.library mishandles a mutated argument that is None.
@torch.library.custom_op("redline::decode_attention_fp8",
                         mutates_args={"k_cache", "v_cache", "k_scale", "v_scale", "counts"})
def decode_attention_fp8(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor,
                         v_scale: torch.Tensor, slot: torch.Tensor, counts: torch.Tensor,
                         width: int, window: int, eps: float, q_norm: torch.Tensor | None = None,
                         k_norm: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                         sin: torch.Tensor | None = None, split: int = 0, scale: float = 0.0) -> torch.Tensor:
    """decode_attention for an FP8 cache: k_cache, v_cache (B, KV, S, D) float8_e4m3fn with their scales k_scale,
    v_scale (B, KV, S) fp32, slots contiguous (cache.quantize_kv); the new key and value are quantised and stored
    with their scales."""
    return _attend(qkv, k_cache, v_cache, k_scale, v_scale, slot, counts, width, window, eps, q_norm, k_norm,
                   cos, sin, split, scale)


@decode_attention_fp8.register_fake
def _(qkv, k_cache, v_cache, k_scale, v_scale, slot, counts, width, window, eps, q_norm=None, k_norm=None,
      cos=None, sin=None, split=0, scale=0.0):
    return _output_like(qkv, k_cache)


def _attend(qkv, k_cache, v_cache, k_scale, v_scale, slot, counts, width: int, window: int, eps: float,
            q_norm, k_norm, cos, sin, split: int, scale: float = 0.0) -> torch.Tensor:
    """The two ops' launch (k_scale None: a cache in qkv's dtype)."""
    B, KV, _, D = k_cache.shape
    H = qkv.shape[1] // D - 2 * KV
    G = H // KV
    whole = split < 0 or (not split and B * KV >= WHOLE_FROM_PROGRAMS)
    pdl = use_pdl(qkv.device)
    mma = G >= (WHOLE_MMA_FROM_GROUP if whole else SPLIT_MMA_FROM_GROUP)
    G_PAD = max(16, triton.next_power_of_2(G)) if mma else triton.next_power_of_2(G)
    quant = k_scale is not None
    if quant != (k_cache.dtype == torch.float8_e4m3fn):
        raise ValueError("decode_attention: a float8_e4m3fn cache goes to decode_attention_fp8, with its scales")
    if qkv.stride(1) != 1:
        qkv = qkv.contiguous()
    out = torch.empty((B, H * D), dtype=qkv.dtype, device=qkv.device)
    norm, rope = q_norm is not None, cos is not None
    tables = (q_norm if norm else qkv, k_norm if norm else qkv, cos if rope else qkv, sin if rope else qkv)
    inputs = (qkv, *tables, k_cache, v_cache, k_scale if quant else qkv, v_scale if quant else qkv, slot)
    strides = (qkv.stride(0), cos.stride(0) if rope else 0, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
               v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
               k_scale.stride(0) if quant else 0, k_scale.stride(1) if quant else 0, out.stride(0))
    qk_scale = (scale or D ** -0.5) * math.log2(math.e)  # exp2 in the kernels
    if whole:  # enough (row, kv head) programs to fill the GPU: one program per pair, over the whole width
        if mma:
            block, stages = WHOLE_BLOCK, WHOLE_STAGES_ONE_HEAD if G == 1 and not quant else WHOLE_STAGES
            block, stages = fit_tile(block, stages, 2 * D * k_cache.element_size(), shared_memory(qkv.device))
            tile = dict(BLOCK=block, num_warps=WHOLE_WARPS, LANES_STAGES=1, num_stages=stages)  # (LANES_: unused)
        else:  # (the stages are the loop's: the kernel's own would pipeline nothing there)
            tile = dict(BLOCK=WHOLE_LANES_BLOCK, num_warps=WHOLE_LANES_WARPS, LANES_STAGES=WHOLE_LANES_STAGES)
        _whole_kernel[(B * KV,)](
            *inputs, out, *strides, KV, window, qk_scale, eps,  # (reads slots before `slot` only)
            G=G, G_PAD=G_PAD, D=D, NORM=norm, ROPE=rope, QUANT=quant, MMA=mma, PDL=pdl, **tile,
            launch_pdl=pdl,
        )
        return out
    split = split or split_slots(D, qkv.element_size())
    if counts.numel() < B * KV:
        raise ValueError(f"decode_attention: counts has {counts.numel()} counters, the split kernel needs {B * KV}")
    n_splits = (width + split - 1) // split
    parts = torch.empty((B * KV * n_splits * G, D), dtype=torch.float32, device=qkv.device)
    maxes = torch.empty((B * KV * n_splits * G,), dtype=torch.float32, device=qkv.device)
    sums = torch.empty_like(maxes)
    _split_kernel[(B * KV, n_splits)](
        *inputs, counts, parts, maxes, sums, out, *strides, KV, n_splits, width, window, qk_scale, eps,
        G=G, G_PAD=G_PAD, D=D, SPLIT=split, NORM=norm, ROPE=rope, QUANT=quant, MMA=mma, PDL=pdl, launch_pdl=pdl,
        num_warps=split_warps(split, D, qkv.element_size()),
    )
    return out


def check_supported(head_dim: int, device: torch.device) -> str | None:
    """Why this kernel cannot run for the model on this GPU (None: it can)."""
    if torch.cuda.get_device_capability(device) < (8, 0):
        return "decode_attention triton needs a GPU of compute capability 8.0 or newer; use matmul"
    if head_dim < 16 or head_dim & (head_dim - 1):
        return (f"decode_attention triton needs a power-of-two head_dim of at least 16, and this model's is "
                f"{head_dim}; use matmul")
    return None
