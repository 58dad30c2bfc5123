"""`redline export CKPT --out DIR`: a redline checkpoint as a Hugging Face folder or a GGUF file.

    redline export runs/modern-124m-... --out exported/       # transformers.AutoModelForCausalLM.from_pretrained
    redline export models/smollm2 --out smol.gguf --format gguf --dtype fp16   # llama.cpp, transformers' GGUF loader

The architecture follows the model: GPT-2 for learned positions (the gpt2 presets), Qwen3 with QK-norm (the modern
presets), Mistral with a sliding window, Qwen2 with biases on q/k/v alone, Llama otherwise. A redline option none of
them has (post-norm, ReLU², learned positions with RMSNorm, logit soft-capping, ...) is an error that names it.
The folder holds config.json, model.safetensors, generation_config.json (the stop, BOS and padding ids, with the
rest of an imported model's own generation config), tokenizer.json and
tokenizer_config.json (special tokens, chat template). Written atomically: on any error nothing is left at --out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Literal

import tyro


@dataclass
class ExportConfig:
    checkpoint: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="CKPT")]
    """A checkpoint folder or a run directory (its newest checkpoint)."""
    out: str
    """The folder (hf) or .gguf file (gguf) to write; it must not exist yet."""
    format: Literal["hf", "gguf"] = "hf"
    """hf: a Hugging Face model folder; gguf: one GGUF file."""
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """Dtype of the written weights (auto: the dtype the checkpoint stores, fp32 for one redline trained). In a
    GGUF, norms and biases stay fp32 as llama.cpp keeps them."""


def stored_dtype(ckpt):
    """The dtype of a checkpoint's model.safetensors (fp32 for the sharded layout, which training writes)."""
    import torch
    from safetensors import safe_open

    path = ckpt / "model.safetensors"
    if not path.is_file():
        return torch.float32
    with safe_open(str(path), framework="pt") as f:
        names = list(f.keys())
        kind = f.get_slice(names[0]).get_dtype() if names else "F32"
    return {"BF16": torch.bfloat16, "F16": torch.float16}.get(kind, torch.float32)


def original_generation_config(ckpt, train_cfg) -> dict | None:
    """The generation_config.json an imported model brought: in the checkpoint itself, or, for a run that started
    from one (init_from), in that checkpoint (where it is still there)."""
    from pathlib import Path

    from redline.training.checkpoint import resolve_checkpoint

    places = [ckpt]
    if train_cfg.init_from and Path(train_cfg.init_from).exists():
        places.append(resolve_checkpoint(train_cfg.init_from))
    for folder in places:
        path = Path(folder) / "generation_config.json"
        if path.is_file():
            try:
                return json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                return None
    return None


def main(argv: list[str]) -> int:
    from pathlib import Path

    from redline.config import parse
    from redline.errors import UserError
    from redline.interop.families import export_family
    from redline.interop.hf import DTYPES
    from redline.training.checkpoint import load_checkpoint_weights, resolve_checkpoint

    cfg = parse(ExportConfig, argv, prog="redline export", description=__doc__.strip())
    out = Path(cfg.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} already exists; give a new path for --out (or remove that one)")
    if cfg.format == "gguf":
        from redline.interop.gguf_file import require_gguf

        require_gguf()  # the extra, before any work
    ckpt = resolve_checkpoint(cfg.checkpoint)
    state, train_cfg, tokenizer, ckpt = load_checkpoint_weights(ckpt)
    family = export_family(train_cfg.model)  # the one-line error for an option no architecture has, early
    dtype = stored_dtype(ckpt) if cfg.dtype == "auto" else DTYPES[cfg.dtype]
    if cfg.format == "hf":
        from redline.interop.hf import write_folder

        write_folder(out, state, train_cfg.model, tokenizer, family, dtype, original_generation_config(ckpt, train_cfg))
        loader = f"AutoModelForCausalLM.from_pretrained({str(out)!r})"
    else:
        from redline.interop.gguf_file import write_gguf

        write_gguf(out, state, train_cfg.model, tokenizer, family, dtype)
        loader = f"AutoModelForCausalLM.from_pretrained({str(out.parent)!r}, gguf_file={out.name!r}) or llama.cpp"
    name = str(dtype).removeprefix("torch.")
    print(f"redline export: {ckpt} -> {out} as {family.architecture} ({cfg.format}, {name}); load it with {loader}")
    print(json.dumps({"out": str(out), "format": cfg.format, "architecture": family.architecture, "dtype": name}))
    return 0
