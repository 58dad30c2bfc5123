"""What the machine is: GPU properties, software versions, whether this torch build carries kernels for the
GPU, NVML readings (clocks, power, temperature, throttle reasons) and the host CPU.

Everything here only reads; nothing allocates GPU memory except what `torch.cuda` needs to start. A reading
that cannot be taken is the string "unavailable" (with the reason where there is one), never a crash.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
import sys

import torch

UNAVAILABLE = "unavailable"

# The oldest CUDA toolkit that can build kernels for a compute capability (what a torch wheel must be built with).
_MIN_CUDA_FOR_ARCH = {(12, 0): "12.8", (10, 0): "12.8", (9, 0): "11.8", (8, 9): "11.8", (8, 6): "11.1", (8, 0): "11.0"}


def package_version(name: str) -> str | None:
    """The installed version of a distribution, without importing it (importing triton or torchao takes seconds)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def software_versions(nvml: "NVML | None" = None) -> dict:
    """torch, its CUDA runtime, cuDNN, NCCL, Triton and torchao versions, and the driver's (NVML, else nvidia-smi)."""
    nccl = None
    if torch.cuda.is_available():
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
        except (RuntimeError, AttributeError, TypeError):
            nccl = None
    versions = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": nccl,
        "triton": package_version("triton") or package_version("pytorch-triton"),
        "torchao": package_version("torchao") or "torchao not installed",
        "nvidia_ml_py": package_version("nvidia-ml-py"),
        "driver": None,
        "driver_cuda": None,
    }
    if nvml is not None and nvml.ok:
        versions["driver"], versions["driver_cuda"] = nvml.driver_version(), nvml.driver_cuda_version()
    if versions["driver"] is None:
        versions["driver"] = _nvidia_smi_driver()
    return versions


def _nvidia_smi_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def nvidia_smi_gpu_names() -> list[str]:
    """GPU names from `nvidia-smi -L`: the fallback when NVML cannot be read from Python."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [m.group(1).strip() for m in re.finditer(r"^GPU \d+: (.+?) \(UUID", out.stdout, flags=re.M)]


# ----------------------------------------------------------------------------------------------------
# does this torch build have kernels for this GPU?


def arch_name(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


def _parse_arch(entry: str) -> tuple[str, int, int, str] | None:
    """'sm_90a' -> ('sm', 9, 0, 'a'); 'compute_120' -> ('compute', 12, 0, ''). Minor is the last digit."""
    m = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", entry)
    if not m:
        return None
    digits = m.group(2)
    return m.group(1), int(digits[:-1]), int(digits[-1]), m.group(3)


def arch_supported(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether a build compiled for `arch_list` (torch.cuda.get_arch_list()) runs on a GPU of `capability`.

    A cubin sm_XY runs on X.Z for Z >= Y (same major); an arch-specific sm_XYa only on X.Y exactly; PTX
    (compute_XY) is compiled by the driver for any capability >= X.Y.
    """
    major, minor = capability
    for entry in arch_list:
        parsed = _parse_arch(entry)
        if parsed is None:
            continue
        kind, a_major, a_minor, suffix = parsed
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
        if kind == "sm" and a_major == major and (a_minor == minor if suffix == "a" else a_minor <= minor):
            return True
    return False


def arch_fix(capability: tuple[int, int]) -> str:
    """How to get a torch build with kernels for this capability."""
    need = _MIN_CUDA_FOR_ARCH.get(capability) or ("12.8" if capability >= (10, 0) else "12.6")
    index = "cu128" if need == "12.8" else "cu126"
    return (f"install a PyTorch build compiled for {arch_name(capability)} (CUDA >= {need}), e.g. "
            f"`pip install --upgrade torch --index-url https://download.pytorch.org/whl/{index}`")


# ----------------------------------------------------------------------------------------------------
# GPU properties


def gpu_properties(index: int) -> dict:
    p = torch.cuda.get_device_properties(index)
    capability = (p.major, p.minor)
    l2 = getattr(p, "L2_cache_size", None)
    arch_list = torch.cuda.get_arch_list()
    return {
        "index": index,
        "name": p.name,
        "capability": f"{p.major}.{p.minor}",
        "memory_gib": round(p.total_memory / 2**30, 2),
        "sm_count": p.multi_processor_count,
        "l2_mib": round(l2 / 2**20, 1) if l2 else None,
        "uuid": str(getattr(p, "uuid", "")) or None,
        "torch_arch_list": arch_list,
        "arch_in_build": arch_supported(capability, arch_list),
    }


# ----------------------------------------------------------------------------------------------------
# NVML

# bit -> (name, whether it means something is wrong). Names follow nvidia-smi's "Clocks Event Reasons".
_THROTTLE_BITS = [
    (0x1, "gpu_idle", False),
    (0x2, "applications_clocks_setting", False),
    (0x4, "sw_power_cap", False),
    (0x8, "hw_slowdown", True),
    (0x10, "sync_boost", False),
    (0x20, "sw_thermal_slowdown", True),
    (0x40, "hw_thermal_slowdown", True),
    (0x80, "hw_power_brake_slowdown", True),
    (0x100, "display_clock_setting", False),
]
BAD_THROTTLE_REASONS = {name for _, name, bad in _THROTTLE_BITS if bad}


