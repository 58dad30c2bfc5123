"""QLoRA's NF4 GEMM as an opaque op (redline/converters/nf4_linear.py): bit for bit torchao's linear_nf4, and under
torch.compile a graph that keeps no dequantized base weight for backward, with the same numerics as eager."""

import pytest
import torch

from redline.converters.lora import LoRAConverter, lora_layers, nf4_module, to_nf4
from redline.converters.nf4_linear import dequantize_parts, nf4_linear, nf4_parts
from redline.model import GPT, ModelConfig
from redline.training.activation_checkpointing import apply_activation_checkpointing

# head_dim 16: qkv (128, 64), proj (64, 64), fc (384, 64), proj (64, 192); no activation of 2 × 24 tokens and
# not the head (256, 64), whose frozen fp32 weight autocast saves in bf16 (eager alike), has an adapted weight's shape
TINY = ModelConfig(vocab_size=200, context_len=32, n_layer=2, n_embd=64, n_head=4, n_kv_head=2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(576, 576), (192, 64)])  # 576²: a scale group of 216, not torchao's 256
def test_nf4_linear_equals_torchao_bit_for_bit(shape, dtype):
    torch.manual_seed(0)
    weight = to_nf4(torch.randn(shape, dtype=dtype))
    parts, block, group = nf4_parts(weight)
    assert torch.equal(dequantize_parts(parts, block, group, *shape), weight.get_original_weight())
    x = torch.randn(3, 5, shape[1], dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    out, out_ref = nf4_linear(x, weight), nf4_module().linear_nf4(x_ref, weight)
    grad = torch.randn_like(out)
    out.backward(grad)
    out_ref.backward(grad)
    assert torch.equal(out, out_ref) and torch.equal(x.grad, x_ref.grad)



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(576, 576), (192, 64), (8192, 2048)])
def test_nf4_triton_dequantization_equals_torchao_bit_for_bit(shape, dtype):
    from redline.converters.nf4_kernel import dequantize_nf4_cuda

    torch.manual_seed(0)
    weight = to_nf4(torch.randn(shape, dtype=dtype, device="cuda") * 0.02)
    parts, block, group = nf4_parts(weight)
    assert torch.equal(dequantize_nf4_cuda(parts, block, group, *shape), weight.get_original_weight())
    x = torch.randn(7, shape[1], dtype=dtype, device="cuda", requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    out, out_ref = nf4_linear(x, weight), nf4_module().linear_nf4(x_ref, weight)
    out.backward(torch.ones_like(out))
    out_ref.backward(torch.ones_like(out_ref))
    assert torch.equal(out, out_ref) and torch.equal(x.grad, x_ref.grad)

def qlora_model(checkpointing: str) -> GPT:
    torch.manual_seed(0)
    model = GPT(TINY)
    LoRAConverter(4, 8.0, 0.0, ("attn.*", "mlp.*"), "nf4", base_dtype=torch.bfloat16, say=lambda m: None
                  ).convert(model)
    with torch.no_grad():  # B starts at zero: let the adapters change the output
        for layer in lora_layers(model).values():
            layer.lora_B.normal_(0, 0.05)
    apply_activation_checkpointing(model, checkpointing)
    return model


def step(model, idx, saved: list | None = None):
    """Loss and the adapters' gradients of one bf16-autocast step; `saved` collects what autograd keeps."""
    model.zero_grad(set_to_none=True)
    hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if saved is not None:
            with hooks:
                loss = model(idx, idx)
        else:
            loss = model(idx, idx)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_compiled_qlora_saves_no_dequantized_weight_and_matches_eager(checkpointing):
    idx = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(0))
    eager = qlora_model(checkpointing)
    loss_eager, grads_eager = step(eager, idx)
    model = qlora_model(checkpointing)
    for block in model.blocks:  # per block, as a deep model is compiled (redline/training/wrap.py)
        block.compile()
    step(model, idx)  # compiles (the first block's input needs no gradient, the second's does)
    saved: list[torch.Tensor] = []
    loss, grads = step(model, idx, saved)
    torch.testing.assert_close(loss, loss_eager, atol=1e-2, rtol=1e-2)
    assert grads.keys() == grads_eager.keys() and len(grads) == 2 * 8
    for name, grad in grads.items():
        torch.testing.assert_close(grad, grads_eager[name], atol=2e-3, rtol=5e-2, msg=name)
    weights = {tuple(layer.weight.shape) for layer in lora_layers(model).values()}
    weights |= {(o, i) for i, o in weights}  # a transposed copy would be just as large
    dequantized = [tuple(t.shape) for t in saved if t.is_floating_point() and tuple(t.shape) in weights]
    assert saved and not dequantized, f"backward keeps dequantized base weights {dequantized}"
