"""`redline bench-infer`: how fast generation is, and what each technique buys.

For every batch size × prompt length it times three ways to generate the same number of tokens:
  naive     no cache: the whole sequence goes through the model again for every new token;
  eager     the KV-cache engine, run eagerly (no compilation, no CUDA graphs);
  compiled  the KV-cache engine as configured (on a GPU: bf16, torch.compile'd blocks, decode step in a CUDA
            graph; on a CPU only when --compile on is asked for).

Reported: time to first token (prefill + one sampling step), decode tokens/s per sequence and for the whole
batch, KV-cache size and peak GPU memory; the median of --repeats runs after one untimed warm-up run, whose
extra time (compilation, graph capture) is reported apart as first_call_s. Prompts are random token ids and
stop tokens are off, so every row generates exactly max_new_tokens. Works on a checkpoint or on a preset with
random weights (`--preset modern-124m`), which runs at the same speed as a trained model of that shape.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Literal

import torch
import tyro

from redline.inference.runtime import RuntimeOptions

METHOD_LABELS = {"naive": "naive (no cache)", "eager": "cache, eager", "compiled": "cache, compiled"}


@dataclass
class BenchInferConfig:
    checkpoint: str | None = None
    """A checkpoint folder or run directory to benchmark (or use --preset)."""
    preset: str | None = None
    """A model preset with random weights, e.g. modern-124m, gpt2-124m, tiny (or use --checkpoint)."""
    context_len: int = 0
    """Preset only: override the preset's context length (0: keep it), e.g. to fit longer prompts on `tiny`."""
    batch_sizes: tuple[int, ...] = ()
    """Batch sizes to measure (empty: 1 64 on a GPU, 1 4 on a CPU)."""
    prompt_lens: tuple[int, ...] = ()
    """Prompt lengths in tokens (empty: 512 on a GPU, 64 on a CPU)."""
    max_new_tokens: int = 0
    """Tokens generated per sequence (0: 256 on a GPU, 64 on a CPU)."""
    repeats: int = 3
    """Timed runs per measurement (the median is reported), after one warm-up run."""
    methods: tuple[Literal["naive", "eager", "compiled"], ...] = ("naive", "eager", "compiled")
    """Which generation loops to time."""
    naive_max_batch: int = 1
    """Time the naive loop only up to this batch size (it recomputes everything and gets slow fast)."""
    seed: int = 0
    """Seed for the random weights and prompts."""
    json_out: str | None = None
    """Also append the final JSON line to this file."""
    profile: str | None = None
    """Profile the compiled engine's decode steps at each batch size (first prompt length): print the GPU time
    per decoded token by kernel group, the kernels launched per token and the top kernels, and write a
    Chrome/Perfetto trace per batch size to this path with -bN added before the suffix (.json or .json.gz)."""
    runtime: tyro.conf.OmitArgPrefixes[RuntimeOptions] = field(default_factory=RuntimeOptions)
    """Device, precision, compilation and CUDA graphs of the `compiled` method."""

    def validate(self) -> None:
        from redline.errors import UserError

        if bool(self.checkpoint) == bool(self.preset):
            raise UserError("give exactly one of --checkpoint PATH or --preset NAME (e.g. --preset modern-124m)")
        if self.context_len and not self.preset:
            raise UserError("--context-len overrides a preset's context length; a checkpoint keeps the one it was "
                            "trained with")
        if self.profile and not self.profile.endswith((".json", ".json.gz")):
            raise UserError(f"--profile {self.profile}: give a trace path ending in .json or .json.gz")
        if self.context_len < 0 or self.max_new_tokens < 0 or self.repeats < 1:
            raise UserError("context_len and max_new_tokens must be >= 0 and repeats >= 1")
        if any(b < 1 for b in self.batch_sizes) or any(p < 1 for p in self.prompt_lens):
            raise UserError("batch sizes and prompt lengths must be positive")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _build_model(cfg: BenchInferConfig, device: torch.device):
    """(model on device, name)."""
    if cfg.checkpoint:
        from redline.training.checkpoint import load_for_inference

        model, _, _ = load_for_inference(cfg.checkpoint, device)
        return model, cfg.checkpoint
    from redline.model import GPT
    from redline.presets import get_preset

    model_cfg = get_preset(cfg.preset)
    if cfg.context_len:
        model_cfg.context_len = cfg.context_len
    torch.manual_seed(cfg.seed)
    with torch.device(device):  # initialise on the GPU: a 1.5B model initialises slowly on a CPU
        model = GPT(model_cfg)
    return model, f"{cfg.preset} (random weights)"


