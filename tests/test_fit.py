"""The micro-batch search: the real search code driven by a fake memory model, real training steps on the CPU,
the gradient-accumulation arithmetic, and bad input to `redline fit`."""

import math

import pytest
import torch

from redline import cli
from redline.config import TrainConfig, parse
from redline.errors import UserError
from redline.training.fit import (TrainingStepProbe, batch_grid, find_max_batch, gradient_accumulation,
                                  is_out_of_memory, search_max_batch)

GIB = 2**30


class FakeGPU:
    """A memory model: a micro-batch of b needs base + per_sequence × b bytes at its peak; above `capacity` the
    run raises a CUDA out-of-memory error, and the failed step's tensors stay allocated (`leaked`) until the
    search frees them, just as they would in the caching allocator."""

    def __init__(self, base: int, per_sequence: int, capacity: int):
        self.base, self.per_sequence, self.capacity = base, per_sequence, capacity
        self.leaked = 0
        self.calls: list[tuple[int, int]] = []  # (batch, bytes still leaked when the probe started)

    def need(self, batch: int) -> int:
        return self.base + self.per_sequence * batch

    def run(self, batch: int):
        self.calls.append((batch, self.leaked))
        peak = self.leaked + self.need(batch)
        if peak > self.capacity:
            self.leaked += self.need(batch) // 2
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {self.per_sequence} bytes")
        return peak, 1000.0 * batch

    def free(self):
        self.leaked = 0

    def true_largest(self, grid, limit):
        fitting = [b for b in grid if self.need(b) <= min(limit, self.capacity)]
        return max(fitting) if fitting else None


@pytest.mark.parametrize("capacity_gib, per_sequence_mib", [(80, 700), (80, 1500), (24, 300), (40, 17), (80, 60000)])
def test_search_finds_the_true_largest_grid_point(capacity_gib, per_sequence_mib):
    gpu = FakeGPU(base=6 * GIB, per_sequence=per_sequence_mib * 2**20, capacity=capacity_gib * GIB)
    grid = batch_grid(1024)
    limit = int(0.9 * capacity_gib * GIB)
    result = search_max_batch(gpu.run, limit, grid, gpu.free)
    expected = gpu.true_largest(grid, limit)
    assert result.batch_size == expected
    assert len(result.points) <= math.ceil(math.log2(len(grid) + 1))  # a binary search, not a scan
    assert all(leaked == 0 for _, leaked in gpu.calls)  # every out-of-memory was freed before the next probe
    if expected is not None and expected != grid[-1]:  # the grid point above the answer was tried and failed
        above = grid[grid.index(expected) + 1]
        assert any(p.batch_size == above and not p.fits for p in result.points)
    if expected is not None:
        best = result.best_point
        assert best.fits and best.peak_bytes == gpu.need(expected) and best.tokens_per_second == 1000.0 * expected


def test_search_without_freeing_would_go_wrong():
    # the fake's leak is real enough to matter: a search that never frees stops too low
    gpu = FakeGPU(base=6 * GIB, per_sequence=700 * 2**20, capacity=80 * GIB)
    grid, limit = batch_grid(1024), 72 * GIB
    assert search_max_batch(gpu.run, limit, grid, lambda: None).batch_size < gpu.true_largest(grid, limit)


def test_over_the_limit_is_not_a_fit():
    # the GPU has room (capacity 80 GiB) but the memory fraction allows only 40 GiB
    gpu = FakeGPU(base=4 * GIB, per_sequence=GIB, capacity=80 * GIB)
    result = search_max_batch(gpu.run, 40 * GIB, batch_grid(128), gpu.free)
    assert result.batch_size == 32  # 4 + 32 = 36 GiB fits; 48 would need 52
    statuses = {p.batch_size: p.status for p in result.points}
    assert "over_limit" in statuses.values()


def test_nothing_fits_and_everything_fits():
    gpu = FakeGPU(base=100 * GIB, per_sequence=GIB, capacity=80 * GIB)
    nothing = search_max_batch(gpu.run, 72 * GIB, batch_grid(64), gpu.free)
    assert nothing.batch_size is None and nothing.best_point is None
    assert [p.batch_size for p in nothing.points][-1] == 1  # it went all the way down
    roomy = FakeGPU(base=GIB, per_sequence=2**20, capacity=80 * GIB)
    everything = search_max_batch(roomy.run, 72 * GIB, batch_grid(64), roomy.free)
    assert everything.batch_size == 64 and everything.at_grid_top


def test_a_custom_grid_is_sorted_and_deduplicated():
    gpu = FakeGPU(base=0, per_sequence=GIB, capacity=30 * GIB)
    result = search_max_batch(gpu.run, 30 * GIB, [40, 8, 24, 8, 16, 32], gpu.free)
    assert result.grid == [8, 16, 24, 32, 40] and result.batch_size == 24


def test_other_errors_are_not_swallowed():
    def broken(batch):
        raise ValueError("a bug, not a memory problem")

    with pytest.raises(ValueError):
        search_max_batch(broken, GIB, [1, 2, 4])


def test_out_of_memory_recognition():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory."))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))


def test_batch_grid():
    assert batch_grid(64) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    assert batch_grid(100) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96]
    assert batch_grid(1) == [1]
    with pytest.raises(UserError):
        batch_grid(0)


