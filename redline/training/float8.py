"""FP8 training through torchao, turned on only where it pays (the `fp8` converter of wrap.py).

fp8=off    nothing changes.
fp8=all    every Linear whose dimensions FP8 GEMMs accept (multiples of 16; 32 for mxfp8), lm_head included.
fp8=auto   only the Linears whose GEMM shapes run at least MIN_SPEEDUP faster in FP8 on this GPU, and only
           if the whole step then runs faster too (StepCheck, at the switch from BF16 to FP8).

How auto decides: FP8 halves GEMM time on large matrices but adds casting work (amax, scale, cast) around
every GEMM, so at GPT-2 124M widths converting every layer makes a step slower (0.77× measured on an H100),
while the 768 → 50304 lm_head may gain. At start-up each distinct Linear shape of the model, at the run's
tokens per micro-batch (M = batch_size × seq_len), runs forward + backward (three GEMMs) both ways under bf16
autocast with fp32 master weights, as in training: BF16 as it is, FP8 through torchao compiled (the casts must
be fused to be cheap, as they are in the compiled model). The GPU time of the kernels is summed with the
profiler, so Python overhead of the lone layer does not count. Results are cached per GPU, torch, torchao,
recipe and shape in `<redline cache>/fp8_linear_benchmarks.json`.

BF16 first: the converted layers are subclasses whose forward checks one flag, `redline_fp8_on`; off, they run
the plain BF16 Linear. Training starts with the flag off for `fp8_warmup_steps` steps and then turns it on;
torch.compile guards on the flag, so the switch costs one recompile and both graphs stay cached. Evaluation
and sampling run with the flag off (`float8_disabled`): evaluation is always BF16. Parameter names are those of
nn.Linear, so checkpoints load into a plain model.

FSDP2 (parallel=fsdp2, tensorwise recipe): the converted layers' weights are all-gathered in FP8 instead of BF16
(torchao's `enable_fsdp_float8_all_gather`: half the bytes on the wire, and the cast to FP8 happens once on each
shard before the all-gather instead of on every rank after it). torchao wraps each such weight in a tensor
subclass, a new Parameter around the same tensor, so the conversion comes before the optimizer is built (as
wrap.py does); a head tied to the embedding keeps the BF16 all-gather so it stays tied. After each optimizer step
the loop calls `precompute_fsdp_float8_scales`: the scales of every such weight in one all-reduce (otherwise each
all-gather reduces its own amax). The all-gathered weight is then FP8 whatever the flag says, so the BF16 steps
(warm-up, evaluation, sampling, fp8=auto's fallback) compute in BF16 from FP8-rounded weights there; checkpoints
store the plain fp32 tensor inside the subclass (`plain_weight`).

torchao is imported only when FP8 is asked for; without it the error says `pip install torchao`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import statistics
import sys
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from redline.errors import UserError
from redline.hardware import doctor_json_path

# a layer is converted by fp8=auto only if FP8 is at least this much faster for its shape (timings carry noise,
# and a layer that merely breaks even is not worth the numerics risk). Was 1.05: on an H100 that bar left out
# gpt2-1.5b's qkv and MLP fc (1.04-1.05x each), and fp8=all then beat fp8=auto (1.04x against 1.01x); the
# whole-step check (MIN_STEP_SPEEDUP) still turns FP8 off where the chosen layers do not pay together.
MIN_SPEEDUP = 1.03

# minimum compute capability of each recipe's FP8 GEMMs
RECIPE_CAPABILITY = {"tensorwise": (8, 9), "rowwise": (9, 0), "mxfp8": (10, 0), "nvfp4": (10, 0)}

INSTALL_HINT = "pip install torchao (0.13 or newer; or `pip install redline[gpu]`)"


def cache_path():
    return doctor_json_path().parent / "fp8_linear_benchmarks.json"


def require_torchao():
    """Import torchao, or raise a UserError that says how to install it."""
    try:
        import torchao
    except ImportError:
        raise UserError(f"FP8 training needs torchao, which is not installed: {INSTALL_HINT}") from None
    return torchao


def torchao_version() -> str | None:
    """The installed torchao's version, without importing it (importing takes seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchao")
    except PackageNotFoundError:
        return None


