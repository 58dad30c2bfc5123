"""Decode attention alone on this GPU: the compiled masked-softmax path ("matmul", the engine's choice
where the kernel cannot run) against
redline's Triton kernels (whole width, or split-K at several span sizes), for the cache shapes of the presets at a given width.

    python scripts/gpu/decode_attention_bench.py [--width 768] [--repeats 20]

Each variant runs 20 times inside one CUDA graph; the graph is replayed `repeats` times and the median per call
is printed in µs, with the cache bytes read per µs (GB/s). One JSON line last.
"""

import argparse
import json
import statistics

import torch

import redline.inference.triton_decode  # noqa: F401  registers torch.ops.redline.decode_attention
from redline.inference.engine import cached_attention

SHAPES = {  # name: (batch, heads, kv heads, head_dim)
    "modern-124m b1": (1, 12, 3, 64), "modern-124m b64": (64, 12, 3, 64),
    "gpt2-124m b1": (1, 12, 12, 64), "gpt2-124m b64": (64, 12, 12, 64),
    "modern-1.5b b1": (1, 25, 5, 64), "gpt2-1.5b b1": (1, 25, 25, 64),
}
# the op's split argument: 0 its own choice, -1 the whole-width kernel, else the split kernel's span
SPLITS = {0: "auto", -1: "whole", 64: "split64", 128: "split128", 256: "split256"}


def time_graph(fn, repeats: int, calls: int = 20) -> float:
    """Median µs per call of fn() replayed from a CUDA graph of `calls` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    W = args.width
    reference = torch.compile(cached_attention, dynamic=False)
    rows = []
    for name, (B, H, KV, D) in SHAPES.items():
        q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, KV, W + 1, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        pad = torch.zeros(B, dtype=torch.long, device="cuda")
        slot = torch.tensor([W - 1], device="cuda")
        mask = (torch.arange(W, device="cuda") <= slot)[None, None, None, :].expand(B, 1, 1, W)
        kw, vw = k[:, :, :W], v[:, :, :W]
        cache_bytes = 2 * B * KV * W * D * 2
        row = {"shape": name, "B": B, "H": H, "KV": KV, "W": W}
        row["matmul_us"] = time_graph(lambda: reference(q, kw, vw, mask), args.repeats)
        ref = reference(q, kw, vw, mask).float()
        for split in SPLITS:
            op = lambda: torch.ops.redline.decode_attention(q[:, :, 0], kw, vw, pad, slot, 0, split)  # noqa: E731
            err = (op().reshape(B, 1, H * D).float() - ref).abs().max().item()
            row[f"triton_{SPLITS[split]}_us"] = time_graph(op, args.repeats)
            row[f"triton_{SPLITS[split]}_maxerr"] = err
        best = min((v, k) for k, v in row.items() if k.endswith("_us"))
        row["best"] = best[1]
        rows.append(row)
        variants = [(name, row[f"triton_{name}_us"]) for name in SPLITS.values()]
        print(f"{name:<16} matmul {row['matmul_us']:7.2f} µs   " + "   ".join(f"triton/{s} {us:7.2f}" for s, us in variants)
            + f"   best {best[1]} ({cache_bytes / best[0] / 1e3:,.0f} GB/s)", flush=True)
    print(json.dumps({"script": "decode_attention_bench.py", "device": torch.cuda.get_device_name(),
                      "width": W, "rows": rows}))


if __name__ == "__main__":
    main()
