"""Multi-GPU scaling on one node: `redline bench --gpus 1,2,4`.

How it works:
- each world size N is one point, run in a process tree of its own by PyTorch's launcher:
      python -m torch.distributed.run --standalone --nproc_per_node=N -m redline bench <the same arguments>
  so an out-of-memory rank, a crash or a hang past `point_timeout` is reported for that point and the next
  world size starts on clean GPUs (the whole tree is stopped, ranks included);
- the per-GPU work is fixed (weak scaling): batch_size and tokens_per_step are per GPU on this command line, so
  N GPUs process N times the tokens of one per step (each world size's point is given the global
  tokens_per_step, N times the per-GPU one, which is what tokens_per_step means everywhere else); N=1 runs
  without a data-parallel wrapper, as single-GPU training does;
- inside the point every rank builds the training step (`parallel=ddp` unless the command says fsdp2), warms
  it up and times it; a step counts as the slowest rank's time for it (ranks run in lockstep anyway), tokens/s
  is the sum over ranks at the median step time, MFU is per GPU, peak memory the largest over ranks;
- then `profile_steps` more steps run under torch.profiler for the communication share (below); rank 0 prints
  the point's JSON line, the parent collects the points, adds the scaling efficiency (per-GPU tokens/s at N
  over per-GPU tokens/s at the smallest N measured) and prints the table, the plot and one JSON line.

Communication share, over the profiled steps (the first one is left out: it absorbs the profiler's start-up):
- on GPUs: the GPU time of collective kernels (NCCL's AllReduce / ReduceScatter / AllGather / ... kernels), as
  the union of their intervals, over the wall time of those steps (first step's start to the last kernel's end);
- on CPUs (gloo): the time gloo's worker threads spend in collectives (`gloo:*` profiler events), the same way;
- exposed: the part of that time during which no compute ran at the same time (no other GPU kernel on any
  stream; on a CPU, no operator on the training threads) — the communication that the step waits for.
Both shares are averaged over ranks, and each rank's share is given too (share_by_rank, exposed_share_by_rank). A
collective's time includes waiting for the slowest rank to join it: ranks whose shares are far apart are out of
step (one waits in its collectives for another), which slow transfers would not explain.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from redline.distributed import DistInfo, all_gather_rows
from redline.errors import UserError

STEP_MARK = "redline_scaling_step"  # the profiler range around each profiled step
# GPU kernels of collectives: NCCL's (ncclKernel_* / ncclDevKernel_*) and any other all-reduce/gather/scatter kernel
COLLECTIVE_KERNEL = re.compile(r"nccl|allreduce|all_reduce|reducescatter|reduce_scatter|allgather|all_gather",
                               re.IGNORECASE)
# CPU profiler ranges that launch, run or wait for a collective (not compute)
COLLECTIVE_OP = ("gloo:", "nccl:", "c10d::", "record_param_comms")


# ----------------------------------------------------------------------------------------------------
# the parent: one point per world size


def parse_gpus(spec: str) -> list[int]:
    """World sizes from their comma list ("1,2,4" -> [1, 2, 4]); a one-line UserError for anything else."""
    items = [item.strip() for item in str(spec).split(",")]
    if not spec or not all(items):
        raise UserError(f"--gpus {spec!r}: give world sizes separated by commas, such as --gpus 1,2,4")
    sizes = []
    for item in items:
        if not item.isdigit():
            raise UserError(f"--gpus {spec!r}: {item!r} is not a whole number of GPUs; write e.g. --gpus 1,2,4")
        sizes.append(int(item))
    if 0 in sizes:
        raise UserError(f"--gpus {spec!r}: a world size must be at least 1")
    repeated = sorted({n for n in sizes if sizes.count(n) > 1})
    if repeated:
        raise UserError(f"--gpus {spec!r} names {', '.join(map(str, repeated))} more than once")
    return sizes


def on_cpu(device: str) -> bool:
    return device == "cpu" or (device == "auto" and not torch.cuda.is_available())


def check_available(sizes: list[int], device: str) -> None:
    """On a CUDA machine a world size may not exceed its GPUs; on a CPU the ranks are processes (gloo)."""
    if on_cpu(device):
        return
    count = torch.cuda.device_count()
    if max(sizes) > count:
        raise UserError(f"--gpus asks for {max(sizes)} GPUs but this machine has {count}; "
                        f"use world sizes up to {count}")


def launcher(world_size: int) -> list[str]:
    """PyTorch's own launcher, one process per GPU on this node."""
    return ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}"]


