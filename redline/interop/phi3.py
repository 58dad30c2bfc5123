"""Phi-3 (Microsoft's Phi3ForCausalLM: Phi-3-mini, Phi-3.5-mini, Phi-4-mini): Llama's block with q/k/v in one
`qkv_proj` (rows [q; k; v], as redline's fused qkv) and the MLP's gate and up in one `gate_up_proj` (rows
[gate; up], as redline's fused fc), no biases, RMSNorm, SwiGLU, grouped-query attention; RoPE on the first
partial_rotary_factor of each head (Phi-4-mini: 0.75, redline's rope_dims), a sliding window on every layer where
the config gives one (Phi-3-mini-4k: 2047), and LongRoPE scaling (`longrope`, older configs `su`; Ding et al. 2024):
each dimension pair's frequency divided by its own factor and the cos/sin tables scaled.

LongRoPE has two sets of factors: transformers computes every position with `short_factor` while the sequence is
at most original_max_position_embeddings long and switches all of them to `long_factor` past it (llama.cpp by the
context it is given). redline picks by the model's context_len (rope_pair_factors up to rope_original_context,
rope_long_pair_factors past it): an import keeps the context at original_max_position_embeddings, the short
factors, equal to transformers on such sequences; `model.context_len` up to max_position_embeddings (training with
`--init-from`) takes the long ones, equal to transformers on sequences past the original context. Semantics read
from transformers' models/phi3/modeling_phi3.py and modeling_rope_utils.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import _ignorable, _mlp_parts, _qkv, _rope, check_silu, shape_fields
from redline.model import ModelConfig, rope_attention_factor

_LONGROPE_NAMES = ("longrope", "su", "yarn")  # transformers' Phi3Config reads "su" and "yarn" as longrope


def _rope_spec(hf: dict) -> dict:
    params = dict(hf.get("rope_parameters") or {})
    if params.get("rope_type", "default") != "default":
        return params
    return dict(hf.get("rope_scaling") or {})


def _fraction(hf: dict) -> float:
    return float((hf.get("rope_parameters") or {}).get("partial_rotary_factor",
                                                       hf.get("partial_rotary_factor", 1.0)))


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    shape = shape_fields(hf, context_len=4096)
    head_dim = shape["head_size"] or shape["n_embd"] // shape["n_head"]
    fraction = _fraction(hf)
    rotated = int(head_dim * fraction)  # transformers' rotary dimensions
    if rotated <= 0 or rotated % 2:
        raise UserError(f"partial_rotary_factor={fraction} rotates {rotated} of each head's {head_dim} dimensions; "
                        f"redline needs an even number above 0")
    spec = _rope_spec(hf)
    kind = spec.get("rope_type", spec.get("type", "default"))
    theta = float((hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope = {"rope_theta": theta}
    if kind in _LONGROPE_NAMES:
        rope = _longrope(hf, spec, theta, rotated)
        shape["context_len"] = rope["rope_original_context"]
    elif kind != "default":
        rope = _rope(hf)  # the scalings Llama's configs give, read the same way
    return ModelConfig(
        **shape, fused_qkv=True, sliding_window=int(hf.get("sliding_window") or 0), pos_emb="rope",
        rope_dims=0 if rotated == head_dim else rotated, mlp="swiglu", fused_mlp=True, norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=False, **rope)


def _longrope(hf: dict, spec: dict, theta: float, rotated: int) -> dict:
    """ModelConfig's LongRoPE fields, as transformers' _compute_longrope_parameters reads them: the original context
    from the config's top level or the scaling's, the factor from max_position_embeddings over it where not given."""
    original = spec.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings")
    short, long = spec.get("short_factor"), spec.get("long_factor")
    if original is None or short is None:
        raise UserError("LongRoPE scaling needs original_max_position_embeddings and rope_scaling's short_factor")
    if len(short) != rotated // 2 or (long is not None and len(long) != rotated // 2):
        raise UserError(f"LongRoPE's short_factor and long_factor need {rotated // 2} entries (one per rotating "
                        f"dimension pair), got {len(short)} and {len(long or [])}")
    factor = spec.get("factor") or hf.get("max_position_embeddings", original) / original
    return {"rope_theta": theta, "rope_scaling": "longrope", "rope_original_context": int(original),
            "rope_factor": max(float(factor), 1.0), "rope_attention_factor": float(spec.get("attention_factor") or 0.0),
            "rope_pair_factors": tuple(float(f) for f in short),
            "rope_long_pair_factors": tuple(float(f) for f in long or ())}


def wants_phi3(cfg: ModelConfig) -> bool:
    """A model only Phi-3 holds among redline's exports: LongRoPE, or RoPE on part of each head with Llama's block."""
    return cfg.rope_scaling == "longrope" or bool(
        cfg.rope_dims and cfg.norm == "rmsnorm" and cfg.mlp == "swiglu" and not cfg.parallel_residual)


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option that Phi-3, the one architecture with LongRoPE (and Llama's block with partial
    RoPE) redline exports to, does not have."""
    what = "model.rope_scaling=longrope" if cfg.rope_scaling == "longrope" else f"model.rope_dims={cfg.rope_dims}"
    arch = f"{what}: Phi-3, the one architecture with it redline exports to,"
    raise_first([
        (cfg.norm_position != "pre" or cfg.parallel_residual, f"{arch} has pre-norm blocks of sequential sublayers"),
        (cfg.norm != "rmsnorm" or cfg.mlp != "swiglu", f"{arch} has RMSNorm and SwiGLU (model.norm={cfg.norm}, "
                                                       f"model.mlp={cfg.mlp})"),
        (cfg.qk_norm, f"{arch} has no QK-norm (model.qk_norm)"),
        (cfg.bias or cfg.has_qkv_bias, f"{arch} has no biases (model.bias, model.qkv_bias)"),
        (cfg.nope_interval, f"{arch} rotates every layer (model.nope_interval)"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    fraction = (cfg.rope_dims or cfg.head_dim) / cfg.head_dim
    context = cfg.context_len
    scaling = None
    if cfg.rope_scaling == "longrope":
        long = cfg.rope_long_pair_factors or cfg.rope_pair_factors
        context = round(cfg.rope_factor * cfg.rope_original_context) if cfg.rope_long_pair_factors else context
        # the attention factor written as computed: transformers derives its default from max_position_embeddings
        scaling = {"rope_type": "longrope", "short_factor": list(cfg.rope_pair_factors), "long_factor": list(long),
                   "factor": context / cfg.rope_original_context, "attention_factor": rope_attention_factor(cfg),
                   "original_max_position_embeddings": cfg.rope_original_context}
    elif cfg.rope_scaling != "none":
        raise UserError(f"model.rope_scaling={cfg.rope_scaling}: Phi-3 takes LongRoPE scaling only (the Llama "
                        f"architectures take {cfg.rope_scaling}, and RoPE on whole heads)")
    return {
        "model_type": "phi3", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": context,
        "original_max_position_embeddings": cfg.rope_original_context if scaling else context,
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
        "sliding_window": cfg.sliding_window or None,
        "rope_parameters": {**(scaling or {"rope_type": "default"}), "rope_theta": cfg.rope_theta,
                            "partial_rotary_factor": fraction},
        # what transformers before 5 reads instead of rope_parameters
        "rope_theta": cfg.rope_theta, "partial_rotary_factor": fraction, "rope_scaling": scaling,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0, "initializer_range": 0.02,
        "use_cache": True, "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,  # the writer sets them
    }


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
           "norm_f.weight": src.take("model.norm.weight")}
    out.update(take_head(src, cfg))
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        out[r + "attn.qkv.weight"] = src.take(p + "self_attn.qkv_proj.weight")
        out[r + "attn.proj.weight"] = src.take(p + "self_attn.o_proj.weight")
        out[r + "mlp.fc.weight"] = src.take(p + "mlp.gate_up_proj.weight")
        out[r + "mlp.proj.weight"] = src.take(p + "mlp.down_proj.weight")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    V = cfg.vocab_size
    out = {"model.embed_tokens.weight": state["wte.weight"][:V], "model.norm.weight": state["norm_f.weight"]}
    out.update(give_head(state, cfg))
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
        out[p + "self_attn.qkv_proj.weight"] = torch.cat(_qkv(state, r, cfg, "weight"))
        out[p + "self_attn.o_proj.weight"] = state[r + "attn.proj.weight"]
        out[p + "mlp.gate_up_proj.weight"] = torch.cat(_mlp_parts(state, r, cfg, "weight"))
        out[p + "mlp.down_proj.weight"] = state[r + "mlp.proj.weight"]
    return {k: v.contiguous() for k, v in out.items()}


FAMILY = Family(name="phi3", architecture="Phi3ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
