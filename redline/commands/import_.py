"""`redline import SRC --out DIR`: bring a model from elsewhere into a redline checkpoint folder.

    redline import path/to/hf-folder --out models/smollm2        # config.json + safetensors (+ shards) + tokenizer
    redline import HuggingFaceTB/SmolLM2-135M --out models/smol  # a Hub name (downloads when online)
    redline import model-Q4_K_M.gguf --out models/q4 --dtype bf16 # GGUF: tensors dequantized
    redline import ~/.cache/nanochat/base_checkpoints/d20 --out models/d20  # nanochat's own model_*.pt + meta_*.json

DIR is a checkpoint like the ones training writes (model.safetensors, config.json, tokenizer/ with its chat
template, meta.json): `generate`, `chat`, `eval`, `sample` and `bench-infer` take it as --checkpoint, `export` as
CKPT, and `train --init-from DIR` continues training it on your data. The families (config.json's model_type)
are listed below and in docs/import_export.md. The EOS ids of generation_config.json become the tokenizer's stop
tokens. Older folders load too: pytorch_model.bin weights (tensors only), and a
vocab.json + merges.txt or tokenizer.model tokenizer converted by transformers. DIR is written atomically: on any
error nothing is left there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Literal

import tyro


@dataclass
class ImportConfig:
    src: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="SRC")]
    """A Hugging Face model folder, a .gguf file, a model name on the Hugging Face Hub (owner/name), or a nanochat
    checkpoint folder (model_NNNNNN.pt + meta_NNNNNN.json)."""
    out: str
    """The checkpoint folder to write (must not exist yet, or be empty)."""
    dtype: Literal["auto", "bf16", "fp32"] = "auto"
    """Dtype of the stored weights. auto: the source's own where it is bf16 or fp32, fp32 otherwise (fp16,
    dequantized GGUF)."""
    tokenizer: str | None = None
    """Use this tokenizer.json (or folder) instead of the one that comes with SRC; for a nanochat checkpoint folder,
    its tokenizer.pkl (a pickle, read for a tiktoken Encoding's state alone) or a tokenizer.json."""
    revision: str | None = None
    """Hub names only: a branch, tag or commit."""
    step: int | None = None
    """nanochat checkpoint folders only: the step to import (model_NNNNNN.pt); default the latest."""


def stored_dtype(choice: str, source_dtype):
    import torch

    if choice != "auto":
        return {"bf16": torch.bfloat16, "fp32": torch.float32}[choice]
    return source_dtype if source_dtype in (torch.bfloat16, torch.float32) else torch.float32


def write_checkpoint(imported, out: str, dtype) -> None:
    """The imported model as a weights-only checkpoint folder, atomically."""
    from redline.config import TrainConfig, to_dict
    from redline.interop.hf import write_atomic_folder
    from redline.training.checkpoint import write_weights_checkpoint

    train_cfg = TrainConfig(preset=f"imported-{imported.family}", model=imported.cfg)
    weights = {k: v.to(dtype) for k, v in imported.state.items()}
    meta = {"imported_from": {"source": imported.source, "family": imported.family,
                              "dtype": str(dtype).removeprefix("torch.")}}
    extra = {}
    if imported.generation_config:
        extra["generation_config.json"] = json.dumps(imported.generation_config, indent=2) + "\n"
    write_atomic_folder(out, lambda tmp: write_weights_checkpoint(tmp, weights, to_dict(train_cfg),
                                                                  imported.tokenizer, meta, extra))


def main(argv: list[str]) -> int:
    from pathlib import Path

    from redline.config import parse
    from redline.errors import UserError
    from redline.interop.source import read_source

    from redline.interop.families import supported_names

    cfg = parse(ImportConfig, argv, prog="redline import",
                description=f"{__doc__.strip()}\n\nFamilies: {', '.join(supported_names())}.")
    out = Path(cfg.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):  # before reading gigabytes
        raise UserError(f"{out} already exists; give a new folder for --out (or remove that one)")
    imported = read_source(cfg.src, cfg.tokenizer, cfg.revision, cfg.step)
    dtype = stored_dtype(cfg.dtype, imported.source_dtype)
    write_checkpoint(imported, cfg.out, dtype)
    m = imported.cfg
    params = sum(t.numel() for t in imported.state.values())
    context = f"context {m.context_len:,}"  # with the RoPE scaling that reaches it, where there is one
    if m.rope_scaling == "longrope":
        context += (f" (LongRoPE's short factors; model.context_len up to "
                    f"{round(m.rope_factor * m.rope_original_context):,} takes its long ones)"
                    if m.rope_long_pair_factors else " (LongRoPE)")
    elif m.pos_emb == "rope" and m.rope_scaling != "none":
        context += f" ({m.rope_scaling} RoPE ×{m.rope_factor:g}" + (
            f" over {m.rope_original_context:,})" if m.rope_scaling in ("llama3", "yarn") else ")")
    if m.sliding_window:
        context += f", window {m.sliding_window:,}" + (
            f" (one full layer in every {m.sliding_window_pattern})" if m.sliding_window_pattern else "")
    print(f"redline import: {imported.family} from {imported.source} -> {out} ({params / 1e6:.1f}M parameters, "
          f"{m.n_layer} layers, width {m.n_embd}, {m.n_head} heads / {m.kv_heads} kv of {m.head_dim}, {context}, "
          f"{str(dtype).removeprefix('torch.')}; stop tokens {imported.tokenizer.stop_ids}"
          f"{'; chat template' if imported.tokenizer.chat_template else ''})")
    print(f"next: redline generate --checkpoint {out} --prompt \"...\"")
    print(json.dumps({"out": str(out), "family": imported.family, "parameters": params,
                      "dtype": str(dtype).removeprefix("torch."), "stop_ids": imported.tokenizer.stop_ids}))
    return 0
