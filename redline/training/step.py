"""The training step: the one implementation that `redline train`, `redline bench` and `redline fit` run.

    cfg = with_vocab_size(cfg, tokenizer.vocab_size)       # resolved copies of the config, before building
    cfg = resolve_batch_size(cfg, device, info)             # batch_size=auto: the search of redline/training/fit.py
    step = TrainStep(cfg, device, info)                     # converters, model, wrapping, optimizers, batch plan
    out = step.step(micro_batches, lr_multiplier)           # StepOutput(loss, grad_norm, skipped): device tensors

TrainStep is built once, in a fixed order: the converters (their hardware checks first), the model (or the
caller's, with checkpoint weights already loaded), wrap.py's one function (converters → activation
checkpointing → compile → data parallel), then the optimizers, after wrapping because FSDP2 and FP8's FSDP2
all-gather replace parameters. One `step` runs `plan.accum` micro-batches under autocast (gradients reduced on
the last one only: DDP's no_sync, FSDP2's gradient sync switch), clips the gradient norm (with fused AdamW and
Muon inside their own kernels: the clip's factor is their grad_scale), applies the update only where the loss and
the norm are finite (on the device with fused AdamW and Muon: no host sync), clears the gradients,
and calls the converters' hooks around it. What a micro-batch is and what its loss means is the objective's
business (redline/training/objectives.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from redline.config import TrainConfig
from redline.converters import Converters, Event, build_converters
from redline.distributed import DistInfo
from redline.errors import UserError
from redline.hardware import autocast, autocast_dtype
from redline.model import GPT
from redline.training.objectives import LanguageModeling, Objective
from redline.training.optim import build_optimizers, optimizer_metrics, set_lr, skips_on_device, step_if_finite
from redline.training.parallel import local_tensor, no_sync, set_fsdp_sync
from redline.training.wrap import Wrapped, compile_enabled, wrap_model


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's tokens are made up: `accum` micro-batches of micro_batch × seq_len tokens on
    each of world_size processes."""

    micro_batch: int
    seq_len: int
    accum: int
    world_size: int

    @property
    def tokens_per_micro_step(self) -> int:
        """Tokens in one micro-batch of one process."""
        return self.micro_batch * self.seq_len

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one optimizer step over every process: the global batch (TrainConfig.tokens_per_step)."""
        return self.micro_batch * self.seq_len * self.accum * self.world_size


def plan_batches(cfg: TrainConfig, world_size: int) -> BatchPlan:
    """The batch plan of a config whose batch_size is resolved: tokens_per_step (0: one micro-batch per process)
    must be a multiple of batch_size × seq_len × world_size; the quotient is the accumulation."""
    if not isinstance(cfg.batch_size, int):
        raise UserError(f"batch_size={cfg.batch_size!r} must be resolved to a number before the step is built "
                        f"(resolve_batch_size)")
    seq_len = cfg.effective_seq_len
    unit = cfg.batch_size * seq_len * world_size
    accum = 1
    if cfg.tokens_per_step:
        if cfg.tokens_per_step % unit:
            raise UserError(f"tokens_per_step={cfg.tokens_per_step} is not a multiple of batch_size × seq_len × "
                            f"world_size = {unit}; use {max(1, round(cfg.tokens_per_step / unit)) * unit}")
        accum = cfg.tokens_per_step // unit
    return BatchPlan(cfg.batch_size, seq_len, accum, world_size)


def ramp_rows(cfg: TrainConfig, step: int) -> int | None:
    """Rows of each micro-batch of step `step` (0-based) under the batch-size warm-up (cfg.batch_ramp_*): linear from
    batch_ramp_start × batch_size to batch_size over batch_ramp_steps steps, rounded up to a multiple of
    batch_ramp_multiple and at most batch_size. None: the full micro-batch (no ramp, or past it)."""
    if not cfg.batch_ramp_steps or step >= cfg.batch_ramp_steps:
        return None
    full, multiple = cfg.batch_size, cfg.batch_ramp_multiple
    wanted = full * (cfg.batch_ramp_start + (1 - cfg.batch_ramp_start) * step / cfg.batch_ramp_steps)
    rows = min(full, max(multiple, math.ceil(wanted / multiple - 1e-9) * multiple))
    return None if rows == full else rows


def ramp_seq_len(cfg: TrainConfig, step: int) -> int | None:
    """Row length of step `step` (0-based) under the sequence-length warm-up (cfg.seq_ramp_*): seq_ramp_start
    doubled for as long as the double is at most the linear ramp from seq_ramp_start to seq_len over
    seq_ramp_steps steps (so each length divides the loader's windows). None: the full length (no ramp, or past
    it)."""
    if not cfg.seq_ramp_steps or step >= cfg.seq_ramp_steps:
        return None
    full, length = cfg.effective_seq_len, cfg.effective_seq_ramp_start
    wanted = length + (full - length) * step / cfg.seq_ramp_steps
    while length * 2 <= wanted:
        length *= 2
    return None if length >= full else length


def with_vocab_size(cfg: TrainConfig, vocab_size: int) -> TrainConfig:
    """A copy of cfg whose model has the data's vocabulary (the preset's is a default: the tokenizer decides)."""
    if cfg.model.vocab_size == vocab_size:
        return cfg
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab_size))


# the largest micro-batch that fits on this process's device (None: not even 1)
BatchSearch = Callable[[TrainConfig, torch.device], int | None]


def search_on_gpu(cfg: TrainConfig, device: torch.device) -> int | None:
    """The search of `redline fit`: real training steps of cfg at growing micro-batches on this CUDA GPU."""
    from redline.training.fit import find_max_batch

    if device.type != "cuda":
        raise UserError("batch_size=auto measures GPU memory and needs a CUDA GPU; give a number on this machine")
    return find_max_batch(cfg, device, memory_fraction=cfg.memory_fraction).batch_size


def resolve_batch_size(cfg: TrainConfig, device: torch.device, info: DistInfo = DistInfo(),
                       search: BatchSearch | None = None) -> TrainConfig:
    """cfg itself when batch_size is a number; for batch_size=auto, a copy with the largest micro-batch that fits
    on every rank and divides the global batch (tokens_per_step) into whole accumulation steps.

    The search builds its own model and optimizer at micro-batch 1 (start-up measurements such as the attention
    backend's are taken there) and frees them before the run builds its own."""
    from redline.training.fit import gradient_accumulation

    if cfg.batch_size != "auto":
        return cfg
    search = search or search_on_gpu
    found = search(dataclasses.replace(cfg, batch_size=1), device)
    best = torch.tensor(found or 0, device=device)
    if info.enabled:
        import torch.distributed as dist

        dist.all_reduce(best, op=dist.ReduceOp.MIN)
    if int(best) < 1:
        raise UserError(f"not even a micro-batch of 1 fits in {cfg.memory_fraction:.0%} of the GPU at seq_len "
                        f"{cfg.effective_seq_len}; try activation_checkpointing=full or a shorter seq_len")
    micro, _ = gradient_accumulation(int(best), cfg.effective_seq_len, cfg.tokens_per_step, info.world_size)
    return dataclasses.replace(cfg, batch_size=micro)


# ----------------------------------------------------------------------------------------------------
# the step


@dataclass
class StepOutput:
    """One optimizer step's results, on the device (reading them is a host sync: the caller chooses when)."""

    loss: torch.Tensor
    """0-dim: the objective's loss, averaged over the micro-batches."""
    grad_norm: torch.Tensor
    """0-dim: the gradient norm before clipping."""
    skipped: torch.Tensor
    """0-dim float32: 1.0 where the update was skipped (a non-finite loss or gradient)."""
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    """The objective's extra scalars, averaged over the micro-batches."""
    events: list[Event] = field(default_factory=list)
    """What the converters reported around this step (see redline/converters)."""


def _say_on_main(info: DistInfo) -> Callable[[str], None]:
    def say(message: str) -> None:
        if info.is_main:
            print(f"redline: {message}", flush=True)
    return say


class TrainStep:
    """A model, its converters, wrapping and optimizers, and the batch plan, built once from the config.

    model: the plain model to train (e.g. with checkpoint weights already loaded); None builds one on `device`
    from cfg.model with cfg.seed. objective: LanguageModeling unless given. cfg.batch_size must be resolved.
    `model` stays the plain model to evaluate and save; `module` is what training calls (compiled, DDP, FSDP2)."""

    def __init__(self, cfg: TrainConfig, device: torch.device, info: DistInfo = DistInfo(),
                 model: GPT | None = None, objective: Objective | None = None,
                 say: Callable[[str], None] | None = None):
        self.cfg, self.device, self.info = cfg, device, info
        self.plan = plan_batches(cfg, info.world_size)
        say = say or _say_on_main(info)
        self.converters: Converters = build_converters(cfg, device, info, compiled=compile_enabled(cfg, device),
                                                       say=say)
        if model is None:
            torch.manual_seed(cfg.seed)
            with torch.device(device):  # initialised on the device: seconds instead of minutes for 1.5B on a CPU
                model = GPT(cfg.model)
        self.model = model
        self.objective = objective or LanguageModeling()
        self.wrapped: Wrapped = wrap_model(model, cfg, device, info, self.converters, say,
                                           shapes_vary=getattr(self.objective, "shapes_vary", False))
        self.module = self.wrapped.module
        self.optimizers = build_optimizers(model, cfg.optim, device)  # after wrapping: see the module docstring
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.skips_on_device = skips_on_device(self.optimizers)
        # clipping folded into the update: each optimizer divides the gradients by the clip's factor inside its own
        # kernel (fused AdamW's grad_scale, Muon's momentum), so clipping adds no pass of its own over them; where
        # an optimizer cannot, or the gradients are DTensors (FSDP2), clip_grad_norm_ scales them first
        self.fold_clip = self.skips_on_device and not any(hasattr(p, "device_mesh") for p in self.params)
        self.amp = autocast_dtype(device, cfg.precision)
        self.clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        self.objective.attach(self)
        self.steps_done = 0
        self.cuda_graphs = self.wrapped.decisions["compile"].get("cuda_graphs", False)

    def _own_gradients(self) -> None:
        """Move gradients out of the CUDA graphs' memory pool. A backward graph's outputs live in that pool and the
        next micro-step's replay overwrites them, but AccumulateGrad installs a first gradient as .grad without a
        copy (pytorch/pytorch#169545): a copy made here is what the later micro-steps add into in place."""
        for p in self.params:
            if p.grad is not None:
                p.grad = p.grad.clone()

    def step(self, batches: Iterable[Any], lr_multiplier: float) -> StepOutput:
        """One optimizer step on the next `plan.accum` micro-batches of `batches` (an iterable read lazily, one
        micro-batch at a time), at lr_multiplier × the peak learning rates."""
        events = self.converters.before_step(self.steps_done)
        set_lr(self.optimizers, lr_multiplier)
        accum = self.plan.accum
        loss_sum = torch.zeros((), device=self.device)
        metric_sums: dict[str, torch.Tensor] = {}
        done = 0
        for micro, batch in zip(range(accum), batches):
            last_micro = micro == accum - 1
            set_fsdp_sync(self.model, last_micro)  # gradients are reduced on the last micro-step only
            with no_sync(self.module, last_micro):
                with autocast(self.device, self.amp):
                    loss, metrics = self.objective.compute(self.module, batch)
                (loss / accum).backward()
            if self.cuda_graphs and micro == 0 and accum > 1:
                self._own_gradients()
            loss_sum += loss.detach()
            for name, value in metrics.items():
                metric_sums[name] = metric_sums.get(name, 0) + value.detach()
            done += 1
        if done != accum:
            raise ValueError(f"a step takes {accum} micro-batches (plan.accum), the batches ran out after {done}")
        loss_mean = loss_sum / accum
        if self.fold_clip:
            grads = [p.grad for p in self.params if p.grad is not None]
            grad_norm = torch.nn.utils.get_total_norm(grads)
            # what clip_grad_norm_ would multiply the gradients by is 1 / this (at most 1)
            scale = None if self.clip == float("inf") else ((grad_norm + 1e-6) / self.clip).clamp(min=1.0)
            for opt in self.optimizers:
                opt.grad_scale = scale
        else:
            grad_norm = local_tensor(torch.nn.utils.clip_grad_norm_(self.params, self.clip))
        # a non-finite loss or gradient skips the update: on the device with fused AdamW, else after one sync
        skipped = step_if_finite(self.optimizers, loss_mean, grad_norm)
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        events += self.converters.after_optimizer_step(self.steps_done)
        self.steps_done += 1
        metrics = {k: v / accum for k, v in metric_sums.items()}
        for name, value in optimizer_metrics(self.optimizers).items():  # e.g. Prodigy's d
            metrics[name] = torch.tensor(value, device=self.device)
        return StepOutput(loss_mean, grad_norm, skipped, metrics, events)

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[nn.Module]:
        """The plain model in eval mode without the converters (evaluation and sampling run in BF16, LoRA
        merged or not as it trains); training mode and the converters come back after."""
        was_training = self.model.training
        with self.converters.evaluation():
            self.model.eval()
            try:
                yield self.model
            finally:
                self.model.train(was_training)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed step needs besides weights and optimizer states (which checkpoints store apart)."""
        return {"steps_done": self.steps_done, "converters": self.converters.state_dict(),
                "objective": self.objective.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done = int(state.get("steps_done", 0))
        self.converters.load_state_dict(state.get("converters", {}))
        self.objective.load_state_dict(state.get("objective", {}))