def point_env(world_size: int, device: str) -> dict[str, str]:
    """On a CPU the cores are shared out between the ranks (each rank gets cores // N threads), so that N=1 is
    not measured with every core and N=2 with one each; a user's OMP_NUM_THREADS wins. GPUs: torchrun's default."""
    if not on_cpu(device) or "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world_size))}


def add_efficiency(points: list[dict]) -> int | None:
    """Scaling efficiency of each ok point against the smallest world size that ran; returns that size."""
    ok = [p for p in points if p.get("status") == "ok" and p.get("tokens_per_second_per_gpu")]
    if not ok:
        return None
    base = min(ok, key=lambda p: p["gpus"])
    ran = {id(p) for p in ok}
    for p in points:
        p["scaling_efficiency"] = (p["tokens_per_second_per_gpu"] / base["tokens_per_second_per_gpu"]
                                   if id(p) in ran else None)
    return base["gpus"]


def run_scaling(base_argv: list[str], sizes: list[int], device: str, timeout: float,
                on_result: Callable[[int, dict], None] | None = None, tokens_per_gpu: int = 0) -> list[dict]:
    """Every world size in turn, each under torchrun in its own process tree; the points in order.
    tokens_per_gpu: the per-GPU batch in tokens per step (0: one micro-batch per GPU)."""
    from redline.bench.matrix import run_point

    if on_cpu(device) and max(sizes) > (os.cpu_count() or 1):
        print(f"redline bench: {max(sizes)} ranks on {os.cpu_count()} CPU cores: the larger world sizes share cores",
              file=sys.stderr)
    points = []
    for i, n in enumerate(sizes):
        argv = base_argv + ([f"tokens_per_step={tokens_per_gpu * n}"] if tokens_per_gpu else [])
        point = run_point(argv, timeout, launcher=launcher(n), env=point_env(n, device))
        point["gpus"] = n
        points.append(point)
        if on_result:
            on_result(i, point)
    return points


def run_command(cfg, argv: list[str], report: dict, out) -> int:
    """`redline bench --gpus 1,2,4` (cfg: a BenchConfig): the points, the table, the plot; the points and the plot's
    path go into `report` (the caller prints it as the JSON line). Exit status 0 when any world size ran."""
    from datetime import datetime

    from redline.bench.matrix import remove_option

    sizes = parse_gpus(cfg.gpus)
    check_available(sizes, cfg.device)
    base = argv
    # each point is one world size with its own global tokens_per_step, and only this process writes
    for name in ("gpus", "plot", "json_out", "json-out", "tokens_per_step"):
        base = remove_option(base, name)
    print(f"redline bench: world sizes {', '.join(map(str, sizes))} (parallel={cfg.parallel}, batch_size={cfg.batch_size} "
          f"per GPU), each under torchrun in its own processes", flush=True)

    def progress(i, point):
        speed = f", {point['tokens_per_second']:,.0f} tokens/s" if point.get("tokens_per_second") else ""
        comm = f", communication {point['comm_share'] * 100:.1f}%" if point.get("comm_share") is not None else ""
        error = f": {point['error'][:200]}" if point.get("status") != "ok" and point.get("error") else ""
        print(f"  [{i + 1}/{len(sizes)}] world size {point['gpus']}: {point['status']}{speed}{comm}{error} "
              f"({point.get('wall_seconds', 0):.0f} s)", flush=True)

    points = run_scaling(base, sizes, cfg.device, cfg.point_timeout, progress, cfg.tokens_per_step)
    baseline = add_efficiency(points)
    report.update(gpus=sizes, parallel=cfg.parallel, points=points, efficiency_baseline_gpus=baseline, plot=None)
    title = f"redline bench {cfg.preset} scaling on {report.get('gpu') or 'cpu'} (parallel={cfg.parallel})"
    print_table(points, title, out)
    if line := summary_line(points):
        print(line)
    if (cfg.plot or "").lower() not in ("off", "none", "false"):
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        path = cfg.plot or default_plot_path(cfg.out_dir, cfg.preset, stamp)
        try:
            report["plot"] = str(write_plot(points, path, title, "GPUs" if report.get("gpu") else "processes"))
            print(f"plot written to {report['plot']}")
        except (UserError, OSError) as e:  # the measurements stand without the picture
            print(f"redline bench: no plot: {e}", file=sys.stderr)
    return 0 if baseline is not None else 1


# ----------------------------------------------------------------------------------------------------
# inside a point: every rank


