"""Micro-benchmarks: GEMM TFLOP/s, device and host-to-device bandwidth, and CPU matmul GFLOP/s.

How it is timed: each benchmark first warms up for a fixed wall time (so clocks reach their steady state and
cuBLAS has picked its kernel), then runs `repeats` timings of `inner` back-to-back calls between two CUDA
events, and reports the median per-call time. Inputs are random (GPUs draw more power on random data than on
zeros, and some compress zeros), so the numbers are what a training step's GEMMs can reach, not a best case.

The bf16 GEMM is measured twice, because a GPU that runs at its power limit lowers its clocks a fraction of a
second into a long run of matrix products: the burst figure is a short run of products right after the GPU sat
idle (before the power limit bites, the clocks still at boost), the sustained figure the same products after
seconds of continuous load. Training keeps the GPU busy for hours, so MFU is taken against the sustained one.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def cuda_time_ms(fn: Callable[[], object], *, warmup_s: float = 0.3, repeats: int = 10, inner: int = 1) -> float:
    """Median milliseconds per call of `fn` on the current CUDA stream, after `warmup_s` seconds of warm-up."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    while True:
        fn()
        torch.cuda.synchronize()
        if time.perf_counter() - start >= warmup_s:
            break
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / inner)
    return statistics.median(times)


def graph_time_us(fns: list[Callable[[], object]], repeats: int = 10) -> float:
    """Median µs per call of the calls `fns`, made once each from one CUDA graph (launch overhead out, as in a
    captured decode step): the first few run on a side stream first (compiling, autotuning), the graph is
    replayed once, then `repeats` timed replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns[:3]:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1000 / len(fns))
    return statistics.median(times)


def read_under_load(fn: Callable[[], object], call_ms: float, read: Callable[[], dict], seconds: float = 0.5) -> dict:
    """Queue `seconds` worth of `fn` calls, take `read()` (NVML) halfway through, then wait for the queue to drain."""
    calls = max(1, min(1000, int(seconds * 1e3 / max(call_ms, 1e-3))))
    torch.cuda.synchronize()
    for _ in range(calls):
        fn()
    time.sleep(seconds / 2)
    reading = read()
    torch.cuda.synchronize()
    return reading


BURST_IDLE_S = 1.0  # idle before each burst: long enough for the clocks to climb back to boost
BURST_CALLS = 20  # products per burst: tens of milliseconds at 8192³, shorter than the power limit reacts
SUSTAIN_S = 3.0  # continuous load before the sustained timing: the clocks settle under the power limit


def gemm_bf16(device: torch.device, n: int = 8192, repeats: int = 10, inner: int = 20,
              bursts: int = 3) -> tuple[float, float, Callable]:
    """(burst TFLOP/s, sustained TFLOP/s, the matmul itself for a load reading) of an n×n×n bf16 matmul with
    fp32 accumulation. Burst: the best of `bursts` runs of BURST_CALLS products, each after BURST_IDLE_S idle.
    Sustained: the median of `repeats` timings of `inner` products after SUSTAIN_S seconds of load."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    out = torch.empty(n, n, device=device, dtype=torch.bfloat16)

    def fn():
        torch.matmul(a, b, out=out)

    def tflops(ms: float) -> float:
        return 2 * n**3 / (ms * 1e-3) / 1e12

    for _ in range(3):  # cuBLAS picks its kernel; a few products are far too short to heat anything
        fn()
    torch.cuda.synchronize()
    burst_ms = []
    for _ in range(bursts):
        time.sleep(BURST_IDLE_S)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(BURST_CALLS):
            fn()
        end.record()
        end.synchronize()
        burst_ms.append(begin.elapsed_time(end) / BURST_CALLS)
    sustained_ms = cuda_time_ms(fn, warmup_s=SUSTAIN_S, repeats=repeats, inner=inner)
    return tflops(min(burst_ms)), tflops(sustained_ms), fn


def gemm_fp8(device: torch.device, n: int = 8192, rowwise: bool = False, repeats: int = 10, inner: int = 10) -> float:
    """TFLOP/s of an n×n×n e4m3 × e4m3 -> bf16 `torch._scaled_mm` (tensorwise or rowwise fp32 scales, fast accum)."""
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)  # row-major (M, K)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major (K, N), as cuBLASLt wants
    if rowwise:
        scale_a = torch.ones(n, 1, device=device, dtype=torch.float32)
        scale_b = torch.ones(1, n, device=device, dtype=torch.float32)
    else:
        scale_a = scale_b = torch.ones((), device=device, dtype=torch.float32)

    def fn():
        torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16, use_fast_accum=True)

    ms = cuda_time_ms(fn, warmup_s=0.3, repeats=repeats, inner=inner)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def copy_bandwidth(device: torch.device, n_bytes: int = 2**30, repeats: int = 10, inner: int = 5) -> float:
    """Device memory bandwidth in TB/s of a device-to-device copy, counting the bytes read and the bytes written."""
    src = torch.empty(n_bytes // 4, device=device, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    ms = cuda_time_ms(lambda: dst.copy_(src), warmup_s=0.2, repeats=repeats, inner=inner)
    return 2 * n_bytes / (ms * 1e-3) / 1e12


def host_to_device_bandwidth(device: torch.device, pinned: bool, n_bytes: int = 2**28, repeats: int = 5) -> float:
    """Host-to-device copy bandwidth in GB/s from pinned (page-locked) or pageable host memory."""
    src = torch.empty(n_bytes, dtype=torch.uint8, pin_memory=pinned).fill_(1)  # fill: fault the pages in first
    dst = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    ms = cuda_time_ms(lambda: dst.copy_(src, non_blocking=pinned), warmup_s=0.1, repeats=repeats, inner=1)
    return n_bytes / (ms * 1e-3) / 1e9


def cpu_matmul_gflops(n: int = 1024, repeats: int = 5, min_repeat_s: float = 0.1) -> float:
    """GFLOP/s of an n×n×n fp32 matmul on the CPU with torch's current thread count (median of repeats)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    torch.matmul(a, b, out=out)  # warm-up: thread pool start, MKL dispatch
    start = time.perf_counter()
    torch.matmul(a, b, out=out)
    one = max(time.perf_counter() - start, 1e-6)
    inner = max(1, int(min_repeat_s / one))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            torch.matmul(a, b, out=out)
        times.append((time.perf_counter() - start) / inner)
    return 2 * n**3 / statistics.median(times) / 1e9
