"""Checkpoints of a LoRA run: the adapters alone, and a reference to the base they adapt.

A LoRA run's checkpoint has the full layout of redline/training/checkpoint.py, but its model.safetensors holds only
what trained: every adapter (`blocks.N.attn.qkv.lora_A` (r, in), `...lora_B` (out, r)) and the parameters of
lora.train_modules. Its meta.json adds

    "lora_base": {"path": the base checkpoint folder (absolute), "identity": sha256 of the base's meta.json digests,
                  "dtype": the dtype the frozen weights had in training (bfloat16, float32),
                  "nf4_backend": QLoRA only: the library that quantized them (torchao, bitsandbytes; absent in
                                 checkpoints from before there was a choice: torchao)}

so a 1.5B model's fine-tune saves megabytes, not gigabytes. Reading one back:

    resume      the base's weights into the plain model, the converter adapts it, then load_adapters (loop.py)
    eval, generate, sample, export, init_from
                checkpoint.load_weights gives the merged model: each adapted W replaced by the W the run trained
                against (rounded to the base dtype, or through NF4 and back, in the run's library, for QLoRA)
                plus (alpha/r)·B·A

The base is checked against its identity before use: a base that moved or changed is a one-line error.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from redline.errors import UserError

META_KEY = "lora_base"


def is_adapter_checkpoint(meta: dict[str, Any]) -> bool:
    return META_KEY in meta


def base_identity(meta: dict[str, Any]) -> str:
    """A checkpoint's identity: the sha256 of its files' digests (no need to hash gigabytes twice)."""
    return hashlib.sha256(json.dumps(meta["sha256"], sort_keys=True).encode()).hexdigest()


def base_reference(base: Path, dtype: torch.dtype, nf4_backend: str | None = None) -> dict[str, str]:
    from redline.training.checkpoint import read_meta

    ref = {"path": str(Path(base).resolve()), "identity": base_identity(read_meta(base)),
           "dtype": str(dtype).removeprefix("torch.")}
    return ref | ({"nf4_backend": nf4_backend} if nf4_backend else {})


def nf4_backend_of(ref: dict[str, str]) -> str:
    """The library that quantized a QLoRA run's base (torchao before there was a choice)."""
    return ref.get("nf4_backend", "torchao")


def check_nf4_backend(ref: dict[str, str], lora, resolved: str | None) -> None:
    """A resumed QLoRA run quantizes its base with the library it trained with: the other's scales round otherwise."""
    if resolved is not None and nf4_backend_of(ref) != resolved:
        raise UserError(f"this QLoRA run trained on a base quantized by {nf4_backend_of(ref)} and lora.nf4_backend="
                        f"{lora.nf4_backend} gives {resolved}; resume with lora.nf4_backend={nf4_backend_of(ref)}")


def resolve_base(meta: dict[str, Any], ckpt: Path) -> Path:
    """The verified base checkpoint of the adapter checkpoint `ckpt` (whose meta.json is `meta`)."""
    from redline.training.checkpoint import verify_checkpoint

    ref = meta[META_KEY]
    base = Path(ref["path"])
    if not (base / "meta.json").is_file():
        raise UserError(f"{ckpt} holds LoRA adapters for the base checkpoint {base}, which is not there; put the "
                        f"base back at that path")
    base_meta = verify_checkpoint(base)
    if base_identity(base_meta) != ref["identity"]:
        raise UserError(f"the base checkpoint {base} is not the one the adapters of {ckpt} were trained on (its "
                        f"files differ); restore that base")
    return base


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """What a LoRA run trained: its parameters with requires_grad, by name (tied ones once)."""
    raw = getattr(model, "_orig_mod", model)
    return {name: p for name, p in raw.named_parameters() if p.requires_grad}


def _read(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(ckpt / "model.safetensors"))
    except Exception as e:  # safetensors raises its own error types for truncated headers
        raise UserError(f"cannot read {ckpt / 'model.safetensors'} ({e}); the checkpoint is corrupted") from None


def load_base(meta: dict[str, Any], ckpt: Path, model: nn.Module) -> None:
    """The base weights of the adapter checkpoint `ckpt` into a plain (not yet adapted) model."""
    from redline.training.checkpoint import load_weights

    load_weights(resolve_base(meta, ckpt), model)


@torch.no_grad()
def load_adapters(ckpt: Path, model: nn.Module) -> None:
    """The adapter checkpoint's tensors into an adapted model: every trained parameter must be there."""
    saved = _read(ckpt)
    params = adapter_state(model)
    missing = sorted(set(params) - set(saved))
    unexpected = sorted(set(saved) - set(params))
    if missing or unexpected:
        raise UserError(f"checkpoint {ckpt} does not match this run's adapters (missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]}); resume with the lora settings it was trained with")
    for name, p in params.items():
        p.copy_(saved[name])


@torch.no_grad()
def merged_state(meta: dict[str, Any], ckpt: Path, model: nn.Module) -> dict[str, torch.Tensor]:
    """The full weights of the fine-tuned model, for a plain `model` of the checkpoint's architecture (used as
    scratch space: it ends holding the base)."""
    from redline.config import TrainConfig, from_dict
    from redline.converters.lora import dequantize, to_nf4
    from redline.training.checkpoint import load_config_dict, load_weights

    cfg = from_dict(TrainConfig, load_config_dict(ckpt))
    load_weights(resolve_base(meta, ckpt), model)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    saved = _read(ckpt)
    dtype = getattr(torch, meta[META_KEY].get("dtype", "float32"))
    scale = cfg.lora.alpha / cfg.lora.rank
    for name, tensor in saved.items():
        if name.endswith(".lora_A"):
            layer = name.removesuffix(".lora_A")
            weight = state[layer + ".weight"].to(dtype)
            if cfg.lora.quantize == "nf4":  # the weights QLoRA trained against: NF4 and back, in the run's library
                weight = dequantize(to_nf4(weight, layer, nf4_backend_of(meta[META_KEY]))).to(dtype)
            delta = (saved[layer + ".lora_B"].float() @ tensor.float()) * scale  # (out, r) @ (r, in)
            state[layer + ".weight"] = weight.float() + delta
            if layer + ".bias" in state:
                state[layer + ".bias"] = state[layer + ".bias"].to(dtype).float()
        elif not name.endswith(".lora_B"):
            state[name] = tensor  # a module trained in full (lora.train_modules)
    if cfg.model.tie_embeddings:
        state.pop("lm_head.weight", None)  # the embedding itself: loading both would let the stale copy win
    return state
