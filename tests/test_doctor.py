"""redline doctor: the peak table, the architecture check, the verdict rules, the precision probes' ops, and the
CPU path end to end (`redline doctor --quick` in-process: the JSON line and the doctor.json it writes)."""

import json

import pytest
import torch

from redline import cli, hardware
from redline.diagnostics import precisions
from redline.diagnostics.attention import SMALL_SHAPE, attention_backends
from redline.diagnostics.gpu_info import NVML, arch_fix, arch_supported, decode_throttle_reasons
from redline.diagnostics.verdicts import all_verdicts, worst


@pytest.mark.parametrize("device_name, expected", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA GH200 480GB", "GH200"),  # contains "H200": must not match the H200 entry
    ("NVIDIA B200", "B200"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA GeForce RTX 3090", "RTX 3090"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA GeForce RTX 5090", "RTX 5090"),
])
def test_peak_table_lookup(device_name, expected):
    peak = hardware.lookup_peak(device_name)
    assert peak is not None and peak.name == expected
    assert peak.bf16_tflops > 0 and peak.memory_tbps > 0 and peak.host_link_gbps > 0


def test_peak_table_values_and_unknown_gpu():
    h100 = hardware.lookup_peak("NVIDIA H100 80GB HBM3")
    assert (h100.bf16_tflops, h100.fp8_tflops, h100.memory_tbps) == (989.0, 1979.0, 3.35)
    assert hardware.lookup_peak("NVIDIA A100-SXM4-80GB").fp8_tflops is None  # no FP8 tensor cores
    assert hardware.lookup_peak("NVIDIA Tesla T4") is None
    assert hardware.lookup_peak("Some Future GPU") is None


@pytest.mark.parametrize("capability, arch_list, supported", [
    ((9, 0), ["sm_80", "sm_86", "sm_90"], True),
    ((12, 0), ["sm_50", "sm_80", "sm_86", "sm_90"], False),  # a Blackwell desktop GPU on a cu124 build
    ((12, 0), ["sm_90", "sm_100", "sm_120"], True),
    ((8, 6), ["sm_80"], True),  # same major: sm_80 cubins run on 8.6
    ((8, 9), ["sm_90"], False),  # a newer minor's cubin does not run on an older GPU
    ((12, 0), ["sm_90", "compute_90"], True),  # PTX is compiled by the driver for newer GPUs
    ((9, 0), ["sm_90a"], True),
    ((10, 0), ["sm_90a", "sm_90"], False),
    ((8, 0), [], False),
])
def test_arch_supported(capability, arch_list, supported):
    assert arch_supported(capability, arch_list) is supported


def test_arch_fix_names_the_build():
    assert "sm_120" in arch_fix((12, 0)) and "cu128" in arch_fix((12, 0))
    assert "sm_90" in arch_fix((9, 0))


def test_throttle_reasons_decode():
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(0x1 | 0x4) == ["gpu_idle", "sw_power_cap"]
    assert decode_throttle_reasons(0x40 | 0x8) == ["hw_slowdown", "hw_thermal_slowdown"]


def test_nvml_unavailable_is_a_reading_not_a_crash():
    nvml = NVML()
    if nvml.ok:
        pytest.skip("this machine has NVML")
    assert nvml.reason and nvml.device_count() == 0
    assert nvml.read(None)["status"] == "unavailable"


# ----------------------------------------------------------------------------------------------------
# verdict rules on hand-made reports


