"""SFT-with-packing training speed against pretraining, same model, same batch, one GPU (TrainStep, compiled).

    python scripts/gpu/sft_bench.py                       # modern-124m, 16 x 1024, 10 warm-up + 30 timed steps
    python scripts/gpu/sft_bench.py --preset gpt2-124m --batch-size 8 --seq-len 2048

Modes, each a fresh TrainStep (the same one `redline train` and `redline sft` run):
  pretrain      language modeling on random token rows (the baseline)
  sft-flex      SFT on task:arithmetic conversations packed best-fit, document masking by flex attention
  sft-sdpa      the same rows, document masking by a dense SDPA mask (model.doc_attention=sdpa)
  sft-nopack    one conversation per row (the plain causal path; most of each row is padding)
tokens/s counts row slots (batch x seq_len per step) in every mode, so it compares the step's speed; the
"real" column is the share of slots holding conversation tokens. Target (the post-training issue): sft-flex at
>= 90% of pretrain. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch


def build(preset: str, batch: int, seq_len: int, doc_attention: str):
    from redline.config import TrainConfig, parse

    cfg = parse(TrainConfig, ["--preset", preset, f"batch_size={batch}", f"seq_len={seq_len}", "max_steps=1",
                              "attn_autotune=False"], prog="sft_bench", description="")
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, doc_attention=doc_attention))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(cfg, objective, batches, warmup: int, steps: int, device: torch.device) -> float:
    from redline.training.step import TrainStep

    step = TrainStep(cfg, device, objective=objective)
    for _ in range(warmup):
        step.step(batches(), 1.0)
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        out = step.step(batches(), 1.0)
    out.loss.item()
    _sync(device)
    seconds = (time.perf_counter() - start) / steps
    del step
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="modern-124m")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", default="cuda", help="cuda (the measurement); cpu only checks the script runs")
    args = parser.parse_args()
    device = torch.device(args.device)
    assert device.type != "cuda" or torch.cuda.is_available(), "sft_bench needs a CUDA GPU"
    torch.backends.cuda.matmul.allow_tf32 = True

    from redline.distributed import DistInfo
    from redline.tokenizer import ByteTokenizer
    from redline.training.conversations import ConversationData
    from redline.training.objectives import LanguageModeling, SupervisedFineTuning

    B, T = args.batch_size, args.seq_len
    tok = ByteTokenizer()
    tok.add_chat_tokens()
    results = {}
    for mode in ("pretrain", "sft-flex", "sft-sdpa", "sft-nopack"):
        cfg = build(args.preset, B, T, "sdpa" if mode == "sft-sdpa" else "auto")  # auto: flex on CUDA
        cfg = dataclasses.replace(cfg, device=args.device)
        if mode == "pretrain":
            g = torch.Generator(device=device).manual_seed(0)
            rows = torch.randint(0, cfg.model.vocab_size, (B, T + 1), device=device, generator=g)
            batches, objective, real = (lambda: iter([(rows[:, :-1], rows[:, 1:])])), LanguageModeling(), 1.0
        else:
            data = ConversationData.load("task:arithmetic", tok, T, packing=mode != "sft-nopack")
            loader = data.train_loader(cfg, DistInfo(), device)
            batch = loader.next_batch()
            real = float((batch["inputs"] != 0).float().mean())
            batches, objective = (lambda: iter([batch])), SupervisedFineTuning()
        seconds = time_steps(cfg, objective, batches, args.warmup, args.steps, device)
        results[mode] = {"step_ms": seconds * 1e3, "tokens_per_s": B * T / seconds, "real_fraction": real}
        print(f"{mode:<11} {seconds * 1e3:8.1f} ms/step {B * T / seconds:12,.0f} tokens/s  real {real:.0%}",
              flush=True)
    ratio = results["sft-flex"]["tokens_per_s"] / results["pretrain"]["tokens_per_s"]
    print(json.dumps({"preset": args.preset, "batch": B, "seq_len": T, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                      "modes": results, "sft_flex_vs_pretrain": ratio, "target_0.90_met": ratio >= 0.90}))


if __name__ == "__main__":
    main()
