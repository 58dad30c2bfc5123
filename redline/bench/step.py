"""Time the training step (redline/training/step.py's TrainStep, the one `redline train` runs) of a TrainConfig.

The step is the loop's own: the same converters, wrapping (attention backend, FP8, activation checkpointing,
compile, DDP/FSDP2), optimizers, accumulation, clipping and non-finite skip. The bench only feeds it batches
(random tokens, or the training loader over prepared shards) and times it. FP8 layers are on from the first
step (fp8_warmup_steps=0): the bench measures FP8 speed, not the BF16 warm-up phase of training; with fp8=auto
it also times the step without FP8 and asks the converter for its verdict, which training would reach at its
switch.

Timing: the first warm-up step (compile, autotuning, first allocations) and the rest of the warm-up are timed
separately with wall clocks and excluded; then each timed step is measured with CUDA events on a GPU
(perf_counter on a CPU) and summarised as median, min and max.

Under torchrun (several ranks) every rank runs its own micro-batches (batch_size is per process and
tokens_per_step the global batch, as in training), gradients are reduced on the last micro-step only, and each
timed step counts as the slowest rank's time for it; tokens/s counts every rank's tokens.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from redline.config import TrainConfig
from redline.distributed import DistInfo, all_reduce_max
from redline.errors import UserError
from redline.hardware import autocast_dtype, peak_flops, resolve_device
from redline.training.optim import lr_multiplier
from redline.training.step import TrainStep, resolve_batch_size, with_vocab_size
from redline.training.wrap import compile_enabled, compile_scope, cuda_graphs_enabled


def _prepared_data(path: str):
    """(data_dir, tokenizer) of a prepared shard folder; real data in bench must already be prepared."""
    try:
        from redline.data.prepare import check_prepared
        from redline.tokenizer import load_tokenizer
    except ImportError as e:
        raise UserError(f"benchmarking on real data needs redline's data modules, which this install lacks ({e}); "
                        f"leave data.path unset to use random tokens") from None
    data_dir = Path(path)
    if not data_dir.exists() or not check_prepared(data_dir):
        raise UserError(f"data.path={path} is not a prepared shard folder; make one with `redline data prepare`, "
                        f"or leave data.path unset to benchmark on random tokens")
    return data_dir, load_tokenizer(str(data_dir))


class BenchStep:
    """The TrainStep of cfg, fed from random tokens or prepared shards; `run()` is one optimizer step."""

    def __init__(self, cfg: TrainConfig, device: torch.device, info: DistInfo = DistInfo()):
        self.data = "random"
        tokenizer = None
        if cfg.data.path is not None:
            data_dir, tokenizer = _prepared_data(cfg.data.path)
            cfg = with_vocab_size(cfg, tokenizer.vocab_size)  # as in training: the data's tokenizer decides
            self.data = str(data_dir)
        cfg = dataclasses.replace(resolve_batch_size(cfg, device, info), fp8_warmup_steps=0)
        self.cfg = cfg
        self.train_step = TrainStep(cfg, device, info)
        seq_len = cfg.effective_seq_len
        if tokenizer is not None:
            from redline.data.loader import TokenLoader

            loader = TokenLoader(data_dir, "train", cfg.batch_size, seq_len, seed=cfg.seed, rank=info.rank,
                                 world_size=info.world_size, expected_identity=tokenizer.identity, device=device)
            self.next_batch = loader.next_batch
        else:
            gen = torch.Generator(device=device).manual_seed(cfg.seed + info.rank)  # each rank its own tokens
            self._pool = [torch.randint(0, cfg.model.vocab_size, (cfg.batch_size, seq_len + 1), device=device,
                                        generator=gen) for _ in range(4)]
            self._next = 0
            self.next_batch = self._random_batch

    def _random_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self._pool[self._next % len(self._pool)]
        self._next += 1
        return tokens[:, :-1], tokens[:, 1:]

    def _micro_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.train_step.plan.accum):
            yield self.next_batch()

    def run(self) -> torch.Tensor:
        """One optimizer step (learning-rate warm-up as in training, from step 0); the mean loss, on the device."""
        multiplier = lr_multiplier(self.cfg.optim, self.train_step.steps_done, 0.0)
        return self.train_step.step(self._micro_batches(), multiplier).loss


def _timed_steps(runner: BenchStep, steps: int, device: torch.device, info: DistInfo, losses: list) -> list[float]:
    """Milliseconds of each of `steps` steps: CUDA events on a GPU (no sync between steps), else perf_counter.
    Under torchrun, a step is as slow as its slowest rank."""
    times_ms: list[float] = []
    if device.type == "cuda":
        events = []
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            losses.append(runner.run())
            end.record()
            events.append((start, end))
        _sync(device)
        times_ms = [s.elapsed_time(e) for s, e in events]
    else:
        for _ in range(steps):
            s = time.perf_counter()
            losses.append(runner.run())
            times_ms.append((time.perf_counter() - s) * 1e3)
    if info.enabled:
        times_ms = all_reduce_max(torch.tensor(times_ms, dtype=torch.float64, device=device)).tolist()
    return times_ms


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def describe(cfg: TrainConfig, device: torch.device, info: DistInfo = DistInfo()) -> dict:
    """The point's settings as they will run (before building anything)."""
    amp = autocast_dtype(device, cfg.precision)
    use_compile = compile_enabled(cfg, device)
    return {
        "preset": cfg.preset, "batch_size": cfg.batch_size, "seq_len": cfg.effective_seq_len,
        "precision": str(amp or torch.float32).replace("torch.", ""), "fp8": cfg.fp8, "fp8_recipe": cfg.fp8_recipe,
        "fp8_head": cfg.fp8_head,
        "activation_checkpointing": cfg.activation_checkpointing, "compile": use_compile,
        "compile_scope": compile_scope(cfg, info.enabled) if use_compile else None, "compile_mode": cfg.compile_mode,
        "cuda_graphs": cuda_graphs_enabled(cfg, device, info.enabled), "attn_backend": cfg.model.attn_backend,
        "optimizer": cfg.optim.name,
        "fused_adamw": cfg.optim.fused if cfg.optim.fused is not None else device.type == "cuda",
        "world_size": info.world_size, "parallel": cfg.parallel if info.enabled else None,
    }


