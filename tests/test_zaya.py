"""ZAYA beyond the shared tables (tests/test_interop.py: import, engine, export, GGUF refusal, its redline exports;
tests/test_lora_export.py: PEFT): training gradients against transformers' ZayaForCausalLM, the engine's chunked
prefill, DecodeBatch and scores over the cached convolution inputs, `redline train --init-from` an import, the
options redline cannot express refused by name at import, export, config validation and the inference plan."""

from __future__ import annotations

import json

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.model import GPT, ModelConfig
from tests.engine_checks import assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward
from tests.interop_models import hf_folder
from tests.test_interop import imported, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
transformers = pytest.importorskip("transformers")

_ZAYA = dict(vocab_size=64, context_len=48, n_layer=3, n_embd=32, n_head=4, n_kv_head=2, fused_qkv=False,
             cca_kernels=(2, 3), residual_affine=True, moe_experts=3, moe_top_k=1, moe_norm_topk=False,
             moe_router_hidden=16, mlp="swiglu", mlp_hidden=32, rope_dims=4)
PROMPTS = [list(range(3, 14)), [7, 1, 8], list(range(40, 52)), [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]


def test_training_gradients_equal_transformers(tmp_path, capsys):
    """The loss and the gradients of the convolutions, the key scales, the value projections, the router (its state
    scale carried from the layer before) and the residual scales equal transformers'; every gradient is finite."""
    hf, model, _, _ = imported("zaya", tmp_path, capsys)
    hf.train(), model.train()
    tokens = torch.randint(0, 320, (2, 13), generator=torch.Generator().manual_seed(3))
    theirs = hf(tokens, labels=tokens).loss
    ours = model(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    theirs.backward()
    ours.backward()
    for i in (0, 2):
        layer, block = hf.model.layers[i], model.blocks[i]
        cca, gate = layer.self_attn.qkv_proj, layer.mlp.gate
        pairs = [(block.attn.qk_conv, cca.conv_qk_depthwise.weight),
                 (block.attn.qk_head_conv, cca.conv_qk_grouped.weight),
                 (block.attn.key_scale, layer.self_attn.qk_norm.temp), (block.attn.v.weight, cca.v_proj_current.weight),
                 (block.attn.v_delayed.weight, cca.v_proj_delayed.weight),
                 (block.mlp.router.weight, gate.down_proj.weight),
                 (block.mlp.router_out.weight, gate.router_mlp.out_proj.weight),
                 (block.mlp.fc, layer.mlp.experts.gate_up_proj),
                 (block.attn_affine.h_scale, layer.post_attention_residual_scale.hidden_states_scale),
                 (block.mlp_affine.x_bias, layer.post_mlp_residual_scale.residual_bias)]
        if i:
            pairs.append((block.mlp.state_scale, gate.router_states_scale))
        for ours_p, theirs_p in pairs:
            torch.testing.assert_close(ours_p.grad, theirs_p.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(model.embed_gain.grad, hf.model.input_hidden_states_scale.grad, rtol=1e-4, atol=1e-6)
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


@pytest.mark.parametrize("chunk", [32768, 4, 1])
def test_engine_prefills_in_chunks_as_full_recompute(chunk, tmp_path, capsys):
    """Prompts of different lengths in one batch, prefilled whole or in chunks (each chunk's convolutions and
    delayed values reading the cached raw inputs of the slots before it), then decoded, as the model's own
    generate; the cache holds each token's keys, values and raw inputs ((H + KV)·D + KV·D/2) a layer."""
    _, model, _, _ = imported("zaya-window", tmp_path, capsys)
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=chunk)
    got = [r.tokens for r in engine.generate(PROMPTS, 10, SamplingParams(temperature=0))]
    assert got == [model.generate(torch.tensor([p]), 10, temperature=0)[0, len(p):].tolist() for p in PROMPTS]
    assert engine.kv_bytes_per_token() == 3 * (2 * 1 * 16 + (4 + 1) * 16 + 8) * 4  # fp32


def test_decode_batch_and_scores_through_the_engine(tmp_path, capsys):
    """The server's DecodeBatch (prefill in spans of 5, prefill_many, rows freed and refilled) decodes as the
    model's own generate; the engine's teacher-forced scores equal the full forward's."""
    _, model, _, _ = imported("zaya", tmp_path, capsys)
    assert_decode_batch_serves_like_generate(model, PROMPTS)
    assert_scores_equal_full_forward(model.float(), 320)


@pytest.mark.slow  # `redline train` end to end: the engine and gradient tests above run always
def test_train_init_from_resumes_and_exports(tmp_path, capsys):
    """`redline train --init-from` an imported ZAYA: the first step's loss is transformers', --resume goes on, and
    the trained run exports back with its logits (the check tests/test_interop_commands.py runs on a Llama)."""
    from tests.test_interop_commands import check_train_init_from

    check_train_init_from("zaya", tmp_path, capsys)


@pytest.mark.parametrize("change, fragment", [
    (dict(attention_bias=True), "attention_bias=true"),
    (dict(lm_head_bias=True), "lm_head_bias=true"),
    (dict(num_experts_per_tok=2), "num_experts_per_tok=2"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(rope_parameters={"hybrid": {"rope_type": "linear", "rope_theta": 100.0, "factor": 2.0}}),
     "rope_parameters.hybrid.rope_type='linear'"),
    (dict(layer_types=["hybrid", "mamba", "hybrid"]), "layer_types"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 100.0}), "name no layer type"),
    (dict(layer_types=["hybrid", "hybrid_sliding", "hybrid"], sliding_window=5,
          rope_parameters={"hybrid": {"rope_type": "default", "rope_theta": 100.0}}),
     "no entry for layer type hybrid_sliding"),
])
def test_import_refuses_what_redline_cannot_express(change, fragment, tmp_path, capsys):
    hf_folder("zaya", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **change}))
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("overrides, fragment", [
    (dict(residual_affine=False), "has all three"),
    (dict(cca_kernels=()), "has all three"),
    (dict(norm_unit_offset=True), "RMSNorms with weights"),
    (dict(rope_scaling="linear", rope_factor=2.0), "unscaled base"),
    (dict(logit_softcap=5.0), "no score scale or caps"),
])
def test_export_refuses_what_zaya_has_not(overrides, fragment):
    from redline.interop.families import export_family

    with pytest.raises(UserError, match=fragment):
        export_family(ModelConfig(**{**_ZAYA, **overrides}))


