"""Data parallelism on PyTorch's own engine: DDP or FSDP2, under torchrun (one node or many).

    ddp    DistributedDataParallel: every rank holds the whole model; gradients are all-reduced in buckets,
           only on the last micro-step of an accumulation (no_sync on the others).
    fsdp2  torch.distributed.fsdp.fully_shard on each transformer block, then on the root: parameters,
           gradients and optimizer state are sharded; bf16 compute with fp32 gradient reduction.

Checkpoints are world-size independent (redline/training/checkpoint.py). Under FSDP2 every rank writes its own
shards of the model and optimizer state with torch.distributed.checkpoint (nothing is gathered), and DCP reads
them back resharded for any world size, or whole into one process or DDP. Where the ranks share no filesystem,
`full_state` gathers the full state to rank 0 instead, written in the one-process format, which
`load_optimizer_states` loads into sharded optimizers. Either way a run saved on 4 GPUs resumes on 2 or 1 and
the reverse (the data loader's position is global, too).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from redline.distributed import DistInfo
from redline.errors import UserError


def is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def apply_data_parallel(model: nn.Module, raw: nn.Module, kind: str, device: torch.device, info: DistInfo,
                        param_dtype: torch.dtype | None, bucket_mb: int = 25) -> nn.Module:
    """Wrap for `kind` ("ddp" | "fsdp2"). `model` may be compiled; `raw` is the plain GPT inside it."""
    if not info.enabled:
        return model
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (info.world_size,))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in raw.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    # the root: embeddings, final norm and head; kept gathered after forward since backward needs the head at once
    fully_shard(raw, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return model


def no_sync(model: nn.Module, last_micro_step: bool):
    """Skip gradient communication on all but the last micro-step of an accumulation."""
    if last_micro_step:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    return contextlib.nullcontext()


def set_fsdp_sync(raw: nn.Module, last_micro_step: bool) -> None:
    """FSDP2's equivalent of no_sync: reduce-scatter gradients only on the last micro-step."""
    if is_fsdp(raw):
        raw.set_requires_gradient_sync(last_micro_step)


def full_state(raw: nn.Module, optimizers: list[torch.optim.Optimizer]):
    """(model state, [optimizer states]) gathered in full on every rank's CPU (rank 0 writes them).

    Collective under FSDP2: every rank must call it."""
    if not is_fsdp(raw):
        return None, [opt.state_dict() for opt in optimizers]
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(raw, options=options)
    return model_state, [get_optimizer_state_dict(raw, opt, options=options) for opt in optimizers]


def load_optimizer_states(raw: nn.Module, optimizers: list[torch.optim.Optimizer], states: list[dict]) -> None:
    """Load full optimizer states saved by `full_state` (or by a single process) into possibly sharded optimizers."""
    if len(states) != len(optimizers):
        raise UserError(f"the checkpoint has {len(states)} optimizer states, this run has {len(optimizers)}; "
                        f"resume with the same optim.name")
    if not is_fsdp(raw):
        for opt, state in zip(optimizers, states):
            if state.get("state") and isinstance(next(iter(state["state"])), str):
                state = _id_keyed(raw, opt, state)  # saved under FSDP2: keyed by parameter name
            opt.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    for opt, state in zip(optimizers, states):
        if "state" in state and state["state"] and isinstance(next(iter(state["state"])), int):
            state = _name_keyed(raw, opt, state)
        set_optimizer_state_dict(raw, opt, optim_state_dict=state,
                                 options=StateDictOptions(full_state_dict=True))


def _name_keyed(raw: nn.Module, opt: torch.optim.Optimizer, state: dict) -> dict:
    """A plain optimizer state dict (params as integer ids) re-keyed by parameter name, as DCP expects."""
    names = {id(p): n for n, p in raw.named_parameters()}
    ordered = [names[id(p)] for group in opt.param_groups for p in group["params"]]
    out_state = {ordered[i]: v for i, v in state["state"].items()}
    groups = []
    for group in state["param_groups"]:
        g = dict(group)
        g["params"] = [ordered[i] for i in group["params"]]
        groups.append(g)
    return {"state": out_state, "param_groups": groups}


def _id_keyed(raw: nn.Module, opt: torch.optim.Optimizer, state: dict) -> dict:
    """The inverse of `_name_keyed`: a name-keyed full state for a plain optimizer (params as integer ids)."""
    names = {id(p): n for n, p in raw.named_parameters()}
    ordered = [names[id(p)] for group in opt.param_groups for p in group["params"]]
    index = {name: i for i, name in enumerate(ordered)}
    groups = []
    for group in state["param_groups"]:
        g = dict(group)
        g["params"] = [index[name] for name in group["params"]]
        groups.append(g)
    return {"state": {index[name]: v for name, v in state["state"].items()}, "param_groups": groups}


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (e.g. the gradient norm under FSDP2), or the tensor itself."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t