def measure(cfg: TrainConfig, warmup: int, steps: int, profile_steps: int = 0,
            trace_path: str | None = None, info: DistInfo = DistInfo(), comm_steps: int = 0,
            device: torch.device | None = None) -> dict:
    """Build the step, warm it up, time it. Returns one result dict (see `redline bench` for the fields).

    Under torchrun (`info` of several ranks, process group joined) every rank calls this; the step times, peak
    memory and communication shares are combined across ranks, so every rank returns the same numbers.
    comm_steps > 0: profile that many more steps for the communication time share (redline/bench/scaling.py).

    Raises torch.OutOfMemoryError as it comes: the caller reports it."""
    device = device or resolve_device(cfg.device, info.local_rank)
    point = {"device": device.type, **describe(cfg, device, info), "warmup_steps": warmup, "timed_steps": steps}
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    runner = BenchStep(cfg, device, info)
    point.update(built(runner), setup_seconds=time.perf_counter() - t0)
    losses = []
    t1 = time.perf_counter()
    if warmup > 0:
        losses.append(runner.run())
        _sync(device)
    point["first_step_seconds"] = time.perf_counter() - t1
    for _ in range(max(warmup - 1, 0)):
        losses.append(runner.run())
    _sync(device)
    point["warmup_seconds"] = time.perf_counter() - t1

    times_ms = _timed_steps(runner, steps, device, info, losses)
    point["timer"] = "cuda_events" if device.type == "cuda" else "perf_counter"
    if point["fp8_mode"] == "auto" and device.type == "cuda" and point["fp8_layers"] and steps > 0:
        times_ms = _check_fp8_auto(runner, point, times_ms, warmup, steps, info, losses)
    if comm_steps > 0:
        from redline.bench.scaling import communication_profile

        point["communication"] = communication_profile(runner.run, comm_steps, device, info)
    if profile_steps > 0:
        from redline.bench.profile import profile_steps as run_profile

        point["profile"] = run_profile(runner.run, profile_steps, trace_path, device)
    point.update(_speed(runner, times_ms, device, info))
    loss_values = torch.stack(losses).tolist() if losses else []
    point.update(loss_first=loss_values[0] if loss_values else None,
                 loss_last=loss_values[-1] if loss_values else None, status="ok")
    point.update(_peak_memory(device))
    nonfinite = torch.tensor(0.0 if all(math.isfinite(v) for v in loss_values) else 1.0, device=device)
    if all_reduce_max(nonfinite).item():  # on any rank (each rank has its own batches)
        point["status"] = "nonfinite"
    return point


