"""A batch of decode rows through one Linear layer on this GPU (the batch-64 decode step's products): the layer as
torch.compile fuses it with cuBLAS (the norm, cuBLAS's product with its bias, the activation and the residual
add: the engine under --decode-linear torch) against redline's batched Triton kernel (torch.ops.redline.gemv
above one row: the bias, activation and residual add in its epilogue), with the norm inside the kernel (`op`)
and run before it (`without norm`, the engine's default for a batch), at the tiles it picks itself, as
torch.ops.redline.gemv_split (split-K where pick_row_blocks chooses it, without the norm) and at the best of a
sweep of column tiles and K splits (all rows in one row tile, K tiles of 128, stages as the op picks them for the
column tile; without the norm unless --sweep-norm fused).

    python scripts/gpu/rows_linear_bench.py [--rows 64] [--repeats 10] [--shapes gpt2] [--quick] [--splits 1 2 4 8]

The weights rotate through enough copies to exceed the L2 cache (each call reads its weight from memory, as in
a whole model's step); one CUDA graph calls each copy once, replayed `repeats` times: the median µs per call and
the weight bytes read per µs (GB/s). One JSON line last, with every swept tile's time (`sweep_us`).
"""

import argparse
import itertools
import json

import torch
import torch.nn.functional as F
import triton

import redline.inference.kernels.linear as tg
from redline.diagnostics.microbench import graph_time_us
from redline.inference.kernels.launch import sm_count

SHAPES = {  # name: (N, K) of the weight (SwiGLU: 2N rows), the norm before it, the activation after, a residual
    "gpt2-124m qkv": (2304, 768, "layernorm", "none", False),
    "gpt2-124m attn.proj": (768, 768, "none", "none", True),
    "gpt2-124m fc": (3072, 768, "layernorm", "gelu_tanh", False),
    "gpt2-124m mlp.proj": (768, 3072, "none", "none", True),
    "gpt2-124m lm_head": (50304, 768, "layernorm", "none", False),
    "modern-124m qkv": (1152, 768, "rmsnorm", "none", False),
    "modern-124m attn.proj": (768, 768, "none", "none", True),
    "modern-124m fc": (2048, 768, "rmsnorm", "swiglu", False),
    "modern-124m mlp.proj": (768, 2048, "none", "none", True),
    "modern-124m lm_head": (32768, 768, "rmsnorm", "none", False),
    "gpt2-1.5b qkv": (4800, 1600, "layernorm", "none", False),
    "gpt2-1.5b attn.proj": (1600, 1600, "none", "none", True),
    "gpt2-1.5b fc": (6400, 1600, "layernorm", "gelu_tanh", False),
    "gpt2-1.5b mlp.proj": (1600, 6400, "none", "none", True),
    "modern-1.5b qkv": (2240, 1600, "rmsnorm", "none", False),
    "modern-1.5b fc": (4288, 1600, "rmsnorm", "swiglu", False),
    "modern-1.5b mlp.proj": (1600, 4288, "none", "none", True),
}
L2_BYTES = 50 * 2**20
SPLIT_UP_TO_PROGRAMS = 512  # splits that make more programs than this are not timed (the heads': several waves)


def separate(x, w, b, r, norm, nw, nb, act):
    """The layer as separate PyTorch ops (what the engine runs under --decode-linear torch): norm, F.linear,
    activation, residual add."""
    K = x.shape[1]
    h = F.layer_norm(x, (K,), nw, nb) if norm == "layernorm" else (F.rms_norm(x, (K,), nw) if norm == "rmsnorm" else x)
    y = F.linear(h, w, b)
    if act == "gelu_tanh":
        y = F.gelu(y, approximate="tanh")
    elif act == "swiglu":
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y + r if r is not None else y


