"""torchrun's environment, read in one place. One process is the first-class case; nothing assumes it.

Only rank 0 writes logs and checkpoints; metrics are averaged across ranks.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def dist_info() -> DistInfo:
    return DistInfo(
        rank=int(os.environ.get("RANK", 0)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
    )


def init_distributed(info: DistInfo, device: torch.device, timeout_s: float = 600.0) -> None:
    """Join the process group torchrun set up (NCCL on GPUs, gloo on CPUs).

    A collective that waits longer than timeout_s for a dead or hung rank raises instead of hanging."""
    if info.enabled and not dist.is_initialized():
        from datetime import timedelta

        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None,
                                timeout=timedelta(seconds=timeout_s))


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG if t.device.type == "cuda" else dist.ReduceOp.SUM)
        if t.device.type != "cuda":  # gloo has no AVG
            t /= dist.get_world_size()
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """The element-wise maximum over ranks (the tensor itself in one process)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def all_gather_rows(t: torch.Tensor) -> torch.Tensor:
    """Every rank's `t` stacked in rank order: (world_size, *t.shape) ((1, *t.shape) in one process)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t.contiguous())  # (the list form: gloo's all_gather_into_tensor wants other shapes)
        return torch.stack(parts)
    return t[None]


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


_TORN_DOWN = False


def leave_process_group() -> None:
    """The end of a distributed command's work: free what is unreachable, then tear the group down. Objects that
    hold tensors of finished collectives must be gone before the teardown: one freed after it can wait forever
    on a gloo worker thread (seen on 2 CPU cores, about 1 run in 20, the run itself finished and written). So
    the command's work returns first (its locals freed), cycles are collected here, and `exit_after_teardown`
    ends the process. A no-op in one process."""
    if dist.is_available() and dist.is_initialized():
        import gc

        gc.collect()
        shutdown()


def shutdown() -> None:
    global _TORN_DOWN
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        _TORN_DOWN = True


def exit_after_teardown(code: int) -> None:
    """In a process whose group was torn down, end now: flush, then os._exit, skipping interpreter shutdown.
    There a gloo worker thread still releasing a finished collective's tensors can take the Python lock while
    the interpreter finalizes and abort the process (std::terminate, about 1 run in 16 under CPU load), after
    the run itself succeeded and everything was written, closed and fsynced. No-op in any other process."""
    if not _TORN_DOWN:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


_PEER_FAILURE_MARKERS = ("connection closed by peer", "connection reset", "broken pipe", "timed out", "timeout",
                         "watchdog", "nccl error", "gloo", "socket")


def peer_failure_message(error: BaseException, info: DistInfo, timeout_s: float) -> str | None:
    """A one-line explanation when `error` means another rank died or hung (None for any other error)."""
    text = str(error)
    is_backend = type(error).__name__ == "DistBackendError"
    if not info.enabled or not (is_backend or any(m in text.lower() for m in _PEER_FAILURE_MARKERS)):
        return None
    first = text.strip().splitlines()[0][:200] if text.strip() else type(error).__name__
    return (f"rank {info.rank}: another rank stopped answering (it died, or hung past dist_timeout={timeout_s:.0f} s): "
            f"{first}. Checkpoints are written whole or not at all, so the last one is intact: "
            f"resume with `redline train --resume RUN_DIR`")
