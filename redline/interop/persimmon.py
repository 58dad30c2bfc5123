"""Persimmon (Adept's PersimmonForCausalLM, model_type "persimmon": persimmon-8b-base, persimmon-8b-chat): GPT-NeoX's
attention layout in Llama's sequential pre-norm block.

- `self_attn.query_key_value` holds q, k and v per head, (heads, 3, head width) in its rows, regrouped into redline's
  fused [q; k; v] on the way in and back on the way out (as gpt_neox.py does); multi-head, biases on every Linear
  layer but the head;
- `qk_layernorm` (its default true): each head's q and k through a LayerNorm of head width with a weight and a bias
  (`q_layernorm`, `k_layernorm`, at layer_norm_eps) before RoPE: redline's qk_norm with qk_layernorm;
- RoPE on the first partial_rotary_factor of each head (0.5 where the config gives none, as PersimmonConfig
  defaults it) in (first half, second half) pairs: rope_dims;
- LayerNorms with biases (input_layernorm, post_attention_layernorm, final_layernorm) and a plain ReLU² MLP,
  dense_4h_to_h(relu(dense_h_to_4h(x))²), both with biases.
Semantics read from transformers' models/persimmon/modeling_persimmon.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, bias_or_zeros, give_head, give_weights_and_biases,
                                      multi_head_problems, pad_rows, qkv_apart, raise_first, take_head,
                                      take_weights_and_biases)
from redline.interop.gpt_neox import _regroup
from redline.interop.llama import _rope, rope_scaling
from redline.model import ModelConfig

_LAYER = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm", "attn.proj": "self_attn.dense",
          "mlp.fc": "mlp.dense_h_to_4h", "mlp.proj": "mlp.dense_4h_to_h"}
_QK = {"attn.q_norm": "self_attn.q_layernorm", "attn.k_norm": "self_attn.k_layernorm"}


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "relu2")
    if act != "relu2":
        raise UserError(f"hidden_act={act!r}: Persimmon's MLP is ReLU² (relu2); redline's Persimmon has no other")
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = width // heads
    params = hf.get("rope_parameters") or {}
    fraction = float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.5)))
    rotated = int(head_dim * fraction)  # transformers' rotary_ndims
    if rotated <= 0 or rotated % 2:
        raise UserError(f"partial_rotary_factor={fraction} rotates {rotated} of each head's {head_dim} dimensions; "
                        f"redline needs an even number above 0")
    rope = _rope(hf)
    if rope.get("rope_scaling", "none") not in ("none", "linear"):
        raise UserError(f"RoPE scaling {rope['rope_scaling']!r} on a Persimmon model (part of each head rotated) is "
                        f"not supported; redline reads it unscaled or linearly scaled")
    qk = bool(hf.get("qk_layernorm", True))
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 16384),
        n_layer=hf["num_hidden_layers"], n_embd=width, n_head=heads, n_kv_head=None, qk_norm=qk, qk_layernorm=qk,
        fused_qkv=True, pos_emb="rope", rope_dims=0 if rotated == head_dim else rotated, mlp="relu2",
        mlp_hidden=hf["intermediate_size"], norm="layernorm", norm_bias=True,
        norm_eps=float(hf.get("layer_norm_eps", 1e-5)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=True, **rope)


def wants_persimmon(cfg: ModelConfig) -> bool:
    """A LayerNorm QK-norm, or RoPE on part of each head with LayerNorm and a ReLU² MLP in sequential pre-norm
    blocks: Persimmon's alone (Jais 2 rotates whole heads, Nemotron's LayerNorms scale by 1 + weight)."""
    return bool(cfg.qk_layernorm or (cfg.pos_emb == "rope" and cfg.rope_dims and cfg.norm == "layernorm"
                                     and cfg.mlp == "relu2" and not cfg.norm_unit_offset
                                     and cfg.norm_position == "pre" and not cfg.parallel_residual))


def check_exportable(cfg: ModelConfig) -> None:
    when = "a LayerNorm QK-norm or ReLU² with partial RoPE and LayerNorm"
    what = f"{when}: Persimmon, the one architecture with them redline exports to,"
    named = [name for name in (
        "qk_layernorm_per_head", "norm_unit_offset", "embed_norm", "embed_scale", "embed_multiplier", "residual_multiplier", "logit_divisor",
        "logit_softcap", "attn_softcap", "attn_scale", "attn_sinks", "value_embeddings", "moe_experts", "conv_layers",
        "delta_layers", "mlp_free_layers", "mixer_free_layers", "nope_interval", "rope_layer_theta",
        "rope_local_theta", "head_bias", "parallel_residual", "qk_norm_after_rope") if getattr(cfg, name)]
    raise_first([
        (bool(named), f"{what} has no model.{named[0] if named else ''}"),
        (cfg.norm != "layernorm" or not cfg.norm_affine or cfg.norm_position != "pre",
         f"{what} has learned pre-LayerNorms (model.norm={cfg.norm}, norm_affine, norm_position)"),
        (cfg.mlp != "relu2", f"{what} has a ReLU² MLP (model.mlp={cfg.mlp})"),
        (cfg.qk_norm and not cfg.qk_layernorm, f"{what} normalizes q and k by LayerNorms (model.qk_layernorm)"),
        (cfg.attn_gate != "none", f"{what} has no gate on its heads (model.attn_gate)"),
        (cfg.pos_emb != "rope" or cfg.rope_scaling not in ("none", "linear"),
         f"{what} rotates with RoPE, unscaled or linearly scaled (model.pos_emb, rope_scaling)"),
    ] + multi_head_problems(cfg, when, "Persimmon"))


def hf_config(cfg: ModelConfig) -> dict:
    scaling = rope_scaling(cfg, "persimmon") or {"rope_type": "default"}
    return {
        "model_type": "persimmon", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "hidden_act": "relu2", "max_position_embeddings": cfg.context_len, "layer_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "qk_layernorm": cfg.qk_layernorm,
        "rope_parameters": {**scaling, "rope_theta": cfg.rope_theta,
                            "partial_rotary_factor": (cfg.rope_dims or cfg.head_dim) / cfg.head_dim},
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    }


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
           "norm_f.weight": src.take("model.final_layernorm.weight"),
           "norm_f.bias": src.take("model.final_layernorm.bias"), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[f"{r}attn.qkv.{kind}"] = _regroup(src.take(f"{p}self_attn.query_key_value.{kind}"), cfg,
                                                  to_neox=False)
        out.update(take_weights_and_biases(src, {**_LAYER, **(_QK if cfg.qk_layernorm else {})}, r, p))
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """redline's tensors in Persimmon's names, every bias the model lacks (LayerNorms' too) as zeros."""
    out = {"model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size],
           "model.final_layernorm.weight": state["norm_f.weight"],
           "model.final_layernorm.bias": bias_or_zeros(state, "norm_f.bias", state["norm_f.weight"]),
           **give_head(state, cfg)}
    for i in range(cfg.n_layer):
        r, p = f"blocks.{i}.", f"model.layers.{i}."
        apart = qkv_apart(state, r, cfg, "")
        for kind in ("weight", "bias"):
            stacked = torch.cat([apart[f"{x}_proj.{kind}"] for x in "qkv"])
            out[f"{p}self_attn.query_key_value.{kind}"] = _regroup(stacked, cfg, to_neox=True)
        out.update(give_weights_and_biases(state, {**_LAYER, **(_QK if cfg.qk_layernorm else {})}, r, p))
    return {k: v.contiguous() for k, v in out.items()}


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


FAMILY = Family(name="persimmon", architecture="PersimmonForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
