"""Gemma 3n's layers (model.altup_streams, altup_correct_scale, altup_coef_clip, laurel_rank, mlp_sparsity, beside
Gemma 4's per-layer inputs and shared keys and values): the inference engine (prefill whole or in chunks, decode, the
server's DecodeBatch, teacher-forced scores) against full recompute, the Gaussian top-k, training gradients and the
coefficient clamp, the refusals; a gemma3n multimodal folder's text model against Gemma3nForCausalLM.
Parity of the text model with transformers' Gemma3nForCausalLM is in tests/test_interop.py (the FAMILIES table:
"gemma3n"), its PEFT adapters in tests/test_lora_export.py."""

import json
from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.model import GPT, ModelConfig, gaussian_top_k, normal_quantile
from tests.engine_checks import assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# five layers: windowed 0, 1, 3 (window 4), full 2 and 4; layers 3 and 4 read layers 1's and 2's keys and values;
# three AltUp streams, LAuReL of rank 4, per-layer inputs of width 8, the first two layers' MLP gates sparse
CFG = ModelConfig(vocab_size=96, context_len=64, n_layer=5, n_embd=32, n_head=4, n_kv_head=2, head_size=8,
                  v_norm=True, qk_norm=True, fused_qkv=False, sliding_window=4, window_layers=(0, 1, 3),
                  rope_theta=5000.0, rope_local_theta=100.0, attn_scale=1.0, mlp="geglu", mlp_hidden=48,
                  norm_position="sandwich", embed_scale=True, tie_embeddings=True, kv_shared_layers=2,
                  per_layer_embd=8, logit_softcap=5.0, altup_streams=3, altup_coef_clip=0.5, laurel_rank=4,
                  mlp_sparsity=(0.95, 0.5, 0.0, 0.0, 0.0))
PROMPTS = [list(range(1, 12)), [5, 6], [40], list(range(20, 37))]


def gemma3n_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    model = GPT(replace(CFG, **overrides))
    with torch.no_grad():  # norms and AltUp's output scale off their initial values, so each matters
        for name, t in model.state_dict().items():
            if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "altup_scale")) or "out_norm" in name:
                t.add_(torch.randn_like(t) * 0.2)
    return model.eval()


def test_layers_are_as_configured():
    model = gemma3n_model()
    assert [b.attn.kv_source for b in model.blocks] == [None, None, None, 1, 2]
    assert len(model.altup_in) == len(model.altup_out) == 2
    block = model.blocks[0]
    assert block.altup_predict.weight.shape == (9, 3) and block.altup_correct.weight.shape == (3, 3)
    assert block.altup_router.weight.shape == (3, 32) and block.laurel_left.weight.shape == (4, 32)
    assert [b.mlp.std_multiplier is not None for b in model.blocks] == [True, True, False, False, False]
    assert model.blocks[0].mlp.std_multiplier == pytest.approx(1.6448536, abs=1e-6)  # Φ⁻¹(0.95)


def test_gaussian_top_k_keeps_the_tail_past_the_quantile():
    """On Gaussian gates, about 1 - s of the units stay, each less the cutoff mean + Φ⁻¹(s)·std."""
    g = torch.randn(4, 20000, generator=torch.Generator().manual_seed(0)) * 2.0 + 0.5
    for s in (0.95, 0.5):
        out = gaussian_top_k(g, normal_quantile(s))
        kept = (out > 0).float().mean().item()
        assert abs(kept - (1 - s)) < 0.01, (s, kept)
        cutoff = g.mean(-1, keepdim=True) + g.std(-1, keepdim=True, unbiased=False) * normal_quantile(s)
        torch.testing.assert_close(out, (g - cutoff).clamp(min=0))


