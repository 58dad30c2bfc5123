"""PhiMoE (PhimoeForCausalLM, model_type "phimoe": microsoft/Phi-3.5-MoE-instruct, Phi-mini-MoE): Mixtral's names in
Phi-3's attention, as transformers' models/phimoe computes them:
- LayerNorms with biases (input_layernorm, post_attention_layernorm, model.norm: weight and bias, eps from
  rms_norm_eps): model.norm=layernorm, norm_bias;
- q/k/v_proj and o_proj with biases where attention_bias (model.bias: the attention's alone, the experts having
  none), a bias on the head where lm_head_bias (model.head_bias), a sliding window on every layer where
  sliding_window is set;
- RoPE on whole heads, or LongRoPE (rope_parameters' short_factor per rotating pair, the cos/sin tables times
  short_mscale): PhimoeRotaryEmbedding builds its frequencies from the short factors at every length and switches
  only the tables' scale to long_mscale past original_max_position_embeddings, which redline's LongRoPE (long
  factors past the original context) does not compute; the import keeps the original context (model.context_len),
  where the two agree, and leaves long_factor / long_mscale unread (a longer model.context_len is refused);
- the router (block_sparse_moe.gate.weight (E, C)) routes by SparseMixer (model.moe_gating=sparsemixer,
  redline.model.sparsemixer): the best expert, weighted by the softmax over the experts whose logits lie within
  2·router_jitter_noise (relative) of its logit (model.moe_jitter_eps), then the best of the others, weighted alike
  among them; the two weights are not rescaled together. That is transformers' eval-time routing; in training
  transformers samples each choice (Gumbel noise), scales its weight by 1 or 1/3 (Heun's third-order step) with
  the gradient of the unscaled weight, and scales the experts' input by input_jitter_noise twice
  (model.moe_input_jitter): redline's MoE does the same in training, its random draws in transformers' order;
- SwiGLU experts intermediate_size wide (block_sparse_moe.experts.j.w1 / w3 / w2, the Hub's and transformers'
  saved layout).
Refused by name: num_experts_per_tok other than 2 (SparseMixer always takes two), output_router_logits
(transformers' load-balancing loss), an activation other than SiLU, RoPE scalings other than LongRoPE. A redline
model with SparseMixer routing exports as PhiMoE; PEFT adapters on the attention as Llama's (the router is
transformers' PhimoeTopKRouter, whose forward returns a triple, and the experts no Linear layers); not as GGUF
(llama.cpp's phimoe weights the top 2 by a softmax rescaled over the two).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, bias_or_zeros, give_head, pad_rows, raise_first,
                                      take_head)
from redline.interop.llama import _qkv, _rope, check_silu, shape_fields
from redline.interop.moe import experts_to_hf, experts_to_redline
from redline.model import ModelConfig, rope_attention_factor

_LONGROPE = ("longrope", "su")


def _rope_fields(hf: dict, head_dim: int) -> tuple[dict, int | None]:
    """(ModelConfig's RoPE fields, the context they hold to: the original one with LongRoPE, else None)."""
    params = dict(hf.get("rope_parameters") or {})
    spec = params if params.get("rope_type", "default") != "default" else dict(hf.get("rope_scaling") or {})
    kind = spec.get("rope_type", spec.get("type", "default"))
    theta = float(params.get("rope_theta", hf.get("rope_theta", 1e6)))
    if kind not in _LONGROPE:
        if kind != "default":
            raise UserError(f"RoPE scaling {kind!r} on a PhiMoE model: transformers' PhimoeRotaryEmbedding scales its "
                            f"tables by short_mscale / long_mscale, which redline takes with LongRoPE alone")
        return _rope({**hf, "rope_parameters": {**params, "rope_theta": theta}}), None
    original = spec.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings")
    short, mscale = spec.get("short_factor"), spec.get("short_mscale")
    if original is None or short is None or mscale is None:
        raise UserError("LongRoPE on a PhiMoE model needs original_max_position_embeddings, short_factor and "
                        "short_mscale in rope_parameters")
    if len(short) != head_dim // 2:
        raise UserError(f"LongRoPE's short_factor needs {head_dim // 2} entries (one per rotating dimension pair), "
                        f"got {len(short)}")
    factor = spec.get("factor") or hf.get("max_position_embeddings", original) / original
    return {"rope_theta": theta, "rope_scaling": "longrope", "rope_original_context": int(original),
            "rope_factor": max(float(factor), 1.0), "rope_attention_factor": float(mscale),
            "rope_pair_factors": tuple(float(f) for f in short)}, int(original)


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    if int(hf.get("num_experts_per_tok") or 2) != 2:
        raise UserError(f"num_experts_per_tok={hf['num_experts_per_tok']}: transformers' PhiMoE router (SparseMixer) "
                        f"always takes two experts; set it to 2")
    if hf.get("output_router_logits"):
        raise UserError("output_router_logits=true: redline has no load-balancing loss with SparseMixer routing; set "
                        "it to false")
    shape = shape_fields(hf, context_len=4096 * 32)
    head_dim = shape["head_size"] or shape["n_embd"] // shape["n_head"]
    rope, original = _rope_fields(hf, head_dim)
    if original is not None:
        shape["context_len"] = min(shape["context_len"], original)
    count = hf.get("num_local_experts") or 16
    return ModelConfig(
        **shape, fused_qkv=True, sliding_window=int(hf.get("sliding_window") or 0), pos_emb="rope", mlp="swiglu",
        fused_mlp=True, norm="layernorm", norm_bias=True, norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=bool(hf.get("attention_bias", False)),
        head_bias=bool(hf.get("lm_head_bias", False)), moe_experts=int(count), moe_top_k=2,
        moe_gating="sparsemixer", moe_norm_topk=False,
        moe_jitter_eps=float(hf.get("router_jitter_noise", 0.01) or 0.0),
        moe_input_jitter=float(hf.get("input_jitter_noise") or 0.0), **rope)


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"norm_f.weight": src.take("model.norm.weight"), "norm_f.bias": src.take("model.norm.bias"),
           "wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg), **take_head(src, cfg)}
    if cfg.head_bias:
        out["lm_head.bias"] = pad_rows(src.take("lm_head.bias"), cfg)
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        attn = p + "self_attn."
        for ours, theirs in (("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm")):
            for kind in ("weight", "bias"):
                out[f"{r}{ours}.{kind}"] = src.take(f"{p}{theirs}.{kind}")
        for kind in ("weight", "bias") if cfg.bias else ("weight",):
            out[f"{r}attn.qkv.{kind}"] = torch.cat([src.take(f"{attn}{x}_proj.{kind}") for x in "qkv"])
            out[f"{r}attn.proj.{kind}"] = src.take(f"{attn}o_proj.{kind}")
        out.update(experts_to_redline(src, p, r, cfg))  # Mixtral's names: block_sparse_moe.*
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """redline's state -> PhiMoE's names; attention_bias covers q/k/v and o_proj together, so a model with biases on
    some of them gets zeros for the others, and LayerNorms or a head without biases get zero ones."""
    norm = state["norm_f.weight"]
    out = {"model.norm.weight": norm, "model.norm.bias": bias_or_zeros(state, "norm_f.bias", norm),
           "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size], **give_head(state, cfg)}
    if cfg.head_bias:
        out["lm_head.bias"] = state["lm_head.bias"][:cfg.vocab_size]
    attention_bias = cfg.bias or cfg.has_qkv_bias
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        attn = p + "self_attn."
        for ours, theirs in (("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm")):
            weight = state[f"{r}{ours}.weight"]
            out[f"{p}{theirs}.weight"], out[f"{p}{theirs}.bias"] = weight, bias_or_zeros(state, f"{r}{ours}.bias",
                                                                                          weight)
        weights = _qkv(state, r, cfg, "weight")
        biases = _qkv(state, r, cfg, "bias") if cfg.has_qkv_bias else [w.new_zeros(w.shape[0]) for w in weights]
        for x, w, b in zip("qkv", weights, biases):
            out[f"{attn}{x}_proj.weight"] = w
            if attention_bias:
                out[f"{attn}{x}_proj.bias"] = b
        out[attn + "o_proj.weight"] = state[r + "attn.proj.weight"]
        if attention_bias:
            out[attn + "o_proj.bias"] = bias_or_zeros(state, r + "attn.proj.bias", state[r + "attn.proj.weight"])
        out.update(experts_to_hf(state, p, r, replace(cfg, moe_expert_bias=False), "mixtral"))
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(cfg: ModelConfig) -> dict:
    params = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "longrope":  # the short factors at every length (PhimoeRotaryEmbedding's): as both sets
        factors, mscale = list(cfg.rope_pair_factors), rope_attention_factor(cfg)
        params = {"rope_type": "longrope", "rope_theta": cfg.rope_theta, "short_factor": factors,
                  "long_factor": factors, "short_mscale": mscale, "long_mscale": mscale,
                  "original_max_position_embeddings": cfg.rope_original_context}
    return {
        "model_type": "phimoe", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "hidden_act": "silu", "max_position_embeddings": cfg.context_len,
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "rope_parameters": params,
        "sliding_window": cfg.sliding_window or None, "attention_bias": cfg.bias or cfg.has_qkv_bias,
        "lm_head_bias": cfg.head_bias, "num_local_experts": cfg.moe_experts, "num_experts_per_tok": 2,
        "router_jitter_noise": cfg.moe_jitter_eps, "input_jitter_noise": cfg.moe_input_jitter,
        "output_router_logits": False, "router_aux_loss_coef": 0.001, "attention_dropout": 0.0,
        "initializer_range": 0.02, "use_cache": True, "pad_token_id": None, "bos_token_id": None,
        "eos_token_id": None,  # the writer sets them
    }


def wants_phimoe(cfg: ModelConfig) -> bool:
    """SparseMixer routing: PhiMoE's alone."""
    return cfg.moe_gating == "sparsemixer"


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with SparseMixer routing that PhiMoE does not have."""
    what = "SparseMixer routing (model.moe_gating=sparsemixer): PhiMoE, the architecture with it,"
    named = [name for name in (
        "norm_unit_offset", "embed_norm", "embed_scale", "embed_multiplier", "residual_multiplier", "logit_divisor",
        "logit_softcap", "attn_softcap", "attn_scale", "attn_sinks", "value_embeddings", "nope_interval",
        "rope_layer_theta", "rope_local_theta", "sliding_window_pattern", "window_layers", "qk_norm", "rope_dims",
        "moe_layers", "moe_dense_layers", "moe_shared_hidden", "moe_bias", "parallel_residual", "kv_lora_rank",
        "attn_chunk", "conv_layers", "delta_layers", "mlp_free_layers", "mixer_free_layers") if getattr(cfg, name, None)]
    raise_first([
        (bool(named), f"model.{named[0] if named else ''} with {what} has no such option"),
        (cfg.norm_position != "pre" or cfg.norm != "layernorm" or not cfg.norm_affine,
         f"{what} has pre-LayerNorm blocks (model.norm={cfg.norm}, norm_position={cfg.norm_position}, "
         f"norm_affine={cfg.norm_affine})"),
        (cfg.mlp != "swiglu", f"{what} has SwiGLU experts (model.mlp={cfg.mlp})"),
        (cfg.pos_emb != "rope" or cfg.rope_scaling not in ("none", "longrope"),
         f"{what} uses RoPE, unscaled or LongRoPE (model.pos_emb={cfg.pos_emb}, rope_scaling={cfg.rope_scaling})"),
        (cfg.head_dim * cfg.n_head != cfg.n_embd, f"{what} has heads n_embd / n_head wide (model.head_size)"),
        (cfg.attn_gate != "none", f"{what} has no gate on its heads (model.attn_gate={cfg.attn_gate})"),
    ])


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


FAMILY = Family(name="phimoe", architecture="PhimoeForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
