"""Checkpoints: written atomically, the newest k kept, verified on load.

One checkpoint is a folder `RUN/checkpoints/step_00000500/` in one of two layouts, named in its meta.json:

full (format 1; one process, DDP, and FSDP2 where the ranks share no filesystem)
    model.safetensors   weights (fp32, tied tensors stored once)
    state.pt            optimizers, step, tokens, elapsed time, RNG states, data-loader position
sharded (format 2; FSDP2)
    dcp/                torch.distributed.checkpoint's files: `.metadata` and one `__R_0.distcp` per rank R
                        with that rank's shards of the weights (fp32) and of the optimizer states
    state.pt            step, tokens, elapsed time, RNG states, data-loader position (no model or optimizer tensors)
and in both
    config.json         the fully resolved TrainConfig
    meta.json           format, layout, step, tokenizer identity, sha256 of every payload file
    tokenizer/          the tokenizer, so eval/sample/generate need nothing else

Written into `.tmp-step_…`, each file fsynced, then renamed into place by rank 0 (for a sharded checkpoint once
every rank's files are complete, and only if every rank succeeded): a crash or a full disk never leaves a
half-written checkpoint under a real name.

Under FSDP2 each rank writes its own shards (nothing is gathered) when every rank sees the checkpoint folder
(one node, or a filesystem all nodes share); otherwise rank 0 gathers the full state and writes the full layout.
A sharded checkpoint loads into any world size and any wrapping: DCP reads, for each tensor, the part a rank
holds now, whatever sharding it was saved with; into one process (eval, sample, generate, a resume on one GPU or
with DDP) it reads whole tensors without a process group.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import secrets
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from redline.durable import fsync_dir, fsync_file, is_disk_full
from redline.errors import UserError

STEP_DIR = re.compile(r"^step_(\d{8})$")
FULL, SHARDED = "full", "sharded"
FORMAT = {FULL: 1, SHARDED: 2}  # meta.json's "format" of each layout
DCP_DIR = "dcp"  # the sharded layout's torch.distributed.checkpoint folder


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


def _paths(run_dir: Path, step: int) -> tuple[Path, Path, Path]:
    """(RUN/checkpoints, its step_N folder, the temporary folder it is written in)."""
    ckpt_root = Path(run_dir) / "checkpoints"
    return ckpt_root, ckpt_root / f"step_{step:08d}", ckpt_root / f".tmp-step_{step:08d}"


def _write_state(path: Path, state: dict[str, Any]) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def _finish(tmp: Path, final: Path, ckpt_root: Path, meta: dict[str, Any], config: dict[str, Any], tokenizer,
            keep: int) -> None:
    """Write config, tokenizer and meta.json into `tmp`, rename it to `final`, prune to the newest `keep`."""
    _write_json(tmp / "config.json", config)
    tokenizer.save(tmp / "tokenizer")
    _write_json(tmp / "meta.json", {**meta, "tokenizer_identity": tokenizer.identity})
    fsync_dir(tmp)
    if final.exists():  # re-saving the same step (e.g. the final save after an interval save)
        _discard(final)
    os.replace(tmp, final)
    fsync_dir(ckpt_root)
    for old in list_checkpoints(ckpt_root.parent)[:-keep]:
        _discard(old)


def _discard(folder: Path) -> None:
    """Remove a checkpoint folder: first renamed out of the step_N names (one atomic step), so a crash while
    deleting never leaves a half-deleted folder that still looks like a checkpoint."""
    trash = folder.with_name(f".old-{folder.name}-{secrets.token_hex(4)}")
    try:
        os.replace(folder, trash)
    except OSError:
        return
    fsync_dir(folder.parent)
    shutil.rmtree(trash, ignore_errors=True)


def _remove_leftovers(ckpt_root: Path) -> None:
    """Temporary and discarded folders a killed process left behind (never complete checkpoints: those are only
    ever named step_N). Called by the one process that saves, before it writes."""
    if not ckpt_root.is_dir():
        return
    for p in ckpt_root.iterdir():
        if p.name.startswith((".tmp-step_", ".old-step_")) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def _save_error(error: BaseException, final: Path) -> str:
    """The one-line explanation of a failed save."""
    if is_disk_full(error):
        return (f"disk full while saving the checkpoint to {final}; the previous checkpoint is intact. "
                f"Free space, lower keep_checkpoints, or point out_dir at a larger disk")
    if isinstance(error, UserError):
        return str(error)
    lines = str(error).strip().splitlines()
    return f"could not save the checkpoint to {final}: {type(error).__name__}: {lines[0] if lines else ''}"


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, state: dict[str, Any],
                    config: dict[str, Any], tokenizer, keep: int, model_state: dict | None = None,
                    extra_meta: dict[str, Any] | None = None) -> Path:
    """Write RUN/checkpoints/step_N atomically in the full layout and prune to the newest `keep`. Returns the
    folder. Called by rank 0 alone.

    model_state: the full weights when they were gathered elsewhere (FSDP2), or the adapters alone of a LoRA run
    (redline/training/adapters.py); None: read them from `model`. extra_meta: added to meta.json."""
    from safetensors.torch import save_file

    ckpt_root, final, tmp = _paths(run_dir, step)
    try:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(ckpt_root)
        tmp.mkdir()
        weights, state_file = tmp / "model.safetensors", tmp / "state.pt"
        save_file(_cpu_fp32(model_state) if model_state is not None else model_weights(model), str(weights))
        _write_state(state_file, state)
        fsync_file(weights)
        meta = {"format": FORMAT[FULL], "layout": FULL, "step": step, **(extra_meta or {}),
                "sha256": {"model.safetensors": _sha256(weights), "state.pt": _sha256(state_file)}}
        _finish(tmp, final, ckpt_root, meta, config, tokenizer, keep)
    except BaseException as e:  # a signal too: no temporary folder is left to fill the disk
        shutil.rmtree(tmp, ignore_errors=True)
        # safetensors raises SafetensorError and torch.save RuntimeError for a full disk, not OSError
        if is_disk_full(e) or isinstance(e, (OSError, UserError)):
            raise UserError(_save_error(e, final)) from None
        raise
    return final


# ----------------------------------------------------------------------------------------------------
# the sharded layout (torch.distributed.checkpoint)


def _dist():
    """(rank, world size, torch.distributed or None when there is no process group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), dist
    return 0, 1, None


