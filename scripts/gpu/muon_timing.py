#!/usr/bin/env python3
"""What Muon costs in a training step: redline's batched Muon against torch.optim.Muon (one matrix at a time)
and against AdamW alone, on one GPU.

    python3 scripts/gpu/muon_timing.py                                  # modern-124m 16×2048, modern-1.5b 4×2048
    python3 scripts/gpu/muon_timing.py --points modern-124m:16x2048 --steps 30

For each point the model is built and compiled once (as `redline train` wraps it: redline/training/wrap.py),
then trained a few steps with each optimizer setup on the same compiled model:

    adamw         fused AdamW for every parameter (redline's default)
    torch-muon    torch.optim.Muon for the blocks' matrices + fused AdamW for the rest
    redline-muon  redline/training/muon.py (batched by shape, compiled) + fused AdamW for the rest
    redline-muon-matmul  the same with every Newton–Schulz product by torch.matmul (optim.muon_symmetric=False)

Each timed step (after the warm-up steps, which compile) is bracketed by CUDA events, and so is the Muon
optimizer's `step()` inside it; the tables give medians. "muon share" is the Muon step's GPU time over the
whole step's, and "share at N" the same Muon step's share of an optimizer step of N tokens (gradient
accumulation: the measured micro-step times the micro-steps it takes, computed, not run); "vs adamw" is the
whole step against the AdamW-only step. redline's Muon step also runs once
under torch.cuda.set_sync_debug_mode("error"): any host synchronisation in it would raise. Random tokens:
this times the step, it measures no quality. Prints a table, then one JSON line; with $OUT set, also writes
$OUT/muon_timing.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from redline.config import OptimConfig, TrainConfig, apply_preset  # noqa: E402
from redline.converters import build_converters  # noqa: E402
from redline.distributed import DistInfo  # noqa: E402
from redline.model import GPT  # noqa: E402
from redline.training.muon import Muon  # noqa: E402
from redline.training.optim import build_optimizers, param_groups  # noqa: E402
from redline.training.wrap import wrap_model  # noqa: E402

SETUPS = ("adamw", "torch-muon", "redline-muon", "redline-muon-matmul")


def optimizers_for(setup: str, model: GPT, device: torch.device) -> list[torch.optim.Optimizer]:
    if setup == "adamw":
        return build_optimizers(model, OptimConfig(name="adamw"), device)
    if setup == "redline-muon":  # the symmetric products in redline's kernel, as on any CUDA GPU with triton
        return build_optimizers(model, OptimConfig(name="muon"), device)
    if setup == "redline-muon-matmul":  # every product by torch.matmul
        return build_optimizers(model, OptimConfig(name="muon", muon_symmetric=False), device)
    hidden, embed_head, gains = param_groups(model)
    cfg = OptimConfig()
    muon = torch.optim.Muon(hidden, lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay,
                            nesterov=True)
    adam = torch.optim.AdamW([{"params": embed_head, "weight_decay": cfg.weight_decay},
                              {"params": gains, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True)
    return [muon, adam]


def profile_muon(optimizers: list[torch.optim.Optimizer], muon, steps: int = 3, top: int = 12) -> None:
    """Print the GPU kernels of a few Muon steps (the gradients are the last step's), top first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            muon.step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events) / steps
    print(f"    GPU kernels of one Muon step: {total / 1e3:.2f} ms in total; the top {top}:")
    for e in events[:top]:
        print(f"    {e.device_time_total / steps / 1e3:8.3f} ms  {e.count // steps:4d}×  {e.key[:90]}")


def time_setup(setup: str, model: GPT, train_model, batch: tuple[torch.Tensor, torch.Tensor], warmup: int,
               steps: int, device: torch.device, profile: bool = False) -> dict:
    optimizers = optimizers_for(setup, model, device)
    muon = next((o for o in optimizers if isinstance(o, Muon | torch.optim.Muon)), None)
    params = [p for p in model.parameters() if p.requires_grad]
    x, y = batch
    step_ms, muon_ms = [], []
    no_sync = None
    for i in range(warmup + steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        muon_start, muon_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = train_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for opt in optimizers:
            if opt is muon:
                muon_start.record()
                if setup.startswith("redline-muon") and i == warmup - 1:  # compiled by now: check it never waits
                    torch.cuda.set_sync_debug_mode("error")
                    try:
                        opt.step()
                        no_sync = True
                    except RuntimeError as error:
                        no_sync = f"synchronised: {error}".splitlines()[0]
                        torch.cuda.set_sync_debug_mode("default")
                        opt.step()
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
                else:
                    opt.step()
                muon_end.record()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            step_ms.append(start.elapsed_time(end))
            if muon is not None:
                muon_ms.append(muon_start.elapsed_time(muon_end))
    if profile and muon is not None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = train_model(x, y)  # fresh gradients for the profiled steps
        loss.backward()
        profile_muon(optimizers, muon)
    del optimizers, muon
    torch.cuda.empty_cache()
    out = {"setup": setup, "step_ms": statistics.median(step_ms), "step_ms_min": min(step_ms),
           "loss": loss.item()}
    if muon_ms:
        out["muon_ms"] = statistics.median(muon_ms)
        out["muon_share"] = out["muon_ms"] / out["step_ms"]
    if no_sync is not None:
        out["no_host_sync"] = no_sync
    return out


def time_point(preset: str, batch_size: int, seq_len: int, warmup: int, steps: int, setups: list[str],
               profile: bool, step_tokens: int) -> list[dict]:
    device = torch.device("cuda")
    cfg = TrainConfig()
    apply_preset(cfg, preset)
    cfg.batch_size, cfg.seq_len, cfg.compile, cfg.precision = batch_size, seq_len, True, "bf16"
    torch.manual_seed(0)
    model = GPT(cfg.model).to(device)
    train_model = wrap_model(model, cfg, device, DistInfo(), build_converters(cfg, device)).module
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, cfg.model.vocab_size, (batch_size, seq_len + 1), device=device, generator=gen)
    batch = (tokens[:, :-1], tokens[:, 1:])
    rows = []
    for setup in setups:
        row = time_setup(setup, model, train_model, batch, warmup, steps, device, profile)
        row.update(point=f"{preset} {batch_size}x{seq_len}", tokens_per_second=batch_size * seq_len / row["step_ms"] * 1e3)
        if "muon_ms" in row:  # the same optimizer step after step_tokens / (batch × seq) micro-batches
            micro = row["step_ms"] - row["muon_ms"]
            accum = max(1, step_tokens // (batch_size * seq_len))
            row["muon_share_at_step_tokens"] = row["muon_ms"] / (micro * accum + row["muon_ms"])
        rows.append(row)
        print(f"  {setup}: step {row['step_ms']:.1f} ms" + (f", Muon {row['muon_ms']:.2f} ms" if "muon_ms" in row else ""),
              flush=True)
    adamw = next((r["step_ms"] for r in rows if r["setup"] == "adamw"), None)
    for row in rows:
        row["vs_adamw"] = row["step_ms"] / adamw - 1 if adamw else None
    del model, train_model
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", nargs="+", default=["modern-124m:16x2048", "modern-1.5b:4x2048"],
                        help="PRESET:BATCHxSEQ, e.g. modern-124m:16x2048")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--setups", nargs="+", choices=SETUPS, default=list(SETUPS))
    parser.add_argument("--step-tokens", type=int, default=524288,
                        help="also give Muon's share of an optimizer step of this many tokens (gradient accumulation)")
    parser.add_argument("--profile", action="store_true", help="print the GPU kernels of each Muon step, top first")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("muon_timing.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    rows = []
    for point in args.points:
        preset, shape = point.split(":")
        batch_size, seq_len = (int(v) for v in shape.lower().split("x"))
        print(f"{preset} {batch_size}x{seq_len}:", flush=True)
        rows += time_point(preset, batch_size, seq_len, args.warmup, args.steps, args.setups, args.profile,
                           args.step_tokens)
    at = f"share at {args.step_tokens // 1024}k"
    print(f"\n{'point':<22} {'setup':<13} {'step ms':>8} {'tok/s':>10} {'Muon ms':>8} {'Muon share':>10} "
          f"{at:>13} {'vs adamw':>9}")
    for r in rows:
        muon = f"{r['muon_ms']:.2f}" if "muon_ms" in r else "—"
        share = f"{r['muon_share']:.1%}" if "muon_share" in r else "—"
        share_at = f"{r['muon_share_at_step_tokens']:.1%}" if "muon_share_at_step_tokens" in r else "—"
        vs = f"{r['vs_adamw']:+.1%}" if r["vs_adamw"] is not None else "—"
        print(f"{r['point']:<22} {r['setup']:<13} {r['step_ms']:>8.1f} {r['tokens_per_second']:>10,.0f} {muon:>8} "
              f"{share:>10} {share_at:>13} {vs:>9}")
    result = {"script": "muon_timing", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "rows": rows}
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "muon_timing.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