def gpu_report(**overrides) -> dict:
    gpu = {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "capability": "9.0",
        "torch_arch_list": ["sm_80", "sm_90"],
        "arch_in_build": True,
        "peak": {"bf16_tflops": 989.0, "fp8_tflops": 1979.0, "memory_tbps": 3.35, "host_link_gbps": 63.0},
        "nvml_idle": {
            "status": "ok",
            "throttle_reasons": ["gpu_idle"],
            "power_limit_w": 700.0,
            "power_default_limit_w": 700.0,
            "memory_used_gib": 0.5,
            "temperature_c": 35,
            "pcie_link": "Gen5 x16",
            "pcie_link_max": "Gen5 x16",
        },
        "nvml_under_load": {
            "status": "ok",
            "throttle_reasons": ["sw_power_cap"],
            "power_draw_w": 690.0,
            "power_limit_w": 700.0,
        },
        "precisions": {
            "bf16": {"by_capability": True, "status": "ok"},
            "fp8_e4m3_tensorwise": {"by_capability": True, "status": "ok"},
            "torchao_float8_tensorwise": {"by_capability": True, "status": "ok"},
        },
        "attention": {"cudnn": {"available": True}, "flash": {"available": True}},
        "bf16_gemm_tflops": 795.0,
        "copy_tbps": 3.0,
        "h2d_pinned_gbps": 53.0,
    }
    gpu.update(overrides)
    return gpu


def report(gpus, torch_cuda="12.8", nvml=None) -> dict:
    return {"versions": {"torch": "2.9.0", "torch_cuda": torch_cuda, "driver": "580.1", "driver_cuda": "13.0"},
            "host": {"torch_threads": 8, "usable_cores": 8, "physical_cores": 8},
            "nvml": nvml or {"status": "ok", "device_count": len(gpus), "device_names": [g["name"] for g in gpus]},
            "gpus": gpus}


def levels(verdicts, check_part):
    return [v.level for v in verdicts if check_part in v.check]


def test_healthy_h100_is_all_green():
    verdicts = all_verdicts(report([gpu_report()]))
    assert worst(verdicts) == "green", [v for v in verdicts if v.level != "green"]
    assert levels(verdicts, "bf16 GEMM") == ["green"]


def test_missing_architecture_is_red_with_the_fix():
    gpu = gpu_report(name="NVIDIA GeForce RTX 5090", capability="12.0", torch_arch_list=["sm_80", "sm_86", "sm_90"],
                     arch_in_build=False)
    verdicts = all_verdicts(report([gpu]))
    (red,) = [v for v in verdicts if v.level == "red"]
    assert "sm_120" in red.message and "cu128" in red.fix


def test_cpu_only_torch_next_to_a_gpu_is_red():
    nvml = {"status": "ok", "device_count": 1, "device_names": ["NVIDIA GeForce RTX 4090"]}
    verdicts = all_verdicts(report([], torch_cuda=None, nvml=nvml))
    assert worst(verdicts) == "red"
    assert any("CPU-only build" in v.message and "whl/cu128" in v.fix for v in verdicts)


def test_unknown_gpu_is_said_once():
    gpus = [gpu_report(index=i, name="NVIDIA Mystery X", peak=None) for i in range(2)]
    verdicts = all_verdicts(report(gpus))
    assert len([v for v in verdicts if "peak table" in v.check]) == 1


def test_slow_throttled_gpu_gets_yellow_and_red_with_fixes():
    gpu = gpu_report(
        bf16_gemm_tflops=400.0, nvml_under_load={"status": "ok", "throttle_reasons": ["hw_thermal_slowdown"]}
    )
    verdicts = all_verdicts(report([gpu]))
    assert levels(verdicts, "bf16 GEMM") == ["yellow"] and levels(verdicts, "throttling") == ["red"]
    assert all(v.fix for v in verdicts if v.level != "green")


def test_no_nvml_and_no_torchao_are_yellow():
    gpu = gpu_report(nvml_idle={"status": "unavailable", "reason": "nvidia-ml-py is not installed"})
    gpu["precisions"]["torchao_float8_tensorwise"] = {"by_capability": True, "status": "torchao not installed"}
    nvml = {
        "status": "unavailable",
        "reason": "nvidia-ml-py is not installed (pip install nvidia-ml-py)",
        "device_count": 0,
    }
    verdicts = all_verdicts(report([gpu], nvml=nvml))
    assert levels(verdicts, "NVML") == ["yellow"] and levels(verdicts, "torchao") == ["yellow"]


# ----------------------------------------------------------------------------------------------------
# the measuring pieces that also run on a CPU


