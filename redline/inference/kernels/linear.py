"""The decode step's Linear layers in Triton: y = act(norm(x) · Wᵀ + b) + r for a few rows x.

At batch 1 every Linear layer of the decode step is a one-row product: it reads the whole weight matrix once
and does two flops per weight, so its speed is the memory bandwidth it reaches. cuBLAS runs these shapes as
small-tile GEMM kernels (and a second split-K reduction kernel for a long K); here (`_gemv_kernel`) each program
owns BLOCK_N output features, streams their weight rows in BLOCK_K-wide tiles with 16-byte loads, accumulates in
fp32 and applies the epilogue (bias, GELU, residual add) before the one store, so the layer's bias, activation
and residual add need no kernels of their own; the norm before the product is computed in it too.

For a batch of rows (`_rows_kernel`, up to 64 in the engine) each program owns all rows and a narrow tile of
output features, as a tensor-core product over K, with the same epilogue: the narrow tiles give 50-100 programs
on a 124M model's layers, where cuBLAS's wider ones leave SMs idle. The engine runs the norm before it (each
program would compute the rows' statistics again; the kernel can, at about 3x the time). A long K (an MLP's
output projection) leaves each of those programs a long loop: there it is split (split-K), each tile's K cut into
spans, one program each. Each program stores its fp32 product in a workspace and counts itself done on an atomic
counter of its tile; the last one adds the products in a fixed order (the same bits whichever finishes last),
applies the epilogue and puts the counter back to zero. No second kernel is launched; the round trip through L2
costs each tile about as much as a short K's loop, so a short K is not split.

On Hopper and newer the kernels are launched with programmatic dependent launch (kernels/launch.py).

Registered as `torch.ops.redline.gemv` (and `gemv_split`, with split-K and its counters), opaque custom ops that
launch the kernels themselves: torch.compile calls them as they are and CUDA graphs capture them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from redline.inference.kernels.launch import sm_count, start_dependents_then_wait, use_pdl

ACTIVATIONS = ("none", "gelu_tanh", "relu2", "swiglu")
NORMS = ("none", "layernorm", "rmsnorm")


@triton.jit
def _gelu_tanh(y):
    """GELU, tanh approximation (F.gelu(approximate="tanh")), y fp32."""
    inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
    return 0.5 * y * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0))


@triton.jit
def _row_stats(X, K, eps, NORM: tl.constexpr, BLOCK_K: tl.constexpr):
    """(mean, 1/std) of the row at X, as nn.LayerNorm (NORM 1: two passes, fp32) or nn.RMSNorm (NORM 2: mean 0)
    compute them. Every program reads the row again; it is a few KB, from cache."""
    rk = tl.arange(0, BLOCK_K)
    mean = 0.0
    if NORM == 1:
        acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            acc += tl.load(X + k0 + rk, mask=k0 + rk < K, other=0.0).to(tl.float32)
        mean = tl.sum(acc, 0) / K
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + rk < K
        x = tl.where(k_ok, tl.load(X + k0 + rk, mask=k_ok, other=0.0).to(tl.float32) - mean, 0.0)
        acc += x * x
    return mean, tl.rsqrt(tl.sum(acc, 0) / K + eps)


@triton.jit
def _tile_stats(x, k_ok, K, eps, NORM: tl.constexpr):
    """_row_stats of a row held whole in one tile x (masked lanes zero)."""
    mean = 0.0
    if NORM == 1:
        mean = tl.sum(x, 0) / K
    d = tl.where(k_ok, x - mean, 0.0)
    return mean, tl.rsqrt(tl.sum(d * d, 0) / K + eps)


@triton.jit
def _normed(x, rk, k_ok, mean, rstd, NormW, NormB, dtype,
            NORM: tl.constexpr, HAS_NORM_W: tl.constexpr, HAS_NORM_B: tl.constexpr):
    """A tile of the row normalised and rounded to the model's dtype as the norm module rounds it."""
    if NORM == 1:  # LayerNorm: (x - mean)·rstd·w + b in fp32, one rounding
        x = (x - mean) * rstd
        if HAS_NORM_W:
            x = x * tl.load(NormW + rk, mask=k_ok, other=0.0).to(tl.float32)
        if HAS_NORM_B:
            x = x + tl.load(NormB + rk, mask=k_ok, other=0.0).to(tl.float32)
        x = x.to(dtype).to(tl.float32)
    elif NORM == 2:  # RMSNorm: normalise in fp32 and round, then scale by the weight and round again
        x = (x * rstd).to(dtype).to(tl.float32)
        if HAS_NORM_W:
            x = (x * tl.load(NormW + rk, mask=k_ok, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
    return x


@triton.jit
def _act(y, up, ACT: tl.constexpr):
    """The activation of y (fp32): GELU (ACT 1), ReLU² (2), or SwiGLU (3): silu(y) · up; `up` is unused otherwise."""
    if ACT == 1:
        y = _gelu_tanh(y)
    elif ACT == 2:
        y = tl.maximum(y, 0.0)
        y = y * y
    elif ACT == 3:
        y = y / (1.0 + tl.exp(-y)) * up
    return y


@triton.jit
def _bias_act(y, up, Bias, N, rn, n_ok, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """The product y (fp32; output features rn along its last dim) plus the bias, then the activation (SwiGLU: `up`
    plus its bias, N entries further on)."""
    if HAS_BIAS:
        y += tl.load(Bias + rn, mask=n_ok, other=0.0).to(tl.float32)
        if ACT == 3:
            up += tl.load(Bias + N + rn, mask=n_ok, other=0.0).to(tl.float32)
    return _act(y, up, ACT)


@triton.jit
def _gemv_kernel(X, W, Bias, Res, NormW, NormB, Y, N, K, stride_x, stride_w, stride_r, stride_y, eps,
                 HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr, NORM: tl.constexpr,
                 HAS_NORM_W: tl.constexpr, HAS_NORM_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 ONE_TILE: tl.constexpr, PDL: tl.constexpr):
    """Grid (cdiv(N, BLOCK_N), M): output features [pid·BLOCK_N, +BLOCK_N) of row m. ACT 3 (SwiGLU): W has 2N
    rows, gate then up, and feature n is silu(gate_n)·up_n. ONE_TILE: K <= BLOCK_K, the row is loaded once.
    PDL: launched with programmatic dependent launch (kernels/launch.py)."""
    pid, m = tl.program_id(0), tl.program_id(1)
    dtype = Y.dtype.element_ty
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    rk = tl.arange(0, BLOCK_K)
    x_row = X + m * stride_x
    w_rows = W + rn[:, None].to(tl.int64) * stride_w
    up_rows = W + (rn[:, None] + N).to(tl.int64) * stride_w  # SwiGLU's up rows
    mean, rstd = 0.0, 1.0
    if ONE_TILE:
        k_ok = rk < K
        w_ok = n_ok[:, None] & k_ok[None, :]
        # the weights first: the norm's statistics are computed while they are on their way
        w = tl.load(w_rows + rk[None, :], mask=w_ok, other=0.0)
        if ACT == 3:
            w_up = tl.load(up_rows + rk[None, :], mask=w_ok, other=0.0)
        start_dependents_then_wait(PDL)  # (the weights are on their way while the kernel before finishes)
        x = tl.load(x_row + rk, mask=k_ok, other=0.0).to(tl.float32)
        if NORM != 0:
            mean, rstd = _tile_stats(x, k_ok, K, eps, NORM)
        x = _normed(x, rk, k_ok, mean, rstd, NormW, NormB, dtype, NORM, HAS_NORM_W, HAS_NORM_B)[None, :]
        acc = w.to(tl.float32) * x
        acc_up = acc  # (read only by SwiGLU)
        if ACT == 3:
            acc_up = w_up.to(tl.float32) * x
    else:
        start_dependents_then_wait(PDL)
        if NORM != 0:
            mean, rstd = _row_stats(x_row, K, eps, NORM, BLOCK_K)
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = k0 + rk < K
            x = tl.load(x_row + k0 + rk, mask=k_ok, other=0.0).to(tl.float32)
            x = _normed(x, k0 + rk, k_ok, mean, rstd, NormW, NormB, dtype, NORM, HAS_NORM_W, HAS_NORM_B)[None, :]
            w_ok = n_ok[:, None] & k_ok[None, :]
            acc += tl.load(w_rows + k0 + rk[None, :], mask=w_ok, other=0.0).to(tl.float32) * x
            if ACT == 3:
                acc_up += tl.load(up_rows + k0 + rk[None, :], mask=w_ok, other=0.0).to(tl.float32) * x
    y = _bias_act(tl.sum(acc, axis=1), tl.sum(acc_up, axis=1), Bias, N, rn, n_ok, HAS_BIAS, ACT)
    if HAS_RES:
        y += tl.load(Res + m * stride_r + rn, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(Y + m * stride_y + rn, y.to(dtype), mask=n_ok)


@triton.jit
def _tile_rows_stats(X, rm, m_ok, stride_x, K, eps, NORM: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """_row_stats of BLOCK_M rows at once: (mean, 1/std), each (BLOCK_M,)."""
    rk = tl.arange(0, BLOCK_K)
    rows = X + rm[:, None].to(tl.int64) * stride_x
    mean = tl.zeros([BLOCK_M], tl.float32)
    if NORM == 1:
        acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            acc += tl.load(rows + k0 + rk[None, :], mask=m_ok[:, None] & (k0 + rk < K)[None, :], other=0.0)
        mean = tl.sum(acc, 1) / K
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ok = m_ok[:, None] & (k0 + rk < K)[None, :]
        x = tl.where(ok, tl.load(rows + k0 + rk[None, :], mask=ok, other=0.0).to(tl.float32) - mean[:, None], 0.0)
        acc += x * x
    return mean, tl.rsqrt(tl.sum(acc, 1) / K + eps)


@triton.jit
def _dot_acc(x, w, acc):
    """acc + x · wᵀ; fp32 inputs exactly (no TF32)."""
    if x.dtype == tl.float32:
        acc = tl.dot(x, tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    else:
        acc = tl.dot(x, tl.trans(w), acc)
    return acc


@triton.jit
def _rows_epilogue_inputs(Bias, Res, rm, rn, m_ok, n_ok, N, stride_r,
                          HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr):
    """What the batched kernel's epilogue reads, fp32: the bias (BLOCK_N,), SwiGLU's up bias, the residual
    (BLOCK_M, BLOCK_N) (zeros where absent)."""
    bias = tl.zeros(rn.shape, tl.float32)
    bias_up = bias
    if HAS_BIAS:
        bias = tl.load(Bias + rn, mask=n_ok, other=0.0).to(tl.float32)
        if ACT == 3:
            bias_up = tl.load(Bias + N + rn, mask=n_ok, other=0.0).to(tl.float32)
    res = tl.zeros((rm.shape[0], rn.shape[0]), tl.float32)
    if HAS_RES:
        res = tl.load(Res + rm[:, None].to(tl.int64) * stride_r + rn[None, :], mask=m_ok[:, None] & n_ok[None, :],
                      other=0.0).to(tl.float32)
    return bias, bias_up, res


@triton.jit
def _rows_epilogue(acc, acc_up, bias, bias_up, res, Y, rm, rn, m_ok, n_ok, stride_y,
                   HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr):
    """The batched kernel's bias, activation and residual add on its product acc (BLOCK_M, BLOCK_N) fp32 (the
    inputs from _rows_epilogue_inputs), and the store in Y's dtype."""
    if HAS_BIAS:
        acc += bias[None, :]
        acc_up += bias_up[None, :]
    y = _act(acc, acc_up, ACT)
    if HAS_RES:
        y += res
    tl.store(Y + rm[:, None].to(tl.int64) * stride_y + rn[None, :], y.to(Y.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _split_sum(part, stride_s, SPLIT_K: tl.constexpr):
    """The sum of the SPLIT_K partial products at part + s·stride_s, s = 0, 1, ... in this order whichever program
    finishes last (so the result is the same bits every call)."""
    # ".cg": from L2, where the other programs' stores are, never from this SM's L1
    total = tl.load(part, cache_modifier=".cg")
    for s in tl.static_range(1, SPLIT_K):
        total += tl.load(part + s * stride_s, cache_modifier=".cg")
    return total


@triton.jit
def _rows_kernel(X, W, Bias, Res, NormW, NormB, Y, Part, Counts, M, N, K, K_SPAN, stride_x, stride_w, stride_r,
                 stride_y, eps,
                 HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr, NORM: tl.constexpr,
                 HAS_NORM_W: tl.constexpr, HAS_NORM_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PDL: tl.constexpr):
    """_gemv_kernel for a batch of rows: grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M), SPLIT_K), output features
    [pid·BLOCK_N, +BLOCK_N) of rows [pid_m·BLOCK_M, +BLOCK_M), as a tensor-core product over K in BLOCK_K-wide
    tiles. Narrow column tiles give enough programs to keep every SM reading weights (a batch of 64 has 64 rows,
    not 64 tiles). SPLIT_K > 1: program (pid, pid_m, s) takes K from s·K_SPAN (a multiple of BLOCK_K) to K_SPAN
    further, stores its fp32 product in Part ((SPLIT_K, tiles, BLOCK_M, BLOCK_N), SwiGLU's up products after it)
    and counts itself done in Counts (int32, zeros, one per output tile); the last one sums the products and
    applies the epilogue, and puts the counter back to zero. PDL: launched with programmatic dependent launch
    (kernels/launch.py)."""
    pid, pid_m = tl.program_id(0), tl.program_id(1)
    dtype = Y.dtype.element_ty
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok, m_ok = rn < N, rm < M
    rk = tl.arange(0, BLOCK_K)
    x_rows = X + rm[:, None].to(tl.int64) * stride_x
    w_rows = W + rn[:, None].to(tl.int64) * stride_w
    up_rows = W + (rn[:, None] + N).to(tl.int64) * stride_w  # SwiGLU's up rows
    start_dependents_then_wait(PDL)
    mean, rstd = tl.zeros([BLOCK_M], tl.float32), tl.full([BLOCK_M], 1.0, tl.float32)
    if NORM != 0:  # (over the whole row, in every split)
        mean, rstd = _tile_rows_stats(X, rm, m_ok, stride_x, K, eps, NORM, BLOCK_M, BLOCK_K)
    k_lo, k_hi = 0, K
    if SPLIT_K > 1:
        k_lo = tl.program_id(2) * K_SPAN
        k_hi = tl.minimum(K, k_lo + K_SPAN)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k_ok = k0 + rk < K  # (a split's span is whole K tiles: only the last tile of K is masked)
        w_ok = n_ok[:, None] & k_ok[None, :]
        w = tl.load(w_rows + k0 + rk[None, :], mask=w_ok, other=0.0)
        x = tl.load(x_rows + k0 + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if NORM != 0:
            x = _normed(x.to(tl.float32), k0 + rk, k_ok, mean[:, None], rstd[:, None], NormW, NormB, dtype, NORM,
                        HAS_NORM_W, HAS_NORM_B).to(dtype)
        acc = _dot_acc(x, w, acc)
        if ACT == 3:
            acc_up = _dot_acc(x, tl.load(up_rows + k0 + rk[None, :], mask=w_ok, other=0.0), acc_up)
    if SPLIT_K > 1:
        split = tl.program_id(2)
        tile = pid_m * tl.num_programs(0) + pid
        stride_s = tl.num_programs(0) * tl.num_programs(1) * BLOCK_M * BLOCK_N  # one split's products
        in_tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        part = Part + tile * BLOCK_M * BLOCK_N + in_tile
        up_part = part + SPLIT_K * stride_s
        tl.store(part + split * stride_s, acc)
        if ACT == 3:
            tl.store(up_part + split * stride_s, acc_up)
        # every program reads the epilogue's inputs now, so that the last one does not wait for them after the sum
        bias, bias_up, res = _rows_epilogue_inputs(Bias, Res, rm, rn, m_ok, n_ok, N, stride_r, HAS_BIAS, HAS_RES, ACT)
        # every thread's stores come before the count (the barrier), and the count releases them to the GPU and
        # acquires the others' (acq_rel): the last program of the tile sees every split's product
        tl.debug_barrier()
        if tl.atomic_add(Counts + tile, 1, sem="acq_rel") == SPLIT_K - 1:
            acc = _split_sum(part, stride_s, SPLIT_K)
            if ACT == 3:
                acc_up = _split_sum(up_part, stride_s, SPLIT_K)
            _rows_epilogue(acc, acc_up, bias, bias_up, res, Y, rm, rn, m_ok, n_ok, stride_y, HAS_BIAS, HAS_RES, ACT)
            tl.atomic_xchg(Counts + tile, 0)  # zero again for the next call
    else:
        bias, bias_up, res = _rows_epilogue_inputs(Bias, Res, rm, rn, m_ok, n_ok, N, stride_r, HAS_BIAS, HAS_RES, ACT)
        _rows_epilogue(acc, acc_up, bias, bias_up, res, Y, rm, rn, m_ok, n_ok, stride_y, HAS_BIAS, HAS_RES, ACT)


ONE_TILE_MAX = 8192  # rows up to this long are loaded whole, in one tile
# pick_blocks's rows per program for a norm before N >= 4096 (qkv), and for K >= 1536 without a norm (the MLP's and
# attention's output products). Whole models at batch 1 (one H100): 4 for the first cost the Qwen3-0.6B shape 0.5%;
# 2 for the second gained it 0.9% and cost modern-124m 2.2% (docs/results/h100-2026-11-27j/).
NORM_WIDE_BLOCK_N, LONG_K_BLOCK_N = 8, 1


def pick_blocks(N: int, K: int, norm: str = "none", act: str = "none") -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) for an (N, K) weight (N output features), the fastest of a sweep
    (scripts/gpu/gemv_bench.py): the whole row in one tile; one or two weight rows per program, more where a
    norm before the product has each program compute the row's statistics (fewer programs, fewer repeats)."""
    block_k = min(triton.next_power_of_2(K), ONE_TILE_MAX)
    if norm != "none":
        block_n = 2 if N < 4096 else (4 if act == "swiglu" else NORM_WIDE_BLOCK_N)
    else:
        block_n = LONG_K_BLOCK_N if K >= 1536 else 2
    block_n = min(block_n, max(1, 32768 // block_k))
    return block_n, block_k, 8 if block_k * block_n >= 16384 else 4


def launch(x: torch.Tensor, weight: torch.Tensor, bias, residual, act: str, out: torch.Tensor,
           block_n: int, block_k: int, num_warps: int, num_stages: int = 1, norm: str = "none",
           norm_weight=None, norm_bias=None, eps: float = 1e-5, pdl: bool = False) -> None:
    """Run the kernel with explicit tiles (for benchmarks; the op picks its own). pdl: with programmatic dependent
    launch (kernels/launch.py; compute capability 9.0+)."""
    M, K = x.shape
    N = out.shape[1]
    _gemv_kernel[(triton.cdiv(N, block_n), M)](
        x, weight, bias if bias is not None else x, residual if residual is not None else x,
        norm_weight if norm_weight is not None else x, norm_bias if norm_bias is not None else x, out, N, K,
        x.stride(0), weight.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0), eps,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, ACT=ACTIVATIONS.index(act),
        NORM=NORMS.index(norm), HAS_NORM_W=norm_weight is not None, HAS_NORM_B=norm_bias is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, ONE_TILE=K <= block_k, PDL=pdl, num_warps=num_warps,
        num_stages=num_stages, launch_pdl=pdl)


ROWS_SMEM_BYTES = 160 * 1024  # the batched kernel's pipeline stages share this much shared memory at most
# Split-K for the batched kernel (from scripts/gpu/rows_linear_bench.py at 64 and 8 rows). A split costs each
# output tile a round trip of its products through L2, and the count, before the last program can sum them, which
# pays only for a long K: K of at least SPLIT_FROM_K is cut into the most spans, a power of two up to SPLIT_MAX,
# each at least SPLIT_MIN_K_SPAN long, that keep the programs within one wave, at the unsplit kernel's column tiles
# (wider ones, which read the rows' activations fewer times, were slower: the products the last program reads
# grow with them). A wave: one program per SM times as many as SPLIT_SM_BYTES of pipelined loads hold (one at 64
# rows, where a second program per SM did not help; 3 at 8). Shorter K (768, 1600) was slower split.
SPLIT_FROM_K, SPLIT_MIN_K_SPAN, SPLIT_MAX = 2048, 256, 8
SPLIT_SM_BYTES = 128 * 1024


def k_span(K: int, split_k: int, block_k: int) -> tuple[int, int]:
    """(K_SPAN, splits): K cut into split_k spans of whole K tiles at most, and how many that leaves (fewer where
    the rounding up to whole tiles covers K sooner)."""
    span = triton.cdiv(triton.cdiv(K, split_k), block_k) * block_k
    return span, triton.cdiv(K, span)


def row_stages(block_m: int, block_n: int, block_k: int, elem_bytes: int = 2) -> int:
    """Pipeline stages of the batched kernel: 5, 3 for tiles of 64 columns or more (the head's), fewer where
    ROWS_SMEM_BYTES would not hold them (as for fp32)."""
    per_stage = (block_m + block_n) * block_k * elem_bytes
    return max(2, min(5 if block_n < 64 else 3, ROWS_SMEM_BYTES // per_stage))


def pick_row_blocks(M: int, N: int, K: int, sms: int, elem_bytes: int = 2,
                    split: bool = True) -> tuple[int, int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, split_k) of the batched kernel for M rows and an (N, K)
    weight on a GPU of `sms` SMs, the fastest of a sweep at 64 rows (scripts/gpu/rows_linear_bench.py): all rows in
    one tile, column tiles narrow enough to give every SM a program on a 124M model's layers (16 columns up to N
    1024, and beyond where that still makes one program per SM at most and K is too short to split; else 32 up to
    4096: more programs than SMs in 16-column tiles were slower than fewer, wider ones), 64 for the head; stages
    from row_stages. Narrower row tiles (more programs, each weight tile read once per row tile) and other K tiles
    were no faster. Then split-K for a long K (see SPLIT_FROM_K; split False: none)."""
    block_m = 16 if M <= 16 else (32 if M <= 32 else 64)
    narrow = N <= 1024 or (triton.cdiv(N, 16) * triton.cdiv(M, block_m) <= sms and K < SPLIT_FROM_K)
    block_n = 16 if narrow else (32 if N <= 4096 else 64)
    block_k = 128
    stages, split_k = row_stages(block_m, block_n, block_k, elem_bytes), 1
    if split and K >= SPLIT_FROM_K:
        tiles = triton.cdiv(N, block_n) * triton.cdiv(M, block_m)
        per_sm = max(1, SPLIT_SM_BYTES // (stages * (block_m + block_n) * block_k * elem_bytes))
        for want in (2, 4, 8):
            span, splits = k_span(K, want, block_k)
            if want > SPLIT_MAX or span < SPLIT_MIN_K_SPAN or tiles * splits > sms * per_sm:
                break
            split_k = splits
    return block_m, block_n, block_k, 4, stages, split_k


def launch_rows(x: torch.Tensor, weight: torch.Tensor, bias, residual, act: str, out: torch.Tensor,
                block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int, split_k: int = 1,
                counts: torch.Tensor | None = None, norm: str = "none", norm_weight=None, norm_bias=None,
                eps: float = 1e-5, workspace: torch.Tensor | None = None, pdl: bool = False) -> None:
    """Run the batched kernel with explicit tiles (for benchmarks; the op picks its own). split_k > 1: K in that
    many spans of whole K tiles (fewer where that covers K: k_span), counted in `counts` (int32 zeros, one per
    output tile, left zeros), the partial products in `workspace` (fp32, for each split (and SwiGLU's up products)
    the output padded to whole tiles; None: allocated here). pdl: with programmatic dependent launch (compute
    capability 9.0+)."""
    M, K = x.shape
    N = out.shape[1]
    n_tiles, m_tiles = triton.cdiv(N, block_n), triton.cdiv(M, block_m)
    span, split_k = k_span(K, split_k, block_k)
    if split_k > 1:
        if counts is None or counts.numel() < n_tiles * m_tiles:
            raise ValueError(f"gemv_split: split-K over {n_tiles * m_tiles} output tiles needs as many int32 "
                             f"counters, and counts has {0 if counts is None else counts.numel()}")
        size = split_k * (2 if act == "swiglu" else 1) * m_tiles * block_m * n_tiles * block_n
        if workspace is None:
            workspace = torch.empty(size, dtype=torch.float32, device=x.device)
        elif workspace.numel() < size:
            raise ValueError(f"launch_rows: the workspace has {workspace.numel()} elements, the split needs {size}")
    _rows_kernel[(n_tiles, m_tiles, split_k)](
        x, weight, bias if bias is not None else x, residual if residual is not None else x,
        norm_weight if norm_weight is not None else x, norm_bias if norm_bias is not None else x, out,
        workspace if split_k > 1 else x, counts if split_k > 1 else x, M, N, K, span,
        x.stride(0), weight.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0), eps,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, ACT=ACTIVATIONS.index(act),
        NORM=NORMS.index(norm), HAS_NORM_W=norm_weight is not None, HAS_NORM_B=norm_bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, PDL=pdl, num_warps=num_warps,
        num_stages=num_stages, launch_pdl=pdl)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias, residual, act: str, norm: str, norm_weight, norm_bias,
            eps: float, counts: torch.Tensor | None) -> torch.Tensor:
    """The gemv ops' launch (counts None: no split-K)."""
    if x.stride(1) != 1 or weight.stride(1) != 1:
        x, weight = x.contiguous(), weight.contiguous()
    M, K = x.shape
    N = weight.shape[0] // (2 if act == "swiglu" else 1)
    out = x.new_empty(M, N)
    if M == 1:
        block_n, block_k, num_warps = pick_blocks(N, K, norm, act)
        launch(x, weight, bias, residual, act, out, block_n, block_k, num_warps, norm=norm, norm_weight=norm_weight,
               norm_bias=norm_bias, eps=eps, pdl=use_pdl(x.device))
    else:
        # a norm in the kernel is computed over the whole row by every program: not split
        tiles = pick_row_blocks(M, N, K, sm_count(x.device), x.element_size(),
                                split=counts is not None and norm == "none")
        launch_rows(x, weight, bias, residual, act, out, *tiles, counts=counts, norm=norm, norm_weight=norm_weight,
                    norm_bias=norm_bias, eps=eps, pdl=use_pdl(x.device))
    return out


# Opaque custom ops (not torch.library.triton_op, whose kernels Inductor launches itself, without the attribute):
# torch.compile calls them as they are, and Triton launches the kernels with programmatic dependent launch.
@torch.library.custom_op("redline::gemv", mutates_args=())
def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         residual: torch.Tensor | None = None, act: str = "none", norm: str = "none",
         norm_weight: torch.Tensor | None = None, norm_bias: torch.Tensor | None = None,
         eps: float = 1e-5) -> torch.Tensor:
    """act(norm(x) · weightᵀ + bias) + residual for x (M, K), weight (N, K) row-major (act "swiglu": (2N, K),
    gate rows then up rows), bias (N,) ((2N,)), residual (M, N); norm "layernorm" or "rmsnorm" with its weight,
    bias and eps, rounded as the modules round. fp32 accumulation, one rounding to x's dtype at the end. One row:
    the matrix-vector kernel; more: the batched one (no split-K: gemv_split)."""
    return _linear(x, weight, bias, residual, act, norm, norm_weight, norm_bias, eps, None)


# An op of its own, not an optional `counts` on the one above: torch.library mishandles a mutated argument that is
# None.
@torch.library.custom_op("redline::gemv_split", mutates_args={"counts"})
def gemv_split(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor, bias: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, act: str = "none", norm: str = "none",
               norm_weight: torch.Tensor | None = None, norm_bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """gemv with split-K for a batch of rows where pick_row_blocks chooses it (without a norm in the kernel), the
    same bits on every call. counts: int32 zeros, at least one per output tile of the batched kernel
    (cdiv(M, 16) · cdiv(N, 16) always suffices; a ValueError names the number otherwise); left zeros."""
    return _linear(x, weight, bias, residual, act, norm, norm_weight, norm_bias, eps, counts)


def _output_like(x: torch.Tensor, weight: torch.Tensor, act: str) -> torch.Tensor:
    """The ops' output for torch.compile's tracing: (M, N) in x's dtype."""
    return x.new_empty(x.shape[0], weight.shape[0] // (2 if act == "swiglu" else 1))


@gemv.register_fake
def _(x, weight, bias=None, residual=None, act="none", norm="none", norm_weight=None, norm_bias=None, eps=1e-5):
    return _output_like(x, weight, act)


@gemv_split.register_fake
def _(x, weight, counts, bias=None, residual=None, act="none", norm="none", norm_weight=None, norm_bias=None,
      eps=1e-5):
    return _output_like(x, weight, act)
