"""The training loop: setup → (resume) → steps, evaluations, checkpoints → final evaluation, sample, summary.

One loop for every variant: architecture changes come through ModelConfig, optional features through the
converters, and what is optimised through the objective, all inside one TrainStep (redline/training/step.py).
`train` reads top to bottom; `Run` holds what surrounds the step (position, data, logs, evaluation, checkpoints).

Exactness: the learning rate is a pure function of (step, budget progress); the data loader's position,
every RNG, the optimizer states and the step's own state (converters, objective) go into each checkpoint, so
N steps straight and N/2 + resume + N/2 give the same losses on a CPU.

Checkpoints (redline/training/checkpoint.py): under FSDP2 every rank writes its own shards (the sharded layout),
elsewhere rank 0 writes the full one. Either resumes on any world size and under any `parallel`: the full
layout's weights load before wrapping and its optimizer states after; a sharded checkpoint loads after wrapping
and building the optimizers, so DCP can fill each rank's shards (or whole tensors without FSDP2).
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from redline.config import TrainConfig, to_dict
from redline.distributed import DistInfo, barrier, dist_info, init_distributed
from redline.durable import write_atomic
from redline.errors import UserError
from redline.hardware import autocast_dtype, environment_snapshot, peak_flops, resolve_device
from redline.model import GPT
from redline.training import adapters
from redline.training import checkpoint as ckpt_io
from redline.training.init_from import RUN_FIELDS, InitPoint
from redline.training.metrics import (MetricsLogger, StepRecords, Throughput, eta_seconds, format_duration,
                                      resume_metrics)
from redline.training.optim import lr_multiplier
from redline.training.parallel import full_state, is_fsdp, load_optimizer_states
from redline.training.objectives import Objective
from redline.training.sources import ShardData, TrainingData
from redline.training.step import (BatchSearch, StepOutput, TrainStep, ramp_rows, ramp_seq_len,
                                   resolve_batch_size, with_vocab_size)


@dataclass
class RunResult:
    run_dir: Path
    step: int
    tokens: int
    status: str  # "completed" | "interrupted" | "diverged" | "already_complete"
    final_eval: dict = field(default_factory=dict)
    sample: str | None = None
    checkpoint: Path | None = None


class StopFlag:
    """SIGINT/SIGTERM set a flag; the loop saves a checkpoint at the end of the current step and exits."""

    def __init__(self):
        self.signal: int | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.signal = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


# ----------------------------------------------------------------------------------------------------
# the loop


def train(cfg: TrainConfig, resume_from: Path | None = None, *, batch_search: BatchSearch | None = None,
          data: Callable[[Path], TrainingData] | None = None, objective: Objective | None = None,
          init: Callable[[GPT], None] | None = None) -> RunResult:
    """Train cfg (never changed: vocabulary and batch_size=auto are resolved into a copy) from scratch or from
    the checkpoint `resume_from`. Under torchrun it joins the process group (unless the caller has); the
    caller leaves it (`redline train` does, then ends the process: see redline/distributed.py).

    batch_search: how batch_size=auto finds the largest micro-batch (default: real steps on the GPU).
    data: run_dir -> the data source (default: cfg.data's token shards; `redline sft` gives conversations);
    objective: what the step optimises (default: language modeling); init: fills a new run's freshly built model
    (e.g. a pretrained checkpoint's weights for fine-tuning; not called on resume)."""
    cfg.validate()
    if not (cfg.max_steps or cfg.max_tokens or cfg.max_time):
        raise UserError("no budget: set max_steps, max_tokens or max_time (minutes)")
    if cfg.lora.enabled and cfg.lora.quantize == "nf4":  # a missing torchao or bitsandbytes, before any work
        from redline.converters.lora import resolve_nf4_backend

        resolve_nf4_backend(cfg.lora.nf4_backend)
    info = dist_info()
    device = resolve_device(cfg.device, info.local_rank)
    init_distributed(info, device, cfg.dist_timeout)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    for name in ("batch_ramp_steps", "seq_ramp_steps"):
        if getattr(cfg, name) and data is not None:  # before the run directory is made
            raise UserError(f"{name} (a warm-up of the batch's shape) is for pretraining on token shards (redline "
                            f"train); set {name}=0 to fine-tune")
    cfg, run_dir, source, init_point, resumed = open_run(cfg, resume_from, data)
    if resumed is not None and budget_progress(cfg, resumed.step, resumed.tokens, resumed.train_time) >= 1.0:
        return already_complete(cfg, run_dir, resumed, info)
    cfg = with_run_vocabulary(cfg, source.tokenizer, data is not None)
    if resumed is not None:
        resumed.check_model(cfg)  # before a model of another shape is built, or searched for a batch size
    cfg = resolve_batch_size(cfg, device, info, batch_search)

    torch.manual_seed(cfg.seed)
    model = new_model(cfg, device, on_host=cfg.lora.enabled and (init is None or resumed is not None))
    load_start_weights(cfg, model, resumed, init_point, init)
    train_step = TrainStep(cfg, device, info, model=model, objective=objective)
    if resumed is not None:
        resumed.restore(train_step, info)
    run = Run(cfg, info, device, run_dir, source, train_step, resumed)
    run.announce_start(init_point)

    status = "completed"
    with StopFlag() as stop:
        while (progress := run.progress()) < 1.0:
            multiplier = lr_multiplier(cfg.optim, run.step, progress)
            profiled = run.profile_step()
            with run.paused(run.compiles() or profiled is not None):  # compilation is not training time
                with profiled or nullcontext():
                    output = train_step.step(run.micro_batches(), multiplier)
            run.advance(output, cfg.optim.peak_lr * multiplier)
            run.end_profile(done=False)
            last = run.progress() >= 1.0
            log_now = run.step % cfg.log_every == 0 or last or stop.signal is not None
            eval_now = bool(cfg.eval_every) and run.step % cfg.eval_every == 0 and not last
            save_now = bool(cfg.checkpoint_every) and run.step % cfg.checkpoint_every == 0 and not last
            # with fused AdamW the skipped-update flags stay on the device until a step that syncs anyway
            if (not train_step.skips_on_device or log_now or eval_now or save_now) and run.diverged():
                status = "diverged"
                break
            if log_now:
                run.write_records(summary=True)
            if eval_now:
                with run.paused():
                    run.evaluate()
            if save_now and run.bad_in_row == 0:
                with run.paused():
                    run.save()
            if stop.signal is not None:
                status = "interrupted"
                break
            run.show_progress()

    run.write_records(summary=False)  # the steps since the last log line, whatever stopped the loop
    run.end_profile(done=True)  # a run that stopped inside its profiled steps reports the ones it ran
    run.stop_clock()
    final_eval: dict = {}
    checkpoint = sample = None
    if status != "diverged":  # a diverged run keeps its last good checkpoint
        if status == "completed":
            final_eval = run.evaluate()
        checkpoint = run.save()
    if status == "completed" and cfg.sample_tokens > 0:
        sample = run.sample()
    run.finish(status, stop.signal, final_eval, checkpoint)
    return RunResult(run_dir, run.step, run.tokens, status, final_eval, sample, checkpoint)


# ----------------------------------------------------------------------------------------------------
# resuming


@dataclass
class ResumePoint:
    """A verified checkpoint to continue from, and its state.pt."""

    checkpoint: Path
    sharded: bool
    state: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def adapters(self) -> bool:
        """A LoRA run's checkpoint: adapters alone, the base elsewhere (redline/training/adapters.py)."""
        return adapters.is_adapter_checkpoint(self.meta)

    @classmethod
    def read(cls, checkpoint: Path, tokenizer, data_name: str) -> ResumePoint:
        meta = ckpt_io.verify_checkpoint(checkpoint)
        if meta.get("tokenizer_identity") != tokenizer.identity:
            raise UserError(f"checkpoint {checkpoint} was trained with another tokenizer than the data in {data_name}")
        return cls(checkpoint, ckpt_io.layout(meta) == ckpt_io.SHARDED, ckpt_io.load_state(checkpoint), meta)

    @property
    def step(self) -> int:
        return self.state["step"]

    @property
    def tokens(self) -> int:
        return self.state["tokens"]

    @property
    def elapsed(self) -> float:
        return self.state["elapsed"]

    @property
    def train_time(self) -> float:
        """Seconds of training (max_time's clock); checkpoints from before it was kept have the wall time."""
        return self.state.get("train_time", self.state["elapsed"])

    def check_model(self, cfg: TrainConfig) -> None:
        """The run's architecture must be the checkpoint's (as init_from's: RUN_FIELDS may change), or loading
        the weights fails with a dump of mismatched tensor names and shapes."""
        from redline.config import from_dict

        saved = from_dict(TrainConfig, ckpt_io.load_config_dict(self.checkpoint)).model
        changed = [f"model.{f.name} (checkpoint {getattr(saved, f.name)}, now {getattr(cfg.model, f.name)})"
                   for f in dataclasses.fields(saved)
                   if f.name not in RUN_FIELDS and getattr(saved, f.name) != getattr(cfg.model, f.name)]
        if changed:
            raise UserError(f"checkpoint {self.checkpoint} has another architecture than this run: "
                            f"{', '.join(changed)}; resume without those settings, or start a new run")

    def restore(self, train_step: TrainStep, info: DistInfo) -> None:
        """Into a built (wrapped) step: the optimizer states (and, sharded, the weights), the step's own state,
        and the RNGs."""
        model, optimizers, state = train_step.model, train_step.optimizers, self.state
        if self.sharded:  # weights and optimizer states into this run's shards (DCP reshards from the saved world size)
            ckpt_io.load_sharded(self.checkpoint, model, optimizers, state.get("optimizer_types"))
        else:
            if self.adapters:
                adapters.load_adapters(self.checkpoint, model)
            load_optimizer_states(model, optimizers, state["optimizers"])
        # checkpoints from before the step kept its state held only fp8=auto's verdict, at the top level
        train_step.load_state_dict(state.get("train_step") or {
            "steps_done": state["step"], "converters": {"fp8": {"verdict": state.get("fp8_auto_check")}}})
        if info.world_size == state.get("world_size", 1):
            ckpt_io.set_rng_state(state["rng"])  # another world size draws other dropout masks anyway


def new_model(cfg: TrainConfig, device: torch.device, on_host: bool = False) -> GPT:
    """The run's plain model. on_host (a LoRA run whose weights all come from a checkpoint): built in host memory
    without initialisation; the LoRA converter moves it to the device layer by layer, cast or quantized
    (redline/converters/lora.py), so a base larger than the device in full precision can be fine-tuned. A caller's
    `init` that works on the device (DPO's reference pass) gets the model there instead."""
    if not on_host:
        return GPT(cfg.model).to(device)
    with torch.device("meta"):
        model = GPT(cfg.model)
    return model.to_empty(device="cpu")


def open_run(cfg: TrainConfig, resume_from: Path | None, data: Callable[[Path], TrainingData] | None):
    """The run's config (with init_from's architecture), directory, data source, init_from checkpoint (a new run
    only) and resume point: (cfg, run_dir, source, init_point, resumed)."""
    # init_from: the checkpoint's architecture and tokenizer (a resumed run has both in its own config already)
    init_point = InitPoint.read(cfg.init_from) if cfg.init_from and resume_from is None else None
    if init_point is not None:
        cfg = init_point.configure(cfg)
        cfg.validate()
    if cfg.lora.enabled and cfg.optim.name == "muon" and resume_from is None:
        # Muon orthogonalises a whole weight matrix's update; a LoRA run trains only its rank-r factors, whose
        # recipe (and PEFT's) is AdamW. The modern presets' Muon default and a Muon-trained base both lead here.
        cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, name="adamw"))
        if dist_info().rank == 0:
            print("redline: LoRA trains its adapters with AdamW (optim.name=muon is for whole matrices; "
                  "optim.name=prodigy is the learning-rate-free choice)", file=sys.stderr)
    run_dir = resume_from.parent.parent if resume_from else new_run_dir(cfg)
    if resume_from is None:
        refuse_used_run_dir(run_dir, dist_info().world_size == 1)
    source = (data(run_dir) if data is not None else
              ShardData(resolve_data(cfg, run_dir, init_point.tokenizer if init_point else None)))
    if init_point is not None and data is None:
        init_point.check_tokenizer(source.tokenizer, source.name)
        source.tokenizer = init_point.tokenizer  # the same ids, with the checkpoint's stop ids and chat template
    resumed = ResumePoint.read(resume_from, source.tokenizer, source.name) if resume_from else None
    if resumed is not None and cfg.init_from and data is None:
        from redline.tokenizer import load_tokenizer  # the same ids (checked): the init's stop ids and chat template

        source.tokenizer = load_tokenizer(str(resumed.checkpoint / "tokenizer"))
    return cfg, run_dir, source, init_point, resumed


