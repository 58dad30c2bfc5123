"""Sarvam MoE (sarvam.py: a config of its own that transformers runs as GLM-4-MoE): its config class's defaults and
the original config's names, GLM-4-MoE's in-memory names read as well as the Hub's, the export's choice between
dots.llm1, Solar Open and Sarvam MoE, and its refusals. Parity through the engine, export, PEFT and the GGUF refusal
are the shared tables' (test_interop.py, test_lora_export.py)."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.interop.families import TensorSource, _families, export_family
from redline.model import GPT
from tests.interop_models import VOCAB, hf_model
from tests.test_interop_llamalike import TOKENS, _imported, _written_as

transformers = pytest.importorskip("transformers")


def test_config_defaults_and_original_names():
    """Without rope_parameters, head_dim or the mixture's fields, SarvamMoEConfig's own (whole heads rotated at base
    8e6, QK-norm, top 6 of 128, a routed scale of 2.5); the original config's num_experts, num_shared_experts and
    use_qkv_bias as n_routed_experts, n_shared_experts and attention_bias."""
    family = _families()["sarvam_moe"]
    bare = {"model_type": "sarvam_moe", "vocab_size": VOCAB, "hidden_size": 128, "num_hidden_layers": 3,
            "num_attention_heads": 4}
    cfg = family.model_config(bare)
    reference = transformers.SarvamMoEConfig(**bare)
    assert (cfg.rope_theta, cfg.rope_dims, cfg.head_dim, cfg.kv_heads, cfg.qk_norm, cfg.norm_eps) == (
        reference.rope_parameters["rope_theta"], 0, reference.head_dim, reference.num_key_value_heads, True, 1e-6)
    assert (cfg.moe_experts, cfg.moe_top_k, cfg.moe_scale, cfg.hidden_dim, cfg.moe_shared_hidden,
            cfg.moe_dense_layers, cfg.has_qkv_bias) == (128, 6, 2.5, 1024, 1024, 1, False)
    original = {**bare, "num_experts": 8, "num_shared_experts": 2, "use_qkv_bias": True, "moe_intermediate_size": 16}
    reference = transformers.SarvamMoEConfig(**original)
    cfg = family.model_config(original)
    assert (cfg.moe_experts, cfg.moe_shared_hidden, cfg.has_qkv_bias) == (
        reference.n_routed_experts, reference.n_shared_experts * 16, reference.attention_bias) == (8, 32, True)


@pytest.mark.parametrize("kind", ["sarvam_moe", "sarvam_moe-bias"])
def test_in_memory_names_read_too(kind):
    """transformers' own state dict (GLM-4-MoE's names: q/k/v_proj apart, embed_tokens, o_proj, q_norm, the router's
    e_score_correction_bias), the folders the FAMILIES tables test being in the Hub's."""
    hf, model = _imported(kind)
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        other = GPT(replace(model.cfg, rope_dims=8)).eval()  # GLM-4-MoE's half-head rotation would differ
        other.load_state_dict(model.state_dict())
        assert (other(TOKENS) - expected).abs().max() > 1e-4


def test_export_goes_where_the_layout_is_written():
    """QK-norm without biases: dots.llm1's layout; without QK-norm on experts alone: Solar Open's; q/k/v biases beside
    QK-norm, or dense first layers without QK-norm: Sarvam MoE's own."""
    family = _families()["sarvam_moe"]
    cfg = family.model_config(hf_model("sarvam_moe").config.to_dict())
    assert export_family(cfg).name == "dots1"
    assert export_family(replace(cfg, qk_norm=False, moe_dense_layers=0, moe_dense_hidden=None)).name == "solar_open"
    assert export_family(replace(cfg, qkv_bias=True)).name == "sarvam_moe"
    assert export_family(replace(cfg, qk_norm=False)).name == "sarvam_moe"
    with pytest.raises(UserError, match="model.moe_aux_loss"):
        export_family(replace(cfg, qkv_bias=True, moe_aux_loss=0.01))


@pytest.mark.parametrize("overrides, fragment", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 500.0}}, "RoPE scaling 'yarn'"),
    ({"n_shared_experts": 0}, "n_shared_experts=0"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
])
def test_refusals_name_the_field(overrides, fragment):
    hf = hf_model("sarvam_moe").config.to_dict()
    with pytest.raises(UserError, match=fragment):
        _families()["sarvam_moe"].model_config({**hf, **overrides})


# ----------------------------------------------------------------------------------------------------
# Sarvam MLA


def test_mla_config_defaults_and_original_names():
    """Without the latent widths, q_lora_rank or the mixture's fields, SarvamMLAConfig's own (one q_proj, 128 experts
    in one group, one dense layer); the original config's num_experts and num_shared_experts."""
    family = _families()["sarvam_mla"]
    bare = {"model_type": "sarvam_mla", "vocab_size": VOCAB, "hidden_size": 128, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_experts": 8, "num_shared_experts": 2, "moe_intermediate_size": 16}
    reference = transformers.SarvamMLAConfig(**bare)
    cfg = family.model_config(bare)
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.head_dim, cfg.rope_dims) == (
        0, reference.kv_lora_rank, reference.qk_head_dim, reference.qk_rope_head_dim)
    assert (cfg.moe_experts, cfg.moe_shared_hidden, cfg.moe_groups, cfg.moe_dense_layers, cfg.moe_top_k) == (
        reference.n_routed_experts, 16 * reference.n_shared_experts, reference.n_group,
        reference.first_k_dense_replace, reference.num_experts_per_tok) == (8, 32, 1, 1, 8)


def test_mla_original_format_reads_as_transformers_does(tmp_path):
    """The remote code's config (head_dim = kv_lora_rank + qk_rope_head_dim, q_head_dim, rope_scaling type
    "deepseek_yarn") as SarvamMLAConfig translates it: YaRN with its mscale_all_dim, the same logits."""
    legacy = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, q_head_dim=24,
                  head_dim=24, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                  max_position_embeddings=64, rope_theta=500.0, pad_token_id=None,
                  rope_scaling={"type": "deepseek_yarn", "factor": 2.0, "original_max_position_embeddings": 16,
                                "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})
    config = transformers.SarvamMLAConfig(**legacy)
    torch.manual_seed(0)
    hf = transformers.DeepseekV3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    family = _families()["sarvam_mla"]
    cfg = family.model_config({"model_type": "sarvam_mla", **legacy})
    assert (cfg.rope_scaling, cfg.rope_factor, cfg.rope_original_context) == ("yarn", 2.0, 16)
    state = hf.state_dict()
    src = TensorSource(state, state.__getitem__, "test")
    ours = family.fold(legacy, cfg, family.to_redline(src, cfg))
    model = GPT(cfg).eval()
    model.load_state_dict(ours, strict=False)
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))  # past the original 16
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, rtol=1e-5, atol=1e-5)


def test_mla_written_as_its_own_family(tmp_path):
    """The family's own folder (model_type sarvam_mla) loads as DeepseekV3ForCausalLM with the same logits;
    export_family sends the model to DeepSeek-V3."""
    hf, model = _imported("sarvam_mla")
    family = _families()["sarvam_mla"]  # its RoPE rows into redline's order, as the import does after to_redline
    model.load_state_dict(family.fold(hf.config.to_dict(), model.cfg, model.state_dict()))
    assert export_family(model.cfg).name == "deepseek_v3"
    back = _written_as(tmp_path, model, "sarvam_mla")
    assert back.config.model_type == "sarvam_mla"
    with torch.no_grad():
        torch.testing.assert_close(back(TOKENS).logits, hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
