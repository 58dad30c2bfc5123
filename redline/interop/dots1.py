"""dots.llm1 (Dots1ForCausalLM, model_type "dots1": rednote-hilab's dots.llm1.base / .inst): Qwen3's attention (QK-norm
per head before RoPE, q/k/v/o_proj without biases, head_dim wide) in pre-RMSNorm blocks, with DeepSeek-V3's mixture
of experts after the first first_k_dense_replace layers, which have a dense SwiGLU intermediate_size wide
(model.moe_dense_layers, moe_dense_hidden), as transformers' Dots1DecoderLayer builds them:
- the router (mlp.gate.weight (E, C)) scores each of n_routed_experts by its sigmoid (model.moe_gating=sigmoid);
  mlp.gate.e_score_correction_bias (model.moe_expert_bias) is added to choose the top num_experts_per_tok among the
  topk_group best of n_group groups (model.moe_groups, moe_topk_groups), the chosen scores rescaled to sum to 1
  (plus 1e-20: model.moe_norm_eps) where norm_topk_prob says (its default false), then scaled by
  routed_scaling_factor (model.moe_scale);
- the experts are SwiGLUs moe_intermediate_size wide: mlp.experts.j.gate_proj / up_proj / down_proj, the Hub's
  layout (transformers stacks them as it loads them), or stacked already (mlp.experts.gate_up_proj (E, 2F, C) rows
  [gate; up], as redline's fc, and down_proj (E, C, F));
- a shared SwiGLU of n_shared_experts x moe_intermediate_size every token passes through, added ungated
  (mlp.shared_experts.*: model.moe_shared_hidden, moe_shared_gate=false).
Windowed layers come from layer_types (sliding_attention from max_window_layers on where sliding_window is set, as
Dots1Config's __post_init__ lays them out). attention_bias (biases on q/k/v and o_proj), an activation other than
SiLU and configs without routed or shared experts are refused by name. Export writes the layout back (one tensor
per expert, zeros for the routing bias of a model without one) for a redline model with sigmoid-scored SwiGLU
experts on pre-RMSNorm blocks with Qwen3's attention. Semantics read from transformers' models/dots1/modular_dots1.py
and models/deepseek_v3/modeling_deepseek_v3.py (DeepseekV3TopkRouter, DeepseekV3MoE).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.afmoe import bias_problem
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import (_mlp_parts, _qkv, _rope, check_silu, hf_config_for, layer_windows, rope_scaling,
                                   shape_fields)
from redline.interop.moe import deepseek_experts_to_hf, deepseek_experts_to_redline
from redline.model import ModelConfig


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: dots.llm1 then has biases on q/k/v and o_proj, which redline's mixtures "
                        "of experts do not have")
    n = hf["num_hidden_layers"]
    experts, top_k = int(hf.get("n_routed_experts") or 0), int(hf.get("num_experts_per_tok") or 0)
    shared = int(hf.get("n_shared_experts") or 0)
    if not experts or not top_k or not shared:
        raise UserError(f"n_routed_experts={hf.get('n_routed_experts')}, num_experts_per_tok="
                        f"{hf.get('num_experts_per_tok')}, n_shared_experts={hf.get('n_shared_experts')}: dots.llm1's "
                        f"mixtures have routed and shared experts; the config must give all three")
    width, dense = int(hf.get("moe_intermediate_size", 1408)), int(hf.get("first_k_dense_replace") or 0)
    groups = int(hf.get("n_group") or 1)
    window, first = hf.get("sliding_window"), hf.get("max_window_layers", n)
    default = ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(n)]
    return ModelConfig(
        **{**shape_fields(hf), "mlp_hidden": width}, qk_norm=True, qk_norm_scope="head", fused_qkv=True,
        pos_emb="rope", mlp="swiglu", fused_mlp=True, norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False, moe_experts=experts, moe_top_k=top_k,
        moe_dense_layers=dense, moe_dense_hidden=int(hf.get("intermediate_size", 10944)) if dense else None,
        moe_gating="sigmoid", moe_expert_bias=True, moe_norm_topk=bool(hf.get("norm_topk_prob", False)),
        moe_norm_eps=1e-20, moe_scale=float(hf.get("routed_scaling_factor", 1.0)), moe_groups=groups,
        moe_topk_groups=int(hf.get("topk_group") or 1) if groups > 1 else 1, moe_shared_hidden=shared * width,
        moe_shared_gate=False, **layer_windows(hf, n, default), **_rope(hf))


def _prefix(src: TensorSource) -> str:
    return "" if "embed_tokens.weight" in src and "model.embed_tokens.weight" not in src else "model."


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = _prefix(src)
    out = {"norm_f.weight": src.take(pre + "norm.weight"),
           "wte.weight": pad_rows(src.take(pre + "embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        out[r + "attn.qkv.weight"] = torch.cat([src.take(f"{attn}{x}_proj.weight") for x in "qkv"])
        out[r + "attn.proj.weight"] = src.take(attn + "o_proj.weight")
        out[r + "attn.q_norm.weight"] = src.take(attn + "q_norm.weight")
        out[r + "attn.k_norm.weight"] = src.take(attn + "k_norm.weight")
        if not cfg.layer_has_experts(i):  # a dense first layer
            out[r + "mlp.fc.weight"] = torch.cat([src.take(mlp + "gate_proj.weight"), src.take(mlp + "up_proj.weight")])
            out[r + "mlp.proj.weight"] = src.take(mlp + "down_proj.weight")
            continue
        out.update(deepseek_experts_to_redline(src, p, r, cfg))
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.norm.weight": state["norm_f.weight"], "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size],
           **give_head(state, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
        for x, t in zip("qkv", _qkv(state, r, cfg, "weight")):
            out[f"{attn}{x}_proj.weight"] = t
        out[attn + "o_proj.weight"] = state[r + "attn.proj.weight"]
        out[attn + "q_norm.weight"] = state[r + "attn.q_norm.weight"]
        out[attn + "k_norm.weight"] = state[r + "attn.k_norm.weight"]
        if not cfg.layer_has_experts(i):
            out[mlp + "gate_proj.weight"], out[mlp + "up_proj.weight"] = _mlp_parts(state, r, cfg, "weight")
            out[mlp + "down_proj.weight"] = state[r + "mlp.proj.weight"]
            continue
        out.update(deepseek_experts_to_hf(state, p, r, cfg))
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(cfg: ModelConfig) -> dict:
    out = hf_config_for("qwen3")(cfg)  # Qwen3's attention, RoPE and shapes
    for key in ("use_sliding_window",):
        out.pop(key, None)
    kinds = ["sliding_attention" if cfg.layer_window(i) else "full_attention" for i in range(cfg.n_layer)]
    out.update(model_type="dots1", intermediate_size=cfg.moe_dense_hidden or cfg.hidden_dim,
               moe_intermediate_size=cfg.hidden_dim, n_routed_experts=cfg.moe_experts,
               n_shared_experts=cfg.moe_shared_hidden // cfg.hidden_dim, num_experts_per_tok=cfg.moe_top_k,
               first_k_dense_replace=cfg.moe_dense_layers, norm_topk_prob=cfg.moe_norm_topk,
               routed_scaling_factor=cfg.moe_scale, n_group=cfg.moe_groups, topk_group=cfg.moe_topk_groups,
               attention_bias=False, sliding_window=cfg.sliding_window or None, max_window_layers=cfg.n_layer,
               layer_types=kinds, output_router_logits=False)
    return out


def wants_dots1(cfg: ModelConfig) -> bool:
    """Experts scored by their sigmoid on blocks of attention and an MLP: of the architectures redline exports to,
    dots.llm1 alone (LFM2-MoE's have short convolutions beside them, Nemotron-H's blocks one sublayer; gated
    attention is Qwen3.5's and LFM3's, a parallel block under one norm Cohere2 MoE's, QK-norm after RoPE Hunyuan's:
    their checks name what they lack)."""
    return bool(cfg.moe_experts and cfg.moe_gating == "sigmoid" and not (
        cfg.conv_layers or cfg.delta_layers or cfg.mlp_free_layers or cfg.mixer_free_layers
        or cfg.attn_gate != "none" or cfg.parallel_shared_norm or cfg.qk_norm_after_rope))


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with sigmoid-scored experts that dots.llm1 does not have."""
    what = "sigmoid-scored experts (model.moe_gating=sigmoid): dots.llm1, the architecture with them,"
    raise_first([
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine
         or cfg.norm_bias or cfg.embed_norm or cfg.parallel_residual,
         f"{what} has pre-RMSNorm blocks run in turn (model.norm_position, norm, norm_unit_offset, norm_affine, "
         f"norm_bias, embed_norm, parallel_residual)"),
        (cfg.mlp != "swiglu", f"{what} has SwiGLU experts and MLPs (model.mlp={cfg.mlp})"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_layer_theta or cfg.rope_local_theta,
         f"{what} rotates every layer's whole heads with one RoPE (model.pos_emb, rope_dims, nope_interval, "
         f"rope_layer_theta, rope_local_theta)"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "head" or cfg.qk_norm_after_rope,
         f"{what} has Qwen3's QK-norm per head before RoPE (model.qk_norm, qk_norm_scope, qk_norm_after_rope)"),
        bias_problem(cfg, what),
        (not cfg.moe_shared_hidden or cfg.moe_shared_gate or cfg.moe_shared_hidden % cfg.hidden_dim,
         f"{what} has an ungated shared expert n_shared_experts x the experts' width wide (model.moe_shared_hidden="
         f"{cfg.moe_shared_hidden}, a multiple of {cfg.hidden_dim}; moe_shared_gate=false)"),
        (cfg.moe_norm_topk and cfg.moe_norm_eps > 1e-20,
         f"{what} adds 1e-20 to the chosen scores' sum (model.moe_norm_eps={cfg.moe_norm_eps}: set it to 1e-20)"),
        (cfg.moe_layers, f"{what} has its dense layers first (model.moe_dense_layers, not moe_layers)"),
        (cfg.attn_sinks or cfg.attn_gate != "none" or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap
         or cfg.value_embeddings or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier
         or cfg.logit_divisor,
         f"{what} has no attention sinks, gates, score scale or caps, value embeddings or scalars"),
    ])


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


