"""`redline bench`: time the training step of any preset or config on this machine.

    redline bench                                              # the tiny preset (works on a CPU)
    redline bench --preset gpt2-124m batch_size=32             # the fast path: compile, fused AdamW, measured SDPA backend
    redline bench --preset gpt2-1.5b batch_size=8 fp8=auto activation_checkpointing=selective
    redline bench --preset modern-124m --matrix batch_size=16,32 seq_len=1024,2048 fp8=off,auto
    redline bench --preset gpt2-124m batch_size=32 --matrix model.ce_chunk_tokens=0,8192   # the loss in chunks
    redline bench --preset gpt2-124m batch_size=32 --profile   # + a profiler trace and the top kernels
    redline bench --preset gpt2-124m --data.path data/fineweb  # real tokens from a prepared shard folder
    redline bench --preset modern-124m batch_size=16 seq_len=2048 --gpus 1,2,4   # multi-GPU scaling (torchrun)

Every TrainConfig option applies (the same as `redline train`). Without data.path the batches are random
tokens (no data needed, same speed); with it they come from the prepared shards through the training loader.
Start-up (model build, attention-backend and FP8 measurements), the first step (compile) and the warm-up are
timed separately and excluded; the timed steps give median, min and max step time (CUDA events on a GPU,
perf_counter on a CPU), tokens/s, MFU against the datasheet bf16 peak and against the measured GEMM peak from
`redline doctor` (when there is one), and peak memory. MFU counts 6N + 12·L·d·T FLOPs per token (N without the
position table), also for FP8 runs, against the bf16 peak. A matrix (`--matrix KEY=V1,V2 ...`) runs each
combination in its own process: a point that runs out of memory is reported as `oom` and the rest go on.
`--gpus 1,2,4` measures multi-GPU scaling on this node: each world size runs under torchrun in its own process
tree with the same per-GPU batch (redline/bench/scaling.py); `torchrun ... -m redline bench` times one world size.
Prints a table, then one JSON line last.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch

from redline.config import TrainConfig, parse
from redline.errors import UserError

DESCRIPTION = ("Time the training step of a preset or config: tokens/s, MFU, peak memory; a matrix of settings; "
               "a profiler trace. Takes every `redline train` option.")
SCHEMA = "redline.bench"
SCHEMA_VERSION = 2
BARE_FLAGS = {"--profile": "True"}  # `--profile` alone means --profile True
CHILD_ENV = "REDLINE_BENCH_POINT"  # set in the environment of each matrix point's process


@dataclass
class BenchConfig(TrainConfig):
    warmup: int | None = None
    """Untimed steps before timing (compile and autotuning happen here; timed and reported separately). None: 10 on
    a GPU, 1 on a CPU."""
    steps: int | None = None
    """Timed steps (median, min and max are reported). None: 20 on a GPU, 3 on a CPU."""
    matrix: tuple[str, ...] = ()
    """Run every combination of settings, each point in its own process: items KEY=V1,V2,... such as
    batch_size=16,32 seq_len=1024,2048 fp8=off,auto compile=True,False activation_checkpointing=none,selective
    model.ce_chunk_tokens=0,8192 (the head and loss in chunks of tokens) preset=gpt2-124m,modern-124m."""
    point_timeout: float = 1200.0
    """Seconds a matrix point may run before its process is stopped and the point reported as timed out."""
    profile: bool = False
    """After the timed steps, profile `profile_steps` more: write a Chrome/Perfetto trace and print the top kernels
    grouped as GEMM, attention, norm, optimizer and other."""
    profile_steps: int = 5
    """Steps recorded by --profile, and by --gpus for the communication share (one more is run first)."""
    trace: str | None = None
    """Where --profile writes the trace (.json, or .json.gz for gzipped). None: <out_dir>/bench/trace-<preset>-<time>.json."""
    gpus: str | None = None
    """Multi-GPU scaling on this node: world sizes such as 1,2,4, each run under torchrun in its own processes
    (parallel=ddp unless parallel=fsdp2 is given). batch_size and tokens_per_step are per GPU here, so every GPU
    does the same work at every world size. Reports tokens/s (all GPUs and per GPU), scaling efficiency against
    the smallest world size, MFU per GPU, the communication share of the step (and its exposed part, not
    overlapped by compute) over profile_steps profiled steps, and peak memory. On a CPU the ranks are processes
    (gloo)."""
    plot: str | None = None
    """With --gpus: where to write the scaling plot (PNG: tokens/s and efficiency against GPUs). None:
    <out_dir>/bench/scaling-<preset>-<time>.png; off: no plot."""
    json_out: str | None = None
    """Also append the JSON line to this file."""
    label: str | None = None
    """A name for this run, copied into its JSON (for scripts that collect many)."""

    def validate(self) -> None:
        if self.json_out:
            from redline.durable import check_output_file

            check_output_file(self.json_out, "--json-out")
        gpus, self.gpus = self.gpus, 1  # TrainConfig checks its launch count; bench's list of world sizes is below
        try:
            super().validate()
        finally:
            self.gpus = gpus
        if gpus is not None:
            from redline.bench.scaling import parse_gpus

            parse_gpus(gpus)


# ----------------------------------------------------------------------------------------------------
# argument handling


def take_matrix(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split `--matrix ITEM ...` off argv (its KEY=V1,V2 items must not become --KEY options)."""
    items, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--matrix":
            i += 1
            while i < len(argv) and not argv[i].startswith("-"):
                items.append(argv[i])
                i += 1
            continue
        if arg.startswith("--matrix="):
            items.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    return items, rest