def with_run_vocabulary(cfg: TrainConfig, tokenizer, fine_tuning: bool) -> TrainConfig:
    """cfg with the model's vocabulary for this run. Pretraining: the tokenizer's (the preset's is a default);
    init_from keeps the checkpoint's (an imported model's may be wider than its tokenizer); a fine-tuning data
    source only grows the model's (redline's chat tokens), never shrinks it."""
    if cfg.init_from:
        return cfg
    vocab = max(tokenizer.vocab_size, cfg.model.vocab_size) if fine_tuning else tokenizer.vocab_size
    return with_vocab_size(cfg, vocab)


def load_start_weights(cfg: TrainConfig, model: GPT, resumed: ResumePoint | None, init_point: InitPoint | None,
                       init: Callable[[GPT], None] | None = None) -> None:
    """The weights a run starts from, into the plain model before converters and wrapping: a resumed run's (the
    optimizer states and, sharded, the weights load after wrapping: ResumePoint.restore), a LoRA run's base (its
    adapters load once the converter has adapted the model), the caller's `init` (e.g. `redline sft`'s), or
    init_from's."""
    if resumed is not None and resumed.adapters != cfg.lora.enabled:
        raise UserError(f"checkpoint {resumed.checkpoint} is {'' if resumed.adapters else 'not '}from a LoRA run and "
                        f"this run has lora.enabled={cfg.lora.enabled}; resume with the settings it was trained "
                        f"with, or start a new run with init_from={resumed.checkpoint}")
    if resumed is not None and resumed.adapters:
        adapters.load_base(resumed.meta, resumed.checkpoint, model)
    elif resumed is not None and not resumed.sharded:
        ckpt_io.load_weights(resumed.checkpoint, model)
    elif resumed is None and init is not None:
        init(model)
    elif init_point is not None:
        ckpt_io.load_init_weights(model, init_point.checkpoint, verify=False)  # InitPoint.read verified it


