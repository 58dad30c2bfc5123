"""Gemma 4's layers (model.global_head_size, global_kv_head, global_values_from_keys, v_norm, kv_shared_layers,
kv_shared_mlp_hidden, per_layer_embd, layer_scalars): the inference engine (prefill whole or in chunks, decode, the
server's DecodeBatch, teacher-forced scores) against full recompute, the shared layers reading their source's cache,
training gradients, the refusals; a gemma4 multimodal folder's text model against Gemma4ForConditionalGeneration.
Parity of the text model with transformers' Gemma4ForCausalLM is in tests/test_interop.py (the FAMILIES table:
"gemma4", "gemma4-k-eq-v")."""

import json
from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.model import GPT, ModelConfig
from tests.engine_checks import assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# five layers: windowed 0, 2, 3 (window 4), full 1 and 4 with heads of their own (width 24, one KV head, values
# from the keys); layers 3 and 4 read layers 2's and 1's keys and values with MLPs twice as wide; per-layer inputs
CFG = ModelConfig(vocab_size=96, context_len=64, n_layer=5, n_embd=32, n_head=4, n_kv_head=2, head_size=8,
                  global_head_size=24, global_kv_head=1, global_values_from_keys=True, v_norm=True, qk_norm=True,
                  fused_qkv=False, sliding_window=4, window_layers=(0, 2, 3), rope_theta=5000.0,
                  rope_scaling="proportional", rope_proportion=0.25, rope_local_theta=100.0, attn_scale=1.0,
                  mlp="geglu", mlp_hidden=48, norm_position="sandwich", embed_scale=True, tie_embeddings=True,
                  kv_shared_layers=2, kv_shared_mlp_hidden=96, per_layer_embd=8, layer_scalars=True,
                  logit_softcap=5.0)
PROMPTS = [list(range(1, 12)), [5, 6], [40], list(range(20, 37))]
# Gemma 4's MoE block: each layer's top 2 of 4 experts (16 wide) beside its dense MLP (48 wide)
EXPERTS = dict(moe_beside_dense=True, moe_experts=4, moe_top_k=2, mlp_hidden=16, moe_dense_hidden=48)


def gemma4_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    model = GPT(replace(CFG, **overrides))
    with torch.no_grad():  # norms and scalars off their initial ones, so each matters
        for name, t in model.state_dict().items():
            if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "layer_scalar")) or "out_norm" in name:
                t.add_(torch.randn_like(t) * 0.2)
    return model.eval()


def test_layers_are_as_configured():
    model = gemma4_model()
    attn = [b.attn for b in model.blocks]
    assert [a.kv_source for a in attn] == [None, None, None, 2, 1]
    assert [(a.n_kv, a.head_dim) for a in attn] == [(2, 8), (1, 24), (2, 8), (2, 8), (1, 24)]
    assert attn[1].v is None and attn[0].v is not None and attn[3].k is None and attn[3].k_norm is None
    assert [b.mlp.proj.in_features for b in model.blocks] == [48, 48, 48, 96, 96]
    assert "blocks.0.layer_scalar" in model.state_dict() and not any("layer_scalar" in n
                                                                      for n, _ in model.named_parameters())
    # the full layers' table: 12 of their 24 dimensions' pairs, a quarter (3) of them turning
    assert model.rope_cos.shape[-1] == 12 and model.rope_cos_1.shape[-1] == 4
    assert (model.rope_sin[:, 3:] == 0).all() and (model.rope_sin[1:, :3] != 0).all()


@pytest.mark.parametrize("chunk, experts", [(32768, False), (5, False), (1, False), (5, True)])
def test_engine_decodes_as_full_recompute(chunk, experts):
    """Prompts of different lengths in one batch, prefilled whole or in chunks (a shared layer reading its source's
    slots written by the chunk before), then decoded (the shared layers reading the step's key and value their
    source wrote); with experts beside the dense MLPs too."""
    model = gemma4_model(**(EXPERTS if experts else {}))
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=chunk)
    got = [r.tokens for r in engine.generate(PROMPTS, 12, SamplingParams(temperature=0))]
    expected = [model.generate(torch.tensor([p]), 12, temperature=0)[0, len(p):].tolist() for p in PROMPTS]
    assert got == expected
    # fp32, three layers hold keys and values: two windowed (2 heads of 8), one full (1 head of 24)
    assert engine.kv_bytes_per_token() == 2 * (2 * 2 * 8 + 1 * 24) * 4
    assert len(engine._state.cache.stacked) == 4  # the two geometries' k and v buffers; none for shared layers


def test_teacher_forced_log_probabilities_equal_the_full_forward():
    assert_scores_equal_full_forward(gemma4_model(), CFG.vocab_size)


