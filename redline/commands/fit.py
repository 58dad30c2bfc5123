"""`redline fit`: the largest micro-batch that fits in GPU memory, found by running real training steps.

    redline fit --preset modern-124m seq_len=2048
    redline fit --preset gpt2-1.5b seq_len=1024 --checkpointing none full
    redline fit --preset modern-350m memory_fraction=0.8 tokens_per_step=1048576

Every train option applies (the model, optimizer, precision and wrapping are the ones `redline train` would
build). Prints each tried micro-batch with its peak memory and tokens/s, the answer with the
gradient-accumulation steps for tokens_per_step, then one JSON line (which `redline plan --bench-json` reads).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
import time
import typing
from dataclasses import dataclass

import torch

from redline.config import TrainConfig, apply_overrides, parse
from redline.errors import UserError
from redline.training.fit import (DEFAULT_MAX_BATCH, DEFAULT_MEMORY_FRACTION, FitPoint, batch_grid, find_max_batch,
                                  gradient_accumulation, validate_memory_fraction)

DESCRIPTION = ("Find the largest micro-batch that fits in GPU memory by running real forward, backward and "
               "optimizer steps. Every train option applies.")


@dataclass
class FitConfig(TrainConfig):
    memory_fraction: float = DEFAULT_MEMORY_FRACTION
    """Largest fraction of the GPU's memory a micro-batch may use, in (0, 1]."""
    max_batch: int = DEFAULT_MAX_BATCH
    """Top of the default search grid (1, 2, 3, 4, 6, 8, 12, ... up to this)."""
    grid: tuple[int, ...] = ()
    """Micro-batch sizes to search instead of the default grid, e.g. --grid 8 16 24 32 40 48."""
    probe_steps: int = 3
    """Training steps run at each tried micro-batch (the first is a warm-up; tokens/s comes from the others)."""
    checkpointing: tuple[str, ...] = ()
    """Activation-checkpointing levels to search, one search each (e.g. --checkpointing none full).
    Empty: only the config's own activation_checkpointing."""
    compile: bool | None = False
    """torch.compile the model while probing (off by default: each new micro-batch would recompile; compiled
    models usually need less memory, so the answer without compile is the safe one)."""
    tokens_per_step: int = 524288
    """Global batch in tokens per optimizer step, for which micro-batch and accumulation steps are printed (0: none)."""

    def validate(self) -> None:
        super().validate()
        validate_memory_fraction(self.memory_fraction)
        if self.max_batch < 1:
            raise UserError(f"max_batch must be at least 1, got {self.max_batch}")
        if any(b < 1 for b in self.grid):
            raise UserError(f"every --grid entry must be a positive micro-batch size, got {list(self.grid)}")
        if self.probe_steps < 1:
            raise UserError(f"probe_steps must be at least 1, got {self.probe_steps}")
        choices = typing.get_args(typing.get_type_hints(TrainConfig)["activation_checkpointing"])
        for level in self.checkpointing:
            if level not in choices:
                raise UserError(f"--checkpointing {level}: choose among {', '.join(choices)}")


def _train_config(cfg: FitConfig, level: str | None) -> TrainConfig:
    """The plain TrainConfig that a `redline train` with these options would use, at one checkpointing level."""
    values = {f.name: copy.deepcopy(getattr(cfg, f.name)) for f in dataclasses.fields(TrainConfig)}
    train_cfg = TrainConfig(**values)
    if level is not None:
        apply_overrides(train_cfg, {"activation_checkpointing": level})
    return train_cfg


def _gib(n: int | None) -> float | None:
    return None if n is None else round(n / 2**30, 2)


