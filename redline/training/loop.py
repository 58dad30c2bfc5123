"""The training loop: setup → (resume) → steps with accumulation, eval, checkpoints → final sample.

One loop for every variant: architecture changes come through ModelConfig, optional features through
`wrap_model` (fixed order: converters → activation checkpointing → compile → data parallel).

Exactness: the learning rate is a pure function of (step, budget progress); the data loader's position,
every RNG and the optimizer states go into each checkpoint, so N steps straight and N/2 + resume + N/2
give the same losses on a CPU.

Checkpoints (redline/training/checkpoint.py): under FSDP2 every rank writes its own shards (the sharded layout),
elsewhere rank 0 writes the full one. Either resumes on any world size and under any `parallel`: the full
layout's weights load before wrapping and its optimizer states after; a sharded checkpoint loads after wrapping
and building the optimizers, so DCP can fill each rank's shards (or whole tensors without FSDP2).
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import torch

from redline.config import TrainConfig, to_dict
from redline.distributed import (DistInfo, all_reduce_mean, barrier, dist_info, exit_after_teardown, init_distributed,
                                 shutdown)
from redline.errors import UserError
from redline.hardware import autocast_dtype, environment_snapshot, peak_flops, resolve_device
from redline.model import GPT
from redline.training import checkpoint as ckpt_io
from redline.training.evaluate import evaluate
from redline.training.float8 import (StepCheck, describe_verdict, float8_disabled, precompute_fsdp_float8_scales,
                                     set_float8_for_step)
from redline.training.metrics import MetricsLogger, format_duration
from redline.training.optim import build_optimizers, lr_multiplier, set_lr, skips_on_device, step_if_finite
from redline.training.parallel import full_state, is_fsdp, load_optimizer_states, local_tensor, no_sync, set_fsdp_sync
from redline.training.wrap import wrap_model


@dataclass
class RunResult:
    run_dir: Path
    step: int
    tokens: int
    status: str  # "completed" | "interrupted" | "diverged"
    final_eval: dict = field(default_factory=dict)
    sample: str | None = None


class StopFlag:
    """SIGINT/SIGTERM set a flag; the loop saves a checkpoint at the end of the current step and exits."""

    def __init__(self):
        self.signal: int | None = None
        self._previous = {}

    def __enter__(self):
        if _in_main_thread():
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


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# ----------------------------------------------------------------------------------------------------
# setup


def resolve_data(cfg: TrainConfig, run_root: Path) -> Path:
    """A prepared shard folder for cfg.data: the embedded default, a prepared folder, or raw text prepared now."""
    from redline.data.embedded import prepare_embedded
    from redline.data.prepare import is_prepared, prepare

    if cfg.data.path is None:
        return prepare_embedded()
    path = Path(cfg.data.path)
    if not path.exists():
        raise UserError(f"data path {path} does not exist; give prepared shards or .txt/.jsonl/.parquet files")
    if is_prepared(path):
        return path
    out = run_root / "data"
    if is_prepared(out):
        return out
    from redline.tokenizer import load_tokenizer, train_bpe
    from redline.data.sources import iter_documents

    if cfg.data.tokenizer:
        tokenizer = load_tokenizer(cfg.data.tokenizer)
    else:
        tokenizer = train_bpe(_capped(iter_documents([str(path)]), 200_000_000), vocab_size=cfg.data.vocab_size)
    prepare([str(path)], out, tokenizer)
    return out


def _capped(docs, max_bytes: int):
    seen = 0
    for doc in docs:
        yield doc
        seen += len(doc)
        if seen >= max_bytes:
            return


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


def auto_batch_size(cfg: TrainConfig, device: torch.device, info: DistInfo) -> tuple[int, int]:
    """batch_size=auto: the largest micro-batch that fits (the smallest over ranks), and its accumulation."""
    from redline.training.fit import find_max_batch, gradient_accumulation

    if device.type != "cuda":
        raise UserError("batch_size=auto measures GPU memory and needs a CUDA GPU; give a number on this machine")
    result = find_max_batch(cfg, device, memory_fraction=cfg.memory_fraction)
    if result.batch_size is None:
        raise UserError(f"not even a micro-batch of 1 fits in {cfg.memory_fraction:.0%} of the GPU at seq_len "
                        f"{cfg.effective_seq_len}; try activation_checkpointing=full or a shorter seq_len")
    best = torch.tensor(result.batch_size, device=device)
    if info.enabled:
        import torch.distributed as dist

        dist.all_reduce(best, op=dist.ReduceOp.MIN)
    return gradient_accumulation(int(best), cfg.effective_seq_len, cfg.tokens_per_step, info.world_size)


def budget_progress(cfg: TrainConfig, step: int, tokens: int, elapsed: float) -> float:
    """Fraction of the budget used: the largest of the step, token and time fractions that are set."""
    parts = []
    if cfg.max_steps:
        parts.append(step / cfg.max_steps)
    if cfg.max_tokens:
        parts.append(tokens / cfg.max_tokens)
    if cfg.max_time:
        parts.append(elapsed / (cfg.max_time * 60))
    return max(parts) if parts else 0.0


# ----------------------------------------------------------------------------------------------------
# the loop


def train(cfg: TrainConfig, resume_from: Path | None = None) -> RunResult:
    from redline.data.loader import TokenLoader
    from redline.data.prepare import load_data_tokenizer

    cfg.validate()
    if not (cfg.max_steps or cfg.max_tokens or cfg.max_time):
        raise UserError("no budget: set max_steps, max_tokens or max_time (minutes)")
    info = dist_info()
    device = resolve_device(cfg.device, info.local_rank)
    init_distributed(info, device, cfg.dist_timeout)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    amp_dtype = autocast_dtype(device, cfg.precision)

    run_dir = resume_from.parent.parent if resume_from else new_run_dir(cfg)
    data_dir = resolve_data(cfg, run_dir)
    tokenizer = load_data_tokenizer(data_dir)
    if cfg.model.vocab_size != tokenizer.vocab_size:
        cfg.model.vocab_size = tokenizer.vocab_size  # the preset's vocab is a default: the data's tokenizer decides
    seq_len = cfg.effective_seq_len
    if cfg.batch_size == "auto":
        cfg.batch_size, _ = auto_batch_size(cfg, device, info)
    micro_tokens = cfg.batch_size * seq_len * info.world_size
    accum = 1
    if cfg.tokens_per_step:
        if cfg.tokens_per_step % micro_tokens:
            raise UserError(
                f"tokens_per_step={cfg.tokens_per_step} is not a multiple of batch_size × seq_len × world_size = "
                f"{micro_tokens}; use {max(1, round(cfg.tokens_per_step / micro_tokens)) * micro_tokens}"
            )
        accum = cfg.tokens_per_step // micro_tokens
    tokens_per_step = micro_tokens * accum

    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model).to(device)
    train_loader = TokenLoader(data_dir, "train", cfg.batch_size, seq_len, seed=cfg.seed, rank=info.rank,
                               world_size=info.world_size, expected_identity=tokenizer.identity, device=device)
    step, tokens, elapsed_before = 0, 0, 0.0
    if resume_from is not None:
        meta = ckpt_io.verify_checkpoint(resume_from)
        if meta.get("tokenizer_identity") != tokenizer.identity:
            raise UserError(f"checkpoint {resume_from} was trained with another tokenizer than the data in {data_dir}")
        sharded = ckpt_io.layout(meta) == ckpt_io.SHARDED
        if not sharded:
            ckpt_io.load_weights(resume_from, model)
        state = ckpt_io.load_state(resume_from)
        train_loader.load_state_dict(state["loader"])
        step, tokens, elapsed_before = state["step"], state["tokens"], state["elapsed"]
    train_model = wrap_model(model, cfg, device, info)
    # after wrapping: FSDP2 replaces the parameters with sharded ones
    optimizers = build_optimizers(model, cfg.optim, device)
    if resume_from is not None:
        if sharded:  # weights and optimizer states into this run's shards (DCP reshards from the saved world size)
            ckpt_io.load_sharded(resume_from, model, optimizers, state.get("optimizer_types"))
        else:
            load_optimizer_states(model, optimizers, state["optimizers"])
        if info.world_size == state.get("world_size", 1):
            ckpt_io.set_rng_state(state["rng"])  # another world size draws other dropout masks anyway

    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
        (run_dir / "environment.json").write_text(json.dumps(environment_snapshot(), indent=2, default=str))
        tokenizer.save(run_dir / "tokenizer")
    log = MetricsLogger(run_dir if info.is_main else None, tensorboard=cfg.tensorboard, enabled=info.is_main)
    token_bytes = torch.as_tensor(tokenizer.token_byte_lengths(), device=device)
    flops_per_token = model.flops_per_token(seq_len)
    peak, measured_peak, gpu_name = peak_flops(device)
    log.print(
        f"[bold]redline train[/bold] {cfg.preset}: {model.num_params() / 1e6:.2f}M parameters "
        f"({model.num_params(embeddings=False) / 1e6:.2f}M without embeddings), {flops_per_token / 1e9:.3f} GFLOP/token | "
        f"device {gpu_name} ×{info.world_size} | {amp_dtype or torch.float32} | batch {cfg.batch_size}×{seq_len}"
        f"{f' ×{accum} accum' if accum > 1 else ''} = {tokens_per_step:,} tokens/step | run {run_dir}"
    )
    if device.type == "cuda" and peak is None:
        log.print(f"[yellow]{gpu_name} is not in the peak table: MFU is left out")
    if resume_from is not None:
        log.print(f"resumed from {resume_from} at step {step}")

    val_loader = TokenLoader(data_dir, "val", cfg.batch_size, seq_len, rank=info.rank, world_size=info.world_size,
                             expected_identity=tokenizer.identity, device=device, prefetch=False)

    def val_batches():
        return val_loader.eval_batches(cfg.eval_batches)

    def run_eval() -> dict:
        with float8_disabled(model):  # evaluation always runs in BF16
            result = evaluate(model, val_batches(), token_bytes, amp_dtype, device)
        log.log({"kind": "eval", "step": step, "tokens": tokens, "elapsed": elapsed(), **result})
        log.print(f"[cyan]eval step {step}: loss {result['loss']:.4f} | ppl {result['perplexity']:.2f} | "
                  f"bpb {result['bpb']:.4f}")
        return result

    def save() -> Path | None:
        path = None
        state = {"loader": train_loader.state_dict(), "step": step, "tokens": tokens, "elapsed": elapsed(),
                 "rng": ckpt_io.rng_state(), "world_size": info.world_size, "fp8_auto_check": fp8_check.verdict}
        # FSDP2: each rank writes its shards, unless the ranks share no filesystem (then gather, as below)
        if is_fsdp(model) and ckpt_io.every_rank_sees(run_dir / "checkpoints"):  # collective
            state["optimizer_types"] = [type(opt).__name__ for opt in optimizers]
            path = ckpt_io.save_sharded_checkpoint(run_dir, step, model, optimizers, state, to_dict(cfg), tokenizer,
                                                   cfg.keep_checkpoints)
        else:
            model_state, optimizer_states = full_state(model, optimizers)  # collective under FSDP2
            if info.is_main:
                path = ckpt_io.save_checkpoint(run_dir, step, model, {**state, "optimizers": optimizer_states},
                                               to_dict(cfg), tokenizer, cfg.keep_checkpoints, model_state=model_state)
        if info.is_main:
            log.log({"kind": "event", "event": "checkpoint", "step": step, "path": str(path)})
        barrier()
        return path if info.is_main else None

    ctx = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
    params = [p for p in model.parameters() if p.requires_grad]
    start = time.perf_counter()

    def elapsed() -> float:
        return elapsed_before + time.perf_counter() - start

    pending: list[tuple[int, float, torch.Tensor, torch.Tensor]] = []  # per-step values, read at log steps
    unchecked: list[tuple[int, torch.Tensor]] = []  # (step, 1.0 if its update was skipped), not yet read
    on_device_skip = skips_on_device(optimizers)
    fp8_check = StepCheck(model, cfg.fp8, cfg.fp8_warmup_steps, device)
    if resume_from is not None:
        fp8_check.restore(state.get("fp8_auto_check"))
    window_start, window_tokens, bad_in_row = time.perf_counter(), 0, 0
    status, final_eval = "completed", {}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    with StopFlag() as stop:
        while True:
            progress = budget_progress(cfg, step, tokens, elapsed())
            if progress >= 1.0:
                break
            multiplier = lr_multiplier(cfg.optim, step, progress)
            if set_float8_for_step(model, step, cfg.fp8_warmup_steps):  # BF16 warm-up over: FP8 from here
                log.print(f"step {step}: FP8 on (the first {cfg.fp8_warmup_steps} steps train in BF16; one recompile)")
            fp8_check.begin(step)
            set_lr(optimizers, multiplier)
            loss_sum = torch.zeros((), device=device)
            for micro in range(accum):
                x, y = train_loader.next_batch()
                last_micro = micro == accum - 1
                set_fsdp_sync(model, last_micro)  # gradients are reduced on the last micro-step only
                with no_sync(train_model, last_micro):
                    with ctx:
                        loss = train_model(x, y)
                    (loss / accum).backward()
                loss_sum += loss.detach()
            loss_mean = loss_sum / accum
            grad_norm = local_tensor(torch.nn.utils.clip_grad_norm_(
                params, cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")))
            # a non-finite loss or gradient skips the update: on the device with fused AdamW (no host sync; the
            # host learns of it at the next log, eval or checkpoint step), else after one sync
            unchecked.append((step + 1, step_if_finite(optimizers, loss_mean, grad_norm)))
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            precompute_fsdp_float8_scales(model)  # FSDP2 with FP8 all-gather: next step's weight scales, one all-reduce
            if (verdict := fp8_check.end(step)) is not None:
                log.log({"kind": "event", "event": "fp8_auto_check", "step": step + 1, **verdict})
                log.print(describe_verdict(verdict))
            step += 1
            tokens += tokens_per_step
            window_tokens += tokens_per_step
            pending.append((step, cfg.optim.lr * multiplier, loss_mean, grad_norm))

            last = budget_progress(cfg, step, tokens, elapsed()) >= 1.0
            log_now = step % cfg.log_every == 0 or last or stop.signal is not None
            eval_now = bool(cfg.eval_every) and step % cfg.eval_every == 0 and not last
            save_now = bool(cfg.checkpoint_every) and step % cfg.checkpoint_every == 0 and not last
            if not on_device_skip or log_now or eval_now or save_now:
                bad_in_row, diverged_at = count_bad_steps(unchecked, bad_in_row, cfg.max_bad_steps, log)
                unchecked.clear()
                if diverged_at is not None:
                    status = "diverged"
                    log.print(f"[red bold]stopping: {bad_in_row} non-finite losses in a row at step {diverged_at}. The "
                              f"last good checkpoint is intact; lower optim.lr or raise optim.warmup_steps and resume from it.")
                    break
            if log_now:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                now = time.perf_counter()
                tokens_per_second = window_tokens / max(now - window_start, 1e-9)
                per_gpu = tokens_per_second / info.world_size
                losses = all_reduce_mean(torch.stack([p[2] for p in pending])).tolist()
                norms = torch.stack([p[3] for p in pending]).tolist()
                mfu = flops_per_token * per_gpu / peak if peak else None
                mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
                for (s, lr, _, _), loss_value, norm in zip(pending, losses, norms):
                    record = {"kind": "train", "step": s, "loss": loss_value, "lr": lr, "grad_norm": norm}
                    if s == step:
                        record.update(tokens=tokens, elapsed=elapsed(), tokens_per_second=tokens_per_second,
                                      step_time=(now - window_start) / len(pending), peak_memory_gib=mem)
                        if mfu is not None:
                            record["mfu"] = mfu
                        if measured_peak:
                            record["mfu_measured_peak"] = flops_per_token * per_gpu / measured_peak
                    log.log(record)
                total = progress_total(cfg, step, tokens, elapsed())
                eta = elapsed() * (1 - total) / total if total > 0 else 0
                log.print(
                    f"step {step:>6}{f'/{cfg.max_steps}' if cfg.max_steps else ''} | loss {losses[-1]:.4f} | "
                    f"lr {pending[-1][1]:.2e} | gnorm {norms[-1]:.2f} | {tokens_per_second / 1e3:,.1f}k tok/s"
                    + (f" | mfu {mfu * 100:.1f}%" if mfu is not None else "")
                    + (f" | mem {mem:.1f} GiB" if mem is not None else "")
                    + f" | eta {format_duration(eta)}"
                )
                log.flush()
                pending.clear()
                window_start, window_tokens = time.perf_counter(), 0
            if eval_now:
                run_eval()
            if save_now and bad_in_row == 0:
                save()
            if stop.signal is not None:
                status = "interrupted"
                break

    if status != "diverged":
        if status == "completed":
            final_eval = run_eval()
        path = save()
        if status == "interrupted" and path is not None:
            log.print(f"[yellow]stopped by signal {stop.signal} at step {step}; checkpoint saved to {path}. "
                      f"Resume with: redline train --resume {run_dir}")
    sample = None
    # under FSDP2 every rank takes part in each forward; otherwise rank 0 alone samples
    if status == "completed" and cfg.sample_tokens > 0 and (info.is_main or is_fsdp(model)):
        with float8_disabled(model):
            sample = sample_text(model, tokenizer, cfg.sample_prompt, cfg.sample_tokens, device, seed=cfg.seed)
        log.print(f"[bold]sample[/bold] (prompt {cfg.sample_prompt!r}):\n{sample}")
    log.log({"kind": "event", "event": "end", "status": status, "step": step, "tokens": tokens, "elapsed": elapsed()})
    log.close()
    shutdown()
    # a rank of a distributed run ends here, before this function's objects are freed: freed after the group's
    # teardown, one of them can wait forever on a gloo worker thread (seen on 2 CPU cores, 1 run in ~20, the
    # run itself finished and written). Same exit code as the command's; no-op in one process.
    exit_after_teardown(1 if status == "diverged" else 0)
    return RunResult(run_dir, step, tokens, status, final_eval, sample)


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


def progress_total(cfg: TrainConfig, step: int, tokens: int, elapsed: float) -> float:
    return min(budget_progress(cfg, step, tokens, elapsed), 1.0)


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