def test_decode_batch_greedy_equals_generate():
    """The server's DecodeBatch: one row prefilled whole, one in spans, two together with prefill_many, rows freed
    and refilled while the others decode."""
    assert_decode_batch_serves_like_generate(gemma4_model(), PROMPTS)


def test_shared_layers_read_their_sources_keys_and_values():
    """New keys and values in a source layer (its k projection redrawn) change what its shared layer reads, in the
    engine as in the forward."""
    model = gemma4_model()
    tokens = torch.tensor([PROMPTS[3]])
    with torch.no_grad():
        before = model(tokens)
        model.blocks[1].attn.k.weight.normal_(0, 0.1)  # layer 4's source (full layers 1 and 4)
        after = model(tokens)
    assert (after - before).abs().max() > 1e-3
    engine = InferenceEngine(model, compile=False)
    got = engine.generate([PROMPTS[3]], 6, SamplingParams(temperature=0))[0].tokens
    assert got == model.generate(tokens, 6, temperature=0)[0, len(PROMPTS[3]):].tolist()


@pytest.mark.parametrize("experts", [False, True])
def test_training_gradients_reach_every_parameter(experts):
    """The forward is differentiable through the shared keys and values, the per-layer inputs and the experts beside
    the MLPs: every parameter gets a gradient (the shared layers' sources' k from the shared layers' queries too), the
    layer scalars none."""
    model = gemma4_model(**(EXPERTS if experts else {})).train()
    idx = torch.randint(0, CFG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(2))
    loss = model(idx, idx)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing
    # the source's keys feed the shared layer: its gradient with the shared layer's output cut off differs
    grad = model.blocks[1].attn.k.weight.grad.clone()
    model.zero_grad()
    model.blocks[4].attn.q.weight.data.zero_()
    model(idx, idx).backward()
    assert (model.blocks[1].attn.k.weight.grad - grad).abs().max() > 1e-6


