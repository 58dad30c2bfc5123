"""Converters: optional changes to the model, each one object with one lifecycle (as torchtitan's model
converters). FP8 training is the first (redline/converters/float8.py).

The training step (redline/training/step.py) drives them:

    build_converters(cfg, device, info)  the converters the config turns on, in the registry's order
    convert(model)             in place, first in wrap.py's fixed order (converters → activation checkpointing →
                               compile → data parallel) and before the optimizer is built, so a converter may
                               replace parameters or change which ones train
    before_step(step)          before the micro-batches of optimizer step `step` (0-based)
    after_optimizer_step(step) after that step's update
    disabled()                 a context in which the model runs without the converter: evaluation, sampling
                               (unless the converter sets keep_in_evaluation, as LoRA does: its adapters are
                               the model being trained), a reference model (DPO's: the base without adapters)
    state_dict()/load_state_dict(state)  what a resumed run must know (stored in the checkpoint's state.pt)
    describe()                 what was decided, for logs, checkpoints and `redline bench`

The hooks may return an event: a dict with "event" (its name) and "message" (one line for the console); the
loop logs the rest of its fields to metrics.jsonl. Everything a converter keeps between hooks lives on the
converter, never on the model.

A converter is registered by name with a factory that reads its fields of the TrainConfig and returns the
converter, or None when the config leaves it off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ContextManager, Protocol

import torch
import torch.nn as nn

from redline.distributed import DistInfo
from redline.errors import UserError

if TYPE_CHECKING:
    from redline.config import TrainConfig

Event = dict[str, Any]


class Converter(Protocol):
    name: str

    def convert(self, model: nn.Module) -> None: ...

    def before_step(self, step: int) -> Event | None: ...

    def after_optimizer_step(self, step: int) -> Event | None: ...

    def disabled(self) -> ContextManager[None]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class BuildContext:
    """What a converter's factory may use besides the config."""

    device: torch.device
    info: DistInfo
    compiled: bool
    """Whether the model will be compiled (wrap.py decides; a converter may measure itself the way it will run)."""
    say: Callable[[str], None] = print


Factory = Callable[["TrainConfig", BuildContext], Converter | None]
REGISTRY: dict[str, Factory] = {}


def register(name: str) -> Callable[[Factory], Factory]:
    """Register a converter factory under `name`; converters are built (and convert) in registration order."""

    def add(factory: Factory) -> Factory:
        if name in REGISTRY:
            raise ValueError(f"a converter named {name!r} is already registered")
        REGISTRY[name] = factory
        return factory

    return add


@dataclass
class Converters:
    """The converters of one run, in order; each hook is called on every one of them."""

    items: list[Converter] = field(default_factory=list)

    def __iter__(self) -> Iterator[Converter]:
        return iter(self.items)

    def get(self, name: str) -> Converter | None:
        return next((c for c in self.items if c.name == name), None)

    def convert(self, model: nn.Module) -> None:
        for converter in self.items:
            converter.convert(model)

    def before_step(self, step: int) -> list[Event]:
        return [e for c in self.items if (e := c.before_step(step)) is not None]

    def after_optimizer_step(self, step: int) -> list[Event]:
        return [e for c in self.items if (e := c.after_optimizer_step(step)) is not None]

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for converter in self.items:
                stack.enter_context(converter.disabled())
            yield

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        """Evaluation and sampling: every converter off except those that keep_in_evaluation (LoRA)."""
        with contextlib.ExitStack() as stack:
            for converter in self.items:
                if not getattr(converter, "keep_in_evaluation", False):
                    stack.enter_context(converter.disabled())
            yield

    def state_dict(self) -> dict[str, dict]:
        return {c.name: c.state_dict() for c in self.items}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        """Each converter's own part; a part whose converter this run does not have is left aside."""
        for converter in self.items:
            if converter.name in state:
                converter.load_state_dict(state[converter.name])

    def describe(self) -> dict[str, dict]:
        return {c.name: c.describe() for c in self.items}


def build_converters(cfg: TrainConfig, device: torch.device, info: DistInfo = DistInfo(), *,
                     compiled: bool = False, say: Callable[[str], None] = print) -> Converters:
    """The converters `cfg` turns on, in registration order (hardware checks and clear errors happen here,
    before any model is built). cfg.batch_size must be resolved (a number)."""
    context = BuildContext(device=device, info=info, compiled=compiled, say=say)
    built = (factory(cfg, context) for factory in REGISTRY.values())
    return Converters([c for c in built if c is not None])


@register("fp8")
def _float8(cfg: TrainConfig, context: BuildContext) -> Converter | None:
    """cfg.fp8, fp8_recipe and fp8_warmup_steps; FP8 layers measure at the micro-batch's tokens."""
    if cfg.fp8 == "off":
        return None
    from redline.converters.float8 import Float8Converter
    from redline.hardware import autocast_dtype

    keep_bf16 = {}
    if cfg.fp8_head:
        keep_bf16["lm_head"] = "fp8_head runs it in FP8 with delayed scaling"
    elif cfg.model.ce_chunk_tokens:
        # the chunked loss calls the head once per chunk in forward and again in backward: an FP8 head would
        # cast its weight per chunk
        keep_bf16["lm_head"] = "model.ce_chunk_tokens computes the head chunk by chunk with the loss"
    precision = autocast_dtype(context.device, cfg.precision)
    return Float8Converter(
        cfg.fp8, cfg.fp8_recipe, context.device, tokens=cfg.batch_size * cfg.effective_seq_len,
        warmup_steps=cfg.fp8_warmup_steps, compiled=context.compiled,
        fsdp=cfg.parallel == "fsdp2" and context.info.enabled, keep_bf16=keep_bf16,
        fallback_precision="BF16" if precision == torch.bfloat16 else str(precision or "float32").removeprefix("torch."),
        say=context.say,
    )


@register("lora")
def _lora(cfg: TrainConfig, context: BuildContext) -> Converter | None:
    """cfg.lora: adapters on the init_from model's Linear layers, the base frozen (NF4 with quantize=nf4)."""
    if not cfg.lora.enabled:
        return None
    from redline.converters.lora import LoRAConverter
    from redline.hardware import autocast_dtype

    lora = cfg.lora
    if lora.quantize == "nf4" and context.info.world_size > 1:
        raise UserError("lora.quantize=nf4 runs on one process (NF4 weights are not broadcast by DDP); drop --gpus "
                        "or use lora.quantize=none")
    amp = autocast_dtype(context.device, cfg.precision)
    return LoRAConverter(lora.rank, lora.alpha, lora.dropout, lora.targets, lora.quantize, lora.train_modules,
                         base_dtype=amp or torch.float32, say=context.say, device=context.device,
                         nf4_backend=lora.nf4_backend)


@register("fp8_head")
def _float8_head(cfg: TrainConfig, context: BuildContext) -> Converter | None:
    """cfg.fp8_head and fp8_warmup_steps (at least one BF16 step records the amaxes): the output layer in FP8 with
    delayed scaling (after fp8's layers: it takes over lm_head)."""
    if not cfg.fp8_head:
        return None
    from redline.converters.float8_head import Float8HeadConverter

    return Float8HeadConverter(context.device, cfg.fp8_warmup_steps, say=context.say)


@register("expert_balance")
def _expert_balance(cfg: TrainConfig, context: BuildContext) -> Converter | None:
    """cfg.model.moe_bias_update: the experts' routing biases moved toward an even load after every step."""
    if not cfg.model.moe_bias_update:
        return None
    from redline.converters.expert_balance import ExpertBalanceConverter

    return ExpertBalanceConverter(cfg.model.moe_bias_update)
