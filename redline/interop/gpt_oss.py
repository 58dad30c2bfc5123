"""OpenAI's GPT-OSS (gpt-oss-20b, gpt-oss-120b): a mixture of experts on the Llama names with
- attention sinks: a learned logit per query head in every softmax's denominator (`self_attn.sinks` ->
  model.attn_sinks);
- biases on q, k, v and o_proj (`attention_bias`: redline's `bias`, the q/k/v ones in the fused qkv);
- windowed and full layers in turn (`layer_types`, windowed first: sliding_window_pattern=2; in any other order,
  window_layers), YaRN RoPE without
  rounding its band (`truncate: false`: rope_truncate);
- a router with a bias, top k of its logits softmaxed among themselves (the softmax over all experts, its top k
  rescaled to sum to 1: moe_norm_topk), experts with biases (moe_bias) and a clamped SwiGLU
  (mlp=swiglu_clamped, swiglu_limit).
transformers holds the experts stacked, transposed against a Linear's weight and with gate and up interleaved:
`mlp.experts.gate_up_proj` (E, C, 2F), gate = [..., ::2], up = [..., 1::2], `gate_up_proj_bias` (E, 2F) alike,
`down_proj` (E, F, C), `down_proj_bias` (E, C). redline's MoE holds fc (E, 2F, C) with rows [gate; up] and proj
(E, C, F). The released checkpoints store the expert weights in MXFP4 instead (`*_blocks`, `*_scales`:
dequantize_mxfp4), which the import dequantizes; exports write transformers' bf16/fp32 layout.
Semantics read from transformers' models/gpt_oss/modeling_gpt_oss.py and configuration_gpt_oss.py, the MXFP4
layout from its integrations/mxfp4.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, bias_or_zeros, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import _ignorable, _prefix, _rope, layer_windows, rope_scaling, shape_fields
from redline.interop.moe import expert_fields
from redline.model import SWIGLU_CLAMPED_ALPHA, ModelConfig

ARCHITECTURE = "GptOssForCausalLM"


def _e2m1_values() -> torch.Tensor:
    """The 16 values of an FP4 E2M1 code (OCP Microscaling spec): bit 3 the sign, bits 2-1 the exponent (bias 1),
    bit 0 the mantissa; exponent 0 is subnormal (0, 0.5). -> (16,) fp32: 0, 0.5, 1, 1.5, 2, 3, 4, 6, then negated."""
    codes = torch.arange(16)
    sign = 1.0 - 2.0 * (codes >> 3).float()
    exponent, mantissa = ((codes >> 1) & 3).float(), (codes & 1).float()
    magnitude = torch.where(exponent > 0, (1 + mantissa / 2) * torch.exp2(exponent - 1), mantissa / 2)
    return sign * magnitude


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """MXFP4 tensors as the GPT-OSS checkpoints store them -> (..., rows, G·32) in `dtype`. blocks (..., rows, G, 16)
    uint8: each row's G blocks of 32 FP4 values, two a byte, the low nibble first; scales (..., rows, G) uint8: each
    block's E8M0 exponent, biased by 127. The rows are the output rows of a Linear-like weight ((E, 2F, C) for
    gate_up_proj, gate and up still interleaved), i.e. transformers' in-memory tensor transposed. Every value is an
    FP4 value times a power of two, exact in bf16 and fp32 alike."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape:
        raise UserError(f"MXFP4 blocks {tuple(blocks.shape)} {blocks.dtype} and scales {tuple(scales.shape)} "
                        f"{scales.dtype}: expected uint8 blocks (..., G, 16) and uint8 scales (..., G)")
    values = _e2m1_values().to(blocks.device)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).long()  # (..., G, 16, 2): low nibble first
    out = values[codes].flatten(-2)  # (..., G, 32) fp32
    out = torch.ldexp(out, scales.long().sub(127).unsqueeze(-1).float())
    return out.flatten(-2).to(dtype)


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UserError(f"hidden_act={act!r}: GPT-OSS's experts are a clamped SwiGLU; this model is not supported")
    alpha = float(hf.get("swiglu_alpha", SWIGLU_CLAMPED_ALPHA))
    if alpha != SWIGLU_CLAMPED_ALPHA:
        raise UserError(f"swiglu_alpha={alpha}: redline's clamped SwiGLU has GPT-OSS's sigmoid gain "
                        f"{SWIGLU_CLAMPED_ALPHA}")
    quant = (hf.get("quantization_config") or {}).get("quant_method")
    if quant not in (None, "mxfp4"):
        raise UserError(f"quantization_config.quant_method={quant!r}: redline reads GPT-OSS's MXFP4 experts, or "
                        f"unquantized weights")
    if hf.get("attention_dropout"):
        raise UserError(f"attention_dropout={hf['attention_dropout']}: redline's sink attention has no dropout")
    # GptOssConfig's RoPE where config.json gives none: YaRN 32x over 4096 tokens, unrounded, base 150000
    params = dict(hf.get("rope_parameters") or {})
    if not params and not hf.get("rope_scaling"):
        params = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                  "original_max_position_embeddings": 4096}
    if params:
        params.setdefault("rope_theta", hf.get("rope_theta", 150000.0))
        hf = {**hf, "rope_parameters": params}
    elif "rope_theta" not in hf:
        hf = {**hf, "rope_theta": 150000.0}
    fields = {**shape_fields(hf), **expert_fields(hf, "intermediate_size")}
    # transformers' default: windowed on even layers, full on odd ones
    windows = layer_windows(hf, fields["n_layer"], ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                                     for i in range(fields["n_layer"])])
    bias = bool(hf.get("attention_bias", True))
    return ModelConfig(
        **fields, fused_qkv=True, **windows, pos_emb="rope",
        mlp="swiglu_clamped", swiglu_limit=float(hf.get("swiglu_limit", 7.0)), fused_mlp=True, norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=bias, qkv_bias=bias, attn_sinks=True, moe_bias=True, moe_norm_topk=True, **_rope(hf),
    )


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the first option a GPT-OSS model does not have."""
    raise_first([
        (not cfg.moe_experts or cfg.mlp != "swiglu_clamped" or not cfg.attn_sinks,
         "model.attn_sinks, moe_bias or mlp=swiglu_clamped: GPT-OSS, the one architecture with them redline exports "
         "to, is a mixture of experts (model.moe_experts) with both sinks and clamped SwiGLU experts "
         "(model.attn_sinks and model.mlp=swiglu_clamped)"),
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine
         or cfg.embed_norm or cfg.parallel_residual or cfg.conv_layers,
         "GPT-OSS's blocks are pre-RMSNorm with learned weights, sublayers in turn, attention on every layer"),
        (cfg.qk_norm or cfg.attn_scale or cfg.attn_softcap or cfg.value_embeddings,
         "QK-norm, a score scale or cap, or value embeddings with model.attn_sinks: GPT-OSS has none of them"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_local_theta or cfg.rope_layer_theta
         or cfg.rope_scaling not in ("none", "yarn"),
         "GPT-OSS rotates whole heads of every layer with one RoPE (none or YaRN scaling)"),
        (not cfg.moe_norm_topk or cfg.moe_gating != "softmax" or cfg.moe_expert_bias or cfg.moe_scale != 1.0
         or cfg.moe_dense_layers or cfg.moe_shared_hidden,
         "GPT-OSS's router softmaxes its top k logits: no sigmoid scores, expert bias, weight scale, dense layers, "
         "shared expert or model.moe_norm_topk=false"),
        (cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.logit_softcap
         or cfg.head_bias, "GPT-OSS has no embedding, residual or logit scalars, logit cap or head bias"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "yarn":
        rope = {**rope_scaling(cfg, "gpt_oss"), "rope_theta": cfg.rope_theta}
    return {
        "model_type": "gpt_oss", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.context_len, "rms_norm_eps": cfg.norm_eps, "rope_parameters": rope,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": cfg.bias or cfg.has_qkv_bias,
        # transformers builds the windowed mask whatever the layers: a model without a window gets the context's,
        # which no full_attention layer reads
        "sliding_window": cfg.sliding_window or cfg.context_len,
        "layer_types": ["sliding_attention" if cfg.layer_window(i) else "full_attention" for i in range(cfg.n_layer)],
        "num_local_experts": cfg.moe_experts, "num_experts_per_tok": cfg.moe_top_k,
        "swiglu_limit": cfg.swiglu_limit, "swiglu_alpha": SWIGLU_CLAMPED_ALPHA,
        "output_router_logits": bool(cfg.moe_aux_loss), "router_aux_loss_coef": cfg.moe_aux_loss or 0.001,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    }


def _deinterleave(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Gate and up interleaved along `dim` (gate at even indices) -> [gate; up] along it."""
    pairs = t.unflatten(dim, (-1, 2))
    return torch.cat([pairs.select(dim + 1, 0), pairs.select(dim + 1, 1)], dim=dim)


