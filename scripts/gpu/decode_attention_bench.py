"""Decode attention alone on this GPU, from the qkv projection's output to the attention output: the compiled
PyTorch path (QK-norm, RoPE, the cache writes and the masked softmax as torch.compile fuses them: what the
engine runs where the kernel cannot) against redline's Triton kernel (whole width, or split-K at several span
sizes), for the presets' shapes at a given width, with the cache in bf16 and in FP8 (float8_e4m3fn with a
scale per token and kv head).

    python scripts/gpu/decode_attention_bench.py [--width 768] [--repeats 20] [--shapes "gpt2-124m b64"]
        [--sweep]   # also the whole-width kernel at every (slots per step, warps, stages) of a small grid
        [--configs 128:4:2 64:4:3]   # or at these (slots per step:warps:stages) only

Each variant runs 20 times inside one CUDA graph; the graph is replayed `repeats` times and the median per call
is printed in µs, with the cache bytes read per µs (GB/s). One JSON line last.
"""

import argparse
import json

import torch
import torch.nn.functional as F

import redline.inference.kernels.decode_attention as td  # registers torch.ops.redline.decode_attention
from redline.inference.cache import cached_attention, dequantize_kv, quantize_kv
from redline.diagnostics.microbench import graph_time_us
from redline.model import apply_rope

SHAPES = {  # name: (batch, heads, kv heads, head_dim, QK-norm and RoPE)
    "modern-124m b1": (1, 12, 3, 64, True), "modern-124m b64": (64, 12, 3, 64, True),
    "gpt2-124m b1": (1, 12, 12, 64, False), "gpt2-124m b64": (64, 12, 12, 64, False),
    "modern-1.5b b1": (1, 25, 5, 64, True), "gpt2-1.5b b1": (1, 25, 25, 64, False),
    "qwen3-0.6b b1": (1, 16, 8, 128, True),
}
# the op's split argument: 0 its own choice, -1 the whole-width kernel, else the split kernel's span
SPLITS = {0: "auto", -1: "whole", 16: "split16", 32: "split32", 64: "split64", 128: "split128", 256: "split256"}
SWEEP = [(block, warps, stages) for block in (64, 128, 256) for warps in (2, 4, 8) for stages in (2, 3, 4)]


