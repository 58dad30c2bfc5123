"""Laguna (LagunaForCausalLM, model_type "laguna": poolside's Laguna XS.2): pre-RMSNorm blocks of AFMoE's attention
with a softplus gate on the heads' output instead of a sigmoid, as transformers' LagunaDecoderLayer builds them:
- attention: q/k/v/o_proj, per-head QK-norm before RoPE, self_attn.g_proj (gating true or "per-head": one gate a
  head, (H, C): model.attn_gate=head; else one an element, (H·D, C): attn_gate=element), softplus(g · x) in fp32
  (model.attn_gate_fn=softplus); every layer rotates, with RoPE parameters per layer type (rope_parameters keyed by
  full_attention / sliding_attention: the full layers' base and scaling as rope_theta / rope_scaling, the windowed
  layers' unscaled base as rope_local_theta; each type's partial_rotary_factor as model.rope_dims and
  model.rope_local_dims); the sliding_attention layers of layer_types windowed;
- mlp_layer_types: dense layers a SwiGLU intermediate_size wide (moe_dense_layers where they come first, else
  moe_layers), sparse ones the router's sigmoid scores (mlp.gate.weight) plus a bias that chooses (the Hub's
  mlp.experts.e_score_correction_bias, in memory mlp.gate.e_score_correction_bias: model.moe_expert_bias), the top
  num_experts_per_tok rescaled to sum to 1 without an epsilon (model.moe_norm_eps=0), times
  moe_routed_scaling_factor (model.moe_scale), SwiGLU experts moe_intermediate_size wide beside an ungated shared
  expert (the Hub's mlp.shared_expert.*, shared_expert_intermediate_size).
Refused by name: attention_bias, num_attention_heads_per_layer that differ, moe_router_logit_softcapping,
moe_apply_router_weight_on_input, no shared expert. A redline model with a softplus gate or its windowed layers'
own partial RoPE (model.rope_local_dims), Laguna's alone, exports as Laguna. Semantics read from transformers'
models/laguna/modular_laguna.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.afmoe import bias_problem, other_layer_problems, qk_norm_problem, shared_expert_problem
from redline.interop.families import Family, TensorSource, raise_first
from redline.interop.gemma3 import _rope_fields
from redline.interop.llama import _ignorable, check_silu, layer_windows, rope_scaling, shape_fields, to_hf, to_redline
from redline.interop.moe import expert_fields
from redline.interop.windowed_moe import _mlp_layers
from redline.model import ModelConfig

_FULL, _SLIDING = "full_attention", "sliding_attention"
_BIAS = ("mlp.experts.e_score_correction_bias", "mlp.gate.e_score_correction_bias")  # the Hub's, in memory
_DEFAULT_ROPE = {_FULL: {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                 _SLIDING: {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}


def _rotated(params: dict, head_dim: int) -> int:
    """The dimensions of each head a layer type's RoPE turns (transformers' int(head_dim · partial_rotary_factor))."""
    return int(head_dim * float(params.get("partial_rotary_factor", 1.0)))


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: Laguna then has biases on q/k/v and o_proj, which redline's mixtures "
                        "of experts do not have")
    n, heads = hf["num_hidden_layers"], hf["num_attention_heads"]
    per_layer = hf.get("num_attention_heads_per_layer") or [heads] * n
    if set(per_layer) != {heads}:
        raise UserError(f"num_attention_heads_per_layer={per_layer}: redline's layers have one head count "
                        f"(num_attention_heads={heads})")
    if hf.get("moe_router_logit_softcapping"):
        raise UserError(f"moe_router_logit_softcapping={hf['moe_router_logit_softcapping']}: redline's routers do "
                        f"not cap their logits")
    if hf.get("moe_apply_router_weight_on_input"):
        raise UserError("moe_apply_router_weight_on_input=true: transformers' Laguna does not run it (it raises); "
                        "the config names no model it runs")
    shared = int(hf.get("shared_expert_intermediate_size") or 0)
    if not shared:
        raise UserError(f"shared_expert_intermediate_size={hf.get('shared_expert_intermediate_size')}: Laguna's "
                        f"mixtures have a shared expert; the config must give its width")
    kinds = hf.get("layer_types") or [_FULL] * n
    params = hf.get("rope_parameters") or {}
    if not (_FULL in params or _SLIDING in params):
        params = _DEFAULT_ROPE
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    windows = layer_windows({**hf, "layer_types": kinds}, n, kinds)
    windowed = bool(windows["sliding_window"])
    full_dims = _rotated(params.get(_FULL) or {}, head_dim)
    local_dims = _rotated(params.get(_SLIDING) or {}, head_dim) if windowed else full_dims
    gating = hf.get("gating", True)
    mlp_kinds = hf.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
    if len(mlp_kinds) != n or not set(mlp_kinds) <= {"sparse", "dense"}:
        raise UserError(f"mlp_layer_types {mlp_kinds}: expected {n} entries of sparse / dense")
    return ModelConfig(
        **{**shape_fields(hf), **expert_fields(hf, "moe_intermediate_size")}, qk_norm=True, qk_norm_scope="head",
        fused_qkv=True, attn_gate="head" if gating is True or gating == "per-head" else "element",
        attn_gate_fn="softplus", pos_emb="rope", mlp="swiglu", fused_mlp=True, norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=False, moe_gating="sigmoid", moe_expert_bias=True, moe_norm_topk=True, moe_norm_eps=0.0,
        moe_scale=float(hf.get("moe_routed_scaling_factor") or 1.0), moe_shared_hidden=shared, moe_shared_gate=False,
        rope_dims=full_dims if full_dims != head_dim else 0,
        rope_local_dims=local_dims if local_dims != full_dims else 0, **windows,
        **_rope_fields({**hf, "rope_parameters": params}, windowed=windowed),
        **_mlp_layers([k == "sparse" for k in mlp_kinds], hf))


def _routed_alone(cfg: ModelConfig) -> ModelConfig:
    """cfg without the routing bias, whose name moe.py's Qwen-MoE layout does not give."""
    return replace(cfg, moe_expert_bias=False)


