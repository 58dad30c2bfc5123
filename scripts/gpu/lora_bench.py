"""Full fine-tuning (AdamW) vs bf16 LoRA vs NF4 QLoRA of one model on one GPU: peak memory, step time, tokens/s.

    python scripts/gpu/lora_bench.py --out OUT [--preset modern-1.5b] [--batch 4] [--seq 1024] [--steps 10]
                                     [--nf4-backend auto|torchao|bitsandbytes]

Each mode runs in its own process (a fresh CUDA context, so one mode's peak never counts in another's) through
redline's one TrainStep: the preset's model (random weights: speed and memory do not depend on their values) at
batch × seq tokens a step, activation checkpointing on every block, bf16 autocast, eager by default (compile off in
all three, so the comparison is of the methods; --compile compiles all three). LoRA and QLoRA: rank 16 on every attention and MLP
projection, AdamW on the adapters; QLoRA's NF4 through --nf4-backend (lora.nf4_backend). Per mode: `warmup` untimed steps, then `steps` steps each timed alone (CUDA
synchronized); step time is their median, tokens/s = tokens per step / median step time.

Memory: peak_train_gib is torch.cuda.max_memory_allocated over the timed steps (weights, optimizer states,
activations: what training holds); peak_setup_gib is the peak while building (LoRA and QLoRA build the model in
host memory and move it to the GPU one adapted layer at a time, cast or quantized, as `redline train` does);
after the timed steps, one more forward measures activations_gib (memory the forward leaves for backward) and
saved_weight_shaped_gib (saved tensors shaped like a frozen base weight: dequantized NF4 or cast copies; see
held_for_backward). One JSON line per mode in OUT/lora_bench.jsonl; the last line printed is a JSON summary with
the ratios the issue's targets name.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = ("full", "lora", "qlora")


def run_mode(mode: str, preset: str, batch: int, seq: int, warmup: int, steps: int, device_name: str,
             compile_model: bool = False, nf4_backend: str = "auto", ac: str = "full", profile: int = 0,
             out_dir: str | None = None, scope: str = "auto", inductor: list[str] | None = None,
             cuda_graphs: str = "auto") -> dict:
    import torch
    import torch._inductor.config

    for setting in inductor or []:  # e.g. cpp_wrapper=True, triton.cudagraphs=True: the host's share of a step
        key, value = setting.split("=", 1)
        *path, name = key.split(".")
        target = torch._inductor.config
        for part in path:
            target = getattr(target, part)
        setattr(target, name, {"True": True, "False": False}.get(value, value))

    from redline.config import TrainConfig, apply_overrides, apply_preset
    from redline.training.step import TrainStep

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = TrainConfig()
    apply_preset(cfg, preset)
    apply_overrides(cfg, {"batch_size": batch, "seq_len": seq, "precision": "bf16" if cuda else "fp32",
                          "device": device.type, "compile": compile_model, "compile_scope": scope,
                          "activation_checkpointing": ac, "attn_autotune": False, "optim.warmup_steps": 0,
                          "optim.name": "adamw",  # PEFT's and the published figures' optimizer (the preset's is Muon)
                          "cuda_graphs": {"auto": None, "on": True, "off": False}[cuda_graphs]})
    if mode != "full":
        apply_overrides(cfg, {"lora.enabled": True, "lora.rank": 16, "lora.alpha": 32.0,
                              "lora.quantize": "nf4" if mode == "qlora" else "none",
                              "lora.nf4_backend": nf4_backend if mode == "qlora" else "auto",
                              "init_from": "(benchmark: random weights)", "optim.weight_decay": 0.0})
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    peak = (lambda: torch.cuda.max_memory_allocated(device) / 2**30) if cuda else (lambda: None)
    # CUDA graphs allocate their pool while recording and replay into it without allocating: what they hold shows
    # as reserved, not allocated, memory
    peak_reserved = (lambda: torch.cuda.max_memory_reserved(device) / 2**30) if cuda else (lambda: None)
    reset = (lambda: torch.cuda.reset_peak_memory_stats(device)) if cuda else (lambda: None)
    reset()
    t0 = time.perf_counter()
    model = None
    if mode != "full":  # as `redline train` builds a LoRA run's model: in host memory, moved layer by layer
        from redline.training.loop import new_model

        model = new_model(cfg, device, on_host=True)
        with torch.no_grad():
            for p in model.parameters():  # stands in for the base's weights (to_empty leaves memory as it was)
                p.normal_(0.0, 0.02)
    step = TrainStep(cfg, device, model=model, say=lambda m: print(f"[{mode}] {m}", file=sys.stderr, flush=True))
    sync()
    setup_seconds = time.perf_counter() - t0
    peak_setup = peak()
    vocab = cfg.model.vocab_size
    gen = torch.Generator(device=device).manual_seed(0)

    def batches():
        while True:
            x = torch.randint(0, vocab, (batch, seq), device=device, generator=gen)
            yield x, torch.roll(x, -1, dims=1)

    data = batches()
    for _ in range(warmup):
        step.step(data, 1.0)
    sync()
    reset()
    times, losses = [], []
    for _ in range(steps):
        start = time.perf_counter()
        out = step.step(data, 1.0)
        sync()
        times.append(time.perf_counter() - start)
        losses.append(float(out.loss))
    median = statistics.median(times)
    trainable = sum(p.numel() for p in step.params)
    profiled = {}
    if profile:  # GPU kernel time per step by group, against the step's wall time: their gap is host time
        from redline.bench.profile import profile_steps

        trace = Path(out_dir) / f"trace_{mode}{'_compiled' if compile_model else ''}.json.gz" if out_dir else None
        summary_ = profile_steps(lambda: step.step(data, 1.0), profile, trace, device)
        profiled = {"profile_kernel_ms_per_step": summary_["total_ms_per_step"],
                    "profile_groups_ms_per_step": summary_["groups_ms_per_step"],
                    "profile_kernels_per_step": summary_.get("kernels_per_step"),
                    "profile_top": summary_["top"][:10], "profile_wall_ms_per_step": summary_["wall_ms_per_step"],
                    "profile_host_top": summary_.get("host_top")}
    from torch._dynamo.utils import counters  # graph breaks split a compiled block into pieces run in between

    profiled["graph_breaks"] = dict(counters["graph_break"]) if compile_model else None
    profiled["unique_graphs"] = counters["stats"].get("unique_graphs") if compile_model else None
    held = held_for_backward(step, next(data), device)
    lora = step.converters.get("lora")
    return {"mode": mode, "preset": preset, "compile": compile_model, "compile_scope": scope, "inductor": inductor,
            "activation_checkpointing": ac,
            "nf4_backend": getattr(lora, "nf4_backend", None), "batch": batch, "seq_len": seq, "params": step.model.num_params(),
            "trainable_params": trainable, "step_time_s": median, "step_times_s": times,
            "tokens_per_second": batch * seq / median, "peak_train_gib": peak(),
            "peak_reserved_gib": peak_reserved(), "cuda_graphs": step.cuda_graphs, "peak_setup_gib": peak_setup,
            "setup_seconds": setup_seconds, "losses": losses, **held, **profiled,
            "gpu": torch.cuda.get_device_name(device) if cuda else "cpu", "torch": torch.__version__}


def held_for_backward(step, batch, device) -> dict:
    """What one forward leaves for backward: activations_gib, the memory allocated across the forward (what
    backward will read, and the loss); saved_weight_shaped_gib, the part of what autograd saves (seen by
    saved-tensor hooks: in eager mode a checkpointed block's own hooks take its tensors, in a compiled graph the
    graph's) that has the shape of an adapted layer's base weight or its transpose, i.e. dequantized or cast
    copies of the frozen base."""
    import torch

    from redline.converters.lora import lora_layers

    weights = {tuple(layer.weight.shape) for layer in lora_layers(step.model).values()}
    weights |= {(o, i) for i, o in weights}
    params = set()
    for p in step.model.parameters():  # an NF4 weight (a wrapper without storage) is its 4-bit parts
        inner = p.__tensor_flatten__()[0] if hasattr(p, "__tensor_flatten__") else []
        params |= {t.untyped_storage().data_ptr() for t in [getattr(p, name) for name in inner] or [p]}
    saved: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if t.is_floating_point() and tuple(t.shape) in weights and ptr not in params:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    cuda = device.type == "cuda"
    allocated = (lambda: torch.cuda.memory_allocated(device)) if cuda else (lambda: 0)
    before = allocated()
    autocast = lambda: torch.autocast(device.type, dtype=step.amp, enabled=step.amp is not None)  # noqa: E731
    with autocast():
        loss, _ = step.objective.compute(step.module, batch)
    activations = (allocated() - before) / 2**30
    loss.backward()
    with autocast(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = step.objective.compute(step.module, batch)
    loss.backward()
    step.model.zero_grad(set_to_none=True)
    return {"activations_gib": activations if cuda else None, "saved_weight_shaped_gib": sum(saved.values()) / 2**30}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--preset", default="modern-1.5b")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--nf4-backend", default="auto", choices=("auto", "torchao", "bitsandbytes"),
                        help="the NF4 library of the qlora mode (lora.nf4_backend)")
    parser.add_argument("--compile", action="store_true", help="torch.compile every mode (per block at this depth)")
    parser.add_argument("--device", default="cuda", help="cuda (the benchmark); cpu runs a smoke test of the script")
    parser.add_argument("--ac", default="full", choices=("full", "selective", "none"),
                        help="activation checkpointing of every mode alike (the issue's targets: full)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="after the timed steps, profile N more: GPU kernel ms per step by group (GEMM, "
                             "attention, ...) next to the median wall step (the gap is host time), and a trace "
                             "OUT/trace_MODE[_compiled].json.gz")
    parser.add_argument("--compile-scope", default="auto", choices=("auto", "model", "blocks"),
                        help="with --compile: the whole model as one graph or each block (compile_scope)")
    parser.add_argument("--cuda-graphs", default="auto", choices=("auto", "on", "off"),
                        help="cuda_graphs of every mode (auto: on for LoRA and QLoRA where compiled)")
    parser.add_argument("--inductor", nargs="*", default=[], metavar="KEY=VALUE",
                        help="torch._inductor.config settings for every mode (e.g. cpp_wrapper=True)")
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # the child process of one mode
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_mode(args.one, args.preset, args.batch, args.seq, args.warmup, args.steps, args.device,
                                  args.compile, args.nf4_backend, args.ac, args.profile, args.out, args.compile_scope,
                                  args.inductor, args.cuda_graphs)))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for mode in args.modes:
        cmd = [sys.executable, __file__, "--out", str(out), "--one", mode, "--preset", args.preset,
               "--batch", str(args.batch), "--seq", str(args.seq), "--warmup", str(args.warmup),
               "--steps", str(args.steps), "--device", args.device, "--nf4-backend", args.nf4_backend,
               "--ac", args.ac, "--profile", str(args.profile), "--compile-scope", args.compile_scope]
        cmd += ["--compile"] if args.compile else []
        cmd += ["--inductor", *args.inductor] if args.inductor else []
        cmd += ["--cuda-graphs", args.cuda_graphs]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode == 0:
            record = json.loads(proc.stdout.strip().splitlines()[-1])
        else:
            lines = proc.stderr.strip().splitlines()
            record = {"mode": mode, "preset": args.preset, "error": lines[-1] if lines else f"exit {proc.returncode}"}
        results[mode] = record
        with open(out / "lora_bench.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        hidden = ("step_times_s", "losses", "profile_top", "profile_host_top")
        shown = {k: v for k, v in record.items() if k not in hidden}
        print(f"{mode:>6}: {json.dumps(shown)}", flush=True)
    print(json.dumps(summary(results)))
    return 0


def summary(results: dict) -> dict:
    """The issue's targets: QLoRA peak <= 35% of full fine-tuning; LoRA tokens/s >= 1.3x full; QLoRA step <= 1.5x
    a LoRA step."""
    def get(mode, key):
        return results.get(mode, {}).get(key)

    def ratio(a, b):
        return a / b if a is not None and b else None

    out = {"summary": "lora_bench", **{f"{m}_{k}": get(m, k) for m in MODES
                                       for k in ("peak_train_gib", "activations_gib", "saved_weight_shaped_gib",
                                                 "tokens_per_second", "step_time_s", "error")
                                       if get(m, k) is not None}}
    out["qlora_peak_over_full"] = ratio(get("qlora", "peak_train_gib"), get("full", "peak_train_gib"))
    out["lora_peak_over_full"] = ratio(get("lora", "peak_train_gib"), get("full", "peak_train_gib"))
    out["lora_speed_over_full"] = ratio(get("lora", "tokens_per_second"), get("full", "tokens_per_second"))
    out["qlora_step_over_lora"] = ratio(get("qlora", "step_time_s"), get("lora", "step_time_s"))
    return out


if __name__ == "__main__":
    sys.exit(main())