def tiles_name(M: int, K: int, tiles) -> str:
    """pick_row_blocks's tuple as a name, with the K splits launch_rows makes of split_k."""
    bm, bn, bk, warps, stages, split = tiles
    return f"m{bm}-n{bn}-k{bk}-w{warps}-s{stages}-split{tg.k_span(K, split, bk)[1]}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="*", default=[64])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--shapes", nargs="*", default=None, help="only the shapes whose name contains one of these")
    ap.add_argument("--quick", action="store_true", help="a smaller tile sweep (16 and 32 columns, up to 4 splits)")
    ap.add_argument("--splits", type=int, nargs="*", default=[1, 2, 4, 8],
                    help="K splits to sweep with each column tile (fewer where K has fewer 128-wide tiles to share)")
    ap.add_argument("--sweep-norm", choices=["fused", "before"], default="before",
                    help="sweep the tiles with the norm in the kernel, or without it (the engine's batched path, "
                         "which runs the norm before the product)")
    args = ap.parse_args()
    sms = sm_count(torch.device("cuda"))
    torch._dynamo.config.recompile_limit = 64
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    compiled = torch.compile(separate, dynamic=False)
    block_ns = (16, 32) if args.quick else (16, 32, 64, 128)
    splits = [s for s in args.splits if s <= 4] if args.quick else args.splits
    rows = []
    for M in args.rows:
        for name, (N, K, norm, act, res) in SHAPES.items():
            if args.shapes and not any(part in name for part in args.shapes):
                continue
            rows_w = 2 * N if act == "swiglu" else N
            copies = max(2, min(64, -(-3 * L2_BYTES // (rows_w * K * 2))))
            ws = [torch.randn(rows_w, K, **bf16) * 0.02 for _ in range(copies)]
            has_bias = name.startswith("gpt2") and "lm_head" not in name
            b = torch.randn(rows_w, **bf16) * 0.02 if has_bias else None
            x = torch.randn(M, K, **bf16)
            r = torch.randn(M, N, **bf16) if res else None
            nw = torch.rand(K, **bf16) + 0.5 if norm != "none" else None
            nb = torch.randn(K, **bf16) * 0.1 if norm == "layernorm" else None
            out = torch.empty(M, N, **bf16)
            gb = rows_w * K * 2 / 1e3
            row = {"shape": name, "M": M, "N": N, "K": K, "norm": norm, "act": act, "copies": copies}
            row["compiled_us"] = graph_time_us([lambda w=w: compiled(x, w, b, r, norm, nw, nb, act) for w in ws],
                                               args.repeats)
            row["cublas_only_us"] = graph_time_us([lambda w=w: F.linear(x, w, b) for w in ws], args.repeats)
            row["op_us"] = graph_time_us([lambda w=w: tg.gemv(x, w, b, r, act, norm, nw, nb) for w in ws],
                                         args.repeats)
            row["op_norm_before_us"] = graph_time_us([lambda w=w: tg.gemv(x, w, b, r, act) for w in ws], args.repeats)
            counts = torch.zeros(triton.cdiv(M, 16) * triton.cdiv(N, 16), dtype=torch.int32, device="cuda")
            row["op_split_us"] = graph_time_us([lambda w=w: tg.gemv_split(x, w, counts, b, r, act) for w in ws],
                                               args.repeats)
            row["op_tiles"] = tiles_name(M, K, tg.pick_row_blocks(M, N, K, sms, split=False))
            row["op_split_tiles"] = tiles_name(M, K, tg.pick_row_blocks(M, N, K, sms))
            best, row["sweep_us"] = None, {}
            fused = args.sweep_norm == "fused"
            block_m, _, block_k, warps, *_ = tg.pick_row_blocks(M, N, K, sms)
            for bn, want in itertools.product(block_ns, splits):
                split = tg.k_span(K, want, block_k)[1]
                tiles = (block_m, bn, block_k, warps, tg.row_stages(block_m, bn, block_k), split)
                if tiles_name(M, K, tiles) in row["sweep_us"] or (
                        split > 1 and triton.cdiv(N, bn) * triton.cdiv(M, block_m) * split > SPLIT_UP_TO_PROGRAMS):
                    continue
                try:
                    t = graph_time_us([lambda w=w: tg.launch_rows(
                        x, w, b, r, act, out, *tiles, counts, norm if fused else "none", nw if fused else None,
                        nb if fused else None) for w in ws], args.repeats)
                except Exception as e:  # a tile that does not fit (shared memory): go on
                    print(f"  {tiles_name(M, K, tiles)}: {str(e).splitlines()[0][:120]}")
                    continue
                row["sweep_us"][tiles_name(M, K, tiles)] = t
                if best is None or t < best[0]:
                    best = (t, tiles_name(M, K, tiles), tiles)
            row["best_us"], row["best_tiles"], row["sweep_norm"] = *best[:2], args.sweep_norm
            if norm != "none":  # the best tiles the other way: what computing the norm in the kernel costs
                row["best_tiles_other_norm_us"] = graph_time_us([lambda w=w: tg.launch_rows(
                    x, w, b, r, act, out, *best[2], counts, *((norm, nw, nb) if not fused else ())) for w in ws],
                    args.repeats)
            want = separate(x.float(), ws[0].float(), b.float() if b is not None else None,
                            r.float() if r is not None else None, norm, nw.float() if nw is not None else None,
                            nb.float() if nb is not None else None, act)
            row["op_max_abs_err_vs_fp32"] = (tg.gemv(x, ws[0], b, r, act, norm, nw, nb).float() - want).abs().max().item()
            want_before = separate(x.float(), ws[0].float(), b.float() if b is not None else None,
                                   r.float() if r is not None else None, "none", None, None, act)
            row["op_split_max_abs_err_vs_fp32"] = (
                tg.gemv_split(x, ws[0], counts, b, r, act).float() - want_before).abs().max().item()
            assert not counts.any(), "gemv_split left a counter nonzero"
            row["compiled_max_abs_err_vs_fp32"] = (
                compiled(x, ws[0], b, r, norm, nw, nb, act).float() - want).abs().max().item()
            for k in ("compiled", "cublas_only", "op", "op_split", "best"):
                row[f"{k}_gbs"] = round(gb / row[f"{k}_us"])
            rows.append(row)
            print(f"M={M} {name:22s} compiled {row['compiled_us']:6.2f} µs ({row['compiled_gbs']:5d} GB/s)  "
                  f"cuBLAS alone {row['cublas_only_us']:6.2f}  op {row['op_us']:6.2f} ({row['op_gbs']:5d}) "
                  f"without norm {row['op_norm_before_us']:6.2f} {row['op_tiles']}  "
                  f"split op {row['op_split_us']:6.2f} ({row['op_split_gbs']:5d}) {row['op_split_tiles']}  "
                  f"best {row['best_us']:6.2f} ({row['best_gbs']:5d}) {row['best_tiles']}  "
                  f"other norm {row.get('best_tiles_other_norm_us', float('nan')):6.2f}  "
                  f"err {row['op_max_abs_err_vs_fp32']:.2e} split {row['op_split_max_abs_err_vs_fp32']:.2e} "
                  f"(compiled {row['compiled_max_abs_err_vs_fp32']:.2e})",
                  flush=True)
            ws = None
            torch.cuda.empty_cache()
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
