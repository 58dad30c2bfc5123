"""GLM-4.7-Flash (glm4_moe_lite) and MiniCPM3 (minicpm3), both on DeepSeek's latent attention, beyond the import /
export parity of tests/test_interop.py (their FAMILIES entries there): the Hub's configs read as transformers reads
them, the export's choice of architecture, the engine on MiniCPM3's scalars with LongRoPE, and each refusal one line
naming its option."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.interop.families import _families, export_family
from tests.interop_models import hf_folder
from tests.test_interop import _expect_import_error, imported, run_cli
from tests.test_latent_attention import MLA, MLA_MOE, full_recompute, sharp

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# GLM-4.7-Flash's config.json as the Hub holds it (the sizes shrunk; its multi-token-prediction layer past the last)
HUB_FLASH = {
    "architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite", "vocab_size": 320, "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_nextn_predict_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 8,
    "routed_scaling_factor": 1.8, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "v_head_dim": 32,
    "qk_nope_head_dim": 24, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 4, "first_k_dense_replace": 1,
    "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 202752, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000, "rope_scaling": None, "partial_rotary_factor": 1.0, "tie_word_embeddings": False,
    "attention_bias": False,
}
# MiniCPM3-4B's (the sizes shrunk): LongRoPE over its 16 rotating pairs, µP scalars, values hidden / heads wide
HUB_MINICPM3 = {
    "architectures": ["MiniCPM3ForCausalLM"], "model_type": "minicpm3", "vocab_size": 320, "hidden_size": 80,
    "intermediate_size": 96, "num_hidden_layers": 62, "num_attention_heads": 4, "num_key_value_heads": 4,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 32, "kv_lora_rank": 16, "q_lora_rank": 24, "hidden_act": "silu",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "scale_emb": 12,
    "scale_depth": 1.4, "dim_model_base": 16, "tie_word_embeddings": True,
    "rope_scaling": {"type": "longrope", "long_factor": [1.0 + i / 4 for i in range(16)],
                     "short_factor": [1.0 + i / 8 for i in range(16)], "original_max_position_embeddings": 32768},
}


def test_hub_glm_4_7_flash_config_reads_as_deepseek_v3():
    """GLM-4.7-Flash: DeepSeek-V3's attention (whole heads of qk_rope_head_dim rotated, the plain score scale) and
    router (sigmoid, the bias choosing, rescaled with 1e-20, times 1.8), its dense first layers from mlp_layer_types
    (the first alone without it, first_k_dense_replace unread as transformers leaves it); Glm4MoeLiteConfig's
    defaults where a field is absent."""
    lite = _families()["glm4_moe_lite"]
    cfg = lite.model_config(HUB_FLASH)
    cfg.validate()
    assert (cfg.head_dim, cfg.rope_dims, cfg.v_head_dim, cfg.kv_lora_rank, cfg.q_lora_rank, cfg.attn_scale) == \
        (32, 8, 0, 16, 24, 32 ** -0.5)
    assert (cfg.moe_experts, cfg.moe_top_k, cfg.moe_groups, cfg.moe_gating, cfg.moe_expert_bias, cfg.moe_norm_topk,
            cfg.moe_norm_eps, cfg.moe_scale, cfg.moe_dense_layers, cfg.moe_dense_hidden, cfg.moe_shared_hidden) == \
        (8, 4, 1, "sigmoid", True, True, 1e-20, 1.8, 1, 96, 32)
    assert (cfg.norm_eps, cfg.rope_theta, cfg.context_len) == (1e-5, 1e6, 202752)
    # transformers' Glm4MoeLiteConfig writes mlp_layer_types and reads first_k_dense_replace not at all
    typed = {k: v for k, v in HUB_FLASH.items() if k != "first_k_dense_replace"}
    assert lite.model_config({**typed, "mlp_layer_types": ["dense", "dense", "sparse"]}).moe_dense_layers == 2
    assert lite.model_config({**HUB_FLASH, "first_k_dense_replace": 2}).moe_dense_layers == 1
    assert lite.model_config({k: v for k, v in typed.items() if k != "rms_norm_eps"}).norm_eps == 1e-5
    deepseek = _families()["deepseek_v3"].model_config({**HUB_FLASH, "model_type": "deepseek_v3"})
    assert replace(deepseek, norm_eps=cfg.norm_eps) == cfg
    assert export_family(cfg).name == "deepseek_v3"


@pytest.mark.parametrize("overrides, fragment", [
    (dict(mlp_layer_types=["sparse", "dense", "sparse"]), "mlp_layer_types=['sparse', 'dense', 'sparse']: redline"),
    (dict(mlp_layer_types=["dense", "sparse"]), "mlp_layer_types=['dense', 'sparse']: redline"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}),
     "partial_rotary_factor=0.5 on glm4_moe_lite"),
    (dict(attention_bias=True), "attention_bias=true"),
    (dict(num_key_value_heads=2), "num_key_value_heads=2 with num_attention_heads=4"),
])
def test_glm4_moe_lite_refusals_are_one_line(overrides, fragment):
    with pytest.raises(UserError) as e:
        _families()["glm4_moe_lite"].model_config({**HUB_FLASH, **overrides})
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_glm4_moe_lite_folder_refusal_writes_nothing(tmp_path, capsys):
    """A refusal at import names the option and leaves no output folder."""
    hf_folder("glm4_moe_lite", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "mlp_layer_types": ["sparse", "dense"]}))
    _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, "mlp_layer_types=['sparse', 'dense']")


def test_hub_minicpm3_config_reads_its_scalars_and_longrope():
    """MiniCPM3-4B: scale_emb the embedding multiplier, scale_depth / sqrt(layers) the residual one, hidden_size /
    dim_model_base the logit divisor; LongRoPE over qk_rope_head_dim (its context the original one, as Phi-3's);
    values hidden_size / heads wide; tied."""
    cfg = _families()["minicpm3"].model_config(HUB_MINICPM3)
    cfg.validate()
    assert (cfg.embed_multiplier, cfg.residual_multiplier, cfg.logit_divisor) == (12.0, 1.4 / math.sqrt(62), 5.0)
    assert (cfg.head_dim, cfg.rope_dims, cfg.v_head_dim, cfg.kv_lora_rank, cfg.q_lora_rank, cfg.moe_experts) == \
        (48, 32, 20, 16, 24, 0)
    assert (cfg.rope_scaling, cfg.rope_original_context, cfg.context_len, cfg.rope_factor) == \
        ("longrope", 32768, 32768, 1.0)
    assert cfg.rope_pair_factors[:2] == (1.0, 1.125) and cfg.rope_long_pair_factors[:2] == (1.0, 1.25)
    assert cfg.tie_embeddings and cfg.norm_eps == 1e-5 and cfg.attn_scale == 48 ** -0.5
    # scale_depth and dim_model_base null: no scaling (MiniCPM3Config's sqrt(layers) and hidden_size)
    plain = _families()["minicpm3"].model_config({**HUB_MINICPM3, "scale_depth": None, "dim_model_base": None})
    assert (plain.residual_multiplier, plain.logit_divisor) == (1.0, 1.0)
    # left out: MiniCPM3Config's defaults (scale_emb 12, scale_depth 1.4, dim_model_base 256)
    bare = {k: v for k, v in HUB_MINICPM3.items() if k not in ("scale_emb", "scale_depth", "dim_model_base")}
    cfg = _families()["minicpm3"].model_config({**bare, "hidden_size": 512, "v_head_dim": 16})
    assert (cfg.embed_multiplier, cfg.residual_multiplier, cfg.logit_divisor) == (12.0, 1.4 / math.sqrt(62), 2.0)
    assert export_family(cfg).name == "minicpm3"


@pytest.mark.parametrize("overrides, fragment", [
    (dict(rope_scaling={"type": "yarn", "factor": 2.0}), "RoPE scaling 'yarn' on minicpm3"),
    (dict(n_routed_experts=8), "n_routed_experts=8 on minicpm3"),
    (dict(rope_scaling={**HUB_MINICPM3["rope_scaling"], "short_factor": [1.0] * 4}),
     "LongRoPE's short_factor and long_factor need 16 entries"),
    (dict(hidden_act="gelu"), "gelu"),
])
def test_minicpm3_refusals_are_one_line(overrides, fragment):
    with pytest.raises(UserError) as e:
        _families()["minicpm3"].model_config({**HUB_MINICPM3, **overrides})
    assert fragment in str(e.value) and "\n" not in str(e.value)


# MiniCPM3's layout in redline: latent attention on dense layers, Granite's three scalars, LongRoPE
MINICPM3 = replace(MLA, embed_multiplier=12.0, residual_multiplier=0.5, logit_divisor=3.0, rope_scaling="longrope",
                   rope_original_context=16, rope_factor=4.0, rope_pair_factors=(1.0, 1.4, 2.0, 3.0),
                   rope_long_pair_factors=(1.5, 2.5, 4.0, 6.0))


@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_on_minicpm3s_layout_decodes_as_full_recompute(chunk):
    """The scalars and LongRoPE (past its original context: the long factors) through the engine's prefill, chunked
    prefill and decode: the full recompute's tokens."""
    model = sharp(MINICPM3)
    prompts = [list(range(1, 15)), [5, 6], [40]]
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=chunk)
    got = [r.tokens for r in engine.generate(prompts, 10, SamplingParams(temperature=0))]
    assert got == [full_recompute(model, p, 10) for p in prompts]


