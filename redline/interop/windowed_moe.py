"""Qwen3-MoE's attention and experts with windowed layers and dense MLP layers named per layer: Mellum and Flint.
Both keep the Llama layout's tensor names (llama.py's to_redline / to_hf, experts under mlp.gate and
mlp.experts.j.*, moe.py), so only their configs are read here.

- Mellum (MellumForCausalLM, model_type "mellum": JetBrains' Mellum2): Qwen3-MoE's block (per-head QK-norm before
  RoPE, softmax router, top num_experts_per_tok rescaled where norm_topk_prob) with layer_types (sliding_attention
  layers windowed: model.sliding_window with sliding_window_pattern or window_layers) and RoPE parameters per layer
  type (rope_parameters keyed by full_attention / sliding_attention, as Gemma 3's: the full layers' base and scaling
  as rope_theta / rope_scaling, the windowed layers' unscaled base as model.rope_local_theta); mlp_layer_types
  names each layer's MLP dense (a SwiGLU intermediate_size wide) or sparse (model.moe_dense_layers where the dense
  ones come first, else model.moe_layers; moe_dense_hidden). Its multi-token-prediction layer (mtp.*) is left out,
  as transformers leaves it. Refused: attention_bias, a partial_rotary_factor (transformers' Mellum attention rotates
  whole heads), scaled RoPE on the windowed layers. A softmax-scored mixture with per-head QK-norm whose layers are
  windowed or dense in part exports as Mellum.
- Flint (FlintForCausalLM, model_type "flint": RecursiveSI's flint): Qwen3-MoE's attention with a learned sink
  logit per head (self_attn.sinks: model.attn_sinks), the sliding_attention layers windowed and rotating, the
  full_attention ones (the first two, every fourth from 1 and the last by default) without RoPE (as AFMoE's:
  afmoe._rotation); the router's sigmoid scores (model.moe_gating=sigmoid, no bias), the top k rescaled to sum to 1
  without an epsilon where norm_topk_prob (model.moe_norm_eps=0), beside an ungated shared expert
  shared_expert_intermediate_size wide (mlp.shared_expert.*: moe_shared_gate=false); the sinks stored as
  self_attn.softmax_offset (transformers' name for them in memory, sinks, read too); dense layers where
  mlp_only_layers or decoder_sparse_step say (Qwen3-MoE's rule). Refused: attention_bias, no shared expert.
  Sigmoid-scored experts with attention sinks export as Flint.
Semantics read from transformers' models/mellum/modular_mellum.py, models/laguna/modular_laguna.py (Mellum's layer
and rotary embedding) and models/flint/modular_flint.py.
"""

from __future__ import annotations

from redline.errors import UserError
from redline.interop.afmoe import (_rotation, bias_problem, other_layer_problems, qk_norm_problem, rotation_problems,
                                   shared_expert_problem)
from redline.interop.families import Family, TensorSource, raise_first
from redline.interop.gemma3 import _rope_fields
from redline.interop.llama import _ignorable, _rope, check_silu, layer_windows, rope_scaling, shape_fields, to_hf, \
    to_redline
from redline.interop.moe import expert_fields
from redline.model import ModelConfig

_FULL, _SLIDING = "full_attention", "sliding_attention"


def _mlp_layers(sparse: list[bool], hf: dict) -> dict:
    """ModelConfig's fields for the layers whose MLP is the mixture: every one (nothing to set), the dense ones first
    (moe_dense_layers), or any other set (moe_layers); the dense MLPs intermediate_size wide."""
    if not any(sparse):
        raise UserError("no layer has experts (mlp_layer_types / mlp_only_layers): redline reads this family's "
                        "mixtures of experts, and this config names a dense model")
    if all(sparse):
        return {}
    dense = {"moe_dense_hidden": int(hf["intermediate_size"])}
    first = sparse.index(True)
    if all(sparse[first:]):
        return {"moe_dense_layers": first, **dense}
    return {"moe_layers": tuple(i for i, s in enumerate(sparse) if s), **dense}


def _no_attention_bias(hf: dict, arch: str) -> None:
    check_silu(hf)
    if hf.get("attention_bias"):
        raise UserError(f"attention_bias=true: {arch} then has biases on q/k/v and o_proj, which redline's mixtures "
                        f"of experts do not have")


