"""A LoRA layer's product, x·Wᵀ + b + (x_a·Aᵀ)·Bᵀ, as two ops that torch.compile cannot look into.

Why opaque ops. Written with torch ops, the adapter's sum costs passes over activations that its thin GEMMs do not
need. In the forward, addmm(out, low, Bᵀ) writes a new (tokens, out) tensor: aten copies `out` into it, then the
GEMM accumulates onto the copy; an in-place addmm_ would not copy, but torch.compile's functionalization turns it
back into the out-of-place addmm. In the backward, autograd adds the adapter's input gradient (tokens, in) to the
base's, another pass. Inside an op, cuBLAS accumulates the low-rank product onto the base GEMM's output in place
(beta = 1), and the adapter's input gradient onto the base's:

    redline::lora_linear(x, W, b?, A, B, x_a?)                  -> (out, low)
        out = x·Wᵀ + b, then out += low·Bᵀ in place, low = x_a·Aᵀ    x (..., in), W (out, in), A (r, in),
                                                                      B (out, r)
    redline::lora_linear_backward(g, x, x_a?, low, W, A, B, input_grad)
        -> (grad_x, grad_x_a, grad_A, grad_B)
        g·B (..., r) once, then grad_B = gᵀ·low, grad_A = (g·B)ᵀ·x_a, grad_x = g·W += (g·B)·A in place

x_a is the adapter's input when it differs from x (dropout on it); None: x itself, and grad_x holds both paths.
W and b are frozen: they get no gradient. Everything is in x's dtype (the caller casts A, B and W), so the op
needs no autocast rule. The kernels are those autograd runs (3 GEMMs forward, 5 backward): the passes are fewer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_LIB = torch.library.Library("redline", "FRAGMENT")
_LIB.define("lora_linear(Tensor x, Tensor weight, Tensor? bias, Tensor lora_a, Tensor lora_b, Tensor? lora_x) "
            "-> (Tensor, Tensor)")
_LIB.define("lora_linear_backward(Tensor grad, Tensor x, Tensor? lora_x, Tensor low, Tensor weight, Tensor lora_a, "
            "Tensor lora_b, bool input_grad) -> (Tensor, Tensor, Tensor, Tensor)")


def _lora_linear(x, weight, bias, lora_a, lora_b, lora_x):
    x_a = x if lora_x is None else lora_x
    low = torch.matmul(x_a, lora_a.t())  # (..., r)
    out = F.linear(x, weight, bias)  # (..., out), a fresh contiguous tensor: safe to add into
    out.view(-1, out.shape[-1]).addmm_(low.view(-1, low.shape[-1]), lora_b.t())
    return out, low


def _lora_linear_backward(grad, x, lora_x, low, weight, lora_a, lora_b, input_grad):
    g = grad.reshape(-1, grad.shape[-1])  # (T, out)
    x_a = (x if lora_x is None else lora_x).reshape(-1, x.shape[-1])  # (T, in)
    g_low = g @ lora_b  # (T, r)
    grad_b = g.t() @ low.reshape(-1, low.shape[-1])  # (out, r)
    grad_a = g_low.t() @ x_a  # (r, in)
    empty = x.new_empty(0)
    grad_x = grad_x_a = empty
    if input_grad:
        grad_x = g @ weight  # (T, in)
        if lora_x is None:
            grad_x.addmm_(g_low, lora_a)
        else:
            grad_x_a = (g_low @ lora_a).view(lora_x.shape)
        grad_x = grad_x.view(x.shape)
    return grad_x, grad_x_a, grad_a, grad_b


_LIB.impl("lora_linear", _lora_linear, "CompositeExplicitAutograd")
_LIB.impl("lora_linear_backward", _lora_linear_backward, "CompositeExplicitAutograd")


@torch.library.register_fake("redline::lora_linear", lib=_LIB)
def _(x, weight, bias, lora_a, lora_b, lora_x):
    return x.new_empty(*x.shape[:-1], weight.shape[0]), x.new_empty(*x.shape[:-1], lora_a.shape[0])


@torch.library.register_fake("redline::lora_linear_backward", lib=_LIB)
def _(grad, x, lora_x, low, weight, lora_a, lora_b, input_grad):
    grad_x = x.new_empty(x.shape) if input_grad else x.new_empty(0)
    grad_x_a = lora_x.new_empty(lora_x.shape) if input_grad and lora_x is not None else x.new_empty(0)
    return grad_x, grad_x_a, lora_a.new_empty(lora_a.shape), lora_b.new_empty(lora_b.shape)


def _setup_context(ctx, inputs, output):
    x, weight, bias, lora_a, lora_b, lora_x = inputs
    ctx.save_for_backward(x, lora_x, output[1], weight, lora_a, lora_b)
    ctx.input_grad = ctx.needs_input_grad[0] or (lora_x is not None and ctx.needs_input_grad[5])
    ctx.set_materialize_grads(False)  # `low` is for backward only: no zero gradient made for it


def _backward(ctx, grad, _grad_low):
    x, lora_x, low, weight, lora_a, lora_b = ctx.saved_tensors
    if grad is None:
        return None, None, None, None, None, None
    grad_x, grad_x_a, grad_a, grad_b = torch.ops.redline.lora_linear_backward(
        grad, x, lora_x, low, weight, lora_a, lora_b, ctx.input_grad)
    return (grad_x if ctx.input_grad else None, None, None, grad_a, grad_b,
            grad_x_a if ctx.input_grad and lora_x is not None else None)


torch.library.register_autograd("redline::lora_linear", _backward, setup_context=_setup_context, lib=_LIB)


def lora_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lora_a: torch.Tensor,
                lora_b: torch.Tensor, lora_x: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) -> x·Wᵀ + b + (x_a·Aᵀ)·Bᵀ (..., out); lora_x: the adapter's input x_a (None: x). Every tensor
    in x's dtype; B already scaled (alpha / r). W and b are frozen: x, x_a, A and B get gradients."""
    return torch.ops.redline.lora_linear(x, weight, bias, lora_a, lora_b, lora_x)[0]
