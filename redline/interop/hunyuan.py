"""Hunyuan dense (Tencent's HunYuanDenseV1ForCausalLM, model_type "hunyuan_v1_dense": Hunyuan-0.5B/1.8B/4B/7B):
Llama's block with a per-head RMSNorm on q and k applied after RoPE (redline's qk_norm_after_rope; Qwen3 normalizes
before), named `query_layernorm` and `key_layernorm`.

Its released configs label their RoPE "dynamic" with a fixed `alpha`, which only stretches the base: theta ·
alpha ** (head_dim / (head_dim - 2)) (transformers' ntk_alpha), so it imports as that base and exports as a plain
one with the same frequencies. Semantics read from transformers' models/hunyuan_v1_dense/modeling_hunyuan_v1_dense.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, raise_first
from redline.interop.llama import _ignorable, _rope, check_silu, hf_config_for, shape_fields, to_hf, to_redline
from redline.model import ModelConfig

_NORMS = {"self_attn.query_layernorm.": "self_attn.q_norm.", "self_attn.key_layernorm.": "self_attn.k_norm."}


def _theirs_to_llama(name: str) -> str:
    for theirs, llama in _NORMS.items():
        name = name.replace(theirs, llama)
    return name


def _rope_fields(hf: dict, head_dim: int) -> dict:
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    alpha = params.get("alpha")
    if params.get("rope_type", params.get("type")) == "dynamic" and alpha:
        theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
        return {"rope_theta": theta * float(alpha) ** (head_dim / (head_dim - 2))}
    return _rope(hf)


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    if hf.get("attention_bias"):  # q/k/v/o biases with none in the MLP: redline's `bias` covers o_proj and the MLP
        raise UserError("attention_bias=true: Hunyuan then has a bias on o_proj but none in its MLP, a mix redline "
                        "does not have (biases on q/k/v alone, or on every Linear layer)")
    if hf.get("use_qk_norm") is False:
        raise UserError("use_qk_norm=false: redline's Hunyuan has its QK-norm after RoPE; this model has none")
    shape = shape_fields(hf)
    head_dim = shape["head_size"] or shape["n_embd"] // shape["n_head"]
    return ModelConfig(
        **shape, qk_norm=True, qk_norm_after_rope=True, fused_qkv=True, pos_emb="rope", mlp="swiglu",
        fused_mlp=True, norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False, **_rope_fields(hf, head_dim))


def check_exportable(cfg: ModelConfig) -> None:
    what = "model.qk_norm_after_rope: Hunyuan, the one architecture with it redline exports to,"
    raise_first([
        (cfg.norm_position != "pre" or cfg.parallel_residual, f"{what} has pre-norm blocks of sequential sublayers"),
        (cfg.norm != "rmsnorm" or cfg.mlp != "swiglu", f"{what} has RMSNorm and SwiGLU (model.norm={cfg.norm}, "
                                                       f"model.mlp={cfg.mlp})"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval, f"{what} rotates every layer's whole heads"),
        (cfg.sliding_window > 0, f"{what} attends to the whole context (model.sliding_window)"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no biases (model.bias, model.qkv_bias)"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    out = hf_config_for("llama")(cfg)
    for key in ("pretraining_tp", "mlp_bias"):
        out.pop(key, None)
    return {**out, "model_type": "hunyuan_v1_dense", "attention_bias": False, "pad_token_id": None,
            "bos_token_id": None, "eos_token_id": None, "eod_token_id": None}  # the writer sets the token ids


def _to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    # Llama's map over the norms' Llama names, each read from (and marked used in) the source under its own name
    theirs = {_theirs_to_llama(name): name for name in src.names}
    return to_redline(TensorSource(theirs, lambda name: src.take(theirs[name]), src.where), cfg)


def _to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    renames = {llama: theirs for theirs, llama in _NORMS.items()}
    out = {}
    for name, t in to_hf(state, cfg).items():
        for llama, theirs in renames.items():
            name = name.replace(llama, theirs)
        out[name] = t
    return out


FAMILY = Family(name="hunyuan_v1_dense", architecture="HunYuanDenseV1ForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=_to_redline, to_hf=_to_hf, ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# Hunyuan MoE (HunYuanMoEV1ForCausalLM, model_type "hunyuan_v1_moe": Hunyuan-A13B): the dense model's attention (QK-norm
# after RoPE) with every layer's MLP a mixture of experts: a router `mlp.gate.wg` (E, C), softmax scores, the top
# moe_topk rescaled to sum to 1, SwiGLU experts intermediate_size wide (mlp.experts.j.gate_proj / up_proj /
# down_proj, or stacked) and an ungated SwiGLU shared MLP as wide (mlp.shared_mlp.*: moe_shared_hidden,
# moe_shared_gate false), as transformers' HunYuanMoEV1Moe computes it. A count or top k per layer (lists) is refused
# by name. Semantics read from transformers' models/hunyuan_v1_moe/modeling_hunyuan_v1_moe.py.

_MOE_NAMES = {**_NORMS, "mlp.gate.wg.": "mlp.gate.", "mlp.shared_mlp.": "mlp.shared_expert."}  # theirs -> moe.py's


def _per_layer(hf: dict, key: str, default: int) -> int:
    value = hf.get(key, default)
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise UserError(f"{key}={value}: a different value per layer; redline's mixtures of experts take one for "
                            f"every layer")
        value = value[0]
    return int(value)


def moe_model_config(hf: dict) -> ModelConfig:
    experts, top_k = _per_layer(hf, "num_experts", 1), _per_layer(hf, "moe_topk", 1)
    dense = model_config(hf)
    return replace(dense, moe_experts=experts, moe_top_k=top_k, moe_norm_topk=True,
                   moe_shared_hidden=dense.hidden_dim, moe_shared_gate=False,
                   moe_aux_loss=float(hf.get("router_aux_loss_coef") or 0.001) if hf.get("output_router_logits")
                   else 0.0)


def wants_hunyuan_moe(cfg: ModelConfig) -> bool:
    return bool(cfg.moe_experts and cfg.qk_norm_after_rope)


def check_moe_exportable(cfg: ModelConfig) -> None:
    check_exportable(cfg)
    what = "model.qk_norm_after_rope with model.moe_experts: Hunyuan MoE, the one architecture with them redline " \
           "exports to,"
    raise_first([
        (cfg.moe_gating != "softmax" or cfg.moe_expert_bias or not cfg.moe_norm_topk or cfg.moe_norm_min
         or cfg.moe_scale != 1.0 or cfg.moe_groups > 1 or cfg.moe_bias,
         f"{what} rescales the top k of its softmax scores to sum to 1, with no bias, floor, scale or groups"),
        (cfg.moe_shared_hidden != cfg.hidden_dim or cfg.moe_shared_gate,
         f"{what} has an ungated shared MLP as wide as its experts (model.moe_shared_hidden=mlp_hidden, "
         f"moe_shared_gate=false)"),
        (cfg.moe_dense_layers or cfg.moe_layers, f"{what} has experts on every layer"),
        (cfg.attn_sinks or cfg.attn_gate != "none" or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap
         or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.head_bias
         or cfg.value_embeddings or cfg.conv_layers or cfg.delta_layers,
         f"{what} has no sinks, gates, scales, caps, scalars or other token mixers"),
    ])


def moe_hf_config(cfg: ModelConfig) -> dict:
    return {**hf_config(cfg), "model_type": "hunyuan_v1_moe", "num_experts": cfg.moe_experts, "moe_topk": cfg.moe_top_k,
            "output_router_logits": bool(cfg.moe_aux_loss), "router_aux_loss_coef": cfg.moe_aux_loss or 0.001}


def _moe_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    theirs = {}
    for name in src.names:
        ours = name
        for old, new in _MOE_NAMES.items():
            ours = ours.replace(old, new)
        theirs[ours] = name
    return to_redline(TensorSource(theirs, lambda name: src.take(theirs[name]), src.where), cfg)


def _moe_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {}  # llama.to_hf names the experts as Qwen-MoE's, which Hunyuan's are
    for name, t in to_hf(state, cfg, "qwen2_moe").items():
        for theirs, ours in _MOE_NAMES.items():
            name = name.replace(ours, theirs)
        out[name] = t
    return out


MOE_FAMILY = Family(name="hunyuan_v1_moe", architecture="HunYuanMoEV1ForCausalLM", model_config=moe_model_config,
                    hf_config=moe_hf_config, to_redline=_moe_to_redline, to_hf=_moe_to_hf, ignorable=_ignorable)
