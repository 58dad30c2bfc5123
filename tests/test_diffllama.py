"""Differential attention (model.diff_attention, DiffLlama's): the engine's prefill, chunked prefill, decode and
DecodeBatch give the full recompute's tokens, training reaches λ's vectors, and what it cannot take is refused by
name. Import and export parity with transformers run in the shared tables (tests/interop_models.py "diffllama",
REDLINE_EXPORTS, test_lora_export.ARCHS)."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.interop import diffllama
from redline.model import GPT, ModelConfig
from tests.engine_checks import assert_decode_batch_parks_rows, assert_freed_row_refills, full_recompute
from tests.test_latent_attention import sharp

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

DIFF = ModelConfig(vocab_size=96, context_len=64, n_layer=3, n_embd=48, n_head=4, n_kv_head=2, mlp_hidden=64,
                   diff_attention=True)
DIFF_GQA = replace(DIFF, n_head=8, n_kv_head=4, head_size=8, n_layer=2)  # two query heads a kv head


def assert_engine_decodes_as_full_recompute(model, chunk: int) -> None:
    """Prompts of different lengths in one batch, prefilled whole or in chunks of `chunk` tokens, then decoded one
    token at a time: the full recompute's tokens."""
    prompts = [list(range(1, 12)), [5, 6], [40]]
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=chunk)
    got = [r.tokens for r in engine.generate(prompts, 10, SamplingParams(temperature=0))]
    assert got == [full_recompute(model, p, 10) for p in prompts]


@pytest.mark.parametrize("cfg", [DIFF, DIFF_GQA], ids=["mha-pairs", "gqa"])
@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_as_full_recompute(chunk, cfg):
    assert_engine_decodes_as_full_recompute(sharp(cfg), chunk)


def test_decode_batch_rows_and_spans():
    model = sharp(DIFF_GQA)
    assert_freed_row_refills(assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model), model)


def test_pairs_heads_over_value_halves():
    """Against the paper's form written out: head i's map over [v of kv heads 0..KV/2 | KV/2..KV] minus λ times head
    i + H/2's, RMS-normed, times 1 − λ_init (one layer, 2 heads, 2 kv heads: each half one head)."""
    torch.manual_seed(0)
    cfg = replace(DIFF, n_layer=1, n_head=2, n_kv_head=2, n_embd=16, pos_emb="none")
    attn = GPT(cfg).blocks[0].attn.eval()
    x = torch.randn(1, 5, 16)
    q, k, v = (t.view(1, 5, 2, 8).transpose(1, 2) for t in attn.project(x))  # (1, 2, 5, 8)
    maps = torch.softmax((q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(~torch.ones(5, 5).tril().bool(),
                                                                          float("-inf")), dim=-1)
    wide = maps @ torch.cat([v[:, :1], v[:, 1:]], dim=-1)  # (1, 2, 5, 16): each head's map over both halves
    lam = (torch.exp(attn.lambda_q1 @ attn.lambda_k1) - torch.exp(attn.lambda_q2 @ attn.lambda_k2)
           + attn.lambda_init)
    y = wide[:, 0] - lam * wide[:, 1]
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * (1 - attn.lambda_init)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, None), attn.proj(y), rtol=1e-5, atol=1e-6)
    assert attn.lambda_init == pytest.approx(0.2)  # 0.8 − 0.6·exp(0) on layer 0


def test_training_reaches_the_lambdas():
    torch.manual_seed(0)
    model = GPT(DIFF).train()
    idx = torch.randint(0, DIFF.vocab_size, (2, 24))
    model(idx, idx).backward()
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
        g = getattr(model.blocks[1].attn, name).grad
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, name


def test_refusals():
    from redline.inference.plan import _triton_attention_unsupported

    with pytest.raises(UserError, match="model.diff_attention"):
        replace(DIFF, n_kv_head=1).validate()
    with pytest.raises(UserError, match="model.diff_attention"):
        replace(DIFF, attn_sinks=True).validate()
    from redline.inference.kernels.fused_block import unsupported

    assert "model.diff_attention" in _triton_attention_unsupported(DIFF, torch.device("cuda"), torch.bfloat16)
    assert "model.diff_attention" in unsupported(DIFF)
    hub = dict(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2)
    with pytest.raises(UserError, match="attention_bias=true"):
        diffllama.model_config({**hub, "attention_bias": True})
    with pytest.raises(UserError, match="attention_dropout=0.1"):
        diffllama.model_config({**hub, "attention_dropout": 0.1})
    with pytest.raises(UserError, match="DiffLlama.*sliding_window"):
        diffllama.check_exportable(replace(DIFF, sliding_window=8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and λ's gradients match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = replace(DIFF_GQA, n_embd=128, vocab_size=512, context_len=128)
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[1].attn.lambda_q1)
