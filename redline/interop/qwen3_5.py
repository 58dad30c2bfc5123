"""Qwen3.5 (Qwen's Qwen3.5 models: Qwen3_5ForCausalLM, model_type "qwen3_5_text", and the text model of
Qwen3_5ForConditionalGeneration, model_type "qwen3_5", whose weights sit under model.language_model.; the mixtures of
experts Qwen3_5MoeForCausalLM, "qwen3_5_moe_text", and Qwen3_5MoeForConditionalGeneration's text model,
"qwen3_5_moe"): a hybrid of gated delta nets and gated full attention, three to one by default (layer_types
"linear_attention" / "full_attention", else every full_attention_interval-th layer full).

- linear_attention layers: redline's GatedDeltaNet (model.delta_layers), its tensors linear_attn.in_proj_qkv
  (q, k, v rows), in_proj_z, in_proj_b, in_proj_a, conv1d.weight (channels, 1, kernel), A_log, dt_bias, norm.weight
  (the gated RMSNorm's, a head's width) and out_proj;
- full_attention layers: Qwen3's attention (per-head QK-norm before RoPE) whose q_proj holds, head by head, the
  head's queries then its output gate (H·2D rows: attn_gate=element, the gate rows split out into attn.gate), RoPE
  on the first partial_rotary_factor of each head (rope_dims; the text model's multimodal RoPE sections all take the
  token's one position, so they are plain RoPE);
- every RMSNorm scales by 1 + weight in fp32 (Gemma's: norm_unit_offset), QK-norm included;
- MLPs: dense SwiGLU (mlp.gate_proj / up_proj / down_proj), or in Qwen3.5-MoE on every layer num_experts SwiGLU
  experts (mlp.experts.j.*, moe_intermediate_size wide), the top num_experts_per_tok of a softmax router (mlp.gate)
  always rescaled to sum to 1, plus a shared expert (mlp.shared_expert.*) scaled by sigmoid(mlp.shared_expert_gate
  · x): redline's MoE with moe_norm_topk and moe_shared_hidden, Qwen2-MoE's tensor names (moe.py, which also reads
  experts saved stacked). transformers' save_pretrained writes one tensor per expert, and so do exports.
Qwen3-Next (qwen3_next.py) is the same hybrid with its delta nets' projections interleaved; it shares this module's
conversions. Semantics read from transformers' models/qwen3_5/modular_qwen3_5.py, qwen3_5_moe/modular_qwen3_5_moe.py
and qwen3_next/modular_qwen3_next.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import check_silu, shape_fields
from redline.interop import multimodal
from redline.interop.multimodal import text_view
from redline.model import ModelConfig

_DELTA = {"attn.in_proj": "in_proj_qkv", "attn.z": "in_proj_z", "attn.b": "in_proj_b", "attn.a": "in_proj_a"}
# redline's input projections of a delta net -> linear_attn.* (out_proj moves as it is)


def text_config(hf: dict) -> dict:
    """The text model's config: Qwen3_5Config's text_config (the head's tying the top-level flag's, as
    transformers reads it: multimodal.text_config), or hf itself."""
    return multimodal.text_config(hf, tie_default=False)


def _kinds(hf: dict) -> list[str]:
    n = hf["num_hidden_layers"]
    interval = int(hf.get("full_attention_interval", 4))
    kinds = hf.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                      for i in range(n)]
    if len(kinds) != n or not set(kinds) <= {"linear_attention", "full_attention"}:
        raise UserError(f"layer_types {kinds}: Qwen3.5 takes {n} entries, each linear_attention or full_attention")
    return kinds


def hybrid_config(hf: dict, mlp: dict) -> ModelConfig:
    """The ModelConfig of a Qwen3.5-layout text config (Qwen3-Next's too), its MLP fields `mlp` given by the caller
    (mlp_hidden and, for a mixture of experts, the moe_* fields)."""
    check_silu(hf)
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: Qwen3.5's attention biases are not supported (its other layers have "
                        "none)")
    params = dict(hf.get("rope_parameters") or {})
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise UserError(f"rope_parameters.rope_type={kind!r}: redline reads Qwen3.5's default RoPE only")
    fields = {**shape_fields({"intermediate_size": None, **hf}), **mlp}
    head_dim = hf.get("head_dim") or fields["n_embd"] // fields["n_head"]
    fraction = float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)))
    rotated = int(head_dim * fraction)
    kinds = _kinds(hf)
    return ModelConfig(
        **fields, qk_norm=True, fused_qkv=True, attn_gate="element", pos_emb="rope",
        rope_theta=float(params.get("rope_theta", hf.get("rope_theta", 10000.0))),
        rope_dims=rotated if rotated != head_dim else 0, mlp="swiglu", fused_mlp=True, norm="rmsnorm",
        norm_unit_offset=True, norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        delta_layers=tuple(i for i, k in enumerate(kinds) if k == "linear_attention"),
        delta_heads=int(hf.get("linear_num_value_heads", 32)), delta_key_heads=int(hf.get("linear_num_key_heads", 16)),
        delta_key_dim=int(hf.get("linear_key_head_dim", 128)),
        delta_value_dim=int(hf.get("linear_value_head_dim", 128)),
        delta_conv_kernel=int(hf.get("linear_conv_kernel_dim", 4)),
    )


def model_config(hf: dict) -> ModelConfig:
    hf = text_config(hf)
    return hybrid_config(hf, {"mlp_hidden": int(hf["intermediate_size"])})


def shared_expert_fields(hf: dict) -> dict:
    """The expert fields of a Qwen3.5-MoE / Qwen3-Next config (moe.expert_fields), with its shared expert."""
    from redline.interop.moe import expert_fields

    shared = int(hf.get("shared_expert_intermediate_size") or 0)
    if shared <= 0:
        raise UserError(f"shared_expert_intermediate_size={hf.get('shared_expert_intermediate_size')}: redline reads "
                        f"Qwen3.5-MoE and Qwen3-Next with their shared expert (a width above 0)")
    return {**expert_fields(hf, "moe_intermediate_size"), "moe_shared_hidden": shared}


def moe_model_config(hf: dict) -> ModelConfig:
    """Qwen3.5-MoE: every layer a mixture of experts, its router's top k always rescaled to sum to 1."""
    hf = text_config(hf)
    return hybrid_config(hf, {**shared_expert_fields(hf), "moe_norm_topk": True})


def wants_qwen3_5(cfg: ModelConfig) -> bool:
    """A model only Qwen3.5 (and Qwen3-Next) holds: gated delta nets, or an output gate on each element of the
    heads."""
    return bool(cfg.delta_layers) or cfg.attn_gate == "element"


def export_name(cfg: ModelConfig) -> str:
    """The family a model with delta nets or element-wise gates exports as: Qwen3.5 with dense MLPs, Qwen3.5-MoE
    with experts on every layer whose top k are rescaled, Qwen3-Next with dense first layers or top-k weights not
    rescaled (a UserError naming the option none of them has)."""
    check_exportable(cfg)
    if not cfg.moe_experts:
        return "qwen3_5_text"
    return "qwen3_5_moe_text" if cfg.moe_norm_topk and not cfg.moe_dense_layers else "qwen3_next"


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option that Qwen3.5, Qwen3.5-MoE and Qwen3-Next, the architectures with gated delta
    nets and element-wise attention gates redline exports to, do not have."""
    what = "model.delta_layers or model.attn_gate=element: Qwen3.5, the one architecture with them redline exports to,"
    experts = "model.moe_experts with model.delta_layers or attn_gate=element: Qwen3.5-MoE and Qwen3-Next"
    raise_first([
        (cfg.attn_gate != "element", f"{what} gates every element of its attention heads (model.attn_gate=element)"),
        (cfg.norm != "rmsnorm" or cfg.norm_position != "pre" or not cfg.norm_unit_offset or cfg.parallel_residual
         or cfg.embed_norm, f"{what} has pre-RMSNorms scaling by 1 + weight (model.norm_unit_offset), sublayers in "
                            f"turn"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "head" or cfg.qk_norm_after_rope,
         f"{what} normalizes q and k per head before RoPE (model.qk_norm)"),
        (cfg.mlp != "swiglu" or cfg.conv_layers, f"{what} has SwiGLU MLPs (or experts) and no convolution layers"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no biases (model.bias, model.qkv_bias)"),
        (cfg.pos_emb != "rope" or cfg.rope_scaling != "none" or cfg.nope_interval or cfg.rope_local_theta
         or cfg.rope_layer_theta, f"{what} rotates the first rope_dims of every attention layer's heads with one "
                                  f"unscaled RoPE"),
        (cfg.sliding_window or cfg.attn_sinks or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap
         or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.head_bias,
         f"{what} has no window, sinks, scales, caps or scalars"),
        (cfg.moe_experts and not (cfg.moe_shared_hidden and cfg.moe_shared_gate),
         f"{experts}, the architectures with both redline exports to, have a shared expert under a sigmoid gate "
         f"(model.moe_shared_hidden, model.moe_shared_gate)"),
        (cfg.moe_experts and (cfg.moe_gating != "softmax" or cfg.moe_expert_bias or cfg.moe_scale != 1.0
                              or cfg.moe_bias),
         f"{experts} weight their experts by a softmax over the router's logits: no sigmoid scores "
         f"(model.moe_gating), expert bias, weight scale or expert biases"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "model_type": "qwen3_5_text", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.context_len, "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                            "partial_rotary_factor": (cfg.rope_dims or cfg.head_dim) / cfg.head_dim},
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "attention_dropout": 0.0,
        "layer_types": ["linear_attention" if i in cfg.delta_layers else "full_attention" for i in range(cfg.n_layer)],
        "linear_num_value_heads": cfg.delta_heads or 1, "linear_num_key_heads": cfg.delta_key_heads or 1,
        "linear_key_head_dim": cfg.delta_key_dim, "linear_value_head_dim": cfg.delta_value_dim,
        "linear_conv_kernel_dim": cfg.delta_conv_kernel, "initializer_range": 0.02, "use_cache": True,
    }


def expert_config(cfg: ModelConfig) -> dict:
    """The expert entries Qwen3.5-MoE's and Qwen3-Next's configs share."""
    return {"num_experts": cfg.moe_experts, "num_experts_per_tok": cfg.moe_top_k,
            "moe_intermediate_size": cfg.hidden_dim, "shared_expert_intermediate_size": cfg.moe_shared_hidden,
            "output_router_logits": bool(cfg.moe_aux_loss), "router_aux_loss_coef": cfg.moe_aux_loss or 0.001}


def moe_hf_config(cfg: ModelConfig) -> dict:
    out = hf_config(cfg)
    del out["intermediate_size"]  # Qwen3_5MoeTextConfig has none: every layer's MLP is experts
    return {**out, **expert_config(cfg), "model_type": "qwen3_5_moe_text"}


def take_delta_projections(src: TensorSource, d: str, cfg: ModelConfig) -> dict:
    """Qwen3.5's delta-net input projections under prefix d (…linear_attn.) -> {redline's layer (attn.in_proj, attn.z,
    attn.b, attn.a): weight}."""
    return {ours: src.take(f"{d}{theirs}.weight") for ours, theirs in _DELTA.items()}


def give_delta_projections(weights: Mapping[str, torch.Tensor], d: str, cfg: ModelConfig) -> dict:
    """take_delta_projections' inverse: {d + their name.weight: weight}."""
    return {f"{d}{theirs}.weight": weights[ours] for ours, theirs in _DELTA.items()}


