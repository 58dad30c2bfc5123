"""The output head and its cross-entropy, computed in chunks of tokens (`model.ce_chunk_tokens`).

Why: with a large vocabulary the head's logits are the largest tensors of a training step. At B·T = 65,536 tokens
and a 50,304-row head they are 3.3 G numbers: 6.6 GB in bf16, twice that for an fp32 copy, and a gradient of the
same size in backward. Chunked, only one chunk of rows (tokens) has logits at any time.

How it works, for a plain nn.Linear head without bias (GPT's lm_head): one custom operator,
`redline::linear_cross_entropy_sum`, walks over the rows in chunks. For each chunk it computes the logits x_c·Wᵀ
in the compute dtype (autocast's, as nn.Linear would under autocast, else the weight's), the loss in fp32 as
F.cross_entropy does on `.float()` logits, and at once the gradient of the summed loss with respect to those
logits (softmax − one-hot, zero on ignored targets), cast to the compute dtype as the full path's backward does;
from it dx_c = g·W and dW += gᵀ·x_c (accumulated in fp32). The chunk's logits are then dropped. Backward only
scales the kept dx (N, C) and dW (V, C) by the incoming gradient. So nothing is recomputed: the same three GEMMs
as the full path, with the memory of one chunk's logits. (Gradients computed in the forward pass chunk by chunk:
the technique of Liger-Kernel's fused linear cross-entropy.) On CUDA the per-chunk softmax, loss and gradient
run as one torch.compile'd function, so they read the chunk's logits once or twice instead of once per
elementwise op; elsewhere they run eagerly.

Why a custom operator and not a torch.autograd.Function: under torch.compile, AOTAutograd traces through a
Function and its partitioner moves work that only backward needs (here the dW GEMMs) into the backward graph,
saving their inputs, every chunk's (n, V) gradient, instead: the full path's memory again (measured on a CPU:
the compiled model's peak grew with the number of chunks). An operator is opaque to the partitioner, so its
outputs are what is saved, compiled or not. Because it computes gradients, it runs only when a gradient is
wanted; under no_grad (evaluation) the chunks compute losses only, through the head module.

Any other head module, such as an FP8 layer that fp8=all|auto made of lm_head, is called on each chunk under
torch.utils.checkpoint: its logits are recomputed chunk by chunk in backward, so the FP8 GEMM still runs (at the
price of one more head forward GEMM than the full path, and FP8 activation scales per chunk instead of per
batch). The same path serves reduction="none" with gradients.

Rows of the head past `vocab` (redline's padded vocabulary, or the padding of a head that model.head_vocab
narrows) take no part in the softmax, as in GPT.forward's full path: their logits are set to -inf, so they add
nothing to the loss and get no gradient. Targets equal to `ignore_index` add nothing to the loss or the gradients,
and the mean divides by the number of the others, as F.cross_entropy does.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype nn.Linear's GEMM runs in here: autocast's when it is on for x's device, else the weight's."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return weight.dtype


def chunk_loss_and_grad(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                        vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (n, V) in the compute dtype, targets (n,) -> (sum of the n losses in fp32, its gradient with respect
    to the logits, in their dtype); the columns from `vocab` on (padding) are left out. Works in place (fp32 logits
    are overwritten), so that eagerly a chunk holds one fp32 (n, V) buffer besides the logits."""
    keep = targets != ignore_index  # (n,)
    safe = torch.where(keep, targets, 0).unsqueeze(1)  # (n, 1): a valid index for gather
    full = logits.float()
    full[:, vocab:] = float("-inf")  # padding: probability 0, gradient 0
    picked = full.gather(1, safe).squeeze(1)  # (n,) the target's logit
    top = full.amax(dim=1, keepdim=True)  # (n, 1)
    probs = full.sub_(top).exp_()  # exp(logit − max)
    norm = probs.sum(dim=1, keepdim=True)  # (n, 1)
    lse = (top + norm.log()).squeeze(1)  # logsumexp
    loss = torch.where(keep, lse - picked, 0.0).sum()
    grad = probs.div_(norm).scatter_add_(1, safe, torch.full_like(safe, -1, dtype=probs.dtype))  # softmax − one-hot
    return loss, grad.mul_(keep.unsqueeze(1)).to(logits.dtype)


_compiled_chunk_step = None


def _chunk_step(device: torch.device):
    """chunk_loss_and_grad, compiled on CUDA (once, lazily), eager elsewhere."""
    global _compiled_chunk_step
    if device.type != "cuda":
        return chunk_loss_and_grad
    if _compiled_chunk_step is None:
        _compiled_chunk_step = torch.compile(chunk_loss_and_grad)
    return _compiled_chunk_step


