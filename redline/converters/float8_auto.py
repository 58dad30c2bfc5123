"""What fp8=auto measures to decide (redline/converters/float8.py applies the decisions).

Per layer, at start-up: FP8 halves GEMM time on large matrices but adds casting work (amax, scale, cast) around
every GEMM, so at small widths converting every layer makes a step slower while a wide head may gain. Each
distinct Linear shape of the model, at the run's tokens per micro-batch (M = batch_size × seq_len), runs forward
+ backward (three GEMMs) both ways under bf16 autocast with fp32 master weights, as in training: BF16 as it is,
FP8 through torchao compiled (the casts must be fused to be cheap, as they are in the compiled model). The GPU
time of the kernels is summed with the profiler, so the Python overhead of a lone layer does not count. Results
are cached per GPU, torch, torchao, recipe and shape in `<redline cache>/fp8_linear_benchmarks.json`.

On the whole step, in training (StepCheck): per-shape timings cannot see everything FP8 does to the compiled
model (casts that break a fusion, FP8 next to BF16 layers), and a step that got slower would betray the promise
that auto never loses. So the last CHECK_STEPS BF16 steps before the switch and CHECK_STEPS FP8 steps after the
recompiling one are timed; the converter keeps FP8 only if the FP8 step is at least MIN_STEP_SPEEDUP faster.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable

import torch
import torch.nn as nn

from redline.measurement_cache import cache_file, read_cache, write_cache_entry

# a layer is converted only if FP8 is at least this much faster for its shape: timings carry noise, and a layer
# that merely breaks even is not worth the numerics risk. The bar is low because the whole-step check
# (MIN_STEP_SPEEDUP) still turns FP8 off where the chosen layers do not pay together.
MIN_SPEEDUP = 1.03
# FP8 stays on only if the whole step is at least this much faster than in BF16
MIN_STEP_SPEEDUP = 1.01
# steps timed on each side of the BF16 → FP8 switch
CHECK_STEPS = 8

Shape = tuple[int, int, int, bool]  # (M, K, N, bias): (M, K) @ (K, N)


def cache_path():
    return cache_file("fp8_linear_benchmarks.json")


def gemm_shape(linear: nn.Linear, tokens: int) -> Shape:
    """(M, K, N, bias) of a Linear applied to `tokens` rows."""
    return tokens, linear.in_features, linear.out_features, linear.bias is not None


def shape_key(shape: Shape, recipe: str, device_name: str, compiled: bool = True) -> str:
    from redline.converters.float8 import torchao_version

    M, K, N, bias = shape
    return (f"{device_name}|torch {torch.__version__}|torchao {torchao_version()}|{recipe}|"
            f"{'compiled' if compiled else 'eager'}|M={M} K={K} N={N} bias={bias}")


# ----------------------------------------------------------------------------------------------------
# per shape


def _kernel_ms(fn: Callable[[], None], reps: int) -> float:
    """Milliseconds of GPU kernel time per call of fn (profiler sum; CUDA events if the profiler sees nothing)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # compiles, autotunes, allocates
        fn()
    torch.cuda.synchronize()
    total_us = 0.0
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        total_us = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == DeviceType.CUDA)
    except RuntimeError:
        total_us = 0.0
    if total_us > 0:
        return total_us / reps / 1e3
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times)


class _Holder(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear

    def forward(self, x):
        return self.linear(x)


def benchmark_shape(shape: Shape, recipe: str, device: torch.device, reps: int = 20,
                    compiled: bool = True) -> dict[str, float]:
    """Forward + backward of one Linear of this shape in BF16 and in FP8: {"bf16_ms", "fp8_ms", "speedup"}.

    compiled: run the FP8 layer through torch.compile, as the model will be (False: eager, as it will be)."""
    from redline.converters.float8 import convert_linears

    M, K, N, bias = shape
    gen = torch.Generator(device=device).manual_seed(0)
    linear = nn.Linear(K, N, bias=bias, device=device)  # fp32 master weights, as in training
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16, generator=gen, requires_grad=True)
    grad = torch.randn(M, N, device=device, dtype=torch.bfloat16, generator=gen)

    def runner(module: nn.Module) -> Callable[[], None]:
        def run():
            module.zero_grad(set_to_none=True)
            x.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = module(x)
            y.backward(grad)
        return run

    bf16_ms = _kernel_ms(runner(_Holder(linear)), reps)
    fp8_model = _Holder(copy.deepcopy(linear))
    convert_linears(fp8_model, {"linear"}, recipe)
    module = torch.compile(fp8_model) if compiled else fp8_model
    try:
        fp8_ms = _kernel_ms(runner(module), reps)
    finally:
        if compiled:  # drop this lone layer's compiled code: it must not count toward the model's recompile limit
            torch.compiler.reset()
    return {"bf16_ms": bf16_ms, "fp8_ms": fp8_ms, "speedup": bf16_ms / fp8_ms if fp8_ms > 0 else 0.0}


