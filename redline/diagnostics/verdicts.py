"""Green / yellow / red verdict lines from a doctor report; every yellow or red line carries its fix.

A pure function of the report dict (the same dict that is written to doctor.json), so each rule can be tested
with a hand-made report on any machine.

red     redline cannot use this GPU as it is (no kernels for its architecture, a CPU-only torch next to an
        NVIDIA GPU, a basic bf16 matmul that fails, hardware slowdown).
yellow  it works, but something costs speed or information (throttling, a low measured peak, no NVML, an
        unknown GPU, no torchao for FP8).
green   checked and fine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from redline.diagnostics.gpu_info import BAD_THROTTLE_REASONS, UNAVAILABLE, arch_fix, arch_name

Level = Literal["green", "yellow", "red"]
_ORDER = {"green": 0, "yellow": 1, "red": 2}

# thresholds below which a measured peak is called out (fractions of the datasheet figure)
# each is well below what a healthy GPU measures (BENCHMARKS.md has measured figures), so only a real problem
# trips it: a sustained bf16 GEMM runs at the power limit, under the datasheet's boost-clock figure
LOW_GEMM_FRACTION = 0.60
LOW_COPY_FRACTION = 0.70
LOW_HOST_LINK_FRACTION = 0.50
BUSY_MEMORY_GIB = 2.0
HOT_IDLE_C = 85


@dataclass
class Verdict:
    level: Level
    check: str
    message: str
    fix: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def worst(verdicts: list[Verdict]) -> Level:
    return max((v.level for v in verdicts), key=_ORDER.__getitem__, default="green")


def _capability(gpu: dict) -> tuple[int, int]:
    major, minor = gpu["capability"].split(".")
    return int(major), int(minor)


def _number(value) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def host_verdicts(report: dict) -> list[Verdict]:
    out: list[Verdict] = []
    versions, host, nvml = report["versions"], report["host"], report["nvml"]
    nvml_count = nvml.get("device_count", 0) or 0
    if not report["gpus"]:
        if nvml_count > 0:
            names = ", ".join(nvml.get("device_names", [])) or f"{nvml_count} GPU(s)"
            if versions.get("torch_cuda") is None:
                out.append(Verdict(
                    "red", "torch build", f"NVML sees {names}, but torch {versions['torch']} is a CPU-only build: "
                    f"everything would run on the CPU, hundreds of times slower",
                    "install a CUDA build: "
                    "`pip install --upgrade torch --index-url https://download.pytorch.org/whl/cu128`"))
            else:
                driver_cuda = versions.get("driver_cuda") or "unknown"
                out.append(Verdict(
                    "red", "CUDA", f"NVML sees {names}, but torch (built for CUDA {versions['torch_cuda']}) cannot use "
                    f"them; the driver {versions.get('driver') or ''} supports CUDA up to {driver_cuda}",
                    f"update the NVIDIA driver, or install a torch build for CUDA <= {driver_cuda}; "
                    f"also check CUDA_VISIBLE_DEVICES"))
        else:
            out.append(Verdict("yellow", "GPU", "no NVIDIA GPU found: CPU report only; training on the CPU is "
                               "practical for the `tiny` preset", "use an NVIDIA GPU for the larger presets"))
        threads, usable = host.get("torch_threads"), host.get("usable_cores")
        physical = host.get("physical_cores") or usable
        if threads and usable and threads < min(usable, physical or usable):
            out.append(Verdict("yellow", "CPU threads", f"torch uses {threads} threads but {min(usable, physical)} "
                               f"cores are available", f"set OMP_NUM_THREADS={min(usable, physical)}"))
        elif threads:
            out.append(Verdict("green", "CPU threads", f"torch uses {threads} threads on {usable} usable cores"))
    if nvml.get("status") != "ok" and report["gpus"]:
        out.append(Verdict("yellow", "NVML", f"NVML unavailable ({nvml.get('reason', '')}): clocks, power, "
                           f"temperature and throttle reasons say \"unavailable\"",
                           "pip install nvidia-ml-py" if "not installed" in nvml.get("reason", "")
                           else "check that the NVIDIA driver is loaded (nvidia-smi)"))
    return out


def gpu_verdicts(gpu: dict, versions: dict, seen_unknown: set[str]) -> list[Verdict]:
    out: list[Verdict] = []
    name, tag = gpu["name"], f"GPU {gpu['index']}"
    cap = _capability(gpu)
    if not gpu["arch_in_build"]:
        out.append(Verdict(
            "red", f"{tag} kernels",
            f"torch {versions['torch']} has kernels for {', '.join(gpu['torch_arch_list']) or 'no GPU'}, none of which "
            f"runs on {name} ({arch_name(cap)}): every CUDA op fails, and a device=auto run would not use the GPU",
            arch_fix(cap)))
        return out  # everything below is a consequence
    kernels = f"torch {versions['torch']} has kernels for {name} ({arch_name(cap)})"
    out.append(Verdict("green", f"{tag} kernels", kernels))

    precisions = gpu.get("precisions", {})
    bf16 = precisions.get("bf16", {})
    if bf16.get("by_capability") and bf16.get("status") != "ok":
        out.append(Verdict("red", f"{tag} bf16", f"a tiny bf16 matmul did not work: {bf16.get('status')} "
                           f"{bf16.get('detail', '')}".strip(), "reinstall torch for this GPU and check `nvidia-smi`"))
    fp8 = precisions.get("fp8_e4m3_tensorwise", {})
    if fp8.get("by_capability") and fp8.get("status") != "ok":
        out.append(
            Verdict(
                "yellow",
                f"{tag} fp8",
                f"an FP8 matmul (torch._scaled_mm) did not work: {fp8.get('status')} {fp8.get('detail', '')}".strip(),
                "upgrade torch (FP8 needs CUDA >= 12.1 builds)",
            )
        )
    ao = precisions.get("torchao_float8_tensorwise", {})
    if ao.get("by_capability") and ao.get("status") == "torchao not installed":
        out.append(Verdict("yellow", f"{tag} torchao", "this GPU has FP8 tensor cores, but torchao is not installed: "
                           "FP8 training is unavailable", "pip install torchao"))

    if gpu.get("peak") is None and name not in seen_unknown:
        seen_unknown.add(name)
        out.append(Verdict("yellow", f"{tag} peak table", f"{name} is not in the datasheet peak table: percentages of "
                           f"peak and MFU against the datasheet are left out (measured peaks are still recorded)",
                           "add the GPU to GPU_PEAKS in redline/hardware.py"))

    out += _nvml_verdicts(gpu, tag)
    out += _benchmark_verdicts(gpu, tag)

    attention = gpu.get("attention", {})
    fast = [b for b in ("cudnn", "flash") if attention.get(b, {}).get("available")]
    if attention and cap >= (8, 0) and not fast:
        out.append(Verdict("yellow", f"{tag} attention", "neither the cuDNN nor the flash attention backend runs here: "
                           "attention falls back to the slower efficient or math kernels",
                           "upgrade torch to a recent CUDA build"))
    elif fast:
        out.append(Verdict("green", f"{tag} attention", f"fast attention backends available: {', '.join(fast)}"))
    return out


def _nvml_verdicts(gpu: dict, tag: str) -> list[Verdict]:
    out: list[Verdict] = []
    idle, load = gpu.get("nvml_idle", {}), gpu.get("nvml_under_load", {})
    if idle.get("status") != "ok":
        return out
    for when, reading in (("idle", idle), ("under load", load)):
        reasons = reading.get("throttle_reasons")
        if not isinstance(reasons, list):
            continue
        bad = [r for r in reasons if r in BAD_THROTTLE_REASONS]
        if bad:
            hardware = [r for r in bad if r.startswith("hw_")]
            out.append(
                Verdict(
                    "red" if hardware else "yellow",
                    f"{tag} throttling",
                    f"clocks held down {when}: {', '.join(bad)}",
                    "check cooling, airflow and power cables; `nvidia-smi -q -d PERFORMANCE` shows the reasons",
                )
            )
        elif when == "under load" and "sw_power_cap" in reasons:
            out.append(
                Verdict(
                    "green",
                    f"{tag} power",
                    f"power-capped under full GEMM load at "
                    f"{reading.get('power_draw_w')} W of {reading.get('power_limit_w')} W (normal for GEMM)",
                )
            )
    limit, default = _number(idle.get("power_limit_w")), _number(idle.get("power_default_limit_w"))
    if limit and default and limit < 0.95 * default:
        out.append(
            Verdict(
                "yellow",
                f"{tag} power limit",
                f"power limit {limit:.0f} W is below the default {default:.0f} W",
                f"sudo nvidia-smi -i {gpu['index']} -pl {default:.0f}",
            )
        )
    used = _number(idle.get("memory_used_gib"))
    if used is not None and used > BUSY_MEMORY_GIB:
        out.append(Verdict("yellow", f"{tag} memory", f"{used:.1f} GiB of GPU memory was in use before doctor started",
                           "stop the other processes (`nvidia-smi` lists them); they also share the compute"))
    temperature = _number(idle.get("temperature_c"))
    if temperature is not None and temperature >= HOT_IDLE_C:
        out.append(Verdict("yellow", f"{tag} temperature", f"{temperature:.0f} °C at idle",
                           "check cooling and airflow; a hot GPU throttles under load"))
    return out


def _benchmark_verdicts(gpu: dict, tag: str) -> list[Verdict]:
    out: list[Verdict] = []
    peak, idle = gpu.get("peak") or {}, gpu.get("nvml_idle", {})
    link = f"{idle.get('pcie_link', UNAVAILABLE)}, max {idle.get('pcie_link_max', UNAVAILABLE)}"
    checks = [  # (label, measured key, datasheet key, unit, fraction below which it is low, fix)
        ("bf16 GEMM", "bf16_gemm_tflops", "bf16_tflops", "TFLOP/s", LOW_GEMM_FRACTION,
         "check the clocks, power limit and throttle reasons above; another process may share the GPU"),
        ("device copy", "copy_tbps", "memory_tbps", "TB/s", LOW_COPY_FRACTION,
         "check the memory clock above (`nvidia-smi -q -d CLOCK`)"),
        ("host→device (pinned)", "h2d_pinned_gbps", "host_link_gbps", "GB/s", LOW_HOST_LINK_FRACTION,
         f"the GPU may sit in a slower or narrower slot (NVML link: {link}): check the slot, riser and BIOS PCIe "
         f"settings"),
    ]
    for label, key, peak_key, unit, low, fix in checks:
        measured, datasheet = _number(gpu.get(key)), _number(peak.get(peak_key))
        if measured is None or datasheet is None:
            continue
        fraction = measured / datasheet
        digits = 2 if unit == "TB/s" else 1
        text = f"{label} {measured:,.{digits}f} {unit} = {fraction:.0%} of the datasheet {datasheet:,.{digits}f}"
        out.append(Verdict("yellow", f"{tag} {label}", text + " (low)", fix) if fraction < low
                   else Verdict("green", f"{tag} {label}", text))
    return out


def all_verdicts(report: dict) -> list[Verdict]:
    seen_unknown: set[str] = set()
    out = host_verdicts(report)
    for gpu in report["gpus"]:
        out += gpu_verdicts(gpu, report["versions"], seen_unknown)
    return out