@pytest.mark.parametrize("chunk", [32768, 5, 1])
def test_engine_decodes_as_full_recompute(chunk):
    """Prompts of different lengths in one batch, prefilled whole or in chunks (the AltUp streams widened and
    collapsed around each span's blocks), then decoded, the shared layers reading their source's slots."""
    model = gemma3n_model()
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=chunk)
    got = [r.tokens for r in engine.generate(PROMPTS, 12, SamplingParams(temperature=0))]
    expected = [model.generate(torch.tensor([p]), 12, temperature=0)[0, len(p):].tolist() for p in PROMPTS]
    assert got == expected
    assert engine.kv_bytes_per_token() == 3 * 2 * 2 * 8 * 4  # fp32, three layers hold keys and values


def test_teacher_forced_log_probabilities_equal_the_full_forward():
    assert_scores_equal_full_forward(gemma3n_model(), CFG.vocab_size)


def test_decode_batch_greedy_equals_generate():
    """The server's DecodeBatch: one row prefilled whole, one in spans, two together with prefill_many, rows freed
    and refilled while the others decode."""
    assert_decode_batch_serves_like_generate(gemma3n_model(), PROMPTS)


def test_training_gradients_reach_every_parameter_and_the_clip_holds():
    """The forward is differentiable through the AltUp streams, LAuReL, the sparse gates and the per-layer inputs:
    every parameter gets a gradient. In training the prediction coefficients' weights are clamped in place to
    ± altup_coef_clip (as transformers does) and the correction ones in the forward (their stored values kept)."""
    model = gemma3n_model()
    with torch.no_grad():
        for block in model.blocks:
            block.altup_predict.weight.normal_(0, 1.0)
            block.altup_correct.weight.normal_(0, 1.0)
    correct = model.blocks[0].altup_correct.weight.detach().clone()
    eval_logits = model(torch.tensor([PROMPTS[0]]))
    model.train()
    idx = torch.randint(0, CFG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(2))
    model(idx, idx).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing
    assert all(b.altup_predict.weight.abs().max() <= 0.5 for b in model.blocks)
    assert torch.equal(model.blocks[0].altup_correct.weight, correct) and correct.abs().max() > 0.5
    # a correction weight past the clip takes no gradient (clamped in the forward)
    past = correct.abs() > 0.5
    assert (model.blocks[0].altup_correct.weight.grad[past] == 0).all()
    assert (model.blocks[0].altup_correct.weight.grad[~past] != 0).any()
    with torch.no_grad():
        assert (model.eval()(torch.tensor([PROMPTS[0]])) - eval_logits).abs().max() > 1e-4  # the clamp stuck