def main(argv: list[str]) -> int:
    from rich.console import Console

    from redline.training.wrap import set_cuda_allocator_defaults

    set_cuda_allocator_defaults()  # the allocator settings `redline train` uses, before anything touches CUDA
    cfg = parse(FitConfig, argv, prog="redline fit", description=DESCRIPTION)
    if cfg.init_from:  # the checkpoint's architecture (its weights do not change speed or memory)
        from redline.training.init_from import InitPoint

        cfg = InitPoint.read(cfg.init_from).configure(cfg)
    if not torch.cuda.is_available():
        raise UserError("redline fit measures GPU memory and needs a CUDA GPU, and none is visible; on a CPU pick "
                        "batch_size by hand (run `redline doctor` to see why no GPU is usable)")
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    device = torch.device("cuda", torch.cuda.current_device())
    gpu = torch.cuda.get_device_name(device)
    total = torch.cuda.get_device_properties(device).total_memory
    seq_len = cfg.effective_seq_len
    grid = list(cfg.grid) or batch_grid(cfg.max_batch)
    console.print(f"[bold]redline fit[/bold] {cfg.preset} at seq_len {seq_len} on {gpu} ({total / 2**30:.1f} GiB): "
                  f"limit {cfg.memory_fraction:.0%} = {cfg.memory_fraction * total / 2**30:.1f} GiB | "
                  f"{cfg.precision} precision, {cfg.optim.name}, compile {'on' if cfg.compile else 'off'} | "
                  f"grid {grid[0]}..{grid[-1]} ({len(grid)} points) | {cfg.probe_steps} steps per point, random tokens")
    summaries = [search_level(cfg, level, device, grid, console) for level in list(cfg.checkpointing) or [None]]
    print_summaries(cfg, summaries, gpu, console)
    fitting = [s for s in summaries if s["batch_size"] is not None]
    if not fitting:
        console.print(f"[red]no micro-batch of the grid fits within {cfg.memory_fraction:.0%}: lower seq_len, try "
                      f"--checkpointing full, or use a smaller preset")
    best = max(fitting, key=lambda s: s["tokens_per_second"] or 0, default=None)
    from redline.model import GPT

    with torch.device("meta"):
        params = GPT(copy.deepcopy(cfg.model)).num_params()
    record = {
        "command": "fit", "preset": cfg.preset, "params": params, "seq_len": seq_len, "gpu": gpu,
        "memory_gib": round(total / 2**30, 2), "memory_fraction": cfg.memory_fraction, "compile": bool(cfg.compile),
        "precision": cfg.precision, "optimizer": cfg.optim.name, "tokens_per_step": cfg.tokens_per_step,
        "grid": grid, "levels": summaries,
        # the recommended point (fastest level at its largest micro-batch): what `redline plan` reads
        "activation_checkpointing": best["activation_checkpointing"] if best else None,
        "batch_size": best["batch_size"] if best else None,
        "tokens_per_second": best["tokens_per_second"] if best else None,
        "peak_memory_gib": best["peak_memory_gib"] if best else None,
    }
    sys.stdout.flush()
    print(json.dumps(record), flush=True)
    return 0 if fitting else 1


def search_level(cfg: FitConfig, level: str | None, device: torch.device, grid: list[int], console) -> dict:
    """The search at one activation-checkpointing level (None: the config's own), each probe printed."""
    train_cfg = _train_config(cfg, level)
    label = level or train_cfg.activation_checkpointing

    def show(point: FitPoint) -> None:
        text = {"fits": "[green]fits", "over_limit": "[yellow]over the limit", "oom": "[red]out of memory"}[point.status]
        extra = ""
        if point.peak_bytes is not None:
            extra += f", peak {point.peak_bytes / 2**30:.1f} GiB"
        if point.tokens_per_second:
            extra += f", {point.tokens_per_second:,.0f} tokens/s"
        console.print(f"  checkpointing {label}: micro-batch {point.batch_size:>5}: {text}[/]{extra} ({point.seconds:.1f} s)")

    started = time.perf_counter()
    result = find_max_batch(train_cfg, device, memory_fraction=cfg.memory_fraction, grid=grid,
                            steps=cfg.probe_steps, on_point=show)
    best = result.best_point
    micro = accum = None
    if result.batch_size is not None:
        micro, accum = gradient_accumulation(result.batch_size, cfg.effective_seq_len, cfg.tokens_per_step)
    return {
        "activation_checkpointing": label,
        "batch_size": result.batch_size,
        "at_grid_top": result.at_grid_top,
        "peak_memory_gib": _gib(best.peak_bytes) if best else None,
        "tokens_per_second": round(best.tokens_per_second, 1) if best and best.tokens_per_second else None,
        "train_batch_size": micro,
        "grad_accum": accum,
        "seconds": round(time.perf_counter() - started, 1),
        "points": [{**dataclasses.asdict(p), "peak_memory_gib": _gib(p.peak_bytes)} for p in result.points],
    }


def print_summaries(cfg: FitConfig, summaries: list[dict], gpu: str, console) -> None:
    from rich.table import Table

    table = Table("checkpointing", "micro-batch", "peak GiB", "tokens/s", f"for {cfg.tokens_per_step:,} tokens/step",
                  "search s", title=f"largest micro-batch within {cfg.memory_fraction:.0%} of {gpu} memory")
    for s in summaries:
        if s["batch_size"] is None:
            table.add_row(s["activation_checkpointing"], "[red]none fits", "-", "-", "-", f"{s['seconds']:.0f}")
            continue
        plan = (f"batch_size={s['train_batch_size']} × {s['grad_accum']} accumulation steps"
                if cfg.tokens_per_step else "-")
        top = " (grid top: raise max_batch)" if s["at_grid_top"] else ""
        table.add_row(s["activation_checkpointing"], f"{s['batch_size']}{top}", f"{s['peak_memory_gib']}",
                      f"{s['tokens_per_second']:,.0f}" if s["tokens_per_second"] else "-", plan, f"{s['seconds']:.0f}")
    console.print(table)
