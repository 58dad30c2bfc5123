"""What the machine is: device choice, datasheet peaks of common GPUs, and an environment snapshot.

MFU is reported against the detected GPU's datasheet peak (dense, no sparsity) and, when `redline doctor`
has measured one, against the measured GEMM peak. An unknown GPU gets no MFU rather than a guess.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from redline.errors import UserError


@dataclass(frozen=True)
class GPUPeak:
    name: str
    bf16_tflops: float  # dense tensor-core bf16 with fp32 accumulation
    fp8_tflops: float | None  # dense e4m3; None where the chip has no FP8 tensor cores
    memory_tbps: float  # device memory bandwidth, TB/s
    host_link_gbps: float | None = None  # host<->device link, one direction, GB/s (PCIe Gen4 x16 31.5, Gen5 x16 63)


# Matched in order against torch.cuda.get_device_name(): the first entry whose every key is in the name wins,
# so a name that contains another (GH200 ⊃ H200, GB200 ⊃ B200, L40S ⊃ L40 ⊃ L4) comes first. Case is ignored
# ("A100-PCIE-40GB" and "A100 80GB PCIe" are both seen).
# Sources: NVIDIA datasheets, dense figures (the "with sparsity" numbers halved).
PCIE4_X16_GBPS = 31.5
PCIE5_X16_GBPS = 63.0
NVLINK_C2C_GBPS = 450.0  # Grace-Hopper/Blackwell CPU<->GPU link, per direction
GPU_PEAKS: list[tuple[tuple[str, ...], GPUPeak]] = [
    (("H100", "PCIe"), GPUPeak("H100 PCIe", 756.0, 1513.0, 2.0, PCIE5_X16_GBPS)),
    (("H100", "NVL"), GPUPeak("H100 NVL", 835.0, 1671.0, 3.9, PCIE5_X16_GBPS)),
    (("H100",), GPUPeak("H100 SXM", 989.0, 1979.0, 3.35, PCIE5_X16_GBPS)),
    (("GH200",), GPUPeak("GH200", 989.0, 1979.0, 4.0, NVLINK_C2C_GBPS)),
    (("H200", "NVL"), GPUPeak("H200 NVL", 835.0, 1671.0, 4.8, PCIE5_X16_GBPS)),
    (("H200",), GPUPeak("H200", 989.0, 1979.0, 4.8, PCIE5_X16_GBPS)),
    (("GB200",), GPUPeak("GB200", 2500.0, 5000.0, 8.0, NVLINK_C2C_GBPS)),
    (("B200",), GPUPeak("B200", 2250.0, 4500.0, 8.0, PCIE5_X16_GBPS)),
    (("A100", "40GB"), GPUPeak("A100 40GB", 312.0, None, 1.555, PCIE4_X16_GBPS)),
    (("A100", "PCIe"), GPUPeak("A100 80GB PCIe", 312.0, None, 1.935, PCIE4_X16_GBPS)),
    (("A100",), GPUPeak("A100 80GB", 312.0, None, 2.039, PCIE4_X16_GBPS)),
    (("L40S",), GPUPeak("L40S", 362.0, 733.0, 0.864, PCIE4_X16_GBPS)),
    (("L40",), GPUPeak("L40", 181.0, 362.0, 0.864, PCIE4_X16_GBPS)),
    (("L4",), GPUPeak("L4", 121.0, 242.5, 0.3, PCIE4_X16_GBPS)),
    (("RTX 6000 Ada",), GPUPeak("RTX 6000 Ada", 364.2, 728.5, 0.96, PCIE4_X16_GBPS)),
    (("RTX 3090",), GPUPeak("RTX 3090", 71.0, None, 0.936, PCIE4_X16_GBPS)),
    (("RTX 4090",), GPUPeak("RTX 4090", 165.2, 330.3, 1.008, PCIE4_X16_GBPS)),
    (("RTX 5090",), GPUPeak("RTX 5090", 209.5, 419.0, 1.792, PCIE5_X16_GBPS)),
]


def lookup_peak(device_name: str) -> GPUPeak | None:
    name = device_name.lower()
    for keys, peak in GPU_PEAKS:
        if all(k.lower() in name for k in keys):
            return peak
    return None


def doctor_json_path() -> Path:
    return Path(os.environ.get("REDLINE_CACHE", Path.home() / ".cache" / "redline")) / "doctor.json"


def measured_bf16_tflops(device_name: str) -> float | None:
    """The bf16 GEMM peak `redline doctor` measured on a GPU of this name, if any."""
    path = doctor_json_path()
    try:
        report = json.loads(path.read_text())
        for gpu in report.get("gpus", []):
            if gpu.get("name") == device_name and gpu.get("bf16_gemm_tflops"):
                return float(gpu["bf16_gemm_tflops"])
    except (OSError, ValueError, AttributeError, TypeError):  # no doctor.json, or one that is not its layout
        return None
    return None


def resolve_device(requested: str, local_rank: int = 0) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise UserError("device=cuda was asked for but no CUDA GPU is visible; use device=cpu or device=auto")
    if requested in ("cuda", "auto") and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def autocast(device: torch.device, amp: torch.dtype | None) -> contextlib.AbstractContextManager:
    """torch.autocast to `amp` on the device, or nothing for plain fp32 (amp None, as autocast_dtype gives)."""
    return torch.autocast(device.type, dtype=amp) if amp else contextlib.nullcontext()


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The autocast dtype for this device and precision setting, or None for plain fp32."""
    if precision == "fp32":
        return None
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16
        if precision == "bf16":
            raise UserError("precision=bf16 but this GPU has no bf16 support; use precision=fp32")
        return None
    if precision == "bf16":
        return torch.bfloat16  # CPU bf16 autocast works, slowly; only when asked for
    return None


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment_snapshot() -> dict:
    """Versions, GPU and driver, git commit: written into every run directory."""
    from redline import __version__

    env = {
        "redline": __version__,
        "git_commit": _git_commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cpu_count": os.cpu_count(),
        "argv": sys.argv,
        "gpus": [],
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            env["gpus"].append({
                "name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1),
                "sm_count": p.multi_processor_count,
            })
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            env["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
    return env


def peak_flops(device: torch.device) -> tuple[float | None, float | None, str]:
    """(datasheet bf16 FLOP/s, measured bf16 FLOP/s from doctor.json, GPU name) for MFU; Nones where unknown."""
    if device.type != "cuda":
        return None, None, "cpu"
    name = torch.cuda.get_device_name(device)
    peak = lookup_peak(name)
    measured = measured_bf16_tflops(name)
    return (peak.bf16_tflops * 1e12 if peak else None), (measured * 1e12 if measured else None), name