def pytorch_step(q, k, v, k_cache, v_cache, mask, slot: int, W: int, q_norm, k_norm, cos, sin, scales=None):
    """The engine's portable path for one layer: (B, H*D) out, the caches written at `slot` (scales: FP8's)."""
    B, KV, _, D = k_cache.shape
    q, k, v = q.view(B, -1, 1, D), k.view(B, KV, 1, D), v.view(B, KV, 1, D)
    if q_norm is not None:
        q, k = F.rms_norm(q, (D,), q_norm, 1e-5), F.rms_norm(k, (D,), k_norm, 1e-5)
        rope = cos[:, None, None, :], sin[:, None, None, :]
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    if scales is None:
        k_cache[:, :, slot] = k[:, :, 0]
        v_cache[:, :, slot] = v[:, :, 0]
        return cached_attention(q, k_cache[:, :, :W], v_cache[:, :, :W], mask).reshape(B, -1)
    (k_cache[:, :, slot], scales[0][:, :, slot]), (v_cache[:, :, slot], scales[1][:, :, slot]) = (
        quantize_kv(k[:, :, 0]), quantize_kv(v[:, :, 0]))
    keys = dequantize_kv(k_cache[:, :, :W], scales[0][:, :, :W], q.dtype)
    values = dequantize_kv(v_cache[:, :, :W], scales[1][:, :, :W], q.dtype)
    return cached_attention(q, keys, values, mask).reshape(B, -1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--configs", nargs="*", default=[])
    ap.add_argument("--maxnreg", nargs="*", type=int, default=[],
                    help="also the whole-width kernel at its tile with these register caps per thread")
    ap.add_argument("--splits", nargs="*", type=int, default=list(SPLITS), choices=list(SPLITS),
                    help="the op's split arguments to time (0 its own choice, -1 whole width, else the span)")
    ap.add_argument("--lanes-configs", nargs="*", default=[],
                    help="BLOCK:WARPS:STAGES tiles of the whole-width kernel without tensor cores (one query head "
                         "per kv head), each timed as whole_regs_<tile>")
    args = ap.parse_args()
    W = args.width
    slot = W - 1
    reference = torch.compile(pytorch_step, dynamic=False)
    rows = []
    for name in args.shapes:
        B, H, KV, D, modern = SHAPES[name]
        for cache in ("bf16", "fp8"):
            bf16 = {"device": "cuda", "dtype": torch.bfloat16}
            qkv = torch.randn(B, (H + 2 * KV) * D, **bf16)
            q, k, v = qkv.split([H * D, KV * D, KV * D], dim=1)
            k_cache, v_cache = torch.randn(B, KV, W + 1, D, **bf16), torch.randn(B, KV, W + 1, D, **bf16)
            scales, cache_bytes = None, 2 * B * KV * W * D * 2
            if cache == "fp8":
                (k_cache, k_scale), (v_cache, v_scale) = quantize_kv(k_cache), quantize_kv(v_cache)
                scales, cache_bytes = (k_scale, v_scale), 2 * B * KV * W * (D + 4)
            norms = [torch.rand(D, **bf16) + 0.5 for _ in range(2)] if modern else [None, None]
            angles = torch.rand(B, D // 2, device="cuda") * 6
            tables = [angles.cos(), angles.sin()] if modern else [None, None]
            slot_t = torch.full((B,), slot, device="cuda")
            counts = torch.zeros(max(td.counters_needed(KV), B * KV), dtype=torch.int32, device="cuda")
            mask = (torch.arange(W, device="cuda") <= slot)[None, None, None, :].expand(B, 1, 1, W)
            row = {"shape": name, "cache": cache, "B": B, "H": H, "KV": KV, "W": W, "cache_bytes": cache_bytes}

            def compiled():
                return reference(q, k, v, k_cache, v_cache, mask, slot, W, *norms, *tables, scales)

            row["pytorch_us"] = graph_time_us([compiled] * 20, args.repeats)
            ref = compiled().float()

            def op(split):
                if scales is not None:
                    return torch.ops.redline.decode_attention_fp8(qkv, k_cache, v_cache, *scales, slot_t, counts,
                                                                  W, 0, 1e-5, *norms, *tables, split)
                return torch.ops.redline.decode_attention(qkv, k_cache, v_cache, slot_t, counts, W, 0, 1e-5,
                                                          *norms, *tables, split)

            for split in args.splits:
                row[f"triton_{SPLITS[split]}_maxerr"] = (op(split).float() - ref).abs().max().item()
                row[f"triton_{SPLITS[split]}_us"] = graph_time_us([lambda split=split: op(split)] * 20, args.repeats)
            if H == KV:  # one query head per kv head: q·Kᵀ and p·V in registers, and on tensor cores
                defaults = td.SPLIT_MMA_FROM_GROUP, td.WHOLE_MMA_FROM_GROUP  # (read at each launch)
                for way, group in (("regs", 2), ("mma", 1)):
                    td.SPLIT_MMA_FROM_GROUP = td.WHOLE_MMA_FROM_GROUP = group
                    for split in [s for s in (-1, 0) if s in args.splits]:
                        row[f"triton_{SPLITS[split]}_{way}_maxerr"] = (op(split).float() - ref).abs().max().item()
                        row[f"triton_{SPLITS[split]}_{way}_us"] = graph_time_us([lambda split=split: op(split)] * 20,
                                                                                args.repeats)
                if B * KV >= td.WHOLE_FROM_PROGRAMS and -1 in args.splits:
                    lanes = td.WHOLE_LANES_BLOCK, td.WHOLE_LANES_WARPS, td.WHOLE_LANES_STAGES
                    td.WHOLE_MMA_FROM_GROUP = 2
                    for config in args.lanes_configs:
                        td.WHOLE_LANES_BLOCK, td.WHOLE_LANES_WARPS, td.WHOLE_LANES_STAGES = map(int, config.split(":"))
                        key = "triton_whole_regs_" + config.replace(":", "_")
                        row[key + "_maxerr"] = (op(-1).float() - ref).abs().max().item()
                        row[key + "_us"] = graph_time_us([lambda: op(-1)] * 20, args.repeats)
                    td.WHOLE_LANES_BLOCK, td.WHOLE_LANES_WARPS, td.WHOLE_LANES_STAGES = lanes
                td.SPLIT_MMA_FROM_GROUP, td.WHOLE_MMA_FROM_GROUP = defaults
            configs = SWEEP if args.sweep else [tuple(map(int, c.split(":"))) for c in args.configs]
            if configs and B * KV >= td.WHOLE_FROM_PROGRAMS:
                defaults = td.WHOLE_BLOCK, td.WHOLE_WARPS, td.WHOLE_STAGES, td.WHOLE_STAGES_ONE_HEAD
                for block, warps, stages in configs:  # (read at each launch)
                    td.WHOLE_BLOCK, td.WHOLE_WARPS, td.WHOLE_STAGES, td.WHOLE_STAGES_ONE_HEAD = block, warps, stages, stages
                    try:
                        row[f"whole_b{block}_w{warps}_s{stages}_us"] = graph_time_us([lambda: op(-1)] * 20, args.repeats)
                    except Exception as e:  # a tile that does not fit (shared memory): say so, go on
                        row[f"whole_b{block}_w{warps}_s{stages}_error"] = str(e).splitlines()[0][:200]
                td.WHOLE_BLOCK, td.WHOLE_WARPS, td.WHOLE_STAGES, td.WHOLE_STAGES_ONE_HEAD = defaults
            if B * KV >= td.WHOLE_FROM_PROGRAMS:
                for cap in args.maxnreg:
                    td.WHOLE_MAXNREG = cap
                    row[f"whole_maxnreg{cap}_maxerr"] = (op(-1).float() - ref).abs().max().item()
                    row[f"whole_maxnreg{cap}_us"] = graph_time_us([lambda: op(-1)] * 20, args.repeats)
                td.WHOLE_MAXNREG = None
            best = min((v, k) for k, v in row.items() if k.endswith("_us") and k != "pytorch_us")
            row["best"], row["best_us"] = best[1], best[0]
            rows.append(row)
            variants = [(k.removeprefix("triton_").removesuffix("_us"), v) for k, v in row.items()
                        if k.endswith("_us") and k != "pytorch_us"]
            print(f"{name:<16} {cache:<5} pytorch {row['pytorch_us']:7.2f} µs   "
                  + "   ".join(f"{s} {us:7.2f}" for s, us in variants)
                  + f"   best {best[1]} {best[0]:.2f} µs ({cache_bytes / best[0] / 1e3:,.0f} GB/s)", flush=True)
    print(json.dumps({"script": "decode_attention_bench.py", "device": torch.cuda.get_device_name(),
                      "width": W, "rows": rows}))


if __name__ == "__main__":
    main()
