"""Griffin's recurrent layers (model.delta_rule=rglru, RecurrentGemma's): the engine's prefill, chunked prefill,
decode and DecodeBatch give the full recompute's tokens, packed documents start their state afresh, training reaches
the recurrence's parameters, and what redline cannot compute is refused by name. Import and export parity with
transformers run in the shared tables (tests/interop_models.py "recurrent_gemma", test_lora_export.ARCHS)."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine
from redline.interop import recurrent_gemma
from redline.model import GPT, ModelConfig
from tests.engine_checks import assert_decode_batch_parks_rows, assert_freed_row_refills
from tests.test_diffllama import assert_engine_decodes_as_full_recompute
from tests.test_latent_attention import sharp

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

HUB = dict(vocab_size=96, hidden_size=48, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
           num_key_value_heads=1, attention_window_size=5, logits_soft_cap=30.0)
GRIFFIN = replace(recurrent_gemma.model_config(HUB), context_len=64)  # recurrent, recurrent, local attention


@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_as_full_recompute(chunk):
    assert_engine_decodes_as_full_recompute(sharp(GRIFFIN), chunk)


def test_decode_batch_rows_and_spans():
    model = sharp(GRIFFIN)
    assert_freed_row_refills(assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model), model)


def test_packed_documents_start_their_state_afresh():
    """Two documents packed in one row (positions restarting, doc_ids): each one's logits are its own forward's."""
    model = sharp(GRIFFIN)
    a, b = torch.randint(0, 96, (1, 7)), torch.randint(0, 96, (1, 5))
    packed = torch.cat([a, b], dim=1)
    positions = torch.cat([torch.arange(7), torch.arange(5)])[None]
    doc_ids = torch.tensor([[0] * 7 + [1] * 5])
    with torch.no_grad():
        got = model(packed, positions=positions, doc_ids=doc_ids)
        torch.testing.assert_close(got[:, :7], model(a), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[:, 7:], model(b), rtol=1e-5, atol=1e-5)


def test_training_reaches_the_recurrence():
    torch.manual_seed(0)
    model = GPT(GRIFFIN).train()
    idx = torch.randint(0, 96, (2, 24))
    model(idx, idx).backward()
    mixer = model.blocks[0].attn
    for name, p in mixer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_refusals():
    with pytest.raises(UserError, match="hidden_activation='silu'"):
        recurrent_gemma.model_config({**HUB, "hidden_activation": "silu"})
    with pytest.raises(UserError, match="lru_width=50"):
        recurrent_gemma.model_config({**HUB, "lru_width": 50})
    with pytest.raises(UserError, match="rope_type='linear'"):
        recurrent_gemma.model_config({**HUB, "rope_parameters": {"rope_type": "linear", "factor": 2.0}})
    with pytest.raises(UserError, match="block_types"):
        recurrent_gemma.model_config({**HUB, "block_types": ["recurrent", "mlp"]})
    with pytest.raises(UserError, match="model.delta_rule=rglru"):
        replace(GRIFFIN, delta_key_dim=2).validate()
    with pytest.raises(UserError, match="RecurrentGemma.*model.sliding_window"):
        recurrent_gemma.check_exportable(replace(GRIFFIN, sliding_window=0))
    assert recurrent_gemma.model_config(HUB).embed_multiplier == 6.9375  # sqrt(48) rounded to bf16, as transformers


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and the recurrence's gradients match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = replace(GRIFFIN, n_embd=128, vocab_size=512, context_len=128, delta_value_dim=32, mlp_hidden=256,
                  embed_multiplier=float(torch.tensor(128 ** 0.5, dtype=torch.bfloat16)))
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[0].attn.recurrent_param)
