"""The processes of a sweep's runs and the GPU memory they hold: each run in a process group of its own that
dies with the sweep, an orphan of a killed sweep stopped before its directory is reused, the next run started only
once the GPU memory of the last is free again (NVML), the error line of a run's log, and one sweep per directory
(an exclusive lock)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from redline.errors import UserError

GPU_RELEASE_TIMEOUT = 60.0
ERROR_LINE = re.compile(r"^(?:[\w.]*(?:Error|Exception|Interrupt)\b.*|redline \w+: error: .*|Killed.*)$")


def die_with_parent() -> None:  # runs in the child before exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: a killed sweep may leave its current run going
        pass


def raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def stop_orphan(status_path: Path) -> None:
    """Runs left going by a sweep that was killed outright: stop them before their directories are reused."""
    try:
        status = json.loads(status_path.read_text())
    except (OSError, json.JSONDecodeError):
        return
    if not isinstance(status, dict):
        return
    children = status.get("children")
    if not isinstance(children, list):  # a status written before runs could go several at once
        children = [{"pid": status.get("child_pid"), "run_id": status.get("running")}]
    for child in children:
        if isinstance(child, dict):
            _stop_child(child.get("pid"), child.get("run_id"))


def _stop_child(child, run_id) -> None:
    if not (isinstance(child, int) and child > 1 and isinstance(run_id, str) and run_id):
        return
    try:
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return
    if run_id in cmdline:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child, signal.SIGKILL)
        for _ in range(100):
            if not Path(f"/proc/{child}").exists():
                break
            time.sleep(0.1)


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def visible_gpus(count: int) -> list[str]:
    """The CUDA device ids of `count` GPUs (0: all) for runs that each take one: the first of those
    CUDA_VISIBLE_DEVICES lists, else of the machine's (NVML's numbering, as nvidia-smi's). A UserError when there
    are fewer."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [d.strip() for d in listed.split(",") if d.strip()]
        if any(d.startswith("-") for d in ids):  # CUDA stops at the first invalid id
            ids = ids[:[d.startswith("-") for d in ids].index(True)]
        where = f"CUDA_VISIBLE_DEVICES={listed!r}"
    else:
        nvml = _nvml()
        try:
            ids = [str(i) for i in range(nvml.nvmlDeviceGetCount())] if nvml is not None else []
        except Exception:
            ids = []
        where = "NVML" if nvml is not None else "NVML found no NVIDIA driver"
    if count < 0:
        raise UserError(f"--gpus {count}: give how many GPUs to use, 1 or more (0: every visible one)")
    if not ids:
        raise UserError(f"--gpus {count}: no GPU is visible here ({where}); leave --gpus out to run one run at a time")
    if count > len(ids):
        raise UserError(f"--gpus {count}: only {len(ids)} GPU(s) are visible ({where}); give --gpus {len(ids)} or "
                        f"fewer")
    return ids[:count] if count else ids


def _handles(nvml, devices: list[str] | None) -> list:
    """NVML handles of `devices` (CUDA ids as visible_gpus gives them: indices or UUIDs), or of every GPU."""
    if devices is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    return [nvml.nvmlDeviceGetHandleByIndex(int(d)) if d.isdigit() else nvml.nvmlDeviceGetHandleByUUID(d)
            for d in devices]


def gpu_memory_used(devices: list[str] | None = None) -> list[int] | None:
    """Bytes in use on each GPU of `devices` (all: None) (NVML), or None without one."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        return [nvml.nvmlDeviceGetMemoryInfo(h).used for h in _handles(nvml, devices)]
    except Exception:
        return None


def wait_for_gpu_release(pid: int, baseline: list[int] | None, timeout: float = GPU_RELEASE_TIMEOUT,
                         devices: list[str] | None = None) -> bool:
    """Wait until the run's process holds no GPU memory and usage is back near where it was before it, on
    `devices` (all: None; a run on a GPU of its own is waited for there alone, while other runs go on beside
    it)."""
    if baseline is None:
        return True
    nvml = _nvml()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            handles = _handles(nvml, devices)
            pids = {p.pid for h in handles for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)}
            used = [nvml.nvmlDeviceGetMemoryInfo(h).used for h in handles]
        except Exception:
            return True
        if pid not in pids and all(u <= b + (512 << 20) for u, b in zip(used, baseline)):
            return True
        time.sleep(0.5)
    return False


def log_tail_text(path: Path, size: int = 16384) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def error_line(log_tail: str) -> str:
    """The line of a run's console output that says why it stopped (the last exception or error line)."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if ERROR_LINE.match(line):
            return line[:500]
    return lines[-1][:500] if lines else ""


class SweepLock:
    def __init__(self, path: Path):
        self.path = path
        self.file = None

    def __enter__(self):
        import fcntl

        self.file = open(self.path, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.file.seek(0)
            owner = self.file.read().strip() or "?"
            self.file.close()
            raise UserError(f"another `redline sweep` (pid {owner}) is running in {self.path.parent}; "
                            f"wait for it or stop it first") from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(str(os.getpid()))
        self.file.flush()
        return self

    def __exit__(self, *exc):
        if self.file is not None:
            self.file.close()