def test_training_through_minicpm3s_layout_lowers_the_loss():
    from redline.model import GPT

    torch.manual_seed(0)
    model = GPT(MINICPM3).train()
    idx = torch.randint(0, MINICPM3.vocab_size, (2, 24))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(5):
        opt.zero_grad()
        loss = model(idx, idx)
        loss.backward()
        first = first if first is not None else loss.item()
        opt.step()
    assert loss.item() < first


@pytest.mark.parametrize("cfg, fragment", [
    (replace(MINICPM3, logit_divisor=7.0), "model.logit_divisor=7.0: MiniCPM3 divides by hidden_size / "
                                           "dim_model_base, a whole dim_model_base (n_embd=48)"),
    (replace(MINICPM3, rope_scaling="yarn", rope_long_pair_factors=(), rope_pair_factors=()),
     "model.rope_scaling=yarn with MiniCPM3's scalars"),
    (replace(MINICPM3, sliding_window=8), "windows, soft caps, sinks, embed_scale or head biases"),
    # experts with the scalars: DeepSeek's choice, which names them
    (replace(MLA_MOE, embed_multiplier=2.0), "embedding/residual/logit scalars or biases with latent attention"),
])
def test_export_refusals_name_the_option(cfg, fragment):
    cfg.validate()
    with pytest.raises(UserError) as e:
        family = export_family(cfg)
        family.hf_config(cfg)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_export_chooses_minicpm3_only_for_its_scalars_or_longrope():
    assert export_family(MINICPM3).name == "minicpm3"
    assert export_family(replace(MLA, embed_multiplier=2.0)).name == "minicpm3"
    assert export_family(MLA).name == "deepseek_v3"  # no scalar: DeepSeek-V3, as before