@pytest.mark.parametrize("overrides, fragment", [
    (dict(laurel_rank=4, altup_streams=0), "model.laurel_rank: the LAuReL branch"),
    (dict(norm_position="pre"), "model.altup_streams"),
    (dict(layer_lambdas=True), "model.altup_streams"),
    (dict(altup_streams=-1), "must be >= 0"),
    (dict(mlp_sparsity=(0.5,)), "model.mlp_sparsity needs one value"),
    (dict(mlp_sparsity=(1.0, 0.0, 0.0, 0.0, 0.0)), "model.mlp_sparsity needs one value"),
    (dict(mlp="gelu"), "model.mlp_sparsity needs"),
])
def test_refusals(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        replace(CFG, **overrides).validate()


def test_engine_refusals():
    model = gemma3n_model()
    with pytest.raises(UserError, match="kv_cache_dtype=fp8 with model.v_norm"):
        InferenceEngine(model, compile=False, kv_cache_dtype="fp8")
    from redline.inference.plan import layerwise_attention

    assert layerwise_attention(ModelConfig(mlp="geglu", mlp_sparsity=(0.5,) * 12)) == "model.mlp_sparsity"


@pytest.mark.parametrize("overrides, fragment", [
    ({}, None),
    (dict(logit_softcap=0.0), "model.logit_softcap"),
    (dict(altup_coef_clip=0.0), "altup_coef_clip"),
    (dict(laurel_rank=0), "laurel_rank"),
    (dict(per_layer_embd=0), "model.per_layer_embd"),
    (dict(mlp="swiglu"), "model.mlp=swiglu: Gemma 3n's MLP is tanh GeGLU"),
    (dict(rope_scaling="linear", rope_factor=2.0), "model.rope_scaling=linear"),
    (dict(norm_unit_offset=True), "no norm_unit_offset"),
    (dict(attn_scale=0.5), "attn_scale=1"),
    (dict(kv_shared_mlp_hidden=96), "kv_shared_mlp_hidden"),
])
def test_export_takes_gemma3ns_options_and_refuses_what_it_has_not(overrides, fragment):
    from redline.interop.families import export_family

    cfg = replace(CFG, **overrides)
    if fragment is None:
        assert export_family(cfg).architecture == "Gemma3nForCausalLM"
    else:
        with pytest.raises(UserError, match=fragment):
            export_family(cfg).hf_config(cfg)


def _hf_text_config(**overrides) -> dict:
    base = dict(model_type="gemma3n_text", vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=5,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, laurel_rank=4,
                hidden_size_per_layer_input=8, num_kv_shared_layers=2)
    return {**base, **overrides}


@pytest.mark.parametrize("overrides, fragment", [
    (dict(altup_active_idx=1), "altup_active_idx=1"),
    (dict(attention_bias=True), "attention_bias=True"),
    (dict(hidden_activation="gelu"), "hidden_activation='gelu'"),
    (dict(laurel_rank=0), "laurel_rank=0"),
    (dict(hidden_size_per_layer_input=0), "hidden_size_per_layer_input=0"),
    (dict(intermediate_size=[48, 48, 64, 48, 48]), r"intermediate_size=\[48, 48, 64"),
    (dict(activation_sparsity_pattern=[0.95]), "activation_sparsity_pattern"),
    (dict(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0}}), "RoPE 'linear'"),
    (dict(layer_types=["sliding_attention"] * 4), "layer_types must name"),
])
def test_import_refuses_what_redline_cannot_express(overrides, fragment):
    from redline.interop import gemma3n

    with pytest.raises(UserError, match=fragment):
        gemma3n.model_config(_hf_text_config(**overrides))