def _mlp_to_redline(src: TensorSource, p: str, r: str, cfg: ModelConfig, i: int) -> dict:
    if cfg.moe_experts and i >= cfg.moe_dense_layers:
        from redline.interop.moe import experts_to_redline

        return experts_to_redline(src, p, r, cfg)
    mlp = p + "mlp."
    return {r + "mlp.fc.weight": torch.cat([src.take(mlp + "gate_proj.weight"), src.take(mlp + "up_proj.weight")]),
            r + "mlp.proj.weight": src.take(mlp + "down_proj.weight")}


def _mlp_to_hf(state: Mapping[str, torch.Tensor], p: str, r: str, cfg: ModelConfig, i: int) -> dict:
    if cfg.moe_experts and i >= cfg.moe_dense_layers:
        from redline.interop.moe import experts_to_hf

        return experts_to_hf(state, p, r, cfg, "qwen2_moe")  # Qwen2-MoE's names, its shared expert and gate
    out = {}
    out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = state[r + "mlp.fc.weight"].chunk(2)
    out[p + "mlp.down_proj.weight"] = state[r + "mlp.proj.weight"]
    return out


def layer_to_redline(src: TensorSource, p: str, r: str, cfg: ModelConfig, i: int,
                     take_projections: Callable[[TensorSource, str, ModelConfig], dict] = take_delta_projections
                     ) -> dict:
    """Layer i's token mixer and MLP (HF names after p, model.layers.i.) -> redline's (after r, blocks.i.), its norms
    left to the caller (Qwen4-Exp's layers have hyper-connections instead: qwen4_exp.py)."""
    H, D = cfg.n_head, cfg.head_dim
    out = _mlp_to_redline(src, p, r, cfg, i)
    if i in cfg.delta_layers:
        d = p + "linear_attn."
        for ours, weight in take_projections(src, d, cfg).items():
            out[f"{r}{ours}.weight"] = weight
        out[r + "attn.proj.weight"] = src.take(d + "out_proj.weight")
        out[r + "attn.conv"] = src.take(d + "conv1d.weight")[:, 0]  # (channels, 1, K) -> (channels, K)
        for name in ("A_log", "dt_bias"):
            out[f"{r}attn.{name}"] = src.take(d + name)
        out[r + "attn.norm"] = src.take(d + "norm.weight")
        return out
    a = p + "self_attn."
    q, gate = src.take(a + "q_proj.weight").view(H, 2, D, -1).unbind(1)  # each head: its queries, its gate
    out[r + "attn.qkv.weight"] = torch.cat([q.reshape(H * D, -1), src.take(a + "k_proj.weight"),
                                            src.take(a + "v_proj.weight")])
    out[r + "attn.gate.weight"] = gate.reshape(H * D, -1)
    out[r + "attn.proj.weight"] = src.take(a + "o_proj.weight")
    out[r + "attn.q_norm.weight"] = src.take(a + "q_norm.weight")
    out[r + "attn.k_norm.weight"] = src.take(a + "k_norm.weight")
    return out


