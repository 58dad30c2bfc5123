"""ZAYA (ZayaForCausalLM, model_type "zaya": Zyphra's ZAYA1), as transformers' models/zaya/modeling_zaya.py builds
it: pre-RMSNorm blocks of compressed convolutional attention (model.cca_kernels) and a mixture of SwiGLU experts under
an MLP router (model.moe_router_hidden), each sublayer's output joining the stream through ZayaResidualScaling
(model.residual_affine, the embeddings' input_hidden_states_scale / _bias too):
- attention: self_attn.qkv_proj.{q_proj, k_proj, v_proj_current, v_proj_delayed} (attn.q, k, v, v_delayed), its two
  convolutions conv_qk_depthwise (cca_time0 wide) and conv_qk_grouped (cca_time1 wide, one group a head), the key
  heads' scale self_attn.qk_norm.temp (attn.key_scale), o_proj; RoPE on the first partial_rotary_factor of each head
  (model.rope_dims), rope_parameters keyed by layer type (hybrid: full layers, rope_theta; hybrid_sliding: windowed,
  rope_local_theta and rope_local_dims);
- MLP: mlp.gate.{down_proj, router_states_scale, router_mlp.{norm, fc1, fc2, out_proj}, balancing_biases} (mlp.router,
  state_scale, router_norm, router_fc1, router_fc2, router_out, balance_bias), mlp.experts.{gate_up_proj, down_proj}
  (mlp.fc, mlp.proj).
Refused by name: attention_bias (biased projections: redline's CCA layers take none), lm_head_bias,
num_experts_per_tok other than 1 (transformers' ZAYA refuses it too), a RoPE scaling, rope_parameters without an
entry for each layer type used (transformers' ZAYA could not build its rotary tables). A redline model with
model.cca_kernels, ZAYA's alone, exports as ZAYA.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import check_silu, layer_windows, shape_fields
from redline.model import ModelConfig

_FULL, _SLIDING = "hybrid", "hybrid_sliding"
_DEFAULT_ROPE = {_FULL: {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.5},
                 _SLIDING: {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5}}


def _rope_params(hf: dict, kinds: list[str]) -> dict:
    """rope_parameters keyed by layer type (transformers' defaults where the config gives none); a UserError where
    they leave out a layer type the model has (transformers' ZayaRotaryEmbedding could not be built)."""
    given = dict(hf.get("rope_parameters") or {})
    params = {k: v for k, v in given.items() if k in (_FULL, _SLIDING)}
    if given and not params:
        raise UserError(f"rope_parameters {given} name no layer type (hybrid, hybrid_sliding): transformers' ZAYA "
                        f"reads each layer's RoPE by its type, so the config names no model it runs")
    missing = sorted({k for k in kinds if params and k not in params})
    if missing:
        raise UserError(f"rope_parameters have no entry for layer type {missing[0]}, which layer_types uses: "
                        f"transformers' ZAYA could not rotate those layers")
    out = {kind: dict(params.get(kind) or _DEFAULT_ROPE[kind]) for kind in (_FULL, _SLIDING)}
    for kind, p in out.items():
        if p.get("rope_type", "default") != "default":
            raise UserError(f"rope_parameters.{kind}.rope_type={p['rope_type']!r}: redline rotates ZAYA's layers "
                            f"with an unscaled base (rope_type default)")
    return out


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    raise_first([
        (bool(hf.get("attention_bias")), "attention_bias=true: ZAYA then has biases on its q/k/v and output "
                                         "projections, which redline's CCA layers do not have"),
        (bool(hf.get("lm_head_bias")), "lm_head_bias=true: redline's output head has no bias"),
        (int(hf.get("num_experts_per_tok", 1)) != 1,
         f"num_experts_per_tok={hf.get('num_experts_per_tok')}: ZAYA's router chooses one expert a token "
         f"(transformers' ZayaConfig refuses any other)"),
    ])
    n, heads = hf["num_hidden_layers"], hf["num_attention_heads"]
    head_dim = int(hf.get("head_dim") or 128)
    kinds = hf.get("layer_types") or [_FULL] * n
    if len(kinds) != n or not set(kinds) <= {_FULL, _SLIDING}:
        raise UserError(f"layer_types {kinds}: expected {n} entries of {_FULL} / {_SLIDING}")
    windows = layer_windows({**hf, "layer_types": ["sliding_attention" if k == _SLIDING else "full_attention"
                                                   for k in kinds]}, n, [])
    windowed = bool(windows["sliding_window"])
    params = _rope_params(hf, kinds)
    dims = {kind: int(head_dim * float(p.get("partial_rotary_factor", 1.0))) for kind, p in params.items()}
    local_theta = float(params[_SLIDING].get("rope_theta", 10_000.0))
    return ModelConfig(
        **{**shape_fields({**hf, "head_dim": head_dim, "intermediate_size": hf["moe_intermediate_size"]}),
           "head_size": head_dim},
        moe_experts=int(hf["num_experts"]), moe_top_k=1, moe_norm_topk=False, moe_router_hidden=int(
            hf.get("router_hidden_size", 256)),
        cca_kernels=(int(hf.get("cca_time0", 2)), int(hf.get("cca_time1", 2))), residual_affine=True,
        fused_qkv=False, qkv_bias=False, bias=False, pos_emb="rope", mlp="swiglu", norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)), tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        rope_theta=float(params[_FULL].get("rope_theta", 5_000_000.0)),
        rope_dims=dims[_FULL] if dims[_FULL] != head_dim else 0,
        rope_local_theta=local_theta if windowed else 0.0,
        rope_local_dims=dims[_SLIDING] if windowed and dims[_SLIDING] != dims[_FULL] else 0, **windows)