def defaults_for_device(cfg: BenchConfig) -> tuple[int, int]:
    on_gpu = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    warmup = cfg.warmup if cfg.warmup is not None else (10 if on_gpu else 1)
    steps = cfg.steps if cfg.steps is not None else (20 if on_gpu else 3)
    if warmup < 1 or steps < 1:
        raise UserError(f"warmup and steps must be at least 1, got warmup={warmup} steps={steps}")
    return warmup, steps


def environment() -> dict:
    from redline import __version__
    from redline.converters.float8 import torchao_version

    env = {"redline": __version__, "torch": torch.__version__, "torchao": torchao_version(),
           "python": platform.python_version(), "cuda": torch.version.cuda, "gpu": None}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        env["capability"] = f"{major}.{minor}"
    return env


# ----------------------------------------------------------------------------------------------------
# output


def _fmt(value, spec: str = ".1f", scale: float = 1.0, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:{spec}}{suffix}"


def console():
    """A rich console; when the output is not a terminal (a log file, a pipe), wide enough for the tables."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=200)


def print_table(points: list[dict], title: str) -> None:
    from rich.table import Table

    table = Table(title=title)
    for col in ("point", "B×T", "prec", "fp8", "AC", "CE chunk", "compile", "attn", "step ms (min–max)", "tokens/s",
                "MFU", "MFU meas.", "peak GiB", "first step s", "status"):
        table.add_column(col, justify="right" if col not in ("point", "status") else "left")
    for p in points:
        fp8 = p.get("fp8_mode", p.get("fp8", "off"))
        if fp8 != "off" and p.get("fp8_layers") is not None:
            fp8 = f"{fp8} ({len(p['fp8_layers'])} layers)"
        if (check := p.get("fp8_auto_check")) and not check["kept"]:
            fp8 = f"auto: off, step {check['speedup']:.2f}× in FP8"
        if p.get("fp8_head"):
            fp8 = "head" if fp8 == "off" else f"{fp8} + head"
        label = p.get("preset", "?")
        if p.get("overrides"):
            label = " ".join(f"{k}={v}" for k, v in p["overrides"].items())
        step = "-"
        if p.get("step_ms_median") is not None:
            step = f"{p['step_ms_median']:.1f} ({p['step_ms_min']:.1f}–{p['step_ms_max']:.1f})"
        status = p.get("status", "?")
        if status != "ok" and p.get("error"):
            status = f"{status}: {p['error'][:60]}"
        table.add_row(
            label, f"{p.get('batch_size', '?')}×{p.get('seq_len', '?')}", str(p.get("precision", "?")), str(fp8),
            str(p.get("activation_checkpointing", "-")), str(p.get("ce_chunk_tokens") or "off"),
            f"{p.get('compile_scope') or 'off'}" if p.get("compile") else "off", str(p.get("attn_backend", "-")),
            step, _fmt(p.get("tokens_per_second"), ",.0f"), _fmt(p.get("mfu"), ".1f", 100, "%"),
            _fmt(p.get("mfu_measured_peak"), ".1f", 100, "%"), _fmt(p.get("peak_memory_gib"), ".1f"),
            _fmt(p.get("first_step_seconds"), ".1f"), status,
        )
    console().print(table)


def print_profile(summary: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    out = console()
    groups = Table(title=f"profile: {summary['timing']} per step, {summary['steps']} steps")
    groups.add_column("group")
    groups.add_column("ms/step", justify="right")
    groups.add_column("share", justify="right")
    for name, ms in sorted(summary["groups_ms_per_step"].items(), key=lambda kv: -kv[1]):
        groups.add_row(name, f"{ms:.2f}", f"{summary['groups_fraction'][name] * 100:.1f}%")
    groups.add_row("total", f"{summary['total_ms_per_step']:.2f}", "100%")
    out.print(groups)
    top = Table(title="top kernels" if summary["timing"].startswith("gpu") else "top operators")
    for col in ("name", "group", "ms/step", "calls/step"):
        top.add_column(col, justify="right" if col in ("ms/step", "calls/step") else "left")
    for row in summary["top"]:
        top.add_row(escape(row["name"][:90]), row["group"], f"{row['ms_per_step']:.3f}", f"{row['calls_per_step']:.0f}")
    out.print(top)
    if summary.get("trace"):
        out.print(f"trace written to {summary['trace']} (open it at https://ui.perfetto.dev)")


def emit(report: dict, json_out: str | None) -> None:
    line = json.dumps(report, default=str)
    print(line, flush=True)
    if json_out:
        path = Path(json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        from redline.durable import append_line

        append_line(path, line)  # one whole record or none: a full disk is one line, earlier records intact


# ----------------------------------------------------------------------------------------------------
# main


def trace_path(cfg: BenchConfig, world_size: int = 1) -> str | None:
    if not cfg.profile:
        return None
    if cfg.profile_steps < 1:
        raise UserError(f"profile_steps must be at least 1, got {cfg.profile_steps}")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    ranks = f"-{world_size}ranks" if world_size > 1 else ""  # rank 0's trace
    return cfg.trace or str(Path(cfg.out_dir) / "bench" / f"trace-{cfg.preset}{ranks}-{stamp}.json")


def run_single(cfg: BenchConfig) -> dict:
    from redline.bench.step import describe, measure
    from redline.hardware import resolve_device

    warmup, steps = defaults_for_device(cfg)
    trace = trace_path(cfg)
    try:
        point = measure(cfg, warmup, steps,
                        profile_steps=cfg.profile_steps if cfg.profile else 0, trace_path=trace)
        point["ce_chunk_tokens"] = cfg.model.ce_chunk_tokens
        return point
    except torch.OutOfMemoryError as e:
        device = resolve_device(cfg.device)
        point = {"device": device.type, **describe(cfg, device), "ce_chunk_tokens": cfg.model.ce_chunk_tokens,
                 "status": "oom", "error": f"out of memory: {str(e).splitlines()[0][:300]}"}
        print(f"redline bench: {cfg.preset} batch_size={cfg.batch_size} seq_len={cfg.effective_seq_len} ran out of "
              f"GPU memory; try a smaller batch_size or activation_checkpointing=selective|full", file=sys.stderr)
        return point


def main(argv: list[str]) -> int:
    from redline.training.wrap import set_cuda_allocator_defaults

    set_cuda_allocator_defaults()  # before anything starts CUDA
    matrix_items, rest = take_matrix(list(argv))
    cfg = parse(BenchConfig, rest, prog="redline bench", description=DESCRIPTION, bare_flags=BARE_FLAGS)
    if cfg.init_from:  # the checkpoint's architecture (its weights do not change speed or memory)
        from redline.training.init_from import InitPoint

        cfg = InitPoint.read(cfg.init_from).configure(cfg)
    cfg.matrix = tuple(matrix_items) + tuple(cfg.matrix)
    under_torchrun = "WORLD_SIZE" in os.environ
    if os.environ.get(CHILD_ENV):  # a point (its recipe file may name the matrix or gpus too): one point only
        cfg.matrix, cfg.gpus = (), None
    elif under_torchrun and (cfg.matrix or cfg.gpus):
        raise UserError("--matrix and --gpus start processes of their own: run them without torchrun")
    if cfg.matrix and cfg.gpus:
        raise UserError("--gpus and --matrix cannot be combined: run `redline bench --gpus ...` once per setting")
    report = {"schema": SCHEMA, "version": SCHEMA_VERSION, "command": "bench", "label": cfg.label, **environment()}

    if under_torchrun:
        return main_rank(cfg, report)
    if cfg.gpus:
        return main_scaling(cfg, rest, report)
    if not cfg.matrix:
        point = run_single(cfg)
        report["points"] = [point]
        print_table([point], f"redline bench {cfg.preset} on {point.get('gpu') or point['device']}")
        if point.get("profile"):
            print_profile(point["profile"])
        emit(report, cfg.json_out)
        return 0 if point["status"] == "ok" else 1

    from redline.bench.matrix import child_argv, expand, parse_matrix, point_label, remove_option, run_matrix

    axes = parse_matrix(cfg.matrix)
    points = expand(axes)
    base = remove_option(rest, "json_out")
    base = remove_option(base, "json-out")
    for point in points:  # catch a bad key or value now, not in the fourth child process
        parse(BenchConfig, child_argv(base, point), prog="redline bench", description=DESCRIPTION, bare_flags=BARE_FLAGS)
    print(f"redline bench: {len(points)} points, each in its own process", flush=True)

    def progress(i, point, result):
        speed = f", {result['tokens_per_second']:,.0f} tokens/s" if result.get("tokens_per_second") else ""
        mfu = f", MFU {result['mfu'] * 100:.1f}%" if result.get("mfu") else ""
        print(f"  [{i + 1}/{len(points)}] {point_label(point)}: {result['status']}{speed}{mfu} "
              f"({result.get('wall_seconds', 0):.0f} s)", flush=True)

    results = run_matrix(base, points, cfg.point_timeout, progress)
    report["matrix"] = list(cfg.matrix)
    report["points"] = results
    print_table(results, f"redline bench matrix ({len(results)} points) on {report.get('gpu') or 'cpu'}")
    for r in results:
        if r.get("profile"):
            print_profile(r["profile"])
    emit(report, cfg.json_out)
    return 0 if any(r.get("status") == "ok" for r in results) else 1


def main_rank(cfg: BenchConfig, report: dict) -> int:
    """One world size under torchrun: every rank measures; rank 0 prints the table and the JSON line."""
    from redline.bench.scaling import print_table as print_scaling_table
    from redline.bench.scaling import run_rank
    from redline.distributed import dist_info

    warmup, steps = defaults_for_device(cfg)
    point = run_rank(cfg, warmup, steps, trace_path(cfg, dist_info().world_size))
    point["ce_chunk_tokens"] = cfg.model.ce_chunk_tokens
    if not dist_info().is_main:
        return 0 if point["status"] == "ok" else 1
    point["gpus"] = point["world_size"]
    report["points"] = [point]
    print_scaling_table([point], f"redline bench {cfg.preset} on {point['world_size']} × {point.get('gpu') or 'cpu'}",
                        console())
    if point.get("profile"):
        print_profile(point["profile"])
    emit(report, cfg.json_out)
    return 0 if point["status"] == "ok" else 1


def main_scaling(cfg: BenchConfig, argv: list[str], report: dict) -> int:
    """`--gpus 1,2,4`: each world size under torchrun in its own process tree (redline/bench/scaling.py)."""
    from redline.bench.scaling import run_command

    defaults_for_device(cfg)  # bad steps or warmup: one error here, not one per world size
    if cfg.profile_steps < 1:
        raise UserError(f"profile_steps must be at least 1, got {cfg.profile_steps}")
    code = run_command(cfg, argv, report, console())
    emit(report, cfg.json_out)
    return code