def unsupported_reason(recipe: str, device: torch.device) -> str | None:
    """Why `recipe` cannot run on `device`, or None when it can."""
    if recipe not in RECIPE_CAPABILITY:
        raise UserError(f"fp8_recipe must be one of {', '.join(RECIPE_CAPABILITY)}, got {recipe!r}")
    if device.type != "cuda":
        return "FP8 training needs a CUDA GPU"
    major, minor = torch.cuda.get_device_capability(device)
    need = RECIPE_CAPABILITY[recipe]
    if (major, minor) < need:
        name = torch.cuda.get_device_name(device)
        return (f"fp8_recipe={recipe} is not supported on this GPU ({name}, compute capability {major}.{minor}; "
                f"it needs {need[0]}.{need[1]} or newer)")
    return None


def resolve_mode(mode: str, recipe: str, device: torch.device, say: Callable[[str], None] = print) -> str:
    """The FP8 mode that will run: fp8=all refuses where it cannot run; fp8=auto says why and runs BF16."""
    if mode == "off":
        return "off"
    reason = unsupported_reason(recipe, device)
    if reason:
        if mode == "all":
            raise UserError(f"fp8=all: {reason}. Use fp8=off, or fp8=auto to fall back to BF16 where FP8 cannot run")
        say(f"fp8=auto: {reason}; training in BF16")
        return "off"
    if recipe == "nvfp4":
        raise UserError("fp8_recipe=nvfp4 is not implemented: torchao has no dense NVFP4 training recipe that redline "
                        "can use yet; use fp8_recipe=mxfp8 (or tensorwise) on this GPU")
    require_torchao()
    return mode


# ----------------------------------------------------------------------------------------------------
# which layers, and what shapes


def candidate_linears(model: nn.Module, recipe: str = "tensorwise") -> dict[str, nn.Linear]:
    """Linear layers whose in/out sizes FP8 GEMMs accept (multiples of 16; 32 for mxfp8's blocks), by name."""
    multiple = 32 if recipe == "mxfp8" else 16
    return {
        name: mod for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and mod.in_features % multiple == 0 and mod.out_features % multiple == 0
    }


def gemm_shape(linear: nn.Linear, tokens: int) -> tuple[int, int, int, bool]:
    """(M, K, N, bias) of a Linear applied to `tokens` rows: (M, K) @ (K, N)."""
    return tokens, linear.in_features, linear.out_features, linear.bias is not None


def shape_key(shape: tuple[int, int, int, bool], recipe: str, device_name: str, compiled: bool = True) -> str:
    M, K, N, bias = shape
    return (f"{device_name}|torch {torch.__version__}|torchao {torchao_version()}|{recipe}|"
            f"{'compiled' if compiled else 'eager'}|M={M} K={K} N={N} bias={bias}")


# ----------------------------------------------------------------------------------------------------
# conversion and the BF16/FP8 switch

_SWITCHABLE: dict[type, type] = {}


@torch.compiler.disable
def _bf16_linear_of_gathered(input: torch.Tensor, weight, bias: torch.Tensor | None) -> torch.Tensor:
    """The BF16 linear of a layer whose weight FSDP2 all-gathers in FP8 (a Float8TrainingTensor once gathered:
    dequantized here). Kept out of compiled graphs: traced, that weight passes for a plain tensor and the matmul
    fails inside torchao (a graph break per such layer in the BF16 warm-up steps and in evaluation; the FP8
    steps stay compiled whole)."""
    if hasattr(weight, "to_original_precision"):
        weight = weight.to_original_precision()
    return F.linear(input, weight, bias)


