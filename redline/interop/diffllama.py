"""DiffLlama (transformers' DiffLlamaForCausalLM, model_type "diffllama"): Llama's block, names and SwiGLU MLP with
differential attention (redline's model.diff_attention, DiffAttention): each query head's map over the first and the
second half of the KV heads' values, heads h and h + H/2 subtracted with a learned λ (four (head_dim,) vectors a
layer, self_attn.lambda_q1 / lambda_k1 / lambda_q2 / lambda_k2) and RMS-normed without a weight.

Semantics read from transformers' models/diffllama/modeling_diffllama.py (its two-call form: the value tensor split
along the KV heads, each half tiled back with repeat, the outputs chunked along the heads).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop import llama
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig

_LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def model_config(hf: dict) -> ModelConfig:
    if hf.get("attention_bias"):  # q/k/v/o biases with none in the MLP: redline's `bias` covers the MLP too
        raise UserError("attention_bias=true: DiffLlama then has biases on q/k/v/o but none in its MLP, a mix redline "
                        "does not have")
    if hf.get("attention_dropout"):
        raise UserError(f"attention_dropout={hf['attention_dropout']}: differential attention has no dropout "
                        f"(transformers refuses it too)")
    return replace(llama.model_config_for("llama")(hf), diff_attention=True)


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = llama.to_redline(src, cfg)
    pre = llama._prefix(src)
    for i in range(cfg.n_layer):
        for name in _LAMBDAS:
            out[f"blocks.{i}.attn.{name}"] = src.take(f"{pre}layers.{i}.self_attn.{name}")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = llama.to_hf(state, cfg, "llama")
    for i in range(cfg.n_layer):
        for name in _LAMBDAS:
            out[f"model.layers.{i}.self_attn.{name}"] = state[f"blocks.{i}.attn.{name}"].contiguous()
    return out


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option DiffLlama, the one architecture with differential attention redline exports to,
    does not have."""
    what = "model.diff_attention: DiffLlama, the one architecture with it redline exports to,"
    raise_first([
        (cfg.norm_position != "pre" or cfg.parallel_residual or cfg.norm != "rmsnorm" or cfg.norm_unit_offset
         or not cfg.norm_affine or cfg.embed_norm, f"{what} has pre-RMSNorm blocks of sequential sublayers"),
        (cfg.mlp != "swiglu" or cfg.moe_experts, f"{what} has a dense SwiGLU MLP (model.mlp=swiglu)"),
        (cfg.qk_norm or cfg.v_norm, f"{what} has no QK-norm"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_local_theta or cfg.rope_layer_theta,
         f"{what} rotates every layer's whole heads with one RoPE"),
        (cfg.sliding_window > 0, f"{what} attends to the whole context (model.sliding_window)"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no Linear biases (model.bias, model.qkv_bias)"),
        (cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap or cfg.embed_scale or cfg.embed_multiplier
         or cfg.residual_multiplier or cfg.logit_divisor or cfg.head_bias or cfg.layer_scalars or cfg.per_layer_embd
         or cfg.sub_norms or cfg.bitlinear != "off", f"{what} has no scales, caps, scalars or sub-norms"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    out = llama.llama_shaped_hf_config(cfg, "diffllama")
    rope = {"rope_type": "default", "rope_theta": out.pop("rope_theta"), **(out.pop("rope_scaling") or {})}
    out.update(attention_bias=False, rope_parameters=rope, lambda_std_dev=0.1, pad_token_id=None, bos_token_id=None,
               eos_token_id=None)  # the writer sets the token ids
    return out


FAMILY = Family(name="diffllama", architecture="DiffLlamaForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=llama._ignorable)