def decode_throttle_reasons(mask: int) -> list[str]:
    return [name for bit, name, _ in _THROTTLE_BITS if mask & bit]


class NVML:
    """A thin reader over nvidia-ml-py (`import pynvml`). `ok` is False, with `reason`, when NVML cannot start."""

    def __init__(self):
        self.ok, self.reason, self._pynvml = False, "", None
        try:
            import pynvml
        except ImportError:
            self.reason = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound / DriverNotLoaded / ...: no NVIDIA driver here
            self.reason = f"NVML did not start: {e}"
            return
        self.ok, self._pynvml = True, pynvml

    def close(self) -> None:
        if self.ok:
            try:
                self._pynvml.nvmlShutdown()
            except Exception:
                pass
            self.ok = False

    def _call(self, fn: str, *args):
        try:
            return getattr(self._pynvml, fn)(*args)
        except Exception:
            return None

    def device_count(self) -> int:
        return (self._call("nvmlDeviceGetCount") or 0) if self.ok else 0

    def device_names(self) -> list[str]:
        names = []
        for i in range(self.device_count()):
            handle = self._call("nvmlDeviceGetHandleByIndex", i)
            name = self._call("nvmlDeviceGetName", handle) if handle is not None else None
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names

    def driver_version(self) -> str | None:
        v = self._call("nvmlSystemGetDriverVersion")
        return v.decode() if isinstance(v, bytes) else v

    def driver_cuda_version(self) -> str | None:
        """The newest CUDA version the driver supports, e.g. '12.8'."""
        v = self._call("nvmlSystemGetCudaDriverVersion")
        return f"{v // 1000}.{v % 1000 // 10}" if isinstance(v, int) and v > 0 else None

    def handle(self, index: int, uuid: str | None = None):
        """The NVML handle of torch device `index`: by UUID (CUDA_VISIBLE_DEVICES may renumber), else by index."""
        if not self.ok:
            return None
        if uuid:
            h = self._call("nvmlDeviceGetHandleByUUID", uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            if h is not None:
                return h
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def read(self, handle) -> dict:
        """Clocks, power, temperature, throttle reasons, PCIe link, memory in use; "unavailable" per missing field."""
        if handle is None:
            return {"status": UNAVAILABLE, "reason": self.reason or "no NVML handle for this GPU"}
        p = self._pynvml

        def value(fn, *args, scale=1.0, digits=1):
            v = self._call(fn, handle, *args)
            return UNAVAILABLE if v is None else round(v * scale, digits)

        reasons_mask = self._call("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if reasons_mask is None:
            reasons_mask = self._call("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        memory = self._call("nvmlDeviceGetMemoryInfo", handle)
        gen, width = (self._call("nvmlDeviceGetCurrPcieLinkGeneration", handle),
                      self._call("nvmlDeviceGetCurrPcieLinkWidth", handle))
        max_gen, max_width = (self._call("nvmlDeviceGetMaxPcieLinkGeneration", handle),
                              self._call("nvmlDeviceGetMaxPcieLinkWidth", handle))
        return {
            "status": "ok",
            "sm_clock_mhz": value("nvmlDeviceGetClockInfo", p.NVML_CLOCK_SM, digits=0),
            "sm_clock_max_mhz": value("nvmlDeviceGetMaxClockInfo", p.NVML_CLOCK_SM, digits=0),
            "memory_clock_mhz": value("nvmlDeviceGetClockInfo", p.NVML_CLOCK_MEM, digits=0),
            "memory_clock_max_mhz": value("nvmlDeviceGetMaxClockInfo", p.NVML_CLOCK_MEM, digits=0),
            "power_draw_w": value("nvmlDeviceGetPowerUsage", scale=1e-3),
            "power_limit_w": value("nvmlDeviceGetEnforcedPowerLimit", scale=1e-3),
            "power_default_limit_w": value("nvmlDeviceGetPowerManagementDefaultLimit", scale=1e-3),
            "temperature_c": value("nvmlDeviceGetTemperature", p.NVML_TEMPERATURE_GPU, digits=0),
            "throttle_reasons": UNAVAILABLE if reasons_mask is None else decode_throttle_reasons(reasons_mask),
            "pcie_link": f"Gen{gen} x{width}" if gen and width else UNAVAILABLE,
            "pcie_link_max": f"Gen{max_gen} x{max_width}" if max_gen and max_width else UNAVAILABLE,
            "memory_used_gib": UNAVAILABLE if memory is None else round(memory.used / 2**30, 2),
        }


# ----------------------------------------------------------------------------------------------------
# the host


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def _physical_cores() -> int | None:
    try:
        cores, physical, core = set(), None, None
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("physical id"):
                    physical = line.split(":", 1)[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":", 1)[1].strip()
                elif not line.strip():
                    if core is not None:
                        cores.add((physical, core))
                    physical, core = None, None
        if core is not None:
            cores.add((physical, core))
        return len(cores) or None
    except OSError:
        return None


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def cpu_info() -> dict:
    """CPU model, cores (logical, physical, usable by this process), memory, and how torch uses them."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        capability = None
    return {
        "model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": _physical_cores(),
        "usable_cores": usable,
        "memory_gib": _memory_gib(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cpu_capability": capability,
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "openmp": torch.backends.openmp.is_available(),
        "torch_cuda_build": torch.version.cuda is not None,
    }
