"""Doge (SmallDoge's DogeForCausalLM, model_type "doge"): Llama's block and names with a per-head QK-norm, dynamic
mask attention (each key's scores plus exp(A · softplus(dt_proj(v))) of its values: redline's model.attn_key_bias,
self_attn.A and self_attn.dt_proj) and learned scales on the residual stream (input_residual and
post_attention_residual: model.residual_scales).

Doge keeps, of a context longer than keep_window_size, only each query's top keep_window_size keys by that bias;
redline does not select keys, so an import's context stops at keep_window_size, where the selection never happens.
Its cross-domain mixture of experts (is_moe) is refused. Semantics read from transformers' models/doge/
modeling_doge.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop import llama
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig


def model_config(hf: dict) -> ModelConfig:
    if hf.get("is_moe"):
        raise UserError("is_moe=true: Doge's cross-domain mixture of experts (CDMoE, product-key routing over "
                        "embedded experts) is not implemented in redline")
    if hf.get("attention_dropout") or hf.get("hidden_dropout"):
        raise UserError("attention_dropout / hidden_dropout > 0: redline imports models for inference and training "
                        "without Doge's own dropouts; set them to 0")
    cfg = llama.model_config_for("llama")(hf)
    keep = int(hf.get("keep_window_size", 2048))
    window = hf.get("sliding_window") or 0
    return replace(cfg, qk_norm=True, attn_key_bias=True, residual_scales=True,
                   context_len=min(cfg.context_len, keep), sliding_window=int(window))


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = llama.to_redline(src, cfg)
    pre = llama._prefix(src)
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        out[r + "attn.A"] = src.take(p + "self_attn.A")
        out[r + "attn.dt_proj.weight"] = src.take(p + "self_attn.dt_proj.weight")
        if cfg.has_qkv_bias:
            out[r + "attn.dt_proj.bias"] = src.take(p + "self_attn.dt_proj.bias")
        out[r + "attn_residual"] = src.take(p + "input_residual")
        out[r + "mlp_residual"] = src.take(p + "post_attention_residual")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = llama.to_hf(state, cfg, "llama")
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[p + "self_attn.A"] = state[r + "attn.A"]
        out[p + "self_attn.dt_proj.weight"] = state[r + "attn.dt_proj.weight"]
        if cfg.has_qkv_bias:
            out[p + "self_attn.dt_proj.bias"] = state[r + "attn.dt_proj.bias"]
        out[p + "input_residual"] = state[r + "attn_residual"]
        out[p + "post_attention_residual"] = state[r + "mlp_residual"]
    return {k: v.contiguous() for k, v in out.items()}


def wants_doge(cfg: ModelConfig) -> bool:
    return cfg.attn_key_bias or cfg.residual_scales


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option Doge, the one architecture with key biases and residual scales redline exports
    to, does not have."""
    what = "model.attn_key_bias / residual_scales: Doge, the one architecture with them redline exports to,"
    raise_first([
        (not (cfg.attn_key_bias and cfg.residual_scales), f"{what} has both (model.attn_key_bias, residual_scales)"),
        (cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine or cfg.embed_norm,
         f"{what} has plain RMSNorms"),
        (cfg.mlp != "swiglu" or cfg.moe_experts, f"{what} has a dense SwiGLU MLP (model.mlp=swiglu)"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "head" or cfg.qk_norm_after_rope,
         f"{what} has a per-head QK-norm before RoPE (model.qk_norm)"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_local_theta or cfg.rope_layer_theta,
         f"{what} rotates every layer's whole heads with one RoPE"),
        (cfg.sliding_window_pattern or cfg.window_layers, f"{what} has one window for every layer or none"),
        (cfg.has_qkv_bias != cfg.bias, f"{what} has biases on q/k/v together with o_proj and the MLP, or none"),
        (cfg.attn_scale or cfg.logit_softcap or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier
         or cfg.logit_divisor or cfg.head_bias or cfg.value_embeddings or cfg.layer_scalars or cfg.per_layer_embd
         or cfg.sub_norms or cfg.bitlinear != "off" or cfg.attn_gate != "none" or cfg.v_norm,
         f"{what} has no other scales, caps, gates or norms"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    out = llama.llama_shaped_hf_config(cfg, "doge")
    rope = {"rope_type": "default", "rope_theta": out.pop("rope_theta"), **(out.pop("rope_scaling") or {})}
    out.update(attention_bias=cfg.bias, mlp_bias=cfg.bias, rope_parameters=rope, keep_window_size=cfg.context_len,
               sliding_window=cfg.sliding_window or None, is_moe=False, hidden_dropout=0.0, pad_token_id=None,
               bos_token_id=None, eos_token_id=None)  # the writer sets the token ids
    return out


FAMILY = Family(name="doge", architecture="DogeForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=llama._ignorable)
