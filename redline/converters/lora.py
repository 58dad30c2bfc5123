"""LoRA and QLoRA: low-rank adapters on a frozen base (Hu et al. 2021, "LoRA"; Dettmers et al. 2023, "QLoRA").

How it works. Each Linear layer whose name matches `lora.targets` becomes a LoRALinear (a subclass of nn.Linear,
so its `weight` and `bias` keep their names and every isinstance(m, nn.Linear) still holds):

    y = x·Wᵀ + b + (alpha / r) · dropout(x)·Aᵀ·Bᵀ        W (out, in) frozen; A (r, in), B (out, r) trained

With a bf16/fp32 base the layer is one op, base GEMM and adapter together (redline/converters/lora_linear.py: the
adapter accumulates into the base's output in place, forward and backward). A starts as PEFT's LoRA does
(Kaiming-uniform), B at zero, so the adapted model starts as the base. Everything else is frozen except the
modules named in `lora.train_modules` (e.g. wte, lm_head), trained in full. The frozen W of an adapted layer is
kept in the compute dtype (bf16 when training in bf16: half the memory of the fp32 master weights a full fine-tune
keeps), or with quantize=nf4 as 4-bit NormalFloat in blocks of 64 with the block scales quantized again to 8 bits
(double quantization), in one of two libraries (`lora.nf4_backend`):

    torchao        its NF4Tensor, dequantized into each GEMM in bf16 inside one opaque op
                   (redline/converters/nf4_linear.py: under torch.compile no graph holds a dequantized weight, so
                   backward keeps the 4-bit weight alone, as in eager mode)
    bitsandbytes   its packed 4-bit NF4 (functional.quantize_4bit, blocks of 64, compress_statistics: the scales
                   in 8 bits per group of 256 around their mean) and its matmul_4bit (dequantize, then the GEMM;
                   its backward dequantizes again rather than keep the weight), as QLoRA's reference code does

Both compute in the activations' dtype (bf16 on a GPU) and differ only in how the block scales are stored
(torchao: int8 per group of scales; bitsandbytes: an 8-bit dynamic code around their mean): the dequantized
weights agree to within a scale's rounding, a weight at the edge between two NF4 levels aside.

NF4 block sizes: torchao's defaults (blocks of 64, scales in groups of 256) need numel/64 to be a multiple of
256, which e.g. 576×576 (SmolLM2-135M) is not; the scale group here is the largest divisor of numel/64 up to 256
(at least 8 where one exists), so every weight whose size is a multiple of 64 quantizes. bitsandbytes takes any
shape (its last block may be partial).

The converter's `disabled()` turns the adapters off (the base model: the reference model of DPO, without a
second copy); evaluation and sampling keep them on (`keep_in_evaluation`). merge()/unmerge() fold the adapters
into W and back (not for an NF4 base, of either library). What a checkpoint of a LoRA run holds is in
redline/training/adapters.py.

Memory while converting: a LoRA run builds and loads its model in host memory (redline/training/loop.py); the
converter moves one adapted layer at a time to the device, cast or quantized there, then the rest of the model, so
the device never holds the full-precision base.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from redline.converters.lora_linear import lora_linear
from redline.converters.nf4_linear import nf4_linear
from redline.errors import UserError

NF4_BLOCK = 64  # QLoRA's block of weights sharing one absmax scale
NF4_SCALE_GROUP_MAX = 256  # torchao's default group of scales quantized together (double quantization)
NF4_SCALE_GROUP_MIN = 8  # one scale per group would divide by its own absmax: degenerate
NF4_BACKENDS = ("torchao", "bitsandbytes")


_NF4 = None  # torchao's NF4 module once imported
_BNB = None  # bitsandbytes once imported: forward reads it as a global, which torch.compile traces
_BNB_WEIGHT: type | None = None  # the parameter class of a bitsandbytes NF4 weight, made on first use


def nf4_module():
    """torchao's NF4 tensor module (moved between torchao releases), or a one-line error naming the extra."""
    global _NF4
    if _NF4 is not None:
        return _NF4
    for name in ("torchao.dtypes.nf4tensor", "torchao.quantization.quantize_.workflows.nf4.nf4_tensor"):
        try:
            _NF4 = __import__(name, fromlist=["to_nf4"])
            return _NF4
        except ImportError:
            continue
    raise UserError("lora.quantize=nf4 needs torchao (NF4Tensor); install the extra: pip install 'redline[lora]'")


