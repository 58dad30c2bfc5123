"""Short-convolution layers (model.conv_layers, LFM2's): packed documents kept apart in training, the inference
engine's cache of each token's convolution input (prefill whole or in chunks, then decode) against full recompute,
the refusals. Parity with transformers' LFM2 is in tests/test_interop.py (the FAMILIES and REDLINE_EXPORTS
tables)."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.model import GPT, ModelConfig

from tests.engine_checks import assert_compiled_engine_stays_greedy

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

CFG = ModelConfig(vocab_size=96, context_len=64, n_layer=4, n_embd=32, n_head=4, n_kv_head=2, qk_norm=True,
                  conv_layers=(0, 1, 3), conv_kernel=3)


def test_packed_documents_do_not_see_each_other():
    torch.manual_seed(0)
    assert_documents_apart(GPT(CFG).eval())


def assert_documents_apart(model) -> None:
    """Two documents packed in one row (doc_ids, positions restarting) give each its own logits; unpacked, the second
    reads the first."""
    idx = torch.randint(0, 96, (2, 12))
    doc_ids = torch.tensor([[0] * 5 + [1] * 7] * 2)
    positions = torch.cat([torch.arange(5), torch.arange(7)])
    with torch.no_grad():
        packed = model(idx, positions=positions, doc_ids=doc_ids)
        torch.testing.assert_close(packed[:, :5], model(idx[:, :5]))
        torch.testing.assert_close(packed[:, 5:], model(idx[:, 5:]))
        assert (model(idx)[:, 5:] - packed[:, 5:]).abs().max() > 1e-3  # unpacked, the second reads the first


@pytest.mark.parametrize("chunk", [32768, 4, 1])
def test_engine_decodes_as_full_recompute(chunk):
    """Prompts of different lengths in one batch, prefilled whole or in chunks of `chunk` tokens (the convolution
    reading the tokens before each chunk from the cache), then decoded one token at a time."""
    torch.manual_seed(0)
    model = GPT(CFG).eval()
    prompts = [list(range(1, 12)), [5, 6], [40]]
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=chunk)
    got = [r.tokens for r in engine.generate(prompts, 10, SamplingParams(temperature=0))]
    expected = [model.generate(torch.tensor([p]), 10, temperature=0)[0, len(p):].tolist() for p in prompts]
    assert got == expected
    assert engine.kv_bytes_per_token() == (2 * 1 * 2 * 8 + 3 * 32) * 4  # fp32: one attention layer, three conv


def test_refusals():
    with pytest.raises(UserError, match="kv_cache_dtype=fp8 with short-convolution or recurrent layers"):
        InferenceEngine(GPT(CFG), compile=False, kv_cache_dtype="fp8")
    for bad in ((3, 1), (0, 4), (-1,)):
        with pytest.raises(UserError, match="model.conv_layers"):
            replace(CFG, conv_layers=bad).validate()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones."""
    torch.manual_seed(0)
    cfg = replace(CFG, n_embd=128, n_head=4, vocab_size=512, context_len=128)
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    model.train()
    idx = torch.randint(0, cfg.vocab_size, (4, 64), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx, idx)
    grad = torch.autograd.grad(loss, model.blocks[0].attn.weight)[0]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss_c = torch.compile(model)(idx, idx)
    grad_c = torch.autograd.grad(loss_c, model.blocks[0].attn.weight)[0]
    torch.testing.assert_close(loss_c, loss, rtol=1e-2, atol=1e-2)
    assert (grad_c - grad).norm() / grad.norm() < 0.05
