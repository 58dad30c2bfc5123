"""`redline sample`: print a few continuations of a prompt (plain full-recompute generation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class SampleConfig:
    checkpoint: str
    """A checkpoint folder or a run directory (its newest checkpoint)."""
    prompt: str = "The "
    """Text to continue."""
    num_samples: int = 3
    """How many continuations."""
    max_new_tokens: int = 100
    """Tokens to generate per continuation."""
    temperature: float = 0.8
    """Sampling temperature (0: greedy)."""
    top_k: int | None = 50
    """Sample among the k most likely tokens (None or 0: all)."""
    seed: int = 0
    """Sampling seed."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to run."""


def main(argv: list[str]) -> int:
    from redline.config import parse
    from redline.errors import UserError
    from redline.hardware import resolve_device
    from redline.training.checkpoint import load_for_inference
    from redline.training.loop import sample_text

    cfg = parse(SampleConfig, argv, prog="redline sample", description=__doc__.strip())
    if cfg.temperature < 0:
        raise UserError(f"temperature must be >= 0, got {cfg.temperature}")
    if cfg.max_new_tokens <= 0 or cfg.num_samples <= 0:
        raise UserError("max_new_tokens and num_samples must be positive")
    if cfg.top_k is not None and cfg.top_k < 0:
        raise UserError(f"--top-k must be >= 0 (0: all tokens), got {cfg.top_k}")
    cfg.top_k = cfg.top_k or None
    device = resolve_device(cfg.device)
    model, tokenizer, _ = load_for_inference(cfg.checkpoint, device)
    for i in range(cfg.num_samples):
        text = sample_text(model, tokenizer, cfg.prompt, cfg.max_new_tokens, device, seed=cfg.seed + i,
                           temperature=cfg.temperature, top_k=cfg.top_k)
        print(f"--- sample {i + 1} ---\n{text}")
    return 0
