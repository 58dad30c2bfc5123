"""The GLM family (Zhipu AI / THUDM): GLM (GlmForCausalLM, model_type "glm": glm-4-9b-chat-hf), GLM-4
(Glm4ForCausalLM, "glm4": GLM-4-9B-0414, GLM-Z1) and GLM-4-MoE (Glm4MoeForCausalLM, "glm4_moe": GLM-4.5,
GLM-4.5-Air, GLM-4.6).

All three are Llama's tensor names with RMSNorm, SwiGLU, grouped-query attention with biases on q/k/v alone
(`attention_bias`; o_proj never has one) and RoPE on the first partial_rotary_factor of each head (0.5 where the
config gives none, as transformers' configs default it; redline's rope_dims). What differs, each a ModelConfig field
(semantics read from transformers' models/glm, glm4 and glm4_moe modeling files):
- GLM and GLM-4 rotate their rope_dims in interleaved pairs ((0, 1), (2, 3), ...: transformers' glm
  apply_rotary_pos_emb repeats each frequency twice and rotates neighbours), GLM-4-MoE in (first half, second half)
  pairs as redline does. The import permutes each head's first rope_dims rows of q and k (their biases too) into
  redline's order, the export back (permuting q and k alike leaves every q·k product as it was);
- GLM and GLM-4 fuse the MLP's gate and up in one `mlp.gate_up_proj` (rows [gate; up], as redline's fused fc);
- GLM-4 puts RMSNorms on the sublayers' outputs too (post_self_attn_layernorm, post_mlp_layernorm): Gemma 2's
  sandwich (norm_position "sandwich") with plain RMSNorm weights, its post_attention_layernorm the MLP input's norm
  as Llama's is;
- GLM-4-MoE: optional QK-norm per head before RoPE (`use_qk_norm`), and from layer first_k_dense_replace on a mixture
  of n_routed_experts SwiGLU experts (moe_intermediate_size wide) as DeepSeek-V3 routes them: sigmoid scores
  (moe_gating), a correction bias that only chooses (`e_score_correction_bias`: moe_expert_bias), the top k among the
  topk_group best of n_group groups (moe_groups, moe_topk_groups: unchosen groups masked with -inf, as redline does),
  rescaled to sum to 1 with 1e-20 (norm_topk_prob, moe_norm_eps), times routed_scaling_factor (moe_scale); plus
  n_shared_experts ungated shared experts in one MLP every token passes through (moe_shared_hidden,
  moe_shared_gate=false). The first layers' dense MLPs are intermediate_size wide (moe_dense_hidden). Its multi-token
  prediction layers (model.layers.N for N >= num_hidden_layers, num_nextn_predict_layers of them) are for
  speculative decoding and training: read as unused, as transformers ignores them too.
GLM-4.7-Flash (model_type "glm4_moe_lite") has DeepSeek's multi-head latent attention: deepseek.py reads it.
Solar Open (model_type "solar_open") is GLM-4-MoE's mixture on every layer under Llama's attention (its section
below).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, give_head, interleave_rope_rows, pad_rows, raise_first,
                                      take_head)
from redline.interop.llama import _ignorable, _mlp_parts, _qkv, _rope, check_silu, rope_scaling, shape_fields
from redline.interop.moe import deepseek_experts_to_hf, deepseek_experts_to_redline
from redline.model import ModelConfig

GLM4_MOE_NORM_EPS = 1e-20  # the rescaled top-k weights' guard, as transformers' Glm4MoeTopkRouter adds it

# redline's block norms -> GLM's names (after model.layers.N.): GLM-4's post_attention_layernorm is the MLP input's
_NORMS = {"pre": {"norm1": "input_layernorm", "norm2": "post_attention_layernorm"},
          "sandwich": {"norm1": "input_layernorm", "attn_out_norm": "post_self_attn_layernorm",
                       "norm2": "post_attention_layernorm", "mlp_out_norm": "post_mlp_layernorm"}}
_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.")


def _fraction(hf: dict) -> float:
    """partial_rotary_factor from rope_parameters (transformers >= 5) or the top level; 0.5 where neither gives it,
    as GlmConfig, Glm4Config and Glm4MoeConfig default it."""
    params = hf.get("rope_parameters") or {}
    return float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.5)))


def _rope_fields(hf: dict, head_dim: int) -> dict:
    """rope_theta and rope_dims (0: the whole head) for GLM's RoPE; a UserError for scalings redline does not take
    with it."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    kind = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if kind != "default":
        raise UserError(f"RoPE scaling {kind!r} on a {hf.get('model_type')} model is not supported: redline reads "
                        f"GLM's RoPE unscaled, as the published GLM models use it")
    fraction = _fraction(hf)
    rotated = int(head_dim * fraction)  # transformers' rotary dimensions
    if rotated <= 0 or rotated % 2:
        raise UserError(f"partial_rotary_factor={fraction} rotates {rotated} of each head's {head_dim} dimensions; "
                        f"redline needs an even number above 0")
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    return {"rope_theta": theta, "rope_dims": 0 if rotated == head_dim else rotated}


