"""LoRA's fused op (redline/converters/lora_linear.py) against the same product written with torch ops: output and
every gradient, eagerly and under torch.compile, with a bias, with dropout on the adapter's input, and with an input
that needs no gradient (a frozen embedding's output)."""

import pytest
import torch
import torch.nn.functional as F

from redline.converters.lora import LoRALinear
from redline.converters.lora_linear import lora_linear


def reference(x, weight, bias, a, b, x_a=None):
    return F.linear(x, weight, bias) + F.linear(F.linear(x if x_a is None else x_a, a), b)


def tensors(bias: bool, dropout: bool, x_grad: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, 24, generator=g, dtype=torch.float64)
    mask = (torch.rand(3, 5, 24, generator=g) > 0.3).double() / 0.7
    w = torch.randn(40, 24, generator=g, dtype=torch.float64)
    bb = torch.randn(40, generator=g, dtype=torch.float64) if bias else None
    a = torch.randn(4, 24, generator=g, dtype=torch.float64)
    b = torch.randn(40, 4, generator=g, dtype=torch.float64)
    x.requires_grad_(x_grad)
    a.requires_grad_(True)
    b.requires_grad_(True)
    return x, w, bb, a, b, mask if dropout else None


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("bias,dropout,x_grad", [(False, False, True), (True, False, True), (False, True, True),
                                                 (False, False, False)],
                         ids=["plain", "bias", "dropout", "frozen-input"])
def test_op_equals_torch_ops(bias, dropout, x_grad, compiled):
    outs, grads = [], []
    for fn in (reference, lora_linear):
        x, w, bb, a, b, mask = tensors(bias, dropout, x_grad)
        x_a = None if mask is None else x * mask
        run = torch.compile(fn, backend="aot_eager", fullgraph=True) if compiled and fn is lora_linear else fn
        out = run(x, w, bb, a, b, x_a)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
        (out * grad_out).sum().backward()
        outs.append(out.detach())
        grads.append([x.grad, a.grad, b.grad])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-12, atol=1e-12)
    for mine, ref, name in zip(grads[1], grads[0], ("x", "A", "B")):
        if ref is None:
            assert mine is None, name
        else:
            torch.testing.assert_close(mine, ref, rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_layer_under_inductor_equals_eager(device):
    """The LoRA layer compiled by Inductor (the op stays opaque there) against the same layer in eager mode (fp32,
    TF32 off); on a GPU also in bf16 under autocast against the same product written with torch ops."""
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    base = torch.nn.Linear(32, 48)
    layer = LoRALinear.from_linear(base, 4, 8.0, 0.0, torch.float32, "none", "fc", torch.device(device))
    with torch.no_grad():
        layer.lora_B.normal_(0, 0.1)
    x = torch.randn(2, 7, 32, requires_grad=True, device=device)
    results = []
    for fn in (layer, torch.compile(layer, fullgraph=True)):
        x.grad, layer.lora_A.grad, layer.lora_B.grad = None, None, None
        out = fn(x)
        out.square().sum().backward()
        results.append([out.detach(), x.grad, layer.lora_A.grad, layer.lora_B.grad])
    for compiled, eager in zip(results[1], results[0]):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    if device == "cuda":
        with torch.autocast("cuda", torch.bfloat16):
            fused = layer(x)
            by_ops = reference(x.bfloat16(), layer.weight.bfloat16(), layer.bias.bfloat16(),
                               layer.lora_A.bfloat16(), (layer.lora_B * layer.scale).bfloat16())
        assert fused.dtype == torch.bfloat16
        torch.testing.assert_close(fused.float(), by_ops.float(), rtol=2e-2, atol=2e-2)
