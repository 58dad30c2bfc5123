"""`redline bench --gpus`: world sizes on CPU processes (gloo, through torchrun), each point in its own process tree;
the numbers, the failure of one point, bad input, and the communication-time arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from redline.bench import matrix, scaling
from redline.commands import bench
from redline.errors import UserError

SMALL = ["--preset", "tiny", "batch_size=2", "seq_len=32", "model.n_layer=2", "warmup=1", "steps=2", "profile_steps=2",
         "device=cpu"]


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------------
# end to end on the CPU: ranks are processes, gloo carries the gradients


@pytest.mark.slow
def test_scaling_over_one_and_two_processes(capsys, tmp_path):
    plot, out = tmp_path / "scaling.png", tmp_path / "bench.jsonl"
    # tokens_per_step is per GPU under --gpus: 128 tokens per GPU, 2 micro-batches of 2 × 32 at every world size
    assert bench.main(SMALL + ["tokens_per_step=128", "--gpus", "1,2", "--plot", str(plot), "--json-out", str(out)]) == 0
    text = capsys.readouterr().out
    report = last_json(text)
    assert "world size" in text and "efficiency" in text  # the table comes before the JSON line
    assert report["schema"] == "redline.bench" and report["version"] == bench.SCHEMA_VERSION
    assert report["gpus"] == [1, 2] and report["parallel"] == "ddp" and report["efficiency_baseline_gpus"] == 1
    one, two = report["points"]
    for n, point in ((1, one), (2, two)):
        assert point["status"] == "ok", point
        assert point["gpus"] == point["world_size"] == n and point["device"] == "cpu"
        assert point["tokens_per_second"] > 0
        # tokens/s: every rank's batch (tokens_per_step is the global batch) at the median (slowest-rank) step
        # time; per GPU is the share of one rank
        assert point["tokens_per_step"] == n * 128 and point["grad_accum"] == 2
        assert point["tokens_per_second"] == pytest.approx(point["tokens_per_step"] / (point["step_ms_median"] / 1e3))
        assert point["tokens_per_second_per_gpu"] == pytest.approx(point["tokens_per_second"] / n)
        assert 0.0 <= point["comm_exposed_share"] <= point["comm_share"] <= 1.0
        assert point["communication"]["steps"] == 2 and point["communication"]["wall_ms_per_step"] > 0
        by_rank = point["communication"]["share_by_rank"]  # each rank's share; the point's is their mean
        assert len(by_rank) == n and len(point["communication"]["exposed_share_by_rank"]) == n
        assert sum(by_rank) / n == pytest.approx(point["comm_share"], rel=0.2) and all(0 <= x <= 1 for x in by_rank)
    assert one["parallel"] is None and two["parallel"] == "ddp"  # one process runs without a DDP wrapper
    assert one["comm_share"] == 0.0 and one["communication"]["collectives_rank0"] == {}
    assert two["comm_share"] > 0 and any(name.startswith("gloo:all_reduce")
                                         for name in two["communication"]["collectives_rank0"])
    assert one["scaling_efficiency"] == 1.0
    assert two["scaling_efficiency"] == pytest.approx(two["tokens_per_second_per_gpu"] / one["tokens_per_second_per_gpu"])
    assert report["plot"] == str(plot) and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(out.read_text().strip()) == report


@pytest.mark.slow
def test_a_failing_world_size_is_reported_and_the_others_run(capsys, tmp_path):
    """A collective timeout of 1 ms cannot be met by two processes that start apart: the 2-process point fails
    in its own process tree (a real failure, nothing mocked); the 1-process point has no collective and runs."""
    code = bench.main(SMALL + ["--gpus", "2,1", "dist_timeout=0.001", "--plot", "off", f"out_dir={tmp_path}"])
    assert code == 0  # at least one world size ran
    text = capsys.readouterr().out
    report = last_json(text)
    failed, ok = report["points"]
    assert failed["gpus"] == 2 and failed["status"] == "error" and failed["exit_code"] != 0
    assert "timeout" in failed["error"].lower() or "timed out" in failed["error"].lower()
    assert "ChildFailedError" not in failed["error"]  # the rank's own error, not torchrun's summary
    assert failed["scaling_efficiency"] is None
    assert ok["gpus"] == 1 and ok["status"] == "ok" and ok["scaling_efficiency"] == 1.0
    assert report["efficiency_baseline_gpus"] == 1 and report["plot"] is None
    assert "[1/2] world size 2: error" in text and "[2/2] world size 1: ok" in text
    assert not (tmp_path / "bench").exists()  # --plot off


@pytest.mark.slow
def test_bench_under_torchrun_with_fsdp2(tmp_path):
    """`torchrun -m redline bench` times one world size; rank 0 alone prints, and parallel=fsdp2 is respected."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "redline",
           "bench", *SMALL, "parallel=fsdp2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sum(line.startswith("{") for line in proc.stdout.splitlines()) == 1  # one JSON line: rank 0's
    (point,) = last_json(proc.stdout)["points"]
    assert point["status"] == "ok" and point["world_size"] == 2 and point["parallel"] == "fsdp2"
    collectives = point["communication"]["collectives_rank0"]
    assert any(name.startswith("gloo:all_gather") for name in collectives), collectives  # parameters gathered
    assert 0 < point["comm_share"] <= 1


def test_each_world_size_gets_its_global_batch(monkeypatch):
    """--gpus keeps the per-GPU batch: the point of N processes is asked for N times the per-GPU tokens_per_step
    (tokens_per_step is the global batch inside every point, as in training)."""
    seen = []
    monkeypatch.setattr(matrix, "run_point", lambda argv, timeout, launcher, env: seen.append(argv) or {"status": "ok"})
    scaling.run_scaling(["--preset", "tiny"], [1, 2, 4], "cpu", 10, tokens_per_gpu=64)
    assert [argv[-1] for argv in seen] == ["tokens_per_step=64", "tokens_per_step=128", "tokens_per_step=256"]
    seen.clear()
    scaling.run_scaling(["--preset", "tiny"], [2], "cpu", 10)
    assert seen == [["--preset", "tiny"]]  # 0: one micro-batch per GPU, nothing to scale


# ----------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("spec, message", [
    ("1,x", "not a whole number"), ("1.5", "not a whole number"), ("-1", "not a whole number"),
    ("0,1", "at least 1"), ("1,2,1", "more than once"), ("1,,2", "separated by commas"), ("", "separated by commas"),
])
def test_gpus_list_errors(spec, message):
    with pytest.raises(UserError, match=message) as e:
        bench.main(["--preset", "tiny", f"--gpus={spec}"])
    assert "\n" not in str(e.value)