def _switchable_class(base: type) -> type:
    """A subclass of a torchao FP8 Linear whose forward is plain BF16 while `redline_fp8_on` is False."""
    if base in _SWITCHABLE:
        return _SWITCHABLE[base]

    class Switchable(base):  # type: ignore[misc, valid-type]
        redline_fp8 = True

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            if self.redline_fp8_on:
                return base.forward(self, input)
            if getattr(self.config, "enable_fsdp_float8_all_gather", False):
                return _bf16_linear_of_gathered(input, self.weight, self.bias)
            return F.linear(input, self.weight, self.bias)

    Switchable.__name__ = Switchable.__qualname__ = f"Switchable{base.__name__}"
    _SWITCHABLE[base] = Switchable
    return Switchable


def _float8_config(recipe: str, emulate: bool, fsdp_float8_all_gather: bool = False):
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(recipe)
    changes = {"emulate": True} if emulate else {}
    if fsdp_float8_all_gather:
        changes["enable_fsdp_float8_all_gather"] = True  # tensorwise only (torchao checks)
    return dataclasses.replace(config, **changes) if changes else config


def _shared_weights(model: nn.Module) -> set[int]:
    """ids of parameters that more than one module holds (a head tied to the embedding)."""
    seen: set[int] = set()
    shared: set[int] = set()
    for _, p in model.named_parameters(remove_duplicate=False):
        (shared if id(p) in seen else seen).add(id(p))
    return shared


def convert_linears(model: nn.Module, names: set[str] | list[str], recipe: str = "tensorwise",
                    emulate: bool = False, enabled: bool = True, fsdp_float8_all_gather: bool = False) -> list[str]:
    """Swap the named nn.Linear layers of `model` for torchao FP8 ones, in place; returns the names converted.

    The parameters stay the same objects (an optimizer built before keeps working, tied weights stay tied),
    except with fsdp_float8_all_gather (tensorwise only): then each weight not shared with another module becomes
    a new Parameter wrapping the same tensor, which FSDP2 casts to FP8 before its all-gather; convert before
    building the optimizer. emulate=True runs the FP8 arithmetic without FP8 GEMMs (any device; for tests)."""
    require_torchao()
    names = set(names)
    missing = names - set(candidate_linears(model, recipe))
    if missing:
        raise UserError(f"cannot convert {sorted(missing)} to FP8: not Linear layers with dimensions FP8 accepts")
    if fsdp_float8_all_gather and recipe != "tensorwise":
        raise UserError(f"FP8 all-gather under FSDP2 needs fp8_recipe=tensorwise, not {recipe}")
    converted: list[str] = []
    if recipe in ("tensorwise", "rowwise"):
        from torchao.float8 import convert_to_float8_training

        shared = _shared_weights(model) if fsdp_float8_all_gather else set()

        def keeper(tied: bool | None):
            """A filter for the named layers not yet converted; tied: only those whose weight is (not) shared."""
            def keep(module: nn.Module, fqn: str) -> bool:
                if fqn not in names or getattr(module, "redline_fp8", False):
                    return False
                if tied is not None and (id(getattr(module, "weight", None)) in shared) != tied:
                    return False
                converted.append(fqn)
                return True
            return keep

        convert_to_float8_training(model, module_filter_fn=keeper(False if fsdp_float8_all_gather else None),
                                   config=_float8_config(recipe, emulate, fsdp_float8_all_gather))
        if fsdp_float8_all_gather:  # a tied head: the BF16 all-gather, so it stays one parameter with the embedding
            convert_to_float8_training(model, module_filter_fn=keeper(True), config=_float8_config(recipe, emulate))
    elif recipe == "mxfp8":
        try:
            from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
            from torchao.quantization.quantize_.common.kernel_preference import KernelPreference
        except ImportError as e:
            raise UserError(f"fp8_recipe=mxfp8 needs a torchao with MXFP8 training ({e}); {INSTALL_HINT}") from None
        for fqn in sorted(names):
            parent_name, _, child = fqn.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            old = getattr(parent, child)
            if getattr(old, "redline_fp8", False):
                continue
            with torch.device("meta"):
                new = MXFP8Linear(old.in_features, old.out_features, bias=False,
                                  kernel_preference=KernelPreference.EMULATED if emulate else KernelPreference.AUTO)
            new.weight, new.bias = old.weight, old.bias
            setattr(parent, child, new)
            converted.append(fqn)
    else:
        raise UserError(f"fp8_recipe={recipe} cannot convert layers; use tensorwise, rowwise or mxfp8")
    for fqn in converted:
        module = model.get_submodule(fqn)
        module.__class__ = _switchable_class(type(module))
        module.redline_fp8_on = enabled
    return sorted(converted)