def run_rank(cfg, warmup: int, steps: int, trace: str | None) -> dict:
    """This rank's part of a point under torchrun: join the group, measure, leave. Every rank returns the same
    combined numbers. An error (out of memory included) propagates, so that torchrun stops the other ranks."""
    from redline.bench.step import measure
    from redline.distributed import barrier, dist_info, init_distributed, shutdown
    from redline.hardware import resolve_device

    if cfg.profile_steps < 1:
        raise UserError(f"profile_steps must be at least 1, got {cfg.profile_steps}")
    info = dist_info()
    device = resolve_device(cfg.device, info.local_rank)
    init_distributed(info, device, cfg.dist_timeout)
    point = measure(cfg, warmup, steps, profile_steps=cfg.profile_steps if cfg.profile else 0,
                    trace_path=trace if info.is_main else None, info=info, comm_steps=cfg.profile_steps, device=device)
    comm = point["communication"]
    point["comm_share"] = comm["share"]
    point["comm_exposed_share"] = comm["exposed_share"]
    # every rank out of its last collective before any rank tears its group down: a rank whose peer closed
    # the connection while a gloo thread still served it aborts (std::terminate) instead of exiting
    barrier()
    shutdown()
    return point


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of the (merged) intervals `a` not covered by the (merged) intervals `b`."""
    out, j = [], 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def _clip(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def communication_times(events, on_gpu: bool) -> dict:
    """Communication and exposed communication over the profiled steps, from the profiler's events (µs).

    The first step mark is left out; the window runs from the second step's start to the end of the last step
    (or the last GPU kernel's end, which comes later)."""
    from torch.autograd import DeviceType

    marks = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.name == STEP_MARK and e.device_type == DeviceType.CPU)
    if len(marks) < 2:
        raise RuntimeError("the profiler recorded fewer than two steps")
    comm, compute, names = [], [], {}
    if on_gpu:
        for e in events:  # kernels, copies and memsets; not the GPU-side copies of record_function ranges
            if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
                interval = (e.time_range.start, e.time_range.end)
                if COLLECTIVE_KERNEL.search(e.name):
                    comm.append(interval)
                    names.setdefault(e.name, []).append(interval)
                else:
                    compute.append(interval)
        window_end = max([marks[-1][1]] + [end for _, end in comm + compute])
    else:
        comm_threads = set()
        for e in events:
            if e.device_type == DeviceType.CPU and e.name.startswith("gloo:"):
                comm.append((e.time_range.start, e.time_range.end))
                comm_threads.add(e.thread)
                names.setdefault(e.name, []).append(comm[-1])
        for e in events:  # the operators that do the work on the training threads (leaves: no waiting wrappers)
            if (e.device_type == DeviceType.CPU and e.thread not in comm_threads and not e.cpu_children
                    and e.name != STEP_MARK and not e.name.startswith(COLLECTIVE_OP)):
                compute.append((e.time_range.start, e.time_range.end))
        window_end = marks[-1][1]
    window_start = marks[1][0]
    comm_u = _union(_clip(comm, window_start, window_end))
    compute_u = _union(_clip(compute, window_start, window_end))
    return {"wall_us": window_end - window_start, "comm_us": _length(comm_u),
            "exposed_us": _length(_minus(comm_u, compute_u)),
            "names_us": {name: _length(_union(_clip(spans, window_start, window_end))) for name, spans in names.items()}}