def built(runner: BenchStep) -> dict:
    """What was built and decided: data, sizes, the batch plan, the attention backend, the FP8 layers."""
    train_step, model = runner.train_step, runner.train_step.model
    decisions = train_step.wrapped.decisions
    fp8 = decisions["converters"].get("fp8", {"mode": "off", "layers": [], "shapes": None})
    return {
        "data": runner.data, "batch_size": runner.cfg.batch_size, "vocab_size": runner.cfg.model.vocab_size,
        "params": model.num_params(), "params_without_embeddings": model.num_params(embeddings=False),
        "tokens_per_step": train_step.plan.tokens_per_step, "grad_accum": train_step.plan.accum,
        "attn_backend": decisions["attention"]["backend"], "attn_backend_source": decisions["attention"]["source"],
        "fp8_mode": fp8["mode"], "fp8_layers": fp8["layers"], "fp8_shapes": fp8["shapes"],
    }


def _check_fp8_auto(runner: BenchStep, point: dict, fp8_ms: list[float], warmup: int, steps: int, info: DistInfo,
                    losses: list) -> list[float]:
    """fp8=auto: time the step without FP8 too (its graph compiles here) and take the converter's verdict, as
    training does at its switch. Returns the step times of what stays: FP8's, or BF16's when FP8 goes off."""
    converter = runner.train_step.converters.get("fp8")
    with converter.disabled():
        for _ in range(max(warmup, 1)):
            losses.append(runner.run())
        bf16_ms = _timed_steps(runner, steps, runner.train_step.device, info, losses)
    point["fp8_auto_check"] = verdict = converter.decide(bf16_ms, fp8_ms)
    if verdict["kept"]:
        return fp8_ms
    point["fp8_layers"] = []  # what training does after its check: BF16 for the rest of the run
    return bf16_ms


def _speed(runner: BenchStep, times_ms: list[float], device: torch.device, info: DistInfo) -> dict:
    """Step times, tokens/s (tokens_per_step is the global batch: every rank's tokens) and MFU (per GPU)."""
    model, seq_len = runner.train_step.model, runner.cfg.effective_seq_len
    median = statistics.median(times_ms) if times_ms else float("nan")
    tokens_per_second = runner.train_step.plan.tokens_per_step / (median / 1e3) if times_ms else None
    per_gpu = tokens_per_second / info.world_size if tokens_per_second else None
    flops_per_token = model.flops_per_token(seq_len)
    peak, measured_peak, gpu_name = peak_flops(device)
    return {
        "gpu": gpu_name, "step_ms_median": median, "step_ms_min": min(times_ms, default=None),
        "step_ms_max": max(times_ms, default=None), "tokens_per_second": tokens_per_second,
        "tokens_per_second_per_gpu": per_gpu, "flops_per_token": flops_per_token,
        "flops_per_token_exact": model.flops_per_token(seq_len, exact=True),
        "mfu": flops_per_token * per_gpu / peak if peak and per_gpu else None,
        "mfu_measured_peak": flops_per_token * per_gpu / measured_peak if measured_peak and per_gpu else None,
        "peak_tflops": peak / 1e12 if peak else None,
        "measured_peak_tflops": measured_peak / 1e12 if measured_peak else None,
    }


def _peak_memory(device: torch.device) -> dict:
    """Peak allocated and reserved memory, the largest over ranks (None on a CPU)."""
    if device.type != "cuda":
        return {"peak_memory_gib": None}
    peaks = torch.tensor([torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)],
                         dtype=torch.float64, device=device)
    allocated, reserved = all_reduce_max(peaks).tolist()
    return {"peak_memory_gib": allocated / 2**30, "peak_reserved_gib": reserved / 2**30,
            "gpu_memory_gib": torch.cuda.get_device_properties(device).total_memory / 2**30}
