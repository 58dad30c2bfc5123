"""DPO and GRPO speed on one GPU, against the baselines the post-training issue names.

    python scripts/gpu/posttrain_bench.py                    # modern-124m; JSON line last (and to --out)
    python scripts/gpu/posttrain_bench.py --preset gpt2-124m --batch-size 8 --seq-len 1024

1. DPO step vs SFT step, same batch (target <= 2.2x): a fresh TrainStep (compiled, as `redline sft` / `redline
   dpo` run it) per objective. SFT: batch_size rows of seq_len tokens, the loss on the second half. DPO:
   batch_size pairs, each a chosen and a rejected row of seq_len tokens with the same prompt half (so 2x the rows
   in one forward; the reference log-probabilities are precomputed, as `redline dpo` does).
2. GRPO rollouts vs bench-infer's batched decode (target >= 50%): decode tokens/s of the engine at batch
   `--rollout-batch` (64), 512-token prompts, 256 new tokens, stop tokens off, as `redline bench-infer` measures
   it (a bf16 copy of the model, greedy); then the same through GRPO's rollout path: the engine on the training
   model itself (fp32 master weights, no copy), sampling at temperature 1, the whole rollout timed (prefill
   included) and decode alone; and with grpo.rollout_weights=bf16 (a bf16 copy refreshed before each rollout).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from sft_bench import time_steps  # noqa: E402 (this folder is on sys.path when run as a script)


def config(preset: str, batch: int, seq_len: int, device: str):
    from redline.config import TrainConfig, parse

    cfg = parse(TrainConfig, ["--preset", preset, f"batch_size={batch}", f"seq_len={seq_len}", "max_steps=1",
                              "attn_autotune=False", f"device={device}"], prog="posttrain_bench", description="")
    return cfg


def dpo_vs_sft(args, device: torch.device) -> dict:
    from redline.posttrain.dpo import DPO
    from redline.training.objectives import SupervisedFineTuning

    B, T = args.batch_size, args.seq_len
    cfg = config(args.preset, B, T, args.device)
    g = torch.Generator(device=device).manual_seed(0)
    vocab = cfg.model.vocab_size
    rows = torch.randint(0, vocab, (2 * B, T + 1), device=device, generator=g)
    rows[B:, : T // 2 + 1] = rows[:B, : T // 2 + 1]  # a pair shares its prompt
    targets = rows[:, 1:].clone()
    targets[:, : T // 2] = -1  # the reply is the second half
    sft_batch = {"inputs": rows[:B, :-1], "targets": targets[:B]}
    dpo_batch = {"inputs": rows[:, :-1], "targets": targets, "index": torch.arange(B, device=device)}
    sft = time_steps(cfg, SupervisedFineTuning(), lambda: iter([sft_batch]), args.warmup, args.steps, device)
    # reference log-probabilities near the policy's (random weights give about -log(vocab) per token)
    reference = torch.full((B, 2), -(T // 2) * float(torch.log(torch.tensor(float(vocab)))))
    dpo = time_steps(cfg, DPO(0.1, reference=reference), lambda: iter([dpo_batch]), args.warmup, args.steps, device)
    print(f"SFT step  {sft * 1e3:8.1f} ms  ({B} x {T})\nDPO step  {dpo * 1e3:8.1f} ms  ({B} pairs: {2 * B} x {T})"
          f"  = {dpo / sft:.2f}x SFT (target <= 2.2x)", flush=True)
    return {"sft_step_ms": sft * 1e3, "dpo_step_ms": dpo * 1e3, "dpo_over_sft": dpo / sft,
            "target_2.2x_met": dpo / sft <= 2.2}


def decode_rate(engine, prompts: list[list[int]], new_tokens: int, sampling, repeats: int) -> tuple[float, float]:
    """(decode tokens/s over the batch, whole-call tokens/s): the median of `repeats` calls after a warm-up."""
    engine.generate(prompts, new_tokens, sampling)  # compile and capture
    decode, whole = [], []
    for _ in range(repeats):
        engine.generate(prompts, new_tokens, sampling)
        t = engine.last
        decode.append(t.decode_tokens_per_s * t.batch)
        whole.append(t.batch * t.steps / (t.total_s - t.setup_s))
    return sorted(decode)[len(decode) // 2], sorted(whole)[len(whole) // 2]


def rollouts_vs_decode(args, device: torch.device) -> dict:
    from redline.inference import InferenceEngine, SamplingParams
    from redline.model import GPT
    from redline.presets import get_preset

    torch.manual_seed(0)
    with torch.device(device):
        model = GPT(get_preset(args.preset))  # fp32 master weights, as training holds them
    B, P, N = args.rollout_batch, args.prompt_len, args.new_tokens
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, model.cfg.vocab_size, (B, P), generator=g).tolist()
    baseline = InferenceEngine(model)  # bench-infer's engine: a bf16 copy, greedy
    base_decode, base_whole = decode_rate(baseline, prompts, N, SamplingParams(), args.repeats)
    baseline.release()
    del baseline
    rollout = InferenceEngine(model, dtype=next(model.parameters()).dtype)  # GRPO's: the training weights
    assert rollout.model is model
    roll_decode, roll_whole = decode_rate(rollout, prompts, N, SamplingParams(temperature=1.0, seed=0), args.repeats)
    rollout.release()
    del rollout
    copy = InferenceEngine(model, dtype=torch.bfloat16)  # grpo.rollout_weights=bf16: a bf16 copy, sampling
    copy_decode, _ = decode_rate(copy, prompts, N, SamplingParams(temperature=1.0, seed=0), args.repeats)
    plan = copy.describe()
    ratio = roll_decode / base_decode
    print(f"bench-infer decode (bf16 copy, greedy)  {base_decode:12,.0f} tokens/s   whole call {base_whole:12,.0f}\n"
          f"GRPO rollout (training weights, T=1)    {roll_decode:12,.0f} tokens/s   whole call {roll_whole:12,.0f}"
          f"   = {ratio:.0%} of bench-infer (target >= 50%)\n"
          f"GRPO rollout (bf16 copy, T=1)           {copy_decode:12,.0f} tokens/s"
          f"   = {copy_decode / base_decode:.0%} of bench-infer (grpo.rollout_weights=bf16)", flush=True)
    return {"batch": B, "prompt_len": P, "new_tokens": N, "bench_infer_decode_tokens_per_s": base_decode,
            "rollout_decode_tokens_per_s": roll_decode, "bench_infer_call_tokens_per_s": base_whole,
            "rollout_call_tokens_per_s": roll_whole, "rollout_over_bench_infer": ratio, "target_0.5_met": ratio >= 0.5,
            "rollout_bf16_copy_decode_tokens_per_s": copy_decode,
            "rollout_bf16_copy_over_bench_infer": copy_decode / base_decode, "engine_plan_bf16_copy": plan}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="modern-124m")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rollout-batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cuda (the measurement); cpu only checks the script runs")
    parser.add_argument("--out", default=None, help="also write the JSON to this file")
    args = parser.parse_args()
    device = torch.device(args.device)
    assert device.type != "cuda" or torch.cuda.is_available(), "posttrain_bench needs a CUDA GPU"
    torch.backends.cuda.matmul.allow_tf32 = True
    result = {"preset": args.preset,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "dpo_vs_sft": dpo_vs_sft(args, device), "grpo_rollouts": rollouts_vs_decode(args, device)}
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()
