"""Named model sizes. Presets are code: each is a ModelConfig, and `PRESETS` is the whole list.

gpt2-*   the GPT-2 architecture: learned positions, LayerNorm (with bias), GELU, multi-head, tied embeddings,
         vocab 50304 (50257 padded), context 1024.
modern-* the source design's "quality" configuration: GQA 4:1, QK-norm, RoPE θ=10000, SwiGLU, pre-RMSNorm,
         fused QKV, no bias, vocab 32768, context 2048; the head tied to the token embedding (measured: the untied
         head ends 13.1% higher in validation perplexity at equal training time, BENCHMARKS.md "Time to quality").
         Their training defaults are config.PRESET_TRAINING["modern-"].
tiny     a few million parameters of the modern design (untied), for CPUs and tests.
"""

from __future__ import annotations

import difflib
from dataclasses import replace

from redline.errors import UserError
from redline.model import ModelConfig


def _gpt2(n_layer: int, n_embd: int, n_head: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=50304, context_len=1024, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_kv_head=None,
        qk_norm=False, fused_qkv=True, pos_emb="learned", mlp="gelu", norm="layernorm", norm_position="pre",
        tie_embeddings=True, bias=True,
    )


def _modern(n_layer: int, n_embd: int, n_head: int, n_kv_head: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=32768, context_len=2048, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_kv_head=n_kv_head,
        qk_norm=True, fused_qkv=True, pos_emb="rope", rope_theta=10000.0, mlp="swiglu", norm="rmsnorm",
        norm_position="pre", tie_embeddings=True, bias=False,
    )


PRESETS: dict[str, ModelConfig] = {
    "gpt2-124m": _gpt2(12, 768, 12),
    "gpt2-350m": _gpt2(24, 1024, 16),
    "gpt2-774m": _gpt2(36, 1280, 20),
    "gpt2-1.5b": _gpt2(48, 1600, 25),
    "modern-124m": _modern(12, 768, 12, 3),
    "modern-350m": _modern(24, 1024, 16, 4),
    "modern-774m": _modern(36, 1280, 20, 5),
    "modern-1.5b": _modern(48, 1600, 25, 5),
    # ~3.1M parameters (1.6M without embeddings) with the embedded default's 4096-token vocab: sized so the
    # embedded default trains in about two minutes on 2 CPU cores
    "tiny": replace(_modern(4, 192, 6, 2), vocab_size=4096, context_len=256, tie_embeddings=False),
}


def get_preset(name: str) -> ModelConfig:
    """A fresh copy of the named preset, or a UserError suggesting the closest names."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=3, cutoff=0.4)
        hint = f"did you mean {', '.join(close)}?" if close else f"choose one of {', '.join(PRESETS)}"
        raise UserError(f"unknown preset {name!r}: {hint}")
    return replace(PRESETS[name])