@pytest.mark.parametrize("max_batch, seq_len, tokens_per_step, expected", [
    (48, 2048, 524288, (32, 8)),  # 256 sequences: 48 does not divide them, 32 does
    (1000, 1024, 524288, (512, 1)),  # the global batch is smaller than what fits
    (24, 1024, 524288, (16, 32)),
    (7, 1000, 21000, (7, 3)),
    (5, 1024, 0, (5, 1)),  # no global batch asked for: one micro-batch per step
])
def test_gradient_accumulation(max_batch, seq_len, tokens_per_step, expected):
    micro, accum = gradient_accumulation(max_batch, seq_len, tokens_per_step)
    assert (micro, accum) == expected
    if tokens_per_step:
        assert micro * accum * seq_len == tokens_per_step


def test_gradient_accumulation_needs_a_multiple_of_seq_len():
    with pytest.raises(UserError, match="not a multiple of seq_len"):
        gradient_accumulation(8, 1024, 1000)


def tiny_config() -> TrainConfig:
    return parse(TrainConfig, ["--preset", "tiny", "seq_len=32", "model.n_layer=2", "compile=False"],
                 prog="t", description="t")


def test_real_training_steps_on_cpu_drive_the_search():
    """The CPU cannot report peak memory, so the memory number comes from a fake model while the real
    training steps (forward, backward, clipping, optimizer) run at every probed micro-batch."""
    torch.manual_seed(0)
    probe = TrainingStepProbe(tiny_config(), torch.device("cpu"), steps=2)
    before = probe.model.lm_head.weight.detach().clone()
    fake = FakeGPU(base=GIB, per_sequence=GIB, capacity=4 * GIB)

    def run(batch):
        peak, tokens_per_second = probe(batch)  # the real steps
        assert peak is None and tokens_per_second > 0
        return fake.run(batch)

    def free():
        probe.free()
        fake.free()

    result = search_max_batch(run, 4 * GIB, [1, 2, 3, 4], free)
    assert result.batch_size == 3  # 1 + 3 = 4 GiB; 4 would need 5
    assert [p.batch_size for p in result.points] == [2, 3, 4]
    assert not torch.equal(before, probe.model.lm_head.weight)  # the optimizer really stepped
    probe.close()


def test_find_max_batch_needs_a_gpu():
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        find_max_batch(tiny_config(), torch.device("cpu"))
    with pytest.raises(UserError, match=r"memory_fraction must be in \(0, 1\]"):
        find_max_batch(tiny_config(), torch.device("cpu"), memory_fraction=1.2)


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.mark.parametrize("fraction", ["0", "1.5", "-0.2"])
def test_cli_rejects_memory_fraction_outside_0_1(fraction, capsys):
    code, _, err = run_cli(["fit", "--preset", "tiny", f"memory_fraction={fraction}"], capsys)
    assert code == 2 and "memory_fraction must be in (0, 1]" in err and len(err.strip().splitlines()) == 1


def test_cli_checkpointing_levels(capsys):
    code, _, err = run_cli(["fit", "--preset", "tiny", "--checkpointing", "none", "sometimes"], capsys)
    assert code == 2
    assert "--checkpointing sometimes: choose among none, selective, full" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cli_without_gpu_says_so(capsys):
    code, _, err = run_cli(["fit", "--preset", "tiny"], capsys)
    assert code == 2 and "needs a CUDA GPU" in err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fit_on_gpu_finds_a_fitting_batch(capsys):
    import json

    code, out, err = run_cli(["fit", "--preset", "tiny", "seq_len=256", "--grid", "1", "2", "4", "8", "16"], capsys)
    assert code == 0, err
    record = json.loads(out.strip().splitlines()[-1])
    assert record["batch_size"] in (1, 2, 4, 8, 16) and record["tokens_per_second"] > 0


def test_cli_report_and_json_line_on_a_fake_gpu(capsys, monkeypatch):
    """The command's table, accumulation plan and JSON line, with the real search on the fake memory model
    standing in for the GPU (the GPU path itself is exercised by scripts/gpu/doctor_fit.sh)."""
    import json
    from types import SimpleNamespace

    import redline.commands.fit as fit_command

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU 80GB")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=80 * GIB))
    searched = []

    def fake_find_max_batch(cfg, device, *, memory_fraction, grid, steps, on_point):
        gpu = FakeGPU(base=8 * GIB, per_sequence=GIB, capacity=80 * GIB)
        searched.append(cfg)
        return search_max_batch(gpu.run, int(memory_fraction * 80 * GIB), grid, gpu.free, on_point)

    monkeypatch.setattr(fit_command, "find_max_batch", fake_find_max_batch)
    argv = ["fit", "--preset", "modern-124m", "seq_len=2048", "memory_fraction=0.5", "--checkpointing", "none", "full"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    record = json.loads(out.strip().splitlines()[-1])
    # 8 + b GiB <= 40 GiB: b = 32 on the default grid; 524288 tokens = 256 sequences of 2048 -> 32 × 8
    assert record["batch_size"] == 32 and record["seq_len"] == 2048 and record["preset"] == "modern-124m"
    level = record["levels"][0]
    assert (level["train_batch_size"], level["grad_accum"]) == (32, 8)
    assert level["peak_memory_gib"] == 40.0 and record["tokens_per_second"] == 32000.0
    assert any(p["status"] == "oom" for p in level["points"])
    assert 95e6 < record["params"] < 105e6  # modern-124m trains with its head tied to the embedding
    assert [c.activation_checkpointing for c in searched] == ["none", "full"]
    assert "micro-batch" in out and "accumulation steps" in out
