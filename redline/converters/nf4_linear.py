"""x·Wᵀ with W stored as torchao's NF4Tensor, as one op that torch.compile cannot look into (QLoRA's base GEMM).

Why an opaque op. torchao's linear_nf4 is an autograd.Function whose forward and backward each dequantize W to
bf16 (a tensor of W's full shape). Eager mode frees it at once. Under torch.compile the dequantization becomes
ordinary nodes of the joint forward/backward graph: common-subexpression elimination merges the backward's copy
into the forward's, and whether that (out, in) bf16 tensor is then kept from forward to backward (2 bytes a
weight, for every block at once: more than the 4-bit base itself) or recomputed is up to AOTAutograd's partitioner
and the graph passes before it. Here the dequantization lives inside two custom ops (torch.library):

    redline::nf4_linear(x, NF4 parts)            (..., in) -> (..., out)   forward: x·Wᵀ
    redline::nf4_linear_grad_input(g, NF4 parts) (..., out) -> (..., in)   backward: g·W

so no graph ever holds a dequantized W: what backward can keep is x and the NF4 parts (the parameters
themselves), exactly what eager QLoRA keeps. W exists only inside an op, for one GEMM.

The dequantization is torchao's NF4Tensor.get_original_weight, bit for bit (the same bf16 products of an NF4 level
and its block's scale), in three passes instead of torchao's dozen: each stored byte holds two 4-bit codes (high
nibble first), so a 256-entry table of level pairs turns a byte into its two values in one gather (the bytes
widened to int32 first), and one multiply applies the blocks' scales. On a CUDA GPU with Triton it is one kernel
instead (nf4_kernel.py), the same bits: one read of the packed weight, one write of W.
"""

from __future__ import annotations

import functools

import torch

NF4_PARTS = ("quantized_data", "quantized_scalers", "quantization_factor", "scaler_mean", "nf4")
_PAIR_AS = {2: torch.int32, 4: torch.int64}  # two bf16/fp16 values read as one int32, two fp32 as one int64


def nf4_parts(weight: torch.Tensor) -> tuple[list[torch.Tensor], int, int]:
    """An NF4Tensor's inner tensors (NF4_PARTS order), block_size and scaler_block_size."""
    return [getattr(weight, name) for name in NF4_PARTS], weight.block_size, weight.scaler_block_size


def dequantize_parts(parts: list[torch.Tensor], block_size: int, scaler_block_size: int, out_features: int,
                     in_features: int) -> torch.Tensor:
    """(out, in) in the NF4 tensor's original dtype: torchao's get_original_weight, bit for bit.

    parts: quantized_data (numel/2,) uint8, two codes a byte; quantized_scalers (numel/block,) int8, the blocks'
    absmax scales quantized in groups of scaler_block_size; quantization_factor (groups,) and scaler_mean ()
    in the original dtype; nf4 (16,) the NF4 levels."""
    data, q_scalers, q_factor, scaler_mean, levels = parts
    dtype = levels.dtype
    n_groups = q_scalers.numel() // scaler_block_size
    scales = (q_scalers.view(n_groups, scaler_block_size) / q_factor.unsqueeze(-1)).flatten().to(dtype)
    scales = scales + scaler_mean  # (numel/block,): torchao's dequantize_scalers
    pairs = torch.stack([levels.repeat_interleave(16), levels.repeat(16)], dim=-1)  # (256, 2): byte -> its codes
    index = data.to(torch.int32)
    wide = _PAIR_AS.get(pairs.element_size())
    if wide is None:
        values = pairs[index]  # (numel/2, 2) in storage order: high nibble, then low
    else:  # each pair read as one wider word: a flat gather, several times faster than gathering rows
        values = pairs.view(wide).view(-1).index_select(0, index).view(dtype)
    return (values.view(-1, block_size) * scales.unsqueeze(-1)).view(out_features, in_features)


def dequantize(parts: list[torch.Tensor], block_size: int, scaler_block_size: int, out_features: int,
               in_features: int) -> torch.Tensor:
    """dequantize_parts, as one Triton kernel where the parts are on a CUDA GPU and Triton is installed."""
    kernel = _triton_kernel() if parts[0].is_cuda else None
    if kernel is not None and kernel.supports(block_size) and out_features * in_features < 2**31:
        return kernel.dequantize_nf4_cuda(parts, block_size, scaler_block_size, out_features, in_features)
    return dequantize_parts(parts, block_size, scaler_block_size, out_features, in_features)


@functools.cache
def _triton_kernel():
    try:
        from redline.converters import nf4_kernel
    except ImportError:  # no triton (a CPU build of torch): the torch-ops path
        return None
    return nf4_kernel


# Defined with torch.library.Library rather than the custom_op decorator: the same opaque operators to
# torch.compile, but a call costs tens of microseconds of Python less on the host, and QLoRA calls them 3 times per
# adapted layer and step (forward, recomputation under activation checkpointing, backward).
_LIB = torch.library.Library("redline", "FRAGMENT")
_ARGS = "Tensor[] parts, int block_size, int scaler_block_size, int out_features, int in_features"
_LIB.define(f"nf4_linear(Tensor x, {_ARGS}) -> Tensor")
_LIB.define(f"nf4_linear_grad_input(Tensor grad, {_ARGS}) -> Tensor")


def _nf4_linear(x, parts, block_size, scaler_block_size, out_features, in_features):
    weight = dequantize(parts, block_size, scaler_block_size, out_features, in_features).to(x.dtype)
    return torch.matmul(x, weight.t())


def _nf4_linear_grad_input(grad, parts, block_size, scaler_block_size, out_features, in_features):
    weight = dequantize(parts, block_size, scaler_block_size, out_features, in_features).to(grad.dtype)
    return torch.matmul(grad, weight)


_LIB.impl("nf4_linear", _nf4_linear, "CompositeExplicitAutograd")
_LIB.impl("nf4_linear_grad_input", _nf4_linear_grad_input, "CompositeExplicitAutograd")


@torch.library.register_fake("redline::nf4_linear", lib=_LIB)
def _(x, parts, block_size, scaler_block_size, out_features, in_features):
    return x.new_empty(*x.shape[:-1], out_features)


@torch.library.register_fake("redline::nf4_linear_grad_input", lib=_LIB)
def _(grad, parts, block_size, scaler_block_size, out_features, in_features):
    return grad.new_empty(*grad.shape[:-1], in_features)


def _setup_context(ctx, inputs, output):
    x, parts, block_size, scaler_block_size, out_features, in_features = inputs
    ctx.save_for_backward(*parts)  # the 4-bit weight, never the dequantized one
    ctx.sizes = (block_size, scaler_block_size, out_features, in_features)


def _backward(ctx, grad):
    grad_x = torch.ops.redline.nf4_linear_grad_input(grad, list(ctx.saved_tensors), *ctx.sizes)
    return grad_x, [None] * len(NF4_PARTS), None, None, None, None  # the NF4 base is frozen: no gradient


torch.library.register_autograd("redline::nf4_linear", _backward, setup_context=_setup_context, lib=_LIB)


def nf4_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (..., in) · Wᵀ -> (..., out) in x's dtype, W (out, in) an NF4Tensor (frozen: x alone gets a gradient)."""
    parts, block_size, scaler_block_size = nf4_parts(weight)
    out_features, in_features = weight.shape
    return torch.ops.redline.nf4_linear(x, parts, block_size, scaler_block_size, out_features, in_features)
