"""The one place optional features wrap the model, in a fixed order:

    (attention backend) → converters (fp8, ...) → activation checkpointing → torch.compile → data parallel
    (DDP / FSDP2, redline/training/parallel.py)

Each step is driven by TrainConfig and is a no-op when off. The attention backend is a resolve step rather than
a wrapper: on CUDA, with model.attn_backend=auto and attn_autotune on, the SDPA backends are timed for the run's
shapes and the fastest is used (redline/training/attention_backend.py). The converters are built by the caller
(redline/training/step.py) from the same config, and convert here.

Every step changes the model in place where it can (FP8 layers and checkpointed blocks keep their parameter
names, per-block compile keeps the module tree), so the caller's `model` stays the one to evaluate and save.
`wrap_model` returns the module to call for training and what was decided (for logs and `redline bench`).

Compile scope: "model" compiles the whole model into one graph (best fusion; compile time grows with depth);
"blocks" compiles one transformer block, reused by every block, plus the lm_head (compile time independent of
depth; the final norm and the loss run eagerly). "auto" takes the whole model up to 16 layers.

CUDA graphs (cfg.cuda_graphs, on by default for LoRA and QLoRA on one GPU): the compiled graphs are replayed with
one launch each (torch.compile's reduce-overhead mode), for steps whose many small kernels the host would otherwise
launch more slowly than the GPU runs them. See cuda_graphs_enabled and _compile_in_place for what they change.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from redline.config import CUDA_GRAPHS_NEED, TrainConfig
from redline.converters import Converters
from redline.distributed import DistInfo
from redline.errors import UserError
from redline.hardware import autocast_dtype
from redline.model import GPT
from redline.training.parallel import apply_data_parallel

WHOLE_MODEL_MAX_LAYERS = 16


def compile_enabled(cfg: TrainConfig, device: torch.device) -> bool:
    """torch.compile on or off: the config's choice, else on for CUDA and off elsewhere."""
    return cfg.compile if cfg.compile is not None else device.type == "cuda"


def cuda_graphs_enabled(cfg: TrainConfig, device: torch.device, distributed: bool = False,
                        shapes_vary: bool = False) -> bool:
    """Whether the compiled graphs replay as CUDA graphs: cfg.cuda_graphs, else on for a LoRA/QLoRA run on one
    CUDA GPU with compile on (their steps are bound by the host's kernel launches) whose batches keep one shape
    (shapes_vary: the objective's batches change shape from step to step, and each shape would record its own
    graphs). On where it cannot work is a one-line error."""
    usable = device.type == "cuda" and compile_enabled(cfg, device) and not distributed
    if cfg.cuda_graphs is None:
        return usable and cfg.lora.enabled and not shapes_vary
    if cfg.cuda_graphs and not usable:
        raise UserError(CUDA_GRAPHS_NEED)
    return cfg.cuda_graphs


def compile_scope(cfg: TrainConfig, distributed: bool = False) -> str:
    if cfg.parallel == "fsdp2" and distributed:
        return "blocks"  # FSDP2's per-block hooks stay outside the compiled graphs (as torchtitan does)
    if cfg.compile_scope != "auto":
        return cfg.compile_scope
    return "model" if cfg.model.n_layer <= WHOLE_MODEL_MAX_LAYERS else "blocks"


def _raise_recompile_limit(limit: int = 64) -> None:
    """Per-block compile shares one code object across blocks, the head and their train/eval/FP8 variants:
    give it room so no variant silently falls back to eager."""
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name) and getattr(dynamo_config, name) < limit:
            setattr(dynamo_config, name, limit)


@dataclass
class Wrapped:
    """What `wrap_model` returns: the module the training step calls, and what was decided."""

    module: nn.Module
    """The model compiled and/or wrapped for data parallelism (the caller's model itself when neither applies)."""
    decisions: dict = field(default_factory=dict)
    """attention (backend and its source), converters (each one's describe()), activation_checkpointing,
    compile, setup_seconds."""


