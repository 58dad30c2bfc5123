"""`redline doctor`: what this machine can do, and what is wrong with it.

    redline doctor              # everything, ~20-40 s on a GPU
    redline doctor --quick      # no micro-benchmarks: properties, versions, NVML, precision probes
    redline doctor --out my.json

Prints the GPU(s), software versions, NVML readings, which precisions and attention backends work, measured
GEMM and bandwidth peaks next to the datasheet, and green / yellow / red verdicts with their fixes; then the
whole report as one JSON line. The report is also written to doctor.json (see `redline.hardware.doctor_json_path`),
from which `train` and `bench` take the measured bf16 peak for MFU. Exit status: 1 if any verdict is red, else 0.

The bf16 GEMM has two figures (diagnostics/microbench.py): the burst one, a short run of products before the power
limit lowers the clocks, and the sustained one after seconds of load. MFU uses the sustained one
(`bf16_gemm_tflops`), what a long training run can keep; the burst one is `bf16_gemm_burst_tflops`.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from redline.config import parse
from redline.errors import UserError

DESCRIPTION = (
    "What this machine can do and what is wrong with it: GPUs, versions, precisions, measured peaks, verdicts."
)
SCHEMA = "redline.doctor"
SCHEMA_VERSION = 1


@dataclass
class DoctorConfig:
    quick: bool = False
    """Skip the micro-benchmarks (GEMMs, bandwidths, attention timings, CPU matmul); tiny precision probes still run."""
    out: str | None = None
    """Also write the report to this JSON file."""
    save: bool = True
    """Write the report to the cache file (REDLINE_CACHE or ~/.cache/redline, doctor.json) that train and bench read
    the measured peak from. A --quick run never replaces a cached report that has measurements."""
    gpu: int | None = None
    """Examine only this GPU index (None: every visible GPU)."""


# ----------------------------------------------------------------------------------------------------
# measuring


def _error_text(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def examine_gpu(index: int, nvml, quick: bool, progress) -> dict:
    """Properties, NVML, precisions, attention and (unless quick) micro-benchmarks of one GPU."""
    from redline.diagnostics import microbench
    from redline.diagnostics.attention import SMALL_SHAPE, TYPICAL_SHAPE, attention_backends
    from redline.diagnostics.gpu_info import gpu_properties
    from redline.diagnostics.precisions import probe_all
    from redline.hardware import lookup_peak

    gpu = gpu_properties(index)
    handle = nvml.handle(index, gpu["uuid"])
    gpu["nvml_idle"] = nvml.read(handle)  # before this process allocates anything on the GPU
    peak = lookup_peak(gpu["name"])
    gpu["peak"] = asdict(peak) if peak else None
    gpu["errors"] = {}
    if not gpu["arch_in_build"]:
        gpu["skipped"] = "no kernels for this GPU in this torch build: nothing was run on it"
        return gpu
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    capability = tuple(int(v) for v in gpu["capability"].split("."))

    progress(f"GPU {index}: precision probes")
    gpu["precisions"] = probe_all(device, capability)
    progress(f"GPU {index}: attention backends")
    try:
        gpu["attention"] = attention_backends(device, SMALL_SHAPE if quick else TYPICAL_SHAPE, time_it=not quick)
    except Exception as e:  # e.g. out of memory on a small GPU
        gpu["errors"]["attention"] = _error_text(e)
    torch.cuda.empty_cache()
    if quick:
        return gpu

    def bench(key: str, label: str, fn):
        progress(f"GPU {index}: {label}")
        try:
            gpu[key] = round(fn(), 2)
        except Exception as e:
            gpu["errors"][key] = _error_text(e)
        torch.cuda.empty_cache()

    def bf16():
        burst, sustained, matmul = microbench.gemm_bf16(device)
        gpu["bf16_gemm_burst_tflops"] = round(burst, 2)
        ms = 2 * 8192**3 / (sustained * 1e12) * 1e3  # one call, to size the queue of the load reading
        gpu["nvml_under_load"] = microbench.read_under_load(matmul, ms, lambda: nvml.read(handle))
        return sustained

    bench("bf16_gemm_tflops", "bf16 GEMM 8192³ (burst and sustained)", bf16)
    if gpu.get("bf16_gemm_tflops") is not None:
        gpu["mfu_peak"] = "bf16_gemm_tflops (sustained)"
    if capability >= (8, 9):
        bench("fp8_gemm_tflops", "fp8 e4m3 GEMM 8192³ (tensorwise)", lambda: microbench.gemm_fp8(device))
        bench(
            "fp8_rowwise_gemm_tflops",
            "fp8 e4m3 GEMM 8192³ (rowwise)",
            lambda: microbench.gemm_fp8(device, rowwise=True),
        )
    total = torch.cuda.get_device_properties(index).total_memory
    copy_bytes = min(2**30, total // 16)
    bench("copy_tbps", "device copy", lambda: microbench.copy_bandwidth(device, copy_bytes))
    bench("h2d_pinned_gbps", "host→device pinned", lambda: microbench.host_to_device_bandwidth(device, pinned=True))
    bench(
        "h2d_pageable_gbps", "host→device pageable", lambda: microbench.host_to_device_bandwidth(device, pinned=False)
    )
    gpu["percent_of_datasheet"] = {}
    for key, value in datasheet_values(gpu["peak"]).items():
        if gpu.get(key) is not None and value:
            gpu["percent_of_datasheet"][key] = round(100 * gpu[key] / value, 1)
    return gpu


def datasheet_values(peak: dict | None) -> dict[str, float | None]:
    """The datasheet figure each measurement is compared with (None where the table has none)."""
    peak = peak or {}
    return {"bf16_gemm_tflops": peak.get("bf16_tflops"), "bf16_gemm_burst_tflops": peak.get("bf16_tflops"),
            "fp8_gemm_tflops": peak.get("fp8_tflops"),
            "fp8_rowwise_gemm_tflops": peak.get("fp8_tflops"), "copy_tbps": peak.get("memory_tbps"),
            "h2d_pinned_gbps": peak.get("host_link_gbps"), "h2d_pageable_gbps": peak.get("host_link_gbps")}


def build_report(cfg: DoctorConfig, progress=lambda text: None) -> dict:
    from redline import __version__
    from redline.diagnostics import microbench
    from redline.diagnostics.gpu_info import NVML, cpu_info, nvidia_smi_gpu_names, software_versions
    from redline.diagnostics.verdicts import all_verdicts, worst

    started = time.perf_counter()
    nvml = NVML()
    try:
        report: dict = {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "redline": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "quick": cfg.quick,
            "host": cpu_info(),
            "versions": software_versions(nvml),
            "nvml": {"status": "ok" if nvml.ok else "unavailable", "reason": nvml.reason},
            "gpus": [],
        }
        names = nvml.device_names() if nvml.ok else nvidia_smi_gpu_names()
        report["nvml"].update(device_count=len(names), device_names=names)
        if not cfg.quick:
            progress("CPU matmul")
            report["host"]["matmul_gflops"] = round(microbench.cpu_matmul_gflops(), 1)
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if cfg.gpu is not None and not 0 <= cfg.gpu < count:
            raise UserError(f"--gpu {cfg.gpu}: this machine has {count} visible CUDA GPU(s)"
                            + (f"; use 0..{count - 1}" if count else ""))
        for index in range(count) if cfg.gpu is None else [cfg.gpu]:
            report["gpus"].append(examine_gpu(index, nvml, cfg.quick, progress))
    finally:
        nvml.close()
    verdicts = all_verdicts(report)
    report["verdicts"] = [v.to_dict() for v in verdicts]
    report["status"] = worst(verdicts)
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    return report


# ----------------------------------------------------------------------------------------------------
# saving and printing


def _has_measurements(report: dict) -> bool:
    return bool(report.get("host", {}).get("matmul_gflops")) or any(
        g.get("bf16_gemm_tflops") for g in report.get("gpus", [])
    )


def save_report(report: dict, cfg: DoctorConfig) -> tuple[list[Path], str | None]:
    """Write the report where asked; returns (paths written, a note when the cache was left as it was)."""
    from redline.durable import write_atomic
    from redline.hardware import doctor_json_path

    paths, note = [], None
    if cfg.out:
        paths.append(Path(cfg.out))
    if cfg.save:
        cache = doctor_json_path()
        previous = None
        try:
            previous = json.loads(cache.read_text())
        except (OSError, ValueError):
            pass
        if not _has_measurements(report) and isinstance(previous, dict) and _has_measurements(previous):
            note = f"kept the measured report at {cache} (a --quick run does not replace measured peaks)"
        else:
            paths.append(cache)
    text = json.dumps(report, indent=2, default=str)
    for path in paths:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text + "\n")  # train and bench read it: never a half-written one
        except OSError as e:
            raise UserError(f"cannot write the report to {path}: {e.strerror}; pass --out to a writable path "
                            f"or --no-save") from None
    return paths, note


_STYLE = {"green": "green", "yellow": "yellow", "red": "bold red"}


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, list):
        return ", ".join(value) or "none"
    return str(value)


def print_report(report: dict, console) -> None:
    _print_host(report["host"], report["versions"], console)
    if report["gpus"]:
        _print_gpus(report["gpus"], console)
        for g in report["gpus"]:
            _print_gpu_checks(g, console)
    for v in report["verdicts"]:
        style = _STYLE[v["level"]]
        fix = f" → fix: {v['fix']}" if v.get("fix") else ""
        console.print(f"[{style}]{v['level'].upper():<6}[/{style}] {v['check']}: {v['message']}{fix}", highlight=False)


def _print_host(host: dict, versions: dict, console) -> None:
    from rich.table import Table

    table = Table(title="host", show_header=False)
    table.add_row(
        "CPU",
        f"{host['model']} | {host['logical_cores']} logical / {host['physical_cores'] or '?'} physical "
        f"cores, {host['usable_cores']} usable | {host['cpu_capability'] or ''}",
    )
    table.add_row("memory", f"{_fmt(host['memory_gib'])} GiB")
    table.add_row("torch threads", f"{host['torch_threads']} (interop {host['torch_interop_threads']}, "
                  f"OMP_NUM_THREADS={host['omp_num_threads'] or 'unset'})")
    if host.get("matmul_gflops"):
        table.add_row("CPU matmul", f"{host['matmul_gflops']:,.1f} GFLOP/s (fp32 1024³)")
    yes_no = {True: "yes", False: "no"}
    table.add_row("torch build", f"{versions['torch']} | CUDA {versions['torch_cuda'] or 'none (CPU-only build)'} | "
                  f"MKL {yes_no[host['mkl']]} | oneDNN {yes_no[host['mkldnn']]} | OpenMP {yes_no[host['openmp']]}")
    for key in ("cudnn", "nccl", "triton", "torchao", "driver", "driver_cuda", "nvidia_ml_py", "python", "platform"):
        table.add_row(key, _fmt(versions.get(key)))
    console.print(table)


def _print_gpus(gpus: list[dict], console) -> None:
    """The GPUs' properties, and NVML's readings idle and under the GEMM load."""
    from rich.table import Table

    table = Table(
        "GPU", "name", "capability", "memory GiB", "SMs", "L2 MiB", "kernels in torch build", title="GPUs"
    )
    for g in gpus:
        table.add_row(str(g["index"]), g["name"], g["capability"], _fmt(g["memory_gib"]), str(g["sm_count"]),
                      _fmt(g["l2_mib"]), "yes" if g["arch_in_build"] else "[bold red]NO")
    console.print(table)
    table = Table("GPU", "when", "SM clock MHz", "mem clock MHz", "power W", "limit W", "temp °C",
                  "throttle reasons", "PCIe link", title="NVML")
    for g in gpus:
        for when, key in (("idle", "nvml_idle"), ("GEMM load", "nvml_under_load")):
            r = g.get(key)
            if not r:
                continue
            if r.get("status") != "ok":
                table.add_row(str(g["index"]), when, f"unavailable: {r.get('reason', '')}", "", "", "", "", "", "")
                continue
            table.add_row(str(g["index"]), when, f"{_fmt(r['sm_clock_mhz'], 0)} / {_fmt(r['sm_clock_max_mhz'], 0)}",
                          f"{_fmt(r['memory_clock_mhz'], 0)} / {_fmt(r['memory_clock_max_mhz'], 0)}",
                          _fmt(r["power_draw_w"]), _fmt(r["power_limit_w"]), _fmt(r["temperature_c"], 0),
                          _fmt(r["throttle_reasons"]), f"{r['pcie_link']} (max {r['pcie_link_max']})")
    console.print(table)


def _print_gpu_checks(g: dict, console) -> None:
    """One GPU's precision checks, attention backends and micro-benchmarks against its datasheet."""
    from rich.table import Table

    if "precisions" in g:
        table = Table(
            "precision", "capability allows", "tiny op", "detail", title=f"GPU {g['index']} precisions"
        )
        for name, r in g["precisions"].items():
            status = r.get("status", "")
            style = "green" if status == "ok" else ("dim" if status.startswith("not supported") else "yellow")
            detail = r.get("detail") or (
                f"rel. error {r['relative_error']}" if "relative_error" in r else r.get("fix", "")
            )
            table.add_row(name, "yes" if r.get("by_capability") else "no", f"[{style}]{status}", detail)
        console.print(table)
    if g.get("attention"):
        table = Table(
            "backend", "available", "fwd+bwd ms", "detail", title=f"GPU {g['index']} attention (SDPA)"
        )
        for name, r in g["attention"].items():
            table.add_row(
                name, "yes" if r["available"] else "[yellow]no", _fmt(r["fwd_bwd_ms"], 3), r["detail"]
            )
        console.print(table)
    rows = [
        ("bf16 GEMM 8192³ burst (after idle)", "bf16_gemm_burst_tflops", "TFLOP/s"),
        ("bf16 GEMM 8192³ sustained (MFU uses it)", "bf16_gemm_tflops", "TFLOP/s"),
        ("fp8 GEMM 8192³ tensorwise", "fp8_gemm_tflops", "TFLOP/s"),
        ("fp8 GEMM 8192³ rowwise", "fp8_rowwise_gemm_tflops", "TFLOP/s"),
        ("device copy (read+write)", "copy_tbps", "TB/s"),
        ("host→device pinned", "h2d_pinned_gbps", "GB/s"),
        ("host→device pageable", "h2d_pageable_gbps", "GB/s"),
    ]
    if any(g.get(key) is not None or key in g.get("errors", {}) for _, key, _ in rows):
        datasheet = datasheet_values(g.get("peak"))
        table = Table("benchmark", "measured", "unit", "datasheet", "% of datasheet",
                      title=f"GPU {g['index']} micro-benchmarks (median, CUDA events)")
        for label, key, unit in rows:
            if key in g.get("errors", {}):
                table.add_row(label, f"[yellow]failed: {g['errors'][key]}", unit, "", "")
            elif g.get(key) is not None:
                pct = g.get("percent_of_datasheet", {}).get(key)
                digits = 2 if unit == "TB/s" else 1
                table.add_row(label, _fmt(g[key], digits), unit, _fmt(datasheet.get(key), digits),
                              f"{pct:.0f}%" if pct else "-")
        console.print(table)


def main(argv: list[str]) -> int:
    from rich.console import Console

    # booleans take values (`--quick True`); the bare flags `--quick` and `--no-save` work too
    argv = [part for arg in argv for part in (["--save", "False"] if arg == "--no-save" else [arg])]
    cfg = parse(DoctorConfig, argv, prog="redline doctor", description=DESCRIPTION)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    errors = Console(stderr=True, highlight=False)
    report = build_report(cfg, progress=lambda text: errors.print(f"[dim]doctor: {text}…"))
    print_report(report, console)
    paths, note = save_report(report, cfg)
    for path in paths:
        console.print(f"wrote {path}")
    if note:
        console.print(note)
    console.print(f"doctor took {report['elapsed_s']:.1f} s")
    sys.stdout.flush()
    print(json.dumps(report, default=str), flush=True)
    return 1 if report["status"] == "red" else 0
