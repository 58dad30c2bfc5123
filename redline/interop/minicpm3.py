"""MiniCPM3 (MiniCPM3ForCausalLM, model_type "minicpm3": MiniCPM3-4B), as transformers' models/minicpm3 computes it.

DeepSeek-V2's multi-head latent attention (deepseek.py's tensor names and reading: q_a_proj / q_a_layernorm /
q_b_proj or one q_proj, kv_a_proj_with_mqa / kv_a_layernorm / kv_b_proj, o_proj) on Llama's dense SwiGLU blocks,
with three differences, each mapped onto a ModelConfig field:
- RoPE in (first half, second half) pairs (transformers' apply_rotary_pos_emb, not DeepSeek-V2's interleaved one):
  the rows are read as they are; LongRoPE where rope_parameters / rope_scaling give it (MiniCPM3-4B does), read as
  Phi-3's (phi3._longrope) over the qk_rope_head_dim rotated dimensions;
- µP scalars: the embeddings times `scale_emb` (model.embed_multiplier), each sublayer's output times
  `scale_depth / sqrt(num_hidden_layers)` before it joins the residual stream (model.residual_multiplier), the last
  hidden state divided by `hidden_size / dim_model_base` before the head (model.logit_divisor: the head has no bias,
  so dividing its product is the same map). Granite's three scalars, so the tied embeddings stay one matrix;
- values `hidden_size / num_attention_heads` wide where v_head_dim is not given (MiniCPM3Config's default).
Exported back to MiniCPM3 from latent attention on dense layers with any of those scalars or LongRoPE (DeepSeek has
none of them), which needs hidden_size / logit_divisor a whole number (dim_model_base). Refused by name: everything
deepseek.py refuses, other RoPE scalings.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop import deepseek, phi3
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig


def _rope_spec(hf: dict) -> dict:
    """The RoPE scaling dict: rope_parameters (transformers >= 5) where it scales, else rope_scaling (the Hub's)."""
    params = dict(hf.get("rope_parameters") or {})
    return params if params.get("rope_type", "default") != "default" else dict(hf.get("rope_scaling") or {})


_DEFAULTS = dict(kv_lora_rank=256, q_lora_rank=768, qk_nope_head_dim=64, qk_rope_head_dim=32, scale_emb=12,
                 scale_depth=1.4, dim_model_base=256, rms_norm_eps=1e-5, tie_word_embeddings=True,
                 max_position_embeddings=32768)
"""MiniCPM3Config's defaults for the fields a config.json may leave out (null scale_depth and dim_model_base, given,
mean no scaling; a null q_lora_rank one q_proj)."""


def model_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **hf}
    for key in ("n_routed_experts", "num_local_experts"):
        if hf.get(key):
            raise UserError(f"{key}={hf[key]} on minicpm3: MiniCPM3's MLPs are dense")
    spec = _rope_spec(hf)
    kind = spec.get("rope_type", spec.get("type", "default"))
    if kind not in ("default", "longrope"):
        raise UserError(f"RoPE scaling {kind!r} on minicpm3: redline reads MiniCPM3's RoPE unscaled or with LongRoPE")
    theta = float((hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 10000.0)))
    heads, n = hf["num_attention_heads"], hf["num_hidden_layers"]
    plain = {**hf, "rope_parameters": {"rope_type": "default", "rope_theta": theta}, "rope_scaling": None,
             "v_head_dim": hf.get("v_head_dim") or hf["hidden_size"] // heads}
    cfg = deepseek.model_config_for("deepseek_v2")(plain)  # dense layers: its latent attention and SwiGLU alone
    depth = math.sqrt(n) if hf["scale_depth"] is None else float(hf["scale_depth"])
    base = hf["dim_model_base"] or hf["hidden_size"]
    fields = dict(embed_multiplier=float(hf["scale_emb"]), residual_multiplier=depth / math.sqrt(n),
                  logit_divisor=hf["hidden_size"] / base)
    if kind != "default":
        fields.update(phi3._longrope(hf, spec, theta, cfg.rope_dims))
        fields["context_len"] = fields["rope_original_context"]
    return dataclasses.replace(cfg, **fields)


def check_exportable(cfg: ModelConfig) -> None:
    raise_first([
        (cfg.moe_experts, f"model.moe_experts={cfg.moe_experts} with latent attention and MiniCPM3's scalars: "
                          f"MiniCPM3's MLPs are dense"),
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine
         or cfg.parallel_residual or cfg.mlp != "swiglu",
         "norms other than pre-norm RMSNorms or MLPs other than SwiGLU with MiniCPM3's scalars: MiniCPM3's blocks "
         "have those alone"),
        (cfg.sliding_window or cfg.attn_softcap or cfg.attn_sinks or cfg.logit_softcap or cfg.embed_scale
         or cfg.head_bias or cfg.rope_local_theta or cfg.embed_norm,
         "windows, soft caps, sinks, embed_scale or head biases with latent attention: MiniCPM3 has none of them"),
        (cfg.rope_scaling not in ("none", "longrope"),
         f"model.rope_scaling={cfg.rope_scaling} with MiniCPM3's scalars: MiniCPM3 takes LongRoPE alone"),
        (cfg.attn_scale and not math.isclose(cfg.attn_scale, cfg.head_dim ** -0.5, rel_tol=1e-12),
         f"model.attn_scale={cfg.attn_scale}: MiniCPM3's score scale is 1 / sqrt(head width)"),
        (abs(cfg.n_embd / (cfg.logit_divisor or 1.0) - round(cfg.n_embd / (cfg.logit_divisor or 1.0))) > 1e-9,
         f"model.logit_divisor={cfg.logit_divisor}: MiniCPM3 divides by hidden_size / dim_model_base, a whole "
         f"dim_model_base (n_embd={cfg.n_embd})"),
    ])