def layer_to_hf(state: Mapping[str, torch.Tensor], p: str, r: str, cfg: ModelConfig, i: int,
                give_projections: Callable[[Mapping[str, torch.Tensor], str, ModelConfig], dict]
                = give_delta_projections) -> dict:
    """layer_to_redline's inverse."""
    H, D = cfg.n_head, cfg.head_dim
    out = _mlp_to_hf(state, p, r, cfg, i)
    if i in cfg.delta_layers:
        d = p + "linear_attn."
        out.update(give_projections({ours: state[f"{r}{ours}.weight"] for ours in _DELTA}, d, cfg))
        out[d + "out_proj.weight"] = state[r + "attn.proj.weight"]
        out[d + "conv1d.weight"] = state[r + "attn.conv"][:, None]
        for name in ("A_log", "dt_bias"):
            out[d + name] = state[f"{r}attn.{name}"]
        out[d + "norm.weight"] = state[r + "attn.norm"]
        return out
    a = p + "self_attn."
    q, k, v = state[r + "attn.qkv.weight"].split([H * D, cfg.kv_heads * D, cfg.kv_heads * D])
    gate = state[r + "attn.gate.weight"]
    out[a + "q_proj.weight"] = torch.stack([q.view(H, D, -1), gate.view(H, D, -1)], dim=1).reshape(2 * H * D, -1)
    out[a + "k_proj.weight"], out[a + "v_proj.weight"] = k, v
    out[a + "o_proj.weight"] = state[r + "attn.proj.weight"]
    out[a + "q_norm.weight"] = state[r + "attn.q_norm.weight"]
    out[a + "k_norm.weight"] = state[r + "attn.k_norm.weight"]
    return out