def mellum_model_config(hf: dict) -> ModelConfig:
    _no_attention_bias(hf, "Mellum")
    n = hf["num_hidden_layers"]
    kinds = hf.get("layer_types") or [_FULL] * n
    params = hf.get("rope_parameters") or {}
    for kind in (_FULL, _SLIDING):
        factor = (params.get(kind) or {}).get("partial_rotary_factor", 1.0)
        if factor != 1.0:
            raise UserError(f"rope_parameters[{kind!r}].partial_rotary_factor={factor}: transformers' Mellum "
                            f"attention rotates whole heads (its rotary tables would not fit the heads); the config "
                            f"names no model transformers runs")
    if not (_FULL in params or _SLIDING in params):  # MellumConfig's defaults
        params = {_FULL: {"rope_type": "default", "rope_theta": 500000.0},
                  _SLIDING: {"rope_type": "default", "rope_theta": 10000.0}}
    windows = layer_windows({**hf, "layer_types": kinds}, n, kinds)
    mlp_kinds = hf.get("mlp_layer_types") or ["sparse"] * n
    if len(mlp_kinds) != n or not set(mlp_kinds) <= {"sparse", "dense"}:
        raise UserError(f"mlp_layer_types {mlp_kinds}: expected {n} entries of sparse / dense")
    return ModelConfig(
        **{**shape_fields(hf), **expert_fields(hf, "moe_intermediate_size")}, qk_norm=True, qk_norm_scope="head",
        fused_qkv=True, pos_emb="rope", mlp="swiglu", fused_mlp=True, norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=False, moe_norm_topk=bool(hf.get("norm_topk_prob", True)), **windows,
        **_rope_fields({**hf, "rope_parameters": params}, windowed=bool(windows["sliding_window"])),
        **_mlp_layers([k == "sparse" for k in mlp_kinds], hf))


def _mellum_hf_config(cfg: ModelConfig) -> dict:
    full = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(rope_scaling(cfg, "mellum") or {})}
    local = {"rope_type": "default", "rope_theta": cfg.rope_local_theta or cfg.rope_theta}
    if cfg.rope_scaling != "none" and not cfg.rope_local_theta:  # the windowed layers take the full ones' RoPE
        local = full
    return {
        "model_type": "mellum", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.moe_dense_hidden or cfg.hidden_dim, "moe_intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "max_position_embeddings": cfg.context_len,
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "sliding_window": cfg.sliding_window or None, "num_experts": cfg.moe_experts,
        "num_experts_per_tok": cfg.moe_top_k, "norm_topk_prob": cfg.moe_norm_topk,
        "output_router_logits": bool(cfg.moe_aux_loss), "router_aux_loss_coef": cfg.moe_aux_loss or 0.001,
        "layer_types": [_SLIDING if cfg.layer_window(i) else _FULL for i in range(cfg.n_layer)],
        "mlp_layer_types": ["sparse" if cfg.layer_has_experts(i) else "dense" for i in range(cfg.n_layer)],
        "rope_parameters": {_FULL: full, _SLIDING: local}, "attention_dropout": 0.0, "initializer_range": 0.02,
        "use_cache": True,
    }


def wants_mellum(cfg: ModelConfig) -> bool:
    """A softmax-scored mixture with Qwen3's attention and windowed or dense layers (or a RoPE base of the windowed
    layers' own): Mellum's alone among the architectures redline exports to (Qwen3-MoE attends to the whole context
    with experts on every layer; QK-norm after RoPE is Hunyuan MoE's, whose check names what it lacks)."""
    return bool(cfg.moe_experts and cfg.moe_gating == "softmax" and cfg.qk_norm and cfg.qk_norm_scope == "head"
                and not (cfg.qk_norm_after_rope or cfg.moe_expert_bias or cfg.attn_sinks or cfg.parallel_shared_norm or cfg.conv_layers
                         or cfg.delta_layers or cfg.mlp_free_layers or cfg.mixer_free_layers)
                and (cfg.sliding_window or cfg.moe_dense_layers or cfg.moe_layers or cfg.rope_local_theta))


def check_mellum_exportable(cfg: ModelConfig) -> None:
    what = ("softmax-scored experts with QK-norm and windowed or dense layers: Mellum, the architecture with them "
            "redline exports to,")
    raise_first([
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine
         or cfg.embed_norm or cfg.parallel_residual,
         f"{what} has pre-RMSNorm blocks run in turn (model.norm_position, norm, norm_unit_offset, norm_affine, "
         f"embed_norm, parallel_residual)"),
        (cfg.mlp != "swiglu", f"{what} has SwiGLU experts and MLPs (model.mlp={cfg.mlp})"),
        *other_layer_problems(cfg, what),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_layer_theta,
         f"{what} rotates every layer's whole heads (model.pos_emb, rope_dims, nope_interval, rope_layer_theta)"),
        bias_problem(cfg, what),
        (cfg.moe_shared_hidden, f"{what} has no shared expert (model.moe_shared_hidden={cfg.moe_shared_hidden})"),
        (cfg.moe_scale != 1.0 or cfg.moe_groups > 1 or cfg.moe_norm_min or cfg.moe_weight_input,
         f"{what} weights the experts by their probabilities alone (model.moe_scale, moe_groups, moe_norm_min, "
         f"moe_weight_input)"),
        (cfg.attn_gate != "none" or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap or cfg.value_embeddings
         or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor,
         f"{what} has no attention gates, score scale or caps, value embeddings or scalars"),
    ])


def _mellum_ignorable(name: str) -> bool:
    return _ignorable(name) or name.startswith("mtp.")  # the multi-token-prediction layer transformers leaves out


MELLUM_FAMILY = Family(name="mellum", architecture="MellumForCausalLM", model_config=mellum_model_config,
                       hf_config=_mellum_hf_config, to_redline=to_redline,
                       to_hf=lambda state, cfg: to_hf(state, cfg, "mellum"), ignorable=_mellum_ignorable)