def wants_minicpm3(cfg: ModelConfig) -> bool:
    """Latent attention on dense layers with an embedding, residual or logit scalar or LongRoPE: MiniCPM3's alone
    (DeepSeek has none of them)."""
    return bool(cfg.kv_lora_rank and not cfg.moe_experts and (
        cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.rope_scaling == "longrope"))


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    D, R = cfg.head_dim, cfg.rope_dims
    params, context = {"rope_type": "default", "rope_theta": cfg.rope_theta}, cfg.context_len
    if cfg.rope_scaling == "longrope":  # Phi-3's LongRoPE entries; every rotated dimension (head_dim is R here)
        phi = phi3.hf_config(cfg)
        params = {k: v for k, v in phi["rope_parameters"].items() if k != "partial_rotary_factor"}
        context = phi["max_position_embeddings"]
    return {
        "model_type": "minicpm3", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_head, "kv_lora_rank": cfg.kv_lora_rank, "q_lora_rank": cfg.q_lora_rank or None,
        "qk_nope_head_dim": D - R, "qk_rope_head_dim": R, "v_head_dim": cfg.v_head_dim or D,
        "scale_emb": cfg.embed_multiplier or 1.0,
        "scale_depth": (cfg.residual_multiplier or 1.0) * math.sqrt(cfg.n_layer),  # divided by it again
        "dim_model_base": round(cfg.n_embd / (cfg.logit_divisor or 1.0)), "hidden_act": "silu",
        "max_position_embeddings": context, "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
        "rope_parameters": params, "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "initializer_range": 0.02, "use_cache": True,
    }


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    return deepseek.to_redline(src, cfg)  # the same names, every layer dense


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    return deepseek.to_hf_for("deepseek_v3")(state, cfg)  # rows as they are: RoPE in (first half, second half) pairs


FAMILY = Family(name="minicpm3", architecture="MiniCPM3ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=deepseek._ignorable)
