#!/usr/bin/env python3
"""A redline checkpoint of a preset with random weights and the bytes tokenizer, for the serving benchmarks.

    python scripts/gpu/random_checkpoint.py modern-124m DIR     # prints the checkpoint's folder (DIR/checkpoints/...)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from redline.config import TrainConfig, to_dict
from redline.model import GPT
from redline.presets import get_preset
from redline.tokenizer import load_tokenizer
from redline.training.checkpoint import save_checkpoint


def main() -> int:
    preset, out = sys.argv[1], Path(sys.argv[2])
    cfg = TrainConfig(model=get_preset(preset))
    torch.manual_seed(0)
    print(save_checkpoint(out, 0, GPT(cfg.model), {}, to_dict(cfg), load_tokenizer("bytes"), keep=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