def _dense_shape(hf: dict) -> dict:
    """shape_fields at GlmConfig's and Glm4Config's defaults: head_dim 128 where the config gives none (not
    hidden_size / heads), a context of 131072."""
    return shape_fields({**hf, "head_dim": hf.get("head_dim") or 128}, context_len=131_072)


def _dense_config(hf: dict, position: str) -> ModelConfig:
    check_silu(hf)
    shape = _dense_shape(hf)
    head_dim = shape["head_size"] or shape["n_embd"] // shape["n_head"]
    return ModelConfig(
        **shape, fused_qkv=True, pos_emb="rope", **_rope_fields(hf, head_dim), mlp="swiglu", fused_mlp=True,
        norm="rmsnorm", norm_position=position, norm_eps=float(hf.get("rms_norm_eps", 1.5625e-07)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False,
        qkv_bias=bool(hf.get("attention_bias", True)))


def glm_model_config(hf: dict) -> ModelConfig:
    return _dense_config(hf, "pre")


def glm4_model_config(hf: dict) -> ModelConfig:
    return _dense_config(hf, "sandwich")


def glm4_moe_model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    shape = shape_fields(hf, context_len=131_072)
    head_dim = shape["head_size"] or shape["n_embd"] // shape["n_head"]
    n = shape["n_layer"]
    dense = int(hf.get("first_k_dense_replace", 1))
    if not 0 <= dense < n:
        raise UserError(f"first_k_dense_replace={dense} with num_hidden_layers={n}: redline's mixtures of experts "
                        f"have experts on at least their last layer")
    width = int(hf.get("moe_intermediate_size", 1408))
    shared = int(hf.get("n_shared_experts", 1))
    if shared < 1:  # transformers still builds the shared MLP, zero rows wide
        raise UserError(f"n_shared_experts={shared}: redline reads GLM-4-MoE's shared experts, one or more")
    return ModelConfig(
        **{**shape, "mlp_hidden": width}, fused_qkv=True, pos_emb="rope", **_rope_fields(hf, head_dim),
        qk_norm=bool(hf.get("use_qk_norm", False)), mlp="swiglu", fused_mlp=True, norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=False, qkv_bias=bool(hf.get("attention_bias", False)),
        moe_experts=int(hf.get("n_routed_experts", hf.get("num_local_experts", 128))),
        moe_top_k=int(hf.get("num_experts_per_tok", 8)), moe_gating="sigmoid", moe_expert_bias=True,
        moe_norm_topk=bool(hf.get("norm_topk_prob", True)), moe_norm_eps=GLM4_MOE_NORM_EPS,
        moe_scale=float(hf.get("routed_scaling_factor", 1.0)), moe_groups=int(hf.get("n_group") or 1),
        moe_topk_groups=int(hf.get("topk_group") or 1), moe_shared_hidden=width * shared, moe_shared_gate=False,
        moe_dense_layers=dense, moe_dense_hidden=int(hf.get("intermediate_size", 10944)) if dense else None)


# ----------------------------------------------------------------------------------------------------
# choosing GLM on export


def wants_glm4(cfg: ModelConfig) -> bool:
    """Sandwich norms with plain RMSNorm weights and RoPE on part of each head: GLM-4's alone (Gemma 2's and 3's
    norms scale by 1 + weight, and they rotate whole heads)."""
    return bool(cfg.norm_position == "sandwich" and not cfg.norm_unit_offset and cfg.norm == "rmsnorm"
                and cfg.rope_dims)


def wants_glm(cfg: ModelConfig) -> bool:
    """Llama's pre-norm block with RoPE on part of each head and biases on q/k/v alone: GLM's (Phi-3, which has the
    rest, has no biases)."""
    return bool(cfg.rope_dims and cfg.has_qkv_bias and not cfg.bias and cfg.norm_position == "pre"
                and cfg.norm == "rmsnorm" and cfg.mlp == "swiglu" and not cfg.parallel_residual
                and not cfg.moe_experts and cfg.rope_scaling != "longrope")


def wants_glm4_moe(cfg: ModelConfig) -> bool:
    """A mixture of sigmoid-scored experts on attention layers with RoPE on part of each head: GLM-4-MoE's (LFM2-MoE's
    sigmoid experts sit beside short convolutions and rotate whole heads)."""
    return bool(cfg.moe_experts and cfg.moe_gating == "sigmoid" and cfg.rope_dims and not cfg.conv_layers
                and not cfg.delta_layers)


def _check_attention(cfg: ModelConfig, arch: str) -> list[tuple[bool, str]]:
    """What GLM's attention and block (all three) have none of, for raise_first."""
    named = [(name, getattr(cfg, name)) for name in (
        "norm_unit_offset", "embed_norm", "embed_scale", "embed_multiplier", "residual_multiplier", "logit_divisor",
        "logit_softcap", "attn_softcap", "attn_scale", "attn_sinks", "value_embeddings", "conv_layers",
        "delta_layers", "nope_interval", "rope_layer_theta", "rope_local_theta", "sliding_window",
        "sliding_window_pattern", "window_layers", "head_bias", "qk_norm_after_rope", "moe_layers")]
    refused = [(bool(value), f"model.{name} with {arch}'s options: {arch} has no such option") for name, value in named]
    return refused + [
        (cfg.pos_emb != "rope", f"model.pos_emb={cfg.pos_emb}: {arch} uses RoPE"),
        (cfg.rope_scaling != "none", f"model.rope_scaling={cfg.rope_scaling}: redline writes {arch} unscaled"),
        (cfg.norm != "rmsnorm" or not cfg.norm_affine, f"model.norm={cfg.norm} (or norm_affine=false): {arch} uses "
                                                       f"RMSNorm with weights"),
        (cfg.mlp != "swiglu", f"model.mlp={cfg.mlp}: {arch}'s MLP is SwiGLU"),
        (cfg.attn_gate != "none", f"model.attn_gate={cfg.attn_gate}: {arch} has no gate on its heads"),
        (cfg.parallel_residual, f"model.parallel_residual: {arch}'s sublayers run in turn"),
        (cfg.bias, f"model.bias=true: {arch} has biases on q/k/v alone (model.qkv_bias)"),
        (cfg.qk_norm and cfg.qk_norm_scope != "head", f"model.qk_norm_scope={cfg.qk_norm_scope}: {arch} normalizes "
                                                      f"each head"),
    ]


def check_glm_exportable(cfg: ModelConfig) -> None:
    raise_first(_check_attention(cfg, "GLM") + [(cfg.qk_norm, "model.qk_norm: GLM has no QK-norm")])


def check_glm4_exportable(cfg: ModelConfig) -> None:
    raise_first([(cfg.moe_experts, "model.moe_experts with norm_position=sandwich: GLM-4, the one architecture with "
                                   "plain sandwich norms redline exports to, is dense")]
                + _check_attention(cfg, "GLM-4") + [(cfg.qk_norm, "model.qk_norm: GLM-4 has no QK-norm")])


def check_glm4_moe_exportable(cfg: ModelConfig) -> None:
    arch = "GLM-4-MoE"
    shared = cfg.moe_shared_hidden
    raise_first(_check_attention(cfg, arch) + [
        (cfg.norm_position != "pre", f"model.norm_position={cfg.norm_position}: {arch}'s norms are pre-norms"),
        (cfg.moe_bias, f"model.moe_bias: {arch}'s router and experts have no biases"),
        (not shared or shared % cfg.hidden_dim or cfg.moe_shared_gate,
         f"model.moe_shared_hidden={shared}, moe_shared_gate={cfg.moe_shared_gate}: {arch} has ungated shared "
         f"experts (moe_shared_gate=false), n_shared_experts of them moe_intermediate_size (model.mlp_hidden) wide"),
        (cfg.moe_norm_topk and cfg.moe_norm_eps != GLM4_MOE_NORM_EPS,
         f"model.moe_norm_eps={cfg.moe_norm_eps}: {arch} rescales the chosen weights with {GLM4_MOE_NORM_EPS:g}; set "
         f"model.moe_norm_eps={GLM4_MOE_NORM_EPS:g}"),
        (cfg.moe_aux_loss, f"model.moe_aux_loss: {arch} trains without a load-balancing loss (its routing bias "
                           f"balances: model.moe_bias_update)"),
    ])


# ----------------------------------------------------------------------------------------------------
# configs


def _common_hf(cfg: ModelConfig, model_type: str) -> dict:
    fraction = (cfg.rope_dims or cfg.head_dim) / cfg.head_dim
    return {
        "model_type": model_type, "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.context_len, "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": cfg.has_qkv_bias, "attention_dropout": 0.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta, "partial_rotary_factor": fraction},
        # what transformers before 5 reads instead of rope_parameters
        "rope_theta": cfg.rope_theta, "partial_rotary_factor": fraction,
        "initializer_range": 0.02, "use_cache": True,
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,  # the writer sets them
    }


def glm_hf_config(cfg: ModelConfig) -> dict:
    return _common_hf(cfg, "glm")


def glm4_hf_config(cfg: ModelConfig) -> dict:
    return _common_hf(cfg, "glm4")


def glm4_moe_hf_config(cfg: ModelConfig) -> dict:
    out = _common_hf(cfg, "glm4_moe")
    out.update(intermediate_size=cfg.moe_dense_hidden or cfg.hidden_dim, moe_intermediate_size=cfg.hidden_dim,
               n_routed_experts=cfg.moe_experts, num_experts_per_tok=cfg.moe_top_k,
               n_shared_experts=cfg.moe_shared_hidden // cfg.hidden_dim, routed_scaling_factor=cfg.moe_scale,
               n_group=cfg.moe_groups, topk_group=cfg.moe_topk_groups, first_k_dense_replace=cfg.moe_dense_layers,
               norm_topk_prob=cfg.moe_norm_topk, use_qk_norm=cfg.qk_norm, num_nextn_predict_layers=0,
               output_router_logits=False)
    return out


# ----------------------------------------------------------------------------------------------------
# weights


def rope_rows(w: torch.Tensor, heads: int, cfg: ModelConfig, to_hf: bool) -> torch.Tensor:
    """q or k rows (heads·D, ...) (or their biases) with each head's first rope_dims rows between redline's (first
    half, second half) pairs and GLM's interleaved ones (to_hf), or back; the rest of each head as it is."""
    D = cfg.head_dim
    R = cfg.rope_dims or D
    per_head = w.reshape(heads, D, *w.shape[1:])
    rot = interleave_rope_rows(per_head[:, :R].reshape(heads * R, *w.shape[1:]), heads, inverse=not to_hf)
    return torch.cat([rot.reshape(heads, R, *w.shape[1:]), per_head[:, R:]], dim=1).reshape(w.shape)


def _interleaved(family: str) -> bool:
    return family in ("glm", "glm4")  # GLM-4-MoE rotates (first half, second half) pairs, as redline does


def _qkv_to_redline(src: TensorSource, attn: str, cfg: ModelConfig, kind: str, interleaved: bool) -> torch.Tensor:
    q, k, v = (src.take(f"{attn}{x}_proj.{kind}") for x in "qkv")
    if interleaved:
        q, k = rope_rows(q, cfg.n_head, cfg, to_hf=False), rope_rows(k, cfg.kv_heads, cfg, to_hf=False)
    return torch.cat([q, k, v])


def _qkv_to_hf(state: Mapping[str, torch.Tensor], r: str, cfg: ModelConfig, kind: str,
               interleaved: bool) -> list[torch.Tensor]:
    q, k, v = _qkv(state, r, cfg, kind)
    if interleaved:
        q, k = rope_rows(q, cfg.n_head, cfg, to_hf=True), rope_rows(k, cfg.kv_heads, cfg, to_hf=True)
    return [q, k, v]


def to_redline_for(family: str):
    def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
        out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
               "norm_f.weight": src.take("model.norm.weight")}
        out.update(take_head(src, cfg))
        interleaved = _interleaved(family)
        for i in range(cfg.n_layer):
            p, r = f"model.layers.{i}.", f"blocks.{i}."
            attn, mlp = p + "self_attn.", p + "mlp."
            for ours, theirs in _NORMS[cfg.norm_position].items():
                out[f"{r}{ours}.weight"] = src.take(f"{p}{theirs}.weight")
            out[r + "attn.qkv.weight"] = _qkv_to_redline(src, attn, cfg, "weight", interleaved)
            if cfg.has_qkv_bias:
                out[r + "attn.qkv.bias"] = _qkv_to_redline(src, attn, cfg, "bias", interleaved)
            out[r + "attn.proj.weight"] = src.take(attn + "o_proj.weight")
            if cfg.qk_norm:
                out[r + "attn.q_norm.weight"] = src.take(attn + "q_norm.weight")
                out[r + "attn.k_norm.weight"] = src.take(attn + "k_norm.weight")
            if cfg.layer_has_experts(i):
                out.update(deepseek_experts_to_redline(src, p, r, cfg))
            elif f"{mlp}gate_up_proj.weight" in src:  # GLM's and GLM-4's fused [gate; up]
                out[r + "mlp.fc.weight"] = src.take(f"{mlp}gate_up_proj.weight")
                out[r + "mlp.proj.weight"] = src.take(f"{mlp}down_proj.weight")
            else:  # GLM-4-MoE's dense first layers, gate and up apart
                out[r + "mlp.fc.weight"] = torch.cat([src.take(f"{mlp}gate_proj.weight"),
                                                      src.take(f"{mlp}up_proj.weight")])
                out[r + "mlp.proj.weight"] = src.take(f"{mlp}down_proj.weight")
        # GLM-4-MoE's multi-token prediction layers past the last one: not part of the causal model
        src.used.update(n for n in src.names if (m := _LAYER.match(n)) and int(m.group(1)) >= cfg.n_layer)
        return out

    return to_redline


