"""The fp8_head converter (redline/converters/float8_head.py): the output layer's FP8 products against float32, the
gradient's scale, the delayed scales, the converter's switch from recording to FP8, and a head that stays tied.
CPU: torch's FP8 product runs emulated there."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from redline.converters.float8_head import AMAX_HISTORY, E4M3_MAX, E5M2_MAX, Float8Head, Float8HeadConverter
from redline.model import GPT
from redline.presets import get_preset

TINY = replace(get_preset("tiny"), n_layer=2, n_embd=64, n_head=4, n_kv_head=2, vocab_size=256, context_len=32,
               tie_embeddings=True)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def head_with_scales(weight: torch.nn.Parameter, x: torch.Tensor, grad_amax: float, grad_scale: bool = True):
    scale = torch.tensor([E4M3_MAX / float(x.abs().max()), E4M3_MAX / float(weight.abs().max()),
                          E5M2_MAX / grad_amax if grad_scale else 1.0])
    head = Float8Head(weight, scale, torch.zeros(3))
    head.mode = "fp8"
    return head


def test_fp8_products_and_gradients_match_float32_within_fp8_rounding():
    """Logits, input gradient and weight gradient within FP8's rounding of the float32 products; the gradient, as
    small as a mean loss over many tokens makes it, survives e5m2 only because it is scaled (unscaled, most of it
    underflows)."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(128, 64) * 0.02)
    x = torch.randn(96, 64)
    grad = torch.randn(96, 128) * 1e-7  # (tokens, vocab): a mean over ~10^5 tokens' losses
    ref_out = x @ weight.detach().t()
    ref_grad_x, ref_grad_w = grad @ weight.detach(), grad.t() @ x

    errors = {}
    for scaled in (True, False):
        head = head_with_scales(weight, x, float(grad.abs().max()), grad_scale=scaled)
        xs = x.clone().requires_grad_()
        out = head(xs)
        out.backward(grad.to(out.dtype))
        errors[scaled] = (relative(out, ref_out), relative(xs.grad, ref_grad_x), relative(weight.grad, ref_grad_w))
        assert torch.equal(head.amax, torch.tensor([x.abs().max(), weight.abs().max(),
                                                    grad.to(torch.bfloat16).abs().max()]).float())
        weight.grad = None
    assert all(e < 0.06 for e in errors[True]), errors[True]
    assert errors[False][1] > 0.5 and errors[False][2] > 0.5, errors[False]  # e5m2's smallest is ~1.5e-5


def test_delayed_scales_follow_the_largest_amax_of_recent_steps():
    converter = Float8HeadConverter(torch.device("cpu"), warmup_steps=1, say=lambda _: None)
    for step, amax in enumerate([2.0, 8.0, 1.0]):
        converter.amax.copy_(torch.tensor([amax, amax / 10, amax / 1e4]))
        converter.after_optimizer_step(step)
    torch.testing.assert_close(converter.scale, torch.tensor([E4M3_MAX / 8, E4M3_MAX / 0.8, E5M2_MAX / 8e-4]))
    assert converter.amax.abs().sum() == 0  # each optimizer step starts its own maxima
    for step in range(3, 3 + AMAX_HISTORY - 1):  # the 8.0 leaves the history after AMAX_HISTORY steps
        converter.amax.copy_(torch.tensor([1.0, 0.1, 1e-4]))
        converter.after_optimizer_step(step)
    torch.testing.assert_close(converter.scale[0], torch.tensor(E4M3_MAX / 1.0))


def test_the_converter_records_then_runs_fp8_and_keeps_the_head_tied():
    torch.manual_seed(0)
    model = GPT(TINY)
    plain_keys = set(model.state_dict())
    converter = Float8HeadConverter(torch.device("cpu"), warmup_steps=2, say=lambda _: None)
    converter.convert(model)
    assert model.lm_head.weight is model.wte.weight and set(model.state_dict()) == plain_keys
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 256, (4, 33))
    losses, modes = [], []
    for step in range(8):
        converter.before_step(step)
        modes.append(model.lm_head.mode)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        converter.after_optimizer_step(step)
        losses.append(loss.item())
    assert modes == ["record"] * 2 + ["fp8"] * 6
    assert losses[-1] < losses[0] - 0.1  # it trains through the switch
    assert model.lm_head.weight is model.wte.weight
    with converter.disabled():
        assert model.lm_head.mode == "plain"
    assert model.lm_head.mode == "fp8"
    state = converter.state_dict()
    again = Float8HeadConverter(torch.device("cpu"), say=lambda _: None)
    again.load_state_dict(state)
    assert again.fp8 and torch.equal(again.scale, converter.scale) and torch.equal(again.history, converter.history)


def test_a_head_it_cannot_take_is_refused():
    from redline.errors import UserError

    model = GPT(replace(TINY, vocab_size=250, tie_embeddings=False))  # padded to a multiple of 64: accepted
    Float8HeadConverter(torch.device("cpu"), say=lambda _: None).convert(model)
    odd = GPT(replace(TINY, n_embd=72, n_head=4, n_kv_head=2))
    with pytest.raises(UserError, match="multiples of 16"):
        Float8HeadConverter(torch.device("cpu"), say=lambda _: None).convert(odd)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_compiled_head_trains_on_a_gpu_as_the_bf16_head_does():
    """torch.compile lowers the FP8 products with inductor on CUDA (not on a CPU): a compiled model with the
    converter follows the plain compiled model's losses within FP8's rounding over the switch from recording."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs FP8 products (compute capability 8.9 or newer)")
    # Both models are compiled from a clean dynamo state: after the GPU tests before it in one process, GPT.forward
    # may be at dynamo's recompile limit, and one of the two runs would then fall back to eager (the likely cause
    # of one failure in a full GPU run, whose output was not kept; it passed alone and after its four neighbours).
    torch._dynamo.reset()
    config = replace(TINY, vocab_size=512, n_embd=128)
    tokens = torch.randint(0, 512, (8, 33), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    runs = {}
    for fp8 in (False, True):
        torch.manual_seed(0)
        model = GPT(config).cuda()
        converter = Float8HeadConverter(torch.device("cuda"), warmup_steps=2, say=lambda _: None)
        if fp8:
            converter.convert(model)
        compiled = torch.compile(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for step in range(6):
            if fp8:
                converter.before_step(step)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = compiled(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if fp8:
                converter.after_optimizer_step(step)
            losses.append(loss.item())
        runs[fp8] = losses
    assert model.lm_head.mode == "fp8"
    assert runs[True][-1] < runs[True][0] - 0.1
    assert runs[True] == pytest.approx(runs[False], rel=0.02)
