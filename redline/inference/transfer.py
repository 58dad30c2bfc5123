"""Host values onto the device without the host waiting for it.

A decode loop queues steps ahead of the GPU; anything that makes the host wait for the device drains that queue and
leaves the GPU idle while the host launches the next work. In PyTorch, `torch.as_tensor(values, device="cuda")`, a
blocking copy and `t[i] = 5` on a CUDA tensor (a blocking copy of a host scalar) all wait for every kernel queued
before them.
"""

from __future__ import annotations

import torch


def to_device(values, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host values (a list or a CPU tensor) on `device`: on a GPU copied from pinned memory with non_blocking, so
    the copy is queued behind the device's work instead of waiting for it."""
    host = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def put(t: torch.Tensor, index, value) -> None:
    """t[index] = value for one element of a device tensor, as a kernel that takes a number as its argument
    (fill_), not a blocking copy of a host scalar; a tensor value (on the device) is copied."""
    if isinstance(value, torch.Tensor):
        t[index].copy_(value)
    else:
        t[index].fill_(value)
