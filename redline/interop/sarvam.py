"""Sarvam AI's two families, each a config of its own over an architecture redline reads.

Sarvam MoE (sarvam-30b, model_type "sarvam_moe"): a config of its own that transformers runs as
Glm4MoeForCausalLM, so GLM-4-MoE's names, router and experts (glm.py: sigmoid scores, a correction bias that
chooses, groups, a routed scale, ungated shared experts, dense first layers). What differs is the config:
- RoPE on whole heads (partial_rotary_factor 1.0 where the config gives none; GLM-4-MoE's default is 0.5), in
  (first half, second half) pairs as GLM-4-MoE's, at a base of 8e6 where none is given;
- its defaults where a config.json leaves a field out (per-head QK-norm on, head_dim 64, 4 KV heads, top 6 of 128
  experts 1024 wide, a routed scale of 2.5, rms_norm_eps 1e-6);
- the original config's names for fields (SarvamMoEConfig's attribute_map: num_experts, num_shared_experts,
  use_qkv_bias).
Its checkpoints hold the original names (what save_pretrained writes back: transformers' conversion_mapping.py renames
them as it loads): `model.word_embeddings`, `attention.query_key_value` (rows [q; k; v], as redline's fused qkv),
`attention.dense`, `attention.query_layernorm` / `key_layernorm`, the router's choosing bias `mlp.gate.expert_bias`;
folders in GLM-4-MoE's names are read too. Its multi-token prediction layers are none in the released checkpoints
(num_mtp_layers): read as unused if present, as GLM-4-MoE's are.

Export: a Sarvam model with QK-norm and no biases is dots.llm1's layout (the same computation: export_family sends it
there), without QK-norm on experts alone Solar Open's; where neither fits (q/k/v biases beside QK-norm, or dense first
layers without it) it is written as Sarvam MoE, the one architecture redline exports to with them. Semantics read from
transformers' models/sarvam_moe/modular_sarvam_moe.py and models/glm4_moe/modeling_glm4_moe.py.

Sarvam MLA (sarvam-105b, model_type "sarvam_mla"): a config of its own that transformers runs as
DeepseekV3ForCausalLM, with DeepSeek-V3's names (deepseek.py: latent attention with RoPE on interleaved pairs, sigmoid
routing with a choosing bias, shared experts, dense first layers). Its defaults where a config.json leaves a field out
differ from DeepseekV3Config's (one q_proj: q_lora_rank null; 128 experts in one group; one dense layer; no
multi-token prediction layers), its original config names num_experts / num_shared_experts, and the original format
(the remote code's) gives `head_dim` = kv_lora_rank + qk_rope_head_dim for vLLM and `q_head_dim`, both derived and
ignored, and YaRN as rope_scaling type "deepseek_yarn", which is YaRN (SarvamMLAConfig.__post_init__). Every option of
it is DeepSeek-V3's: exported as DeepSeek-V3, the same logits; PEFT adapters and GGUF (llama.cpp's deepseek2) as
DeepSeek-V3's.
Semantics read from transformers' models/sarvam_mla/modular_sarvam_mla.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.interop import deepseek, glm
from redline.interop.families import Family, TensorSource
from redline.model import ModelConfig

SARVAM_MOE_THETA = 8_000_000.0  # SarvamMoEConfig.default_theta

# SarvamMoEConfig's defaults for the fields a config.json may leave out (Glm4MoeConfig's differ)
_MOE_DEFAULTS = dict(vocab_size=262144, hidden_size=4096, intermediate_size=8192, num_hidden_layers=19,
                     num_attention_heads=64, num_key_value_heads=4, head_dim=64, max_position_embeddings=131072,
                     rms_norm_eps=1e-6, moe_intermediate_size=1024, num_experts_per_tok=6, n_shared_experts=1,
                     n_routed_experts=128, routed_scaling_factor=2.5, n_group=1, topk_group=1,
                     first_k_dense_replace=1, norm_topk_prob=True, use_qk_norm=True, attention_bias=False,
                     tie_word_embeddings=False)
# SarvamMoEConfig's attribute_map: the original sarvam-30b config's names -> GLM-4-MoE's
_MOE_ALIASES = {"num_experts": "n_routed_experts", "num_local_experts": "n_routed_experts",
                "num_shared_experts": "n_shared_experts", "use_qkv_bias": "attention_bias"}


def moe_model_config(hf: dict) -> ModelConfig:
    hf = dict(hf)
    for alias, name in _MOE_ALIASES.items():
        if alias in hf and name not in hf:
            hf[name] = hf[alias]
    hf = {**_MOE_DEFAULTS, **hf}
    params = dict(hf.get("rope_parameters") or {})
    params.setdefault("rope_theta", hf.get("rope_theta", SARVAM_MOE_THETA))
    params.setdefault("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    return glm.glm4_moe_model_config({**hf, "rope_parameters": params})


# the Hub's names -> GLM-4-MoE's (transformers' in-memory ones, which glm.py reads), as conversion_mapping.py renames
_HUB_NAMES = (("model.word_embeddings.", "model.embed_tokens."), (".attention.dense.", ".self_attn.o_proj."),
              (".attention.query_layernorm.", ".self_attn.q_norm."),
              (".attention.key_layernorm.", ".self_attn.k_norm."),
              (".mlp.gate.expert_bias", ".mlp.gate.e_score_correction_bias"))
_FUSED = ".attention.query_key_value."


def _qkv_sizes(cfg: ModelConfig) -> list[int]:
    return [cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim]


def moe_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    """GLM-4-MoE's to_redline over a view of the source in GLM-4-MoE's names: the Hub's renamed, each fused
    query_key_value read as the q_proj, k_proj and v_proj its rows hold."""
    names: dict[str, tuple[str, int | None]] = {}  # GLM-4-MoE's name -> (the source's, which third of fused rows)
    for name in src.names:
        if _FUSED in name:
            for part, x in enumerate("qkv"):
                names[name.replace(_FUSED, f".self_attn.{x}_proj.")] = (name, part)
            continue
        ours = name
        for hub, memory in _HUB_NAMES:
            ours = ours.replace(hub, memory)
        names[ours] = (name, None)

    def read(name: str) -> torch.Tensor:
        theirs, part = names[name]
        t = src.take(theirs)
        return t if part is None else t.split(_qkv_sizes(cfg))[part]

    out = glm.to_redline_for("glm4_moe")(TensorSource(names, read, src.where), cfg)
    # the multi-token prediction layers past the last one: not part of the causal model (marked in the view alone)
    src.used.update(n for n in src.names if (m := glm._LAYER.match(n)) and int(m.group(1)) >= cfg.n_layer)
    return out


def moe_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """GLM-4-MoE's to_hf in the Hub's names, as save_pretrained writes a Sarvam MoE checkpoint."""
    out = {}
    for name, t in glm.to_hf_for("glm4_moe")(state, cfg).items():
        for hub, memory in _HUB_NAMES:
            name = name.replace(memory, hub)
        out[name] = t
    for key in [k for k in out if ".self_attn.q_proj." in k]:
        out[key.replace(".self_attn.q_proj.", _FUSED)] = torch.cat(
            [out.pop(key.replace(".q_proj.", f".{x}_proj.")) for x in "qkv"])
    return {k.replace(".self_attn.", ".attention."): v for k, v in out.items()}


def wants_sarvam_moe(cfg: ModelConfig) -> bool:
    """GLM-4-MoE's experts (sigmoid scores, ungated shared experts) under attention that rotates whole heads, where
    dots.llm1 (QK-norm without biases) and Solar Open (experts on every layer without QK-norm) do not fit: q/k/v
    biases beside QK-norm, or dense first layers without it."""
    return bool(cfg.moe_experts and cfg.moe_gating == "sigmoid" and not cfg.rope_dims and cfg.pos_emb == "rope"
                and cfg.moe_shared_hidden and not cfg.moe_shared_gate and not cfg.moe_layers
                and ((cfg.qk_norm and cfg.has_qkv_bias) or (not cfg.qk_norm and cfg.moe_dense_layers))
                and not (cfg.conv_layers or cfg.delta_layers or cfg.mlp_free_layers or cfg.mixer_free_layers
                         or cfg.attn_gate != "none" or cfg.qk_norm_after_rope))


def check_moe_exportable(cfg: ModelConfig) -> None:
    """GLM-4-MoE's checks (glm.py), which are Sarvam MoE's: the same block and mixture."""
    glm.check_glm4_moe_exportable(cfg)


def moe_hf_config(cfg: ModelConfig) -> dict:
    return {**glm.glm4_moe_hf_config(cfg), "model_type": "sarvam_moe"}


MOE_FAMILY = Family(name="sarvam_moe", architecture="Glm4MoeForCausalLM", model_config=moe_model_config,
                    hf_config=moe_hf_config, to_redline=moe_to_redline, to_hf=moe_to_hf,
                    ignorable=glm._ignorable)


# SarvamMLAConfig's defaults for the fields a config.json may leave out (DeepseekV3Config's where Sarvam keeps them)
_MLA_DEFAULTS = dict(vocab_size=262144, hidden_size=4096, intermediate_size=16384, moe_intermediate_size=2048,
                     num_hidden_layers=32, num_attention_heads=64, n_shared_experts=1, n_routed_experts=128,
                     routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                     v_head_dim=128, qk_nope_head_dim=128, n_group=1, topk_group=1, num_experts_per_tok=8,
                     first_k_dense_replace=1, norm_topk_prob=True, max_position_embeddings=4096, rms_norm_eps=1e-6,
                     tie_word_embeddings=False, rope_interleave=True)
# SarvamMLAConfig's attribute_map: the original sarvam-105b config's names -> DeepSeek-V3's
_MLA_ALIASES = {"num_experts": "n_routed_experts", "num_local_experts": "n_routed_experts",
                "num_shared_experts": "n_shared_experts"}


def mla_as_deepseek_v3(hf: dict) -> dict:
    """A sarvam_mla config as the deepseek_v3 config it is (the module docstring): the original names and format
    translated, SarvamMLAConfig's defaults where a field is left out."""
    hf = {k: v for k, v in hf.items() if k not in ("head_dim", "q_head_dim")}  # derived: the widths below give them
    for alias, name in _MLA_ALIASES.items():
        if alias in hf and name not in hf:
            hf[name] = hf[alias]
    scaling = dict(hf.get("rope_scaling") or {})
    if "deepseek_yarn" in (scaling.get("type"), scaling.get("rope_type")):
        params = {k: v for k, v in scaling.items() if k != "type"}
        hf["rope_parameters"] = {"rope_theta": hf.get("rope_theta", 10000.0), **params, "rope_type": "yarn"}
        hf["rope_scaling"] = None
    return {**_MLA_DEFAULTS, **hf}


def mla_model_config(hf: dict) -> ModelConfig:
    return deepseek.model_config_for("deepseek_v3")(mla_as_deepseek_v3(hf))


def mla_hf_config(cfg: ModelConfig) -> dict:
    return {**deepseek.hf_config_for("deepseek_v3")(cfg), "model_type": "sarvam_mla"}


def _mla_fold(hf: dict, cfg: ModelConfig, state: dict) -> dict:
    return deepseek.fold_for("deepseek_v3")(mla_as_deepseek_v3(hf), cfg, state)


MLA_FAMILY = Family(name="sarvam_mla", architecture="DeepseekV3ForCausalLM", model_config=mla_model_config,
                    hf_config=mla_hf_config, to_redline=deepseek.to_redline, to_hf=deepseek.to_hf_for("deepseek_v3"),
                    ignorable=deepseek._ignorable, fold=_mla_fold)
"""Sarvam MLA: read as the DeepSeek-V3 it is, written back as DeepSeek-V3 (export_family never picks this family)."""
