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

from redline.interop import llama
from redline.interop.families import Family, TensorSource, interleave_rope_rows
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
