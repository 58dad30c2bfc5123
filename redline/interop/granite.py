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

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
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


def check_exportable(cfg: ModelConfig, swa: bool = False, experts: bool = False) -> None:
    """A UserError naming the option that Granite, the one architecture with these scalars, does not have (swa:
    Granite SWA, which has its windows and per-layer RoPE bases besides; experts: GraniteMoeSWA, its experts checked
    by check_moe_exportable)."""
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
        (swa and (cfg.attn_softcap or cfg.value_embeddings or (cfg.moe_experts and not experts) or cfg.conv_layers),
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
# Granite 4.0 (GraniteMoeHybridForCausalLM, model_type "granitemoehybrid"): its hybrid models (granite-4.0-h-350m,
# -h-1b, -h-micro: Mamba-2 layers with attention on a few, layer_types "mamba" / "attention", or transformers'
# "linear_attention" / "full_attention") and its dense ones (attention only: granite-4.0-350m, -1b, -micro).
# - Granite's block and scalars, its SwiGLU MLP named shared_mlp with gate and up as one input_linear (rows
#   [gate; up], as redline's fused fc) and down as output_linear;
# - attention layers with RoPE or no positions at all (position_embedding_type None: the NoPE form);
# - Mamba-2 layers (mamba.*: in_proj, conv1d with its bias, dt_bias, A_log, D, the gated norm, out_proj) as
#   model.delta_layers with delta_rule=mamba2: n_heads heads of d_head, n_groups groups of B and C of d_state;
#   time_step_limit (min, inf), the floor transformers' chunked scan clamps dt to, as model.delta_dt_min (an
#   upper bound refused), written back from it.
# Semantics read from transformers' models/granitemoehybrid/modular_granitemoehybrid.py and models/bamba (its
# mixer). Its MoE models (-h-tiny, -h-small: num_local_experts > 0) have GraniteMoeShared's experts and shared MLP.

_FUSED, _DOWN = "shared_mlp.input_linear.weight", "shared_mlp.output_linear.weight"
_MAMBA_KINDS, _ATTENTION_KINDS = {"mamba", "linear_attention"}, {"attention", "full_attention"}


def _hybrid_kinds(hf: dict) -> list[bool]:
    """Each layer: True for Mamba-2, False for attention (transformers' default: Mamba-2 everywhere)."""
    n = hf["num_hidden_layers"]
    kinds = hf.get("layer_types") or hf.get("layers_block_type") or ["mamba"] * n
    if len(kinds) != n or not set(kinds) <= _MAMBA_KINDS | _ATTENTION_KINDS:
        raise UserError(f"layer_types {kinds}: Granite 4.0 takes {n} entries, each mamba or attention")
    return [kind in _MAMBA_KINDS for kind in kinds]


def _mamba_fields(hf: dict, mamba: list[bool]) -> dict:
    if not any(mamba):
        return {}
    width, heads = int(hf.get("mamba_expand", 2)) * hf["hidden_size"], int(hf.get("mamba_n_heads", 128))
    head = hf.get("mamba_d_head", "auto")
    head = width // heads if head in (None, "auto") else int(head)
    groups = int(hf.get("mamba_n_groups", 1))
    if head * heads != width or heads % groups:
        raise UserError(f"mamba_n_heads={heads} x mamba_d_head={head} != mamba_expand x hidden_size = {width}, or "
                        f"mamba_n_groups={groups} does not divide the heads: not a Mamba-2 layer redline can build")
    return dict(delta_layers=tuple(i for i, m in enumerate(mamba) if m), delta_rule="mamba2", delta_heads=heads,
                delta_key_heads=groups, delta_key_dim=int(hf.get("mamba_d_state", 256)), delta_value_dim=head,
                delta_conv_kernel=int(hf.get("mamba_d_conv", 4)),
                delta_conv_bias=bool(hf.get("mamba_conv_bias", True)),
                delta_proj_bias=bool(hf.get("mamba_proj_bias", False)), delta_dt_min=time_step_floor(hf))


def _json_float(x) -> float:
    """A float of config.json: transformers writes infinity as {"__float__": "Infinity"}, older files Infinity."""
    return float(x["__float__"]) if isinstance(x, dict) and "__float__" in x else float(x)


def time_step_floor(hf: dict) -> float:
    """A Mamba-2 config's time_step_limit (min, max), which transformers' chunked scan clamps dt = softplus(dt +
    dt_bias) to (Bamba's, Granite 4.0's and Mamba2's mixers) -> model.delta_dt_min = min; None or absent: (0, inf).
    An upper bound is refused: redline floors the time step and never caps it."""
    limit = hf.get("time_step_limit")
    if limit is None:
        return 0.0
    low, high = (_json_float(x) for x in limit)
    if high != float("inf") or not low >= 0:
        raise UserError(f"time_step_limit={[low, high]}: redline's Mamba-2 layers floor the time step "
                        f"(model.delta_dt_min) but never cap it; only (min >= 0, inf) is supported")
    return low


def time_step_limit(cfg: ModelConfig) -> list:
    """time_step_limit for config.json from model.delta_dt_min: [min, infinity], infinity as transformers writes it
    (strict JSON has no Infinity)."""
    return [cfg.delta_dt_min, {"__float__": "Infinity"}]


def hybrid_model_config(hf: dict) -> ModelConfig:
    mamba = _hybrid_kinds(hf)
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: Granite 4.0's MLP has no biases, and redline's biases cover both")
    rope = hf.get("position_embedding_type")
    if rope not in (None, "rope", "nope"):
        raise UserError(f"position_embedding_type={rope!r}: redline reads rope or none")
    if hf.get("num_local_experts"):  # GraniteMoeShared's experts and shared MLP
        cfg = shared_model_config(hf)
    else:
        cfg = model_config({**hf, "intermediate_size": hf["shared_intermediate_size"], "mlp_bias": False})
    return replace(cfg, pos_emb="rope" if rope == "rope" else "none", **_mamba_fields(hf, mamba))


# redline's names in a Mamba-2 layer (after blocks.N.attn.) -> transformers' (after model.layers.N.mamba.)
_MAMBA = {"in_proj.weight": "in_proj.weight", "proj.weight": "out_proj.weight", "conv": "conv1d.weight",
          "A_log": "A_log", "dt_bias": "dt_bias", "D": "D", "norm": "norm.weight"}
_MAMBA_CONV_BIAS = {"conv_bias": "conv1d.bias"}
_MAMBA_PROJ_BIAS = {"in_proj.bias": "in_proj.bias", "proj.bias": "out_proj.bias"}


def _mamba_names(cfg: ModelConfig) -> dict:
    names = {**_MAMBA, **(_MAMBA_CONV_BIAS if cfg.delta_conv_bias else {}),
             **(_MAMBA_PROJ_BIAS if cfg.delta_proj_bias else {})}
    if cfg.delta_gate_norm == "none":  # a mixer without the output norm has no weight for it (Falcon-H1's)
        del names["norm"]
    return names


def hybrid_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"norm_f.weight": src.take("model.norm.weight"),
           "wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        if cfg.moe_experts:
            from redline.interop.moe import experts_to_redline

            out.update(experts_to_redline(src, p, r, cfg), **_shared_to_redline(src, p, r))
        else:
            out[r + "mlp.fc.weight"], out[r + "mlp.proj.weight"] = src.take(p + _FUSED), src.take(p + _DOWN)
        out.update(_mixer_to_redline(src, cfg, i))
    return out


def _mixer_to_redline(src: TensorSource, cfg: ModelConfig, i: int, layer: str = "model.layers.{i}.",
                      mamba: str = "mamba.", attention: str = "self_attn.", *, recurrent: bool | None = None,
                      module: str = "attn") -> dict:
    """Layer i's Mamba-2 mixer (mamba.*) or attention (self_attn.q/k/v/o_proj, with their biases where the model has
    them) -> redline's blocks.i.<module>.*. layer, mamba and attention: the names of another architecture with these
    mixers (Nemotron-H's and Mamba2's backbone.layers.{i}.mixer.*). recurrent: which of the two (None: the mixer on
    model.delta_layers, attention elsewhere; Falcon-H1's layers have both, the mixer as blocks.i.mamba)."""
    p, r = layer.format(i=i), f"blocks.{i}.{module}."
    if i in cfg.delta_layers if recurrent is None else recurrent:
        out = {f"{r}{ours}": src.take(f"{p}{mamba}{theirs}") for ours, theirs in _mamba_names(cfg).items()}
        out[r + "conv"] = out[r + "conv"][:, 0]  # (channels, 1, kernel) -> (channels, kernel)
        return out
    a = p + attention
    out = {r + "qkv.weight": torch.cat([src.take(f"{a}{x}_proj.weight") for x in "qkv"]),
           r + "proj.weight": src.take(a + "o_proj.weight")}
    if cfg.has_qkv_bias:
        out[r + "qkv.bias"] = torch.cat([src.take(f"{a}{x}_proj.bias") for x in "qkv"])
    if cfg.bias:
        out[r + "proj.bias"] = src.take(a + "o_proj.bias")
    return out


def _mixer_to_hf(state, cfg: ModelConfig, i: int, layer: str = "model.layers.{i}.", mamba: str = "mamba.",
                 attention: str = "self_attn.", *, recurrent: bool | None = None, module: str = "attn") -> dict:
    """_mixer_to_redline's inverse."""
    p, r = layer.format(i=i), f"blocks.{i}.{module}."
    if i in cfg.delta_layers if recurrent is None else recurrent:
        out = {f"{p}{mamba}{theirs}": state[f"{r}{ours}"] for ours, theirs in _mamba_names(cfg).items()}
        out[f"{p}{mamba}conv1d.weight"] = out[f"{p}{mamba}conv1d.weight"][:, None]
        return out
    D, KV, a = cfg.head_dim, cfg.kv_heads, p + attention
    sizes = [cfg.n_head * D, KV * D, KV * D]
    out = dict(zip((a + f"{x}_proj.weight" for x in "qkv"), state[r + "qkv.weight"].split(sizes)))
    out[a + "o_proj.weight"] = state[r + "proj.weight"]
    if cfg.has_qkv_bias:
        out.update(zip((a + f"{x}_proj.bias" for x in "qkv"), state[r + "qkv.bias"].split(sizes)))
    if cfg.bias:
        out[a + "o_proj.bias"] = state[r + "proj.bias"]
    return out


def hybrid_to_hf(state, cfg: ModelConfig) -> dict:
    out = {"model.norm.weight": state["norm_f.weight"],
           "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size], **give_head(state, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
        if cfg.moe_experts:
            from redline.interop.moe import experts_to_hf

            out.update(experts_to_hf(state, p, r, cfg, "granitemoe"), **_shared_to_hf(state, p, r))
        else:
            out[p + _FUSED], out[p + _DOWN] = state[r + "mlp.fc.weight"], state[r + "mlp.proj.weight"]
        out.update(_mixer_to_hf(state, cfg, i))
    return {k: v.contiguous() for k, v in out.items()}


def check_hybrid_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with Mamba-2 layers that Granite 4.0, the one architecture with them
    redline exports to, does not have."""
    what = "model.delta_rule=mamba2: Granite 4.0, the one architecture with Mamba-2 layers redline exports to,"
    if cfg.moe_experts:  # GraniteMoeShared's experts, the shared MLP beside them always there
        check_moe_exportable(replace(cfg, pos_emb="rope"))
        raise_first([(not cfg.moe_shared_hidden, f"{what} has a shared MLP beside its experts "
                                                 f"(model.moe_shared_hidden, model.moe_shared_gate=false)")])
    raise_first([
        (cfg.delta_gate_norm != "after_gate", f"{what} normalizes the mixer's output after its gate "
                                              f"(model.delta_gate_norm={cfg.delta_gate_norm})"),
        (cfg.conv_layers or cfg.attn_gate != "none" or cfg.value_embeddings,
         f"{what} has no short convolutions, gates on attention or value embeddings"),
        ((cfg.delta_heads * cfg.delta_value_dim) % cfg.n_embd,
         f"{what} makes its layers' inner width (model.delta_heads x model.delta_value_dim = "
         f"{cfg.delta_heads * cfg.delta_value_dim}) a whole multiple of model.n_embd={cfg.n_embd} (mamba_expand)"),
        (cfg.rope_dims or cfg.rope_scaling != "none", f"{what} rotates whole heads with unscaled RoPE, or has no "
                                                      f"positions"),
    ])
    if wants_granite(cfg) or cfg.attn_scale:
        check_exportable(cfg)
    else:  # the block's shape alone, every scalar 1
        raise_first([(cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.mlp != "swiglu" or cfg.qk_norm
                      or cfg.parallel_residual or cfg.norm_unit_offset or cfg.embed_scale or cfg.bias
                      or cfg.has_qkv_bias or cfg.sliding_window or cfg.attn_sinks or cfg.attn_softcap
                      or cfg.logit_softcap or cfg.pos_emb == "learned",
                      f"{what} has pre-RMSNorm blocks, SwiGLU, no QK-norm, biases, windows, sinks or caps")])


def hybrid_hf_config(cfg: ModelConfig) -> dict:
    out = hf_config(cfg)
    out.pop("mlp_bias", None)
    out = {**out, "model_type": "granitemoehybrid", "shared_intermediate_size": cfg.hidden_dim,
           "num_local_experts": 0, "num_experts_per_tok": 0,
           **({"shared_intermediate_size": cfg.moe_shared_hidden, "intermediate_size": cfg.hidden_dim,
               "num_local_experts": cfg.moe_experts, "num_experts_per_tok": cfg.moe_top_k,
               "output_router_logits": bool(cfg.moe_aux_loss), "router_aux_loss_coef": cfg.moe_aux_loss or 0.001}
              if cfg.moe_experts else {}),
           "layer_types": ["mamba" if i in cfg.delta_layers else "attention" for i in range(cfg.n_layer)],
           "position_embedding_type": "rope" if cfg.pos_emb == "rope" else None}
    if cfg.delta_layers:
        out.update(mamba_n_heads=cfg.delta_heads, mamba_n_groups=cfg.delta_key_heads, mamba_d_state=cfg.delta_key_dim,
                   mamba_d_head=cfg.delta_value_dim, mamba_d_conv=cfg.delta_conv_kernel,
                   mamba_expand=cfg.delta_heads * cfg.delta_value_dim // cfg.n_embd,
                   mamba_conv_bias=cfg.delta_conv_bias, mamba_proj_bias=cfg.delta_proj_bias,
                   time_step_limit=time_step_limit(cfg))
    return out


HYBRID_FAMILY = Family(name="granitemoehybrid", architecture="GraniteMoeHybridForCausalLM",
                       model_config=hybrid_model_config, hf_config=hybrid_hf_config, to_redline=hybrid_to_redline,
                       to_hf=hybrid_to_hf, ignorable=_ignorable)


# Bamba (BambaForCausalLM, model_type "bamba": ibm-ai-platform/Bamba-9B), the hybrid whose Mamba-2 mixer Granite 4.0
# took: the same mamba.* and self_attn.* layers (attention on attn_layer_indices, Mamba-2 elsewhere), Llama's SwiGLU
# MLP as feed_forward.gate_proj / up_proj / down_proj, pre-norms input_layernorm and pre_ff_layernorm, the last one
# final_layernorm, RoPE on partial_rotary_factor of each head (rope_dims), no scalars. Semantics read from
# transformers' models/bamba/modular_bamba.py.


def bamba_model_config(hf: dict) -> ModelConfig:
    from redline.interop.llama import _rope, check_silu, shape_fields

    check_silu(hf)
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise UserError("attention_bias / mlp_bias=true: Bamba's released models have no biases; redline reads none")
    n = hf["num_hidden_layers"]
    attention = set(hf.get("attn_layer_indices") or ())
    if not attention <= set(range(n)):
        raise UserError(f"attn_layer_indices={sorted(attention)}: each must be a layer of {n}")
    fields = shape_fields(hf)
    head_dim = fields["n_embd"] // fields["n_head"]
    params = hf.get("rope_parameters") or {}
    rotated = int(head_dim * float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.5))))
    return ModelConfig(
        **fields, fused_qkv=True, pos_emb="rope", **_rope(hf), rope_dims=rotated if rotated != head_dim else 0,
        mlp="swiglu", fused_mlp=True, norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False,
        **_mamba_fields(hf, [i not in attention for i in range(n)]))


def bamba_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    return {**bamba_outside_to_redline(src, cfg),
            **{k: v for i in range(cfg.n_layer) for k, v in bamba_ffn_to_redline(src, cfg, i).items()},
            **{k: v for i in range(cfg.n_layer) for k, v in _mixer_to_redline(src, cfg, i).items()}}


def bamba_outside_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    """Bamba's (and Falcon-H1's) embeddings, final norm and head -> redline's."""
    return {"norm_f.weight": src.take("model.final_layernorm.weight"),
            "wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg), **take_head(src, cfg)}


def bamba_ffn_to_redline(src: TensorSource, cfg: ModelConfig, i: int) -> dict:
    """Layer i's norms (input_layernorm, pre_ff_layernorm) and SwiGLU feed_forward, with biases where the model has
    them (Falcon-H1's mlp_bias), -> redline's blocks.i.norm1, norm2 and mlp: Bamba's layout, Falcon-H1's too."""
    p, r, f = f"model.layers.{i}.", f"blocks.{i}.", f"model.layers.{i}.feed_forward."
    out = {r + "norm1.weight": src.take(p + "input_layernorm.weight"),
           r + "norm2.weight": src.take(p + "pre_ff_layernorm.weight"),
           r + "mlp.fc.weight": torch.cat([src.take(f + "gate_proj.weight"), src.take(f + "up_proj.weight")]),
           r + "mlp.proj.weight": src.take(f + "down_proj.weight")}
    if cfg.bias:
        out[r + "mlp.fc.bias"] = torch.cat([src.take(f + "gate_proj.bias"), src.take(f + "up_proj.bias")])
        out[r + "mlp.proj.bias"] = src.take(f + "down_proj.bias")
    return out


def bamba_to_hf(state, cfg: ModelConfig) -> dict:
    out = bamba_outside_to_hf(state, cfg)
    for i in range(cfg.n_layer):
        out.update(bamba_ffn_to_hf(state, cfg, i), **_mixer_to_hf(state, cfg, i))
    return {k: v.contiguous() for k, v in out.items()}


def bamba_outside_to_hf(state, cfg: ModelConfig) -> dict:
    """bamba_outside_to_redline's inverse."""
    return {"model.final_layernorm.weight": state["norm_f.weight"],
            "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size], **give_head(state, cfg)}


def bamba_ffn_to_hf(state, cfg: ModelConfig, i: int) -> dict:
    """bamba_ffn_to_redline's inverse."""
    p, r, f = f"model.layers.{i}.", f"blocks.{i}.", f"model.layers.{i}.feed_forward."
    out = {p + "input_layernorm.weight": state[r + "norm1.weight"],
           p + "pre_ff_layernorm.weight": state[r + "norm2.weight"],
           f + "down_proj.weight": state[r + "mlp.proj.weight"]}
    out[f + "gate_proj.weight"], out[f + "up_proj.weight"] = state[r + "mlp.fc.weight"].chunk(2)
    if cfg.bias:
        out[f + "gate_proj.bias"], out[f + "up_proj.bias"] = state[r + "mlp.fc.bias"].chunk(2)
        out[f + "down_proj.bias"] = state[r + "mlp.proj.bias"]
    return out


def bamba_hf_config(cfg: ModelConfig) -> dict:
    return {
        "model_type": "bamba", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "hidden_act": "silu", "max_position_embeddings": cfg.context_len,
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "mlp_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                            "partial_rotary_factor": (cfg.rope_dims or cfg.head_dim) / cfg.head_dim},
        "attn_layer_indices": [i for i in range(cfg.n_layer) if i not in cfg.delta_layers],
        "mamba_n_heads": cfg.delta_heads, "mamba_n_groups": cfg.delta_key_heads, "mamba_d_state": cfg.delta_key_dim,
        "mamba_d_head": cfg.delta_value_dim, "mamba_d_conv": cfg.delta_conv_kernel,
        "mamba_expand": cfg.delta_heads * cfg.delta_value_dim // cfg.n_embd, "mamba_conv_bias": cfg.delta_conv_bias,
        "mamba_proj_bias": cfg.delta_proj_bias, "time_step_limit": time_step_limit(cfg),
    }


def wants_bamba(cfg: ModelConfig) -> bool:
    """Mamba-2 layers with RoPE on part of each head: Bamba's (Granite 4.0 rotates whole heads, or none)."""
    return bool(cfg.delta_layers) and cfg.delta_rule == "mamba2" and cfg.pos_emb == "rope" and bool(cfg.rope_dims)


def check_bamba_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a Mamba-2 model with partial RoPE that Bamba does not have."""
    what = "Mamba-2 layers with RoPE on part of each head: Bamba, the architecture with them,"
    raise_first([
        (cfg.delta_gate_norm != "after_gate", f"{what} normalizes the mixer's output after its gate "
                                              f"(model.delta_gate_norm={cfg.delta_gate_norm})"),
        (cfg.moe_experts or cfg.conv_layers or cfg.attn_gate != "none" or cfg.value_embeddings or cfg.qk_norm
         or cfg.bias or cfg.has_qkv_bias or cfg.norm != "rmsnorm" or cfg.norm_position != "pre"
         or cfg.norm_unit_offset or cfg.mlp != "swiglu" or cfg.parallel_residual,
         f"{what} has pre-RMSNorm blocks, SwiGLU MLPs, no QK-norm, biases, experts, gates or convolution layers"),
        (cfg.rope_scaling != "none" or cfg.sliding_window or cfg.attn_sinks or cfg.attn_scale or cfg.attn_softcap
         or cfg.logit_softcap or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier
         or cfg.logit_divisor or cfg.head_bias or cfg.nope_interval or cfg.rope_layer_theta,
         f"{what} has one unscaled RoPE and no windows, sinks, scales, caps or scalars"),
        ((cfg.delta_heads * cfg.delta_value_dim) % cfg.n_embd,
         f"{what} makes its layers' inner width (model.delta_heads x model.delta_value_dim) a whole multiple of "
         f"model.n_embd (mamba_expand)"),
    ])


BAMBA_FAMILY = Family(name="bamba", architecture="BambaForCausalLM", model_config=bamba_model_config,
                      hf_config=bamba_hf_config, to_redline=bamba_to_redline, to_hf=bamba_to_hf,
                      ignorable=_ignorable)


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


def check_moe_exportable(cfg: ModelConfig, swa: bool = False) -> None:
    """A UserError naming the option of a mixture of experts with Granite's scalars (or an ungated shared expert)
    that GraniteMoE and GraniteMoeShared lack (swa: GraniteMoeSWA, with Granite SWA's sinks, windows and RoPE
    bases)."""
    from redline.interop.moe import check_exportable as check_experts

    check_exportable(cfg, swa=swa, experts=swa)
    # Granite SWA's windows are written as per-layer lists (swa_fields), whatever redline's layout of them
    check_experts(replace(cfg, sliding_window_pattern=0, rope_local_theta=0.0) if swa else cfg, granite=True)
    raise_first([
        (cfg.moe_shared_hidden and cfg.moe_shared_gate,
         "model.moe_shared_hidden with Granite's scalars: GraniteMoeShared adds its shared MLP ungated "
         "(model.moe_shared_gate=false); Qwen2-MoE, whose shared expert is gated, has no Granite scalars"),
        (not cfg.moe_norm_topk, "model.moe_norm_topk=false with Granite's scalars: GraniteMoE weights each token's "
                                "experts by the softmax over the chosen ones"),
    ])


def moe_export_name(cfg: ModelConfig) -> str:
    """GraniteMoeShared where there is a shared MLP, GraniteMoE otherwise (after check_moe_exportable)."""
    check_moe_exportable(cfg)
    return "granitemoeshared" if cfg.moe_shared_hidden else "granitemoe"


def moe_hf_config(cfg: ModelConfig) -> dict:
    out = hf_config(cfg)
    out.pop("mlp_bias", None)
    out = {**out, "model_type": "granitemoe", "attention_bias": False, "num_local_experts": cfg.moe_experts,
           "num_experts_per_tok": cfg.moe_top_k, "output_router_logits": bool(cfg.moe_aux_loss),
           "router_aux_loss_coef": cfg.moe_aux_loss or 0.001}
    if cfg.moe_shared_hidden:
        out.update(model_type="granitemoeshared", shared_intermediate_size=cfg.moe_shared_hidden)
    return out


MOE_FAMILY = Family(name="granitemoe", architecture="GraniteMoeForCausalLM", model_config=moe_model_config,
                    hf_config=moe_hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)


# GraniteMoeShared (GraniteMoeSharedForCausalLM, model_type "granitemoeshared"): GraniteMoE with a SwiGLU MLP beside
# the experts that every token passes through, its output added ungated (shared_mlp.input_linear (2F, C), rows
# [gate; up], and output_linear: moe_shared_hidden with moe_shared_gate=false). Semantics read from transformers'
# models/granitemoeshared/modular_granitemoeshared.py.


def _shared_fields(hf: dict) -> dict:
    width = int(hf.get("shared_intermediate_size") or 0)
    return dict(moe_shared_hidden=width, moe_shared_gate=False) if width else {}


def shared_model_config(hf: dict) -> ModelConfig:
    return replace(moe_model_config(hf), **_shared_fields(hf))


def _shared_to_redline(src: TensorSource, p: str, r: str) -> dict:
    return {f"{r}mlp.shared.fc.weight": src.take(p + _FUSED), f"{r}mlp.shared.proj.weight": src.take(p + _DOWN)}


def _shared_to_hf(state, p: str, r: str) -> dict:
    return {p + _FUSED: state[f"{r}mlp.shared.fc.weight"], p + _DOWN: state[f"{r}mlp.shared.proj.weight"]}


def shared_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = to_redline(src, cfg)
    for i in range(cfg.n_layer if cfg.moe_shared_hidden else 0):
        out.update(_shared_to_redline(src, f"model.layers.{i}.", f"blocks.{i}."))
    return out


def shared_to_hf(state, cfg: ModelConfig, name: str = "granitemoe") -> dict:
    out = to_hf(state, cfg, name)
    for i in range(cfg.n_layer if cfg.moe_shared_hidden else 0):
        out.update(_shared_to_hf(state, f"model.layers.{i}.", f"blocks.{i}."))
    return out


SHARED_FAMILY = Family(name="granitemoeshared", architecture="GraniteMoeSharedForCausalLM",
                       model_config=shared_model_config, hf_config=moe_hf_config, to_redline=shared_to_redline,
                       to_hf=shared_to_hf, ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# Granite SWA (GraniteSWAForCausalLM, model_type "granite_swa": granite-swash-2b): Granite's block, names and scalars
# with
# - a learned sink logit per query head (self_attn.sinks -> attn_sinks), the attention output times
#   sigmoid(logsumexp(scores) - sink);
# - windowed and full layers in any order (layer_types; by default full where i % 4 == 0, the first of each four:
#   window_layers, since redline's sliding_window_pattern puts the full layer last);
# - a RoPE base per layer, 0 for none (layer_rope_theta -> rope_layer_theta), each base with the model's RoPE
#   scaling: transformers builds one rotary embedding a distinct base from the same rope_parameters.
# Semantics read from transformers' models/granite_swa/modular_granite_swa.py. GraniteMoeSWA (below) is the same
# attention on GraniteMoeShared's experts.


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


def _with_swa(hf: dict, cfg: ModelConfig) -> ModelConfig:
    """cfg with Granite SWA's sinks, windowed layers and per-layer RoPE bases."""
    from redline.interop.llama import layer_windows

    n = cfg.n_layer
    windows = layer_windows({"sliding_window": 128, **hf}, n,  # GraniteSWAConfig's defaults
                            ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(n)])
    return replace(cfg, attn_sinks=True, **windows, **_layer_thetas(hf, cfg))


def swa_model_config(hf: dict) -> ModelConfig:
    return _with_swa(hf, model_config(hf))


def _layer_theta(cfg: ModelConfig, layer: int) -> float:
    """The RoPE base layer `layer` rotates by, 0 for none (nope_interval, rope_layer_theta 0)."""
    return cfg.rope_bases[cfg.layer_rope_table(layer)][0] if cfg.layer_rope(layer) else 0.0


def _swa_fields(cfg: ModelConfig) -> dict:
    """Granite SWA's config.json entries for the windows and RoPE bases, one a layer."""
    return {"sliding_window": cfg.sliding_window or cfg.context_len,
            "layer_types": ["sliding_attention" if cfg.layer_window(i) else "full_attention"
                            for i in range(cfg.n_layer)],
            "layer_rope_theta": [_layer_theta(cfg, i) for i in range(cfg.n_layer)]}


def swa_hf_config(cfg: ModelConfig) -> dict:
    return {**hf_config(cfg), "model_type": "granite_swa", **_swa_fields(cfg)}


SWA_FAMILY = Family(name="granite_swa", architecture="GraniteSWAForCausalLM", model_config=swa_model_config,
                    hf_config=swa_hf_config, to_redline=to_redline, to_hf=to_llama_hf, ignorable=_ignorable)


# GraniteMoeSWA (GraniteMoeSWAForCausalLM, model_type "granitemoe_swa": granite-swash-3b-a600m): GraniteMoeShared's
# experts (and its ungated shared MLP where shared_intermediate_size > 0, none by default) under Granite SWA's
# attention: sinks, windowed and full layers in any order, a RoPE base per layer. Its experts' tensors carry
# transformers' in-memory names (moe._GRANITE_STACKED). Semantics read from transformers'
# models/granitemoe_swa/modular_granitemoe_swa.py.


def moe_swa_model_config(hf: dict) -> ModelConfig:
    return _with_swa(hf, shared_model_config(hf))


def moe_swa_hf_config(cfg: ModelConfig) -> dict:
    return {**moe_hf_config(cfg), "model_type": "granitemoe_swa", "shared_intermediate_size": cfg.moe_shared_hidden,
            **_swa_fields(cfg)}


def moe_swa_to_hf(state, cfg: ModelConfig) -> dict:
    return shared_to_hf(state, cfg, "granitemoe_swa")


MOE_SWA_FAMILY = Family(name="granitemoe_swa", architecture="GraniteMoeSWAForCausalLM",
                        model_config=moe_swa_model_config, hf_config=moe_swa_hf_config, to_redline=shared_to_redline,
                        to_hf=moe_swa_to_hf, ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# HyperCLOVA X (NAVER's HyperCLOVAXForCausalLM, model_type "hyperclovax": HyperCLOVAX-SEED-Think-14B): Granite's block,
# names and scalars with two differences (transformers' models/hyperclovax/modular_hyperclovax.py):
# - the logits are multiplied by logits_scaling where Granite divides by it: logit_divisor = 1 / logits_scaling;
# - use_post_norm (its default true): an RMSNorm on each sublayer's output before the residual multiplier (Peri-LN:
#   post_norm1, post_norm2), redline's sandwich norms with plain weights, the MLP input's norm keeping Llama's name
#   (post_attention_layernorm).
# Without post norms a model is Granite's with its logits scaled, and exports as Granite.

# redline's sandwich norms (llama.NORM_NAMES, Gemma's names) -> HyperCLOVA X's, after model.layers.N.
_HCX_NORMS = {"post_attention_layernorm": "post_norm1", "pre_feedforward_layernorm": "post_attention_layernorm",
              "post_feedforward_layernorm": "post_norm2"}


def _hcx_renamed(name: str, names: dict) -> str:
    """`name` with its block norm's segment renamed by `names` (other tensors as they are)."""
    head, dot, rest = name.rpartition(".layers.")
    if not dot:
        return name
    layer, _, tail = rest.partition(".")
    module, _, kind = tail.partition(".")
    return f"{head}{dot}{layer}.{names.get(module, module)}.{kind}" if module in names else name


def hyperclovax_model_config(hf: dict) -> ModelConfig:
    scaling = hf.get("logits_scaling")
    scaling = 1.0 if scaling is None else float(scaling)
    if scaling <= 0:
        raise UserError(f"logits_scaling={scaling}: HyperCLOVA X's logit multiplier must be above 0")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    scale = hf.get("attention_multiplier")
    cfg = model_config({**hf, "head_dim": head_dim, "logits_scaling": 1.0,
                        "attention_multiplier": head_dim ** -0.5 if scale is None else scale})
    return replace(cfg, logit_divisor=0.0 if scaling == 1.0 else 1.0 / scaling,
                   norm_position="sandwich" if hf.get("use_post_norm", True) else "pre")


def wants_hyperclovax(cfg: ModelConfig) -> bool:
    """Plain RMSNorms on the sublayers' inputs and outputs rotating whole heads, without QK-norm: HyperCLOVA X's
    (GLM-4 rotates part of each head, the Gemmas' norms scale by 1 + weight, LFM3 has QK-norm)."""
    return bool(cfg.norm_position == "sandwich" and cfg.norm == "rmsnorm" and not cfg.norm_unit_offset
                and not cfg.rope_dims and not cfg.qk_norm)


def check_hyperclovax_exportable(cfg: ModelConfig) -> None:
    what = ("plain RMSNorms on the sublayers' inputs and outputs (norm_position=sandwich): HyperCLOVA X, the one "
            "architecture with them and whole heads rotated redline exports to,")
    named = [name for name in ("attn_sinks", "attn_softcap", "logit_softcap", "embed_scale", "embed_norm",
                               "value_embeddings", "head_bias", "moe_experts", "conv_layers", "delta_layers",
                               "sliding_window", "nope_interval", "rope_local_theta", "rope_layer_theta",
                               "parallel_residual") if getattr(cfg, name)]
    raise_first([
        (bool(named), f"{what} has no model.{named[0] if named else ''}"),
        (not cfg.norm_affine, f"{what} has learned norms (model.norm_affine)"),
        (cfg.mlp != "swiglu", f"{what} has a SwiGLU MLP (model.mlp={cfg.mlp})"),
        (cfg.attn_gate != "none", f"{what} has no gate on its heads (model.attn_gate)"),
        (cfg.pos_emb != "rope", f"{what} rotates with RoPE (model.pos_emb={cfg.pos_emb})"),
        (cfg.has_qkv_bias != cfg.bias, f"{what} has biases on every Linear layer or none (model.qkv_bias)"),
    ])


def hyperclovax_hf_config(cfg: ModelConfig) -> dict:
    return {**hf_config(cfg), "model_type": "hyperclovax", "use_post_norm": cfg.norm_position == "sandwich",
            "logits_scaling": 1.0 / cfg.logit_divisor if cfg.logit_divisor else 1.0}


def hyperclovax_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    theirs = {v: k for k, v in _HCX_NORMS.items()}
    if cfg.norm_position != "sandwich":
        return to_redline(src, cfg)
    names = {_hcx_renamed(n, theirs): n for n in src.names}
    view = TensorSource(names, lambda n: src.take(names[n]), src.where)
    return to_redline(view, cfg)


def hyperclovax_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = to_hf(state, cfg, "llama")
    return {_hcx_renamed(k, _HCX_NORMS): v for k, v in out.items()} if cfg.norm_position == "sandwich" else out


HYPERCLOVAX_FAMILY = Family(name="hyperclovax", architecture="HyperCLOVAXForCausalLM",
                            model_config=hyperclovax_model_config, hf_config=hyperclovax_hf_config,
                            to_redline=hyperclovax_to_redline, to_hf=hyperclovax_to_hf, ignorable=_ignorable)
