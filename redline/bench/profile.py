"""Profile a few training steps: a Chrome/Perfetto trace, and kernel time grouped by kind.

Groups, matched on the kernel's name in this order: communication (NCCL's kernels, gloo's and c10d's
collectives under DDP and FSDP2, including the time a rank waits in them for the others), attention (flash,
cuDNN SDPA, memory-efficient, fmha), gemm (cuBLAS, CUTLASS, nvjet, Triton matmul templates, FP8 scaled_mm),
norm (LayerNorm/RMSNorm, including Inductor kernels that fuse one), optimizer (fused AdamW, foreach/multi-tensor
kernels such as the gradient norm), other (everything else: elementwise, casts, cross-entropy, copies). On a CPU
there are no kernels, so the same grouping is applied to the operators' own CPU time.

Open the trace at https://ui.perfetto.dev or chrome://tracing (a .json.gz path is written gzipped).
"""

from __future__ import annotations

import gzip
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

GROUPS: tuple[tuple[str, re.Pattern], ...] = (
    ("communication", re.compile(r"nccl|gloo:|c10d::|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all",
                                 re.IGNORECASE)),
    ("attention", re.compile(r"flash|fmha|sdpa|attention|attn|_efficient_attention|cudnn.*(fprop|bprop|dgrad)",
                             re.IGNORECASE)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|matmul|scaled_mm|wgmma|triton_tem|mm_kernel|"
                        r"aten::(mm|addmm|bmm|linear|_scaled_mm)$|sm\d\d_", re.IGNORECASE)),
    ("norm", re.compile(r"layer_norm|layernorm|rms_norm|rmsnorm|group_norm|batch_norm|rsqrt", re.IGNORECASE)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach|lpnorm|sgd|muon|\[optimizer\]", re.IGNORECASE)),
)
GROUP_NAMES = tuple(name for name, _ in GROUPS) + ("other",)


def kernel_group(name: str) -> str:
    """The group of a kernel or operator name: attention, gemm, norm, optimizer or other."""
    for group, pattern in GROUPS:
        if pattern.search(name):
            return group
    return "other"


def summarize(rows: list[tuple[str, float, int]], n_steps: int, top: int = 15) -> dict:
    """rows: (name, total microseconds, calls). Milliseconds per step by group, and the top names."""
    n = max(n_steps, 1)
    groups = dict.fromkeys(GROUP_NAMES, 0.0)
    for name, us, _ in rows:
        groups[kernel_group(name)] += us / 1e3 / n
    total = sum(groups.values())
    ranked = sorted(rows, key=lambda r: r[1], reverse=True)[:top]
    return {
        "steps": n_steps,
        "total_ms_per_step": total,
        "groups_ms_per_step": groups,
        "groups_fraction": {g: (ms / total if total else 0.0) for g, ms in groups.items()},
        "top": [{"name": name, "group": kernel_group(name), "ms_per_step": us / 1e3 / n, "calls_per_step": calls / n}
                for name, us, calls in ranked],
    }


_RANGES = ("ProfilerStep", "train_step_", "Optimizer.")  # ranges around operators and kernels, not work of their own


def _in_optimizer(evt) -> bool:
    """Whether a CPU operator ran inside an optimizer step or gradient clipping (its names say nothing of it)."""
    parent = evt.cpu_parent
    while parent is not None:
        if parent.name.startswith("Optimizer.") or "clip_grad" in parent.name:
            return True
        parent = parent.cpu_parent
    return False


def _rows(prof, device: torch.device) -> list[tuple[str, float, int]]:
    from torch.autograd import DeviceType

    if device.type == "cuda":
        # the step and optimizer ranges also appear on the GPU's timeline (as user annotations) and span the
        # kernels inside them: leave them out, or the kernels would be counted twice
        return [(evt.key, float(evt.self_device_time_total), int(evt.count)) for evt in prof.key_averages()
                if evt.device_type == DeviceType.CUDA and evt.self_device_time_total > 0
                and not getattr(evt, "is_user_annotation", False) and not evt.key.startswith(_RANGES)]
    totals: dict[str, list[float]] = {}
    for evt in prof.events():
        if evt.device_type != DeviceType.CPU or evt.name.startswith(_RANGES):
            continue
        us = evt.self_cpu_time_total
        if us <= 0:
            continue
        name = evt.name
        if _in_optimizer(evt) and kernel_group(name) != "optimizer":
            name = f"{name} [optimizer]"  # the [optimizer] tag puts it in the optimizer group
        entry = totals.setdefault(name, [0.0, 0])
        entry[0] += us
        entry[1] += 1
    return [(name, us, calls) for name, (us, calls) in totals.items()]


