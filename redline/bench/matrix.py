"""A matrix of bench points, each run in its own process.

`--matrix batch_size=16,32 fp8=off,auto` runs every combination (4 points here). Each point is
`python -m redline bench <the same arguments> <the point's key=value>` in a fresh process, so an out-of-memory
point (or a crash, or a hang past the timeout) is reported as such and the next point starts on a clean GPU.
The child prints its JSON line last; the parent keeps it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from redline.errors import UserError

_BOOLS = {"true": "True", "false": "False", "none": "None"}


def parse_matrix(items: list[str] | tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """["batch_size=16,32", "fp8=off,auto"] -> [("batch_size", ["16", "32"]), ("fp8", ["off", "auto"])]."""
    axes: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key or not values:
            raise UserError(f"--matrix item {item!r} must look like KEY=V1,V2,... (e.g. batch_size=16,32)")
        if key in ("matrix", "json_out", "json-out"):
            raise UserError(f"--matrix cannot vary {key}")
        if any(key == k for k, _ in axes):
            raise UserError(f"--matrix names {key} twice; give all its values in one item: {key}=V1,V2")
        vals = [_BOOLS.get(v.strip().lower(), v.strip()) for v in values.split(",") if v.strip()]
        axes.append((key, vals))
    return axes


def expand(axes: list[tuple[str, list[str]]]) -> list[list[tuple[str, str]]]:
    """Every combination, the first axis varying slowest."""
    if not axes:
        return [[]]
    keys = [k for k, _ in axes]
    return [list(zip(keys, combo)) for combo in itertools.product(*(vals for _, vals in axes))]


def point_label(point: list[tuple[str, str]]) -> str:
    return " ".join(f"{k}={v}" for k, v in point) or "(base)"


def remove_option(argv: list[str], name: str, takes_value: bool = True) -> list[str]:
    """argv without `name` (and its value) in any of its spellings: --name V, --name=V, name=V."""
    flag, out, skip = f"--{name}", [], False
    alt = flag.replace("_", "-")
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in (flag, alt):
            skip = takes_value and i + 1 < len(argv) and not argv[i + 1].startswith("--")
            continue
        if arg.startswith((flag + "=", alt + "=", name + "=")):
            continue
        out.append(arg)
    return out


def child_argv(base_argv: list[str], point: list[tuple[str, str]]) -> list[str]:
    """The bench arguments of one point: the base arguments, then the point's values (the last value wins)."""
    argv = list(base_argv)
    extra: list[str] = []
    for key, value in point:
        if key == "preset":  # --preset is read before the rest: only one may be given
            argv = remove_option(argv, "preset")
            extra = ["--preset", value] + extra
        else:
            extra += [f"--{key}", value]
    return argv + extra


def last_json_line(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


_ERROR_LINE = re.compile(r"^(redline \S+: error: |[\w.]*(Error|Exception)\b)")
_RANK_PREFIX = re.compile(r"^\[(rank|default)\d+\]:\s*")


def failure_line(stderr: str) -> str | None:
    """The line of a failed point's stderr that says what went wrong: redline's own one-line error, else the first
    exception line (under torchrun the first rank to fail comes first, the other ranks' errors and torchrun's
    ChildFailedError summary after it), else the last line with words in it."""
    # torchrun may prefix each rank's lines with "[rank0]:" (or "[default0]:" with --tee/--log-dir)
    lines = [_RANK_PREFIX.sub("", line.strip()) for line in stderr.strip().splitlines() if line.strip()]
    for line in lines:
        if line.startswith("redline ") and ": error: " in line:
            return line[:500]
    for line in lines:
        if _ERROR_LINE.match(line) and "ChildFailedError" not in line:
            return line[:500]
    worded = [line for line in lines if any(c.isalnum() for c in line)]  # not a rule of "=" or "-"
    return worded[-1][:500] if worded else None


def classify_failure(stderr: str) -> str:
    text = stderr.lower()
    if "out of memory" in text or "outofmemoryerror" in text:
        return "oom"
    return "error"


def _stop(proc: subprocess.Popen) -> None:
    """Stop a point's process and everything it started (torchrun's ranks, compile workers)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_point(argv: list[str], timeout: float, launcher: Sequence[str] = (), env: dict[str, str] | None = None) -> dict:
    """Run one bench point in a child process; its result dict (status ok | oom | error | timeout | ...).

    launcher: what runs `-m redline bench` instead of plain python, such as
    ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]; env: extra environment."""
    cmd = [sys.executable, *launcher, "-m", "redline", "bench", *argv]
    env = dict(os.environ, PYTHONUNBUFFERED="1", REDLINE_BENCH_POINT="1", **(env or {}))
    start = time.perf_counter()
    # a session of its own: a timeout (or Ctrl-C here) stops the whole process tree, not only its root
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        _, stderr = proc.communicate()
        return {"status": "timeout", "error": f"stopped after {timeout:.0f} s", "stderr_tail": (stderr or "")[-2000:],
                "exit_code": proc.returncode, "wall_seconds": time.perf_counter() - start}
    except BaseException:
        _stop(proc)
        raise
    wall = time.perf_counter() - start
    report = last_json_line(stdout)
    points = report.get("points") if isinstance(report, dict) else None
    if points:
        result = dict(points[0])
        if result.get("status") != "ok":
            result.setdefault("stderr_tail", stderr[-2000:])
    else:
        result = {"status": classify_failure(stderr), "error": failure_line(stderr) or f"exit {proc.returncode}",
                  "stderr_tail": stderr[-2000:]}
    result["exit_code"] = proc.returncode
    result["wall_seconds"] = wall
    return result


def run_matrix(base_argv: list[str], points: list[list[tuple[str, str]]], timeout: float,
               on_result: Callable[[int, list[tuple[str, str]], dict], None] | None = None) -> list[dict]:
    """Run every point in sequence, each in its own process; results in order, each with its "overrides"."""
    results = []
    for i, point in enumerate(points):
        result = run_point(child_argv(base_argv, point), timeout)
        result["overrides"] = dict(point)
        results.append(result)
        if on_result:
            on_result(i, point, result)
    return results