@pytest.mark.parametrize("overrides, fragment", [
    (dict(cca_kernels=(2,)), "model.cca_kernels takes two kernel widths"),
    (dict(cca_kernels=(0, 2)), "model.cca_kernels takes two kernel widths"),
    (dict(qk_norm=True), "model.cca_kernels \\(ZAYA's attention\\) takes separate unbiased"),
    (dict(fused_qkv=True), "model.cca_kernels \\(ZAYA's attention\\) takes separate unbiased"),
    (dict(kv_conv=2), "model.cca_kernels \\(ZAYA's attention\\) takes separate unbiased"),
    (dict(moe_swiglu_limit=5.0), "takes unclamped gated experts"),
    (dict(norm_position="sandwich"), "model.residual_affine and model.moe_router_hidden are ZAYA's"),
    (dict(moe_top_k=2), "moe_top_k 1"),
    (dict(moe_norm_topk=True), "moe_top_k 1"),
    (dict(moe_experts=0), "moe_top_k 1"),
])
def test_config_validation_names_the_field(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        ModelConfig(**{**_ZAYA, **overrides}).validate()


def test_plan_refuses_fp8_and_triton_attention_by_name():
    """The cache keeps the raw inputs unquantized (no FP8 cache) and the decode kernel reads no convolutions;
    packed documents are refused in training (the convolutions would mix them)."""
    from redline.inference.plan import _triton_attention_unsupported, plan_decode

    cfg = ModelConfig(**_ZAYA)
    with pytest.raises(UserError, match="kv_cache_dtype=fp8 with ZAYA's convolutional attention"):
        plan_decode(cfg, torch.device("cpu"), kv_cache_dtype="fp8")
    reason = _triton_attention_unsupported(cfg, torch.device("cuda"), torch.bfloat16)
    assert reason.startswith("decode_attention triton has no convolutional attention (model.cca_kernels")
    model = GPT(cfg)
    tokens = torch.randint(0, 64, (1, 8))
    with pytest.raises(UserError, match="packed documents \\(doc_ids\\) with ZAYA's convolutional attention"):
        model(tokens, tokens, doc_ids=torch.zeros(1, 8, dtype=torch.long))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py),
    the convolutions' inputs cached per slot; the compiled training step's loss and gradients match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = ModelConfig(**{**_ZAYA, "vocab_size": 512, "context_len": 128, "n_embd": 128, "n_head": 8, "n_layer": 4,
                         "rope_dims": 8, "sliding_window": 16, "window_layers": (1,), "rope_local_theta": 100.0})
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(3, 40)), [5, 9, 2], list(range(100, 160))])
    assert_compiled_training_step_matches(model, model.blocks[1].attn.qk_conv)
