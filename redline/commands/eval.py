"""`redline eval`: loss, perplexity and bits per byte of a checkpoint on a data set's validation split."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import torch


@dataclass
class EvalConfig:
    checkpoint: str
    """A checkpoint folder (RUN/checkpoints/step_N) or a run directory (its newest checkpoint)."""
    data: str | None = None
    """A prepared shard folder (None: the data the run was trained on)."""
    split: Literal["val", "train"] = "val"
    """Which split to evaluate."""
    batches: int = 50
    """Micro-batches to evaluate."""
    batch_size: int = 8
    """Sequences per micro-batch."""
    seq_len: int = 0
    """Sequence length (0: the training run's)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to evaluate."""


def main(argv: list[str]) -> int:
    from rich.console import Console

    from redline.config import parse
    from redline.data.loader import TokenLoader
    from redline.errors import UserError
    from redline.hardware import autocast_dtype, resolve_device
    from redline.training.checkpoint import load_for_inference
    from redline.training.evaluate import evaluate
    from redline.training.loop import resolve_data
    from pathlib import Path

    cfg = parse(EvalConfig, argv, prog="redline eval", description=__doc__.strip())
    device = resolve_device(cfg.device)
    model, tokenizer, train_cfg = load_for_inference(cfg.checkpoint, device)
    if cfg.data is not None:
        data_dir = Path(cfg.data)
        from redline.data.prepare import is_prepared
        if not is_prepared(data_dir):
            raise UserError(f"{data_dir} is not a prepared shard folder; run `redline data prepare` first")
    else:
        data_dir = resolve_data(train_cfg, Path(train_cfg.out_dir) / (train_cfg.run_name or ""))
    seq_len = cfg.seq_len or train_cfg.effective_seq_len
    if seq_len > model.cfg.context_len:
        raise UserError(f"seq_len={seq_len} exceeds the model's context_len {model.cfg.context_len}")
    loader = TokenLoader(data_dir, cfg.split, cfg.batch_size, seq_len, expected_identity=tokenizer.identity,
                         device=device, prefetch=False)
    token_bytes = torch.as_tensor(tokenizer.token_byte_lengths(), device=device)
    result = evaluate(model, loader.eval_batches(cfg.batches), token_bytes,
                      autocast_dtype(device, "auto"), device)
    Console().print(f"{cfg.checkpoint} on {data_dir} ({cfg.split}, {result['eval_tokens']:,} tokens): "
                    f"loss {result['loss']:.4f} | perplexity {result['perplexity']:.2f} | bits/byte {result['bpb']:.4f}")
    print(json.dumps({"checkpoint": cfg.checkpoint, "data": str(data_dir), "split": cfg.split, **result}))
    return 0