def bnb_module():
    """bitsandbytes, or a one-line error naming the extra."""
    global _BNB
    if _BNB is None:
        try:
            import bitsandbytes
            import bitsandbytes.functional  # noqa: F401 (quantize_4bit, dequantize_4bit)
        except ImportError:
            raise UserError("lora.nf4_backend=bitsandbytes needs bitsandbytes; install the extra: "
                            "pip install 'redline[qlora-bnb]'") from None
        _BNB = bitsandbytes
    return _BNB


def auto_nf4_backend() -> str:
    """lora.nf4_backend=auto's library: torchao where it is installed, else bitsandbytes where it is (else torchao,
    whose absence is then the error)."""
    bnb_only = importlib.util.find_spec("torchao") is None and importlib.util.find_spec("bitsandbytes") is not None
    return "bitsandbytes" if bnb_only else "torchao"


def resolve_nf4_backend(name: str) -> str:
    """torchao or bitsandbytes for lora.nf4_backend=`name`, imported now: a missing library is a one-line error
    before any work."""
    if name == "auto":
        name = auto_nf4_backend()
    if name not in NF4_BACKENDS:
        raise UserError(f"lora.nf4_backend must be auto, torchao or bitsandbytes, got {name!r}")
    nf4_module() if name == "torchao" else bnb_module()
    return name


def _bnb_weight_class() -> type:
    """bitsandbytes' Params4bit (packed codes (ceil(out·in / 2), 1) uint8 and their quant_state, which .to() moves
    along) that counts as the (out, in) weight it stores, as torchao's NF4Tensor does: parameter counts and FLOPs
    per token (GPT.num_params) stay those of the model."""
    global _BNB_WEIGHT
    if _BNB_WEIGHT is None:
        class BnbNF4Weight(bnb_module().nn.Params4bit):
            def numel(self) -> int:
                return math.prod(self.quant_state.shape)

        BnbNF4Weight.__qualname__ = BnbNF4Weight.__name__  # made here, where bitsandbytes is imported
        _BNB_WEIGHT = BnbNF4Weight
    return _BNB_WEIGHT


def nf4_block_sizes(shape: tuple[int, ...], name: str = "weight") -> tuple[int, int]:
    """(block_size, scaler_block_size) for a weight of `shape`, or a one-line error when NF4 cannot store it."""
    numel = math.prod(shape)
    if numel % NF4_BLOCK:
        raise UserError(f"{name} {tuple(shape)} has {numel} elements, not a multiple of NF4's block of {NF4_BLOCK}; "
                        f"leave it out of lora.targets or use lora.quantize=none")
    blocks = numel // NF4_BLOCK
    divisors = [d for d in range(1, min(blocks, NF4_SCALE_GROUP_MAX) + 1) if blocks % d == 0]
    group = divisors[-1]
    if group < NF4_SCALE_GROUP_MIN:  # e.g. a prime number of blocks: one group of them all
        group = next((d for d in range(NF4_SCALE_GROUP_MIN, blocks + 1) if blocks % d == 0), blocks)
    return NF4_BLOCK, group


def to_nf4(weight: torch.Tensor, name: str = "weight", backend: str = "torchao") -> torch.Tensor:
    """weight (out, in) -> its NF4 form with double-quantized scales: torchao's NF4Tensor of the same shape and
    dtype, or (backend=bitsandbytes) a frozen bitsandbytes parameter, dequantized to weight's dtype."""
    if backend == "bitsandbytes":
        packed, state = bnb_module().functional.quantize_4bit(
            weight.detach().contiguous(), blocksize=NF4_BLOCK, compress_statistics=True, quant_type="nf4")
        return _bnb_weight_class()(packed, requires_grad=False, quant_state=state, blocksize=NF4_BLOCK,
                                   compress_statistics=True, quant_type="nf4", bnb_quantized=True)
    block, group = nf4_block_sizes(tuple(weight.shape), name)
    return nf4_module().to_nf4(weight.detach().contiguous(), block, group)


