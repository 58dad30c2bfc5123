#!/usr/bin/env python3
"""A plain PyTorch GPT-2 124M training step: the baseline `redline bench` is compared with.

Written from scratch on purpose, sharing no code with redline: GPT-2 small (12 layers, 768 wide, 12 heads,
learned positions, pre-LayerNorm with bias, tanh-GELU MLP, tied embeddings, vocab 50304), fused AdamW, bf16
autocast, the SDPA default backend, torch.compile of the whole model (default mode), gradient clipping at 1.0,
random tokens. The usual nanoGPT-style step: nothing tuned beyond what a careful user writes by hand.

    python3 scripts/gpu/plain_gpt2_baseline.py                     # B=32, T=1024, compiled
    python3 scripts/gpu/plain_gpt2_baseline.py --batch-size 16 --no-compile

Timing: the first step (compile) and the rest of the warm-up are timed separately and excluded; each timed
step is measured with CUDA events; tokens/s from the median step. MFU = (6N + 12·L·d·T) × tokens/s / peak,
N = parameters without the position table (the head is tied), peak = the datasheet dense bf16 figure for the
GPUs named below (else none). Prints a table, then one JSON line; with $OUT set, also writes
$OUT/plain_gpt2_baseline.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DATASHEET_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "H200": 989.0, "A100": 312.0}


class SelfAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = SelfAttention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab=50304, ctx=1024, layers=12, d=768, heads=12):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def datasheet_peak(name: str) -> float | None:
    for key in ("H100 PCIe", "H100 NVL", "H100", "H200", "A100"):
        if all(part in name for part in key.split()):
            return DATASHEET_BF16_TFLOPS[key] * 1e12
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("plain_gpt2_baseline.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    model = GPT2().to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), fused=True)
    step_model = model if args.no_compile else torch.compile(model)
    B, T = args.batch_size, args.seq_len
    data = torch.randint(0, 50257, (4, B, T + 1), device=device)

    def step(i: int) -> torch.Tensor:
        tokens = data[i % 4]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step(0)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for i in range(1, args.warmup):
        step(i)
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0
    events = []
    for i in range(args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step(i)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in events]
    median = statistics.median(ms)
    tokens_per_second = B * T / (median / 1e3)
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    flops_per_token = 6 * n + 12 * 12 * 768 * T
    name = torch.cuda.get_device_name()
    peak = datasheet_peak(name)
    mfu = flops_per_token * tokens_per_second / peak if peak else None
    result = {
        "name": "plain_gpt2_124m", "gpu": name, "torch": torch.__version__, "batch_size": B, "seq_len": T,
        "compile": not args.no_compile, "params": n + model.wpe.weight.numel(), "flops_per_token": flops_per_token,
        "first_step_seconds": first, "warmup_seconds": warmup_s, "warmup_steps": args.warmup, "timed_steps": args.steps,
        "step_ms_median": median, "step_ms_min": min(ms), "step_ms_max": max(ms),
        "tokens_per_second": tokens_per_second, "mfu": mfu, "peak_tflops": peak / 1e12 if peak else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30, "loss_last": loss.item(), "status": "ok",
    }
    print(f"{'plain GPT-2 124M':<22} B={B} T={T} {'compiled' if result['compile'] else 'eager'} on {name}")
    print(f"  first step (compile) {first:6.1f} s   warm-up total {warmup_s:6.1f} s")
    mfu_text = f"MFU {mfu * 100:.1f}%" if mfu else "MFU n/a (GPU not in the table)"
    print(f"  step {median:7.2f} ms (min {min(ms):.2f}, max {max(ms):.2f})   {tokens_per_second:,.0f} tokens/s   {mfu_text}")
    print(f"  peak memory {result['peak_memory_gib']:.1f} GiB")
    line = json.dumps(result)
    print(line)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "plain_gpt2_baseline.json"), "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