def _measure(run, repeats: int, device: torch.device) -> dict:
    """One warm-up call, then `repeats` timed ones. `run()` returns Timings."""
    t0 = time.perf_counter()
    run()
    _sync(device)
    first_call_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timings = [run() for _ in range(repeats)]
    B = timings[0].batch
    decode = [t.decode_tokens_per_s for t in timings]
    total = _median([t.total_s for t in timings])
    return {
        "ttft_ms": 1e3 * _median([t.ttft_s for t in timings]),
        "decode_tok_s_per_seq": _median(decode),
        "decode_tok_s_total": B * _median(decode),
        "e2e_tok_s_total": B * timings[0].steps / total,
        "total_s": total,
        "first_call_s": first_call_s,
        "first_call_extra_s": max(0.0, first_call_s - total),  # compilation and graph capture, mostly
        "peak_mem_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "runs": repeats,
    }


def _runner(method: str, engines: dict, model, prompts: torch.Tensor, new_tokens: int, device: torch.device):
    """A function that generates once with `method` and returns its Timings."""
    from redline.inference.baseline import naive_generate

    if method == "naive":
        on_device = prompts.to(device)
        return lambda: naive_generate(model, on_device, new_tokens)[1]
    engine, as_lists = engines[method], prompts.tolist()

    def run():
        engine.generate(as_lists, new_tokens)
        return engine.last

    return run


def _trace_path(path: str, batch: int) -> str:
    """trace.json.gz -> trace-b64.json.gz (validate() allows only .json and .json.gz)."""
    suffix = ".json.gz" if path.endswith(".json.gz") else ".json"
    return f"{path[: -len(suffix)]}-b{batch}{suffix}"


def _profile_decode(engine, prompts: torch.Tensor, new_tokens: int, device: torch.device, trace: str) -> dict:
    """Kernel time per decode step: a generate call of new_tokens minus one of a single token (the prefill)."""
    from redline.bench.profile import profile_difference

    as_lists = prompts.tolist()
    engine.generate(as_lists, new_tokens)  # compiled and captured before profiling
    summary = profile_difference(lambda: engine.generate(as_lists, new_tokens),
                                 lambda: engine.generate(as_lists, 1), new_tokens - 1, trace, device)
    engine.release()
    return summary


