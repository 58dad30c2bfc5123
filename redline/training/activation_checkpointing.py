"""Activation checkpointing per transformer block: none, selective (every other block) or full.

How it works: a checkpointed block keeps only its input for the backward pass and runs its forward again
there (torch.utils.checkpoint, use_reentrant=False, which works under torch.compile and with DDP). Instead of
wrapping each block in another module, which would rename every parameter (`blocks.3._checkpoint_wrapped_module.
attn...`) and break checkpoints, the block's class is swapped for a subclass whose forward does the
checkpointing: parameter names, state dicts and the optimizer's parameter list stay exactly as they were.

Costs and savings: a checkpointed block stores one (B, T, C) tensor instead of every intermediate (about
34·B·T·C bytes in bf16, plus the MLP's hidden activations), and runs its forward twice, so full checkpointing
costs roughly one more forward pass (~33% more compute); selective costs half of that.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from redline.errors import UserError

MODES = ("none", "selective", "full")

_SUBCLASSES: dict[type, type] = {}


def _checkpointed_class(base: type) -> type:
    """A subclass of `base` whose forward is checkpointed while training (eval and no_grad run it plainly)."""
    if base in _SUBCLASSES:
        return _SUBCLASSES[base]

    class Checkpointed(base):  # type: ignore[misc, valid-type]
        redline_checkpointed = True

        def forward(self, *args, **kwargs):
            if not (self.training and torch.is_grad_enabled()):
                return base.forward(self, *args, **kwargs)
            return checkpoint(self.forward_plain, *args, use_reentrant=False, **kwargs)

        def forward_plain(self, *args, **kwargs):
            return base.forward(self, *args, **kwargs)

    Checkpointed.__name__ = Checkpointed.__qualname__ = f"Checkpointed{base.__name__}"
    _SUBCLASSES[base] = Checkpointed
    return Checkpointed


def blocks_to_checkpoint(n_blocks: int, mode: str) -> list[int]:
    """Indices of the blocks that `mode` checkpoints: none, every other one (0, 2, 4, ...), or all."""
    if mode not in MODES:
        raise UserError(f"activation_checkpointing must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "none":
        return []
    if mode == "selective":
        return list(range(0, n_blocks, 2))
    return list(range(n_blocks))


def apply_activation_checkpointing(model: nn.Module, mode: str) -> list[int]:
    """Checkpoint the blocks of `model.blocks` that `mode` selects, in place; returns their indices.

    Call before torch.compile (the fixed order in redline/training/wrap.py)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise UserError("activation checkpointing needs a model with a `blocks` list of transformer blocks")
    chosen = blocks_to_checkpoint(len(blocks), mode)
    for i in chosen:
        block = blocks[i]
        if not getattr(block, "redline_checkpointed", False):
            block.__class__ = _checkpointed_class(type(block))
    return chosen


def is_checkpointed(module: nn.Module) -> bool:
    return bool(getattr(module, "redline_checkpointed", False))