def already_complete(cfg: TrainConfig, run_dir: Path, resumed: ResumePoint, info: DistInfo) -> RunResult:
    """`--resume` of a run whose checkpoint already reached the budget: say so and do nothing."""
    if info.is_main:
        budget = ", ".join(f"{name}={getattr(cfg, name)}" for name in ("max_steps", "max_tokens", "max_time")
                           if getattr(cfg, name))
        print(f"redline train: {run_dir} is already complete (step {resumed.step}, {resumed.tokens:,} tokens; "
              f"budget {budget}); raise the budget to train further, e.g. --resume max_steps=N", flush=True)
    return RunResult(run_dir, resumed.step, resumed.tokens, "already_complete", checkpoint=resumed.checkpoint)


# ----------------------------------------------------------------------------------------------------
# what surrounds the step


def batch_positions(batch: Any) -> int:
    """Input positions of one micro-batch: (x, y) windows or a dict with "inputs" (B, T); 0 when unknown."""
    inputs = batch.get("inputs") if isinstance(batch, dict) else batch[0] if isinstance(batch, (tuple, list)) else None
    return inputs.numel() if isinstance(inputs, torch.Tensor) else 0


POSTTRAIN_COMMANDS = ("sft", "dpo", "grpo")  # objectives whose runs are resumed by the command of their name