def communication_profile(step: Callable[[], object], n_steps: int, device: torch.device, info: DistInfo) -> dict:
    """Run 1 + n_steps steps under torch.profiler; the communication share of the last n_steps, averaged over
    ranks (see the module docstring)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(n_steps + 1):
            with record_function(STEP_MARK):
                step()
        if on_gpu:
            torch.cuda.synchronize(device)
    times = communication_times(prof.events(), on_gpu)
    ranks = all_gather_rows(torch.tensor([times["wall_us"], times["comm_us"], times["exposed_us"]],
                                         dtype=torch.float64, device=device))  # (world, 3)
    wall, comm, exposed = ranks.mean(dim=0).tolist()
    top = sorted(times["names_us"].items(), key=lambda kv: -kv[1])[:8]

    def shares(column: int) -> list[float | None]:
        return [part / whole if whole > 0 else None for whole, part in ranks[:, [0, column]].tolist()]

    return {
        "steps": n_steps,
        "timing": "collective kernels, GPU time" if on_gpu else "gloo collectives, time on gloo's threads",
        "wall_ms_per_step": wall / 1e3 / n_steps,
        "comm_ms_per_step": comm / 1e3 / n_steps,
        "exposed_ms_per_step": exposed / 1e3 / n_steps,
        "share": comm / wall if wall > 0 else None,
        "exposed_share": exposed / wall if wall > 0 else None,
        "share_by_rank": shares(1),
        "exposed_share_by_rank": shares(2),
        "collectives_rank0": {name: us / 1e3 / n_steps for name, us in top},  # ms per step, rank 0's names
    }


# ----------------------------------------------------------------------------------------------------
# output


def _fmt(value, spec: str = ".1f", scale: float = 1.0, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:{spec}}{suffix}"


def print_table(points: list[dict], title: str, out) -> None:
    from rich.table import Table

    table = Table(title=title)
    for col in ("world size", "parallel", "B×T per GPU", "step ms", "tokens/s", "per GPU", "efficiency", "MFU/GPU",
                "comm share (exposed)", "peak GiB", "status"):
        table.add_column(col, justify="left" if col in ("parallel", "status") else "right")
    for p in points:
        comm = "-"
        if p.get("comm_share") is not None:
            comm = f"{p['comm_share'] * 100:.1f}% ({_fmt(p.get('comm_exposed_share'), '.1f', 100, '%')})"
            by_rank = [x for x in (p.get("communication") or {}).get("share_by_rank") or () if x is not None]
            if len(by_rank) > 1:  # ranks far apart: one waits in its collectives for another
                comm += f", ranks {min(by_rank) * 100:.0f}-{max(by_rank) * 100:.0f}%"
        status = p.get("status", "?")
        if status != "ok" and p.get("error"):
            status = f"{status}: {p['error'][:80]}"
        table.add_row(
            str(p["gpus"]), str(p.get("parallel") or ("-" if p.get("status") != "ok" else "none")),
            f"{p['batch_size']}×{p['seq_len']}" if p.get("batch_size") else "-", _fmt(p.get("step_ms_median")),
            _fmt(p.get("tokens_per_second"), ",.0f"), _fmt(p.get("tokens_per_second_per_gpu"), ",.0f"),
            _fmt(p.get("scaling_efficiency"), ".1f", 100, "%"), _fmt(p.get("mfu"), ".1f", 100, "%"), comm,
            _fmt(p.get("peak_memory_gib")), status,
        )
    out.print(table)


def default_plot_path(out_dir: str, preset: str, stamp: str) -> Path:
    """Next to the bench's other outputs: <out_dir>/bench/scaling-<preset>-<time>.png."""
    return Path(out_dir) / "bench" / f"scaling-{preset}-{stamp}.png"


def write_plot(points: list[dict], path: str | Path, title: str, unit: str = "GPUs") -> Path:
    """tokens/s (with the linear ideal from the smallest world size) and scaling efficiency against world size."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("the scaling plot needs matplotlib: pip install 'redline[report]' (or --plot off)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = sorted((p for p in points if p.get("status") == "ok"), key=lambda p: p["gpus"])
    sizes = [p["gpus"] for p in ok]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    if ok:
        base = ok[0]
        left.plot(sizes, [p["tokens_per_second"] for p in ok], "o-", label="measured")
        left.plot(sizes, [base["tokens_per_second_per_gpu"] * n for n in sizes], "--", color="gray",
                  label=f"linear from {base['gpus']}")
        right.plot(sizes, [p["scaling_efficiency"] * 100 for p in ok], "o-")
    for p in points:
        if p.get("status") != "ok":
            left.axvline(p["gpus"], color="red", alpha=0.3)
            left.annotate(p.get("status", "failed"), (p["gpus"], 0), xycoords=("data", "axes fraction"),
                          color="red", rotation=90, va="bottom")
    left.set(xlabel=unit, ylabel=f"tokens/s (all {unit})", title="throughput")
    left.set_ylim(bottom=0)
    left.legend()
    right.set(xlabel=unit, ylabel="tokens/s per rank vs the smallest world size (%)", title="scaling efficiency",
              ylim=(0, max([105] + [p["scaling_efficiency"] * 105 for p in ok])))
    for ax in (left, right):
        ax.set_xticks(sorted(p["gpus"] for p in points))
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def summary_line(points: list[dict]) -> str:
    """One line per run for logs: the efficiency at the largest world size that ran."""
    ok = [p for p in points if p.get("status") == "ok" and p.get("scaling_efficiency") is not None]
    if len(ok) < 2:
        return ""
    last = max(ok, key=lambda p: p["gpus"])
    shares = [p["comm_share"] for p in ok if p.get("comm_share") is not None and p["gpus"] > 1]
    comm = f", communication {statistics.median(shares) * 100:.0f}% of the step (median)" if shares else ""
    return (f"scaling: world size {last['gpus']} reaches {last['scaling_efficiency'] * 100:.0f}% of linear "
            f"({last['tokens_per_second']:,.0f} tokens/s){comm}")
