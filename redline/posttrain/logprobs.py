"""Log-probabilities of given tokens under a model, the quantity DPO and GRPO are written in.

The model's own loss (redline/model.py, `reduction="none"`) is the per-token cross-entropy, so a token's
log-probability is its negation: the same code path (chunked loss, soft-capping, padded vocabulary) as training,
normalised over the padded vocabulary as the training loss is), and targets of -1 (prompt tokens, padding) come out as 0.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def token_logps(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """inputs, targets (B, T) -> log p(targets[b, t] | inputs[b, :t+1]) (B, T) fp32; 0 where targets is -1."""
    return -model(inputs, targets, reduction="none").float()


def sequence_logps(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (sum of the counted targets' log-probabilities (B,), how many targets each row counts (B,))."""
    return token_logps(model, inputs, targets).sum(-1), (targets != -1).sum(-1)


def pad_rows(rows: list[list[int]], value: int, length: int | None = None) -> torch.Tensor:
    """Right-pad lists of ids to one length (the longest, or `length`) -> (len(rows), T) int64 on the CPU."""
    T = length or max(len(r) for r in rows)
    out = torch.full((len(rows), T), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out
