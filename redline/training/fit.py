"""Find the largest micro-batch that fits in GPU memory, by running real training steps.

How it works:
- Candidates come from a grid (1, 2, 3, 4, 6, 8, 12, 16, 24, ...: powers of two and the points halfway
  between them) and the limit is memory_fraction × the GPU's memory.
- A binary search over the grid probes one micro-batch at a time: `steps` real training steps (forward,
  backward, gradient clipping, optimizer step) on random tokens, with the caching allocator capped at the
  limit (torch.cuda.set_per_process_memory_fraction). A probe fits when nothing runs out of memory and the peak
  reserved memory stays within the limit. An out-of-memory error is caught, its memory freed, and the search
  goes on.
- Memory grows with the micro-batch, so about log2(len(grid)) probes find the largest grid point that fits;
  the grid point above it was probed too and did not fit (unless the answer is the top of the grid).

The search (`search_max_batch`) sees only a function micro-batch -> (peak bytes, tokens/s) that may raise an
out-of-memory error: the tests drive it with a fake memory model, a GPU with real steps (`TrainingStepProbe`).
`find_max_batch(cfg)` puts the two together for `redline fit` and `redline train batch_size=auto`. Under
torchrun each rank searches on its own GPU: take the minimum over ranks before using the answer.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Literal, Sequence

import torch

from redline.config import TrainConfig
from redline.errors import UserError

DEFAULT_MEMORY_FRACTION = 0.9
DEFAULT_MAX_BATCH = 1024

# a probe: micro-batch -> (peak bytes, or None where memory cannot be measured; tokens per second)
RunSteps = Callable[[int], tuple[int | None, float | None]]


def batch_grid(max_batch: int = DEFAULT_MAX_BATCH) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, ...: powers of two and the points halfway between, up to max_batch."""
    if max_batch < 1:
        raise UserError(f"max_batch must be at least 1, got {max_batch}")
    grid, power = [1], 2
    while power <= max_batch:
        if power * 3 // 4 > grid[-1]:
            grid.append(power * 3 // 4)
        grid.append(power)
        power *= 2
    if power * 3 // 4 <= max_batch and power * 3 // 4 > grid[-1]:
        grid.append(power * 3 // 4)
    return grid


def validate_memory_fraction(fraction: float) -> None:
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise UserError(f"memory_fraction must be in (0, 1], got {fraction}; e.g. memory_fraction=0.9 keeps 10% spare")


def is_out_of_memory(error: BaseException) -> bool:
    """A CUDA out-of-memory, including the ones cuBLAS and cuDNN report as allocation failures."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and (
        "out of memory" in text.lower() or "CUBLAS_STATUS_ALLOC_FAILED" in text or "CUDNN_STATUS_ALLOC_FAILED" in text
    )


@dataclass
class FitPoint:
    batch_size: int
    status: Literal["fits", "over_limit", "oom"]
    """fits; over_limit: ran, but its peak exceeded the limit; oom: ran out of memory."""
    peak_bytes: int | None = None
    tokens_per_second: float | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def fits(self) -> bool:
        return self.status == "fits"


@dataclass
class FitResult:
    batch_size: int | None
    """The largest grid point that fits (None: not even the smallest)."""
    limit_bytes: int
    grid: list[int]
    points: list[FitPoint] = field(default_factory=list)
    """Every probe, in the order tried."""

    @property
    def at_grid_top(self) -> bool:
        """True when the top of the grid fits: the real limit may be higher (raise max_batch)."""
        return self.batch_size is not None and self.batch_size == self.grid[-1]

    @property
    def best_point(self) -> FitPoint | None:
        return next((p for p in self.points if p.batch_size == self.batch_size and p.fits), None)

    def to_dict(self) -> dict:
        return {"batch_size": self.batch_size, "limit_bytes": self.limit_bytes, "grid": self.grid,
                "at_grid_top": self.at_grid_top, "points": [asdict(p) for p in self.points]}


def probe_point(run: RunSteps, batch: int, limit_bytes: int, free_memory: Callable[[], None]) -> FitPoint:
    """Run one micro-batch; an out-of-memory becomes an "oom" point and its memory is freed."""
    free_memory()  # start from an empty cache, so the peak is this micro-batch's own
    start = time.perf_counter()
    error = None
    try:
        peak, tokens_per_second = run(batch)
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        error = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    # outside the except block: the traceback (and the tensors its frames hold) is gone before freeing
    seconds = round(time.perf_counter() - start, 3)
    if error is not None:
        free_memory()
        return FitPoint(batch, "oom", seconds=seconds, error=error)
    status = "fits" if peak is None or peak <= limit_bytes else "over_limit"
    return FitPoint(batch, status, peak, tokens_per_second, seconds)


def search_max_batch(run: RunSteps, limit_bytes: int, grid: Sequence[int],
                     free_memory: Callable[[], None] = lambda: None,
                     on_point: Callable[[FitPoint], None] | None = None) -> FitResult:
    """Binary search for the largest grid point whose steps run without running out of memory within the limit."""
    grid = sorted(set(int(b) for b in grid))
    if not grid or grid[0] < 1:
        raise UserError(f"the batch grid must hold positive micro-batch sizes, got {list(grid)}")
    result = FitResult(None, limit_bytes, grid)
    lo, hi = -1, len(grid)  # invariant: grid[lo] fits (or lo = -1); grid[hi] does not (or hi = len(grid))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        point = probe_point(run, grid[mid], limit_bytes, free_memory)
        result.points.append(point)
        if on_point is not None:
            on_point(point)
        if point.fits:
            lo = mid
        else:
            hi = mid
    result.batch_size = grid[lo] if lo >= 0 else None
    return result


def gradient_accumulation(max_batch: int, seq_len: int, tokens_per_step: int, world_size: int = 1) -> tuple[int, int]:
    """(micro-batch, accumulation steps) for a global batch of `tokens_per_step` tokens.

    The micro-batch is the largest one <= max_batch that divides the global batch's sequences per process,
    as `redline train` needs tokens_per_step to be a multiple of micro-batch × seq_len × world_size.
    tokens_per_step = 0: one micro-batch of max_batch per step.
    """
    if max_batch < 1:
        raise UserError(f"no micro-batch fits (max_batch={max_batch})")
    if tokens_per_step <= 0:
        return max_batch, 1
    sequences, rest = divmod(tokens_per_step, seq_len * world_size)
    if rest or sequences == 0:
        unit = seq_len * world_size
        raise UserError(f"tokens_per_step={tokens_per_step} is not a multiple of seq_len × world_size = {unit}; "
                        f"use {max(1, round(tokens_per_step / unit)) * unit}")
    for micro in range(min(max_batch, sequences), 0, -1):
        if sequences % micro == 0:
            return micro, sequences // micro
    return 1, sequences  # unreachable: 1 divides everything


# ----------------------------------------------------------------------------------------------------
# real training steps


class TrainingStepProbe:
    """Runs `steps` training steps of `cfg`'s model at a given micro-batch; returns (peak reserved bytes, tokens/s).

    The steps are those `redline train` runs (redline/training/step.py's TrainStep: the same converters, with
    FP8 on from the first step, activation checkpointing, compile and optimizers), and the optimizer state
    persists across probes as it does in training. The first step is a warm-up (it also allocates the
    optimizer state); tokens/s is measured over the others. Start-up decisions that depend on the micro-batch
    (attention backend, fp8=auto's layers) are taken at cfg.batch_size (1 when it is auto).
    """

    def __init__(self, cfg: TrainConfig, device: torch.device, steps: int = 3):
        from redline.training.step import TrainStep

        if steps < 1:
            raise UserError(f"probe steps must be at least 1, got {steps}")
        self.cfg, self.device, self.steps = cfg, device, steps
        self.seq_len = cfg.effective_seq_len
        batch = cfg.batch_size if isinstance(cfg.batch_size, int) else 1
        # one micro-batch per step, whatever the global batch; FP8 (if any) on from the first step
        probe_cfg = dataclasses.replace(cfg, batch_size=batch, tokens_per_step=0, fp8_warmup_steps=0)
        self.train_step = TrainStep(probe_cfg, device)
        self.num_params = self.model.num_params()

    @property
    def model(self) -> torch.nn.Module:
        return self.train_step.model

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, batch: int) -> tuple[int | None, float | None]:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        # ids the head predicts (model.head_vocab), as the targets must be
        tokens = torch.randint(self.cfg.model.head_width, (batch, self.seq_len + 1), device=self.device)
        micro_batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())  # (B, T) each
        del tokens
        start = time.perf_counter()
        for step in range(self.steps):
            if step == 1:
                self._sync()
                start = time.perf_counter()
            self.train_step.step([micro_batch], lr_multiplier=1.0)
        self._sync()
        timed_steps = max(self.steps - 1, 1)
        tokens_per_second = batch * self.seq_len * timed_steps / max(time.perf_counter() - start, 1e-9)
        peak = torch.cuda.max_memory_reserved(self.device) if cuda else None
        return peak, tokens_per_second

    def free(self) -> None:
        """Drop gradients and cached blocks (the optimizer state stays: training keeps it too)."""
        for opt in self.train_step.optimizers:
            opt.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def close(self) -> None:
        self.free()
        del self.train_step
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def find_max_batch(cfg: TrainConfig, device: torch.device | None = None, *,
                   memory_fraction: float = DEFAULT_MEMORY_FRACTION, grid: Sequence[int] | None = None,
                   steps: int = 3, on_point: Callable[[FitPoint], None] | None = None) -> FitResult:
    """The largest micro-batch of `cfg` (model, seq_len, optimizer, precision, wrapping) that fits on a CUDA GPU.

    Runs real training steps; the model and optimizer it builds are freed before it returns.
    """
    validate_memory_fraction(memory_fraction)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if device.type != "cuda":
        raise UserError("the micro-batch search measures GPU memory and needs a CUDA GPU, and none is visible; "
                        "on a CPU pick batch_size by hand")
    total = torch.cuda.get_device_properties(device).total_memory
    limit = int(memory_fraction * total)
    torch.cuda.set_per_process_memory_fraction(memory_fraction, device)
    probe = None
    try:
        try:
            probe = TrainingStepProbe(cfg, device, steps)
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            raise UserError(f"the {cfg.preset} model alone does not fit in {memory_fraction:.0%} of "
                            f"{total / 2**30:.0f} GiB; use a smaller preset or a larger memory_fraction") from None
        return search_max_batch(probe, limit, grid or batch_grid(), probe.free, on_point)
    finally:
        if probe is not None:
            probe.close()
        torch.cuda.set_per_process_memory_fraction(1.0, device)
