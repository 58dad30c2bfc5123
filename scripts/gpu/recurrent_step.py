"""Training step time of recurrent layers on one GPU: a 12-layer, width-768 model (vocab 32768, 12 heads of 64, 4 kv
heads) with attention on every layer, against the same model with gated delta nets on 9 of its 12 layers (Qwen3.5's
3:1: 12 value heads of 64 reading 6 key heads of 64, gated attention on the others) and with Mamba-2 layers there
(Granite 4.0's: 24 heads of 64, one group of B and C with a state of 128, attention without positions on the others);
the same split into Nemotron-H's blocks of one sublayer each (24 blocks), and Falcon-H1's layers (attention with
RoPE and a Mamba-2 mixer side by side in all 12).
Compiled, bf16 autocast, fused AdamW, batch 8 x 2048 random tokens; 8 steps, the median of steps 3-8.

    python scripts/gpu/recurrent_step.py                 # all five
    python scripts/gpu/recurrent_step.py --only mamba2   # one (a substring of its name)
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from redline.model import GPT, ModelConfig

BASE = ModelConfig(vocab_size=32768, context_len=2048, n_layer=12, n_embd=768, n_head=12, n_kv_head=4, qk_norm=True,
                   norm_unit_offset=True, head_size=64)
RECURRENT = tuple(i for i in range(12) if (i + 1) % 4)
MODELS = {
    "attention": BASE,
    "gated delta 3:1": replace(BASE, attn_gate="element", rope_dims=32, delta_layers=RECURRENT, delta_heads=12,
                               delta_key_heads=6, delta_key_dim=64, delta_value_dim=64),
    "mamba2 3:1": replace(BASE, qk_norm=False, norm_unit_offset=False, pos_emb="none", delta_rule="mamba2",
                          delta_layers=RECURRENT, delta_heads=24, delta_key_heads=1, delta_key_dim=128,
                          delta_value_dim=64, delta_conv_bias=True),
}
# Nemotron-H's blocks of one sublayer: the Mamba-2 3:1 model above split into 24 blocks, each mixer (Mamba-2, or
# attention on every fourth) and each MLP a block of its own
MODELS["nemotron-h 3:1 (one sublayer a block)"] = replace(
    MODELS["mamba2 3:1"], n_layer=24, delta_layers=tuple(2 * i for i in RECURRENT),
    mlp_free_layers=tuple(range(0, 24, 2)), mixer_free_layers=tuple(range(1, 24, 2)))
# Falcon-H1's: attention and Mamba-2 side by side in every one of the 12 layers
MODELS["falcon-h1 parallel"] = replace(MODELS["mamba2 3:1"], delta_layers=tuple(range(12)), delta_parallel=True,
                                       pos_emb="rope")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run the models whose name contains this")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("recurrent_step.py: no CUDA GPU visible")
    for name, cfg in MODELS.items():
        if args.only and args.only not in name:
            continue
        torch.manual_seed(0)
        model = GPT(cfg).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        step = torch.compile(model)
        idx = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")
        times = []
        for _ in range(8):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step(idx, idx)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        median = statistics.median(times[2:])
        print(f"{name}: first step (compile) {times[0]:.1f} s, median of steps 3-8 {median * 1e3:.1f} ms, "
              f"{args.batch * args.seq / median:,.0f} tok/s, loss {loss.item():.3f}", flush=True)
        del model, opt, step
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
