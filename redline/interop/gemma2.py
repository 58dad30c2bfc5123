"""Gemma 2 (Google's Gemma2ForCausalLM, model_type "gemma2": gemma-2-2b and its instruct model): Gemma 3's block
(gemma3.py: sandwich norms scaling by 1 + weight, GeGLU, scaled embeddings, query_pre_attn_scalar, windowed layers
between full ones) without its QK-norm or the windowed layers' own RoPE base, and with the attention scores
soft-capped (attn_logit_softcapping -> attn_softcap, 50 by default) besides the logits (final_logit_softcapping ->
logit_softcap, 30).
Its windowed and full layers alternate (layer_types; transformers' default: layer i full where i + 1 is even).
Semantics read from transformers' models/gemma2/modeling_gemma2.py and configuration_gemma2.py.

VaultGemma (model_type "vaultgemma": vaultgemma-1b, Google's differentially private model) is Gemma 2 without the
norms on the sublayers' outputs: pre-norm blocks, the MLP's input norm named pre_feedforward_layernorm where Llama's
is post_attention_layernorm (transformers' models/vaultgemma/modular_vaultgemma.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.interop import gemma, gemma3
from redline.interop.families import Family, TensorSource, raise_first
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


def vault_model_config(hf: dict) -> ModelConfig:
    """Gemma 2's reading (its caps, window pattern and query_pre_attn_scalar refused or taken alike) on pre-norm
    blocks."""
    return replace(model_config(hf), norm_position="pre")


def wants_vaultgemma(cfg: ModelConfig) -> bool:
    """Gemma's pre-norm block (gemma.wants_gemma) with Gemma 2's window, score scale or caps."""
    return gemma.wants_gemma(cfg) and bool(cfg.sliding_window or cfg.attn_scale or cfg.attn_softcap
                                           or cfg.logit_softcap)


def check_vault_exportable(cfg: ModelConfig) -> None:
    what = ("a window, model.attn_scale or caps with Gemma's pre-norm block: VaultGemma, the one architecture with "
            "them redline exports to,")
    raise_first([
        (not (cfg.norm == "rmsnorm" and cfg.norm_unit_offset and cfg.embed_scale),
         f"{what} has RMSNorm by 1 + weight and scaled embeddings (model.norm_unit_offset, model.embed_scale)"),
        (cfg.mlp != "geglu" or cfg.gelu_approximate != "tanh", f"{what} has a GeGLU MLP with tanh-GELU "
                                                               f"(model.mlp={cfg.mlp})"),
        (cfg.qk_norm, f"{what} has no QK-norm (model.qk_norm)"),
        (cfg.parallel_residual, f"{what} has sequential sublayers (model.parallel_residual)"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_local_theta,
         f"{what} rotates every layer's whole heads with one RoPE base"),
        (cfg.rope_scaling != "none", f"{what} has no RoPE scaling (model.rope_scaling={cfg.rope_scaling})"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no biases (model.bias, model.qkv_bias)"),
    ])
    gemma3.query_pre_attn_scalar(cfg)


def vault_hf_config(cfg: ModelConfig) -> dict:
    return {**hf_config(replace(cfg, norm_position="sandwich")), "model_type": "vaultgemma"}


# redline's pre-norm blocks name their MLP-input norm as Llama does; VaultGemma's keeps Gemma 2's name
_LLAMA_NORM2, _VAULT_NORM2 = ".post_attention_layernorm.", ".pre_feedforward_layernorm."


def vault_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    # Llama's reading over VaultGemma's names: a source with both names leaves one of them unread, and so reported
    theirs = {name.replace(_VAULT_NORM2, _LLAMA_NORM2): name for name in src.names}
    return to_redline(TensorSource(theirs, lambda name: src.take(theirs[name]), src.where), cfg)


def vault_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    return {k.replace(_LLAMA_NORM2, _VAULT_NORM2): v for k, v in to_hf(state, cfg, "vaultgemma").items()}


VAULT_FAMILY = Family(name="vaultgemma", architecture="VaultGemmaForCausalLM", model_config=vault_model_config,
                      hf_config=vault_hf_config, to_redline=vault_to_redline, to_hf=vault_to_hf, ignorable=_ignorable)
