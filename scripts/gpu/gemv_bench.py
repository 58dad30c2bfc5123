"""One-row matrix products (the batch-1 decode step's Linear layers) on this GPU: cuBLAS (F.linear with the
bias, what the engine runs by default), Inductor's tuned Triton reduction (torch.compile of x·Wᵀ + b with
coordinate-descent tuning, what `--kernel-tuning on` gives a layer without a norm before it), and redline's
Triton kernel (torch.ops.redline.gemv) at a sweep of tile sizes and at the tiles it picks itself.

    python scripts/gpu/gemv_bench.py [--repeats 10] [--quick]

Each shape is also timed with what the decode step fuses into it (the norm before, the activation after): the
op against the same as separate PyTorch kernels (the norm, F.linear, the activation).

The weights are rotated through enough copies to exceed the L2 cache (each call reads its weight from memory,
as in a decode step of a whole model): one CUDA graph calls each copy once, the graph is replayed `repeats`
times and the median µs per call is printed with the weight bytes read per µs (GB/s). One JSON line last.
"""

import argparse
import itertools
import json

import torch
import torch.nn.functional as F
import triton

import redline.inference.kernels.linear as tg
from redline.diagnostics.microbench import graph_time_us
from rows_linear_bench import separate  # this folder's: the layer as separate PyTorch kernels