def to_redline(src: TensorSource, cfg: ModelConfig,
               take_projections: Callable[[TensorSource, str, ModelConfig], dict] = take_delta_projections) -> dict:
    """HF-named tensors -> redline's; take_projections reads a delta net's input projections (Qwen3-Next's are laid
    out otherwise)."""
    src = text_view(src)  # Qwen3_5ForConditionalGeneration's model.language_model. read as model.
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
           "norm_f.weight": src.take("model.norm.weight")}
    out.update(take_head(src, cfg))
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        out.update(layer_to_redline(src, p, r, cfg, i, take_projections))
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig,
          give_projections: Callable[[Mapping[str, torch.Tensor], str, ModelConfig], dict] = give_delta_projections
          ) -> dict:
    """redline's tensors -> HF-named ones; give_projections writes a delta net's input projections."""
    V = cfg.vocab_size
    out = {"model.embed_tokens.weight": state["wte.weight"][:V], "model.norm.weight": state["norm_f.weight"]}
    out.update(give_head(state, cfg))
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
        out.update(layer_to_hf(state, p, r, cfg, i, give_projections))
    return {k: v.contiguous() for k, v in out.items()}


def ignorable(name: str) -> bool:
    """The multimodal checkpoints' vision tower and multi-token-prediction layers, which the text model does not
    run."""
    return name.startswith(("model.visual.", "mtp.", "visual."))


TEXT_FAMILY = Family(name="qwen3_5_text", architecture="Qwen3_5ForCausalLM", model_config=model_config,
                     hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=ignorable)
# Qwen3_5ForConditionalGeneration's folders: the text model is read; exports are the text model (TEXT_FAMILY)
FAMILY = Family(name="qwen3_5", architecture="Qwen3_5ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=ignorable)
MOE_TEXT_FAMILY = Family(name="qwen3_5_moe_text", architecture="Qwen3_5MoeForCausalLM", model_config=moe_model_config,
                         hf_config=moe_hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=ignorable)
# Qwen3_5MoeForConditionalGeneration's folders, read and exported as FAMILY's are
MOE_FAMILY = Family(name="qwen3_5_moe", architecture="Qwen3_5MoeForCausalLM", model_config=moe_model_config,
                    hf_config=moe_hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=ignorable)