def wrap_model(model: GPT, cfg: TrainConfig, device: torch.device, info: DistInfo, converters: Converters,
               say: Callable[[str], None] | None = None, shapes_vary: bool = False) -> Wrapped:
    """The one place optional features wrap the model, in a fixed order:
    converters → activation checkpointing → compile → data parallel. cfg.batch_size must be resolved. shapes_vary:
    the objective's batches change shape from step to step (no CUDA graphs unless cfg.cuda_graphs says so)."""
    from redline.training.activation_checkpointing import apply_activation_checkpointing
    from redline.training.attention_backend import resolve_attention_backend

    say = say or (lambda message: None)
    decisions: dict = {}
    t0 = time.perf_counter()
    seq_len = cfg.effective_seq_len
    amp = autocast_dtype(device, cfg.precision)
    attention = resolve_attention_backend(model, cfg.batch_size, seq_len, device, amp, enabled=cfg.attn_autotune)
    if attention["source"] in ("measured", "cache"):
        timings = ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} n/a" for k, v in attention["ms"].items())
        say(f"attention backend {attention['backend']} ({attention['source']}; fwd+bwd ms: {timings})")
    elif attention["source"] == "failed":
        say(f"attention backend: measuring failed ({attention['error']}); PyTorch chooses")
    decisions["attention"] = attention
    # 1. converters (under FSDP2 the tensorwise FP8 weights are all-gathered in FP8: see converters/float8.py)
    converters.convert(model)
    decisions["converters"] = converters.describe()
    # 2. activation checkpointing
    checkpointed = apply_activation_checkpointing(model, cfg.activation_checkpointing)
    decisions["activation_checkpointing"] = {"mode": cfg.activation_checkpointing, "blocks": checkpointed}
    if checkpointed:
        say(f"activation checkpointing ({cfg.activation_checkpointing}): {len(checkpointed)} of {len(model.blocks)} blocks")
    # 3. compile
    use_compile = compile_enabled(cfg, device)
    graphs = cuda_graphs_enabled(cfg, device, info.enabled, shapes_vary)
    plain = None if cfg.compile_mode == "default" else cfg.compile_mode
    # torch.compile's modes: reduce-overhead is default + CUDA graphs, max-autotune the tuned GEMMs + CUDA graphs
    with_graphs = {"default": "reduce-overhead", "max-autotune-no-cudagraphs": "max-autotune"}
    mode = with_graphs[cfg.compile_mode] if graphs else plain
    scope = compile_scope(cfg, info.enabled) if use_compile else None
    decisions["compile"] = {"enabled": use_compile, "scope": scope, "mode": cfg.compile_mode, "cuda_graphs": graphs}
    decisions["setup_seconds"] = time.perf_counter() - t0
    if scope:
        say(f"torch.compile ({'whole model' if scope == 'model' else 'per block + lm_head'}, mode {cfg.compile_mode}"
            f"{', CUDA graphs' if graphs else ''}): the first step compiles")
    module: nn.Module = model
    # a batch-size or sequence-length warm-up's few shapes: each its own static graph, so the full batch's kernels
    # are not traded for dynamic-shape ones after the second shape
    ramped = bool(cfg.batch_ramp_steps or cfg.seq_ramp_steps)
    dynamic = False if ramped else None
    if scope == "blocks" or (scope and ramped):
        _raise_recompile_limit()
    if scope == "blocks":
        for part in (*model.blocks, model.lm_head):
            _compile_in_place(part, mode, dynamic, no_grad_mode=plain)
    elif scope == "model":
        module = torch.compile(model, mode=mode, dynamic=dynamic)
    # 4. data parallel
    module = apply_data_parallel(module, model, cfg.parallel, device, info, param_dtype=amp,
                                 bucket_mb=cfg.ddp_bucket_mb)
    return Wrapped(module, decisions)


def _compile_in_place(module: nn.Module, mode: str | None, dynamic: bool | None, no_grad_mode: str | None) -> None:
    """module.compile(mode), the calls without autograd (evaluation, DPO's reference pass) compiled in
    no_grad_mode where it differs. Blocks compiled one by one hand each graph's output to the next; under CUDA
    graphs a call with no backward pending starts a new replay generation and frees the output it is handed
    (pytorch/pytorch#152887), so only the training calls, whose backward is pending, replay graphs."""
    if no_grad_mode == mode:
        module.compile(mode=mode, dynamic=dynamic)
        return
    training = torch.compile(module._call_impl, mode=mode, dynamic=dynamic)
    no_grad = torch.compile(module._call_impl, mode=no_grad_mode, dynamic=dynamic)
    # what nn.Module.compile sets: __call__ runs it instead of _call_impl
    module._compiled_call_impl = lambda *args, **kwargs: (training if torch.is_grad_enabled() else no_grad)(
        *args, **kwargs)


def set_cuda_allocator_defaults() -> None:
    """expandable_segments in the CUDA caching allocator (less fragmentation, so larger batches fit).

    Call at the very start of a command, before anything touches CUDA; a value the user set is kept."""
    if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ and "PYTORCH_ALLOC_CONF" not in os.environ:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