def to_hf_for(family: str):
    def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
        V = cfg.vocab_size
        out = {"model.embed_tokens.weight": state["wte.weight"][:V], "model.norm.weight": state["norm_f.weight"]}
        out.update(give_head(state, cfg))
        interleaved = _interleaved(family)
        for i in range(cfg.n_layer):
            p, r = f"model.layers.{i}.", f"blocks.{i}."
            attn, mlp = p + "self_attn.", p + "mlp."
            for ours, theirs in _NORMS[cfg.norm_position].items():
                out[f"{p}{theirs}.weight"] = state[f"{r}{ours}.weight"]
            for x, t in zip("qkv", _qkv_to_hf(state, r, cfg, "weight", interleaved)):
                out[f"{attn}{x}_proj.weight"] = t
            if cfg.has_qkv_bias:
                for x, t in zip("qkv", _qkv_to_hf(state, r, cfg, "bias", interleaved)):
                    out[f"{attn}{x}_proj.bias"] = t
            out[attn + "o_proj.weight"] = state[r + "attn.proj.weight"]
            if cfg.qk_norm:
                out[attn + "q_norm.weight"] = state[r + "attn.q_norm.weight"]
                out[attn + "k_norm.weight"] = state[r + "attn.k_norm.weight"]
            if cfg.layer_has_experts(i):
                out.update(deepseek_experts_to_hf(state, p, r, cfg))
            elif family == "glm4_moe":
                out[mlp + "gate_proj.weight"], out[mlp + "up_proj.weight"] = _mlp_parts(state, r, cfg, "weight")
                out[mlp + "down_proj.weight"] = state[r + "mlp.proj.weight"]
            else:
                out[mlp + "gate_up_proj.weight"] = torch.cat(_mlp_parts(state, r, cfg, "weight"))
                out[mlp + "down_proj.weight"] = state[r + "mlp.proj.weight"]
        return {k: v.contiguous() for k, v in out.items()}

    return to_hf


