"""Kolibri-1 (Kolibri1ForCausalLM, model_type "kolibri1": Aleph Alpha's Kolibri-1): EXAONE 4.0's attention (per-head
QK-norm before RoPE; the sliding_attention layers of layer_types windowed and rotating, the full_attention ones
without RoPE) in GLM-4's blocks, plain RMSNorms on each sublayer's
input and output (model.norm_position=sandwich), every MLP a mixture, as transformers' Kolibri1DecoderLayer builds it:
- the router (mlp.gate.weight (E, C)) chooses the top num_experts_per_tok of its logits plus a bias (the Hub's
  moe.router.expert_bias, transformers' mlp.gate.e_score_correction_bias: model.moe_expert_bias with
  moe_bias_on_logits) and weights each chosen expert by its logit's sigmoid (model.moe_gating=sigmoid), rescaled to
  sum to 1 without an epsilon where norm_topk_prob (model.moe_norm_eps=0); no scale;
- SwiGLU experts moe_intermediate_size wide (mlp.experts.j.*, or stacked) and an ungated shared SwiGLU
  shared_expert_intermediate_size wide (mlp.shared_experts.*: model.moe_shared_hidden, moe_shared_gate=false);
- the norms: input_layernorm, post_attn_norm (transformers' post_self_attn_layernorm), post_attention_layernorm (the
  MLP's input), post_ffn_norm (transformers' post_mlp_layernorm); either name is read.
Refused by name: an activation other than SiLU, no shared expert, no sliding_window (transformers' model then fails
building its mask). A redline model whose routing bias joins the
logits (model.moe_bias_on_logits, Kolibri-1's alone) exports as Kolibri-1. Semantics read from transformers'
models/kolibri1/modular_kolibri1.py, models/exaone4 and models/glm4.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.afmoe import (_rotation, bias_problem, other_layer_problems, qk_norm_problem, rotation_problems,
                                   shared_expert_problem)
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import _qkv, _rope, check_silu, layer_windows, rope_scaling, shape_fields
from redline.interop.moe import experts_to_hf, experts_to_redline, expert_fields
from redline.model import ModelConfig

# redline's norm: (the Hub's name, transformers' in-memory name)
_NORMS = {"norm1": ("input_layernorm", "input_layernorm"), "attn_out_norm": ("post_attn_norm",
                                                                             "post_self_attn_layernorm"),
          "norm2": ("post_attention_layernorm", "post_attention_layernorm"),
          "mlp_out_norm": ("post_ffn_norm", "post_mlp_layernorm")}
_BIAS = ("moe.router.expert_bias", "mlp.gate.e_score_correction_bias")  # the Hub's, transformers' in-memory


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    n = hf["num_hidden_layers"]
    shared = int(hf.get("shared_expert_intermediate_size") or 0)
    if not shared:
        raise UserError(f"shared_expert_intermediate_size={hf.get('shared_expert_intermediate_size')}: Kolibri-1's "
                        f"mixtures have a shared expert; the config must give its width")
    default = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(n)]
    kinds = hf.get("layer_types") or default
    if not hf.get("sliding_window"):  # Kolibri1Model builds its sliding mask whatever the layer types
        raise UserError(f"sliding_window={hf.get('sliding_window')}: transformers' Kolibri-1 needs a window (its "
                        f"model builds the windowed layers' mask in any case); the config names no model it runs")
    rope = _rope(hf)
    return ModelConfig(
        **{**shape_fields(hf, context_len=262144), **expert_fields(hf, "moe_intermediate_size")}, qk_norm=True,
        qk_norm_scope="head", fused_qkv=True, mlp="swiglu", fused_mlp=True, norm="rmsnorm", norm_position="sandwich",
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=False, moe_gating="sigmoid", moe_expert_bias=True, moe_bias_on_logits=True,
        moe_norm_topk=bool(hf.get("norm_topk_prob", False)), moe_norm_eps=0.0, moe_shared_hidden=shared,
        moe_shared_gate=False, **layer_windows(hf, n, default), **rope,
        **_rotation([k == "sliding_attention" for k in kinds], rope["rope_theta"]))


def _prefix(src: TensorSource) -> str:
    return "" if "embed_tokens.weight" in src and "model.embed_tokens.weight" not in src else "model."


def _either(src: TensorSource, p: str, names: tuple[str, str]) -> torch.Tensor:
    return src.take(p + (names[0] if p + names[0] in src else names[1]))


def _routed_alone(cfg: ModelConfig) -> ModelConfig:
    """cfg without the routing bias and shared expert, whose names moe.py's Qwen-MoE layout does not give."""
    return replace(cfg, moe_expert_bias=False, moe_bias_on_logits=False, moe_shared_hidden=0)


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = _prefix(src)
    out = {"norm_f.weight": src.take(pre + "norm.weight"),
           "wte.weight": pad_rows(src.take(pre + "embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        attn = p + "self_attn."
        for ours, theirs in _NORMS.items():
            out[f"{r}{ours}.weight"] = _either(src, p, tuple(f"{t}.weight" for t in theirs))
        out[r + "attn.qkv.weight"] = torch.cat([src.take(f"{attn}{x}_proj.weight") for x in "qkv"])
        out[r + "attn.proj.weight"] = src.take(attn + "o_proj.weight")
        out[r + "attn.q_norm.weight"] = src.take(attn + "q_norm.weight")
        out[r + "attn.k_norm.weight"] = src.take(attn + "k_norm.weight")
        # Qwen-MoE's router and experts; the shared experts under DeepSeek's name
        out.update(experts_to_redline(src, p, r, _routed_alone(cfg)))
        out[r + "mlp.expert_bias"] = _either(src, p, _BIAS).float()
        shared = p + "mlp.shared_experts."
        out[r + "mlp.shared.fc.weight"] = torch.cat([src.take(shared + "gate_proj.weight"),
                                                     src.take(shared + "up_proj.weight")])
        out[r + "mlp.shared.proj.weight"] = src.take(shared + "down_proj.weight")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.norm.weight": state["norm_f.weight"], "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size],
           **give_head(state, cfg)}
    plain = _routed_alone(cfg)
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        attn = p + "self_attn."
        for ours, (theirs, _) in _NORMS.items():
            out[f"{p}{theirs}.weight"] = state[f"{r}{ours}.weight"]
        for x, t in zip("qkv", _qkv(state, r, cfg, "weight")):
            out[f"{attn}{x}_proj.weight"] = t
        out[attn + "o_proj.weight"] = state[r + "attn.proj.weight"]
        out[attn + "q_norm.weight"] = state[r + "attn.q_norm.weight"]
        out[attn + "k_norm.weight"] = state[r + "attn.k_norm.weight"]
        out.update(experts_to_hf(state, p, r, plain, "qwen3_moe"))
        out[p + _BIAS[0]] = state[r + "mlp.expert_bias"].float()
        shared = p + "mlp.shared_experts."
        out[shared + "gate_proj.weight"], out[shared + "up_proj.weight"] = state[r + "mlp.shared.fc.weight"].chunk(2)
        out[shared + "down_proj.weight"] = state[r + "mlp.shared.proj.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(cfg: ModelConfig) -> dict:
    # the windowed layers rotate and the full ones not (rotation_problems); a model without a window: its rotating
    # layers windowed by the whole context
    kinds = ["sliding_attention" if cfg.pos_emb == "rope" and cfg.layer_rope(i) else "full_attention"
             for i in range(cfg.n_layer)]
    return {
        "model_type": "kolibri1", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "moe_intermediate_size": cfg.hidden_dim, "shared_expert_intermediate_size": cfg.moe_shared_hidden,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "max_position_embeddings": cfg.context_len,
        "rms_norm_eps": cfg.norm_eps, "rope_theta": max(cfg.rope_layer_theta) if cfg.rope_layer_theta
        else cfg.rope_theta, "rope_scaling": rope_scaling(cfg, "kolibri1"), "tie_word_embeddings": cfg.tie_embeddings,
        "num_experts": cfg.moe_experts, "num_experts_per_tok": cfg.moe_top_k, "norm_topk_prob": cfg.moe_norm_topk,
        "sliding_window": cfg.sliding_window or cfg.context_len,
        "layer_types": kinds, "output_router_logits": False, "attention_dropout": 0.0, "initializer_range": 0.02,
        "use_cache": True,
    }


def wants_kolibri1(cfg: ModelConfig) -> bool:
    """A routing bias that joins the router's logits: Kolibri-1's alone among the architectures redline exports to."""
    return cfg.moe_bias_on_logits


def check_exportable(cfg: ModelConfig) -> None:
    what = "model.moe_bias_on_logits: Kolibri-1, the one architecture with it redline exports to,"
    raise_first([
        (cfg.norm_position != "sandwich" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine
         or cfg.embed_norm or cfg.parallel_residual,
         f"{what} has plain RMSNorms on each sublayer's input and output (model.norm_position=sandwich; norm, "
         f"norm_unit_offset, norm_affine, embed_norm, parallel_residual)"),
        (cfg.mlp != "swiglu", f"{what} has SwiGLU experts (model.mlp={cfg.mlp})"),
        qk_norm_problem(cfg, what),
        *rotation_problems(cfg, what), *other_layer_problems(cfg, what),
        bias_problem(cfg, what),
        shared_expert_problem(cfg, what),
        (cfg.moe_norm_topk and cfg.moe_norm_eps,
         f"{what} divides the chosen scores by their sum alone (model.moe_norm_eps={cfg.moe_norm_eps}: set it to 0)"),
        (cfg.moe_dense_layers or cfg.moe_layers or cfg.moe_scale != 1.0 or cfg.moe_groups > 1 or cfg.moe_weight_input,
         f"{what} has experts on every layer, weighted by their scores alone (model.moe_dense_layers, moe_layers, "
         f"moe_scale, moe_groups, moe_weight_input)"),
        (cfg.attn_gate != "none" or cfg.attn_sinks or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap
         or cfg.value_embeddings or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier
         or cfg.logit_divisor or cfg.kv_lora_rank,
         f"{what} has no attention gates or sinks, score scale or caps, value embeddings, latent attention or "
         f"scalars"),
    ])


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


FAMILY = Family(name="kolibri1", architecture="Kolibri1ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