def test_precision_ops_run_and_are_checked_on_cpu():
    cpu = torch.device("cpu")
    for name in ("tf32", "bf16", "fp16", "fp8_e4m3_tensorwise", "fp8_e5m2_e4m3_tensorwise", "fp8_e4m3_rowwise"):
        result = precisions.run_probe(name, cpu, None)
        assert result["status"] == "ok", (name, result)
        assert result["relative_error"] < 0.05


def test_capability_gate_never_calls_the_kernel(monkeypatch):
    def must_not_run(device):
        raise AssertionError("the kernel was called on a GPU that cannot run it")

    monkeypatch.setitem(precisions.PROBES, "nvfp4", must_not_run)
    monkeypatch.setitem(precisions.PROBES, "mxfp8", must_not_run)
    for name in ("nvfp4", "mxfp8"):
        result = precisions.run_probe(name, torch.device("cpu"), (9, 0))
        assert result["status"] == "not supported on this GPU" and result["by_capability"] is False


def test_a_failing_probe_is_reported_not_raised(monkeypatch):
    def broken(device):
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")

    monkeypatch.setitem(precisions.PROBES, "bf16", broken)
    result = precisions.run_probe("bf16", torch.device("cpu"), (12, 0))
    assert result["status"] == "failed" and "no kernel image" in result["detail"]


def test_attention_backends_on_cpu():
    result = attention_backends(torch.device("cpu"), SMALL_SHAPE, time_it=False)
    assert set(result) == {"cudnn", "flash", "efficient", "math"}
    assert result["math"]["available"]
    assert all(r["detail"] for r in result.values())


