"""Where metrics go: metrics.jsonl (one record per step, eval and event), TensorBoard event files, the console
(log lines, a live progress bar between them on a terminal, a closing summary).

Only rank 0 creates a MetricsLogger that writes; other ranks get one that does nothing. The record schema
(`kind` = "train" | "eval" | "event") is what `redline report` reads; it never writes back.

Step records are kept on the device (StepRecords) and written at log steps, at every checkpoint and before the
run ends, so metrics.jsonl is complete up to each checkpoint: a run killed after one and resumed from it loses
no record. A resumed run first drops the records its killed predecessor wrote after that checkpoint, and says
so in one event when records up to it are missing (`resume_metrics`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from redline.distributed import all_reduce_mean
from redline.durable import append_line, fsync_file


class MetricsLogger:
    def __init__(self, run_dir: Path | None, tensorboard: bool = True, enabled: bool = True):
        self.enabled = enabled and run_dir is not None
        self.console = Console(stderr=False, highlight=False, soft_wrap=True)  # log lines never wrap mid-number
        self.path = Path(run_dir) / "metrics.jsonl" if self.enabled else None
        self._lines: list[str] = []  # records not yet handed to the OS
        self._tb = None
        self.progress: ProgressBar | None = None
        if not self.enabled:
            return
        self.path.touch()
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
            except ImportError:
                self.console.print("[yellow]tensorboard is not installed: no event files (pip install tensorboard)")

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"time": time.time(), **record}
        self._lines.append(json.dumps(record) + "\n")
        if self._tb is not None and "step" in record:
            prefix = record.get("kind", "train")
            for key, value in record.items():
                if key not in ("step", "kind", "time") and isinstance(value, (int, float)) and value == value:
                    self._tb.add_scalar(f"{prefix}/{key}", value, record["step"])

    def flush(self, durable: bool = False) -> None:
        """Hand the buffered records to the OS (they survive a killed process); durable: to the disk too. The
        records go out whole or not at all: on a full disk metrics.jsonl keeps its earlier records, without a torn
        line, and the run stops with one DiskFullError line."""
        if self._lines:
            text, self._lines = "".join(self._lines), []
            append_line(self.path, text, sync=durable)
        elif durable and self.path is not None:
            fsync_file(self.path)
        if self._tb is not None:
            self._tb.flush()

    def print(self, *args, **kwargs) -> None:
        if self.enabled:
            self.console.print(*args, **kwargs)

    def start_progress(self, total_steps: int | None) -> None:
        """A live progress bar below the log lines, on a terminal only."""
        if self.enabled and self.console.is_terminal:
            self.progress = ProgressBar(self.console, total_steps)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None
        self.flush()
        if self._tb is not None:
            self._tb.close()
            self._tb = None


class ProgressBar:
    """The budget used so far as a bar, with the step and the ETA, redrawn in place under the log lines (rich
    prints each log line above it). Never made where the output is not a terminal: a log file or a pipe gets the
    log lines alone, without the bar's control characters."""

    def __init__(self, console: Console, total_steps: int | None):
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

        self.total_steps = total_steps
        self._progress = Progress(TextColumn("[bold]train"), BarColumn(), TaskProgressColumn(),
                                  TextColumn("{task.fields[status]}"), console=console, transient=True)
        self._task = self._progress.add_task("train", total=1.0, status="")
        self._progress.start()

    def update(self, fraction: float, step: int, eta: float | None) -> None:
        steps = f"step {step}/{self.total_steps}" if self.total_steps else f"step {step}"
        status = steps + (f" | eta {format_duration(eta)}" if eta is not None else "")
        self._progress.update(self._task, completed=min(fraction, 1.0), status=status)

    def close(self) -> None:
        self._progress.stop()


# ----------------------------------------------------------------------------------------------------
# step records


@dataclass
class Throughput:
    """What the last record of a log window carries besides its loss."""

    flops_per_token: float
    peak_flops: float | None
    measured_peak_flops: float | None
    world_size: int
    device: torch.device


class StepRecords:
    """Per-step values kept on the device until they are written, so the step never waits on the host: one
    read for all the steps since the last write. Every rank calls `write` at the same steps (the losses are
    averaged over ranks); rank 0's logger writes."""

    def __init__(self, log: MetricsLogger, throughput: Throughput):
        self.log, self.throughput = log, throughput
        self.pending: list[tuple[int, float, Any]] = []  # (step, lr, StepOutput)
        self.window_start, self.window_tokens, self.window_steps = time.perf_counter(), 0, 0

    def add(self, step: int, lr: float, output, tokens: int) -> None:
        self.pending.append((step, lr, output))
        self.window_tokens += tokens
        self.window_steps += 1

    def write(self, tokens: int, elapsed: float, summary: bool, max_steps: int = 0,
              eta: float | None = None, train_time: float | None = None) -> None:
        """Write the pending records. summary (a log step): the last record gets the window's throughput and
        memory, a console line is printed and the window restarts; otherwise (a checkpoint, the end) the records
        alone go out, and the window runs on."""
        if not self.pending:
            return
        t = self.throughput
        if summary and t.device.type == "cuda":
            torch.cuda.synchronize(t.device)
        now = time.perf_counter()
        names = sorted(self.pending[-1][2].metrics)
        values = all_reduce_mean(torch.stack([torch.stack([out.loss, *(out.metrics[n] for n in names)])
                                              for _, _, out in self.pending])).tolist()
        norms = torch.stack([out.grad_norm for _, _, out in self.pending]).tolist()
        last_step = self.pending[-1][0]
        extra: dict[str, Any] = {}
        if summary:
            extra = self._window(now, tokens, elapsed)
            if train_time is not None:
                extra["train_time"] = train_time
        for (step, lr, _), row, norm in zip(self.pending, values, norms):
            record = {"kind": "train", "step": step, "loss": row[0], "lr": lr, "grad_norm": norm,
                      **dict(zip(names, row[1:]))}
            if step == last_step:
                record.update(extra)
            self.log.log(record)
        if summary:
            window_means = dict(zip(names, torch.tensor(values)[:, 1:].mean(dim=0).tolist()))
            self.log.print(step_line(last_step, max_steps, values[-1][0], self.pending[-1][1], norms[-1], extra, eta,
                                     objective_line(window_means)))
            self.window_start, self.window_tokens, self.window_steps = time.perf_counter(), 0, 0
        self.log.flush()
        self.pending.clear()

    def _window(self, now: float, tokens: int, elapsed: float) -> dict[str, Any]:
        t = self.throughput
        seconds = max(now - self.window_start, 1e-9)
        tokens_per_second = self.window_tokens / seconds
        per_gpu = tokens_per_second / t.world_size
        extra = {"tokens": tokens, "elapsed": elapsed, "tokens_per_second": tokens_per_second,
                 "step_time": seconds / max(self.window_steps, 1),
                 "peak_memory_gib": torch.cuda.max_memory_allocated(t.device) / 2**30 if t.device.type == "cuda" else None}
        if t.peak_flops:
            extra["mfu"] = t.flops_per_token * per_gpu / t.peak_flops
        if t.measured_peak_flops:
            extra["mfu_measured_peak"] = t.flops_per_token * per_gpu / t.measured_peak_flops
        return extra


