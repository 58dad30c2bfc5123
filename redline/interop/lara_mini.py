"""Lara Mini (LaraMiniForCausalLM, model_type "lara_mini": translated's Lara-4-Mini): Qwen3-Next's hybrid of gated
delta nets and attention, with Qwen3.5's delta nets and four differences, each a ModelConfig field redline has:

- layer_types of three kinds: "linear_attention" (Qwen3.5's gated delta net: redline's GatedDeltaNet, as
  qwen3_5.py reads it), "sliding_attention" (Qwen3's attention with per-head QK-norm and RoPE over the whole head,
  the last sliding_window tokens: model.window_layers) and "full_attention" (the same attention over the whole
  context without RoPE, NoPE: model.rope_layer_theta 0 on those layers). No output gate on the attention;
- plain RMSNorms (weight times the normed input, not Qwen3-Next's 1 + weight), QK-norm and the delta nets' gated
  norm included;
- every layer a mixture of experts: the top num_experts_per_tok of a softmax router (mlp.gate), rescaled where
  norm_topk_prob, plus a shared expert added in full, without Qwen3-Next's sigmoid gate (model.moe_shared_gate
  false); the experts stacked as transformers holds them (mlp.experts.gate_up_proj (E, 2F, C), rows [gate; up],
  and mlp.experts.down_proj (E, C, F)), which is how its save_pretrained writes them;
- the delta nets' input projections in one tensor, linear_attn.in_proj, rows [q | k | v | z | b | a] (the Hub's
  layout, which transformers' conversion_mapping splits into Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b and
  in_proj_a as it loads and fuses again as it saves), and the gated norm named linear_attn.out_norm. Files holding
  the split names are read too; exports write the fused ones.
RoPE is the default one over whole heads (a partial_rotary_factor, which transformers' Qwen3 attention cannot
apply, or another rope_type is refused), biases are refused. Semantics read from transformers'
models/lara_mini/modular_lara_mini.py, configuration_lara_mini.py and conversion_mapping.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop import qwen3_5
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import check_silu, shape_fields
from redline.model import ModelConfig

_KINDS = ("linear_attention", "sliding_attention", "full_attention")
_PATTERN = ["linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention"]
# LaraMiniConfig's default layer_types, repeated over the layers (the released models' period of 5)


def layer_kinds(hf: dict) -> list[str]:
    n = hf["num_hidden_layers"]
    kinds = hf.get("layer_types") or [_PATTERN[i % len(_PATTERN)] for i in range(n)]
    if len(kinds) != n or not set(kinds) <= set(_KINDS):
        raise UserError(f"layer_types {kinds}: Lara Mini takes {n} entries, each one of {', '.join(_KINDS)}")
    return kinds


def model_config(hf: dict) -> ModelConfig:
    from redline.interop.moe import expert_fields

    check_silu(hf)
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: Lara Mini's attention biases are not supported (its other layers have "
                        "none)")
    params = dict(hf.get("rope_parameters") or {})
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise UserError(f"rope_parameters.rope_type={kind!r}: redline reads Lara Mini's default RoPE only")
    fraction = float(params.get("partial_rotary_factor", 1.0))
    if fraction != 1.0:
        raise UserError(f"rope_parameters.partial_rotary_factor={fraction}: Lara Mini's attention (Qwen3's) rotates "
                        f"whole heads; transformers cannot apply RoPE to part of them")
    shared = int(hf.get("shared_expert_intermediate_size") or 0)
    if shared <= 0:
        raise UserError(f"shared_expert_intermediate_size={hf.get('shared_expert_intermediate_size')}: Lara Mini's "
                        f"layers have a shared expert (a width above 0)")
    kinds = layer_kinds(hf)
    windowed = tuple(i for i, k in enumerate(kinds) if k == "sliding_attention")
    window = int(hf.get("sliding_window") or 0)
    if windowed and window <= 0:
        raise UserError(f"sliding_window={hf.get('sliding_window')}: Lara Mini's sliding_attention layers need a "
                        f"window of 1 or more tokens")
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope = dict(pos_emb="rope", rope_theta=theta, window_layers=windowed, sliding_window=window,
                rope_layer_theta=tuple(theta if i in windowed else 0.0 for i in range(len(kinds))))
    if not windowed:  # no layer rotates or windows: every attention layer is NoPE
        rope = dict(pos_emb="none")
    return ModelConfig(
        **{**shape_fields({"intermediate_size": None, **hf}), **expert_fields(hf, "moe_intermediate_size")},
        moe_norm_topk=bool(hf.get("norm_topk_prob", True)), moe_shared_hidden=shared, moe_shared_gate=False,
        qk_norm=True, fused_qkv=True, mlp="swiglu", fused_mlp=True, norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        delta_layers=tuple(i for i, k in enumerate(kinds) if k == "linear_attention"),
        delta_heads=int(hf.get("linear_num_value_heads", 16)), delta_key_heads=int(hf.get("linear_num_key_heads", 8)),
        delta_key_dim=int(hf.get("linear_key_head_dim", 128)),
        delta_value_dim=int(hf.get("linear_value_head_dim", 128)),
        delta_conv_kernel=int(hf.get("linear_conv_kernel_dim", 4)), **rope)


def wants_lara_mini(cfg: ModelConfig) -> bool:
    """A model only Lara Mini holds among the exports: Qwen3.5's gated delta nets beside attention without an output
    gate (OLMo Hybrid's output-norm blocks are decided before)."""
    return bool(cfg.delta_layers) and cfg.delta_rule == "gated_delta" and cfg.attn_gate != "element"


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option Lara Mini, the one architecture redline exports gated delta nets beside
    ungated attention to, does not have."""
    what = "model.delta_layers without model.attn_gate=element: Lara Mini, the architecture with them redline " \
           "exports to,"
    rotating = [i for i in cfg.attention_layers if cfg.layer_rope(i)] if cfg.pos_emb == "rope" else []
    windowed = [i for i in cfg.attention_layers if cfg.layer_window(i)]
    raise_first([
        (cfg.attn_gate != "none", f"{what} has no output gate on its attention (model.attn_gate)"),
        (cfg.norm != "rmsnorm" or cfg.norm_position != "pre" or cfg.norm_unit_offset or cfg.parallel_residual
         or cfg.embed_norm or not cfg.norm_affine or cfg.delta_norm_position,
         f"{what} has pre-RMSNorms with plain weights (no model.norm_unit_offset), sublayers in turn"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "head" or cfg.qk_norm_after_rope,
         f"{what} normalizes q and k per head before RoPE (model.qk_norm)"),
        (cfg.mlp != "swiglu" or cfg.conv_layers or cfg.mlp_free_layers or cfg.mixer_free_layers,
         f"{what} has SwiGLU experts on every layer and no convolution layers"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no biases (model.bias, model.qkv_bias)"),
        (rotating != windowed or cfg.rope_dims or cfg.rope_scaling != "none" or cfg.rope_local_theta
         or len({cfg.rope_layer_theta[i] for i in rotating} if cfg.rope_layer_theta else {cfg.rope_theta}) > 1
         or (cfg.pos_emb not in ("rope", "none")) or (cfg.pos_emb == "none" and windowed),
         f"{what} rotates its windowed attention layers' whole heads with one unscaled RoPE and its full layers not "
         f"at all (model.window_layers, model.rope_layer_theta)"),
        (cfg.attn_sinks or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap or cfg.embed_scale
         or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.head_bias or cfg.attn_chunk
         or cfg.delta_beta_scale != 1.0 or cfg.delta_norm_eps,
         f"{what} has no sinks, scales, caps or scalars"),
        (not cfg.moe_experts or cfg.moe_dense_layers or cfg.moe_layers or not cfg.moe_shared_hidden
         or cfg.moe_shared_gate, f"{what} has experts on every layer and a shared expert without a gate "
                                 f"(model.moe_experts, model.moe_shared_hidden, model.moe_shared_gate=false)"),
        (cfg.moe_gating != "softmax" or cfg.moe_expert_bias or cfg.moe_scale != 1.0 or cfg.moe_bias
         or cfg.moe_groups > 1 or cfg.moe_norm_min,
         f"{what} weights its experts by a softmax over the router's logits: no sigmoid scores (model.moe_gating), "
         f"expert bias, groups, weight scale or expert biases"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    kinds = ["linear_attention" if i in cfg.delta_layers else
             "sliding_attention" if cfg.layer_window(i) else "full_attention" for i in range(cfg.n_layer)]
    windows = [cfg.layer_window(i) for i in range(cfg.n_layer) if cfg.layer_window(i)]
    theta = next((t for t in cfg.rope_layer_theta if t), cfg.rope_theta)
    return {
        "model_type": "lara_mini", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "max_position_embeddings": cfg.context_len,
        "rms_norm_eps": cfg.norm_eps, "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "attention_dropout": 0.0,
        "layer_types": kinds, "sliding_window": windows[0] if windows else cfg.context_len,
        "linear_num_value_heads": cfg.delta_heads, "linear_num_key_heads": cfg.delta_key_heads,
        "linear_key_head_dim": cfg.delta_key_dim, "linear_value_head_dim": cfg.delta_value_dim,
        "linear_conv_kernel_dim": cfg.delta_conv_kernel, "moe_intermediate_size": cfg.hidden_dim,
        "shared_expert_intermediate_size": cfg.moe_shared_hidden, "num_experts": cfg.moe_experts,
        "num_experts_per_tok": cfg.moe_top_k, "norm_topk_prob": cfg.moe_norm_topk,
        "output_router_logits": bool(cfg.moe_aux_loss), "router_aux_loss_coef": cfg.moe_aux_loss or 0.001,
        "initializer_range": 0.02, "use_cache": True,
    }


def _split(cfg: ModelConfig) -> list[int]:
    """The row counts of a fused in_proj: q, k and v (redline's in_proj), z, b, a."""
    H, Hk, Dk, Dv = cfg.delta_heads, cfg.delta_key_heads, cfg.delta_key_dim, cfg.delta_value_dim
    return [2 * Hk * Dk + H * Dv, H * Dv, H, H]


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
           "norm_f.weight": src.take("model.norm.weight")}
    out.update(take_head(src, cfg))
    from redline.interop.moe import experts_to_redline

    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        out.update(experts_to_redline(src, p, r, cfg))
        if i in cfg.delta_layers:
            d = p + "linear_attn."
            if d + "in_proj.weight" in src:  # the Hub's fused rows [q | k | v | z | b | a]
                parts = src.take(d + "in_proj.weight").split(_split(cfg))
                out.update({f"{r}{ours}.weight": t for ours, t in zip(("attn.in_proj", "attn.z", "attn.b", "attn.a"),
                                                                       parts)})
            else:  # transformers' in-memory names, Qwen3.5's
                out.update({f"{r}{ours}.weight": t for ours, t in qwen3_5.take_delta_projections(src, d, cfg).items()})
            out[r + "attn.proj.weight"] = src.take(d + "out_proj.weight")
            out[r + "attn.conv"] = src.take(d + "conv1d.weight")[:, 0]  # (channels, 1, K) -> (channels, K)
            for name in ("A_log", "dt_bias"):
                out[f"{r}attn.{name}"] = src.take(d + name)
            out[r + "attn.norm"] = src.take(d + ("out_norm.weight" if d + "out_norm.weight" in src else "norm.weight"))
            continue
        a = p + "self_attn."
        out[r + "attn.qkv.weight"] = torch.cat([src.take(a + f"{n}_proj.weight") for n in "qkv"])
        out[r + "attn.proj.weight"] = src.take(a + "o_proj.weight")
        out[r + "attn.q_norm.weight"] = src.take(a + "q_norm.weight")
        out[r + "attn.k_norm.weight"] = src.take(a + "k_norm.weight")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    V, D = cfg.vocab_size, cfg.head_dim
    out = {"model.embed_tokens.weight": state["wte.weight"][:V], "model.norm.weight": state["norm_f.weight"]}
    out.update(give_head(state, cfg))
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
        m = p + "mlp."
        out[m + "gate.weight"] = state[r + "mlp.router.weight"]
        out[m + "experts.gate_up_proj"], out[m + "experts.down_proj"] = state[r + "mlp.fc"], state[r + "mlp.proj"]
        s = m + "shared_expert."
        out[s + "gate_proj.weight"], out[s + "up_proj.weight"] = state[r + "mlp.shared.fc.weight"].chunk(2)
        out[s + "down_proj.weight"] = state[r + "mlp.shared.proj.weight"]
        if i in cfg.delta_layers:
            d = p + "linear_attn."
            out[d + "in_proj.weight"] = torch.cat([state[f"{r}attn.{n}.weight"] for n in ("in_proj", "z", "b", "a")])
            out[d + "out_proj.weight"] = state[r + "attn.proj.weight"]
            out[d + "conv1d.weight"] = state[r + "attn.conv"][:, None]
            for name in ("A_log", "dt_bias"):
                out[d + name] = state[f"{r}attn.{name}"]
            out[d + "out_norm.weight"] = state[r + "attn.norm"]
            continue
        a = p + "self_attn."
        out[a + "q_proj.weight"], out[a + "k_proj.weight"], out[a + "v_proj.weight"] = state[
            r + "attn.qkv.weight"].split([cfg.n_head * D, cfg.kv_heads * D, cfg.kv_heads * D])
        out[a + "o_proj.weight"] = state[r + "attn.proj.weight"]
        out[a + "q_norm.weight"] = state[r + "attn.q_norm.weight"]
        out[a + "k_norm.weight"] = state[r + "attn.k_norm.weight"]
    return {k: v.contiguous() for k, v in out.items()}


FAMILY = Family(name="lara_mini", architecture="LaraMiniForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf)