# ----------------------------------------------------------------------------------------------------
# the command, in-process


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_doctor_quick_cpu_json_line_and_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    out_path = tmp_path / "mine.json"
    code, out, err = run_cli(["doctor", "--quick", "--out", str(out_path)], capsys)
    assert code == 0, err
    line = json.loads(out.strip().splitlines()[-1])
    assert line["schema"] == "redline.doctor" and line["schema_version"] == 1 and line["quick"] is True
    assert line["gpus"] == []
    host = line["host"]
    for key in ("model", "logical_cores", "usable_cores", "memory_gib", "torch_threads", "cpu_capability"):
        assert key in host
    assert host["torch_threads"] >= 1 and "matmul_gflops" not in host  # --quick: no measurement
    assert line["versions"]["torch"] == torch.__version__
    assert line["versions"]["torchao"]  # a version, or "torchao not installed"
    assert line["verdicts"] and {v["level"] for v in line["verdicts"]} <= {"green", "yellow", "red"}
    assert all(v["fix"] for v in line["verdicts"] if v["level"] != "green")
    cached = json.loads((tmp_path / "cache" / "doctor.json").read_text())
    assert cached == line == json.loads(out_path.read_text())
    human = out.strip().splitlines()[:-1]  # the human report precedes the JSON line
    assert any("torch build" in row for row in human) and any("YELLOW" in row or "GREEN" in row for row in human)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_doctor_full_cpu_measures_matmul(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    code, out, err = run_cli(["doctor"], capsys)
    assert code == 0, err
    line = json.loads(out.strip().splitlines()[-1])
    assert line["quick"] is False and line["host"]["matmul_gflops"] > 0
    assert "GFLOP/s" in out


def test_quick_run_keeps_a_measured_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    measured = {"schema": "redline.doctor", "schema_version": 1,
                "gpus": [{"name": "NVIDIA H100 80GB HBM3", "bf16_gemm_tflops": 795.0}]}
    (tmp_path / "doctor.json").write_text(json.dumps(measured))
    code, out, _ = run_cli(["doctor", "--quick"], capsys)
    assert code in (0, 1)
    assert json.loads((tmp_path / "doctor.json").read_text()) == measured
    assert "does not replace measured peaks" in " ".join(out.split())
    # the contract train and bench rely on: gpus[].name and gpus[].bf16_gemm_tflops
    assert hardware.measured_bf16_tflops("NVIDIA H100 80GB HBM3") == 795.0
    assert hardware.measured_bf16_tflops("NVIDIA A100-SXM4-80GB") is None


def test_doctor_bad_gpu_index(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    code, _, err = run_cli(["doctor", "--quick", "--gpu", str(count + 3)], capsys)
    assert code == 2 and f"--gpu {count + 3}" in err and len(err.strip().splitlines()) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_doctor_full_on_gpu_feeds_the_mfu_reader(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    code, out, err = run_cli(["doctor", "--gpu", "0"], capsys)
    line = json.loads(out.strip().splitlines()[-1])
    gpu = line["gpus"][0]
    assert gpu["bf16_gemm_tflops"] > 0 and gpu["copy_tbps"] > 0
    assert hardware.measured_bf16_tflops(gpu["name"]) == gpu["bf16_gemm_tflops"]
    assert code == (1 if line["status"] == "red" else 0)
    # the burst (before the power limit bites) is at least the sustained figure, which MFU uses
    assert gpu["bf16_gemm_burst_tflops"] >= 0.98 * gpu["bf16_gemm_tflops"]
    assert gpu["mfu_peak"] == "bf16_gemm_tflops (sustained)"


def test_gpu_sections_render(capsys):
    """The GPU tables and verdict lines, from a report shaped like a real one (probes run here on the CPU)."""
    from rich.console import Console

    from redline.commands.doctor import print_report
    from redline.diagnostics.verdicts import all_verdicts

    cpu = torch.device("cpu")
    gpu = gpu_report()
    reading = {"status": "ok", "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980, "memory_clock_mhz": 2619,
               "memory_clock_max_mhz": 2619, "power_draw_w": 120.5, "power_limit_w": 700.0,
               "power_default_limit_w": 700.0, "temperature_c": 34, "throttle_reasons": ["gpu_idle"],
               "pcie_link": "Gen5 x16", "pcie_link_max": "Gen5 x16", "memory_used_gib": 0.4}
    gpu.update(sm_count=132, l2_mib=50.0, memory_gib=79.1, nvml_idle=reading,
               nvml_under_load={**reading, "power_draw_w": 690.0, "throttle_reasons": ["sw_power_cap"]},
               precisions=precisions.probe_all(cpu, (9, 0)),
               attention=attention_backends(cpu, SMALL_SHAPE, time_it=False),
               fp8_gemm_tflops=1430.0, h2d_pageable_gbps=20.0, errors={"fp8_rowwise_gemm_tflops": "RuntimeError: x"},
               bf16_gemm_burst_tflops=841.0,
               percent_of_datasheet={"bf16_gemm_tflops": 80.4, "copy_tbps": 89.6})
    rep = report([gpu])
    rep["host"] = {"model": "Test CPU", "logical_cores": 8, "physical_cores": 4, "usable_cores": 8, "memory_gib": 64.0,
                   "torch_threads": 4, "torch_interop_threads": 4, "omp_num_threads": None, "cpu_capability": "AVX2",
                   "mkl": True, "mkldnn": True, "openmp": True}
    rep["verdicts"] = [v.to_dict() for v in all_verdicts(rep)]
    print_report(rep, Console(width=200, highlight=False))
    out = capsys.readouterr().out
    for text in ("NVIDIA H100 80GB HBM3", "GEMM load", "sw_power_cap", "nvfp4", "not supported on this GPU",
                 "math", "795.0", "80%", "failed: RuntimeError", "GREEN"):
        assert text in out, text
    # both GEMM figures, and which one MFU is taken against
    burst = next(line for line in out.splitlines() if "bf16 GEMM 8192³ burst" in line)
    sustained = next(line for line in out.splitlines() if "bf16 GEMM 8192³ sustained (MFU uses it)" in line)
    assert "841.0" in burst and "795.0" in sustained


def test_no_save_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    code, out, err = run_cli(["doctor", "--quick", "--no-save"], capsys)
    assert code in (0, 1), err
    assert not (tmp_path / "doctor.json").exists()
    assert json.loads(out.strip().splitlines()[-1])["quick"] is True
