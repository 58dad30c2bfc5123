"""Granite (IBM's GraniteForCausalLM, model_type "granite": granite-3.x-2b/8b and their instruct models): the Llama
layout's names and block with four scalars of its own, each a ModelConfig field (semantics read from transformers'
models/granite/modeling_granite.py):
- embedding_multiplier: the token embeddings times it (embed_multiplier);
- residual_multiplier: each sublayer's output times it before the residual add (residual_multiplier);
- attention_multiplier: the attention scores' scale in place of 1/sqrt(head_dim) (attn_scale);
- logits_scaling: the head's logits divided by it (logit_divisor).
A multiplier of 1 is stored as redline's 0 (none), so a model that has none runs on the fused decode block.
"""

from __future__ import annotations

from redline.errors import UserError
from redline.interop.families import Family, raise_first
from redline.interop.llama import _ignorable, hf_config_for, model_config_for, to_hf, to_redline
from redline.model import ModelConfig

GRANITE_FIELDS = ("embed_multiplier", "residual_multiplier", "logit_divisor")


def _factor(hf: dict, key: str) -> float:
    value = hf.get(key)
    value = 1.0 if value is None else float(value)
    if value <= 0:
        raise UserError(f"{key}={value}: Granite's scalars must be above 0")
    return 0.0 if value == 1.0 else value


def model_config(hf: dict) -> ModelConfig:
    from dataclasses import replace

    scale = hf.get("attention_multiplier")
    return replace(model_config_for("granite")(hf), embed_multiplier=_factor(hf, "embedding_multiplier"),
                   residual_multiplier=_factor(hf, "residual_multiplier"),
                   logit_divisor=_factor(hf, "logits_scaling"), attn_scale=1.0 if scale is None else float(scale))


def wants_granite(cfg: ModelConfig) -> bool:
    """A model only Granite holds: one of its scalars, or a score scale on a pre-norm block with none of Gemma's
    options (families.export_family routes Gemma's own)."""
    gemma = (cfg.norm_unit_offset or cfg.embed_scale or cfg.sliding_window_pattern or cfg.rope_local_theta
             or cfg.mlp == "geglu")
    return any(getattr(cfg, name) for name in GRANITE_FIELDS) or bool(
        cfg.attn_scale and cfg.norm_position == "pre" and not gemma)


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option that Granite, the one architecture with these scalars, does not have."""
    names = [f"model.{name}" for name in (*GRANITE_FIELDS, "attn_scale") if getattr(cfg, name)]
    what = (f"{', '.join(names)}: Granite, the one architecture with {'it' if len(names) == 1 else 'them'} redline "
            f"exports to,")
    raise_first([
        (cfg.norm_position != "pre", f"{what} has pre-norm blocks (model.norm_position={cfg.norm_position})"),
        (cfg.norm != "rmsnorm" or cfg.mlp != "swiglu", f"{what} has RMSNorm and SwiGLU (model.norm={cfg.norm}, "
                                                       f"model.mlp={cfg.mlp})"),
        (cfg.pos_emb != "rope" or cfg.rope_dims, f"{what} rotates whole heads with RoPE"),
        (cfg.parallel_residual, f"{what} has sequential sublayers (model.parallel_residual)"),
        (cfg.qk_norm, f"{what} has no QK-norm (model.qk_norm)"),
        (cfg.sliding_window > 0, f"{what} attends to the whole context (model.sliding_window)"),
        (cfg.nope_interval, f"{what} rotates every layer (model.nope_interval)"),
        (cfg.norm_unit_offset or cfg.embed_scale, f"{what} has none of Gemma's norms or embedding scale"),
        (cfg.has_qkv_bias != cfg.bias, f"{what} has biases on every Linear layer or none (model.qkv_bias)"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    out = hf_config_for("llama")(cfg)
    out.pop("pretraining_tp", None)
    return {**out, "model_type": "granite", "embedding_multiplier": cfg.embed_multiplier or 1.0,
            "residual_multiplier": cfg.residual_multiplier or 1.0, "logits_scaling": cfg.logit_divisor or 1.0,
            "attention_multiplier": cfg.attn_scale or cfg.head_dim ** -0.5}


FAMILY = Family(name="granite", architecture="GraniteForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