def _names(layer: int) -> dict[str, str]:
    """Block `layer`'s redline names -> transformers' (after "model.layers.{layer}.")."""
    attn, gate = "self_attn.qkv_proj.", "mlp.gate."
    names = {
        "norm1.weight": "input_layernorm.weight", "norm2.weight": "post_attention_layernorm.weight",
        "attn.q.weight": attn + "q_proj.weight", "attn.k.weight": attn + "k_proj.weight",
        "attn.v.weight": attn + "v_proj_current.weight", "attn.v_delayed.weight": attn + "v_proj_delayed.weight",
        "attn.qk_conv": attn + "conv_qk_depthwise.weight", "attn.qk_conv_bias": attn + "conv_qk_depthwise.bias",
        "attn.qk_head_conv": attn + "conv_qk_grouped.weight", "attn.qk_head_conv_bias": attn + "conv_qk_grouped.bias",
        "attn.key_scale": "self_attn.qk_norm.temp", "attn.proj.weight": "self_attn.o_proj.weight",
        "mlp.router.weight": gate + "down_proj.weight", "mlp.router.bias": gate + "down_proj.bias",
        "mlp.router_norm.weight": gate + "router_mlp.norm.weight",
        "mlp.router_fc1.weight": gate + "router_mlp.fc1.weight", "mlp.router_fc1.bias": gate + "router_mlp.fc1.bias",
        "mlp.router_fc2.weight": gate + "router_mlp.fc2.weight", "mlp.router_fc2.bias": gate + "router_mlp.fc2.bias",
        "mlp.router_out.weight": gate + "router_mlp.out_proj.weight", "mlp.balance_bias": gate + "balancing_biases",
        "mlp.fc": "mlp.experts.gate_up_proj", "mlp.proj": "mlp.experts.down_proj",
    }
    if layer:  # the first layer's router has no state before it
        names["mlp.state_scale"] = gate + "router_states_scale"
    for ours, theirs in (("attn_affine", "post_attention_residual_scale"), ("mlp_affine", "post_mlp_residual_scale")):
        for a, b in (("h_scale", "hidden_states_scale"), ("h_bias", "hidden_states_bias"),
                     ("x_scale", "residual_scale"), ("x_bias", "residual_bias")):
            names[f"{ours}.{a}"] = f"{theirs}.{b}"
    return names