def fp8_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if getattr(m, "redline_fp8", False)]


def uses_fsdp_float8_all_gather(model: nn.Module) -> bool:
    """Whether any converted layer's weight is all-gathered in FP8 under FSDP2."""
    return any(getattr(getattr(layer, "config", None), "enable_fsdp_float8_all_gather", False)
               for layer in fp8_layers(model))


def precompute_fsdp_float8_scales(model: nn.Module) -> None:
    """Call after each optimizer step: the FP8 scales of every weight that FSDP2 all-gathers in FP8, in one
    all-reduce (torchao's precompute_float8_dynamic_scale_for_fsdp). Collective under FSDP2; a no-op (one
    attribute read) for a model without such weights."""
    if not getattr(model, "redline_fp8_all_gather", False):
        return
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def plain_weight(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor inside torchao's FP8 all-gather weight (also inside an FSDP2 DTensor), sharing its
    storage; any other tensor as it is. Checkpoints store and load this one, so they need no torchao."""
    fsdp_utils = sys.modules.get("torchao.float8.fsdp_utils")
    if fsdp_utils is None:  # torchao not imported: no such weights exist
        return t
    wrapper = fsdp_utils.WeightWithDynamicFloat8CastTensor
    local = getattr(t, "_local_tensor", None)
    if isinstance(local, wrapper):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local._tensor, t.device_mesh, t.placements, run_check=False, shape=t.shape,
                                  stride=t.stride())
    return t._tensor if isinstance(t, wrapper) else t


def set_float8_enabled(model: nn.Module, enabled: bool) -> int:
    """Turn the converted layers' FP8 on or off; returns how many layers there are."""
    layers = fp8_layers(model)
    for layer in layers:
        layer.redline_fp8_on = enabled
    return len(layers)


def float8_enabled(model: nn.Module) -> bool:
    return any(layer.redline_fp8_on for layer in fp8_layers(model))


@contextlib.contextmanager
def float8_disabled(model: nn.Module) -> Iterator[None]:
    """Run the block in BF16 (evaluation, sampling), then put each layer's FP8 flag back."""
    layers = fp8_layers(model)
    before = [layer.redline_fp8_on for layer in layers]
    for layer in layers:
        layer.redline_fp8_on = False
    try:
        yield
    finally:
        for layer, on in zip(layers, before):
            layer.redline_fp8_on = on


def set_float8_for_step(model: nn.Module, step: int, warmup_steps: int) -> bool:
    """Called by the training loop before each step: BF16 while step < warmup_steps, FP8 after (unless fp8=auto's
    end-to-end check turned it back off: `model.redline_fp8_reverted`).

    Returns True at the step where FP8 turns on (the caller logs it). Cheap when the model has no FP8 layers."""
    layers = getattr(model, "redline_fp8_modules", None)
    if layers is None:
        layers = fp8_layers(model)
        model.redline_fp8_modules = layers  # a plain list: not registered as submodules
    if not layers:
        return False
    want = step >= warmup_steps and not getattr(model, "redline_fp8_reverted", False)
    if layers[0].redline_fp8_on == want:
        return False
    for layer in layers:
        layer.redline_fp8_on = want
    return want


# ----------------------------------------------------------------------------------------------------
# fp8=auto's end-to-end check


class StepCheck:
    """fp8=auto's second opinion, on the whole step: per-shape timings cannot see everything FP8 does to the
    compiled model (casts that break a fusion, FP8 next to BF16 layers), and a step that got slower would
    betray the promise that auto never loses. The training loop times (CUDA events, no host sync until the
    end) the last CHECK_STEPS BF16 steps before the switch and CHECK_STEPS FP8 steps after the recompiling
    one; if the FP8 step's median is not at least MIN_STEP_SPEEDUP faster, FP8 goes back off for the rest of
    the run (the BF16 graph is still compiled: no recompile). The verdict goes into the checkpoints, so a
    resumed run keeps it. Active for fp8=auto on CUDA with FP8 layers and fp8_warmup_steps >= CHECK_STEPS."""

    def __init__(self, model: nn.Module, mode: str, warmup_steps: int, device: torch.device,
                 steps: int | None = None):
        steps = steps or CHECK_STEPS
        self.model, self.device = model, device
        self.active = mode == "auto" and device.type == "cuda" and bool(fp8_layers(model)) and warmup_steps >= steps
        self.windows = {"bf16": range(warmup_steps - steps, warmup_steps),
                        "fp8": range(warmup_steps + 1, warmup_steps + 1 + steps)}
        self.events: dict[str, list] = {"bf16": [], "fp8": []}
        self._open = None
        self.verdict: dict | None = None

    def restore(self, verdict: dict | None) -> None:
        """Take a verdict from a checkpoint (a run resumed after the check does not check again)."""
        if verdict:
            self.verdict, self.active = verdict, False
            self.model.redline_fp8_reverted = not verdict["kept"]

    def begin(self, step: int) -> None:
        """Before step `step` (0-based) runs."""
        if self.active and any(step in w for w in self.windows.values()):
            self._open = torch.cuda.Event(enable_timing=True)
            self._open.record()

    def end(self, step: int) -> dict | None:
        """After step `step` ran; returns the verdict once, at the end of the FP8 window."""
        if self._open is None:
            return None
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        kind = "bf16" if step in self.windows["bf16"] else "fp8"
        self.events[kind].append((self._open, end))
        self._open = None
        if kind != "fp8" or step != self.windows["fp8"][-1]:
            return None
        self.active = False
        if not self.events["bf16"]:  # resumed inside the windows: nothing to compare with
            return None
        from redline.distributed import all_reduce_max

        torch.cuda.synchronize()
        bf16, fp8 = ([s.elapsed_time(e) for s, e in self.events[k]] for k in ("bf16", "fp8"))
        # the slowest rank's medians, so every rank takes the same decision
        medians = all_reduce_max(torch.tensor([statistics.median(bf16), statistics.median(fp8)],
                                              dtype=torch.float64, device=self.device))
        self.verdict = step_verdict(*medians.tolist())
        if not self.verdict["kept"]:
            self.model.redline_fp8_reverted = True
            set_float8_enabled(self.model, False)
        return self.verdict


CHECK_STEPS = 8
# FP8 stays on only if the whole step is at least this much faster than in BF16
MIN_STEP_SPEEDUP = 1.01


def step_verdict(bf16_ms: float, fp8_ms: float) -> dict:
    speedup = bf16_ms / fp8_ms
    return {"bf16_step_ms": bf16_ms, "fp8_step_ms": fp8_ms, "speedup": speedup, "kept": speedup >= MIN_STEP_SPEEDUP}


def describe_verdict(verdict: dict) -> str:
    what = "FP8 stays on" if verdict["kept"] else "FP8 turned back off (BF16 for the rest of the run)"
    return (f"fp8=auto check: step {verdict['bf16_step_ms']:.1f} ms in BF16, {verdict['fp8_step_ms']:.1f} ms in FP8 "
            f"({verdict['speedup']:.3f}×): {what}")


# ----------------------------------------------------------------------------------------------------
# the micro-benchmark behind fp8=auto


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


def benchmark_shape(shape: tuple[int, int, int, bool], recipe: str, device: torch.device,
                    reps: int = 20, compiled: bool = True) -> dict[str, float]:
    """Forward + backward of one Linear of this shape in BF16 and in FP8: {"bf16_ms", "fp8_ms", "speedup"}.

    compiled: run the FP8 layer through torch.compile, as the model will be (False: eager, as it will be)."""
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


def benchmark_shapes(shapes: list[tuple[int, int, int, bool]], recipe: str, device: torch.device,
                     use_cache: bool = True, say: Callable[[str], None] = print,
                     compiled: bool = True) -> dict[tuple, dict]:
    """benchmark_shape for each distinct shape, through the per-GPU cache."""
    from redline.training.attention_backend import read_cache, write_cache_entry

    name = torch.cuda.get_device_name(device)
    path = cache_path()
    cached = read_cache(path) if use_cache else {}
    results: dict[tuple, dict] = {}
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


def select_layers(shapes: dict[str, tuple], timings: dict[tuple, dict]) -> tuple[set[str], list[dict]]:
    """fp8=auto's decision: the layers whose shape is at least MIN_SPEEDUP faster in FP8, and a per-shape table."""
    chosen = {name for name, shape in shapes.items() if timings[shape]["speedup"] >= MIN_SPEEDUP}
    table = [
        {"M": s[0], "K": s[1], "N": s[2], "bias": s[3], "layers": sorted(n for n, t in shapes.items() if t == s),
         **timings[s], "fp8": timings[s]["speedup"] >= MIN_SPEEDUP}
        for s in dict.fromkeys(shapes.values())
    ]
    return chosen, table


def apply_float8(model: nn.Module, mode: str, recipe: str, device: torch.device, tokens: int,
                 warmup_steps: int, say: Callable[[str], None] = print, compiled: bool = True,
                 fsdp: bool = False) -> dict:
    """The converter: resolve the mode for this device, pick the layers, convert them. Returns a summary.

    tokens: rows each Linear sees per micro-batch (batch_size × seq_len), the M of the measured shapes.
    compiled: whether the model will be compiled (fp8=auto measures FP8 the way it will run).
    fsdp: the model will be sharded with FSDP2; with the tensorwise recipe its FP8 weights are then all-gathered
    in FP8 (the loop calls precompute_fsdp_float8_scales after each optimizer step)."""
    mode = resolve_mode(mode, recipe, device, say)
    all_gather = fsdp and recipe == "tensorwise"
    summary: dict = {"mode": mode, "recipe": recipe, "layers": [], "fsdp_float8_all_gather": False}
    if mode == "off":
        return summary
    candidates = candidate_linears(model, recipe)
    if getattr(getattr(model, "cfg", None), "ce_chunk_tokens", 0) and candidates.pop("lm_head", None) is not None:
        # the chunked loss computes the head itself in BF16; an FP8 head would be recomputed per chunk instead
        say("fp8: the head stays BF16 (model.ce_chunk_tokens computes it chunk by chunk with the loss)")
    if mode == "all":
        chosen = set(candidates)
    else:
        shapes = {name: gemm_shape(linear, tokens) for name, linear in candidates.items()}
        timings = benchmark_shapes(list(shapes.values()), recipe, device, say=say, compiled=compiled)
        chosen, summary["shapes"] = select_layers(shapes, timings)
    converted = convert_linears(model, chosen, recipe, enabled=warmup_steps == 0, fsdp_float8_all_gather=all_gather)
    summary["layers"] = converted
    model.redline_fp8_modules = fp8_layers(model)
    model.redline_fp8_all_gather = summary["fsdp_float8_all_gather"] = uses_fsdp_float8_all_gather(model)
    if mode == "auto":
        for s in summary["shapes"]:
            say(f"fp8=auto: {s['K']}→{s['N']} at M={s['M']}: BF16 {s['bf16_ms']:.3f} ms, FP8 {s['fp8_ms']:.3f} ms "
                f"({s['speedup']:.2f}×, {s['source']}) → {'FP8' if s['fp8'] else 'BF16'} "
                f"for {', '.join(s['layers'][:3])}{' …' if len(s['layers']) > 3 else ''}")
    if converted:
        when = "from the first step" if warmup_steps == 0 else f"after {warmup_steps} BF16 steps"
        say(f"fp8={mode}: {len(converted)} of {len(candidates)} Linear layers in FP8 ({recipe}) {when}")
        if summary["fsdp_float8_all_gather"]:
            say("fp8: FSDP2 all-gathers their weights in FP8 (BF16 steps and evaluation compute from FP8-rounded "
                "weights)")
    else:
        say(f"fp8={mode}: no Linear layer runs faster in FP8 at these shapes; training in BF16")
    return summary