def test_import_reads_transformers_defaults():
    """A config at Gemma3nTextConfig's defaults where it leaves them out: four sliding layers to one full, the
    first ten layers' gates sparse at 0.95, the bases 1e6 and 1e4, the published models' clip and cap."""
    from redline.interop import gemma3n

    cfg = gemma3n.model_config(_hf_text_config(num_hidden_layers=12, num_kv_shared_layers=5))
    assert cfg.window_layers == (0, 1, 2, 3, 5, 6, 7, 8, 10, 11) and cfg.sliding_window == 512
    assert cfg.mlp_sparsity == (0.95,) * 10 + (0.0,) * 2 and cfg.altup_streams == 4
    assert (cfg.rope_theta, cfg.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert (cfg.altup_coef_clip, cfg.logit_softcap, cfg.per_layer_vocab) == (120.0, 30.0, 262_144)
    assert gemma3n.model_config(_hf_text_config(num_hidden_layers=5)).mlp_sparsity == ()  # 10 layers or fewer


def test_import_reads_the_hubs_config():
    """gemma-3n-E2B's config.json as the Hub holds it (small): the RoPE bases as rope_theta and rope_local_base_freq,
    intermediate_size a list, query_pre_attn_scalar (which transformers' Gemma 3n does not read: its scores are
    unscaled) and altup_lr_multiplier (a training hint) beside the rest."""
    from redline.interop import gemma3n

    kinds = ["sliding_attention"] * 4 + ["full_attention"]
    cfg = gemma3n.model_config(_hf_text_config(
        num_hidden_layers=10, layer_types=kinds * 2, intermediate_size=[48] * 10, rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0, rope_scaling=None, query_pre_attn_scalar=256, altup_lr_multiplier=1.0,
        activation_sparsity_pattern=[0.95] * 3 + [0.0] * 7, num_kv_shared_layers=4, vocab_size_per_layer_input=90))
    assert (cfg.mlp_hidden, cfg.attn_scale, cfg.rope_theta, cfg.rope_local_theta) == (48, 1.0, 1e6, 1e4)
    assert cfg.window_layers == (0, 1, 2, 3, 5, 6, 7, 8) and cfg.mlp_sparsity == (0.95,) * 3 + (0.0,) * 7
    assert [cfg.kv_source(i) for i in range(6, 10)] == [5, 5, 5, 4] and cfg.per_layer_vocab == 90


def test_multimodal_folder_imports_its_text_model(tmp_path, capsys):
    """A Gemma3nForConditionalGeneration folder (text_config nested in config.json, the text model under
    model.language_model., vision and audio towers and embedders beside it, left unread): the imported model's
    logits are the text model's. (transformers' vision tower needs timm: the folder is written as
    save_pretrained lays it out, the towers standing in as one tensor each.)"""
    import transformers
    from safetensors.torch import save_file

    from redline import cli
    from redline.training.checkpoint import load_for_inference
    from tests.interop_models import byte_level_tokenizer, hf_model

    text = hf_model("gemma3n")
    (tmp_path / "hf").mkdir()
    weights = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v.contiguous()
               for k, v in text.state_dict().items() if k != "lm_head.weight"}
    for tower in ("vision_tower.timm_model.conv_stem.conv.weight", "audio_tower.conformer.0.norm.weight",
                  "embed_vision.embedding.weight", "embed_audio.embedding.weight"):
        weights["model." + tower] = torch.zeros(4, 4)
    save_file(weights, str(tmp_path / "hf" / "model.safetensors"))
    text_config = {**text.config.to_dict(), "model_type": "gemma3n_text"}
    config = {"model_type": "gemma3n", "architectures": ["Gemma3nForConditionalGeneration"],
              "text_config": text_config, "vision_config": {"model_type": "gemma3n_vision"},
              "audio_config": {"model_type": "gemma3n_audio"}, "eos_token_id": [1, 2]}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    byte_level_tokenizer(tmp_path / "hf")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")])
    err = capsys.readouterr().err
    assert exc.value.code == 0, err
    assert "a multimodal gemma3n folder; its text model is read, the 4 tensors outside it" in err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    tokens = torch.randint(0, 320, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), text(tokens).logits, rtol=1e-5, atol=1e-5)
    assert isinstance(text, transformers.Gemma3nForCausalLM)


@pytest.mark.slow  # a training run: about 15 s on 2 CPU cores
def test_train_init_from_an_imported_gemma3n_trains_its_altup_and_laurel(tmp_path, capsys):
    """`redline train --init-from` on an imported Gemma 3n: the first step's loss is transformers' on the same batch,
    and training moves the AltUp coefficients, stream projections and output scales and the LAuReL branches."""
    from tests.test_interop_commands import Imported, trained_two_steps

    before, after = trained_two_steps(Imported("gemma3n", tmp_path / "src"), tmp_path, capsys)
    old, new = before.state_dict(), after.state_dict()
    for name in ("blocks.0.altup_predict.weight", "blocks.0.altup_correct.weight", "blocks.0.altup_scale",
                 "blocks.0.laurel_left.weight", "altup_in.0.weight", "altup_out.2.weight", "blocks.0.mlp.fc.weight"):
        assert not torch.equal(old[name], new[name]), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily as the eager one does (tests/engine_checks.py),
    the AltUp streams between its compiled blocks; the compiled training step (the prediction coefficients clamped in
    place inside it) gives eager's loss and gradients."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = replace(CFG, n_embd=128, vocab_size=512, context_len=128)
    model = GPT(cfg).cuda()
    with torch.no_grad():
        for block in model.blocks:  # some prediction weights past the clip, so that the clamp acts
            block.altup_predict.weight.normal_(0, 1.0)
            block.altup_scale.normal_(0, 1.0)
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[1].laurel_left.weight, length=64)
    assert all(b.altup_predict.weight.abs().max() <= cfg.altup_coef_clip for b in model.blocks)