GLM_FAMILY = Family(name="glm", architecture="GlmForCausalLM", model_config=glm_model_config,
                    hf_config=glm_hf_config, to_redline=to_redline_for("glm"), to_hf=to_hf_for("glm"),
                    ignorable=_ignorable)
GLM4_FAMILY = Family(name="glm4", architecture="Glm4ForCausalLM", model_config=glm4_model_config,
                     hf_config=glm4_hf_config, to_redline=to_redline_for("glm4"), to_hf=to_hf_for("glm4"),
                     ignorable=_ignorable)
GLM4_MOE_FAMILY = Family(name="glm4_moe", architecture="Glm4MoeForCausalLM", model_config=glm4_moe_model_config,
                         hf_config=glm4_moe_hf_config, to_redline=to_redline_for("glm4_moe"),
                         to_hf=to_hf_for("glm4_moe"), ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# Solar Open (Upstage's SolarOpenForCausalLM, model_type "solar_open": Solar-Open-100B): GLM-4-MoE's names, router and
# experts on Llama's attention: experts on every layer (no first_k_dense_replace), no QK-norm, RoPE on whole heads in
# (first half, second half) pairs with any of Llama's scalings, biases on q/k/v alone where attention_bias says
# (o_proj never has one), RoPE base 1e6 where the config gives none. Semantics read from transformers'
# models/solar_open/modular_solar_open.py (SolarOpenAttention is LlamaAttention without the o_proj bias,
# SolarOpenMoE is Glm4MoeMoE). Its rotary embedding takes a partial_rotary_factor that its attention then cannot
# apply (the cos/sin tables would be narrower than the heads): anything but 1 is refused.

SOLAR_OPEN_THETA = 1_000_000.0  # SolarOpenConfig.default_theta


def solar_open_model_config(hf: dict) -> ModelConfig:
    params = dict(hf.get("rope_parameters") or {})
    fraction = float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    if fraction != 1.0:
        raise UserError(f"partial_rotary_factor={fraction} on a Solar Open model: its attention rotates whole heads "
                        f"(transformers' SolarOpenAttention fails on narrower tables); redline reads 1 alone")
    if "rope_theta" not in params and "rope_theta" not in hf:
        params["rope_theta"] = SOLAR_OPEN_THETA
    hf = {**hf, "rope_parameters": params or None}
    cfg = glm4_moe_model_config({**hf, "first_k_dense_replace": 0, "use_qk_norm": False,
                                 "partial_rotary_factor": 1.0, "rope_parameters": None, "rope_scaling": None})
    return replace(cfg, moe_dense_hidden=None, **_rope(hf))


def wants_solar_open(cfg: ModelConfig) -> bool:
    """Sigmoid-scored experts with an ungated shared expert on every layer of Llama's attention, without QK-norm,
    rotating whole heads: Solar Open's (GLM-4-MoE rotates part of each head, dots.llm1 has QK-norm)."""
    return bool(cfg.moe_experts and cfg.moe_gating == "sigmoid" and cfg.moe_shared_hidden and not cfg.moe_shared_gate
                and not cfg.rope_dims and not cfg.qk_norm
                and not cfg.moe_dense_layers and not cfg.moe_layers and not cfg.conv_layers and not cfg.delta_layers
                and not cfg.mlp_free_layers and not cfg.mixer_free_layers and cfg.attn_gate == "none"
                and not cfg.parallel_residual and not cfg.qk_norm_after_rope)


def check_solar_open_exportable(cfg: ModelConfig) -> None:
    what = ("sigmoid-scored experts on Llama's attention without QK-norm: Solar Open, the architecture with them "
            "redline exports to,")
    shared = cfg.moe_shared_hidden
    named = [name for name in (
        "norm_unit_offset", "embed_norm", "embed_scale", "embed_multiplier", "residual_multiplier", "logit_divisor",
        "logit_softcap", "attn_softcap", "attn_scale", "attn_sinks", "value_embeddings", "nope_interval",
        "rope_layer_theta", "rope_local_theta", "sliding_window", "head_bias", "moe_bias", "moe_aux_loss", "bias")
        if getattr(cfg, name)]
    raise_first([
        (bool(named), f"{what} has no model.{named[0] if named else ''}"),
        (cfg.pos_emb != "rope" or cfg.rope_scaling not in ("none", "linear", "llama3", "yarn"),
         f"{what} rotates with RoPE (model.pos_emb={cfg.pos_emb}, rope_scaling={cfg.rope_scaling})"),
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or not cfg.norm_affine,
         f"{what} has pre-RMSNorm blocks with weights (model.norm_position, norm, norm_affine)"),
        (cfg.mlp != "swiglu", f"{what} has SwiGLU experts (model.mlp={cfg.mlp})"),
        (not shared or shared % cfg.hidden_dim or cfg.moe_shared_gate,
         f"{what} has ungated shared experts (moe_shared_gate=false), n_shared_experts of them moe_intermediate_size "
         f"(model.mlp_hidden) wide (model.moe_shared_hidden={shared})"),
        (cfg.moe_norm_topk and cfg.moe_norm_eps != GLM4_MOE_NORM_EPS,
         f"{what} rescales the chosen weights with {GLM4_MOE_NORM_EPS:g} (model.moe_norm_eps={cfg.moe_norm_eps}); set "
         f"model.moe_norm_eps={GLM4_MOE_NORM_EPS:g}"),
    ])


def solar_open_hf_config(cfg: ModelConfig) -> dict:
    out = glm4_moe_hf_config(cfg)
    for key in ("intermediate_size", "first_k_dense_replace", "use_qk_norm", "num_nextn_predict_layers",
                "partial_rotary_factor", "rope_theta"):
        out.pop(key)
    out["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta,
                              **(rope_scaling(cfg, "solar_open") or {})}
    return {**out, "model_type": "solar_open"}


SOLAR_OPEN_FAMILY = Family(name="solar_open", architecture="SolarOpenForCausalLM",
                           model_config=solar_open_model_config, hf_config=solar_open_hf_config,
                           to_redline=to_redline_for("solar_open"), to_hf=to_hf_for("solar_open"),
                           ignorable=_ignorable)