def flint_model_config(hf: dict) -> ModelConfig:
    _no_attention_bias(hf, "Flint")
    n = hf["num_hidden_layers"]
    shared = int(hf.get("shared_expert_intermediate_size") or 0)
    if not shared:
        raise UserError(f"shared_expert_intermediate_size={hf.get('shared_expert_intermediate_size')}: Flint's "
                        f"mixtures have a shared expert; the config must give its width")
    default = [_FULL if i < 2 or i % 4 == 1 or i == n - 1 else _SLIDING for i in range(n)]
    kinds = hf.get("layer_types") or default
    windows = layer_windows(hf, n, default)
    rope = _rope(hf)
    dense = hf.get("mlp_only_layers")
    dense = [0, 1] if dense is None else dense
    step = int(hf.get("decoder_sparse_step") or 1)
    experts = expert_fields(hf, "moe_intermediate_size")
    sparse = [i not in dense and (i + 1) % step == 0 for i in range(n)]
    return ModelConfig(
        **{**shape_fields(hf), **experts}, qk_norm=True, qk_norm_scope="head", fused_qkv=True, attn_sinks=True,
        mlp="swiglu", fused_mlp=True, norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False, moe_gating="sigmoid",
        moe_norm_topk=bool(hf.get("norm_topk_prob", True)), moe_norm_eps=0.0, moe_shared_hidden=shared,
        moe_shared_gate=False, **windows, **rope, **_rotation([k == _SLIDING for k in kinds], rope["rope_theta"]),
        **_mlp_layers(sparse, hf))


def _flint_hf_config(cfg: ModelConfig) -> dict:
    from redline.interop.afmoe import hf_config as afmoe_config

    out = afmoe_config(cfg)  # the same rotating windowed and NoPE full layers
    sparse = [cfg.layer_has_experts(i) for i in range(cfg.n_layer)]
    out.update(model_type="flint", shared_expert_intermediate_size=cfg.moe_shared_hidden,
               norm_topk_prob=cfg.moe_norm_topk, decoder_sparse_step=1,
               mlp_only_layers=[i for i, s in enumerate(sparse) if not s],
               output_router_logits=bool(cfg.moe_aux_loss), router_aux_loss_coef=cfg.moe_aux_loss or 0.0005)
    for key in ("num_dense_layers", "num_shared_experts", "route_scale", "global_attn_every_n_layers",
                "mup_enabled"):
        out.pop(key)
    return out


def wants_flint(cfg: ModelConfig) -> bool:
    """Sigmoid-scored experts with attention sinks: Flint's alone among the architectures redline exports to."""
    return bool(cfg.moe_experts and cfg.moe_gating == "sigmoid" and cfg.attn_sinks)


def check_flint_exportable(cfg: ModelConfig) -> None:

    what = "sigmoid-scored experts with attention sinks: Flint, the architecture with them redline exports to,"
    raise_first([
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine
         or cfg.embed_norm or cfg.parallel_residual,
         f"{what} has pre-RMSNorm blocks run in turn (model.norm_position, norm, norm_unit_offset, norm_affine, "
         f"embed_norm, parallel_residual)"),
        (cfg.mlp != "swiglu", f"{what} has SwiGLU experts and MLPs (model.mlp={cfg.mlp})"),
        qk_norm_problem(cfg, what),
        *rotation_problems(cfg, what), *other_layer_problems(cfg, what),
        bias_problem(cfg, what),
        shared_expert_problem(cfg, what),
        (cfg.moe_norm_topk and cfg.moe_norm_eps,
         f"{what} divides the chosen scores by their sum alone (model.moe_norm_eps={cfg.moe_norm_eps}: set it to 0)"),
        (cfg.moe_expert_bias or cfg.moe_scale != 1.0 or cfg.moe_groups > 1 or cfg.moe_norm_min
         or cfg.moe_weight_input,
         f"{what} weights the chosen experts by their scores alone (model.moe_expert_bias, moe_scale, moe_groups, "
         f"moe_norm_min, moe_weight_input)"),
        (cfg.attn_gate != "none" or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap or cfg.value_embeddings
         or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor,
         f"{what} has no attention gates, score scale or caps, value embeddings or scalars"),
    ])


# Flint's files name each head's sink logit self_attn.softmax_offset (transformers renames it sinks as it loads them)
_SINKS, _HUB_SINKS = "self_attn.sinks", "self_attn.softmax_offset"


def _flint_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    theirs = {name.replace(_HUB_SINKS, _SINKS): name for name in src.names}  # the in-memory name: read as it is
    return to_redline(TensorSource(theirs, lambda name: src.take(theirs[name]), src.where), cfg)


def _flint_to_hf(state, cfg: ModelConfig) -> dict:
    return {name.replace(_SINKS, _HUB_SINKS): t for name, t in to_hf(state, cfg, "flint").items()}


FLINT_FAMILY = Family(name="flint", architecture="FlintForCausalLM", model_config=flint_model_config,
                      hf_config=_flint_hf_config, to_redline=_flint_to_redline, to_hf=_flint_to_hf,
                      ignorable=_ignorable)
