"""The output layer in FP8 with delayed scaling: the `fp8_head` converter (redline/converters/).

At 124M parameters the head (n_embd × vocab) is the largest product of a step: with GPT-2's 50,304-token vocabulary
a quarter of the model's FLOPs. torchao's FP8 layers (fp8=all) scale each tensor from its own amax at every call,
which costs a reduction pass over the activations and the gradient before each cast. This converter casts with
scales taken from earlier steps instead (delayed scaling, as NVIDIA's Transformer Engine does; modded-nanogpt's
speedrun runs its head in FP8 with fixed scales), so a cast is one pass, and the amax the next steps need is taken
from the tensor on the way:

    forward   x8 = sat(x · s_x) e4m3, w8 = sat(W · s_w) e4m3;  logits = (x8 · w8ᵀ) / (s_x · s_w)      (N, V) bf16
    backward  g8 = sat(g · s_g) e5m2;  grad_x = (g8 · w8) / (s_g · s_w),  grad_W = (g8ᵀ · x8) / (s_g · s_x)

with sat() saturating at the format's largest value (e4m3 448, e5m2 57,344: e5m2's wider range suits gradients).
Each scale is FORMAT_MAX / the largest amax of its tensor over the last AMAX_HISTORY optimizer steps, updated on
the device after each optimizer step (no host synchronisation). The first `warmup_steps` steps (fp8_warmup_steps, at
least one) run the head in BF16 and only record the amaxes, so FP8 starts from measured scales; evaluation and sampling run it in BF16. A tied head
stays tied (the module holds the embedding's own Parameter), and the parameter keeps the name `lm_head.weight`, so
checkpoints load into a plain model. The amax histories are the converter's state: a resumed run scales as the
uninterrupted one.

On a GPU this needs FP8 products (compute capability 8.9 or newer); on a CPU torch's FP8 product runs emulated,
for tests, not speed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from redline.errors import UserError

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
E4M3_MAX, E5M2_MAX = torch.finfo(E4M3).max, torch.finfo(E5M2).max
FORMAT_MAX = (E4M3_MAX, E4M3_MAX, E5M2_MAX)  # x, W, the gradient
AMAX_HISTORY = 16  # optimizer steps whose largest amax sets a scale
MULTIPLE = 16  # FP8 products need every dimension to be a multiple of this


def _record(amax: torch.Tensor, first: int, *tensors: torch.Tensor) -> None:
    """amax[first:first + len(tensors)] = max(itself, each tensor's largest magnitude), in place on the device."""
    seen = torch.stack([t.detach().abs().amax().float() for t in tensors])
    torch.maximum(amax[first:first + len(tensors)], seen, out=amax[first:first + len(tensors)])


def _inverse(scale: torch.Tensor, i: int) -> torch.Tensor:
    """1 / scale[i] as a tensor of its own: inductor's _scaled_mm lowering asserts on a scale that is a view at an
    offset into a larger buffer (scale.reciprocal()[i] compiled on CUDA)."""
    return torch.reciprocal(scale[i])


class _Float8Head(torch.autograd.Function):
    """x (N, C), W (V, C), scale (3,) [s_x, s_w, s_g], amax (3,) running maxima of this step -> x·Wᵀ (N, V) bf16."""

    @staticmethod
    def forward(ctx, x, weight, scale, amax):
        _record(amax, 0, x, weight)
        x8 = (x.float() * scale[0]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
        w8 = (weight.float() * scale[1]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
        ctx.save_for_backward(x8, w8, scale, amax)
        return torch._scaled_mm(x8, w8.t(), scale_a=_inverse(scale, 0), scale_b=_inverse(scale, 1),
                                out_dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, grad):
        x8, w8, scale, amax = ctx.saved_tensors
        _record(amax, 2, grad)
        g8 = (grad.float() * scale[2]).clamp(-E5M2_MAX, E5M2_MAX).to(E5M2)
        inv_x, inv_w, inv_g = (_inverse(scale, i) for i in range(3))
        # _scaled_mm takes its first operand row-major and its second column-major
        grad_x = torch._scaled_mm(g8, w8.t().contiguous().t(), scale_a=inv_g, scale_b=inv_w, out_dtype=torch.bfloat16)
        grad_w = torch._scaled_mm(g8.t().contiguous(), x8.t().contiguous().t(), scale_a=inv_g, scale_b=inv_x,
                                  out_dtype=torch.float32)
        return grad_x, grad_w, None, None


class _RecordedHead(torch.autograd.Function):
    """The BF16 product x·Wᵀ (as autocast computes it), recording the amaxes of x, W and the gradient."""

    @staticmethod
    def forward(ctx, x, weight, amax):
        _record(amax, 0, x, weight)
        x16, w16 = x.to(torch.bfloat16), weight.to(torch.bfloat16)
        ctx.save_for_backward(x16, w16, amax)
        return x16 @ w16.t()

    @staticmethod
    def backward(ctx, grad):
        x16, w16, amax = ctx.saved_tensors
        _record(amax, 2, grad)
        grad = grad.to(torch.bfloat16)
        return grad @ w16, (grad.t() @ x16).float(), None


class Float8Head(nn.Module):
    """The model's lm_head: its weight (the same Parameter, tied or not), run as `mode` says: "fp8", "record" (BF16,
    amaxes recorded) or "plain" (F.linear). Scales and amaxes are the converter's tensors."""

    def __init__(self, weight: nn.Parameter, scale: torch.Tensor, amax: torch.Tensor):
        super().__init__()
        self.weight = weight
        self.scale, self.amax = scale, amax
        self.mode = "record"

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "plain" or not torch.is_grad_enabled():
            return F.linear(x, self.weight)
        flat = x.reshape(-1, x.shape[-1])  # (N, C)
        if flat.shape[0] % MULTIPLE:  # an FP8 product needs N a multiple of 16 too: this call runs in BF16
            return F.linear(x, self.weight)
        if self.mode == "fp8":
            out = _Float8Head.apply(flat, self.weight, self.scale, self.amax)
        else:
            out = _RecordedHead.apply(flat, self.weight, self.amax)
        return out.view(*x.shape[:-1], out.shape[-1])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}"


class Float8HeadConverter:
    """fp8_head=True: the model's lm_head as a Float8Head (see the module docstring)."""

    name = "fp8_head"

    def __init__(self, device: torch.device, warmup_steps: int = 1, say: Callable[[str], None] = print):
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            if (major, minor) < (8, 9):
                raise UserError(f"fp8_head needs FP8 products: compute capability 8.9 or newer, this GPU "
                                f"({torch.cuda.get_device_name(device)}) has {major}.{minor}; drop fp8_head")
        elif device.type == "cpu":
            say("fp8_head on a CPU: FP8 products run emulated (for tests, not speed)")
        else:
            raise UserError(f"fp8_head runs on a CUDA GPU (or emulated on a CPU), not on {device.type}")
        self.warmup_steps = max(1, warmup_steps)  # FP8 starts from recorded amaxes
        self.scale = torch.ones(3, device=device)
        self.amax = torch.zeros(3, device=device)  # this optimizer step's, across its micro-batches
        self.history = torch.zeros(3, AMAX_HISTORY, device=device)
        self._format_max = torch.tensor(FORMAT_MAX, device=device)
        self.head: Float8Head | None = None
        self.fp8 = False

    def convert(self, model: nn.Module) -> None:
        head = getattr(model, "lm_head", None)
        if not isinstance(head, nn.Linear):
            raise UserError("fp8_head converts the model's lm_head, a Linear layer; this model has none")
        if head.bias is not None:
            raise UserError("fp8_head takes a head without a bias; drop fp8_head for this model")
        out_features, in_features = head.weight.shape
        if in_features % MULTIPLE or out_features % MULTIPLE:
            raise UserError(f"fp8_head needs the head's dimensions to be multiples of {MULTIPLE} (FP8 products), "
                            f"got {out_features} × {in_features}; drop fp8_head")
        self.head = Float8Head(head.weight, self.scale, self.amax)
        model.lm_head = self.head
        self._set_mode()

    def _set_mode(self) -> None:
        if self.head is not None:
            self.head.mode = "fp8" if self.fp8 else "record"

    def before_step(self, step: int):
        if not self.fp8 and step >= self.warmup_steps:
            self.fp8 = True
            self._set_mode()
            return {"event": "fp8_head", "message": f"step {step}: the output layer runs in FP8 from here (delayed "
                                                    f"scaling over {AMAX_HISTORY} steps' amaxes)"}
        return None

    @torch.no_grad()
    def after_optimizer_step(self, step: int):
        """This step's amaxes into the history, and the scales from it: all on the device."""
        self.history.copy_(torch.roll(self.history, 1, dims=1))
        self.history[:, 0] = self.amax
        largest = self.history.amax(dim=1)  # (3,)
        self.scale.copy_(torch.where(largest > 0, self._format_max / largest.clamp_min(1e-30), self.scale))
        self.amax.zero_()
        return None

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        if self.head is None:
            yield
            return
        mode, self.head.mode = self.head.mode, "plain"
        try:
            yield
        finally:
            self.head.mode = mode

    def state_dict(self) -> dict:
        return {"fp8": self.fp8, "scale": self.scale.cpu(), "history": self.history.cpu()}

    def load_state_dict(self, state: dict) -> None:
        self.fp8 = bool(state["fp8"])
        self.scale.copy_(state["scale"])
        self.history.copy_(state["history"])
        self._set_mode()

    def describe(self) -> dict:
        return {"formats": "inputs and weight e4m3, gradient e5m2", "scaling": f"delayed, {AMAX_HISTORY} steps",
                "warmup_steps": self.warmup_steps, "fp8": self.fp8}
