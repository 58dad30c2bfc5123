"""FP8 training through torchao, turned on only where it pays: the `fp8` converter (redline/converters/).

fp8=off    no converter.
fp8=all    every Linear whose dimensions FP8 GEMMs accept (multiples of 16; 32 for mxfp8), lm_head included.
fp8=auto   only the Linears whose GEMM shapes run at least MIN_SPEEDUP faster in FP8 on this GPU, and only if
           the whole step then runs faster too (measured at the switch from BF16 to FP8): see float8_auto.py.

BF16 first: each converted layer is a subclass of its torchao FP8 Linear whose forward runs the plain BF16
Linear while its `fp8_enabled` is False. The converter keeps the list of its layers and is the only one that
flips them: off for the first `fp8_warmup_steps` steps, then on (torch.compile guards on the flag, so the switch
costs one recompile and both graphs stay cached); off inside `disabled()` (evaluation and sampling are BF16);
off for good when fp8=auto's whole-step check finds FP8 slower. Parameter names are those of nn.Linear, so
checkpoints load into a plain model.

FSDP2 (parallel=fsdp2, tensorwise recipe): the converted layers' weights are all-gathered in FP8 instead of BF16
(torchao's `enable_fsdp_float8_all_gather`: half the bytes on the wire, and the cast to FP8 happens once on each
shard before the all-gather instead of on every rank after it). torchao wraps each such weight in a tensor
subclass, a new Parameter around the same tensor, so the conversion comes before the optimizer is built (as
the training step does); a head tied to the embedding keeps the BF16 all-gather so it stays tied. After each
optimizer step the converter precomputes the scales of every such weight in one all-reduce (otherwise each
all-gather reduces its own amax). The all-gathered weight is then FP8 whatever the flag says, so the BF16 steps
(warm-up, evaluation, sampling, fp8=auto's fallback) compute in BF16 from FP8-rounded weights there; checkpoints
store the plain fp32 tensor inside the subclass (`plain_weight`).

torchao is imported only when FP8 is asked for; without it the error says `pip install torchao`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import sys
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from redline.errors import UserError

# minimum compute capability of each recipe's FP8 GEMMs
RECIPE_CAPABILITY = {"tensorwise": (8, 9), "rowwise": (9, 0), "mxfp8": (10, 0), "nvfp4": (10, 0)}

INSTALL_HINT = "pip install torchao (0.13 or newer; or `pip install redline[gpu]`)"


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


def resolve_mode(mode: str, recipe: str, device: torch.device, say: Callable[[str], None] = print,
                 fallback: str = "BF16") -> str:
    """The FP8 mode that will run: fp8=all refuses where it cannot run; fp8=auto says why and trains in
    `fallback` (the precision the run has without FP8: BF16, or float32 on a CPU)."""
    if mode == "off":
        return "off"
    reason = unsupported_reason(recipe, device)
    if reason:
        if mode == "all":
            raise UserError(f"fp8=all: {reason}. Use fp8=off, or fp8=auto to fall back to BF16 where FP8 cannot run")
        say(f"fp8=auto: {reason}; training in {fallback}")
        return "off"
    if recipe == "nvfp4":
        raise UserError("fp8_recipe=nvfp4 is not implemented: torchao has no dense NVFP4 training recipe that redline "
                        "can use yet; use fp8_recipe=mxfp8 (or tensorwise) on this GPU")
    require_torchao()
    return mode


def candidate_linears(model: nn.Module, recipe: str = "tensorwise") -> dict[str, nn.Linear]:
    """Linear layers whose in/out sizes FP8 GEMMs accept (multiples of 16; 32 for mxfp8's blocks), by name; never
    BitNet's projections (model.bitlinear, sub_norms), whose forward rounds and norms of its own an FP8 layer would
    drop."""
    from redline.model import BitLinear

    multiple = 32 if recipe == "mxfp8" else 16
    return {
        name: mod for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and not isinstance(mod, BitLinear) and mod.in_features % multiple == 0
        and mod.out_features % multiple == 0
    }


# ----------------------------------------------------------------------------------------------------
# conversion and the BF16/FP8 switch

class SwitchableFloat8:
    """What every converted layer also is: it runs its FP8 forward while `fp8_enabled`, the BF16 one otherwise."""

    fp8_enabled: bool = True


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
    """A subclass of a torchao FP8 Linear whose forward is plain BF16 while `fp8_enabled` is False."""
    if base in _SWITCHABLE:
        return _SWITCHABLE[base]

    class Switchable(base, SwitchableFloat8):  # type: ignore[misc, valid-type]
        def forward(self, input: torch.Tensor) -> torch.Tensor:
            if self.fp8_enabled:
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
                if fqn not in names or isinstance(module, SwitchableFloat8):
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
            if isinstance(old, SwitchableFloat8):
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
        module.fp8_enabled = enabled
    return sorted(converted)


def fp8_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, SwitchableFloat8)]


def uses_fsdp_float8_all_gather(model: nn.Module) -> bool:
    """Whether any converted layer's weight is all-gathered in FP8 under FSDP2."""
    return any(getattr(getattr(layer, "config", None), "enable_fsdp_float8_all_gather", False)
               for layer in fp8_layers(model))


def precompute_fsdp_float8_scales(model: nn.Module) -> None:
    """The FP8 scales of every weight that FSDP2 all-gathers in FP8, in one all-reduce (torchao's
    precompute_float8_dynamic_scale_for_fsdp); after each optimizer step of a model that has such weights.
    Collective under FSDP2."""
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
        layer.fp8_enabled = enabled
    return len(layers)


def float8_enabled(model: nn.Module) -> bool:
    return any(layer.fp8_enabled for layer in fp8_layers(model))


# ----------------------------------------------------------------------------------------------------
# the converter


class Float8Converter:
    """cfg.fp8 from start-up to the last step: which layers, the BF16 warm-up, fp8=auto's whole-step check, the
    FSDP2 scale precompute, and evaluation without FP8.

    tokens: rows each Linear sees per micro-batch (batch_size × seq_len), the M of fp8=auto's measured shapes.
    compiled: whether the model will be compiled (fp8=auto measures FP8 the way it will run).
    fsdp: the model will be sharded with FSDP2; with the tensorwise recipe its FP8 weights are then all-gathered
    in FP8. keep_bf16: layer name -> why it stays BF16. fallback_precision: what fp8=auto says the run trains in
    where FP8 cannot run. emulate: FP8 arithmetic without FP8 GEMMs (any device; for tests).
    The hardware check runs here, so an impossible fp8=all fails before any model is built."""

    name = "fp8"

    def __init__(self, mode: str, recipe: str, device: torch.device, *, tokens: int, warmup_steps: int,
                 compiled: bool = True, fsdp: bool = False, keep_bf16: dict[str, str] | None = None,
                 fallback_precision: str = "BF16", emulate: bool = False, say: Callable[[str], None] = print):
        self.mode = resolve_mode(mode, recipe, device, say, fallback_precision)
        self.recipe, self.device, self.tokens = recipe, device, tokens
        self.warmup_steps, self.compiled, self.fsdp = warmup_steps, compiled, fsdp
        self.keep_bf16 = dict(keep_bf16 or {})
        self.emulate, self.say = emulate, say
        self.model: nn.Module | None = None
        self.layers: list[nn.Module] = []
        self.layer_names: list[str] = []
        self.shapes: list[dict] | None = None  # fp8=auto's per-shape table
        self.all_gather = False  # FSDP2 all-gathers the converted weights in FP8
        self.reverted = False  # fp8=auto's whole-step check found FP8 slower: BF16 for the rest of the run
        self.verdict: dict | None = None
        self.check = None  # fp8=auto's StepCheck, while it is still to run
        self._disabled = 0  # depth of disabled() contexts: steps run inside one stay BF16

    def convert(self, model: nn.Module) -> None:
        """Pick the layers (fp8=auto measures them) and convert them in place, FP8 off until the warm-up ends."""
        self.model = model
        if self.mode == "off":
            return
        candidates = candidate_linears(model, self.recipe)
        for name, reason in self.keep_bf16.items():
            if candidates.pop(name, None) is not None:
                self.say(f"fp8: {name} stays BF16 ({reason})")
        if self.mode == "all":
            chosen = set(candidates)
        else:
            from redline.converters.float8_auto import (benchmark_shapes, describe_shapes, gemm_shape,
                                                        select_layers)

            shapes = {name: gemm_shape(linear, self.tokens) for name, linear in candidates.items()}
            timings = benchmark_shapes(list(shapes.values()), self.recipe, self.device, say=self.say,
                                       compiled=self.compiled)
            chosen, self.shapes = select_layers(shapes, timings)
            for line in describe_shapes(self.shapes):
                self.say(line)
        all_gather = self.fsdp and self.recipe == "tensorwise"
        self.layer_names = convert_linears(model, chosen, self.recipe, emulate=self.emulate,
                                           enabled=self.warmup_steps == 0, fsdp_float8_all_gather=all_gather)
        self.layers = fp8_layers(model)
        self.all_gather = uses_fsdp_float8_all_gather(model)
        self._announce(len(candidates))
        self._plan_check()

    def _announce(self, candidates: int) -> None:
        if not self.layers:
            self.say(f"fp8={self.mode}: no Linear layer runs faster in FP8 at these shapes; training in BF16")
            return
        when = "from the first step" if self.warmup_steps == 0 else f"after {self.warmup_steps} BF16 steps"
        self.say(f"fp8={self.mode}: {len(self.layers)} of {candidates} Linear layers in FP8 ({self.recipe}) {when}")
        if self.all_gather:
            self.say("fp8: FSDP2 all-gathers their weights in FP8 (BF16 steps and evaluation compute from FP8-rounded "
                     "weights)")

    def _plan_check(self) -> None:
        """fp8=auto on CUDA with FP8 layers and a warm-up long enough to time: check the whole step at the switch."""
        from redline.converters.float8_auto import CHECK_STEPS, StepCheck

        if (self.mode == "auto" and self.device.type == "cuda" and self.layers and self.verdict is None
                and self.warmup_steps >= CHECK_STEPS):
            self.check = StepCheck(self.warmup_steps)

    def before_step(self, step: int) -> dict | None:
        """BF16 while step < warmup_steps (or after a reverting check), FP8 after; the event at the switch."""
        if self.check is not None:
            self.check.begin(step)
        if not self.layers or self._disabled:
            return None
        want = step >= self.warmup_steps and not self.reverted
        if self.layers[0].fp8_enabled == want:
            return None
        self._set(want)
        if not want:
            return None
        return {"event": "fp8_on", "step": step, "layers": len(self.layers),
                "message": f"step {step}: FP8 on (the first {self.warmup_steps} steps train in BF16; one recompile)"}

    def after_optimizer_step(self, step: int) -> dict | None:
        """FSDP2's FP8 all-gather: the next step's weight scales, one all-reduce. fp8=auto: the verdict, once."""
        if self.all_gather:
            precompute_fsdp_float8_scales(self.model)
        if self.check is None or (times := self.check.end(step)) is None:
            if self.check is not None and self.check.done:
                self.check = None  # resumed inside the timing windows: nothing to compare
            return None
        self.check = None
        from redline.converters.float8_auto import describe_verdict

        verdict = self.decide(*times)
        return {"event": "fp8_auto_check", "step": step + 1, **verdict, "message": describe_verdict(verdict)}

    def decide(self, bf16_step_ms: list[float], fp8_step_ms: list[float]) -> dict:
        """fp8=auto's verdict from step times in each precision: the slowest rank's medians, so that every rank
        decides the same. Not kept: FP8 goes off for the rest of the run (the BF16 graph is still compiled)."""
        import torch.distributed as dist

        from redline.converters.float8_auto import step_verdict
        from redline.distributed import all_reduce_max

        medians = torch.tensor([statistics.median(bf16_step_ms), statistics.median(fp8_step_ms)], dtype=torch.float64)
        if dist.is_available() and dist.is_initialized():
            medians = all_reduce_max(medians.to(self.device))
        self.verdict = step_verdict(*medians.tolist())
        if not self.verdict["kept"]:
            self.reverted = True
            self._set(False)
        return self.verdict

    def _set(self, enabled: bool) -> None:
        for layer in self.layers:
            layer.fp8_enabled = enabled

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """BF16 inside (evaluation, sampling, steps timed without FP8); each layer's flag put back after, unless
        a verdict inside turned FP8 off for good."""
        before = [layer.fp8_enabled for layer in self.layers]
        self._disabled += 1
        self._set(False)
        try:
            yield
        finally:
            self._disabled -= 1
            for layer, on in zip(self.layers, before):
                layer.fp8_enabled = on and not self.reverted

    def state_dict(self) -> dict:
        return {"verdict": self.verdict}

    def load_state_dict(self, state: dict) -> None:
        """A verdict from a checkpoint: a run resumed after fp8=auto's check does not check again."""
        verdict = state.get("verdict")
        if verdict:
            self.verdict, self.check = verdict, None
            self.reverted = not verdict["kept"]

    def describe(self) -> dict:
        return {"mode": self.mode, "recipe": self.recipe, "layers": self.layer_names, "shapes": self.shapes,
                "warmup_steps": self.warmup_steps, "fsdp_float8_all_gather": self.all_gather,
                "auto_check": self.verdict}
