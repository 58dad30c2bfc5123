"""ModernBERT-Decoder's layers (model.head_transform, model.first_norm_free with model.embed_norm): the engine's
prefill, chunked prefill, decode and DecodeBatch give the full recompute's tokens, training reaches the prediction
head, the Hub's sparse configs read as transformers fills them in, and what redline cannot compute is refused by
name. Import, export and PEFT parity with transformers run in the shared tables (tests/interop_models.py
"modernbert-decoder", test_interop.REDLINE_EXPORTS, test_lora_export.ARCHS)."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine
from redline.interop import modernbert_decoder
from redline.model import GPT, ModelConfig
from tests.engine_checks import assert_decode_batch_parks_rows, assert_freed_row_refills
from tests.test_diffllama import assert_engine_decodes_as_full_recompute
from tests.test_latent_attention import sharp

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

MODERNBERT = ModelConfig(vocab_size=96, context_len=64, n_layer=3, n_embd=48, n_head=4, mlp_hidden=64,
                         norm="layernorm", mlp="geglu", gelu_approximate="none", embed_norm=True,
                         first_norm_free=True, head_transform=True, head_bias=True, sliding_window=4,
                         window_layers=(1, 2), rope_local_theta=500.0)


@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_as_full_recompute(chunk):
    assert_engine_decodes_as_full_recompute(sharp(MODERNBERT), chunk)


def test_decode_batch_rows_and_spans():
    model = sharp(MODERNBERT)
    assert_freed_row_refills(assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model), model)


def test_layers_and_head_as_modernbert_computes_them():
    """Layer 0 holds no attention norm; the logits are the head's of norm(gelu(dense(final norm))), chunked loss
    included; training reaches the prediction head."""
    torch.manual_seed(0)
    model = GPT(MODERNBERT).train()
    assert isinstance(model.blocks[0].norm1, torch.nn.Identity) and isinstance(model.blocks[1].norm1,
                                                                                torch.nn.LayerNorm)
    idx = torch.randint(0, 96, (2, 12))
    final = []
    hook = model.norm_f.register_forward_hook(lambda module, args, out: final.append(out))
    with torch.no_grad():
        logits = model(idx)
    hook.remove()
    head = model.head_transform
    expected = model.lm_head(head.norm(torch.nn.functional.gelu(head.dense(final[0]))))[..., :96]
    with torch.no_grad():
        torch.testing.assert_close(logits, expected)
        chunked = GPT(replace(MODERNBERT, ce_chunk_tokens=5))
        chunked.load_state_dict(model.state_dict())
        torch.testing.assert_close(chunked(idx, idx), model(idx, idx))
    model(idx, idx).backward()
    for p in (head.dense.weight, head.norm.weight, model.embed_norm.weight, model.lm_head.bias):
        assert p.grad is not None and p.grad.abs().sum() > 0


HUB = {"model_type": "modernbert-decoder", "vocab_size": 50368, "hidden_size": 384, "intermediate_size": 576,
       "num_hidden_layers": 7, "num_attention_heads": 6, "max_position_embeddings": 7999, "norm_eps": 1e-5,
       "hidden_activation": "gelu", "global_attn_every_n_layers": 3, "local_attention": 128,
       "global_rope_theta": 160000.0, "local_rope_theta": 160000.0, "tie_word_embeddings": True}


def test_reads_the_hubs_config_as_transformers_fills_it_in():
    """Ettin's configs give global_attn_every_n_layers, local_attention and the two RoPE bases, not layer_types or
    rope_parameters: layers 0, 3, 6 global, the others within local_attention // 2."""
    cfg = modernbert_decoder.model_config(HUB)
    assert (cfg.window_layers, cfg.sliding_window, cfg.rope_theta, cfg.rope_local_theta) == ((1, 2, 4, 5), 64,
                                                                                            160000.0, 0.0)
    assert (cfg.head_transform, cfg.first_norm_free, cfg.embed_norm, cfg.head_bias, cfg.gelu_approximate,
            cfg.norm_bias, cfg.tie_embeddings) == (True, True, True, True, "none", False, True)
    local = modernbert_decoder.model_config({**HUB, "local_rope_theta": 10000.0})
    assert local.rope_local_theta == 10000.0


@pytest.mark.parametrize("overrides, fragment", [
    (dict(hidden_activation="silu"), "hidden_activation='silu'"),
    (dict(classifier_activation="gelu_pytorch_tanh"), "classifier_activation='gelu_pytorch_tanh'"),
    (dict(attention_bias=True), "attention_bias=True with mlp_bias=False"),
    (dict(classifier_bias=True), "classifier_bias=True with mlp_bias=False"),
    (dict(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0}}), "rope_type='linear'"),
    (dict(local_attention=None), "local_attention=None"),
])
def test_refuses_what_it_cannot_compute(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        modernbert_decoder.model_config({**HUB, **overrides})


def test_refusals():
    from redline.inference.kernels.fused_block import unsupported
    from redline.interop.families import export_family

    with pytest.raises(UserError, match="model.head_transform takes a GELU MLP"):
        replace(MODERNBERT, mlp="swiglu").validate()
    with pytest.raises(UserError, match="model.first_norm_free sequential pre-norm blocks"):
        replace(MODERNBERT, norm_position="sandwich").validate()
    with pytest.raises(UserError, match="ModernBERT-Decoder.*has all three of them"):
        export_family(replace(MODERNBERT, first_norm_free=False))
    with pytest.raises(UserError, match="ModernBERT-Decoder.*multi-head attention"):
        export_family(replace(MODERNBERT, n_kv_head=2))
    assert export_family(MODERNBERT).architecture == "ModernBertDecoderForCausalLM"
    assert "model.head_transform" in unsupported(MODERNBERT)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and the prediction head's gradients match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    model = sharp(replace(MODERNBERT, n_embd=128, vocab_size=512, context_len=128)).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.head_transform.dense.weight)


@pytest.mark.slow  # `redline train` end to end: the engine and gradient tests above run always
def test_train_init_from_the_import_starts_at_transformers_loss(tmp_path, capsys):
    """`redline train --init-from` an imported ModernBERT-Decoder: the first step's loss is transformers' on that
    batch (tests/test_interop_commands.py), and training moves the prediction head and the embeddings' norm."""
    from tests.test_interop_commands import Imported, trained_two_steps

    before, after = trained_two_steps(Imported("modernbert-decoder", tmp_path / "import"), tmp_path, capsys)
    for name in ("head_transform.dense.weight", "head_transform.norm.weight", "embed_norm.weight"):
        assert not torch.equal(before.state_dict()[name], after.state_dict()[name]), name