def test_gpus_parsing_and_conflicts():
    assert scaling.parse_gpus("1,2,4") == [1, 2, 4]
    assert scaling.parse_gpus(" 4 , 1 ") == [4, 1]
    with pytest.raises(UserError, match="cannot be combined"):
        bench.main(["--preset", "tiny", "--gpus", "1,2", "--matrix", "batch_size=1,2"])


def test_more_gpus_than_the_machine_has(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UserError, match="asks for 4 GPUs but this machine has 2"):
        scaling.check_available([1, 2, 4], "auto")
    scaling.check_available([1, 2], "auto")
    scaling.check_available([1, 2, 4], "cpu")  # processes on a CPU


def test_help_says_the_batch_is_per_gpu(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--gpus" in text and "--plot" in text
    assert "per GPU" in text and "torchrun" in text


# ----------------------------------------------------------------------------------------------------
# pieces


def test_interval_arithmetic():
    merged = scaling._union([(5, 7), (0, 2), (1, 3), (9, 9)])
    assert merged == [(0, 3), (5, 7)] and scaling._length(merged) == 5
    # communication [0, 10) with compute at [2, 4) and [6, 12): exposed [0, 2) and [4, 6)
    assert scaling._minus([(0, 10)], [(2, 4), (6, 12)]) == [(0, 2), (4, 6)]
    assert scaling._minus([(0, 2), (5, 8)], []) == [(0, 2), (5, 8)]
    assert scaling._minus([(0, 2)], [(-1, 3)]) == []
    assert scaling._clip([(0, 4), (5, 9), (10, 11)], 2, 6) == [(2, 4), (5, 6)]


def _event(name, start, end, device="cpu", thread=1, children=(), annotation=False):
    from types import SimpleNamespace

    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import Interval

    return SimpleNamespace(name=name, time_range=Interval(start, end), thread=thread, cpu_children=list(children),
                           device_type=DeviceType.CUDA if device == "cuda" else DeviceType.CPU,
                           is_user_annotation=annotation)


def test_communication_times_from_gpu_kernels():
    """Three step marks; the first is left out, so the window is [100, 300] (the last kernel ends at 300)."""
    mark = scaling.STEP_MARK
    events = [
        _event(mark, 0, 100), _event(mark, 100, 200), _event(mark, 200, 290),
        _event(mark, 100, 300, "cuda", annotation=True),  # the GPU copy of a record_function range: not compute
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 50, 90, "cuda"),  # before the window: left out
        _event("sm90_xmma_gemm_bf16bf16", 100, 160, "cuda"),
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 140, 180, "cuda"),  # 20 µs overlapped, 20 exposed
        _event("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 150, 170, "cuda"),  # another stream, inside the first
        _event("triton_poi_fused_add", 200, 300, "cuda"),
        _event("ncclDevKernel_AllGather_RING_LL", 250, 260, "cuda"),  # fully hidden
        _event("nccl:all_reduce", 140, 141),  # the CPU-side range of a collective: not GPU time
    ]
    t = scaling.communication_times(events, on_gpu=True)
    assert t["wall_us"] == 200 and t["comm_us"] == 50 and t["exposed_us"] == 20
    assert t["names_us"]["ncclDevKernel_AllReduce_Sum_f32_RING_LL"] == 40


