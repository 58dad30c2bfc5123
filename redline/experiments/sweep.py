"""Running a sweep: one subprocess per run, resumable, appending results as each run ends.

Layout of a sweep directory:

    sweep.json       the recipe and the planned runs with their fingerprints
    configs/RUN.yaml each run's config (`redline train --config configs/RUN.yaml` reruns it alone)
    runs/RUN/        each run's directory (written by `redline train`) plus train.log, its console output
    results.jsonl    one summary per finished run, appended and fsynced as each ends
    status.json      live progress (done / running / failed, ETA) for `redline dashboard`

How it stays correct when things go wrong:
- each run is its own process group: a crash or an out-of-memory error ends that run only; it is recorded
  as failed with the error line from its log, and the sweep goes on;
- the next run starts only when the previous process group is gone and, on a GPU, the memory it held
  is free again (NVML), so one run's leftovers never shrink the next one's memory;
- a run is finished only once its line is in results.jsonl; re-running the same command skips those
  (failed ones too, unless --retry-failed) and starts over any run that was cut short, from an empty
  directory; a run whose recipe entry changed since it finished is refused unless --redo-changed;
- Ctrl-C or SIGTERM kills the running runs' process groups and leaves no partial record; children also
  get SIGTERM if the sweep process itself dies (Linux parent-death signal);
- with --gpus N, N runs go at once, each on a GPU of its own (CUDA_VISIBLE_DEVICES set to it alone; its record
  names it), and a GPU takes its next run once the last one's memory there is free again; a run that starts from
  another run of the sweep (init_from) waits for that run to end;
- one sweep per directory at a time (an exclusive lock on .sweep.lock).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from redline.durable import append_line, write_atomic
from redline.errors import UserError
from redline.experiments.preflight import check_requirements
from redline.experiments.processes import (
    SweepLock,
    die_with_parent,
    error_line,
    gpu_memory_used,
    in_main_thread,
    kill_group,
    log_tail_text,
    raise_interrupt,
    stop_orphan,
    wait_for_gpu_release,
)
from redline.experiments.recipes import (
    DEFAULT_COMMAND,
    Recipe,
    RunSpec,
    describe_budget,
    resolve_command,
    resolve_train_config,
)
from redline.experiments.results import count_params, read_jsonl, summarize_run

POLL_SECONDS = 0.5


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class Plan:
    spec: RunSpec
    fingerprint: str
    state: str  # "done" | "failed" | "todo" | "changed"
    record: dict[str, Any] | None = None


@dataclass
class Running:
    """A run whose process has started."""

    plan: Plan
    proc: subprocess.Popen
    log: Any  # its train.log, open for the process's output
    t0: float
    base: dict[str, Any]  # the start of its record
    planned_model: dict[str, Any] | None
    gpu: str | None  # the CUDA device it runs on alone (None: whatever it picks)
    gpu_baseline: list[int] | None  # memory in use on its GPU (every GPU when gpu is None) before it started

    @property
    def devices(self) -> list[str] | None:
        """The GPUs whose memory it must give back (None: every GPU)."""
        return None if self.gpu is None else [self.gpu]
    timed_out: bool = False


class Sweep:
    def __init__(self, recipe: Recipe, runs: list[RunSpec], out_dir: Path):
        self.recipe = recipe
        self.runs = runs
        self.out_dir = Path(out_dir).resolve()
        self.command = resolve_command(recipe.command)
        self.default_runner = recipe.command == DEFAULT_COMMAND
        self._last_status = 0.0  # when status.json was last written

    # ------------------------------------------------------------------------------------------------
    # planning

    @property
    def results_path(self) -> Path:
        return self.out_dir / "results.jsonl"

    def plan(self) -> list[Plan]:
        """Each run with what re-running this sweep would do about it."""
        # a record that is not one of ours (edited by hand, or from another tool) counts as no record
        finished = {r["run_id"]: r for r in read_jsonl(self.results_path)
                    if isinstance(r.get("run_id"), str) and isinstance(r.get("status"), str)}
        plans = []
        for spec in self.runs:
            fingerprint = spec.fingerprint(self.recipe.command)
            record = finished.get(spec.run_id)
            if record is None:
                state = "todo"
            elif record.get("fingerprint") != fingerprint:
                state = "changed"
            elif record.get("status") in ("completed", "diverged"):
                state = "done"
            else:
                state = "failed"
            plans.append(Plan(spec, fingerprint, state, record))
        return plans

    def config_path(self, spec: RunSpec) -> Path:
        return self.out_dir / "configs" / f"{spec.run_id}.yaml"

    def run_dir(self, spec: RunSpec) -> Path:
        return self.out_dir / "runs" / spec.run_id

    def write_config(self, spec: RunSpec) -> dict[str, Any]:
        import yaml

        contents = spec.config_file_contents(self.out_dir / "runs")
        path = self.config_path(spec)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = f"# run {spec.run_id} of sweep {self.recipe.name}: redline train --config {path}\n"
        write_atomic(path, header + yaml.safe_dump(contents, sort_keys=False))
        return contents

    def resolved_configs(self, plans: list[Plan]) -> dict[str, Any]:
        """run id -> the TrainConfig `redline train` will build for it (runs whose config is invalid are left
        out: start_run records each of those as failed with its error)."""
        configs = {}
        for plan in plans:
            try:
                configs[plan.spec.run_id] = resolve_train_config(plan.spec.config_file_contents(self.out_dir / "runs"))
            except UserError:
                continue
        return configs

    def write_meta(self) -> None:
        meta = {"recipe": self.recipe.to_dict(), "created": now_iso(), "command": self.command,
                "runs": [{"run_id": s.run_id, **s.cell, "seed": s.seed, "fingerprint": s.fingerprint(self.recipe.command)}
                         for s in self.runs]}
        path = self.out_dir / "sweep.json"
        if path.is_file():
            with contextlib.suppress(json.JSONDecodeError, OSError):
                meta["created"] = json.loads(path.read_text()).get("created", meta["created"])
        write_atomic(path, json.dumps(meta, indent=2, default=str))

    # ------------------------------------------------------------------------------------------------
    # running

    def execute(self, retry_failed: bool = False, redo_changed: bool = False, stop_after_minutes: float = 0.0,
                display: Progress | None = None, gpus: list[str] | None = None) -> dict[str, Any]:
        """Run every run that is not finished yet: one at a time, or with `gpus` (CUDA device ids, from
        visible_gpus()) one on each of them at once. Returns counts for the final summary."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with SweepLock(self.out_dir / ".sweep.lock"):
            stop_orphan(self.out_dir / "status.json")
            plans = self.plan()
            changed = [p.spec.run_id for p in plans if p.state == "changed"]
            if changed and not redo_changed:
                raise UserError(
                    f"{len(changed)} finished run(s) in {self.out_dir} were made from a different recipe entry "
                    f"(e.g. {changed[0]}); use another --out directory, or --redo-changed to run them again")
            todo = [p for p in plans if p.state in ("todo", "changed") or (p.state == "failed" and retry_failed)]
            skipped = len(plans) - len(todo)
            if self.default_runner:
                check_requirements(self.resolved_configs(todo))  # a missing library fails now, not in every run
            self.write_meta()
            display = display or Progress(None)
            slots: list[str | None] = list(gpus) if gpus else [None]
            display.start(self, plans, todo, slots=len(slots))
            started = time.monotonic()
            counts = {"planned": len(plans), "skipped": skipped, "ran": 0, "completed": 0, "failed": 0, "left": 0}
            previous_term = signal.signal(signal.SIGTERM, raise_interrupt) if in_main_thread() else None
            queue, active, free = list(todo), [], list(slots)
            if len(slots) > 1:  # each variant's first seed first: its compilation is cached for its later seeds
                order = {seed: i for i, seed in enumerate(dict.fromkeys(p.spec.seed for p in todo))}
                queue.sort(key=lambda p: order[p.spec.seed])
            needs = self.dependencies(todo)
            try:
                while queue or active:
                    while queue and free:
                        if counts["ran"] + len(active) and stop_after_minutes and \
                                time.monotonic() - started > stop_after_minutes * 60:
                            counts["left"] = len(queue)
                            display.note(f"stopping: --stop-after {stop_after_minutes:g} min reached with "
                                         f"{counts['left']} run(s) left; run the same command again to continue")
                            queue = []
                            break
                        # the first run whose starting runs (init_from) have all ended
                        pending = {p.spec.run_id for p in queue} | {r.plan.spec.run_id for r in active}
                        plan = next((p for p in queue if not needs[p.spec.run_id] & pending), None)
                        if plan is None:
                            break  # every queued run starts from one still running: wait for it
                        queue.remove(plan)
                        slot = free.pop(0)
                        run = self.start_run(plan, display, slot)
                        if isinstance(run, Running):
                            active.append(run)
                            self.write_status("running", display)
                        else:  # its config failed before anything started
                            free.insert(0, slot)
                            self._count(run, counts, display)
                    if not active:
                        break
                    for run in self.wait_any(active, display):
                        active.remove(run)
                        record = self.finish_run(run, display)
                        free.append(run.gpu)
                        self._count(record, counts, display)
                self.write_status("finished" if not counts["left"] else "stopped", display)
            except KeyboardInterrupt:
                for run in active:
                    kill_group(run.proc)
                    run.proc.wait()
                self.write_status("interrupted", display)
                display.stop()
                display.note(f"interrupted: the run(s) in progress were stopped and will start over; finished runs "
                             f"are kept. Run the same command again to resume ({self.out_dir}).")
                raise
            finally:
                if previous_term is not None:
                    signal.signal(signal.SIGTERM, previous_term)
                for run in active:
                    run.log.close()
            display.stop()
            counts["wall_seconds"] = time.monotonic() - started
            return counts

    def dependencies(self, plans: list[Plan]) -> dict[str, set[str]]:
        """run id -> the ids of the runs among `plans` whose directory its config starts from (init_from): a
        fine-tune of a run the same sweep pretrains starts only once that run has ended."""
        dirs = {str(self.run_dir(p.spec)): p.spec.run_id for p in plans}
        needs = {}
        for plan in plans:
            start = plan.spec.config_file_contents(self.out_dir / "runs").get("init_from")
            needs[plan.spec.run_id] = {dirs[str(Path(start))]} if start and str(Path(start)) in dirs else set()
        return needs

    @staticmethod
    def _count(record: dict[str, Any], counts: dict[str, int], display: Progress) -> None:
        counts["ran"] += 1
        counts["completed" if record["status"] == "completed" else "failed"] += 1
        display.finished(record)

    def start_run(self, plan: Plan, display: Progress, gpu: str | None = None) -> Running | dict[str, Any]:
        """Start a run's process (on CUDA device `gpu` alone, if given) -> a Running, or the record of a run
        whose config is invalid (nothing started)."""
        spec = plan.spec
        run_dir = self.run_dir(spec)
        if run_dir.exists():  # cut short last time (or being redone): start from an empty directory
            shutil.rmtree(run_dir)
        contents = self.write_config(spec)
        base = {"run_id": spec.run_id, **spec.cell, "seed": spec.seed, "fingerprint": plan.fingerprint,
                "overrides": spec.overrides, "config_file": str(self.config_path(spec)), "started": now_iso()}
        if gpu is not None:
            base["gpu"] = gpu
        planned_model = None
        if self.default_runner:  # check the config here first: a bad key fails in a second, not after CUDA init
            try:
                from redline.config import to_dict

                planned_model = to_dict(resolve_train_config(contents))["model"]
            except UserError as e:
                record = {**base, "status": "failed", "error": f"config: {e}", "returncode": None, "wall_time": 0.0}
                return self.append(record, spec)
        run_dir.mkdir(parents=True, exist_ok=True)
        cmd = self.command + ["--config", str(self.config_path(spec))]
        gpu_baseline = gpu_memory_used(None if gpu is None else [gpu])
        log = open(run_dir / "train.log", "wb")
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if gpu is not None:  # the run sees its GPU alone, numbered as NVML and nvidia-smi number them
            env["CUDA_VISIBLE_DEVICES"] = gpu
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, preexec_fn=die_with_parent)
        except BaseException:
            log.close()
            raise
        run = Running(plan, proc, log, time.monotonic(), base, planned_model, gpu, gpu_baseline)
        display.running(spec, proc.pid)
        return run

    def wait_any(self, active: list[Running], display: Progress) -> list[Running]:
        """Wait up to POLL_SECONDS -> the runs whose process has ended (or was killed for its time limit)."""
        deadline = time.monotonic() + POLL_SECONDS
        timeout = self.timeout_seconds()
        while True:
            ended = []
            for run in active:
                if run.proc.poll() is not None:
                    ended.append(run)
                elif timeout and time.monotonic() - run.t0 > timeout:
                    run.timed_out = True
                    kill_group(run.proc)
                    ended.append(run)
            if ended or time.monotonic() >= deadline:
                break
            time.sleep(min(0.05, POLL_SECONDS))
        for run in active:
            if run not in ended:
                display.tick(run.plan.spec.run_id, self.run_dir(run.plan.spec))
        if time.monotonic() - self._last_status > 5:
            self.write_status("running", display)
        return ended

    def finish_run(self, run: Running, display: Progress) -> dict[str, Any]:
        """Collect an ended run: its process group gone, its GPU memory free, its record appended."""
        spec = run.plan.spec
        run_dir = self.run_dir(spec)
        try:
            run.proc.wait()
        finally:
            kill_group(run.proc)  # stragglers of the run (compile workers, data loader processes)
            run.log.close()
        wall = time.monotonic() - run.t0
        wait_for_gpu_release(run.proc.pid, run.gpu_baseline, devices=run.devices)
        summary = summarize_run(run_dir, spec={"run_id": spec.run_id, **spec.cell, "seed": spec.seed})
        record = {**run.base, **summary, "returncode": run.proc.returncode, "wall_time": wall}
        log_tail = log_tail_text(run_dir / "train.log")
        if run.timed_out:
            record["status"] = "failed"
            record["error"] = f"timed out after {self.timeout_seconds() / 60:.1f} min (recipe timeout_minutes) and was killed"
        elif record["status"] == "completed" and run.proc.returncode != 0:
            record["status"] = "failed"
            record["error"] = f"exited with status {run.proc.returncode} after finishing: {error_line(log_tail)}"
        elif record["status"] == "interrupted":
            record["status"] = "failed"
            record["error"] = "interrupted by a signal from outside the sweep"
        elif record["status"] not in ("completed", "diverged"):
            record["status"] = "failed"
            record["error"] = error_line(log_tail) or f"exited with status {run.proc.returncode} without an end record"
        if record["status"] == "failed" and "out of memory" in log_tail.lower():
            record["error_kind"] = "out_of_memory"
        if record.get("params") is None and run.planned_model is not None:
            record["params"], record["params_non_embedding"] = count_params(run.planned_model)
        if not self.recipe.keep_checkpoints:
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        return self.append(record, spec)

    def append(self, record: dict[str, Any], spec: RunSpec) -> dict[str, Any]:
        record["finished"] = now_iso()
        append_line(self.results_path, json.dumps(record, default=str))  # whole, fsynced, or not at all
        return record

    def timeout_seconds(self) -> float | None:
        if self.recipe.timeout_minutes:
            return self.recipe.timeout_minutes * 60
        if "max_time" in self.recipe.budget and not ({"max_steps", "max_tokens"} & set(self.recipe.budget)):
            return (self.recipe.budget["max_time"] * 3 + 10) * 60  # startup, compile and evaluation on top
        return None

    def write_status(self, state: str, display: Progress) -> None:
        self._last_status = time.monotonic()
        status = {"state": state, "updated": now_iso(), "pid": os.getpid(), **display.snapshot()}
        write_atomic(self.out_dir / "status.json", json.dumps(status, default=str))