def is_bnb_nf4(t: torch.Tensor) -> bool:
    return _BNB_WEIGHT is not None and isinstance(t, _BNB_WEIGHT)


def is_nf4(t: torch.Tensor) -> bool:
    """Whether `t` is an NF4 weight, of either library."""
    return type(t).__name__ == "NF4Tensor" or is_bnb_nf4(t)


def dequantize(weight: torch.Tensor) -> torch.Tensor:
    """A plain tensor of a (possibly NF4) weight, (out, in) in its original dtype."""
    if is_bnb_nf4(weight):
        return _BNB.functional.dequantize_4bit(weight.data, weight.quant_state)
    return weight.get_original_weight() if is_nf4(weight) else weight


def stored_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype a frozen weight computes in outside autocast: its own, or what an NF4 weight dequantizes to."""
    return weight.quant_state.dtype if is_bnb_nf4(weight) else weight.dtype


class LoRALinear(nn.Linear):
    """nn.Linear with a frozen (bf16/fp32 or NF4) weight and a trained low-rank update; see the module docstring."""

    def __init__(self, in_features: int, out_features: int, bias: bool, rank: int, alpha: float, dropout: float,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, in_features, device=device, dtype=torch.float32))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, device=device, dtype=torch.float32))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as peft's LoRA layer: a small random A
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.adapters_on = True
        self.merged = False

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, alpha: float, dropout: float, base_dtype: torch.dtype,
                    quantize: str, name: str, device: torch.device | None = None,
                    nf4_backend: str = "torchao") -> LoRALinear:
        """The adapted copy of `linear` on `device` (None: where it is): its weight (and bias) frozen in
        base_dtype, NF4 (of the library nf4_backend) when quantize=nf4."""
        with torch.device("meta"):
            layer = cls(linear.in_features, linear.out_features, linear.bias is not None, rank, alpha, dropout)
        device = device or linear.weight.device
        layer.lora_A = nn.Parameter(torch.empty(rank, linear.in_features, device=device))
        layer.lora_B = nn.Parameter(torch.zeros(linear.out_features, rank, device=device))
        nn.init.kaiming_uniform_(layer.lora_A, a=math.sqrt(5))
        weight = linear.weight.detach().to(device, base_dtype)
        frozen = to_nf4(weight, name, nf4_backend) if quantize == "nf4" else weight
        # bitsandbytes' weight is a Parameter already (wrapping it again would drop its quant_state)
        layer.weight = frozen if isinstance(frozen, nn.Parameter) else nn.Parameter(frozen, requires_grad=False)
        if linear.bias is not None:
            layer.bias = nn.Parameter(linear.bias.detach().to(device, base_dtype), requires_grad=False)
        for attr in ("is_residual_out",):
            if hasattr(linear, attr):
                setattr(layer, attr, getattr(linear, attr))
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) -> (..., out): in the autocast dtype under autocast, else in W's dtype (cast back to x's)."""
        device = x.device.type
        autocast = torch.is_autocast_enabled(device)
        dtype = torch.get_autocast_dtype(device) if autocast else stored_dtype(self.weight)
        h = x.to(dtype)  # cast once, for the base and the adapter alike
        adapt = self.adapters_on and not self.merged
        if adapt and not is_nf4(self.weight):  # base and adapter in one op: no pass over activations of its own
            lora_x = None if isinstance(self.lora_dropout, nn.Identity) else self.lora_dropout(h)
            bias = None if self.bias is None else self.bias.to(dtype)
            scaled_b = (self.lora_B * self.scale).to(dtype)  # (out, r)
            out = lora_linear(h, self.weight.to(dtype), bias, self.lora_A.to(dtype), scaled_b, lora_x)
            return out if autocast else out.to(x.dtype)
        if is_bnb_nf4(self.weight):  # dequantizes per call in h's dtype; saves only the packed weight
            out = _BNB.matmul_4bit(h, self.weight.t(), quant_state=self.weight.quant_state)
            if self.bias is not None:
                out = out + self.bias.to(out.dtype)
        elif is_nf4(self.weight):
            out = nf4_linear(h, self.weight)  # an op compile cannot see into: backward keeps only the NF4 weight
            if self.bias is not None:
                out = out + self.bias.to(out.dtype)
        else:
            out = F.linear(h, self.weight, self.bias)
        if adapt:  # an NF4 base, of either library
            low = F.linear(self.lora_dropout(h), self.lora_A.to(dtype))  # (..., r): r ≪ in, out
            # out + low·(scale·B)ᵀ in one GEMM (addmm adds into its output): no separate scaling and adding passes
            # over the (..., out) activations, which in eager mode cost more than the adapter's two thin GEMMs
            scaled_b = (self.lora_B * self.scale).to(dtype)  # (out, r)
            out = torch.addmm(out.flatten(0, -2), low.flatten(0, -2), scaled_b.t()).view(out.shape)
        return out if autocast else out.to(x.dtype)

    def delta(self) -> torch.Tensor:
        """(out, in) fp32: the update the adapters add to W."""
        return (self.lora_B.detach().float() @ self.lora_A.detach().float()) * self.scale

    @torch.no_grad()
    def merge(self) -> None:
        if self.merged:
            return
        if is_nf4(self.weight):
            raise UserError("an NF4 base cannot take the adapters in place; `redline export CKPT --merge` writes "
                            "the merged model")
        self.weight.add_(self.delta().to(self.weight.dtype))
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        if not self.merged:
            return
        self.weight.sub_(self.delta().to(self.weight.dtype))
        self.merged = False

    def extra_repr(self) -> str:
        kind = ("nf4 (bitsandbytes)" if is_bnb_nf4(self.weight) else "nf4" if is_nf4(self.weight)
                else str(self.weight.dtype).removeprefix("torch."))
        return f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha}, base={kind}"