@pytest.mark.parametrize("overrides, fragment", [
    (dict(global_head_size=24, rope_local_theta=0.0), "model.global_head_size=24 needs"),
    (dict(sliding_window=0, window_layers=(), rope_local_theta=0.0), "model.global_head_size=24 needs"),
    (dict(global_kv_head=3), "model.global_kv_head=3"),
    (dict(fused_qkv=True), "model.fused_qkv=false"),
    (dict(kv_shared_layers=4), "model.kv_shared_layers=4"),
    (dict(kv_shared_layers=0), "model.kv_shared_mlp_hidden sets"),
    (dict(per_layer_embd=0, per_layer_vocab=90), "model.per_layer_vocab sizes"),
    (dict(value_embeddings=1), "no value embeddings"),
    (dict(qk_norm_after_rope=True), "model.kv_shared_layers takes per-head QK-norm"),
    (dict(moe_experts=4, moe_top_k=2), "model.per_layer_embd and kv_shared_mlp_hidden take dense MLPs"),
    ({**EXPERTS, "moe_dense_hidden": None}, "model.moe_beside_dense"),
    ({**EXPERTS, "moe_shared_hidden": 16}, "model.moe_beside_dense"),
    ({**EXPERTS, "norm_position": "pre"}, "model.moe_beside_dense"),
])
def test_refusals(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        replace(CFG, **overrides).validate()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("experts", [False, True])
def test_gpu_compiled_engine_and_training_step(experts):
    """On a GPU: the compiled, graph-captured engine decodes greedily as the eager one does (tests/engine_checks.py),
    the shared layers reading their source's buffers inside the captured step; the compiled training step's loss and
    gradients (a source layer's keys included) match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = replace(CFG, n_embd=128, vocab_size=512, context_len=128, **(EXPERTS if experts else {}))
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    # the keys weight's bf16 gradient takes many paths (values normed, shared layers' reads, the full layers' values
    # from keys): eager and compiled bf16 differ by 10-22%, so both are held to the fp32 gradient
    assert_compiled_training_step_matches(model, model.blocks[1].attn.k.weight, length=64)


def test_engine_refusals():
    model = gemma4_model()
    with pytest.raises(UserError, match="kv_cache_dtype=fp8 with model.global_head_size"):
        InferenceEngine(model, compile=False, kv_cache_dtype="fp8")
    with pytest.raises(UserError, match="decode_attention triton has no model.global_head_size"):
        InferenceEngine(model, compile=False, decode_attention="triton")


@pytest.mark.parametrize("overrides, fragment", [
    ({}, None), (EXPERTS, None),
    (dict(layer_scalars=False), "layer_scalars"),
    (dict(attn_scale=0.5), "attn_scale=1"),
    (dict(mlp="swiglu"), "model.mlp=swiglu: Gemma 4's MLP is tanh GeGLU"),
    (dict(kv_shared_mlp_hidden=50), "model.kv_shared_mlp_hidden=50"),
    (dict(norm_unit_offset=True), "no norm_unit_offset"),
    (dict(rope_scaling="linear", rope_proportion=1.0, rope_factor=2.0), "model.rope_scaling=linear"),
    (dict(window_layers=(0, 2, 3, 4), kv_shared_layers=1, kv_shared_mlp_hidden=0), "a windowed last layer"),
    ({**EXPERTS, "moe_norm_topk": False}, "moe_norm_topk"),
])
def test_export_takes_gemma4s_options_and_refuses_what_it_has_not(overrides, fragment):
    """Any of Gemma 4's options makes a model Gemma 4's to export; what Gemma 4 has not is named."""
    from redline.interop.families import export_family

    cfg = replace(CFG, **overrides)
    if fragment is None:
        assert export_family(cfg).architecture == "Gemma4ForCausalLM"
        return
    with pytest.raises(UserError, match=fragment):
        export_family(cfg)


transformers = pytest.importorskip("transformers")


def _hf_text_config(**overrides) -> dict:
    base = dict(model_type="gemma4_text", vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    return {**base, **overrides}


@pytest.mark.parametrize("overrides, fragment", [
    (dict(use_bidirectional_attention="all"), "use_bidirectional_attention='all'"),
    (dict(enable_moe_block=True, num_experts=4, top_k_experts=2), "enable_moe_block=True: the experts need"),
    (dict(attention_bias=True), "attention_bias=True"),
    (dict(hidden_activation="gelu"), "hidden_activation='gelu'"),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e6},
                           "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}), "RoPE 'yarn'"),
    (dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                           "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}),
     "sliding-window layers' RoPE 'linear'"),
    (dict(layer_types=["sliding_attention", "full_attention"],
          per_layer_config={"0": {"head_dim": 16}, "1": {"head_dim": 32}}), "per_layer_config="),
])
def test_import_refuses_what_redline_cannot_run(overrides, fragment):
    from redline.interop import gemma4

    with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        gemma4.model_config(_hf_text_config(**overrides))


def test_import_reads_older_configs_and_the_defaults():
    """A config without per_layer_config (as the Hub's first Gemma 4 uploads give global_head_dim and
    num_global_key_value_heads) and transformers' defaults: five sliding layers to one full, the full ones 512 wide
    with proportional RoPE on a quarter of their pairs (theta 1e6), the sliding ones at theta 1e4; bidirectional
    attention over image tokens alone ("vision") leaves the text model causal."""
    from redline.interop import gemma4

    cfg = gemma4.model_config(_hf_text_config(num_hidden_layers=7, attention_k_eq_v=True,
                                              num_global_key_value_heads=1, sliding_window=512,
                                              use_bidirectional_attention="vision"))  # text stays causal
    assert cfg.window_layers == (0, 1, 2, 3, 4) and cfg.layer_window(6) == 0  # the last forced full
    assert (cfg.global_head_size, cfg.global_kv_head, cfg.global_values_from_keys) == (512, 1, True)
    assert (cfg.rope_scaling, cfg.rope_proportion, cfg.rope_theta, cfg.rope_local_theta) == (
        "proportional", 0.25, 1e6, 1e4)
    # every layer full: their geometry is the model's
    full = gemma4.model_config(_hf_text_config(layer_types=["full_attention"] * 2, global_head_dim=16))
    assert (full.head_dim, full.global_head_size, full.sliding_window, full.rope_local_theta) == (16, 0, 0, 0.0)


def test_multimodal_folder_imports_its_text_model(tmp_path, capsys):
    """A Gemma4ForConditionalGeneration folder (text_config nested in config.json, the text model under
    model.language_model., a vision tower beside it, left unread): the imported model's logits are transformers'
    multimodal model's on text."""
    from redline import cli
    from redline.training.checkpoint import load_for_inference
    from tests.interop_models import byte_level_tokenizer, hf_model

    text = hf_model("gemma4")
    text_config = {**text.config.to_dict(), "pad_token_id": 0}
    config = transformers.Gemma4Config(
        text_config=text_config, audio_config=None,
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=8))
    hf = transformers.Gemma4ForConditionalGeneration(config).eval()
    moved = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
             for k, v in text.state_dict().items()}
    assert not hf.load_state_dict(moved, strict=False).unexpected_keys
    hf.save_pretrained(tmp_path / "hf")
    byte_level_tokenizer(tmp_path / "hf")
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert saved["model_type"] == "gemma4" and "text_config" in saved
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")])
    assert exc.value.code == 0, capsys.readouterr().err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    tokens = torch.randint(0, 320, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(input_ids=tokens).logits, rtol=1e-5, atol=1e-5)