def _to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = to_redline(src, _routed_alone(cfg))
    pre = "model." if "model.embed_tokens.weight" in src else ""
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        out[r + "attn.gate.weight"] = src.take(p + "self_attn.g_proj.weight")
        if cfg.layer_has_experts(i):
            out[r + "mlp.expert_bias"] = src.take(p + (_BIAS[0] if p + _BIAS[0] in src else _BIAS[1])).float()
    return out


def _to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = to_hf(state, _routed_alone(cfg), "laguna")
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[p + "self_attn.g_proj.weight"] = state[r + "attn.gate.weight"].contiguous()
        if cfg.layer_has_experts(i):
            bias = state.get(r + "mlp.expert_bias")  # zeros choose as no bias does
            out[p + _BIAS[0]] = torch.zeros(cfg.moe_experts) if bias is None else bias.float()
    return out


def hf_config(cfg: ModelConfig) -> dict:
    full = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(rope_scaling(cfg, "laguna") or {}),
            "partial_rotary_factor": (cfg.rope_dims or cfg.head_dim) / cfg.head_dim}
    local = {"rope_type": "default", "rope_theta": cfg.rope_local_theta,
             "partial_rotary_factor": (cfg.rope_local_dims or cfg.rope_dims or cfg.head_dim) / cfg.head_dim}
    if not cfg.rope_local_theta:  # the windowed layers take the full ones' RoPE
        local = full
    return {
        "model_type": "laguna", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.moe_dense_hidden or cfg.hidden_dim, "moe_intermediate_size": cfg.hidden_dim,
        "shared_expert_intermediate_size": cfg.moe_shared_hidden, "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head, "num_attention_heads_per_layer": [cfg.n_head] * cfg.n_layer,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.context_len, "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "gating": "per-head" if cfg.attn_gate == "head" else "per-element",
        "sliding_window": cfg.sliding_window or cfg.context_len, "num_experts": cfg.moe_experts,
        "num_experts_per_tok": cfg.moe_top_k, "moe_routed_scaling_factor": cfg.moe_scale,
        "moe_apply_router_weight_on_input": False, "moe_router_logit_softcapping": 0.0,
        "output_router_logits": bool(cfg.moe_aux_loss), "router_aux_loss_coef": cfg.moe_aux_loss or 0.001,
        "layer_types": [_SLIDING if cfg.layer_window(i) else _FULL for i in range(cfg.n_layer)],
        "mlp_layer_types": ["sparse" if cfg.layer_has_experts(i) else "dense" for i in range(cfg.n_layer)],
        "rope_parameters": {_FULL: full, _SLIDING: local}, "attention_dropout": 0.0, "initializer_range": 0.02,
        "use_cache": True,
    }


def wants_laguna(cfg: ModelConfig) -> bool:
    """A softplus gate on the heads, or the windowed layers' own partial RoPE: Laguna's alone among the
    architectures redline exports to (every other gate is a sigmoid, every other RoPE one width)."""
    return cfg.attn_gate_fn == "softplus" or bool(cfg.rope_local_dims)


def check_exportable(cfg: ModelConfig) -> None:
    what = ("model.attn_gate_fn=softplus or model.rope_local_dims: Laguna, the one architecture with them redline "
            "exports to,")
    raise_first([
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine
         or cfg.embed_norm or cfg.parallel_residual,
         f"{what} has pre-RMSNorm blocks run in turn (model.norm_position, norm, norm_unit_offset, norm_affine, "
         f"embed_norm, parallel_residual)"),
        (cfg.attn_gate == "none" or cfg.attn_gate_fn != "softplus",
         f"{what} gates its heads by a softplus (model.attn_gate, attn_gate_fn=softplus)"),
        (not cfg.moe_experts or cfg.mlp != "swiglu" or cfg.moe_gating != "sigmoid",
         f"{what} has sigmoid-scored SwiGLU experts (model.moe_experts, mlp, moe_gating=sigmoid)"),
        qk_norm_problem(cfg, what),
        *other_layer_problems(cfg, what),
        (cfg.pos_emb != "rope" or cfg.nope_interval or cfg.rope_layer_theta,
         f"{what} rotates every layer (model.pos_emb, nope_interval, rope_layer_theta)"),
        bias_problem(cfg, what),
        shared_expert_problem(cfg, what),
        (not cfg.moe_norm_topk or cfg.moe_norm_eps,
         f"{what} rescales the chosen scores to sum to 1 without an epsilon (model.moe_norm_topk=true, "
         f"moe_norm_eps=0)"),
        (cfg.moe_groups > 1 or cfg.moe_norm_min or cfg.moe_weight_input or cfg.moe_bias_on_logits,
         f"{what} chooses among all experts by their scores (model.moe_groups, moe_norm_min, moe_weight_input, "
         f"moe_bias_on_logits)"),
        (cfg.attn_sinks or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap or cfg.value_embeddings
         or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.kv_lora_rank,
         f"{what} has no attention sinks, score scale or caps, value embeddings, latent attention or scalars"),
    ])


FAMILY = Family(name="laguna", architecture="LagunaForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=_to_redline, to_hf=_to_hf, ignorable=_ignorable)
