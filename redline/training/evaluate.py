"""Validation loss, perplexity and bits per byte.

Bits per byte = (sum of per-token losses in nats) / (ln 2 × UTF-8 bytes those tokens decode to), over the
target tokens that are text (special tokens such as end-of-text have no bytes and are left out of both
sums). Unlike loss it stays comparable across tokenizers and vocabulary sizes. Targets of -1 (the rows past the
end of a split shorter than the evaluation: redline/data/loader.py) count in neither loss nor tokens.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from redline.distributed import all_reduce_mean
from redline.hardware import autocast


@torch.no_grad()
def evaluate(model, batches, token_bytes: torch.Tensor, autocast_dtype: torch.dtype | None,
             device: torch.device) -> dict[str, float]:
    """batches: an iterable of (x, y) on `device`. token_bytes: (vocab,) int tensor on `device`."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, tokens, text loss, text bytes
    ctx = autocast(device, autocast_dtype)
    for x, y in batches:
        with ctx:
            loss = model(x, y, reduction="none").double()  # (B, T) nats
        scored = y >= 0
        loss = torch.where(scored, loss, 0.0)
        nbytes = torch.where(scored, token_bytes[y.clamp(min=0)], 0).double()
        text = nbytes > 0
        sums += torch.stack([loss.sum(), scored.sum().double(), (loss * text).sum(), nbytes.sum()])
    model.train(was_training)
    sums = all_reduce_mean(sums)
    loss, tokens, text_loss, text_bytes = sums.tolist()  # each the ranks' mean
    mean = loss / max(tokens, 1)
    ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return {
        "loss": mean,
        "perplexity": math.exp(min(mean, 50.0)),
        "bpb": text_loss / (math.log(2) * text_bytes) if text_bytes else float("nan"),
        "eval_tokens": round(tokens * ranks),  # all ranks together: each window of the split once
    }