def matches(name: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """A module name matches a pattern that matches it whole or matches its end after a dot (attn.qkv matches
    blocks.3.attn.qkv)."""
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "*." + p) for p in patterns)


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    raw = getattr(model, "_orig_mod", model)
    return {name: m for name, m in raw.named_modules() if isinstance(m, LoRALinear)}


def _set_module(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)


class LoRAConverter:
    """The `lora` converter (see the module docstring)."""

    name = "lora"
    keep_in_evaluation = True  # the adapters are the model being trained: evaluation and sampling keep them

    def __init__(self, rank: int, alpha: float, dropout: float, targets: tuple[str, ...], quantize: str = "none",
                 train_modules: tuple[str, ...] = (), base_dtype: torch.dtype = torch.float32, say=print,
                 device: torch.device | None = None, nf4_backend: str = "auto"):
        self.rank, self.alpha, self.dropout = rank, alpha, dropout
        self.targets, self.quantize, self.train_modules = tuple(targets), quantize, tuple(train_modules)
        self.base_dtype = base_dtype
        self.say, self.device = say, device
        self.layers: dict[str, LoRALinear] = {}
        self.counts: dict[str, int] = {}
        # torchao or bitsandbytes (None without NF4); a missing package is named before any model is built
        self.nf4_backend = resolve_nf4_backend(nf4_backend) if quantize == "nf4" else None

    def convert(self, model: nn.Module) -> None:
        raw = getattr(model, "_orig_mod", model)
        linears = {n: m for n, m in raw.named_modules() if type(m) is nn.Linear}
        from redline.model import BitLinear

        bitnet = [n for n, m in raw.named_modules() if isinstance(m, BitLinear) and matches(n, self.targets)]
        if bitnet:  # an adapter beside it would see neither its norm nor its rounding
            raise UserError(f"lora.targets match {bitnet[0]}, a BitNet projection (model.bitlinear, model.sub_norms: "
                            f"its input normed or rounded inside it), which takes no adapter; target the plain Linear "
                            f"layers alone")
        chosen = [n for n in linears if matches(n, self.targets)]
        if not chosen:
            some = ", ".join(list(linears)[:4])
            raise UserError(f"lora.targets {list(self.targets)} match no Linear layer of the model (its layers are "
                            f"named like {some}); fix the patterns")
        unmatched = [p for p in self.targets if not any(matches(n, [p]) for n in linears)]
        if unmatched:  # a typo beside a pattern that matches would otherwise leave those layers out unnoticed
            some = ", ".join(list(linears)[:4])
            raise UserError(f"lora.targets {unmatched[0]!r} matches no Linear layer of the model (its layers are "
                            f"named like {some}); fix or drop it")
        trained = {n: m for n, m in raw.named_modules() if n and matches(n, self.train_modules)}
        if self.train_modules and not trained:
            raise UserError(f"lora.train_modules {list(self.train_modules)} match no module of the model; name "
                            f"modules such as wte or lm_head")
        named = [n for n, _ in raw.named_modules() if n]
        unmatched = [p for p in self.train_modules if not any(matches(n, [p]) for n in named)]
        if unmatched:
            raise UserError(f"lora.train_modules {unmatched[0]!r} matches no module of the model; name modules such "
                            f"as wte or lm_head")
        if set(chosen) & set(trained):
            raise UserError(f"{sorted(set(chosen) & set(trained))[0]} is both adapted (lora.targets) and trained in "
                            f"full (lora.train_modules); leave it out of one of them")
        for p in raw.parameters():
            p.requires_grad_(False)
        for name in chosen:  # one layer at a time onto the device: its full-precision copy never is there whole
            layer = LoRALinear.from_linear(linears[name], self.rank, self.alpha, self.dropout, self.base_dtype,
                                           self.quantize, name, self.device, self.nf4_backend or "torchao")
            _set_module(raw, name, layer)
            self.layers[name] = layer
        if self.device is not None:
            raw.to(self.device)  # the rest (embeddings, norms, head); NF4 weights move as they are
        for module in trained.values():
            for p in module.parameters():
                p.requires_grad_(True)
        trainable = sum(p.numel() for p in raw.parameters() if p.requires_grad)
        total = sum(p.numel() for p in raw.parameters())
        self.counts = {"adapted_layers": len(chosen), "trainable_params": trainable, "total_params": total}
        base = (f"nf4 through {self.nf4_backend}" if self.quantize == "nf4"
                else str(self.base_dtype).removeprefix("torch."))
        self.say(f"lora: rank {self.rank}, alpha {self.alpha:g} on {len(chosen)} Linear layers (base {base}); "
                 f"{trainable / 1e6:.3f}M of {total / 1e6:.2f}M parameters train ({100 * trainable / total:.2f}%)")

    def before_step(self, step: int):
        return None

    def after_optimizer_step(self, step: int):
        return None

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """The base model: every adapter off (e.g. DPO's reference model)."""
        before = {name: layer.adapters_on for name, layer in self.layers.items()}
        for layer in self.layers.values():
            layer.adapters_on = False
        try:
            yield
        finally:
            for name, layer in self.layers.items():
                layer.adapters_on = before[name]

    def merge(self) -> None:
        for layer in self.layers.values():
            layer.merge()

    def unmerge(self) -> None:
        for layer in self.layers.values():
            layer.unmerge()

    def state_dict(self) -> dict[str, Any]:
        return {}  # the adapters are weights: the checkpoint's model.safetensors holds them

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout, "targets": list(self.targets),
                "quantize": self.quantize, "nf4_backend": self.nf4_backend, "train_modules": list(self.train_modules),
                "base_dtype": str(self.base_dtype).removeprefix("torch."), **self.counts}