FAMILY = Family(name="dots1", architecture="Dots1ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# HY-V3 (Tencent's HYV3ForCausalLM, model_type "hy_v3": Hy3-preview): dots.llm1's layout under other names and
# defaults. Apertus's attention (q/k/v/o_proj, per-head q_norm / k_norm RMSNorms before RoPE: Qwen3's), a kind per
# layer's MLP (`mlp_layer_types`: "dense", a SwiGLU intermediate_size wide, or "sparse"; without it the first layer
# dense), and DeepSeek-V3's routing without groups: sigmoid scores, the choosing bias as mlp.e_score_correction_bias
# (beside the router, not in it), the chosen scores always rescaled to sum to 1 (plus 1e-20), times
# router_scaling_factor; Qwen3-MoE's stacked SwiGLU experts and an ungated shared SwiGLU moe_intermediate_size x
# num_shared_experts wide (intermediate_size where that product is 0: HYV3MLP takes a width of 0 as "the config's").
# transformers adds the shared expert to the routed sum in fp32 (enable_moe_fp32_combine), one rounding as redline's
# add in the model's dtype. Its multi-token prediction layers (model.layers.N past the last) are left unread, as
# transformers leaves them. A model of this layout exports as dots.llm1. Semantics read from transformers'
# models/hy_v3/modular_hy_v3.py.

HY_V3_THETA = 11_158_840.0  # HYV3Config.default_theta


def hy_v3_model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            raise UserError(f"{key}=true on a HY-V3 model: redline's mixtures of experts have no attention or MLP "
                            f"biases")
    n = hf["num_hidden_layers"]
    kinds = hf.get("mlp_layer_types") or ["dense"] * min(n, 1) + ["sparse"] * max(n - 1, 0)
    if len(kinds) != n or not set(kinds) <= {"dense", "sparse"} or "sparse" not in kinds:
        raise UserError(f"mlp_layer_types {kinds}: expected {n} entries of dense / sparse, at least one sparse")
    sparse = tuple(i for i, kind in enumerate(kinds) if kind == "sparse")
    dense = sparse[0] if sparse == tuple(range(sparse[0], n)) else 0  # dense layers first: moe_dense_layers
    experts, top_k = int(hf.get("num_experts") or 0), int(hf.get("num_experts_per_tok") or 0)
    if not experts or not top_k:
        raise UserError(f"num_experts={hf.get('num_experts')}, num_experts_per_tok={hf.get('num_experts_per_tok')}: "
                        f"HY-V3's mixtures need both")
    width, dense_width = int(hf.get("moe_intermediate_size", 1536)), int(hf.get("intermediate_size", 13312))
    shared = width * int(hf.get("num_shared_experts") or 0) or dense_width
    params = dict(hf.get("rope_parameters") or {})
    if "rope_theta" not in params and "rope_theta" not in hf:
        params["rope_theta"] = HY_V3_THETA
    return ModelConfig(
        **{**shape_fields({**hf, "head_dim": hf.get("head_dim") or 128}, context_len=131_072), "mlp_hidden": width},
        qk_norm=True, qk_norm_scope="head", fused_qkv=True, pos_emb="rope", mlp="swiglu", fused_mlp=True,
        norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False, moe_experts=experts, moe_top_k=top_k, moe_dense_layers=dense,
        moe_layers=() if dense or len(sparse) == n else sparse,
        moe_dense_hidden=dense_width if len(sparse) < n else None, moe_gating="sigmoid", moe_expert_bias=True,
        moe_norm_topk=True, moe_norm_eps=1e-20, moe_scale=float(hf.get("router_scaling_factor", 2.826)),
        moe_shared_hidden=shared, moe_shared_gate=False, **_rope({**hf, "rope_parameters": params or None}))


# the Hub's names (what save_pretrained writes) -> transformers' in-memory ones, which to_redline reads (transformers'
# conversion_mapping.py renames them so as it loads a checkpoint)
_HY_V3_NAMES = ((".mlp.router.gate.weight", ".mlp.gate.weight"), (".mlp.expert_bias", ".mlp.e_score_correction_bias"),
                (".mlp.shared_mlp.", ".mlp.shared_experts."))


def _hy_v3_renamed(name: str, to_hub: bool) -> str:
    for hub, memory in _HY_V3_NAMES:
        old, new = (memory, hub) if to_hub else (hub, memory)
        if old in name:
            return name.replace(old, new)
    return name


def hy_v3_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    names = {_hy_v3_renamed(n, to_hub=False): n for n in src.names}
    view = TensorSource(names, lambda n: src.take(names[n]), src.where)
    out = to_redline(view, cfg)  # dots.llm1's, which takes the choosing bias beside the router too
    # the multi-token prediction layers past the last one: not part of the causal model
    pre = _prefix(src) + "layers."
    src.used.update(n for n in src.names if n.startswith(pre) and int(n[len(pre):].split(".")[0]) >= cfg.n_layer)
    return out


def hy_v3_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """to_hf's tensors in the Hub's names, as save_pretrained writes a HY-V3 checkpoint (the router as
    mlp.router.gate, the choosing bias as mlp.expert_bias, the shared expert as mlp.shared_mlp)."""
    out = {k.replace("mlp.gate.e_score_correction_bias", "mlp.e_score_correction_bias"): v
           for k, v in to_hf(state, cfg).items()}
    return {_hy_v3_renamed(k, to_hub=True): v for k, v in out.items()}


def hy_v3_hf_config(cfg: ModelConfig) -> dict:
    """HY-V3's config.json for a model of its layout (export_family sends one to dots.llm1, which has it)."""
    out = {key: value for key, value in hf_config_for("qwen3")(cfg).items()
           if key not in ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types", "rope_theta",
                          "rope_scaling")}
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(rope_scaling(cfg, "hy_v3") or {})}
    out.update(model_type="hy_v3", intermediate_size=cfg.moe_dense_hidden or cfg.hidden_dim,
               moe_intermediate_size=cfg.hidden_dim, num_experts=cfg.moe_experts, num_experts_per_tok=cfg.moe_top_k,
               num_shared_experts=cfg.moe_shared_hidden // cfg.hidden_dim, router_scaling_factor=cfg.moe_scale,
               mlp_layer_types=["sparse" if cfg.layer_has_experts(i) else "dense" for i in range(cfg.n_layer)],
               attention_bias=False, mlp_bias=False, rope_parameters=rope, output_router_logits=False)
    return out


HY_V3_FAMILY = Family(name="hy_v3", architecture="HYV3ForCausalLM", model_config=hy_v3_model_config,
                      hf_config=hy_v3_hf_config, to_redline=hy_v3_to_redline, to_hf=hy_v3_to_hf,
                      ignorable=_ignorable)