def _host_top(prof, n_steps: int, top: int = 12) -> list[dict]:
    """CPU operators (and compiled-graph calls) by their own host time per step, the largest first."""
    from torch.autograd import DeviceType

    n = max(n_steps, 1)
    rows = [(evt.key, evt.self_cpu_time_total, evt.count) for evt in prof.key_averages()
            if evt.device_type == DeviceType.CPU and evt.self_cpu_time_total > 0 and not evt.key.startswith(_RANGES)]
    rows.sort(key=lambda r: r[1], reverse=True)
    return [{"name": name, "ms_per_step": us / 1e3 / n, "calls_per_step": calls / n} for name, us, calls in rows[:top]]


def export_trace(prof, path: str | Path) -> Path:
    """Write the Chrome/Perfetto JSON trace; gzipped when the path ends in .gz."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix != ".gz":
        prof.export_chrome_trace(str(path))
        return path
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(plain))
        with plain.open("rb") as src, gzip.open(path, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
    return path


def _new_profile(device: torch.device):
    """A torch.profiler recording CPU operators, and CUDA kernels on a GPU."""
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else []))


def _profiled(fn: Callable[[], object], device: torch.device):
    """Run fn under the profiler (CPU operators, and CUDA kernels on a GPU, waited for); the profile."""
    with _new_profile(device) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return prof


def _summary(prof, n_steps: int, wall_ms: float, trace_path: str | Path | None, device: torch.device) -> dict:
    """The grouped summary of n_steps profiled steps (profile_steps' format); the trace written if asked."""
    summary = summarize(_rows(prof, device), n_steps)
    summary["timing"] = "gpu kernel time" if device.type == "cuda" else "cpu operator self time"
    summary["wall_ms_per_step"] = wall_ms  # under the profiler (its own host cost included)
    if device.type == "cuda":  # where the host's time goes: a step whose wall time far exceeds its kernels waits on it
        summary["host_top"] = _host_top(prof, n_steps)
    if trace_path:
        summary["trace"] = str(export_trace(prof, trace_path))
    return summary


def profile_steps(step: Callable[[], object], n_steps: int, trace_path: str | Path | None,
                  device: torch.device) -> dict:
    """Run `step` n_steps times under the profiler; write the trace; return the grouped summary."""
    from torch.profiler import record_function

    def steps():
        for i in range(n_steps):
            with record_function(f"train_step_{i}"):
                step()

    start = time.perf_counter()
    prof = _profiled(steps, device)
    return _summary(prof, n_steps, (time.perf_counter() - start) * 1e3 / max(n_steps, 1), trace_path, device)


class StepsProfiler:
    """The profiler around steps that a loop runs itself (`redline train profile_steps=N`): start(), each step
    inside step_range(i), then stop(n_steps, trace_path) -> profile_steps' summary."""

    def __init__(self, device: torch.device):
        self.device = device
        self._prof = None
        self._start = 0.0

    def start(self) -> None:
        self._prof = _new_profile(self.device)
        self._prof.__enter__()
        self._start = time.perf_counter()

    def step_range(self, i: int):
        """A named range around step i (left out of the kernel counts, as profile_steps' are)."""
        from torch.profiler import record_function

        return record_function(f"train_step_{i}")

    def stop(self, n_steps: int, trace_path: str | Path | None) -> dict:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall_ms = (time.perf_counter() - self._start) * 1e3 / max(n_steps, 1)
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        return _summary(prof, n_steps, wall_ms, trace_path, self.device)


def profile_difference(run: Callable[[], object], base: Callable[[], object], n_steps: int,
                       trace_path: str | Path | None, device: torch.device) -> dict:
    """Kernel time of `run` minus that of `base`, per step: for work that cannot be cut into steps from the
    outside, such as the decode steps of one generate call (run: N tokens, base: 1 token, n_steps: N - 1).
    Kernels inside CUDA graphs are counted. The trace written is that of `run`."""
    totals: dict[str, list[float]] = {}
    for sign, fn in ((-1, base), (1, run)):
        prof = _profiled(fn, device)
        for name, us, calls in _rows(prof, device):
            entry = totals.setdefault(name, [0.0, 0])
            entry[0] += sign * us
            entry[1] += sign * calls
    rows = [(name, us, calls) for name, (us, calls) in totals.items() if us > 0 and calls > 0]
    summary = summarize(rows, n_steps)
    summary["kernels_per_step"] = sum(calls for _, _, calls in rows) / max(n_steps, 1)
    summary["timing"] = "gpu kernel time" if device.type == "cuda" else "cpu operator self time"
    if trace_path:
        summary["trace"] = str(export_trace(prof, trace_path))
    return summary