def _interleave(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[gate; up] along `dim` -> interleaved (gate at even indices)."""
    gate, up = t.chunk(2, dim=dim)
    return torch.stack([gate, up], dim=dim + 1).flatten(dim, dim + 1)


def _experts_to_redline(src: TensorSource, p: str, r: str) -> dict:
    """Block p's router and experts -> redline's; the expert weights MXFP4 (the released checkpoints) or
    transformers' in-memory layout."""
    x = f"{p}mlp.experts."
    out = {f"{r}mlp.router.weight": src.take(f"{p}mlp.router.weight"),
           f"{r}mlp.router.bias": src.take(f"{p}mlp.router.bias"),
           f"{r}mlp.fc_bias": _deinterleave(src.take(x + "gate_up_proj_bias"), 1),
           f"{r}mlp.proj_bias": src.take(x + "down_proj_bias")}
    if x + "gate_up_proj_blocks" in src:  # MXFP4: rows are output rows already, (E, 2F, C) and (E, C, F)
        gate_up = dequantize_mxfp4(src.take(x + "gate_up_proj_blocks"), src.take(x + "gate_up_proj_scales"))
        down = dequantize_mxfp4(src.take(x + "down_proj_blocks"), src.take(x + "down_proj_scales"))
    else:  # (E, C, 2F) and (E, F, C)
        gate_up = src.take(x + "gate_up_proj").transpose(1, 2)
        down = src.take(x + "down_proj").transpose(1, 2)
    out[f"{r}mlp.fc"] = _deinterleave(gate_up, 1)
    out[f"{r}mlp.proj"] = down
    return out


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = _prefix(src)
    out = {"norm_f.weight": src.take(f"{pre}norm.weight"),
           "wte.weight": pad_rows(src.take(f"{pre}embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        attn = p + "self_attn."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        out[r + "attn.qkv.weight"] = torch.cat([src.take(f"{attn}{x}_proj.weight") for x in "qkv"])
        out[r + "attn.proj.weight"] = src.take(attn + "o_proj.weight")
        if cfg.bias:
            out[r + "attn.qkv.bias"] = torch.cat([src.take(f"{attn}{x}_proj.bias") for x in "qkv"])
            out[r + "attn.proj.bias"] = src.take(attn + "o_proj.bias")
        out[r + "attn.sinks"] = src.take(attn + "sinks")
        out.update(_experts_to_redline(src, p, r))
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """redline's state dict -> transformers' GPT-OSS names (the experts in its stacked, interleaved layout); biases
    the model lacks (q/k/v/o without `bias`, the router and experts without moe_bias) as zeros."""
    V = cfg.vocab_size
    out = {"model.norm.weight": state["norm_f.weight"], "model.embed_tokens.weight": state["wte.weight"][:V]}
    out.update(give_head(state, cfg))
    q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        attn, x = p + "self_attn.", p + "mlp.experts."
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
        if cfg.fused_qkv:
            weights = state[r + "attn.qkv.weight"].split([q, kv, kv])
            biases = bias_or_zeros(state, r + "attn.qkv.bias", state[r + "attn.qkv.weight"]).split([q, kv, kv])
        else:
            weights = [state[f"{r}attn.{n}.weight"] for n in "qkv"]
            biases = [bias_or_zeros(state, f"{r}attn.{n}.bias", w) for n, w in zip("qkv", weights)]
        if cfg.bias or cfg.has_qkv_bias:  # attention_bias: q/k/v/o together
            for n, w, b in zip("qkv", weights, biases):
                out[f"{attn}{n}_proj.weight"], out[f"{attn}{n}_proj.bias"] = w, b
            out[attn + "o_proj.bias"] = bias_or_zeros(state, r + "attn.proj.bias", state[r + "attn.proj.weight"])
        else:
            for n, w in zip("qkv", weights):
                out[f"{attn}{n}_proj.weight"] = w
        out[attn + "o_proj.weight"] = state[r + "attn.proj.weight"]
        out[attn + "sinks"] = state[r + "attn.sinks"]
        fc, proj = state[r + "mlp.fc"], state[r + "mlp.proj"]  # (E, 2F, C), (E, C, F)
        out[p + "mlp.router.weight"] = state[r + "mlp.router.weight"]
        out[p + "mlp.router.bias"] = bias_or_zeros(state, r + "mlp.router.bias", state[r + "mlp.router.weight"])
        out[x + "gate_up_proj"] = _interleave(fc, 1).transpose(1, 2)
        out[x + "gate_up_proj_bias"] = _interleave(state.get(r + "mlp.fc_bias", fc.new_zeros(fc.shape[:2])), 1)
        out[x + "down_proj"] = proj.transpose(1, 2)
        out[x + "down_proj_bias"] = state.get(r + "mlp.proj_bias", proj.new_zeros(proj.shape[:2]))
    return {k: v.contiguous() for k, v in out.items()}


FAMILY = Family(name="gpt_oss", architecture=ARCHITECTURE, model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