def main(argv: list[str]) -> int:
    from rich.console import Console

    from redline.config import _pop_option, normalize_argv, parse
    from redline.errors import UserError
    from redline.inference.engine import InferenceEngine

    # --preset is taken out here: config.parse would treat it as a training preset
    preset, argv = _pop_option(normalize_argv(argv), "--preset")
    cfg = parse(BenchInferConfig, argv, prog="redline bench-infer", description=__doc__.strip(),
                default=BenchInferConfig(preset=preset))
    device = cfg.runtime.resolve_device()
    on_gpu = device.type == "cuda"
    batch_sizes = cfg.batch_sizes or ((1, 64) if on_gpu else (1, 4))
    prompt_lens = cfg.prompt_lens or ((512,) if on_gpu else (64,))
    new_tokens = cfg.max_new_tokens or (256 if on_gpu else 64)
    model, name = _build_model(cfg, device)
    console = Console()
    console.width = max(console.width, 150)  # the table is wide; do not fold it in a pipe or a log

    compiled = cfg.runtime.engine(model)
    model = compiled.model  # the model in the run's dtype, shared by every method
    # the eager baseline is plain PyTorch: redline's Triton kernels belong to the compiled engine's techniques
    eager = InferenceEngine(model, compile=False, cuda_graphs=False, decode_attention="matmul",
                            decode_linear="torch")
    methods = list(cfg.methods)
    if "compiled" in methods and not (compiled.plan.compile or compiled.plan.cuda_graphs):
        methods.remove("compiled")  # identical to eager here (a CPU without --compile on)
        console.print("[dim]compiled: skipped, nothing to compile or capture on this device "
                      "(pass --compile on to try torch.compile on the CPU)[/dim]")
    if not methods:
        raise UserError("no method left to time; pick from --methods naive eager compiled")
    engines = {"eager": eager, "compiled": compiled}

    ctx = model.cfg.context_len
    gen = torch.Generator().manual_seed(cfg.seed)
    results = _time_methods(cfg, methods, engines, model, prompt_lens, batch_sizes, new_tokens, device, gen, console)
    _add_speedups(results)
    device_name = torch.cuda.get_device_name(device) if on_gpu else f"cpu ({torch.get_num_threads()} threads)"
    title = (f"bench-infer: {name}, {model.num_params() / 1e6:.1f}M parameters, {device_name}, "
             f"{str(compiled.dtype).removeprefix('torch.')}, {new_tokens} new tokens"
             + (", FP8 KV cache (compiled method)" if compiled.plan.kv_cache == "fp8" else ""))
    console.print(_results_table(title, results))
    compile_s = sum(r.get("first_call_extra_s", 0.0) for r in results if r["method"] == "compiled")
    console.print(f"compile + capture cost (first calls of the compiled engine, beyond a timed run): {compile_s:.1f} s")
    profiles = []
    if cfg.profile:
        engine = engines["compiled" if "compiled" in methods else "eager"]
        profiles = _profile_batches(cfg, engine, model, prompt_lens[0], batch_sizes, new_tokens, device, gen, console)

    summary = {
        "command": "bench-infer", "model": name, "preset": cfg.preset, "checkpoint": cfg.checkpoint,
        "params": model.num_params(), "device": device_name, "dtype": str(compiled.dtype).removeprefix("torch."),
        "engine": compiled.describe(), "kv_bytes_per_token": compiled.kv_bytes_per_token(),
        "context_len": ctx, "max_new_tokens": new_tokens, "repeats": cfg.repeats,
        "compile_s": compile_s, "torch": torch.__version__, "results": results, "profiles": profiles,
    }
    line = json.dumps(summary)
    if cfg.json_out:
        from redline.durable import append_line

        append_line(cfg.json_out, line)  # whole or not at all (a full disk is one line)
    sys.stdout.flush()
    print(line)
    return 0


def _time_methods(cfg, methods, engines, model, prompt_lens, batch_sizes, new_tokens, device, gen, console
                  ) -> list[dict]:
    """One result row per (prompt length, batch, method): the timings, or why the point was skipped."""
    ctx = model.cfg.context_len
    results = []
    for P in prompt_lens:
        for B in batch_sizes:
            if P + new_tokens > ctx:
                results += [{"method": m, "batch": B, "prompt_len": P, "new_tokens": new_tokens,
                             "status": f"skipped: {P}+{new_tokens} tokens exceed context_len {ctx}"} for m in methods]
                continue
            prompts = torch.randint(0, model.cfg.vocab_size, (B, P), generator=gen)
            for method in methods:
                row = {"method": method, "batch": B, "prompt_len": P, "new_tokens": new_tokens}
                if method == "naive" and B > cfg.naive_max_batch:
                    results.append({**row, "status": f"skipped: batch > naive_max_batch={cfg.naive_max_batch}"})
                    continue
                try:
                    stats = _measure(_runner(method, engines, model, prompts, new_tokens, device), cfg.repeats, device)
                    stats["kv_cache_mib"] = engines[method].kv_cache_bytes / 2**20 if method in engines else 0.0
                    if method in engines:
                        engines[method].release()  # free this shape's cache and graphs before the next one
                    results.append({**row, **stats, "status": "ok"})
                except torch.cuda.OutOfMemoryError:
                    for e in engines.values():
                        e.release()
                    results.append({**row, "status": "out of memory"})
                console.print(f"[dim]{METHOD_LABELS[method]:<20} batch {B:>4} prompt {P:>5}: "
                              f"{results[-1].get('decode_tok_s_total', float('nan')):,.0f} tokens/s "
                              f"({results[-1]['status']})[/dim]")
    return results


