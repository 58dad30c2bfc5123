"""AFMoE (AfmoeForCausalLM, model_type "afmoe": Arcee's Trinity-Mini, Trinity-Nano): Llama's attention with a
per-head QK-norm before RoPE and a sigmoid gate on every element of the heads' output (self_attn.gate_proj,
model.attn_gate=element), in blocks with RMSNorms on each sublayer's input and output (input_layernorm,
post_attention_layernorm, pre_mlp_layernorm, post_mlp_layernorm: model.norm_position=sandwich), as transformers'
AfmoeDecoderLayer builds them:
- layer_types: sliding_attention layers attend to the last sliding_window tokens and rotate (RoPE); the
  full_attention layers (every global_attn_every_n_layers-th by default) attend to the whole context WITHOUT RoPE
  (AfmoeAttention rotates only its local layers): model.nope_interval where they fall on every N-th layer, else
  model.rope_layer_theta (rope_theta on the rotating layers, 0 on the others);
- the first num_dense_layers layers have a dense SwiGLU intermediate_size wide (model.moe_dense_layers,
  moe_dense_hidden), the others a mixture: the router (mlp.router.gate.weight (E, C)) scores each of num_experts by
  its sigmoid (model.moe_gating=sigmoid), mlp.expert_bias (model.moe_expert_bias) added to choose the top
  num_experts_per_tok, the chosen scores always rescaled to sum to 1 (plus 1e-20: model.moe_norm_eps) and times
  route_scale (model.moe_scale); SwiGLU experts moe_intermediate_size wide (mlp.experts.j.*, or stacked
  gate_up_proj / down_proj) and an ungated shared SwiGLU num_shared_experts experts wide (mlp.shared_experts.*:
  model.moe_shared_hidden, moe_shared_gate=false);
- mup_enabled scales the token embeddings by sqrt(hidden_size) (model.embed_multiplier).
Refused by name: attention_bias, an activation other than SiLU, no routed or shared experts. Export writes the layout
back for a redline model with sigmoid-scored experts and element-wise attention gates or sandwich norms, whose
rotating layers are exactly its windowed ones. Semantics read from transformers' models/afmoe/modular_afmoe.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import _mlp_parts, _qkv, _rope, check_silu, layer_windows, rope_scaling, shape_fields
from redline.model import ModelConfig

_NORMS = {"norm1": "input_layernorm", "attn_out_norm": "post_attention_layernorm", "norm2": "pre_mlp_layernorm",
          "mlp_out_norm": "post_mlp_layernorm"}


def _rotation(rotates: list[bool], theta: float) -> dict:
    """ModelConfig's fields for the layers that rotate: every one (nothing to set), none (no positions), all but every
    N-th (nope_interval), or any other set (rope_layer_theta, 0 where a layer does not rotate)."""
    n = len(rotates)
    if all(rotates):
        return {"pos_emb": "rope"}
    if not any(rotates):
        return {"pos_emb": "none"}
    interval = rotates.index(False) + 1
    if rotates == [(i + 1) % interval != 0 for i in range(n)]:
        return {"pos_emb": "rope", "nope_interval": interval}
    return {"pos_emb": "rope", "rope_layer_theta": tuple(theta if r else 0.0 for r in rotates)}


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: AFMoE then has biases on q/k/v and o_proj, which redline's mixtures of "
                        "experts do not have")
    n = hf["num_hidden_layers"]
    experts, top_k = int(hf.get("num_experts") or 0), int(hf.get("num_experts_per_tok") or 0)
    shared = int(hf.get("num_shared_experts") or 0)
    if not experts or not top_k or not shared:
        raise UserError(f"num_experts={hf.get('num_experts')}, num_experts_per_tok={hf.get('num_experts_per_tok')}, "
                        f"num_shared_experts={hf.get('num_shared_experts')}: redline reads AFMoE's mixtures with "
                        f"routed and shared experts; the config must give all three above 0")
    width, dense = int(hf.get("moe_intermediate_size", 1408)), int(hf.get("num_dense_layers") or 0)
    every = int(hf.get("global_attn_every_n_layers") or 4)
    default = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    kinds = hf.get("layer_types") or default
    windows = layer_windows(hf, n, default)
    rope = _rope(hf)
    return ModelConfig(
        **{**shape_fields(hf), "mlp_hidden": width}, qk_norm=True, qk_norm_scope="head", fused_qkv=True,
        attn_gate="element", mlp="swiglu", fused_mlp=True, norm="rmsnorm", norm_position="sandwich",
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=False, embed_multiplier=math.sqrt(hf["hidden_size"]) if hf.get("mup_enabled") else 0.0,
        moe_experts=experts, moe_top_k=top_k, moe_dense_layers=dense,
        moe_dense_hidden=int(hf.get("intermediate_size", 6144)) if dense else None, moe_gating="sigmoid",
        moe_expert_bias=True, moe_norm_topk=True, moe_norm_eps=1e-20, moe_scale=float(hf.get("route_scale") or 1.0),
        moe_shared_hidden=shared * width, moe_shared_gate=False, **windows, **rope,
        **_rotation([k == "sliding_attention" for k in kinds], rope["rope_theta"]))


def _prefix(src: TensorSource) -> str:
    return "" if "embed_tokens.weight" in src and "model.embed_tokens.weight" not in src else "model."


def _swiglu_to_redline(src: TensorSource, prefix: str) -> torch.Tensor:
    """(gate; up) rows of the SwiGLU under prefix, as redline's fused fc."""
    return torch.cat([src.take(prefix + "gate_proj.weight"), src.take(prefix + "up_proj.weight")])


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = _prefix(src)
    out = {"norm_f.weight": src.take(pre + "norm.weight"),
           "wte.weight": pad_rows(src.take(pre + "embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        for ours, theirs in _NORMS.items():
            out[f"{r}{ours}.weight"] = src.take(f"{p}{theirs}.weight")
        out[r + "attn.qkv.weight"] = torch.cat([src.take(f"{attn}{x}_proj.weight") for x in "qkv"])
        out[r + "attn.proj.weight"] = src.take(attn + "o_proj.weight")
        out[r + "attn.q_norm.weight"] = src.take(attn + "q_norm.weight")
        out[r + "attn.k_norm.weight"] = src.take(attn + "k_norm.weight")
        out[r + "attn.gate.weight"] = src.take(attn + "gate_proj.weight")
        if not cfg.layer_has_experts(i):  # a dense first layer
            out[r + "mlp.fc.weight"] = _swiglu_to_redline(src, mlp)
            out[r + "mlp.proj.weight"] = src.take(mlp + "down_proj.weight")
            continue
        out[r + "mlp.router.weight"] = src.take(mlp + "router.gate.weight")
        out[r + "mlp.expert_bias"] = src.take(mlp + "expert_bias").float()
        if mlp + "experts.gate_up_proj" in src:  # transformers' in-memory layout: (E, 2F, C) rows [gate; up], (E, C, F)
            out[r + "mlp.fc"] = src.take(mlp + "experts.gate_up_proj")
            out[r + "mlp.proj"] = src.take(mlp + "experts.down_proj")
        else:  # the Hub's: one tensor per expert
            e = [f"{mlp}experts.{j}." for j in range(cfg.moe_experts)]
            out[r + "mlp.fc"] = torch.stack([_swiglu_to_redline(src, x) for x in e])
            out[r + "mlp.proj"] = torch.stack([src.take(x + "down_proj.weight") for x in e])
        out[r + "mlp.shared.fc.weight"] = _swiglu_to_redline(src, mlp + "shared_experts.")
        out[r + "mlp.shared.proj.weight"] = src.take(mlp + "shared_experts.down_proj.weight")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.norm.weight": state["norm_f.weight"], "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size],
           **give_head(state, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        for ours, theirs in _NORMS.items():
            out[f"{p}{theirs}.weight"] = state[f"{r}{ours}.weight"]
        for x, t in zip("qkv", _qkv(state, r, cfg, "weight")):
            out[f"{attn}{x}_proj.weight"] = t
        out[attn + "o_proj.weight"] = state[r + "attn.proj.weight"]
        out[attn + "q_norm.weight"] = state[r + "attn.q_norm.weight"]
        out[attn + "k_norm.weight"] = state[r + "attn.k_norm.weight"]
        out[attn + "gate_proj.weight"] = state[r + "attn.gate.weight"]
        if not cfg.layer_has_experts(i):
            out[mlp + "gate_proj.weight"], out[mlp + "up_proj.weight"] = _mlp_parts(state, r, cfg, "weight")
            out[mlp + "down_proj.weight"] = state[r + "mlp.proj.weight"]
            continue
        out[mlp + "router.gate.weight"] = state[r + "mlp.router.weight"]
        bias = state.get(r + "mlp.expert_bias")  # zeros choose as no bias does
        out[mlp + "expert_bias"] = torch.zeros(cfg.moe_experts) if bias is None else bias.float()
        for j, (fc, proj) in enumerate(zip(state[r + "mlp.fc"], state[r + "mlp.proj"])):
            out[f"{mlp}experts.{j}.gate_proj.weight"], out[f"{mlp}experts.{j}.up_proj.weight"] = fc.chunk(2)
            out[f"{mlp}experts.{j}.down_proj.weight"] = proj
        shared = mlp + "shared_experts."
        out[shared + "gate_proj.weight"], out[shared + "up_proj.weight"] = state[r + "mlp.shared.fc.weight"].chunk(2)
        out[shared + "down_proj.weight"] = state[r + "mlp.shared.proj.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(cfg: ModelConfig) -> dict:
    theta = max(cfg.rope_layer_theta) if cfg.rope_layer_theta else cfg.rope_theta
    # every layer rotating without a window: windowed layers whose window spans the whole context
    window = cfg.sliding_window or (cfg.context_len if cfg.pos_emb == "rope" else 0)
    kinds = ["sliding_attention" if cfg.pos_emb == "rope" and cfg.layer_rope(i) else "full_attention"
             for i in range(cfg.n_layer)]
    return {
        "model_type": "afmoe", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.moe_dense_hidden or cfg.hidden_dim, "moe_intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layer, "num_dense_layers": cfg.moe_dense_layers,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
        "hidden_act": "silu", "max_position_embeddings": cfg.context_len, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": theta, "rope_scaling": rope_scaling(cfg, "afmoe"), "tie_word_embeddings": cfg.tie_embeddings,
        "num_experts": cfg.moe_experts, "num_experts_per_tok": cfg.moe_top_k,
        "num_shared_experts": cfg.moe_shared_hidden // cfg.hidden_dim, "route_scale": cfg.moe_scale,
        "sliding_window": window or None, "layer_types": kinds, "global_attn_every_n_layers": cfg.n_layer,
        "mup_enabled": bool(cfg.embed_multiplier), "attention_bias": False, "attention_dropout": 0.0,
        "output_router_logits": False, "initializer_range": 0.02, "use_cache": True,
    }


def wants_afmoe(cfg: ModelConfig) -> bool:
    """Sigmoid-scored experts under element-wise attention gates or sandwich norms: of the architectures redline
    exports to, AFMoE alone (Qwen3.5-MoE's gated attention has softmax experts and norms by 1 + weight, Gemma 4's
    sandwich experts run beside a dense MLP, partial RoPE is GLM-4-MoE's; gated delta nets and short convolutions are
    theirs: their checks name what they lack)."""
    return bool(cfg.moe_experts and cfg.moe_gating == "sigmoid"
                and not (cfg.moe_beside_dense or cfg.norm_unit_offset or cfg.rope_dims)
                and (cfg.attn_gate == "element" or cfg.norm_position == "sandwich")
                and not (cfg.conv_layers or cfg.delta_layers or cfg.mlp_free_layers or cfg.mixer_free_layers))


def qk_norm_problem(cfg: ModelConfig, what: str) -> tuple[bool, str]:
    """For raise_first: a model without the per-head QK-norm before RoPE that AFMoE, Flint, Mellum, Kolibri-1 and
    Laguna have."""
    return (not cfg.qk_norm or cfg.qk_norm_scope != "head" or cfg.qk_norm_after_rope,
            f"{what} has QK-norm per head before RoPE (model.qk_norm, qk_norm_scope, qk_norm_after_rope)")


def bias_problem(cfg: ModelConfig, what: str) -> tuple[bool, str]:
    """For raise_first: a model with biases, which none of these mixtures (nor dots.llm1's) has."""
    return (cfg.bias or cfg.has_qkv_bias or cfg.moe_bias or cfg.head_bias,
            f"{what} has no biases (model.bias, qkv_bias, moe_bias, head_bias)")


def shared_expert_problem(cfg: ModelConfig, what: str) -> tuple[bool, str]:
    """For raise_first: a model without the one ungated shared expert of any width Flint, Kolibri-1 and Laguna
    have."""
    return (not cfg.moe_shared_hidden or cfg.moe_shared_gate,
            f"{what} has an ungated shared expert (model.moe_shared_hidden={cfg.moe_shared_hidden}, "
            f"moe_shared_gate=false)")


def rotation_problems(cfg: ModelConfig, what: str) -> list[tuple[bool, str]]:
    """For raise_first: what keeps a model's layers from being AFMoE's (and Flint's) two kinds, windowed layers that
    rotate by one RoPE base and full layers that do not."""
    rotating = [cfg.pos_emb == "rope" and cfg.layer_rope(i) for i in range(cfg.n_layer)]
    windowed = [bool(cfg.layer_window(i)) for i in range(cfg.n_layer)]
    return [
        (cfg.pos_emb not in ("rope", "none") or cfg.rope_dims or cfg.rope_local_theta
         or len({t for t in cfg.rope_layer_theta if t}) > 1,
         f"{what} rotates whole heads by one RoPE base (model.pos_emb, rope_dims, rope_local_theta, "
         f"rope_layer_theta)"),
        (any(windowed) and windowed != rotating,
         f"{what} rotates exactly its windowed layers and none of its full ones (model.sliding_window, "
         f"sliding_window_pattern, window_layers against nope_interval, rope_layer_theta)"),
        (not any(windowed) and any(rotating) and not all(rotating),
         f"{what} rotates its windowed layers alone: layers without RoPE among rotating ones need a window on the "
         f"rotating ones (model.sliding_window)"),
    ]


def other_layer_problems(cfg: ModelConfig, what: str) -> list[tuple[bool, str]]:
    """For raise_first: the layers of other architectures (Gemma 4's and Gemma 3n's, recurrent and convolution
    layers, blocks of one sublayer, shared attention blocks, differential attention, BitNet's) that AFMoE, Flint,
    Mellum, Kolibri-1 and Laguna have none of."""
    named = [name for name in ("v_norm", "layer_scalars", "per_layer_embd", "kv_shared_layers", "global_head_size",
                               "global_kv_head", "global_values_from_keys", "altup_streams", "laurel_rank",
                               "mlp_sparsity", "conv_layers", "delta_layers", "mlp_free_layers", "mixer_free_layers",
                               "moe_beside_dense", "attn_chunk", "nope_temperature", "rope_qk_norm", "qk_layernorm",
                               "attn_sinks_windowed", "shared_attn_layers", "moe_post_norm", "diff_attention",
                               "attn_key_bias", "residual_scales", "sub_norms")
             if getattr(cfg, name, None)]
    if getattr(cfg, "bitlinear", "off") != "off":
        named.append("bitlinear")
    return [(bool(named), f"{what} has no such layers (model.{named[0] if named else ''})")]


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model wants_afmoe chose that AFMoE does not have."""
    what = "sigmoid-scored experts with element-wise attention gates or sandwich norms: AFMoE, the architecture with them,"
    raise_first([
        (cfg.norm_position != "sandwich" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine
         or cfg.embed_norm or cfg.parallel_residual,
         f"{what} has plain RMSNorms on each sublayer's input and output (model.norm_position=sandwich; norm, "
         f"norm_unit_offset, norm_affine, embed_norm, parallel_residual)"),
        (cfg.attn_gate != "element", f"{what} gates every element of its heads' output (model.attn_gate=element)"),
        (cfg.mlp != "swiglu", f"{what} has SwiGLU experts and MLPs (model.mlp={cfg.mlp})"),
        qk_norm_problem(cfg, what),
        *rotation_problems(cfg, what), *other_layer_problems(cfg, what),
        (cfg.embed_multiplier and abs(cfg.embed_multiplier - math.sqrt(cfg.n_embd)) > 1e-9 * cfg.embed_multiplier,
         f"{what} scales its embeddings by sqrt(n_embd) or not at all (model.embed_multiplier="
         f"{cfg.embed_multiplier})"),
        bias_problem(cfg, what),
        (not cfg.moe_shared_hidden or cfg.moe_shared_gate or cfg.moe_shared_hidden % cfg.hidden_dim,
         f"{what} has an ungated shared expert num_shared_experts x the experts' width wide (model.moe_shared_hidden="
         f"{cfg.moe_shared_hidden}, a multiple of {cfg.hidden_dim}; moe_shared_gate=false)"),
        (not cfg.moe_norm_topk or cfg.moe_norm_eps > 1e-20,
         f"{what} rescales the chosen scores to sum to 1 plus 1e-20 (model.moe_norm_topk=true, moe_norm_eps=1e-20)"),
        (cfg.moe_groups > 1 or cfg.moe_layers or cfg.moe_weight_input or cfg.moe_norm_min,
         f"{what} chooses among all experts, its dense layers first (model.moe_groups, moe_layers, moe_weight_input, "
         f"moe_norm_min)"),
        (cfg.attn_sinks or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap or cfg.value_embeddings
         or cfg.embed_scale or cfg.residual_multiplier or cfg.logit_divisor or cfg.kv_lora_rank,
         f"{what} has no attention sinks, score scale or caps, value embeddings, latent attention or other scalars"),
    ])


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


FAMILY = Family(name="afmoe", architecture="AfmoeForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