def adapter_parts(layer: str, rest: str, base: str, out_features: int) -> list:
    """PEFT's module for redline layer `layer` (rest: its name after blocks.N., base transformers' layer prefix) with
    its B rows (peft_adapter's _parts): each of the attention's and the router's Linear layers is one of
    transformers'; the experts are bare tensors there."""
    linear = {ours.removesuffix(".weight"): theirs.removesuffix(".weight")
              for ours, theirs in _names(1).items() if ours.endswith(".weight") and not ours.startswith("norm")
              and ours not in ("mlp.router_norm.weight",)}
    if rest not in linear:
        raise UserError(f"the adapter on {layer} has no counterpart in ZayaForCausalLM (its experts are bare tensors); "
                        f"train with lora.targets attn.* mlp.router* or export with --merge")
    return [(base + linear[rest], slice(0, out_features))]


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = "" if "embed_tokens.weight" in src and "model.embed_tokens.weight" not in src else "model."
    out = {"wte.weight": pad_rows(src.take(pre + "embed_tokens.weight"), cfg),
           "norm_f.weight": src.take(pre + "norm.weight"),
           "embed_bias": src.take(pre + "input_hidden_states_bias"),
           "embed_gain": src.take(pre + "input_hidden_states_scale"), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        for ours, theirs in _names(i).items():
            out[f"blocks.{i}.{ours}"] = src.take(f"{pre}layers.{i}.{theirs}")
        out[f"blocks.{i}.mlp.balance_bias"] = out[f"blocks.{i}.mlp.balance_bias"].float()
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size],
           "model.norm.weight": state["norm_f.weight"], "model.input_hidden_states_bias": state["embed_bias"],
           "model.input_hidden_states_scale": state["embed_gain"],
           **give_head(state, cfg)}
    for i in range(cfg.n_layer):
        for ours, theirs in _names(i).items():
            out[f"model.layers.{i}.{theirs}"] = state[f"blocks.{i}.{ours}"].contiguous()
    return out


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    full = {"rope_type": "default", "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": (cfg.rope_dims or cfg.head_dim) / cfg.head_dim}
    local = {"rope_type": "default", "rope_theta": cfg.rope_local_theta or cfg.rope_theta,
             "partial_rotary_factor": (cfg.rope_local_dims or cfg.rope_dims or cfg.head_dim) / cfg.head_dim}
    return {
        "model_type": "zaya", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "max_position_embeddings": cfg.context_len,
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "lm_head_bias": False, "sliding_window": cfg.sliding_window or None,
        "layer_types": [_SLIDING if cfg.layer_window(i) else _FULL for i in range(cfg.n_layer)],
        "rope_parameters": {_FULL: full, _SLIDING: local}, "moe_intermediate_size": cfg.hidden_dim,
        "num_experts": cfg.moe_experts, "num_experts_per_tok": 1, "router_hidden_size": cfg.moe_router_hidden,
        "cca_time0": cfg.cca_kernels[0], "cca_time1": cfg.cca_kernels[1], "attention_dropout": 0.0,
        "initializer_range": 0.02, "use_cache": True,
    }


def check_exportable(cfg: ModelConfig) -> None:
    what = ("model.cca_kernels, residual_affine or moe_router_hidden: ZAYA, the one architecture with them redline "
            "exports to,")
    raise_first([
        (not cfg.cca_kernels or not cfg.residual_affine or not cfg.moe_router_hidden,
         f"{what} has all three: convolutional attention (model.cca_kernels), scaled residuals "
         f"(model.residual_affine) and an MLP router (model.moe_router_hidden)"),
        (cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine or cfg.embed_norm,
         f"{what} has RMSNorms with weights (model.norm, norm_unit_offset, norm_affine, embed_norm)"),
        (cfg.mlp != "swiglu" or cfg.moe_swiglu_limit,
         f"{what} has unclamped SwiGLU experts (model.mlp=swiglu, moe_swiglu_limit)"),
        (cfg.pos_emb != "rope" or cfg.nope_interval or cfg.rope_layer_theta or cfg.rope_scaling != "none",
         f"{what} rotates every layer by an unscaled base (model.pos_emb, nope_interval, rope_layer_theta, "
         f"rope_scaling)"),
        (cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap or cfg.embed_scale or cfg.embed_multiplier
         or cfg.residual_multiplier or cfg.logit_divisor or cfg.head_transform or cfg.head_vocab or cfg.smear_gate,
         f"{what} has no score scale or caps, embedding, residual or logit scalars, head transform or smear"),
    ])


FAMILY = Family(name="zaya", architecture="ZayaForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf)
