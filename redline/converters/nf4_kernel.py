"""NF4 dequantization in one Triton kernel: torchao's NF4Tensor.get_original_weight, bit for bit, on a CUDA GPU.

QLoRA dequantizes every frozen base weight once in the forward, once more when activation checkpointing recomputes
it, and once in the backward (the gradient of the input needs W). Done with torch ops (nf4_linear.py's
dequantize_parts) that is several passes over weight-sized intermediates (int32 indices, gathered pairs, scaled
values) per call; here each program reads a span of the packed bytes and their blocks' int8 scales and writes the
bf16/fp16/fp32 values once: about 2.5 bytes of memory traffic per weight in bf16. A program takes a tile of whole quantization
blocks, so each block's scale is computed once, and writes its values contiguously.

Bit-exactness with torchao: every step is rounded to the weight's dtype where PyTorch's ops on that dtype round,
in the same order: scale = dtype(dtype(q_scaler / factor) + mean), value = dtype(level · scale). The division is
the correctly rounded one (div_rn), as PyTorch's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCKS_PER_PROGRAM = 64


@triton.jit
def _nf4_dequant_kernel(DATA, QSCALE, QFACTOR, MEAN, LEVELS, OUT, n_blocks, BLOCK_SIZE: tl.constexpr,
                        SCALER_BLOCK: tl.constexpr, ROWS: tl.constexpr):
    # DATA (n_blocks * BLOCK_SIZE / 2,) uint8, two 4-bit codes a byte (high nibble first); QSCALE (n_blocks,) int8;
    # QFACTOR (n_blocks / SCALER_BLOCK,), MEAN () and LEVELS (16,) in OUT's dtype; OUT (n_blocks * BLOCK_SIZE,).
    # A program: ROWS quantization blocks as a (ROWS, BLOCK_SIZE / 2) tile of bytes, one scale per row.
    HALF: tl.constexpr = BLOCK_SIZE // 2
    dtype = OUT.dtype.element_ty
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_blocks
    byte = tl.load(DATA + rows[:, None] * HALF + tl.arange(0, HALF)[None, :], mask=row_ok[:, None], other=0)
    byte = byte.to(tl.int32)
    q_scale = tl.load(QSCALE + rows, mask=row_ok, other=0).to(tl.float32)
    factor = tl.load(QFACTOR + rows // SCALER_BLOCK, mask=row_ok, other=1.0).to(tl.float32)
    scale = tl.math.div_rn(q_scale, factor).to(dtype)  # torchao: int8 / factor, rounded to the dtype
    scale = (scale.to(tl.float32) + tl.load(MEAN).to(tl.float32)).to(dtype).to(tl.float32)  # + mean, rounded
    high = tl.load(LEVELS + (byte >> 4)).to(tl.float32) * scale[:, None]
    low = tl.load(LEVELS + (byte & 15)).to(tl.float32) * scale[:, None]
    values = tl.interleave(high, low).to(dtype)  # (ROWS, BLOCK_SIZE): each byte's high code first
    tl.store(OUT + rows[:, None] * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)[None, :], values, mask=row_ok[:, None])


def supports(block_size: int) -> bool:
    """Whether the kernel takes NF4 blocks of this size (a power of two: a tile's width)."""
    return block_size >= 2 and block_size & (block_size - 1) == 0


def dequantize_nf4_cuda(parts: list[torch.Tensor], block_size: int, scaler_block_size: int, out_features: int,
                        in_features: int) -> torch.Tensor:
    """(out, in) in the NF4 tensor's dtype from its parts (nf4_linear.NF4_PARTS order), on their CUDA device."""
    data, q_scalers, q_factor, scaler_mean, levels = parts
    numel = out_features * in_features
    if not supports(block_size) or numel >= 2**31:  # the tile's width; int32 offsets
        raise ValueError(f"the NF4 kernel takes power-of-two blocks and under 2**31 values, got {block_size} and {numel}")
    out = torch.empty(numel, dtype=levels.dtype, device=data.device)
    n_blocks = numel // block_size
    grid = (triton.cdiv(n_blocks, _BLOCKS_PER_PROGRAM),)
    _nf4_dequant_kernel[grid](data, q_scalers, q_factor, scaler_mean, levels, out, n_blocks, BLOCK_SIZE=block_size,
                              SCALER_BLOCK=scaler_block_size, ROWS=_BLOCKS_PER_PROGRAM)
    return out.view(out_features, in_features)
