"""One training step built from a TrainConfig, as the training loop runs it, and timed.

The step is the loop's: micro-batches under autocast with gradient accumulation, clip_grad_norm_, the
optimizer step skipped where the loss or gradient is not finite (on the device with fused AdamW, no host
sync), and zero_grad(set_to_none=True). The model goes through the same `wrap_model` (attention backend, FP8,
activation checkpointing, compile), and the optimizers come from the same `build_optimizers`.

Timing: the first warm-up step (compile, autotuning, first allocations) and the rest of the warm-up are timed
separately with wall clocks and excluded; then each timed step is measured with CUDA events on a GPU
(perf_counter on a CPU) and summarised as median, min and max. FP8 layers are on from the first step: the
bench measures FP8 speed, not the BF16 warm-up phase of training.

Under torchrun (several ranks) the model is wrapped in DDP or FSDP2 as in training, every rank runs its own
micro-batches (batch_size is per rank), gradients are reduced on the last micro-step only, and each timed step
counts as the slowest rank's time for it; tokens/s is the sum over ranks.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from redline.config import TrainConfig
from redline.distributed import DistInfo, all_reduce_max
from redline.errors import UserError
from redline.hardware import autocast_dtype, peak_flops, resolve_device
from redline.model import GPT
from redline.training.float8 import precompute_fsdp_float8_scales
from redline.training.optim import build_optimizers, lr_multiplier, set_lr, step_if_finite
from redline.training.parallel import local_tensor, no_sync, set_fsdp_sync
from redline.training.wrap import compile_scope, wrap_model


def _prepared_data(path: str):
    """(data_dir, tokenizer) of a prepared shard folder; real data in bench must already be prepared."""
    try:
        from redline.data.prepare import is_prepared
        from redline.tokenizer import load_tokenizer
    except ImportError as e:
        raise UserError(f"benchmarking on real data needs redline's data modules, which this install lacks ({e}); "
                        f"leave data.path unset to use random tokens") from None
    data_dir = Path(path)
    if not data_dir.exists() or not is_prepared(data_dir):
        raise UserError(f"data.path={path} is not a prepared shard folder; make one with `redline data prepare`, "
                        f"or leave data.path unset to benchmark on random tokens")
    return data_dir, load_tokenizer(str(data_dir))


@dataclass
class TrainStep:
    """A model, its optimizers and a batch source, ready to run `step()`."""

    cfg: TrainConfig
    device: torch.device
    info: DistInfo = field(default_factory=DistInfo)
    """This process's rank and the world size (one process unless run under torchrun)."""
    model: GPT = field(init=False)
    train_model: torch.nn.Module = field(init=False)

    def __post_init__(self):
        cfg, device = self.cfg, self.device
        self.seq_len = cfg.effective_seq_len
        self.amp = autocast_dtype(device, cfg.precision)
        self.data = "random"
        tokenizer = None
        if cfg.data.path is not None:
            data_dir, tokenizer = _prepared_data(cfg.data.path)
            cfg.model.vocab_size = tokenizer.vocab_size  # as in training: the data's tokenizer decides
            self.data = str(data_dir)
        self.accum = 1
        micro_tokens = cfg.batch_size * self.seq_len
        if cfg.tokens_per_step:
            if cfg.tokens_per_step % micro_tokens:
                raise UserError(f"tokens_per_step={cfg.tokens_per_step} is not a multiple of batch_size × seq_len = "
                                f"{micro_tokens}")
            self.accum = cfg.tokens_per_step // micro_tokens
        self.tokens_per_step = micro_tokens * self.accum
        torch.manual_seed(cfg.seed)
        with torch.device(device):  # initialise on the device: seconds instead of minutes for 1.5B on a CPU
            self.model = GPT(cfg.model)
        self.train_model = wrap_model(self.model, cfg, device, self.info)
        # after wrapping, as in the loop: FSDP2 replaces the parameters with sharded ones
        self.optimizers = build_optimizers(self.model, cfg.optim, device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if tokenizer is not None:
            from redline.data.loader import TokenLoader

            loader = TokenLoader(data_dir, "train", cfg.batch_size, self.seq_len, seed=cfg.seed, rank=self.info.rank,
                                 world_size=self.info.world_size, expected_identity=tokenizer.identity, device=device)
            self.next_batch = loader.next_batch
        else:
            gen = torch.Generator(device=device).manual_seed(cfg.seed + self.info.rank)  # each rank its own tokens
            pool = [torch.randint(0, cfg.model.vocab_size, (cfg.batch_size, self.seq_len + 1), device=device,
                                  generator=gen) for _ in range(4)]
            self._pool, self._next = pool, 0
            self.next_batch = self._random_batch
        self.ctx = (lambda: torch.autocast(device.type, dtype=self.amp)) if self.amp else contextlib.nullcontext
        self.steps_done = 0

    def _random_batch(self):
        tokens = self._pool[self._next % len(self._pool)]
        self._next += 1
        return tokens[:, :-1], tokens[:, 1:]

    def step(self) -> torch.Tensor:
        """One optimizer step; returns the mean loss as a device tensor."""
        cfg = self.cfg
        set_lr(self.optimizers, lr_multiplier(cfg.optim, self.steps_done, 0.0))
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(self.accum):
            x, y = self.next_batch()
            last_micro = micro == self.accum - 1
            set_fsdp_sync(self.model, last_micro)  # gradients are reduced on the last micro-step only
            with no_sync(self.train_model, last_micro):
                with self.ctx():
                    loss = self.train_model(x, y)
                (loss / self.accum).backward()
            loss_sum += loss.detach()
        loss_mean = loss_sum / self.accum
        grad_norm = local_tensor(torch.nn.utils.clip_grad_norm_(
            self.params, cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")))
        step_if_finite(self.optimizers, loss_mean, grad_norm)  # as the loop: no host sync with fused AdamW
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        precompute_fsdp_float8_scales(self.model)  # as the loop: FSDP2's FP8 all-gather scales, one all-reduce
        self.steps_done += 1
        return loss_mean


def _timed_steps(runner: TrainStep, steps: int, device: torch.device, info: DistInfo, losses: list) -> list[float]:
    """Milliseconds of each of `steps` steps: CUDA events on a GPU (no sync between steps), else perf_counter.
    Under torchrun, a step is as slow as its slowest rank."""
    times_ms: list[float] = []
    if device.type == "cuda":
        events = []
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            losses.append(runner.step())
            end.record()
            events.append((start, end))
        _sync(device)
        times_ms = [s.elapsed_time(e) for s, e in events]
    else:
        for _ in range(steps):
            s = time.perf_counter()
            losses.append(runner.step())
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
    use_compile = cfg.compile if cfg.compile is not None else device.type == "cuda"
    return {
        "preset": cfg.preset, "batch_size": cfg.batch_size, "seq_len": cfg.effective_seq_len,
        "precision": str(amp or torch.float32).replace("torch.", ""), "fp8": cfg.fp8, "fp8_recipe": cfg.fp8_recipe,
        "activation_checkpointing": cfg.activation_checkpointing, "compile": use_compile,
        "compile_scope": compile_scope(cfg, info.enabled) if use_compile else None, "compile_mode": cfg.compile_mode,
        "attn_backend": cfg.model.attn_backend, "optimizer": cfg.optim.name,
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
    from redline.training.float8 import fp8_layers, set_float8_enabled, step_verdict

    device = device or resolve_device(cfg.device, info.local_rank)
    point = {"device": device.type, **describe(cfg, device, info), "warmup_steps": warmup, "timed_steps": steps}
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    runner = TrainStep(cfg, device, info=info)
    model = runner.model
    wrap = getattr(model, "redline_wrap", {})
    set_float8_enabled(model, True)
    point.update(
        data=runner.data, vocab_size=cfg.model.vocab_size, params=model.num_params(),
        params_without_embeddings=model.num_params(embeddings=False), tokens_per_step=runner.tokens_per_step,
        grad_accum=runner.accum, attn_backend=wrap.get("attention", {}).get("backend", cfg.model.attn_backend),
        attn_backend_source=wrap.get("attention", {}).get("source"),
        fp8_mode=wrap.get("fp8", {}).get("mode", "off"), fp8_layers=wrap.get("fp8", {}).get("layers", []),
        fp8_shapes=wrap.get("fp8", {}).get("shapes"), setup_seconds=time.perf_counter() - t0,
    )
    check_fp8 = point["fp8_mode"] == "auto" and device.type == "cuda" and bool(fp8_layers(model)) and steps > 0
    losses = []
    t1 = time.perf_counter()
    if warmup > 0:
        losses.append(runner.step())
        _sync(device)
    point["first_step_seconds"] = time.perf_counter() - t1
    for _ in range(max(warmup - 1, 0)):
        losses.append(runner.step())
    _sync(device)
    point["warmup_seconds"] = time.perf_counter() - t1

    times_ms = _timed_steps(runner, steps, device, info, losses)
    point["timer"] = "cuda_events" if device.type == "cuda" else "perf_counter"
    if check_fp8:  # fp8=auto: the BF16 step too (its graph compiles here); FP8 stays only if the step is faster
        set_float8_enabled(model, False)
        for _ in range(max(warmup, 1)):
            losses.append(runner.step())
        bf16_ms = _timed_steps(runner, steps, device, info, losses)
        verdict = step_verdict(statistics.median(bf16_ms), statistics.median(times_ms))
        point["fp8_auto_check"] = verdict
        if verdict["kept"]:
            set_float8_enabled(model, True)
        else:  # what training does after its check: BF16 for the rest of the run
            times_ms, point["fp8_layers"] = bf16_ms, []

    if comm_steps > 0:
        from redline.bench.scaling import communication_profile

        point["communication"] = communication_profile(runner.step, comm_steps, device, info)
    if profile_steps > 0:
        from redline.bench.profile import profile_steps as run_profile

        point["profile"] = run_profile(runner.step, profile_steps, trace_path, device)
    loss_values = torch.stack(losses).tolist() if losses else []
    median = statistics.median(times_ms) if times_ms else float("nan")
    # tokens_per_step is per rank (batch_size is per process); MFU is per GPU
    per_gpu = runner.tokens_per_step / (median / 1e3) if times_ms else None
    tokens_per_second = per_gpu * info.world_size if per_gpu else None
    flops_per_token = model.flops_per_token(runner.seq_len)
    peak, measured_peak, gpu_name = peak_flops(device)
    point.update(
        gpu=gpu_name, step_ms_median=median, step_ms_min=min(times_ms, default=None),
        step_ms_max=max(times_ms, default=None), tokens_per_second=tokens_per_second,
        tokens_per_second_per_gpu=per_gpu, global_tokens_per_step=runner.tokens_per_step * info.world_size,
        flops_per_token=flops_per_token, flops_per_token_exact=model.flops_per_token(runner.seq_len, exact=True),
        mfu=flops_per_token * per_gpu / peak if peak and per_gpu else None,
        mfu_measured_peak=flops_per_token * per_gpu / measured_peak if measured_peak and per_gpu else None,
        peak_tflops=peak / 1e12 if peak else None, measured_peak_tflops=measured_peak / 1e12 if measured_peak else None,
        loss_first=loss_values[0] if loss_values else None, loss_last=loss_values[-1] if loss_values else None,
        status="ok",
    )
    if device.type == "cuda":  # the largest over ranks
        peaks = torch.tensor([torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)],
                             dtype=torch.float64, device=device)
        allocated, reserved = all_reduce_max(peaks).tolist()
        point["peak_memory_gib"] = allocated / 2**30
        point["peak_reserved_gib"] = reserved / 2**30
        point["gpu_memory_gib"] = torch.cuda.get_device_properties(device).total_memory / 2**30
    else:
        point["peak_memory_gib"] = None
    nonfinite = torch.tensor(0.0 if all(math.isfinite(v) for v in loss_values) else 1.0, device=device)
    if all_reduce_max(nonfinite).item():  # on any rank (each rank has its own batches)
        point["status"] = "nonfinite"
    return point