class Run:
    """One run's position (step, tokens, time), data, logs, evaluations and checkpoints around its TrainStep."""

    def __init__(self, cfg: TrainConfig, info: DistInfo, device: torch.device, run_dir: Path, source: TrainingData,
                 train_step: TrainStep, resumed: ResumePoint | None):
        self.cfg, self.info, self.device, self.run_dir = cfg, info, device, run_dir
        self.step_positions = 0  # input positions of the current step (micro_batches)
        self.source, self.tokenizer, self.train_step = source, source.tokenizer, train_step
        self.step, self.tokens = (resumed.step, resumed.tokens) if resumed else (0, 0)
        self.elapsed_before = resumed.elapsed if resumed else 0.0
        self.train_time_before = resumed.train_time if resumed else 0.0
        self.first_step = self.step  # this process's first step compiles
        self.shapes_seen: set[tuple[int, int]] = set()  # micro-batch shapes this process has trained (compiled) at
        self.paused_seconds = 0.0  # this process's wall time that is not training: compilation, evaluations, saves
        self.pause_started: float | None = None  # when the pause under way began
        self.stopped_at: float | None = None  # the training time when the loop ended
        seq_len, batch = cfg.effective_seq_len, cfg.batch_size
        self.train_loader = source.train_loader(cfg, info, device)
        if resumed is not None:
            self.train_loader.load_state_dict(resumed.state["loader"])
        self.unchecked: list[tuple[int, torch.Tensor]] = []  # (step, 1.0 if its update was skipped), not yet read
        self.bad_in_row = 0
        self.saved: tuple[int, Path | None] | None = None  # (step, path) of the last checkpoint written
        self.lora_base: dict | None = None  # a LoRA run: the reference to its base, in each checkpoint's meta
        self.resumed_meta = resumed.meta if resumed is not None else None
        self.best_bpb: float | None = None
        self.profiler = None  # profile_steps' profiler while it records (bench/profile.py)
        self.profiled = 0  # steps it has recorded
        self.log = self._open_log(resumed)
        model = train_step.model
        peak, measured_peak, gpu_name = peak_flops(device)
        flops_per_token = model.flops_per_token(seq_len)
        self.records = StepRecords(self.log, Throughput(flops_per_token, peak, measured_peak, info.world_size, device))
        plan, amp = train_step.plan, autocast_dtype(device, cfg.precision)
        at_most = "at most " if getattr(source, "rows_cut", False) else ""
        self.log.print(
            f"[bold]redline train[/bold] {cfg.preset}: {model.num_params() / 1e6:.2f}M parameters "
            f"({model.num_params(embeddings=False) / 1e6:.2f}M without embeddings), {flops_per_token / 1e9:.3f} "
            f"GFLOP/token | device {gpu_name} ×{info.world_size} | {amp or torch.float32} | batch {batch}×{seq_len}"
            f"{f' ×{plan.accum} accum' if plan.accum > 1 else ''} = "
            f"{at_most}{plan.tokens_per_step:,} tokens/step | run {run_dir}")
        for line in warm_up_lines(cfg):
            self.log.print(line)
        if device.type == "cuda" and peak is None:
            self.log.print(f"[yellow]{gpu_name} is not in the peak table: MFU is left out")
        steps = cfg.max_steps or (-(-cfg.max_tokens // plan.tokens_per_step) if cfg.max_tokens and not at_most else 0)
        for line in schedule_lines(cfg, steps) + data_lines(self.train_loader, plan.tokens_per_step, steps):
            self.log.print(line)
        if resumed is not None:
            self.log.print(f"resumed from {resumed.checkpoint} at step {self.step}")
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.start = time.perf_counter()
        self.start_progress = self.progress()
        self.log.start_progress(cfg.max_steps or None)

    def _open_log(self, resumed: ResumePoint | None) -> MetricsLogger:
        """The run directory's files and its metrics log (rank 0); a resumed run's metrics end at its checkpoint."""
        if not self.info.is_main:
            return MetricsLogger(None, enabled=False)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.run_dir / "config.json", json.dumps(to_dict(self.cfg), indent=2))
        write_atomic(self.run_dir / "environment.json", json.dumps(environment_snapshot(), indent=2, default=str))
        self.tokenizer.save(self.run_dir / "tokenizer")
        history = resume_metrics(self.run_dir, resumed.step) if resumed is not None else None
        log = MetricsLogger(self.run_dir, tensorboard=self.cfg.tensorboard)
        if history is not None:
            self.best_bpb = history.best_bpb
            if history.missing:
                count = sum(last - first + 1 for first, last in history.missing)
                log.log({"kind": "event", "event": "metrics_gap", "step": resumed.step, "missing_steps": count,
                         "ranges": history.missing})
                log.print(f"[yellow]metrics.jsonl has no record of {count} step(s) up to the checkpoint "
                          f"(first {history.missing[0][0]}); they were lost before this resume")
        return log

    def elapsed(self) -> float:
        """Training time of the whole run, this process's and that of the runs it resumed."""
        return self.elapsed_before + time.perf_counter() - self.start

    def train_time(self) -> float:
        """Training time of the whole run, max_time's clock: the wall time less the steps that compile (each
        process's first, and a warm-up's first at each batch shape), evaluations and checkpoints, so that runs
        with and without a warm compile cache, or evaluated more often, train for the same time. Stopped when the
        loop ends (the closing evaluation, checkpoint and sample are not training)."""
        if self.stopped_at is not None:
            return self.stopped_at
        now = time.perf_counter()
        pausing = now - self.pause_started if self.pause_started is not None else 0.0
        return self.train_time_before + now - self.start - self.paused_seconds - pausing

    def stop_clock(self) -> None:
        self.stopped_at = self.train_time()

    @contextmanager
    def paused(self, paused: bool = True):
        """Time inside the block does not count as training time (when `paused`). On a GPU the device is waited for
        on both sides, so the steps queued before the block count as training and the block's own work does not."""
        if not paused:
            yield
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.pause_started = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.paused_seconds += time.perf_counter() - self.pause_started
            self.pause_started = None

    def compiles(self) -> bool:
        """Whether the next step compiles (as far as the loop can tell): this process's first step, or the first
        step at a new micro-batch shape of a batch-size or sequence-length warm-up. Its time is not training time."""
        shape = (ramp_rows(self.cfg, self.step) or self.cfg.batch_size,
                 ramp_seq_len(self.cfg, self.step) or self.cfg.effective_seq_len)
        new = self.step == self.first_step or shape not in self.shapes_seen
        self.shapes_seen.add(shape)
        return new

    def progress(self) -> float:
        return budget_progress(self.cfg, self.step, self.tokens, self.train_time())

    def micro_batches(self) -> Iterator[Any]:
        """The next step's micro-batches, read one at a time as the step asks for them; counts the positions they
        hold (self.step_positions), since DPO and GRPO batches are cut to their longest row, not seq_len."""
        self.step_positions = 0
        rows = ramp_rows(self.cfg, self.step)  # a batch-size warm-up's smaller micro-batches (None: the full ones)
        length = ramp_seq_len(self.cfg, self.step)  # a sequence-length warm-up's shorter rows (None: the windows)
        for _ in range(self.train_step.plan.accum):
            batch = self.train_loader.next_batch(rows) if rows else self.train_loader.next_batch()
            if length:  # (B, T) windows of the stream -> (B·T/L, L) rows: the same tokens and next-token targets
                batch = tuple(t.reshape(-1, length) for t in batch)
            self.step_positions += batch_positions(batch)
            yield batch

    def profile_step(self):
        """The profiler's range around this step when profile_steps records it (started here at the step after
        profile_from's), else None."""
        cfg = self.cfg
        if self.profiler is None and cfg.profile_steps and self.step == cfg.profile_from and not self.profiled:
            from redline.bench.profile import StepsProfiler

            self.profiler = StepsProfiler(self.device)
            self.profiler.start()
        if self.profiler is None:
            return None
        self.profiled += 1
        return self.profiler.step_range(self.profiled - 1)

    def end_profile(self, done: bool) -> None:
        """Once profile_steps steps are recorded (or the loop has ended: done): each process writes its trace and
        summary under profile/ in the run folder, and rank 0 logs a `profile` record and prints its kernel time."""
        if self.profiler is None or (self.profiled < self.cfg.profile_steps and not done):
            return
        with self.paused():
            folder = self.run_dir / "profile"
            folder.mkdir(parents=True, exist_ok=True)
            rank = self.info.rank
            summary = self.profiler.stop(self.profiled, folder / f"trace-rank{rank}.json.gz")
            self.profiler = None
            summary = {"first_step": self.cfg.profile_from + 1, **summary}
            write_atomic(folder / f"rank{rank}.json", json.dumps(summary, indent=2))
        self.log.log({"kind": "profile", "step": self.step, **summary})
        groups = " | ".join(f"{name} {ms:.2f}" for name, ms in summary["groups_ms_per_step"].items() if ms > 0)
        self.log.print(f"[cyan]profile of steps {summary['first_step']}-{self.step}[/cyan] ({summary['timing']}, ms a "
                       f"step): {groups} | wall {summary['wall_ms_per_step']:.2f} under the profiler | {folder}")

    def advance(self, output: StepOutput, lr: float) -> None:
        self.step += 1
        # tokens the step computed on, over every process (each is assumed to hold as many as this one)
        tokens = self.step_positions * self.info.world_size or self.train_step.plan.tokens_per_step
        self.tokens += tokens
        self.unchecked.append((self.step, output.skipped))
        self.records.add(self.step, lr, output, tokens)
        for event in output.events:
            self.log.log({"kind": "event", **{k: v for k, v in event.items() if k != "message"}})
            self.log.print(event["message"])

    def diverged(self) -> bool:
        """Read the skipped-update flags since the last check; True when max_bad_steps in a row were reached."""
        if not self.unchecked:
            return False
        self.bad_in_row, diverged_at = count_bad_steps(self.unchecked, self.bad_in_row, self.cfg.max_bad_steps,
                                                       self.log)
        self.unchecked.clear()
        if diverged_at is None:
            return False
        self.log.print(f"[red bold]stopping: {self.bad_in_row} non-finite losses in a row at step {diverged_at}. The "
                       f"last good checkpoint is intact; lower optim.lr or raise optim.warmup_steps and resume from it.")
        return True

    def write_records(self, summary: bool) -> None:
        """The pending step records; summary: a log step's line with throughput and ETA (every rank calls this)."""
        if summary and self.device.type == "cuda":  # the clocks below count the steps' GPU work, not only their launch
            torch.cuda.synchronize(self.device)
        eta = eta_seconds(min(self.progress(), 1.0), self.start_progress, time.perf_counter() - self.start)
        self.records.write(self.tokens, self.elapsed(), summary, self.cfg.max_steps, eta, self.train_time())

    def show_progress(self) -> None:
        if self.log.progress is not None:
            progress = min(self.progress(), 1.0)
            self.log.progress.update(progress, self.step,
                                     eta_seconds(progress, self.start_progress, time.perf_counter() - self.start))

    def announce_start(self, init_point: InitPoint | None) -> None:
        """A LoRA run's reference to its base (in each checkpoint's meta) and init_from's event and line."""
        if self.cfg.lora.enabled:  # its checkpoints hold the adapters and name the base they adapt
            lora = self.train_step.converters.get("lora")
            if self.resumed_meta is not None:
                self.lora_base = self.resumed_meta[adapters.META_KEY]
                adapters.check_nf4_backend(self.lora_base, self.cfg.lora, lora.nf4_backend)
            else:
                self.lora_base = adapters.base_reference(init_point.checkpoint, lora.base_dtype, lora.nf4_backend)
        if init_point is not None:
            self.log.log({"kind": "event", "event": "init_from", "step": 0, "path": str(init_point.checkpoint)})
            self.log.print(f"weights from {init_point.checkpoint} (optimizer fresh, step 0)")

    def evaluate(self) -> dict:
        """Validation loss, perplexity and bits per byte, without the converters (BF16); logged and printed."""
        with self.train_step.evaluation() as model:
            result = self.source.evaluate(model, self.cfg, self.info, self.device)
        epoch = getattr(self.train_loader, "epoch", None)  # token shards: training epochs read so far
        self.log.log({"kind": "eval", "step": self.step, "tokens": self.tokens, "elapsed": self.elapsed(),
                      "train_time": self.train_time(), **({"epoch": round(epoch, 4)} if epoch is not None else {}),
                      **result})
        if hasattr(self.source, "eval_line"):  # a source whose evaluation measures something else (DPO, GRPO)
            self.log.print(f"[cyan]eval step {self.step}: {self.source.eval_line(result)}")
            return result
        self.log.print(f"[cyan]eval step {self.step}: loss {result['loss']:.4f} | ppl {result['perplexity']:.2f} | "
                       f"bpb {result['bpb']:.4f}")
        if result["bpb"] == result["bpb"]:
            self.best_bpb = result["bpb"] if self.best_bpb is None else min(self.best_bpb, result["bpb"])
        return result

    def save(self) -> Path | None:
        """A checkpoint of this step (collective), after writing the pending step records, so metrics.jsonl is
        complete up to every checkpoint. Returns its path on rank 0."""
        if self.saved is not None and self.saved[0] == self.step:
            return self.saved[1]  # this step is saved already (an interval save, then a signal)
        self.write_records(summary=False)
        self.log.flush(durable=True)
        cfg, info, train_step = self.cfg, self.info, self.train_step
        model, optimizers = train_step.model, train_step.optimizers
        state = {"loader": self.train_loader.state_dict(), "step": self.step, "tokens": self.tokens,
                 "elapsed": self.elapsed(), "train_time": self.train_time(), "rng": ckpt_io.rng_state(),
                 "world_size": info.world_size, "train_step": train_step.state_dict()}
        path = None
        # FSDP2: each rank writes its shards, unless the ranks share no filesystem (then gather, as below)
        if is_fsdp(model) and ckpt_io.every_rank_sees(self.run_dir / "checkpoints"):  # collective
            state["optimizer_types"] = [type(opt).__name__ for opt in optimizers]
            path = ckpt_io.save_sharded_checkpoint(self.run_dir, self.step, model, optimizers, state, to_dict(cfg),
                                                   self.tokenizer, cfg.keep_checkpoints)
        else:
            model_state, optimizer_states = full_state(model, optimizers)  # collective under FSDP2
            extra_meta = None
            if self.lora_base is not None:  # the adapters (and modules trained in full) alone
                model_state, extra_meta = adapters.adapter_state(model), {adapters.META_KEY: self.lora_base}
            if info.is_main:
                path = ckpt_io.save_checkpoint(self.run_dir, self.step, model, {**state, "optimizers": optimizer_states},
                                               to_dict(cfg), self.tokenizer, cfg.keep_checkpoints,
                                               model_state=model_state, extra_meta=extra_meta)
        if info.is_main:
            self.log.log({"kind": "event", "event": "checkpoint", "step": self.step, "path": str(path)})
            self.log.flush()
        barrier()
        self.saved = (self.step, path if info.is_main else None)
        return self.saved[1]

    def sample(self) -> str | None:
        """The closing sample: on rank 0 (under FSDP2 every rank takes part in each forward)."""
        if not (self.info.is_main or is_fsdp(self.train_step.model)):
            return None
        cfg = self.cfg
        with self.train_step.evaluation() as model:
            text = sample_text(model, self.tokenizer, cfg.sample_prompt, cfg.sample_tokens, self.device, seed=cfg.seed)
        self.log.print(f"[bold]sample[/bold] (prompt {cfg.sample_prompt!r}):\n{text}")
        return text

    def finish(self, status: str, stopped_by: int | None, final_eval: dict, checkpoint: Path | None) -> None:
        """The end event, the closing summary, and the logs closed."""
        if self.log.progress is not None:
            self.log.progress.close()
            self.log.progress = None
        self.log.log({"kind": "event", "event": "end", "status": status, "step": self.step, "tokens": self.tokens,
                      "elapsed": self.elapsed(), "train_time": self.train_time()})
        for line in self.summary(status, stopped_by, final_eval, checkpoint):
            self.log.print(line)
        self.log.close()

    def resume_command(self) -> str:
        name = self.train_step.objective.name
        return name if name in POSTTRAIN_COMMANDS else "train"

    def summary(self, status: str, stopped_by: int | None, final_eval: dict, checkpoint: Path | None) -> list[str]:
        took = format_duration(time.perf_counter() - self.start)
        total = format_duration(self.elapsed())
        head = (f"{self.step} steps, {self.tokens:,} tokens in {total}"
                + (f" ({took} in this process)" if self.elapsed_before else ""))
        bpb = f" | val bpb {final_eval['bpb']:.4f}" if "bpb" in final_eval else ""
        if self.best_bpb is not None and (not final_eval or self.best_bpb < final_eval.get("bpb", 0)):
            bpb += f" | best val bpb {self.best_bpb:.4f}"
        where = f" | checkpoint {checkpoint}" if checkpoint else ""
        if status == "completed":
            if self.resume_command() != "train":  # a post-trained model is talked to and scored on tasks
                return [f"[bold green]done[/bold green]: {head}{bpb}{where}",
                        f"next: redline chat --checkpoint {self.run_dir}   (or redline evaluate {self.run_dir} "
                        f"--tasks ...)"]
            return [f"[bold green]done[/bold green]: {head}{bpb}{where}",
                    f"next: redline generate --checkpoint {self.run_dir} --prompt \"{self.cfg.sample_prompt}\"   "
                    f"(or redline eval --checkpoint {self.run_dir})"]
        if status == "interrupted":
            return [f"[yellow]stopped by signal {stopped_by} at step {self.step}; checkpoint saved to {checkpoint}. "
                    f"{head}{bpb}",
                    f"next: redline {self.resume_command()} --resume {self.run_dir}"]
        last = ckpt_io.list_checkpoints(self.run_dir) if self.info.is_main else []
        return [f"[red]diverged at step {self.step}: {head}{bpb}",
                f"next: lower optim.lr and resume from {last[-1] if last else 'the start (no checkpoint yet)'}"]


# ----------------------------------------------------------------------------------------------------
# setup


def resolve_data(cfg: TrainConfig, run_root: Path, tokenizer=None) -> Path:
    """A prepared shard folder for cfg.data: the embedded corpus, a prepared folder, or raw text prepared now
    (data/raw.py). The tokenizer: data.tokenizer's when it names one, else `tokenizer` for raw text when given
    (init_from's), else a BPE trained on the text (the embedded corpus: its own)."""
    from redline.data.embedded import prepare_embedded
    from redline.data.prepare import check_prepared
    from redline.data.raw import prepare_raw_text

    if cfg.data.path is None:  # the embedded corpus, with its own BPE unless data.tokenizer names one
        from redline.tokenizer import load_tokenizer

        return prepare_embedded(tokenizer=load_tokenizer(cfg.data.tokenizer) if cfg.data.tokenizer else None)
    path = Path(cfg.data.path)
    if not path.exists():
        raise UserError(f"data path {path} does not exist; give prepared shards or .txt/.jsonl/.parquet files")
    if check_prepared(path):
        return path
    return prepare_raw_text(path, run_root / "data", cfg.effective_seq_len, cfg.data.tokenizer or tokenizer,
                            vocab_size=cfg.data.vocab_size or cfg.model.vocab_size)


def refuse_used_run_dir(run_dir: Path, check_metrics: bool = True, command: str = "train") -> None:
    """A new run must not write into another run's directory: their metrics would mix, and the other's newer
    checkpoints would stand for this one (eval, export and --resume take the newest). check_metrics: also a run
    that saved no checkpoint (one process only: under torchrun rank 0 may have started this run's metrics
    before another rank looks; checkpoints come only after steps every rank takes)."""
    if ckpt_io.list_checkpoints(run_dir):
        raise UserError(f"{run_dir} already holds a run; continue it with `redline {command} --resume {run_dir}`, or "
                        f"give another run_name")
    if check_metrics and (run_dir / "metrics.jsonl").exists():
        raise UserError(f"{run_dir} holds a run that saved no checkpoint; give another run_name, or delete it")


def new_run_dir(cfg: TrainConfig) -> Path:
    name = cfg.run_name or f"{cfg.preset}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.out_dir) / name


def find_resume_checkpoint(cfg: TrainConfig) -> Path | None:
    """The checkpoint `resume` points at: a path, or (auto) the newest of run_name / of the newest run."""
    if cfg.resume == "never":
        return None
    if cfg.resume != "auto":
        return ckpt_io.resolve_checkpoint(cfg.resume)
    if cfg.run_name:
        found = ckpt_io.list_checkpoints(Path(cfg.out_dir) / cfg.run_name)
        return found[-1] if found else None
    root = Path(cfg.out_dir)
    runs = [p for p in root.iterdir() if p.is_dir() and ckpt_io.list_checkpoints(p)] if root.is_dir() else []
    if not runs:
        return None
    newest = max(runs, key=lambda p: ckpt_io.list_checkpoints(p)[-1].stat().st_mtime)
    return ckpt_io.list_checkpoints(newest)[-1]


def warm_up_lines(cfg: TrainConfig) -> list[str]:
    """What a batch-size or sequence-length warm-up will do, a line each, for the run's opening lines (or that it
    changes nothing, when its rounding leaves one size)."""
    ramps = [  # (steps, the ramp's size at a step, the full size, what it says, why it would change nothing)
        (cfg.batch_ramp_steps, ramp_rows, cfg.batch_size, "batch-size warm-up: {} rows a micro-batch",
         f"batch_size {cfg.batch_size} in multiples of batch_ramp_multiple={cfg.batch_ramp_multiple} rows has one "
         f"size; lower it", "batch_ramp_steps"),
        (cfg.seq_ramp_steps, ramp_seq_len, cfg.effective_seq_len, "sequence-length warm-up: rows of {} tokens",
         f"seq_ramp_start is seq_len ({cfg.effective_seq_len}); give a shorter start", "seq_ramp_steps")]
    lines = []
    for steps, size, full, says, idle, name in ramps:
        if not steps:
            continue
        sizes = sorted({size(cfg, step) or full for step in range(steps)} | {full})  # then the full one
        lines.append(says.format(" → ".join(map(str, sizes))) + f" over the first {steps} steps" if len(sizes) > 1
                     else f"[yellow]{name}={steps} changes nothing: {idle}")
    return lines


def schedule_lines(cfg: TrainConfig, steps: int) -> list[str]:
    """Warnings for the run's opening lines where its learning-rate schedule cannot do what it is for (steps: the
    run's step budget as far as it is known, 0 if none)."""
    lines = []
    if not (cfg.max_steps or cfg.max_tokens or cfg.max_time) and cfg.optim.schedule != "constant":
        lines.append(f"[yellow]no budget (max_steps, max_tokens or max_time): the {cfg.optim.schedule} schedule never "
                     f"decays and the learning rate stays at its peak; give one to cool the run")
    if steps and cfg.optim.warmup_steps >= steps:  # e.g. a short fine-tune inheriting a pretraining warmup
        lines.append(f"[yellow]optim.warmup_steps={cfg.optim.warmup_steps} is not shorter than the run's {steps} "
                     f"steps: the learning rate never reaches its peak; lower optim.warmup_steps")
    for name in ("seq_ramp_steps", "batch_ramp_steps"):  # e.g. a short run of a modern preset (100 steps of it)
        if steps and getattr(cfg, name) >= steps:
            lines.append(f"[yellow]{name}={getattr(cfg, name)} is not shorter than the run's {steps} steps: it never "
                         f"trains on full-size batches; lower {name}")
    return lines


def data_lines(loader, tokens_per_step: int, steps: int) -> list[str]:
    """The training split's size and how many times the step budget reads it (steps: 0 if not known): a run past
    one epoch sees its windows again, reshuffled, and its validation loss falls less per step from there on.
    Only for token shards (a loader with total_tokens); conversations and pairs say their own epochs."""
    total = getattr(loader, "total_tokens", None)
    if not total:
        return []
    line = f"training data: {total:,} tokens"
    if steps:
        epochs = steps * tokens_per_step / total
        line += f"; {steps:,} steps of {tokens_per_step:,} tokens read {epochs:.2f} epochs of it"
        if epochs > 1:
            line += f" (the data repeats, reshuffled, from about step {-(-total // tokens_per_step):,})"
    return [line]


def budget_progress(cfg: TrainConfig, step: int, tokens: int, train_time: float) -> float:
    """Fraction of the budget used: the largest of the step, token and time fractions that are set (train_time:
    seconds of training, Run.train_time)."""
    parts = []
    if cfg.max_steps:
        parts.append(step / cfg.max_steps)
    if cfg.max_tokens:
        parts.append(tokens / cfg.max_tokens)
    if cfg.max_time:
        parts.append(train_time / (cfg.max_time * 60))
    return max(parts) if parts else 0.0


def count_bad_steps(unchecked: list[tuple[int, torch.Tensor]], bad_in_row: int, limit: int, log) -> tuple[int, int | None]:
    """Read the skipped-update flags of the steps since the last check (one host sync) and log each skipped step.
    Returns the number of non-finite steps in a row at the end, and the step at which `limit` in a row was first
    reached (None if it was not)."""
    flags = torch.stack([flag for _, flag in unchecked]).tolist()
    for (step, _), bad in zip(unchecked, flags):
        if not bad:
            bad_in_row = 0
            continue
        bad_in_row += 1
        log.log({"kind": "event", "event": "nonfinite_loss", "step": step})
        log.print(f"[red]step {step}: non-finite loss or gradient, update skipped ({bad_in_row} in a row)")
        if bad_in_row >= limit:
            return bad_in_row, step
    return bad_in_row, None


@torch.no_grad()
def sample_text(model: GPT, tokenizer, prompt: str, n_tokens: int, device: torch.device, seed: int = 0,
                temperature: float = 0.8, top_k: int | None = 50) -> str:
    ids = tokenizer.encode(prompt) or [tokenizer.eot_id]
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    out = model.generate(idx, n_tokens, temperature=temperature, top_k=top_k, generator=gen)
    model.train(was_training)
    return tokenizer.decode(out[0].tolist())
