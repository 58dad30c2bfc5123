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

from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, raise_first
from redline.interop.llama import _ignorable, llama_shaped_hf_config, model_config_for, to_hf, to_llama_hf, to_redline
from redline.model import ModelConfig

GRANITE_FIELDS = ("embed_multiplier", "residual_multiplier", "logit_divisor")


def _factor(hf: dict, key: str) -> float:
    value = hf.get(key)
    value = 1.0 if value is None else float(value)
    if value <= 0:
        raise UserError(f"{key}={value}: Granite's scalars must be above 0")
    return 0.0 if value == 1.0 else value


def model_config(hf: dict) -> ModelConfig:
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


def check_exportable(cfg: ModelConfig, swa: bool = False) -> None:
    """A UserError naming the option that Granite, the one architecture with these scalars, does not have (swa:
    Granite SWA, which has its windows and per-layer RoPE bases besides)."""
    names = [f"model.{name}" for name in (*GRANITE_FIELDS, "attn_scale", "attn_sinks") if getattr(cfg, name)]
    what = (f"{', '.join(names)}: Granite{' SWA' if swa else ''}, the one architecture with "
            f"{'it' if len(names) == 1 else 'them'} redline exports to,")
    raise_first([
        (cfg.norm_position != "pre", f"{what} has pre-norm blocks (model.norm_position={cfg.norm_position})"),
        (cfg.norm != "rmsnorm" or cfg.mlp != "swiglu", f"{what} has RMSNorm and SwiGLU (model.norm={cfg.norm}, "
                                                       f"model.mlp={cfg.mlp})"),
        (cfg.pos_emb == "learned" or cfg.rope_dims, f"{what} rotates whole heads with RoPE or has no positions"),
        (cfg.parallel_residual, f"{what} has sequential sublayers (model.parallel_residual)"),
        (cfg.qk_norm, f"{what} has no QK-norm (model.qk_norm)"),
        (cfg.sliding_window > 0 and not swa, f"{what} attends to the whole context (model.sliding_window)"),
        (cfg.nope_interval and not swa, f"{what} rotates every layer (model.nope_interval)"),
        (swa and cfg.rope_local_theta and cfg.rope_scaling != "none",
         f"{what} scales every layer's RoPE alike (model.rope_local_theta, unscaled, with model.rope_scaling)"),
        (swa and (cfg.attn_softcap or cfg.value_embeddings or cfg.moe_experts or cfg.conv_layers),
         f"{what} has no score cap, value embeddings, experts or short convolutions"),
        (cfg.norm_unit_offset or cfg.embed_scale, f"{what} has none of Gemma's norms or embedding scale"),
        (cfg.has_qkv_bias != cfg.bias, f"{what} has biases on every Linear layer or none (model.qkv_bias)"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    return {**llama_shaped_hf_config(cfg, "granite"), "embedding_multiplier": cfg.embed_multiplier or 1.0,
            "residual_multiplier": cfg.residual_multiplier or 1.0, "logits_scaling": cfg.logit_divisor or 1.0,
            "attention_multiplier": cfg.attn_scale or cfg.head_dim ** -0.5}


FAMILY = Family(name="granite", architecture="GraniteForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# Granite 4.0's dense models (GraniteMoeHybridForCausalLM, model_type "granitemoehybrid", with attention layers only
# and no experts: granite-4.0-350m, granite-4.0-1b, granite-4.0-micro): Granite's block, its SwiGLU MLP named
# shared_mlp with gate and up as one input_linear (rows [gate; up], as redline's fused fc) and down as output_linear,
# and RoPE or no positions at all (position_embedding_type None: the NoPE form). Semantics read from transformers'
# models/granitemoehybrid/modeling_granitemoehybrid.py; the Mamba-2 layers and the experts of its hybrid and MoE
# models are refused by name.

_FUSED, _DOWN = "shared_mlp.input_linear.weight", "shared_mlp.output_linear.weight"


def hybrid_model_config(hf: dict) -> ModelConfig:
    kinds = set(hf.get("layer_types") or hf.get("layers_block_type") or ["mamba"])  # (transformers' default: Mamba)
    if not kinds <= {"attention", "full_attention"}:
        raise UserError(f"layer_types {sorted(kinds)}: redline runs Granite 4.0's attention-only models; the Mamba-2 "
                        f"layers of its hybrid (-h) models are not supported")
    if hf.get("num_local_experts"):
        raise UserError(f"num_local_experts={hf['num_local_experts']}: Granite 4.0's experts beside its shared MLP "
                        f"are not supported (redline runs its dense models, and GraniteMoE's experts: granitemoe)")
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: Granite 4.0's MLP has no biases, and redline's biases cover both")
    rope = hf.get("position_embedding_type")
    if rope not in (None, "rope", "nope"):
        raise UserError(f"position_embedding_type={rope!r}: redline reads rope or none")
    cfg = model_config({**hf, "intermediate_size": hf["shared_intermediate_size"], "mlp_bias": False})
    return cfg if rope == "rope" else replace(cfg, pos_emb="none")


def _llama_view(src: TensorSource) -> TensorSource:
    """src with each block's input_linear seen as Llama's gate_proj and up_proj (its halves) and output_linear as
    down_proj, so that llama.py's map reads it; the real tensors are taken (marked used) as the halves are read."""
    names: dict[str, tuple[str, int | None]] = {}
    for name in src.names:
        if name.endswith(_FUSED):
            base = name[: -len(_FUSED)] + "mlp."
            names[base + "gate_proj.weight"], names[base + "up_proj.weight"] = (name, 0), (name, 1)
        else:
            names[name.replace(_DOWN, "mlp.down_proj.weight")] = (name, None)

    def read(name: str):
        real, half = names[name]
        t = src.take(real)
        return t if half is None else t.chunk(2)[half]

    return TensorSource(names, read, src.where)


def hybrid_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    return to_redline(_llama_view(src), cfg)


def hybrid_to_hf(state, cfg: ModelConfig) -> dict:
    out = to_hf(state, cfg)
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        out[p + _FUSED] = torch.cat([out.pop(p + "mlp.gate_proj.weight"), out.pop(p + "mlp.up_proj.weight")])
        out[p + _DOWN] = out.pop(p + "mlp.down_proj.weight")
    return out


def hybrid_hf_config(cfg: ModelConfig) -> dict:
    out = hf_config(cfg)
    out.pop("mlp_bias", None)
    return {**out, "model_type": "granitemoehybrid", "shared_intermediate_size": cfg.hidden_dim,
            "num_local_experts": 0, "num_experts_per_tok": 0, "layer_types": ["attention"] * cfg.n_layer,
            "position_embedding_type": "rope" if cfg.pos_emb == "rope" else None}


HYBRID_FAMILY = Family(name="granitemoehybrid", architecture="GraniteMoeHybridForCausalLM",
                       model_config=hybrid_model_config, hf_config=hybrid_hf_config, to_redline=hybrid_to_redline,
                       to_hf=hybrid_to_hf, ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# GraniteMoE (GraniteMoeForCausalLM, model_type "granitemoe": granite-3.0-1b-a400m, granite-3.0-3b-a800m and their
# instruct models): Granite's block and scalars with its MLP a mixture of experts (moe.py): a router (router.layer,
# (E, C)) sending each token to num_experts_per_tok of num_local_experts SwiGLU experts, stacked as redline's
# (input_linear (E, 2F, C), rows [gate; up]; output_linear (E, C, F)), weighted by the softmax of the chosen
# experts' logits, the same as the top k of the softmax rescaled to sum to 1 (moe_norm_topk). Semantics read from
# transformers' models/granitemoe/modeling_granitemoe.py.


def moe_model_config(hf: dict) -> ModelConfig:
    from redline.interop.moe import expert_fields

    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: GraniteMoE's experts have no biases, and redline's biases cover the "
                        "attention and the MLP together")
    return replace(model_config({**hf, "mlp_bias": False}), **expert_fields(hf, "intermediate_size"),
                   moe_norm_topk=True)


def check_moe_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a mixture of experts with Granite's scalars that GraniteMoE lacks."""
    from redline.interop.moe import check_exportable as check_experts

    check_exportable(cfg)
    check_experts(cfg, granite=True)
    raise_first([
        (cfg.moe_shared_hidden, "model.moe_shared_hidden with Granite's scalars: GraniteMoE has no shared expert"),
        (not cfg.moe_norm_topk, "model.moe_norm_topk=false with Granite's scalars: GraniteMoE weights each token's "
                                "experts by the softmax over the chosen ones"),
    ])


def moe_hf_config(cfg: ModelConfig) -> dict:
    out = hf_config(cfg)
    out.pop("mlp_bias", None)
    return {**out, "model_type": "granitemoe", "attention_bias": False, "num_local_experts": cfg.moe_experts,
            "num_experts_per_tok": cfg.moe_top_k, "output_router_logits": bool(cfg.moe_aux_loss),
            "router_aux_loss_coef": cfg.moe_aux_loss or 0.001}


MOE_FAMILY = Family(name="granitemoe", architecture="GraniteMoeForCausalLM", model_config=moe_model_config,
                    hf_config=moe_hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# Granite SWA (GraniteSWAForCausalLM, model_type "granite_swa": granite-swash-2b): Granite's block, names and scalars
# with
# - a learned sink logit per query head (self_attn.sinks -> attn_sinks), the attention output times
#   sigmoid(logsumexp(scores) - sink);
# - windowed and full layers in any order (layer_types; by default full where i % 4 == 0, the first of each four:
#   window_layers, since redline's sliding_window_pattern puts the full layer last);
# - a RoPE base per layer, 0 for none (layer_rope_theta -> rope_layer_theta), each base with the model's RoPE
#   scaling: transformers builds one rotary embedding a distinct base from the same rope_parameters.
# Semantics read from transformers' models/granite_swa/modular_granite_swa.py. GraniteMoeSWA, the same attention on
# GraniteMoeShared's experts and ungated shared MLP, is refused by name.


def _layer_thetas(hf: dict, cfg: ModelConfig) -> dict:
    """rope_theta alone where every layer rotates by one base, else rope_layer_theta."""
    thetas = hf.get("layer_rope_theta")
    if thetas is None:
        return {}
    if len(thetas) != cfg.n_layer or min(thetas) < 0:
        raise UserError(f"layer_rope_theta has {len(thetas)} entries for {cfg.n_layer} layers, or one below 0")
    if len(set(thetas)) == 1 and thetas[0]:
        return {"rope_theta": float(thetas[0])}
    return {"rope_layer_theta": tuple(float(t) for t in thetas)}


def swa_model_config(hf: dict) -> ModelConfig:
    from redline.interop.llama import layer_windows

    cfg = model_config(hf)
    n = cfg.n_layer
    windows = layer_windows({"sliding_window": 128, **hf}, n,  # GraniteSWAConfig's defaults
                            ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(n)])
    return replace(cfg, attn_sinks=True, **windows, **_layer_thetas(hf, cfg))


def _layer_theta(cfg: ModelConfig, layer: int) -> float:
    """The RoPE base layer `layer` rotates by, 0 for none (nope_interval, rope_layer_theta 0)."""
    return cfg.rope_bases[cfg.layer_rope_table(layer)][0] if cfg.layer_rope(layer) else 0.0


def swa_hf_config(cfg: ModelConfig) -> dict:
    return {**hf_config(cfg), "model_type": "granite_swa", "sliding_window": cfg.sliding_window or cfg.context_len,
            "layer_types": ["sliding_attention" if cfg.layer_window(i) else "full_attention"
                            for i in range(cfg.n_layer)],
            "layer_rope_theta": [_layer_theta(cfg, i) for i in range(cfg.n_layer)]}


SWA_FAMILY = Family(name="granite_swa", architecture="GraniteSWAForCausalLM", model_config=swa_model_config,
                    hf_config=swa_hf_config, to_redline=to_redline, to_hf=to_llama_hf, ignorable=_ignorable)