SHAPES = {  # name: (N, K) of the weight, and what comes before and after it in the decode step (norm, act)
    "gpt2-124m qkv": (2304, 768, "layernorm", "none"), "gpt2-124m attn.proj": (768, 768, "none", "none"),
    "gpt2-124m fc": (3072, 768, "layernorm", "gelu_tanh"), "gpt2-124m mlp.proj": (768, 3072, "none", "none"),
    "gpt2-124m lm_head": (50304, 768, "layernorm", "none"),
    "gpt2-1.5b qkv": (4800, 1600, "layernorm", "none"), "gpt2-1.5b attn.proj": (1600, 1600, "none", "none"),
    "gpt2-1.5b fc": (6400, 1600, "layernorm", "gelu_tanh"), "gpt2-1.5b mlp.proj": (1600, 6400, "none", "none"),
    "gpt2-1.5b lm_head": (50304, 1600, "layernorm", "none"),
    "modern-1.5b qkv": (2240, 1600, "rmsnorm", "none"), "modern-1.5b fc": (8576, 1600, "rmsnorm", "swiglu"),
    "modern-1.5b mlp.proj": (1600, 4288, "none", "none"), "modern-1.5b lm_head": (32768, 1600, "rmsnorm", "none"),
    "qwen3-0.6b qkv": (4096, 1024, "rmsnorm", "none"), "qwen3-0.6b o_proj": (1024, 2048, "none", "none"),
    "qwen3-0.6b fc": (6144, 1024, "rmsnorm", "swiglu"), "qwen3-0.6b mlp.proj": (1024, 3072, "none", "none"),
    "qwen3-0.6b lm_head": (151936, 1024, "rmsnorm", "none"),
}
L2_BYTES = 50 * 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="a smaller tile sweep")
    ap.add_argument("--shapes", nargs="*", default=None, help="only the shapes whose name contains one of these")
    args = ap.parse_args()
    torch._dynamo.config.recompile_limit = 64  # one compilation per shape
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    tuned = torch.compile(lambda x, w, b: F.linear(x, w) + b, dynamic=False,
                          options={"coordinate_descent_tuning": True})
    sweep = list(itertools.product((1, 2, 4, 8, 16), (1024, 2048, 4096, 8192), (4, 8), (1,)))
    sweep += list(itertools.product((1, 2, 4, 8, 16), (1024,), (4, 8), (3,)))
    if args.quick:
        sweep = list(itertools.product((1, 2, 4), (1024, 4096), (4,), (1,)))

    def best_tiles(K, call):
        """(µs, tiles) of the fastest tiles for call(block_n, block_k, warps, stages)."""
        best = None
        for bn, bk, warps, stages in sweep:
            if bk > 2 * triton.next_power_of_2(K) or bn * bk > 32768:  # pointless, or too many registers
                continue
            t = graph_time_us(call(bn, bk, warps, stages), args.repeats)
            if best is None or t < best[0]:
                best = (t, f"n{bn}-k{bk}-w{warps}-s{stages}")
        return best

    rows = []
    for name, (N, K, norm, act) in SHAPES.items():
        if args.shapes and not any(part in name for part in args.shapes):
            continue
        copies = max(2, min(128, -(-3 * L2_BYTES // (N * K * 2))))
        ws = [torch.randn(N, K, **bf16) * 0.02 for _ in range(copies)]
        b = torch.randn(N, **bf16) * 0.02
        x = torch.randn(1, K, **bf16)
        r = torch.randn(1, N, **bf16)
        out = torch.empty(1, N, **bf16)
        gb = N * K * 2 / 1e3  # weight bytes / 1e3: divided by µs gives GB/s
        row = {"shape": name, "N": N, "K": K, "copies": copies}
        row["cublas_us"] = graph_time_us([lambda w=w: F.linear(x, w, b) for w in ws], args.repeats)
        row["inductor_tuned_us"] = graph_time_us([lambda w=w: tuned(x, w, b) for w in ws], args.repeats)
        row["triton_best_us"], row["triton_best_tiles"] = best_tiles(K, lambda bn, bk, warps, stages: [
            lambda w=w: tg.launch(x, w, b, None, "none", out, bn, bk, warps, stages) for w in ws])
        row["triton_op_us"] = graph_time_us([lambda w=w: torch.ops.redline.gemv(x, w, b) for w in ws], args.repeats)
        row["triton_op_tiles"] = "n{}-k{}-w{}".format(*tg.pick_blocks(N, K))
        # with what is fused into it in the decode step: the norm before (its weight and bias) and the activation
        # after, against the same as separate PyTorch kernels (the norm, then cuBLAS, then the activation)
        nw, nb = torch.rand(K, **bf16) + 0.5, torch.randn(K, **bf16) if norm == "layernorm" else None
        n_out = N // 2 if act == "swiglu" else N
        b_act = torch.randn(N, **bf16) * 0.02
        row["norm_act"] = f"{norm}+{act}"

        row["separate_fused_us"] = graph_time_us(
            [lambda w=w: separate(x, w, b_act, None, norm, nw, nb, act) for w in ws], args.repeats)
        row["triton_fused_us"] = graph_time_us(
            [lambda w=w: torch.ops.redline.gemv(x, w, b_act, None, act, norm, nw, nb) for w in ws], args.repeats)
        row["triton_fused_tiles"] = "n{}-k{}-w{}".format(*tg.pick_blocks(n_out, K, norm, act))
        out_fused = torch.empty(1, n_out, **bf16)
        row["triton_fused_best_us"], row["triton_fused_best_tiles"] = best_tiles(
            K, lambda bn, bk, warps, stages: [
                lambda w=w: tg.launch(x, w, b_act, None, act, out_fused, bn, bk, warps, stages, norm=norm,
                                      norm_weight=nw, norm_bias=nb) for w in ws])
        # the fused epilogue: GELU and a residual add, against F.linear then F.gelu then + r
        want = F.gelu(F.linear(x.float(), ws[0].float(), b.float()), approximate="tanh") + r.float()
        got = torch.ops.redline.gemv(x, ws[0], b, r, "gelu_tanh").float()
        row["max_abs_err_vs_fp32"] = (got - want).abs().max().item()
        row["cublas_max_abs_err_vs_fp32"] = (
            (F.gelu(F.linear(x, ws[0], b), approximate="tanh") + r).float() - want).abs().max().item()
        for k in ("cublas", "inductor_tuned", "triton_best", "triton_op"):
            row[f"{k}_gbs"] = round(gb / row[f"{k}_us"])
        rows.append(row)
        print(f"{name:22s} cuBLAS {row['cublas_us']:7.2f} µs ({row['cublas_gbs']:5d} GB/s)  "
              f"inductor {row['inductor_tuned_us']:7.2f} ({row['inductor_tuned_gbs']:5d})  "
              f"triton best {row['triton_best_us']:7.2f} ({row['triton_best_gbs']:5d}) {row['triton_best_tiles']}  "
              f"op {row['triton_op_us']:7.2f} ({row['triton_op_gbs']:5d})  "
              f"err {row['max_abs_err_vs_fp32']:.2e} (cuBLAS {row['cublas_max_abs_err_vs_fp32']:.2e})  "
              f"{row['norm_act']}: separate {row['separate_fused_us']:.2f} µs, fused {row['triton_fused_us']:.2f} "
              f"{row['triton_fused_tiles']}, best {row['triton_fused_best_us']:.2f} {row['triton_fused_best_tiles']}",
              flush=True)
        ws = None  # free the copies before the next shape's
        torch.cuda.empty_cache()
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