# An objective's own step metrics that the console line shows (their mean over the log window; every value stays
# in metrics.jsonl): name -> format. A GRPO step's reward depends on which prompts it drew, so one step's value
# says little and the window's mean is what a reader can follow.
CONSOLE_METRICS = {"reward_mean": "reward {:.3f}", "preference_accuracy": "pref acc {:.1%}",
                   "reward_margin": "margin {:+.3f}", "kl": "kl {:.4f}"}


def objective_line(means: dict[str, float]) -> str:
    """' | reward 0.412 | ...' for the objective metrics of CONSOLE_METRICS in `means` (kl only when not 0)."""
    parts = [fmt.format(means[name]) for name, fmt in CONSOLE_METRICS.items()
             if name in means and not (name == "kl" and means[name] == 0)]
    return "".join(f" | {p}" for p in parts)


def step_line(step: int, max_steps: int, loss: float, lr: float, grad_norm: float, window: dict,
              eta: float | None, objective: str = "") -> str:
    """The console line of a log step; objective: objective_line's text, after the loss."""
    mfu, mem = window.get("mfu"), window.get("peak_memory_gib")
    return (f"step {step:>6}{f'/{max_steps}' if max_steps else ''} | loss {loss:.4f}{objective} | lr {lr:.2e} | "
            f"gnorm {grad_norm:.2f} | {window.get('tokens_per_second', 0) / 1e3:,.1f}k tok/s"
            + (f" | mfu {mfu * 100:.1f}%" if mfu is not None else "")
            + (f" | mem {mem:.1f} GiB" if mem is not None else "")
            + (f" | eta {format_duration(eta)}" if eta is not None else ""))


def eta_seconds(progress: float, start_progress: float, seconds: float) -> float | None:
    """Seconds left at budget `progress` (0..1), from this process's own rate: `seconds` since it started at
    `start_progress` (a resumed run's earlier time, its compile and its crash do not count). None before any
    progress."""
    done = progress - start_progress
    if done <= 0:
        return None
    return seconds * max(1.0 - progress, 0.0) / done


# ----------------------------------------------------------------------------------------------------
# a resumed run's metrics


@dataclass
class History:
    """What a resumed run's metrics.jsonl held up to its checkpoint."""

    dropped: int = 0
    """Records after the checkpoint (or torn by a kill) that were removed."""
    missing: list[tuple[int, int]] = field(default_factory=list)
    """Ranges (first, last) of training steps up to the checkpoint without a record."""
    best_bpb: float | None = None
    """The lowest validation bits per byte among the kept evaluations."""


def resume_metrics(run_dir: Path, step: int) -> History:
    """Make RUN/metrics.jsonl end at checkpoint step `step`: drop what a killed run wrote after it (those steps
    run again) and lines a kill cut short; report the steps up to it that have no record. Rank 0 only."""
    path = Path(run_dir) / "metrics.jsonl"
    history = History()
    kept: list[str] = []
    seen: set[int] = set()
    lines = path.read_bytes().splitlines() if path.exists() else []
    for raw in lines:
        try:  # a line a kill cut short, bytes that are not UTF-8, or JSON that is not a record: dropped
            line = raw.decode("utf-8")
            record = json.loads(line)
        except ValueError:  # UnicodeDecodeError is a ValueError too
            history.dropped += 1
            continue
        if not isinstance(record, dict):
            history.dropped += 1
            continue
        at = record.get("step")
        if isinstance(at, int) and at > step:
            history.dropped += 1
            continue
        kept.append(line)
        if record.get("kind") == "train" and isinstance(at, int):
            seen.add(at)
        bpb = record.get("bpb") if record.get("kind") == "eval" else None
        if isinstance(bpb, (int, float)) and math.isfinite(bpb):
            history.best_bpb = bpb if history.best_bpb is None else min(history.best_bpb, bpb)
    if history.dropped:
        from redline.durable import write_atomic

        write_atomic(path, "".join(line + "\n" for line in kept))
    history.missing = _ranges(sorted(set(range(1, step + 1)) - seen))
    return history


def _ranges(steps: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s in steps:
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