@torch.library.custom_op("redline::linear_cross_entropy_sum", mutates_args=())
def linear_cross_entropy_sum(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int,
                             ignore_index: int, dtype: torch.dtype,
                             vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (N, C), weight (V, C), targets (N,) -> (sum over rows of cross_entropy(x·Wᵀ) over its first `vocab`
    columns, its gradient with respect to x (N, C, x's dtype), and to weight (V, C, fp32 or wider)); GEMMs in
    `dtype`, `chunk` rows at a time."""
    step = _chunk_step(x.device)
    w = weight.to(dtype)
    grad_x = torch.empty_like(x)
    grad_w = torch.zeros(weight.shape, dtype=torch.promote_types(weight.dtype, torch.float32), device=weight.device)
    total = torch.zeros((), dtype=torch.float32, device=x.device)
    with torch.autocast(x.device.type, enabled=False):  # dtypes are explicit here
        for start in range(0, x.shape[0], chunk):
            x_c = x[start:start + chunk].to(dtype)  # (n, C)
            loss, grad = step(x_c @ w.t(), targets[start:start + chunk], ignore_index, vocab)  # grad: (n, V)
            total += loss
            grad_x[start:start + chunk] = grad @ w
            if grad_w.dtype == dtype:
                grad_w.addmm_(grad.t(), x_c)
            else:  # a bf16 GEMM, accumulated in fp32
                grad_w += (grad.t() @ x_c).to(grad_w.dtype)
    return total, grad_x, grad_w


@linear_cross_entropy_sum.register_fake
def _(x, weight, targets, chunk, ignore_index, dtype, vocab):
    accumulate = torch.promote_types(weight.dtype, torch.float32)
    return x.new_empty(()).float(), torch.empty_like(x), weight.new_empty(weight.shape, dtype=accumulate)


def _setup_context(ctx, inputs, output):
    _, grad_x, grad_w = output
    ctx.save_for_backward(grad_x, grad_w)
    ctx.weight_dtype = inputs[1].dtype


def _backward(ctx, grad_total, _grad_of_grad_x, _grad_of_grad_w):
    grad_x, grad_w = ctx.saved_tensors
    return (grad_x * grad_total.to(grad_x.dtype), (grad_w * grad_total).to(ctx.weight_dtype),
            None, None, None, None, None)


linear_cross_entropy_sum.register_autograd(_backward, setup_context=_setup_context)


def _head_loss(head: nn.Module, x: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str,
               vocab: int | None) -> torch.Tensor:
    return F.cross_entropy(head(x).float()[:, :vocab], targets, ignore_index=ignore_index, reduction=reduction)


@torch.compiler.disable(recursive=False)
def _module_chunks(head: nn.Module, x: torch.Tensor, targets: torch.Tensor, chunk: int, ignore_index: int,
                   reduction: str, vocab: int | None) -> list[torch.Tensor]:
    """Each chunk's loss through the head module, its logits recomputed in backward (torch.utils.checkpoint).

    This loop is never compiled itself (recursive=False: what it calls still is, one chunk per graph): traced into
    one graph with the rest of the model, the partitioner and scheduler are free to keep every chunk's logits
    alive at once (measured on a CPU: a higher peak than the full path's)."""
    per_chunk = "none" if reduction == "none" else "sum"
    parts = []
    for start in range(0, x.shape[0], chunk):  # a loop, not a comprehension: that would be a frame of its own
        parts.append(checkpoint(_head_loss, head, x[start:start + chunk], targets[start:start + chunk],
                                ignore_index, per_chunk, vocab, use_reentrant=False))
    return parts


def chunked_cross_entropy(head: nn.Module, x: torch.Tensor, targets: torch.Tensor, chunk: int,
                          reduction: Literal["mean", "sum", "none"] = "mean", ignore_index: int = -1,
                          vocab: int | None = None) -> torch.Tensor:
    """F.cross_entropy(head(x).float()[:, :vocab], targets, ignore_index=ignore_index, reduction=reduction) without
    all of head(x) at once. x: (N, C) final hidden states, targets: (N,), chunk: rows per chunk, vocab: the head's
    rows that are tokens (None: all). A scalar, or (N,) for reduction="none"."""
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, *head.parameters()))
    plain_linear = type(head) is nn.Linear and head.bias is None
    if wants_grad and plain_linear and reduction != "none":
        total, _, _ = linear_cross_entropy_sum(x, head.weight, targets, chunk, ignore_index,
                                               compute_dtype(x, head.weight), vocab or head.weight.shape[0])
    elif wants_grad:
        parts = _module_chunks(head, x, targets, chunk, ignore_index, reduction, vocab)
        if reduction == "none":
            return torch.cat(parts)
        total = torch.stack(parts).sum()
    else:
        per_chunk = "none" if reduction == "none" else "sum"
        parts = [_head_loss(head, x[start:start + chunk], targets[start:start + chunk], ignore_index, per_chunk, vocab)
                 for start in range(0, x.shape[0], chunk)]
        if reduction == "none":
            return torch.cat(parts)
        total = torch.stack(parts).sum()
    if reduction == "sum":
        return total
    return total / (targets != ignore_index).sum()  # F.cross_entropy's mean: over the targets not ignored
