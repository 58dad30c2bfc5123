"""ERNIE 4.5, dense (Baidu's Ernie4_5ForCausalLM, model_type "ernie4_5": ERNIE-4.5-0.3B): the Llama layout's tensor
names and block (RMSNorm, SwiGLU, GQA, a tied head by default), biases on every Linear layer or none (`use_bias`),
and RoPE on interleaved pairs: dimensions (0, 1), (2, 3), ... of a head rotate together (GLM's style, transformers'
models/ernie4_5/modeling_ernie4_5.py), where redline pairs the first half with the second.

Import permutes each head's q and k rows into redline's order (families.interleave_rope_rows): every q·k product is
unchanged, so the model runs as a Llama-layout one, on every fast path. `redline export` writes it as Llama (the
same logits; transformers, vLLM and llama.cpp all load that); this module's writer is the inverse map, for a folder
of ERNIE's own layout.

Helium (Kyutai's HeliumForCausalLM, model_type "helium": Helium-1-2B) is Llama's block and names with the same
interleaved RoPE (transformers' models/helium/modular_helium.py: rotate_half over (even, odd) pairs, each frequency
repeated twice), read and written here alike.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop import llama
from redline.interop.families import Family, TensorSource, interleave_rope_rows, raise_first
from redline.model import ModelConfig


def model_config(hf: dict) -> ModelConfig:
    llama.check_silu(hf)
    return ModelConfig(**llama.shape_fields(hf), fused_qkv=True, pos_emb="rope", mlp="swiglu", fused_mlp=True,
                       norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
                       tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=bool(hf.get("use_bias", False)),
                       **llama._rope(hf))


def permute_qk(state: dict, cfg: ModelConfig, inverse: bool) -> dict:
    """Each block's fused q and k rows (weight and bias) between the two RoPE pair orders (every family whose RoPE
    rotates interleaved pairs: ERNIE 4.5's, Cohere's)."""
    for i in range(cfg.n_layer):
        for kind in ("weight", "bias") if cfg.has_qkv_bias else ("weight",):
            name = f"blocks.{i}.attn.qkv.{kind}"
            q, k, v = llama._split_qkv(state[name], cfg)
            state[name] = torch.cat([interleave_rope_rows(q, cfg.n_head, inverse),
                                     interleave_rope_rows(k, cfg.kv_heads, inverse), v])
    return state


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    return permute_qk(llama.to_redline(src, cfg), cfg, inverse=True)


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    return llama.to_hf(permute_qk(dict(state), cfg, inverse=False), cfg)


def hf_config(cfg: ModelConfig) -> dict:
    out = llama.hf_config_for("llama")(cfg)
    for key in ("attention_bias", "mlp_bias", "pretraining_tp"):
        out.pop(key, None)
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(out.pop("rope_scaling") or {})}
    out.pop("rope_theta")
    return {**out, "model_type": "ernie4_5", "use_bias": cfg.bias, "rope_parameters": rope}


FAMILY = Family(name="ernie4_5", architecture="Ernie4_5ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=llama._ignorable)


def helium_hf_config(cfg: ModelConfig) -> dict:
    return llama.llama_shaped_hf_config(cfg, "helium")


HELIUM_FAMILY = Family(name="helium", architecture="HeliumForCausalLM", model_config=llama.model_config_for("llama"),
                       hf_config=helium_hf_config, to_redline=to_redline,
                       to_hf=lambda state, cfg: llama.to_hf(permute_qk(dict(state), cfg, inverse=False), cfg, "llama"),
                       ignorable=llama._ignorable)


# ----------------------------------------------------------------------------------------------------
# ERNIE 4.5 MoE (Ernie4_5_MoeForCausalLM, model_type "ernie4_5_moe": ERNIE-4.5-21B-A3B, -300B-A47B): ERNIE 4.5's
# attention (interleaved RoPE pairs, permuted as above) with a mixture of experts on the layers
# moe_layer_start_index..moe_layer_end_index, every moe_layer_interval-th ((i + 1) % interval == 0), dense SwiGLU
# MLPs (intermediate_size wide) on the others. Its router, as transformers' Ernie4_5_MoeTopKRouter computes it:
# softmax scores; the top moe_k chosen by the scores plus moe_statics.e_score_correction_bias (1, E) (redline's
# moe_expert_bias: it chooses, the unbiased scores weight); the chosen weights divided by their sum floored at
# moe_norm_min (moe_norm_min); moe_num_shared_experts SwiGLU experts fused into one ungated shared MLP
# (shared_experts.*, moe_intermediate_size times as many wide: moe_shared_hidden, moe_shared_gate false). Experts are
# the Qwen-MoE names (mlp.gate, mlp.experts.j.gate_proj / up_proj / down_proj, or stacked). Its multi-token
# prediction layers (mtp*) are training-only, skipped as transformers skips them. Semantics read from transformers'
# models/ernie4_5_moe/modeling_ernie4_5_moe.py.

_MOE_RENAMES = {".mlp.moe_statics.e_score_correction_bias": ".mlp.expert_bias",
                ".mlp.shared_experts.": ".mlp.shared_expert."}  # ERNIE's names -> moe.py's


def _expert_layers(hf: dict) -> list[int]:
    n = hf["num_hidden_layers"]
    start, interval = int(hf.get("moe_layer_start_index", 1)), int(hf.get("moe_layer_interval", 1))
    end = int(hf.get("moe_layer_end_index", -1))
    end = n - 1 if end == -1 else end
    return [i for i in range(n) if (i + 1) % interval == 0 and start <= i <= end]


def moe_model_config(hf: dict) -> ModelConfig:
    from redline.interop.moe import expert_fields

    llama.check_silu(hf)
    if hf.get("use_bias"):
        raise UserError("use_bias=true: ERNIE 4.5 MoE's experts then have no biases beside its biased attention, "
                        "dense MLPs and head, a mix redline's mixtures of experts do not have")
    n = hf["num_hidden_layers"]
    layers = _expert_layers(hf)
    dense, width = int(hf["intermediate_size"]), int(hf.get("moe_intermediate_size") or hf["intermediate_size"])
    count = hf.get("moe_num_experts", hf.get("num_experts"))
    top_k = hf.get("moe_k", hf.get("num_experts_per_tok"))
    experts = expert_fields({**hf, "num_experts": count, "num_experts_per_tok": top_k,
                             "moe_intermediate_size": width}, "moe_intermediate_size")
    if not layers:
        raise UserError("moe_layer_start_index / moe_layer_end_index / moe_layer_interval put experts on no layer; "
                        "redline's ERNIE 4.5 MoE has experts on some")
    if layers == list(range(layers[0], n)):  # dense first layers, then experts on the rest: the released layout
        placement = dict(moe_dense_layers=layers[0], moe_dense_hidden=dense if dense != width else None)
    elif dense == width:  # experts among dense layers of their width
        placement = dict(moe_layers=tuple(layers))
    else:
        raise UserError(f"moe_layer_start_index / moe_layer_end_index / moe_layer_interval put experts on layers "
                        f"{layers} with intermediate_size={dense} != moe_intermediate_size={width}: redline's dense "
                        f"layers among or after the expert layers are as wide as the experts")
    shared = int(hf.get("moe_num_shared_experts") or 0) * width
    shape = {**llama.shape_fields(hf), **experts}
    return ModelConfig(**shape, **placement, fused_qkv=True, pos_emb="rope", mlp="swiglu", fused_mlp=True,
                       norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
                       tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=False, moe_gating="softmax",
                       moe_expert_bias=True, moe_norm_topk=True, moe_norm_min=float(hf.get("moe_norm_min", 1e-12)),
                       moe_shared_hidden=shared, moe_shared_gate=False, **llama._rope(hf))


def wants_ernie_moe(cfg: ModelConfig) -> bool:
    """A mixture of experts only ERNIE 4.5 MoE holds among the architectures redline exports to: softmax scores with
    an expert bias that chooses (LFM2-MoE's has sigmoid scores and convolutions, GPT-OSS's biases are on the experts'
    projections)."""
    return bool(cfg.moe_experts and cfg.moe_expert_bias and cfg.moe_gating == "softmax" and not cfg.conv_layers
                and not cfg.moe_bias and not cfg.attn_sinks)


def check_moe_exportable(cfg: ModelConfig) -> None:
    what = ("softmax scores with model.moe_expert_bias: ERNIE 4.5 MoE, the one architecture with them redline exports "
            "to,")
    shared = cfg.moe_shared_hidden
    raise_first([
        (cfg.norm_position != "pre" or cfg.parallel_residual or cfg.norm != "rmsnorm" or cfg.norm_unit_offset
         or not cfg.norm_affine or cfg.embed_norm, f"{what} has pre-RMSNorm blocks of sequential sublayers"),
        (cfg.mlp != "swiglu", f"{what} has SwiGLU experts (model.mlp={cfg.mlp})"),
        (cfg.qk_norm or cfg.sliding_window or cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval
         or cfg.rope_local_theta or cfg.rope_layer_theta, f"{what} has no QK-norm or window, and one RoPE on every "
                                                          f"layer's whole heads"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no biases with its experts (model.bias, model.qkv_bias)"),
        (not cfg.moe_norm_topk or cfg.moe_scale != 1.0 or cfg.moe_groups > 1,
         f"{what} rescales the chosen weights to sum to 1 (model.moe_norm_topk), with no weight scale or groups"),
        (shared and (cfg.moe_shared_gate or shared % cfg.hidden_dim),
         f"{what} has ungated shared experts as wide as the routed ones (model.moe_shared_gate=false, "
         f"moe_shared_hidden a multiple of mlp_hidden)"),
        (cfg.delta_layers or cfg.mlp_free_layers or cfg.mixer_free_layers,
         f"{what} has attention and an MLP on every layer"),
        (cfg.attn_gate != "none" or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap or cfg.embed_scale
         or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.head_bias
         or cfg.value_embeddings, f"{what} has no gates, scales, caps or scalars"),
    ])
    _expert_span(cfg)


def _expert_span(cfg: ModelConfig) -> tuple[int, int, int]:
    """(moe_layer_start_index, moe_layer_end_index, moe_layer_interval) that put experts on the model's layers, or a
    UserError where no such span does."""
    layers = [i for i in range(cfg.n_layer) if cfg.layer_has_experts(i)]
    interval = layers[1] - layers[0] if len(layers) > 1 else 1
    start = layers[0] if interval == 1 else 0
    span = (start, layers[-1], interval)
    if _expert_layers({"num_hidden_layers": cfg.n_layer, "moe_layer_start_index": start,
                       "moe_layer_end_index": layers[-1], "moe_layer_interval": interval}) != layers:
        raise UserError(f"model.moe_layers={cfg.moe_layers}: ERNIE 4.5 MoE puts its experts on every "
                        f"moe_layer_interval-th layer ((i + 1) % interval == 0) of one span of layers")
    return span


def moe_hf_config(cfg: ModelConfig) -> dict:
    out = hf_config(cfg)
    for key in ("head_dim",) if cfg.head_dim * cfg.n_head == cfg.n_embd else ():
        out.pop(key, None)
    out.update(model_type="ernie4_5_moe", intermediate_size=cfg.moe_dense_hidden or cfg.hidden_dim,
               moe_intermediate_size=cfg.hidden_dim, moe_num_experts=cfg.moe_experts, moe_k=cfg.moe_top_k,
               moe_num_shared_experts=cfg.moe_shared_hidden // cfg.hidden_dim,
               moe_norm_min=cfg.moe_norm_min, output_router_logits=bool(cfg.moe_aux_loss),
               router_aux_loss_coef=cfg.moe_aux_loss or 0.001)
    out["moe_layer_start_index"], out["moe_layer_end_index"], out["moe_layer_interval"] = _expert_span(cfg)
    return out


def _moe_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    theirs = {}
    for name in src.names:
        ours = name
        for old, new in _MOE_RENAMES.items():
            ours = ours.replace(old, new)
        theirs[ours] = name
    out = to_redline(TensorSource(theirs, lambda name: src.take(theirs[name]), src.where), cfg)
    for name in [n for n in out if n.endswith("mlp.expert_bias")]:  # (1, E) -> (E,)
        out[name] = out[name].reshape(-1)
    return out


def _moe_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {}  # llama.to_hf names the experts as Qwen-MoE's, which ERNIE's are
    for name, t in llama.to_hf(permute_qk(dict(state), cfg, inverse=False), cfg, "qwen2_moe").items():
        for old, new in _MOE_RENAMES.items():
            name = name.replace(new, old)
        out[name] = t.reshape(1, -1) if name.endswith("e_score_correction_bias") else t
    return out


def _moe_ignorable(name: str) -> bool:
    return llama._ignorable(name) or "mtp" in name  # multi-token prediction layers, as transformers skips them


MOE_FAMILY = Family(name="ernie4_5_moe", architecture="Ernie4_5_MoeForCausalLM", model_config=moe_model_config,
                    hf_config=moe_hf_config, to_redline=_moe_to_redline, to_hf=_moe_to_hf, ignorable=_moe_ignorable)