def _gather(value: Any) -> list[Any]:
    """Every rank's `value`, in rank order (collective; [value] without a process group)."""
    rank, world, dist = _dist()
    if dist is None:
        return [value]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, value)
    return out


def every_rank_sees(folder: Path) -> bool:
    """Whether a file rank 0 writes into `folder` is visible to every rank: one node, or a filesystem all nodes
    share. Collective; True without a process group."""
    rank, world, dist = _dist()
    if dist is None:
        return True
    token = [secrets.token_hex(8) if rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    probe = Path(folder) / f".probe-{token[0]}"
    if rank == 0:
        try:
            probe.parent.mkdir(parents=True, exist_ok=True)
            probe.write_text(token[0])
        except OSError:
            pass  # then nobody sees it: the full layout is written, and says what went wrong
    dist.barrier()
    try:
        seen = probe.read_text() == token[0]
    except OSError:
        seen = False
    everyone = all(_gather(seen))
    if rank == 0:
        probe.unlink(missing_ok=True)
    return everyone


def sharded_state(model: torch.nn.Module, optimizers: list[torch.optim.Optimizer] = ()) -> dict[str, Any]:
    """What a sharded checkpoint holds, as DCP saves and loads it: {"model": weights, "optimizers": {"0": …}}.

    Under FSDP2 the values are this rank's shards (DTensors); otherwise whole tensors. The optimizer states are
    flattened and keyed by parameter name (`state.blocks.0.attn.qkv.weight.exp_avg`,
    `param_groups.blocks.0.attn.qkv.weight.lr`), so they reshard like the weights. An optimizer without state
    yet gets it from one zero step at learning rate 0 (torch's state-dict API does that), so a fresh run's
    optimizers can receive a checkpoint's."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    from redline.converters.float8 import plain_weight

    raw = getattr(model, "_orig_mod", model)
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    # FP8 all-gather wraps weights in a torchao tensor subclass: store (and load into) the plain tensor inside
    weights = {name: plain_weight(t) for name, t in get_model_state_dict(raw, options=options).items()}
    return {"model": weights,
            "optimizers": {str(i): get_optimizer_state_dict(raw, opt, options=options)
                           for i, opt in enumerate(optimizers)}}


def _first_failure(error: BaseException) -> BaseException:
    """The first rank's own exception inside DCP's CheckpointException (which maps rank → (exception, trace))."""
    failures = getattr(error, "failures", None) or {}
    for _, (exc, _trace) in sorted(failures.items()):
        return exc
    return error


def _check_complete(dcp_dir: Path, names: list[str], digests: dict[str, str]) -> None:
    """On rank 0: every file DCP's .metadata points into is there and has its digest. Fails where the ranks do
    not share the filesystem (another node's shards are not in rank 0's folder)."""
    from torch.distributed.checkpoint import FileSystemReader

    needed = {info.relative_path for info in FileSystemReader(str(dcp_dir)).read_metadata().storage_data.values()}
    missing = sorted((needed - set(names)) | {n for n in names if f"{DCP_DIR}/{n}" not in digests})
    if missing:
        raise UserError(f"rank 0 does not see {missing[0]} of the sharded checkpoint in {dcp_dir}: the ranks must "
                        f"share the filesystem of out_dir")


def save_sharded_checkpoint(run_dir: Path, step: int, model: torch.nn.Module,
                            optimizers: list[torch.optim.Optimizer], state: dict[str, Any], config: dict[str, Any],
                            tokenizer, keep: int) -> Path:
    """Write RUN/checkpoints/step_N in the sharded layout, atomically, and prune to the newest `keep`.

    Collective: every rank calls it and writes its own shards of the weights and optimizer states; rank 0
    writes `state` (the non-tensor state), config, tokenizer and meta.json, and renames the folder into place
    once every rank's files are complete. A failure on any rank raises the same UserError on every rank and
    leaves no folder under the real name. Works without a process group too (one process writes it all)."""
    import torch.distributed.checkpoint as dcp

    rank, world, dist = _dist()
    ckpt_root, final, tmp = _paths(run_dir, step)

    def agree(error: BaseException | None) -> None:
        """Raise on every rank if any rank failed (rank 0 removes the temporary folder first)."""
        messages = [m for m in _gather(None if error is None else _save_error(error, final)) if m]
        if messages:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise UserError(messages[0])

    error: BaseException | None = None
    if rank == 0:
        try:
            ckpt_root.mkdir(parents=True, exist_ok=True)
            _remove_leftovers(ckpt_root)
            (tmp / DCP_DIR).mkdir(parents=True)
        except OSError as e:
            error = e
    agree(error)
    # every rank writes its shards, each file fsynced; rank 0 then writes .metadata (fsynced) from all ranks' results
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(sharded_state(model, optimizers), checkpoint_id=tmp / DCP_DIR, no_dist=dist is None)
    except dcp.CheckpointException as e:  # raised on every rank when any rank failed (a BaseException)
        error = _first_failure(e)
    except Exception as e:
        error = e
    agree(error)
    # sha256 of DCP's files, each rank hashing a share of them (on a shared filesystem any rank reads any file)
    names: list[str] = []
    mine: dict[str, str] = {}
    try:
        names = sorted(f.name for f in (tmp / DCP_DIR).iterdir() if f.is_file())
        mine = {f"{DCP_DIR}/{name}": _sha256(tmp / DCP_DIR / name) for name in names[rank::world]}
    except OSError as e:
        error = e
    agree(error)
    digests = {k: v for part in _gather(mine) for k, v in part.items()}
    if rank == 0:
        try:
            _check_complete(tmp / DCP_DIR, names, digests)
            _write_state(tmp / "state.pt", state)
            digests["state.pt"] = _sha256(tmp / "state.pt")
            fsync_dir(tmp / DCP_DIR)
            meta = {"format": FORMAT[SHARDED], "layout": SHARDED, "step": step, "world_size": world,
                    "sha256": dict(sorted(digests.items()))}
            _finish(tmp, final, ckpt_root, meta, config, tokenizer, keep)
        except Exception as e:  # torch.save's RuntimeError for a full disk too: every rank must hear of it
            error = e
    agree(error)
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
    if (p / "meta.json").is_file() and ((p / "model.safetensors").exists() or (p / DCP_DIR).is_dir()):
        return p
    if p.name == "checkpoints":
        p = p.parent
    found = list_checkpoints(p)
    if found:
        return found[-1]
    if not p.exists():
        raise UserError(f"checkpoint {path} does not exist; give a run directory or RUN/checkpoints/step_N")
    runs = sorted(d.name for d in p.iterdir() if d.is_dir() and list_checkpoints(d)) if p.is_dir() else []
    if runs:  # a folder of runs (out_dir, e.g. runs/) given for one of them
        shown = ", ".join(runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
        raise UserError(f"{path} holds runs, not a checkpoint: give one of them, e.g. {p / runs[0]} ({shown})")
    raise UserError(f"no checkpoint in {path}; give a run directory with checkpoints/ or a step_N folder")


def read_meta(ckpt: Path) -> dict[str, Any]:
    try:
        meta = json.loads((ckpt / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"checkpoint {ckpt} has an unreadable meta.json ({e}); it is corrupted, use an older one") from None
    digests = meta.get("sha256") if isinstance(meta, dict) else None
    if not (isinstance(digests, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in digests.items())):
        raise UserError(f"checkpoint {ckpt} has a meta.json without the sha256 of its files; it is corrupted, "
                        f"use an older one")
    return meta


def layout(meta: dict[str, Any]) -> str:
    """FULL or SHARDED, from a checkpoint's meta.json (checkpoints from before the sharded layout are full)."""
    if meta.get("format", 1) not in FORMAT.values():
        raise UserError(f"checkpoint format {meta.get('format')!r} is not one this redline reads "
                        f"({', '.join(map(str, FORMAT.values()))}); update redline, or the meta.json is corrupted")
    kind = meta.get("layout", FULL)
    if kind not in FORMAT:
        raise UserError(f"checkpoint layout {kind!r} is not one this redline reads ({', '.join(FORMAT)}); "
                        f"update redline, or the meta.json is corrupted")
    return kind


def verify_checkpoint(ckpt: Path) -> dict[str, Any]:
    """Check every payload file against the sha256 in meta.json; returns meta."""
    meta = read_meta(ckpt)
    layout(meta)
    for name, digest in meta["sha256"].items():
        f = ckpt / name
        if not f.is_file():
            raise UserError(f"checkpoint {ckpt} is missing {name}; it is incomplete, use an older checkpoint")
        if _sha256(f) != digest:
            raise UserError(f"checkpoint file {f} is corrupted or truncated (sha256 mismatch); use an older checkpoint")
    return meta


def load_weights(ckpt: Path, model: torch.nn.Module) -> None:
    """The checkpoint's weights into a plain model, from either layout; a LoRA run's checkpoint gives the merged
    model (its base with the adapters folded in: redline/training/adapters.py)."""
    from safetensors.torch import load_file

    from redline.training import adapters

    meta = read_meta(ckpt)
    if layout(meta) == SHARDED:
        load_sharded(ckpt, model)
        return
    if adapters.is_adapter_checkpoint(meta):
        raw = getattr(model, "_orig_mod", model)
        raw.load_state_dict(adapters.merged_state(meta, ckpt, raw), strict=False)
        return

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


def load_init_weights(model: torch.nn.Module, path: str | Path, verify: bool = True) -> Path:
    """Load the weights of the redline checkpoint `path` into `model`, and return the checkpoint folder.

    path: a checkpoint folder (RUN/checkpoints/step_N, or a folder `redline import` wrote) or a run directory (its
    newest checkpoint); either layout, any stored dtype (copied into the model's). model: a plain GPT (not compiled
    or wrapped, no converters applied yet) built from that checkpoint's ModelConfig (see
    redline/training/init_from.py). Weights only: no optimizer, step or data state. verify: check every payload
    file against meta.json's sha256 first (False: the caller has)."""
    ckpt = resolve_checkpoint(path)
    if verify:
        verify_checkpoint(ckpt)
    load_weights(ckpt, model)
    return ckpt


def load_sharded(ckpt: Path, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer] = (),
                 optimizer_types: list[str] | None = None) -> None:
    """A sharded checkpoint's weights (and optimizer states) into `model` (and `optimizers`), whatever world size
    and sharding it was saved with: under FSDP2 every rank reads the parts of each tensor it holds now
    (collective); a plain or DDP model reads whole tensors on its own, without a process group.

    optimizer_types: the optimizers' class names the checkpoint was saved with (state.pt), checked first."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    from redline.training.parallel import is_fsdp

    have = [type(opt).__name__ for opt in optimizers]
    if optimizer_types is not None and optimizers and list(optimizer_types) != have:
        raise UserError(f"the checkpoint has optimizer states of {', '.join(optimizer_types)}, this run uses "
                        f"{', '.join(have)}; resume with the same optim.name")
    raw = getattr(model, "_orig_mod", model)
    target = sharded_state(raw, optimizers)  # this rank's tensors, which DCP fills in place
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(target, checkpoint_id=ckpt / DCP_DIR, no_dist=not is_fsdp(raw))
    except (dcp.CheckpointException, RuntimeError, ValueError, KeyError, OSError) as e:
        lines = str(_first_failure(e)).strip().splitlines()
        reason = lines[-1][:300] if lines else type(e).__name__
        raise UserError(f"cannot load the sharded checkpoint {ckpt} into this model ({reason}); it is corrupted or "
                        f"from another model") from None
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    set_model_state_dict(raw, target["model"], options=options)
    for i, opt in enumerate(optimizers):
        set_optimizer_state_dict(raw, opt, optim_state_dict=target["optimizers"][str(i)], options=options)


def load_state(ckpt: Path) -> dict[str, Any]:
    try:
        with open(ckpt / "state.pt", "rb") as f:
            return torch.load(f, map_location="cpu", weights_only=False)
    except Exception as e:
        raise UserError(f"cannot read {ckpt / 'state.pt'} ({e}); the checkpoint is corrupted") from None


def load_config_dict(ckpt: Path) -> dict[str, Any]:
    try:
        config = json.loads((ckpt / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"checkpoint {ckpt} has no readable config.json ({e})") from None
    if not isinstance(config, dict):
        raise UserError(f"checkpoint {ckpt} has a config.json that is not a table of settings; it is corrupted")
    return config


def generation_config(ckpt: Path) -> dict | None:
    """The generation_config.json an imported model brought: in the checkpoint itself, or, for a run that started
    from one (init_from), in that checkpoint (where it is still there). None: none, or not a JSON object."""
    places = [Path(ckpt)]
    init_from = load_config_dict(Path(ckpt)).get("init_from") if (Path(ckpt) / "config.json").is_file() else None
    if isinstance(init_from, str) and Path(init_from).exists():
        try:
            places.append(resolve_checkpoint(init_from))
        except UserError:
            pass
    for folder in places:
        path = folder / "generation_config.json"
        if path.is_file():
            try:
                value = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            return value if isinstance(value, dict) else None
    return None


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


# ----------------------------------------------------------------------------------------------------
# checkpoints made outside training: imported models (redline import), and reading one for export


def write_weights_checkpoint(folder: Path, weights: dict[str, torch.Tensor], config: dict[str, Any], tokenizer,
                             meta: dict[str, Any], extra_files: dict[str, str] | None = None) -> None:
    """Fill the empty folder `folder` with a checkpoint that holds weights alone (no optimizer or data state): the
    full layout's model.safetensors in the tensors' own dtypes, config.json (a TrainConfig), tokenizer/, meta.json
    (step 0, `meta` added) and `extra_files` (name -> text, e.g. generation_config.json), each file fsynced. Every
    command that reads a checkpoint reads it. The caller makes it atomic: write into a temporary folder, rename."""
    from safetensors.torch import save_file

    folder = Path(folder)
    weights_file = folder / "model.safetensors"
    save_file({k: v.contiguous() for k, v in weights.items()}, str(weights_file))
    fsync_file(weights_file)
    digests = {"model.safetensors": _sha256(weights_file)}
    for name, text in (extra_files or {}).items():
        (folder / name).write_text(text, encoding="utf-8")
        fsync_file(folder / name)
        digests[name] = _sha256(folder / name)
    _write_json(folder / "config.json", config)
    tokenizer.save(folder / "tokenizer")
    _write_json(folder / "meta.json", {"format": FORMAT[FULL], "layout": FULL, "step": 0, **meta,
                                       "sha256": digests, "tokenizer_identity": tokenizer.identity})
    fsync_dir(folder)


def load_checkpoint_weights(path: str | Path):
    """(fp32 CPU state dict, TrainConfig, tokenizer, checkpoint folder) of a checkpoint of either layout, for
    export; tied tensors appear once (under wte.weight)."""
    model, tokenizer, cfg = load_for_inference(path, "cpu")
    return model_weights(model), cfg, tokenizer, resolve_checkpoint(path)
