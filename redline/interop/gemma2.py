"""Gemma 2 (Google's Gemma2ForCausalLM, model_type "gemma2": gemma-2-2b and its instruct model): Gemma 3's block
(gemma3.py: sandwich norms scaling by 1 + weight, GeGLU, scaled embeddings, query_pre_attn_scalar, windowed layers
between full ones) without its QK-norm or the windowed layers' own RoPE base, and with the attention scores
soft-capped (attn_logit_softcapping -> attn_softcap, 50 by default) besides the logits (final_logit_softcapping ->
logit_softcap, 30).
Its windowed and full layers alternate (layer_types; transformers' default: layer i full where i + 1 is even).
Semantics read from transformers' models/gemma2/modeling_gemma2.py and configuration_gemma2.py.
"""

from __future__ import annotations

from dataclasses import replace

from redline.interop import gemma3
from redline.interop.families import Family, raise_first
from redline.interop.llama import _ignorable, _rope, to_hf, to_redline
from redline.model import ModelConfig


def model_config(hf: dict) -> ModelConfig:
    # Gemma 3's reading, with Gemma 2's defaults: layers alternating, one RoPE for all, no QK-norm
    plain = {k: v for k, v in hf.items() if k not in ("attn_logit_softcapping", "rope_parameters", "rope_scaling")}
    cfg = gemma3.model_config({"sliding_window_pattern": 2, "final_logit_softcapping": 30.0, **plain})
    cap = hf.get("attn_logit_softcapping", 50.0)
    return replace(cfg, qk_norm=False, rope_local_theta=0.0, attn_softcap=float(cap or 0.0),
                   **_rope({**hf, "max_position_embeddings": hf.get("max_position_embeddings", 8192)}))


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a sandwich-norm model without QK-norm that Gemma 2 does not have."""
    raise_first([
        (cfg.rope_local_theta, "model.rope_local_theta without model.qk_norm: Gemma 2 rotates every layer with one "
                               "RoPE base (Gemma 3, with QK-norm, has the windowed layers' own)"),
        (cfg.rope_scaling != "none", f"model.rope_scaling={cfg.rope_scaling} without model.qk_norm: Gemma 2 has no "
                                     f"RoPE scaling"),
    ])
    gemma3.check_exportable(replace(cfg, qk_norm=True, attn_softcap=0.0))  # the rest of Gemma 3's block


def hf_config(cfg: ModelConfig) -> dict:
    out = gemma3.hf_config(replace(cfg, qk_norm=True, attn_softcap=0.0))
    for key in ("rope_parameters", "use_bidirectional_attention"):
        out.pop(key)
    return {**out, "model_type": "gemma2", "attn_logit_softcapping": cfg.attn_softcap or None,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta}}


FAMILY = Family(name="gemma2", architecture="Gemma2ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
