"""torch.compile for the engine: each engine compiles its own copies of the step functions.

torch.compile keeps compiled code per code object and remembers per function (file, line, name) which shapes
changed between compilations ("automatic dynamic"): a second engine in the process, for another model, would share
the first one's recompile limit and recompile with its weights, head counts and cache made dynamic (slower
kernels; and Inductor fails scheduling the Triton ops with them). So each engine compiles a copy of each function
with a code object of its own, and calls it with automatic dynamic shapes off; the batch, length and width dims
stay dynamic, as the engine marks them so at each call (`mark_dynamic`).
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch


RECOMPILE_LIMIT = 64
"""Variants one engine's function may be compiled in. Dynamo's default (8) is too few for the prefill: with or
without a mask, without a cached prefix or with one read as a slice or gathered by row, one row or several, one
token or more (size-1 dims specialise), and with fullgraph=True one more variant is a hard failure, not a fallback."""


def isolated_compile(fn: Callable, **options) -> Callable:
    """torch.compile(fn) for one engine alone, its shapes static except the dims marked dynamic."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    compiled = torch.compile(copy, fullgraph=True, **options)
    dynamo = torch._dynamo.config
    limit = {"recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit": RECOMPILE_LIMIT}

    def call(*args, **kwargs):
        with dynamo.patch(automatic_dynamic_shapes=False, **limit):
            return compiled(*args, **kwargs)

    return call


def mark_dynamic(*specs) -> None:
    """Batch, length and width dims are dynamic for torch.compile: one compilation for all sizes (instead of
    dynamic=True, which would make head counts symbolic too; dynamo still specialises size-1 dims, so batch 1
    compiles apart). specs: (tensor, dim, ...); a None tensor (a layer that holds no cache) is passed over."""
    from torch._dynamo import maybe_mark_dynamic

    for tensor, *dims in specs:
        for d in dims if tensor is not None else ():
            maybe_mark_dynamic(tensor, d)


def decode_options(device: torch.device, kernel_tuning: bool, grouped_gemm: bool = False) -> dict:
    """Inductor options for the decode step's functions: coordinate-descent tuning when asked (Inductor then also
    computes one-row matrix products as tuned Triton reductions instead of cuBLAS calls), and programmatic
    dependent launch for the kernels it generates, as redline's own kernels use it (kernels/launch.py), where the
    GPU and this torch's Inductor have it, and the step holds no grouped GEMM (grouped_gemm: a mixture of experts'
    torch grouped_mm). With Inductor's kernels launched so around grouped_mm, a graph-captured decode step reads
    stale values: tokens up to a logit below the best one in bf16, found on an H200 with torch 2.11 for Jamba's,
    Cohere2 MoE's and Llama 4's experts, gone with the attribute off (docs/results/h200-2026-11-29g/)."""
    import torch._inductor.config as inductor_config

    options = {"coordinate_descent_tuning": kernel_tuning}
    if device.type == "cuda" and hasattr(inductor_config.triton, "enable_pdl") and not grouped_gemm:
        try:
            from redline.inference.kernels.launch import use_pdl
        except ImportError:  # (no triton: nothing is compiled for a GPU)
            return options
        if use_pdl(device):
            options["triton.enable_pdl"] = True
    return options
