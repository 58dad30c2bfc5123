"""Programmatic dependent launch (PDL) for the decode step's kernels.

A decode step at batch 64 is about 60 kernels of a few µs each (kernels/linear.py, kernels/decode_attention.py),
back to back in one CUDA graph. Launched plainly, each waits for the one before it to finish before its programs
are even placed on the SMs, so the GPU idles between kernels. On Hopper (compute capability 9.0) and newer, a
kernel launched with the programmatic-stream-serialization attribute may start while the one before it still
runs:

- every program of the earlier kernel calls `gdc_launch_dependents` (griddepcontrol.launch_dependents) as it
  starts: once all of them have, the next kernel's programs are placed wherever an SM has room;
- each program of the next kernel does what depends on no earlier kernel (its addresses; the split attention
  kernel also loads its cache span, which no kernel of the step has written before it), then calls `gdc_wait`
  (griddepcontrol.wait), which returns once the earlier kernel has finished and its writes are visible. Every
  program waits before its first read of an earlier kernel's output and before any write, so the writes land in
  the plain order.

CUDA graphs keep the dependency when they capture such launches. A kernel launched without the attribute is
ordered as usual, and a wait in a kernel launched plainly returns at once; the engine has Inductor launch the
kernels it generates between ours (norms, embedding, argmax) the same way. (What it is worth: BENCHMARKS.md.)
Prefetching each product's weight tile into L2 before the wait was measured slower, and is not done.

References: the CUDA programming guide's "Programmatic Dependent Launch and Synchronization", the PTX ISA's
griddepcontrol.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def use_pdl(device: torch.device) -> bool:
    """Launch with programmatic dependent launch on this device (a GPU of compute capability 9.0+)."""
    return device.type == "cuda" and _capability(device.index or 0) >= (9, 0)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def _shared_memory(index: int) -> int:
    return torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def shared_memory(device: torch.device) -> int:
    """Bytes of shared memory one program may use on this GPU (227 KiB on Hopper, 163 KiB on the A100)."""
    return _shared_memory(device.index if device.index is not None else torch.cuda.current_device())


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of this GPU: how many programs one wave of a kernel runs at once (one each)."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@triton.jit
def start_dependents_then_wait(PDL: tl.constexpr):
    """Let the next kernel's programs start, then wait until the kernel before has finished and its writes are
    visible (PDL 0: nothing; the kernel was launched plainly)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