def _add_speedups(results: list[dict]) -> None:
    """speedup_vs_naive / speedup_vs_eager: each technique against the simpler ones at the same batch and prompt."""
    by_key = {(r["method"], r["batch"], r["prompt_len"]): r for r in results if r["status"] == "ok"}
    for r in results:
        if r["status"] != "ok":
            continue
        for base in {"eager": ("naive",), "compiled": ("naive", "eager")}.get(r["method"], ()):
            ref = by_key.get((base, r["batch"], r["prompt_len"]))
            if ref:
                r[f"speedup_vs_{base}"] = r["decode_tok_s_per_seq"] / ref["decode_tok_s_per_seq"]


def _results_table(title: str, results: list[dict]):
    from rich.table import Table

    table = Table(title=title)
    for col in ("method", "batch", "prompt", "TTFT ms", "decode tok/s/seq", "decode tok/s all",
                "× naive", "× eager", "KV MiB", "peak MiB", "1st call s"):
        table.add_column(col, justify="left" if col == "method" else "right")

    def fmt(value, spec):
        return "-" if value is None or math.isnan(value) else format(value, spec)

    for r in results:
        if r["status"] != "ok":
            table.add_row(METHOD_LABELS[r["method"]], str(r["batch"]), str(r["prompt_len"]), r["status"],
                          *[""] * 7)
            continue
        table.add_row(METHOD_LABELS[r["method"]], str(r["batch"]), str(r["prompt_len"]), fmt(r["ttft_ms"], ".1f"),
                      fmt(r["decode_tok_s_per_seq"], ",.0f"), fmt(r["decode_tok_s_total"], ",.0f"),
                      fmt(r.get("speedup_vs_naive"), ".1f"), fmt(r.get("speedup_vs_eager"), ".1f"),
                      fmt(r["kv_cache_mib"], ",.1f"), fmt(r["peak_mem_mib"], ",.0f"), fmt(r["first_call_s"], ".2f"))
    return table


def _profile_batches(cfg, engine, model, P, batch_sizes, new_tokens, device, gen, console) -> list[dict]:
    """--profile: kernels and their time per decoded token at each batch size, the first prompt length."""
    profiles = []
    for B in batch_sizes:
        if P + new_tokens > model.cfg.context_len or new_tokens < 2:
            continue
        prompts = torch.randint(0, model.cfg.vocab_size, (B, P), generator=gen)
        try:
            prof = _profile_decode(engine, prompts, new_tokens, device, _trace_path(cfg.profile, B))
        except torch.cuda.OutOfMemoryError:
            engine.release()
            console.print(f"profile batch {B}, prompt {P}: out of memory, not profiled")
            continue
        profiles.append({"batch": B, "prompt_len": P, **prof})
        ms = prof["total_ms_per_step"]
        groups = ", ".join(f"{g} {v:.3f}" for g, v in prof["groups_ms_per_step"].items() if v > 0)
        console.print(f"profile batch {B}, prompt {P}: {prof['timing']} {ms:.3f} ms per decoded token "
                      f"({groups}), {prof['kernels_per_step']:.0f} {'kernels' if device.type == 'cuda' else 'operators'}"
                      f" per token; trace {prof['trace']}")
        for row in prof["top"][:12]:
            console.print(f"  {row['ms_per_step'] * 1e3:8.1f} µs  {row['calls_per_step']:5.1f}×  "
                          f"{row['group']:<9} {row['name'][:110]}")
    return profiles