def test_communication_times_from_gloo_threads():
    mark = scaling.STEP_MARK
    matmul = _event("aten::mm", 110, 150)
    events = [
        _event(mark, 0, 100), _event(mark, 100, 200, children=[matmul]), _event(mark, 200, 300),
        matmul, _event("aten::add_", 250, 260),
        _event("c10d::allreduce_", 140, 142),  # the training thread hands the collective to gloo: not compute
        _event("gloo:all_reduce", 140, 190, thread=7),  # 10 µs under the matmul, 40 exposed
        _event("gloo:all_reduce", 180, 200, thread=8),  # another gloo thread: the union counts once
        _event("aten::copy_", 185, 190, thread=7),  # on a gloo thread: part of the collective, not compute
    ]
    t = scaling.communication_times(events, on_gpu=False)
    assert t["wall_us"] == 200 and t["comm_us"] == 60 and t["exposed_us"] == 50
    with pytest.raises(RuntimeError, match="fewer than two steps"):
        scaling.communication_times(events[:1], on_gpu=False)


def test_efficiency_against_the_smallest_world_size_that_ran():
    points = [{"gpus": 1, "status": "oom"}, {"gpus": 2, "status": "ok", "tokens_per_second_per_gpu": 100.0},
              {"gpus": 4, "status": "ok", "tokens_per_second_per_gpu": 90.0}]
    assert scaling.add_efficiency(points) == 2
    assert [p["scaling_efficiency"] for p in points] == [None, 1.0, 0.9]
    assert scaling.add_efficiency([{"gpus": 1, "status": "error"}]) is None


def test_failure_line_prefers_the_ranks_own_error():
    stderr = "\n".join([
        "[W socket.cpp:469] waitForInput: poll returned 0", "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>', "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: Connection closed by peer", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "============================================================", "redline FAILED",
    ])
    assert matrix.failure_line(stderr).startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert matrix.classify_failure(stderr) == "oom"
    assert matrix.failure_line("noise\nredline bench: error: bad\nmore") == "redline bench: error: bad"
    assert matrix.failure_line("just a line") == "just a line"
    # ranks' lines prefixed by torchrun, and a summary that ends in a rule
    assert matrix.failure_line("[rank1]: Traceback (most recent call last):\n[rank1]: torch.distributed.DistStoreError: "
                               "wait timeout after 1ms\n====") == "torch.distributed.DistStoreError: wait timeout after 1ms"
    assert matrix.failure_line("exitcode  : -6 (pid: 7)\n==========\n") == "exitcode  : -6 (pid: 7)"


def test_cpu_threads_are_shared_between_ranks(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert scaling.point_env(2, "cpu") == {"OMP_NUM_THREADS": "4"}
    assert scaling.point_env(16, "cpu") == {"OMP_NUM_THREADS": "1"}
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert scaling.point_env(2, "cpu") == {}  # the user's setting wins
    assert scaling.launcher(4) == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
