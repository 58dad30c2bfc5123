"""The baseline the engine is measured against: no cache, the whole sequence recomputed for every new token."""

from __future__ import annotations

import time

import torch

from redline.errors import UserError
from redline.inference.engine import Timings
from redline.inference.sampling import SamplingParams, make_generator, sample_next
from redline.model import GPT


@torch.no_grad()
def naive_generate(model: GPT, prompts: torch.Tensor, max_new_tokens: int,
                   sampling: SamplingParams | None = None) -> tuple[torch.Tensor, Timings]:
    """Equal-length prompts (B, T) on the model's device -> (generated ids (B, max_new_tokens), timings).
    The model runs as it is (its dtype, its mode)."""
    sampling = sampling or SamplingParams()
    sampling.validate()
    B, T = prompts.shape
    if T + max_new_tokens > model.cfg.context_len:
        raise UserError(f"prompt length {T} + max_new_tokens {max_new_tokens} exceeds "
                        f"context_len {model.cfg.context_len}")
    generator = make_generator(sampling, prompts.device)
    t_start = time.perf_counter()
    idx, t_first = prompts, None
    # model.prefix_lm (reference_window): the prompt is the prefix (the reference), as the engine's prefill makes it
    prefix = torch.full((B,), T, device=prompts.device) if model.cfg.prefix_lm or model.cfg.reference_window else None
    for i in range(max_new_tokens):
        logits = model(idx, prefix_len=prefix)[:, -1, :]
        nxt = sample_next(logits, sampling, generator)
        idx = torch.cat([idx, nxt[:, None]], dim=1)
        if i == 0:
            nxt.tolist()  # synchronise: the first token is on the host
            t_first = time.perf_counter()
    idx[:, -1].tolist()
    t_end = time.perf_counter()
    timings = Timings(batch=B, prompt_len=T, steps=max_new_tokens, ttft_s=t_first - t_start,
                      decode_s=t_end - t_first, total_s=t_end - t_start)
    return idx[:, T:], timings
