"""Doge's dynamic mask attention and residual scales (model.attn_key_bias, model.residual_scales): the engine's
prefill, chunked prefill, decode and DecodeBatch give the full recompute's tokens, the keys' biases are the paper's
form, training reaches them, and what redline cannot compute is refused by name. Import and export parity with
transformers run in the shared tables (tests/interop_models.py "doge", test_lora_export.ARCHS)."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine
from redline.interop import doge
from redline.model import GPT, ModelConfig
from tests.engine_checks import assert_decode_batch_parks_rows, assert_freed_row_refills
from tests.test_diffllama import assert_engine_decodes_as_full_recompute
from tests.test_latent_attention import sharp

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

DOGE = ModelConfig(vocab_size=96, context_len=64, n_layer=2, n_embd=48, n_head=4, n_kv_head=2, mlp_hidden=64,
                   qk_norm=True, attn_key_bias=True, residual_scales=True, bias=True)


def doge_model(cfg: ModelConfig = DOGE) -> GPT:
    """sharp's model with A, dt_proj and the residual scales moved off their init, so that the biases differ."""
    model = sharp(cfg)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.A.normal_(0, 1.0)
            block.attn.dt_proj.weight.mul_(20)
            block.attn_residual.normal_(1.0, 0.2)
            block.mlp_residual.normal_(1.0, 0.2)
    return model


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_as_full_recompute(chunk, window):
    assert_engine_decodes_as_full_recompute(doge_model(replace(DOGE, sliding_window=window)), chunk)


def test_decode_batch_rows_and_spans():
    model = doge_model()
    assert_freed_row_refills(assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model), model)


def test_key_biases_are_dogess_dynamic_mask():
    """Each key's scores plus exp(A · softplus(dt_proj(v))) of its own values, causal (one layer written out)."""
    torch.manual_seed(0)
    cfg = replace(DOGE, n_layer=1, pos_emb="none", qk_norm=False, bias=False)
    attn = doge_model(cfg).blocks[0].attn
    x = torch.randn(1, 6, 48)
    q, k, v = attn.project(x)  # (1, 6, H*D), (1, 6, KV*D) each
    bias = torch.exp(attn.A * torch.nn.functional.softplus(attn.dt_proj(v)))  # (1, 6, KV): a key's, a kv head
    q, k, v = q.view(1, 6, 4, 12).transpose(1, 2), k.view(1, 6, 2, 12).transpose(1, 2), v.view(1, 6, 2, 12)
    k, v = k.repeat_interleave(2, dim=1), v.transpose(1, 2).repeat_interleave(2, dim=1)
    scores = q @ k.transpose(-1, -2) / 12 ** 0.5 + bias.transpose(1, 2).repeat_interleave(2, dim=1)[:, :, None]
    scores = scores.masked_fill(~torch.ones(6, 6).tril().bool(), float("-inf"))
    y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(1, 6, 48)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, None), attn.proj(y), rtol=1e-5, atol=1e-5)


def test_training_reaches_the_biases_and_scales():
    torch.manual_seed(0)
    model = GPT(DOGE).train()
    with torch.no_grad():  # A = 0 at init (Doge's too) gives every key the bias 1, whatever dt_proj says
        for block in model.blocks:
            block.attn.A.normal_(0, 1.0)
    idx = torch.randint(0, 96, (2, 24))
    model(idx, idx).backward()
    block = model.blocks[1]
    for name, p in (("A", block.attn.A), ("dt_proj", block.attn.dt_proj.weight), ("attn_residual",
                    block.attn_residual), ("mlp_residual", block.mlp_residual)):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_refusals():
    from redline.inference.kernels.fused_block import unsupported
    from redline.inference.plan import _triton_attention_unsupported

    hub = dict(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=4096, keep_window_size=128)
    assert doge.model_config(hub).context_len == 128  # no key is ever dropped within keep_window_size
    with pytest.raises(UserError, match="is_moe=true"):
        doge.model_config({**hub, "is_moe": True})
    with pytest.raises(UserError, match="attention_bias=True with mlp_bias=False"):
        doge.model_config({**hub, "attention_bias": True})
    with pytest.raises(UserError, match="model.attn_key_bias"):
        replace(DOGE, attn_sinks=True).validate()
    with pytest.raises(UserError, match="Doge.*both"):
        doge.check_exportable(replace(DOGE, residual_scales=False))
    assert "model.attn_key_bias" in _triton_attention_unsupported(DOGE, torch.device("cuda"), torch.bfloat16)
    assert "model.attn_key_bias" in unsupported(DOGE)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and the biases' gradients match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    model = doge_model(replace(DOGE, n_embd=128, vocab_size=512, context_len=128)).cuda()  # A off its zero init,
    # else dt_proj takes no gradient
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[0].attn.dt_proj.weight)