def benchmark_shapes(shapes: list[Shape], recipe: str, device: torch.device, use_cache: bool = True,
                     say: Callable[[str], None] = print, compiled: bool = True) -> dict[Shape, dict]:
    """benchmark_shape for each distinct shape, through the per-GPU cache."""
    name = torch.cuda.get_device_name(device)
    path = cache_path()
    cached = read_cache(path) if use_cache else {}
    results: dict[Shape, dict] = {}
    todo = []
    for shape in dict.fromkeys(shapes):
        entry = cached.get(shape_key(shape, recipe, name, compiled))
        if isinstance(entry, dict) and {"bf16_ms", "fp8_ms", "speedup"} <= entry.keys():
            results[shape] = {**entry, "source": "cache"}
        else:
            todo.append(shape)
    if todo:
        say(f"fp8=auto: timing {len(todo)} Linear shape(s) in BF16 and FP8 ({recipe}, "
            f"{'compiled' if compiled else 'eager'}) on {name}; cached afterwards")
    for shape in todo:
        try:
            result = benchmark_shape(shape, recipe, device, compiled=compiled)
        except (RuntimeError, ValueError, AssertionError) as e:  # this shape stays BF16; training goes on
            error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            say(f"fp8=auto: timing {shape[1]}→{shape[2]} at M={shape[0]} failed ({error}); it stays BF16")
            results[shape] = {"bf16_ms": float("nan"), "fp8_ms": float("nan"), "speedup": 0.0, "source": "failed",
                              "error": error}
            continue
        finally:
            torch.cuda.empty_cache()  # the lone layer's activations are gone: hand their memory back
        write_cache_entry(path, shape_key(shape, recipe, name, compiled), result)
        results[shape] = {**result, "source": "measured"}
    return results


def select_layers(shapes: dict[str, Shape], timings: dict[Shape, dict]) -> tuple[set[str], list[dict]]:
    """The layers whose shape is at least MIN_SPEEDUP faster in FP8, and a per-shape table."""
    chosen = {name for name, shape in shapes.items() if timings[shape]["speedup"] >= MIN_SPEEDUP}
    table = [
        {"M": s[0], "K": s[1], "N": s[2], "bias": s[3], "layers": sorted(n for n, t in shapes.items() if t == s),
         **timings[s], "fp8": timings[s]["speedup"] >= MIN_SPEEDUP}
        for s in dict.fromkeys(shapes.values())
    ]
    return chosen, table


def describe_shapes(table: list[dict]) -> list[str]:
    """One console line per measured shape and what was decided for it."""
    return [f"fp8=auto: {s['K']}→{s['N']} at M={s['M']}: BF16 {s['bf16_ms']:.3f} ms, FP8 {s['fp8_ms']:.3f} ms "
            f"({s['speedup']:.2f}×, {s['source']}) → {'FP8' if s['fp8'] else 'BF16'} "
            f"for {', '.join(s['layers'][:3])}{' …' if len(s['layers']) > 3 else ''}" for s in table]


# ----------------------------------------------------------------------------------------------------
# on the whole step


class StepCheck:
    """Times (CUDA events, no host sync until the end) steps warmup_steps - steps .. warmup_steps - 1 (BF16) and
    warmup_steps + 1 .. warmup_steps + steps (FP8; the step at warmup_steps recompiles and is left out)."""

    def __init__(self, warmup_steps: int, steps: int = CHECK_STEPS):
        self.windows = {"bf16": range(warmup_steps - steps, warmup_steps),
                        "fp8": range(warmup_steps + 1, warmup_steps + 1 + steps)}
        self.events: dict[str, list] = {"bf16": [], "fp8": []}
        self.done = False
        self._open = None

    def begin(self, step: int) -> None:
        """Before step `step` (0-based) runs."""
        if not self.done and any(step in w for w in self.windows.values()):
            self._open = torch.cuda.Event(enable_timing=True)
            self._open.record()

    def end(self, step: int) -> tuple[list[float], list[float]] | None:
        """After step `step` ran; (BF16 step times, FP8 step times) in ms once, at the end of the FP8 window.
        None before, and when the run resumed inside the windows (nothing to compare with)."""
        if self._open is None:
            return None
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        kind = "bf16" if step in self.windows["bf16"] else "fp8"
        self.events[kind].append((self._open, end))
        self._open = None
        if kind != "fp8" or step != self.windows["fp8"][-1]:
            return None
        self.done = True
        if not self.events["bf16"]:
            return None
        torch.cuda.synchronize()
        bf16, fp8 = ([s.elapsed_time(e) for s, e in self.events[k]] for k in ("bf16", "fp8"))
        return bf16, fp8


def step_verdict(bf16_ms: float, fp8_ms: float) -> dict:
    speedup = bf16_ms / fp8_ms
    return {"bf16_step_ms": bf16_ms, "fp8_step_ms": fp8_ms, "speedup": speedup, "kept": speedup >= MIN_STEP_SPEEDUP}


def describe_verdict(verdict: dict) -> str:
    what = "FP8 stays on" if verdict["kept"] else "FP8 turned back off (BF16 for the rest of the run)"
    return (f"fp8=auto check: step {verdict['bf16_step_ms']:.1f} ms in BF16, {verdict['fp8_step_ms']:.1f} ms in FP8 "
            f"({verdict['speedup']:.3f}×): {what}")
