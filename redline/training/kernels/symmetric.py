"""Symmetric products for Muon's Newton–Schulz iteration, one triangle computed: C = α·X·Xᵀ + β·Y + γ·I.

Each quintic Newton–Schulz iteration (training/muon.py) runs three batched products on a stack X (B, r, k) of
r × k matrices (r the smaller side):

    A = X·Xᵀ                  (B, r, r)   2·r²·k flops a matrix
    P = c·A·A + b·A + a·I     (B, r, r)   2·r³
    X ← P·X                   (B, r, k)   2·r²·k

A and P are symmetric (A·A = A·Aᵀ, as A is), so only the tiles on and above the diagonal need computing: each
program here computes one tile (i ≤ j) of a batch matrix and stores it twice, at (i, j) and transposed at (j, i).
That is (T + 1) / 2T of the tiles (T tiles a side: 21 of 36 at r = 768 in 128-wide tiles), and of the
iteration's arithmetic about 3/4 at r = k/4 (the 768 × 3072 MLP matrices) and 2/3 for square ones. The second
product's epilogue adds b·A + a·I in fp32 and rounds P to the output dtype once, so P needs no elementwise
kernel of its own. modded-nanogpt's Muon computes these products by triangle the same way; this kernel is
redline's own.

Tiles are fixed per shape (no autotuning: a configuration chosen by timing could differ between two processes and
with it the bits of the result, which an exact resume must reproduce). X may be any strided view: the tall case's
Xᵀ·X is X.mT passed as it is.

Registered as `torch.ops.redline.symmetric_product`, an opaque custom op that launches the kernel itself
(torch.compile calls it as it is). Its Python call costs the host more than the kernel costs a 768-wide stack on
the GPU; Muon replays each stack's Newton–Schulz run as a CUDA graph (training/muon.py), so a training step pays
that cost only when the graph is recorded. Registered with torch.library.triton_op instead (torch.compile launching
the kernel from its own generated code) the host's cost went away, but the kernel ran no faster than torch.matmul's
products (BENCHMARKS.md, "Optimizers"). It needs the triton package and a CUDA GPU; `available()` says whether it can run here.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU build of torch without triton: Muon uses torch.matmul
    triton = None


DTYPES = (torch.bfloat16, torch.float16)
"""What the kernel computes in (Triton's fp32 products would round their inputs to tf32, where torch.matmul's
do not by default)."""


def available(device: torch.device) -> bool:
    """Whether the kernel can run for tensors on `device` (a CUDA GPU with the triton package)."""
    return triton is not None and device.type == "cuda"


def tile_config(r: int) -> tuple[int, int, int, int]:
    """(BLOCK, BLOCK_K, num_warps, num_stages) for r × r outputs: 128-wide tiles for the transformer's
    matrices (r >= 512), 64-wide below, where 128-wide tiles would leave most SMs idle."""
    return (128, 64, 8, 3) if r >= 512 else (64, 64, 4, 3)


if triton is not None:

    @triton.jit
    def _symmetric_kernel(X, Y, C, R, K, sxb, sxr, sxk, syb, syr, syc, scb, scr, scc, alpha, beta, gamma,
                          HAS_Y: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
        """Grid (T(T+1)/2, B): program (t, b) computes tile t of the upper triangle of C[b] (row by row: row i holds
        T - i tiles) and stores it and its transpose."""
        t = tl.program_id(0)
        b = tl.program_id(1).to(tl.int64)
        n_tiles = tl.cdiv(R, BLOCK)
        i = 0
        while t >= n_tiles - i:
            t -= n_tiles - i
            i += 1
        j = i + t
        rm = i * BLOCK + tl.arange(0, BLOCK)
        rn = j * BLOCK + tl.arange(0, BLOCK)
        rk = tl.arange(0, BLOCK_K)
        xb = X + b * sxb
        acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + rk
            left = tl.load(xb + rm[:, None] * sxr + kk[None, :] * sxk,
                           mask=(rm[:, None] < R) & (kk[None, :] < K), other=0.0)  # (BLOCK, BLOCK_K): X rows i
            right = tl.load(xb + rn[:, None] * sxr + kk[None, :] * sxk,
                            mask=(rn[:, None] < R) & (kk[None, :] < K), other=0.0)  # (BLOCK, BLOCK_K): X rows j
            acc = tl.dot(left, tl.trans(right), acc)
        out = acc * alpha
        inside = (rm[:, None] < R) & (rn[None, :] < R)
        if HAS_Y:
            y = tl.load(Y + b * syb + rm[:, None] * syr + rn[None, :] * syc, mask=inside, other=0.0)
            out += beta * y.to(tl.float32)
            out += tl.where(rm[:, None] == rn[None, :], gamma, 0.0)
        out = out.to(C.dtype.element_ty)
        cb = C + b * scb
        tl.store(cb + rm[:, None] * scr + rn[None, :] * scc, out, mask=inside)
        if i != j:  # the mirror tile (j, i)
            tl.store(cb + rn[:, None] * scr + rm[None, :] * scc, tl.trans(out),
                     mask=(rn[:, None] < R) & (rm[None, :] < R))


@torch.library.custom_op("redline::symmetric_product", mutates_args=())
def symmetric_product(x: Tensor, y: Tensor | None, alpha: float, beta: float, gamma: float) -> Tensor:
    """x (B, r, k) any strides, y (B, r, r) symmetric or None -> C (B, r, r) contiguous, x's dtype:
    α·x·xᵀ + β·y + γ·I, accumulated in fp32 and rounded once (y and γ only when y is given)."""
    B, R, K = x.shape
    out = torch.empty(B, R, R, device=x.device, dtype=x.dtype)
    block, block_k, warps, stages = tile_config(R)
    n = triton.cdiv(R, block)
    ys = y.stride() if y is not None else (0, 0, 0)
    _symmetric_kernel[(n * (n + 1) // 2, B)](
        x, y if y is not None else x, out, R, K, *x.stride(), *ys, *out.stride(), alpha, beta, gamma,
        HAS_Y=y is not None, BLOCK=block, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return out


@symmetric_product.register_fake
def _(x: Tensor, y: Tensor | None, alpha: float, beta: float, gamma: float) -> Tensor:
    B, R, _ = x.shape
    return x.new_empty(B, R, R)
