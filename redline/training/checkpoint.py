"""Checkpoints: written atomically, the newest k kept, verified on load.

Layout of one checkpoint, a folder `RUN/checkpoints/step_00000500/`:
    model.safetensors   weights (fp32, tied tensors stored once)
    state.pt            optimizers, step, tokens, elapsed time, RNG states, data-loader position
    config.json         the fully resolved TrainConfig
    meta.json           step, tokenizer identity, sha256 of the two files above
    tokenizer/          the tokenizer, so eval/sample/generate need nothing else
Written into `.tmp-step_…`, each file fsynced, then renamed into place: a crash or a full disk never leaves
a half-written checkpoint under a real name.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from redline.durable import fsync_dir, fsync_file
from redline.errors import UserError

STEP_DIR = re.compile(r"^step_(\d{8})$")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, default=str))
    fsync_file(path)  # inside the temporary checkpoint folder: the folder's rename makes it visible


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """fp32 CPU copies of the weights, without the compile wrapper's prefix; tied tensors once."""
    return _cpu_fp32(getattr(model, "_orig_mod", model).state_dict())


def _cpu_fp32(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, seen = {}, {}
    for name, t in state.items():
        key = t.data_ptr()
        if key in seen and t.numel() > 0:
            continue  # tied weight: safetensors refuses shared storage, and load_state_dict re-ties it
        seen[key] = name
        out[name] = t.detach().to("cpu", torch.float32 if t.is_floating_point() else t.dtype).contiguous()
    return out


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, state: dict[str, Any],
                    config: dict[str, Any], tokenizer, keep: int, model_state: dict | None = None) -> Path:
    """Write RUN/checkpoints/step_N atomically and prune to the newest `keep`. Returns the folder.

    model_state: the full weights when they were gathered elsewhere (FSDP2); None: read them from `model`."""
    from safetensors.torch import save_file

    ckpt_root = run_dir / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step:08d}"
    tmp = ckpt_root / f".tmp-step_{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        weights, state_file = tmp / "model.safetensors", tmp / "state.pt"
        save_file(_cpu_fp32(model_state) if model_state is not None else model_weights(model), str(weights))
        with open(state_file, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        fsync_file(weights)
        _write_json(tmp / "config.json", config)
        tokenizer.save(tmp / "tokenizer")
        _write_json(tmp / "meta.json", {
            "format": 1, "step": step, "tokenizer_identity": tokenizer.identity,
            "sha256": {"model.safetensors": _sha256(weights), "state.pt": _sha256(state_file)},
        })
        fsync_dir(tmp)
        if final.exists():  # re-saving the same step (e.g. the final save after an interval save)
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(ckpt_root)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(
                f"disk full while saving the checkpoint to {final}; the previous checkpoint is intact. "
                f"Free space, lower keep_checkpoints, or point out_dir at a larger disk"
            ) from None
        raise UserError(f"could not save the checkpoint to {final}: {e}") from None
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name) and (p / "meta.json").exists())


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder from a checkpoint, a run directory (its newest) or a checkpoints folder."""
    p = Path(path)
    if (p / "meta.json").is_file() and (p / "model.safetensors").exists():
        return p
    if p.name == "checkpoints":
        p = p.parent
    found = list_checkpoints(p)
    if found:
        return found[-1]
    if not p.exists():
        raise UserError(f"checkpoint {path} does not exist; give a run directory or RUN/checkpoints/step_N")
    raise UserError(f"no checkpoint in {path}; give a run directory with checkpoints/ or a step_N folder")


def read_meta(ckpt: Path) -> dict[str, Any]:
    try:
        return json.loads((ckpt / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"checkpoint {ckpt} has an unreadable meta.json ({e}); it is corrupted, use an older one") from None


def verify_checkpoint(ckpt: Path) -> dict[str, Any]:
    """Check both payload files against the sha256 in meta.json; returns meta."""
    meta = read_meta(ckpt)
    for name, digest in meta.get("sha256", {}).items():
        f = ckpt / name
        if not f.is_file():
            raise UserError(f"checkpoint {ckpt} is missing {name}; it is incomplete, use an older checkpoint")
        if _sha256(f) != digest:
            raise UserError(f"checkpoint file {f} is corrupted or truncated (sha256 mismatch); use an older checkpoint")
    return meta


def load_weights(ckpt: Path, model: torch.nn.Module) -> None:
    from safetensors.torch import load_file

    try:
        weights = load_file(str(ckpt / "model.safetensors"))
    except Exception as e:  # safetensors raises its own error types for truncated headers
        raise UserError(f"cannot read {ckpt / 'model.safetensors'} ({e}); the checkpoint is corrupted") from None
    raw = getattr(model, "_orig_mod", model)
    missing, unexpected = raw.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if getattr(raw.cfg, "tie_embeddings", False) else set()
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        raise UserError(f"checkpoint {ckpt} does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")


def load_state(ckpt: Path) -> dict[str, Any]:
    try:
        with open(ckpt / "state.pt", "rb") as f:
            return torch.load(f, map_location="cpu", weights_only=False)
    except Exception as e:
        raise UserError(f"cannot read {ckpt / 'state.pt'} ({e}); the checkpoint is corrupted") from None


def load_config_dict(ckpt: Path) -> dict[str, Any]:
    try:
        return json.loads((ckpt / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"checkpoint {ckpt} has no readable config.json ({e})") from None


def load_for_inference(path: str | Path, device: torch.device | str = "cpu"):
    """(model in eval mode, tokenizer, TrainConfig) from a checkpoint or run directory."""
    from redline.config import TrainConfig, from_dict
    from redline.model import GPT
    from redline.tokenizer import load_tokenizer

    ckpt = resolve_checkpoint(path)
    verify_checkpoint(ckpt)
    cfg = from_dict(TrainConfig, load_config_dict(ckpt))
    model = GPT(cfg.model)
    load_weights(ckpt, model)
    tokenizer = load_tokenizer(str(ckpt / "tokenizer"))
    return model.to(device).eval(), tokenizer, cfg