# ----------------------------------------------------------------------------------------------------
# progress display


class Progress:
    """Runs done / running / failed and an ETA: a live panel on a terminal, one line per event elsewhere."""

    def __init__(self, console):
        self.console = console
        self.live = None
        self.total = self.done = self.failed = self.skipped = 0
        self.active: dict[str, dict[str, Any]] = {}
        """run id -> {"spec", "pid", "started", "fraction", "step"} of each run in progress, in start order."""
        self.slots = 1
        self.durations: list[float] = []
        self.recent: list[dict[str, Any]] = []
        self.sweep: Sweep | None = None
        self.todo = 0

    def start(self, sweep: Sweep, plans: list[Plan], todo: list[Plan], slots: int = 1) -> None:
        self.sweep = sweep
        self.total = len(plans)
        self.todo = len(todo)
        self.slots = slots
        self.skipped = len(plans) - len(todo)
        self.done = sum(p.state == "done" for p in plans if p not in todo)
        self.failed = sum(p.state == "failed" for p in plans if p not in todo)
        self.durations = [p.record["wall_time"] for p in plans
                          if p.record and p.record.get("status") == "completed"
                          and isinstance(p.record.get("wall_time"), (int, float)) and p.record["wall_time"] > 0]
        at_once = f", {slots} at once" if slots > 1 else ""
        self._print(f"sweep {sweep.recipe.name}: {self.total} runs ({self.skipped} already finished, "
                    f"{len(todo)} to run{at_once}), budget {describe_budget(sweep.recipe.budget)} each → "
                    f"{sweep.out_dir}")
        if self.console is not None and self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self._render(), console=self.console, refresh_per_second=2, transient=True)
            self.live.start()

    def running(self, spec: RunSpec, pid: int | None = None) -> None:
        self.active[spec.run_id] = {"spec": spec, "pid": pid, "started": time.monotonic(), "fraction": 0.0,
                                    "step": ""}
        if self.live is None:
            self._print(f"[{self.done + self.failed + len(self.active)}/{self.total}] {spec.run_id} ...")
        self._refresh()

    def tick(self, run_id: str, run_dir: Path) -> None:
        run = self.active.get(run_id)
        last = _last_train_record(run_dir / "metrics.jsonl")
        if run is not None and last and self.sweep is not None:
            budget = self.sweep.recipe.budget
            fractions = []
            if budget.get("max_steps") and last.get("step"):
                fractions.append(last["step"] / budget["max_steps"])
            if budget.get("max_tokens") and last.get("tokens"):
                fractions.append(last["tokens"] / budget["max_tokens"])
            if budget.get("max_time") and last.get("elapsed"):
                fractions.append(last["elapsed"] / (budget["max_time"] * 60))
            run["fraction"] = min(max(fractions, default=0.0), 1.0)
            run["step"] = f"step {last.get('step')} loss {last.get('loss', float('nan')):.3f}"
        self._refresh()

    def finished(self, record: dict[str, Any]) -> None:
        self.active.pop(record["run_id"], None)
        if record["status"] == "completed":
            self.done += 1
            if record.get("wall_time"):
                self.durations.append(record["wall_time"])
        else:
            self.failed += 1
        self.recent = (self.recent + [record])[-6:]
        self._print(_record_line(record, self.done + self.failed, self.total))
        self._refresh()

    def note(self, text: str) -> None:
        self._print(text)

    def eta_seconds(self) -> float | None:
        """Seconds left: the runs not finished (less what the running ones have done) times the mean run, over
        the runs that go at once."""
        if not self.durations:
            return None
        mean = sum(self.durations) / len(self.durations)
        left = self.total - self.done - self.failed - sum(r["fraction"] for r in self.active.values())
        return max(0.0, left * mean / self.slots)

    def snapshot(self) -> dict[str, Any]:
        first = next(iter(self.active.values()), None)
        return {"total": self.total, "done": self.done, "failed": self.failed, "skipped": self.skipped,
                "running": first["spec"].run_id if first else None,
                "running_fraction": first["fraction"] if first else 0.0, "eta_seconds": self.eta_seconds(),
                "child_pid": first["pid"] if first else None,
                "children": [{"run_id": run_id, "pid": r["pid"], "fraction": r["fraction"]}
                             for run_id, r in self.active.items()]}

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def _print(self, text: str) -> None:
        if self.console is None:
            print(text, flush=True)
        elif self.live is not None:
            self.live.console.print(text, markup=False, highlight=False)
        else:
            self.console.print(text, markup=False, highlight=False)

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._render())

    def _render(self):
        from rich.table import Table
        from rich.text import Text

        from redline.training.metrics import format_duration

        eta = self.eta_seconds()
        grid = Table.grid(padding=(0, 2))
        # Text objects, not markup strings: a console.print(markup=False) above the live area must not show tags
        grid.add_row(Text.from_markup(f"[bold]{self.done}[/] done"),
                     Text.from_markup(f"[bold]{len(self.active)}[/] running"),
                     Text.from_markup(f"[bold red]{self.failed}[/] failed"),
                     Text(f"{self.total - self.done - self.failed} left"),
                     Text(f"ETA {format_duration(eta) if eta is not None else 'after the first run'}"))
        for run_id, run in self.active.items():
            elapsed = time.monotonic() - run["started"]
            bar = "█" * int(run["fraction"] * 20) + "·" * (20 - int(run["fraction"] * 20))
            grid.add_row(Text(run_id, style="cyan"), Text(bar), Text(f"{run['fraction'] * 100:.0f}%"),
                         Text(format_duration(elapsed)), Text(run["step"]))
        return grid


