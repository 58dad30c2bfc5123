"""What QLoRA keeps for backward, eager vs torch.compile, with torchao's linear_nf4 vs redline's opaque NF4 op.

    python scripts/gpu/qlora_saved.py [--preset modern-1.5b] [--layers 4] [--batch 4] [--seq 1024] [--checkpointing none]

A few blocks of the preset (random weights), every attention and MLP projection adapted (rank 16) over an NF4
base, activation checkpointing on every block (--checkpointing none: off), bf16 autocast, compiled per block as wrap.py compiles a deep model.
For each of torchao (LinearNF4 traced into the graph) and redline (redline/converters/nf4_linear.py) × eager and
compiled, after two warm-up steps: activations_gib, the memory one forward leaves allocated for backward;
saved_weight_shaped_gib, the saved tensors (seen by saved-tensor hooks) shaped like an adapted base weight or its
transpose, i.e. dequantized copies of the 4-bit base; peak_step_gib, the peak of one forward and backward; step_s.
One line per case, then one JSON line with all of them.
"""

from __future__ import annotations

import argparse
import json
import time


def measure(impl: str, compiled: bool, preset: str, layers: int, batch: int, seq: int, device_name: str,
            checkpointing: str) -> dict:
    import torch

    import redline.converters.lora as lora
    from redline.converters.nf4_linear import nf4_linear
    from redline.model import GPT
    from redline.presets import get_preset
    from redline.training.activation_checkpointing import apply_activation_checkpointing

    torch._dynamo.reset()
    lora.nf4_linear = (lambda x, w: lora.nf4_module().linear_nf4(x, w)) if impl == "torchao" else nf4_linear
    device = torch.device(device_name)
    cuda = device.type == "cuda"
    allocated = (lambda: torch.cuda.memory_allocated(device)) if cuda else (lambda: 0)
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    cfg = get_preset(preset)
    cfg.n_layer = layers
    torch.manual_seed(0)
    with device:
        model = GPT(cfg)
    lora.LoRAConverter(16, 32.0, 0.0, ("attn.*", "mlp.*"), "nf4", base_dtype=torch.bfloat16, say=lambda m: None,
                       device=device).convert(model)
    apply_activation_checkpointing(model, checkpointing)
    if compiled:
        for block in model.blocks:
            block.compile()
    weights = {tuple(layer.weight.shape) for layer in lora.lora_layers(model).values()}
    weights |= {(o, i) for i, o in weights}
    idx = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    saved: dict[int, int] = {}

    def pack(t):
        if t.is_floating_point() and tuple(t.shape) in weights:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def step(hooks: bool = False) -> float:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            if hooks:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    loss = model(idx, idx)
            else:
                loss = model(idx, idx)
        held = allocated()
        loss.backward()
        model.zero_grad(set_to_none=True)
        return held

    for _ in range(2):
        step()
    sync()
    before = allocated()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    held = step()
    sync()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) if cuda else 0
    step(hooks=True)
    return {"impl": impl, "compile": compiled, "layers": layers, "checkpointing": checkpointing, "activations_gib": (held - before) / 2**30,
            "saved_weight_shaped_gib": sum(saved.values()) / 2**30, "peak_step_gib": (peak - before) / 2**30,
            "step_s": seconds, "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="modern-1.5b")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--checkpointing", default="full", choices=("full", "none"))
    parser.add_argument("--device", default="cuda", help="cuda (the measurement); cpu runs a smoke test (no memory figures)")
    args = parser.parse_args()
    rows = []
    for impl in ("torchao", "redline"):
        for compiled in (False, True):
            row = measure(impl, compiled, args.preset, args.layers, args.batch, args.seq, args.device,
                          args.checkpointing)
            rows.append(row)
            print(f"{impl:>8} {'compiled' if compiled else 'eager':>8}: activations {row['activations_gib']:.3f} GiB, "
                  f"saved weight-shaped {row['saved_weight_shaped_gib']:.3f} GiB, step peak "
                  f"{row['peak_step_gib']:.3f} GiB, step {row['step_s']:.3f} s", flush=True)
    print(json.dumps({"qlora_saved": rows}))


if __name__ == "__main__":
    main()
