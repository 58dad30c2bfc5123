"""NF4 dequantization speed on a CUDA GPU: the ways QLoRA can turn a 4-bit base weight back into bf16, per weight
of a preset's Linear layers (LoRA's default targets).

    python scripts/gpu/nf4_dequant_bench.py [--preset modern-1.5b] [--repeats 50]

Ways: `triton` (redline/converters/nf4_kernel.py, what QLoRA's GEMM uses on a GPU), `torch-ops`
(nf4_linear.dequantize_parts, the CPU path), `torchao` (NF4Tensor.get_original_weight) and, where bitsandbytes is
installed, `bitsandbytes` (its dequantize_4bit on its own NF4 format). Each row: the median time of one call (CUDA
events, after a warm-up) and the memory bandwidth it reaches counting one read of the packed weight and one write
of the bf16 one; the last line is one JSON object with every row and the sum over the model's layers (x3: forward,
activation-checkpointing recomputation, backward).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from redline.converters.lora import lora_layers, to_nf4
from redline.converters.nf4_kernel import dequantize_nf4_cuda
from redline.converters.nf4_linear import dequantize_parts, nf4_parts
from redline.model import GPT
from redline.presets import get_preset


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def layer_shapes(preset: str) -> dict[tuple[int, int], int]:
    """{(out, in): how many} of the preset's Linear layers that LoRA adapts by default (one meta-device model)."""
    from redline.converters.lora import LoRAConverter

    with torch.device("meta"):
        model = GPT(get_preset(preset))
    LoRAConverter(16, 32.0, 0.0, ("attn.*", "mlp.*"), "none", base_dtype=torch.bfloat16, say=lambda m: None
                  ).convert(model)
    shapes: dict[tuple[int, int], int] = {}
    for layer in lora_layers(model).values():
        shape = tuple(layer.weight.shape)
        shapes[shape] = shapes.get(shape, 0) + 1
    return shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="modern-1.5b")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    try:
        import bitsandbytes as bnb
    except ImportError:
        bnb = None
    rows, total = [], {}
    for shape, count in layer_shapes(args.preset).items():
        weight = torch.randn(shape, dtype=torch.bfloat16, device="cuda") * 0.02
        nf4 = to_nf4(weight)
        parts, block, group = nf4_parts(nf4)
        ways = {"triton": lambda: dequantize_nf4_cuda(parts, block, group, *shape),
                "torch-ops": lambda: dequantize_parts(parts, block, group, *shape),
                "torchao": lambda: nf4.get_original_weight()}
        if bnb is not None:
            packed = to_nf4(weight, backend="bitsandbytes")
            ways["bitsandbytes"] = lambda: bnb.functional.dequantize_4bit(packed.data, packed.quant_state)
        moved = weight.numel() * (0.5 + 2)  # bytes: the packed codes read, the bf16 weight written
        for way, fn in ways.items():
            ms = median_ms(fn, args.repeats)
            rows.append({"shape": list(shape), "layers": count, "way": way, "ms": round(ms, 4),
                         "gb_s": round(moved / ms / 1e6, 1)})
            total[way] = total.get(way, 0.0) + 3 * count * ms
            print(f"{str(shape):>14} x{count:<3} {way:>13} {ms:8.4f} ms {moved / ms / 1e6:8.1f} GB/s", flush=True)
    for way, ms in total.items():
        print(f"{way:>13}: {ms:8.2f} ms of dequantization per QLoRA step (3 per layer)")
    print(json.dumps({"nf4_dequant_bench": rows, "per_step_ms": total, "preset": args.preset,
                      "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