def _record_line(record: dict[str, Any], index: int, total: int) -> str:
    parts = [f"[{index}/{total}] {record['run_id']}: {record['status']}"]
    if record.get("tokens_per_second"):
        parts.append(f"{record['tokens_per_second']:,.0f} tok/s")
    if record.get("final_val_bpb") is not None:
        parts.append(f"val bpb {record['final_val_bpb']:.4f}")
    if record.get("peak_memory_gib"):
        parts.append(f"{record['peak_memory_gib']:.1f} GiB")
    if record.get("wall_time") is not None:
        parts.append(f"{record['wall_time']:.0f}s")
    if record.get("error"):
        parts.append(f"error: {record['error']}")
    return " | ".join(parts)


def _last_train_record(path: Path) -> dict[str, Any] | None:
    for line in reversed(log_tail_text(path, 8192).splitlines()):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("kind") == "train":
            return record
    return None


def default_out_dir(recipe: Recipe) -> Path:
    return Path("sweeps") / recipe.name


def print_plan(plans: list[Plan], console) -> None:
    from rich.table import Table

    table = Table("run", "state", "params", "overrides (besides the recipe's common set)")
    for plan in plans:
        table.add_row(plan.spec.run_id, plan.state, _planned_params(plan.spec),
                      " ".join(f"{k}={v}" for k, v in plan.spec.overrides.items() if k not in ("seed", "data.path")))
    console.print(table)


def _planned_params(spec: RunSpec) -> str:
    try:
        from redline.config import to_dict

        contents = spec.config_file_contents(Path("."))
        total, _ = count_params(to_dict(resolve_train_config(contents))["model"])
        return f"{total / 1e6:.1f}M" if total else "?"
    except UserError as e:
        return f"invalid: {e}"