def test_minicpm3_export_writes_its_scalars_and_longrope(tmp_path, capsys):
    """The exported config.json holds the source's scale_emb, scale_depth, dim_model_base and LongRoPE (the round
    trip's logits: tests/test_interop.py)."""
    hf, model, _, ckpt = imported("minicpm3-longrope", tmp_path, capsys)
    code, _, err = run_cli(["export", str(ckpt), "--out", str(tmp_path / "exported")], capsys)
    assert code == 0, err
    written = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert written["model_type"] == "minicpm3" and written["dim_model_base"] == 32
    assert written["scale_depth"] == pytest.approx(1.2) and written["scale_emb"] == 2.5
    assert written["rope_parameters"]["rope_type"] == "longrope"


def test_glm_4_7_flash_adapter_loads_on_deepseek_v3_with_redlines_logits(tmp_path, capsys, monkeypatch):
    """A LoRA run on GLM-4.7-Flash's layout (as its import reads it) exports its adapter for the DeepSeek-V3 the base
    exports as: PEFT loads it onto transformers' DeepseekV3ForCausalLM with redline's logits (the latent attention
    adapted; PEFT moves MLP adapters onto the experts)."""
    from dataclasses import asdict

    from tests import test_lora_export

    cfg = _families()["glm4_moe_lite"].model_config({**HUB_FLASH, "num_hidden_layers": 2})
    fields = {k: v for k, v in asdict(cfg).items() if k not in ("vocab_size", "context_len")}
    monkeypatch.setitem(test_lora_export.ARCHS, "glm4_moe_lite", fields)
    base, ckpt = test_lora_export.lora_run(tmp_path, "glm4_moe_lite", targets=("attn.*",))
    test_lora_export.assert_peft_gives_redlines_logits(tmp_path, base, ckpt, arch="DeepseekV3ForCausalLM")
