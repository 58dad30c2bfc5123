"""Cohere's Command models (CohereForCausalLM, model_type "cohere": Command-R, Aya 23; Cohere2ForCausalLM,
"cohere2": Command R7B, Aya Expanse): the Llama layout's tensor names with parallel sublayers under one LayerNorm
without a bias, x + attn(ln(x)) + mlp(ln(x)) (redline's parallel_residual with parallel_shared_norm, norm_bias
false), SwiGLU, GQA, a tied head whose logits are multiplied by `logit_scale` (redline's logit_divisor, its
inverse), and RoPE on interleaved pairs (dimensions (0, 1), (2, 3), ... rotate together), which import permutes into
redline's (first half, second half) order as ernie.py does (every q·k product unchanged).

Cohere2 interleaves sliding-window layers, which rotate, with full layers, which do not (NoPE): `layer_types` (or the
older `sliding_window_pattern`) with one full layer in every N is redline's sliding_window_pattern N with
nope_interval N, as EXAONE 4.0's (exaone4._layers). Semantics read from transformers' models/cohere and
models/cohere2 modeling files.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop import llama
from redline.interop.ernie import permute_qk
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig


def model_config_for(name: str):
    def model_config(hf: dict) -> ModelConfig:
        llama.check_silu(hf)
        if hf.get("attention_bias"):
            raise UserError("attention_bias=true: Cohere then has q/k/v/o biases with none in its MLP, a mix redline "
                            "does not have")
        if hf.get("use_qk_norm"):
            raise UserError("use_qk_norm=true: Cohere's QK-norm is a LayerNorm with weights of its own for every "
                            "head, which redline's per-head QK-norm (one set of weights for all heads) cannot hold")
        window, interval = 0, 0
        if name == "cohere2":
            from redline.interop.exaone4 import _layers

            if not hf.get("sliding_window"):
                raise UserError("a cohere2 config without sliding_window: its full-attention layers do not rotate, "
                                "so every layer would be position-free; redline does not run such a model")
            window, interval = _layers(hf)
        scale = float(hf.get("logit_scale") or 1.0)
        return ModelConfig(
            **llama.shape_fields(hf), fused_qkv=True, pos_emb="rope", mlp="swiglu",
            fused_mlp=True, norm="layernorm", norm_bias=False, norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
            parallel_residual=True, parallel_shared_norm=True, bias=False,
            tie_embeddings=bool(hf.get("tie_word_embeddings", True)), logit_divisor=0.0 if scale == 1.0 else 1 / scale,
            sliding_window=window, sliding_window_pattern=interval, nope_interval=interval, **llama._rope(hf),
        )

    return model_config


def wants_cohere(cfg: ModelConfig) -> bool:
    """A model only Cohere's architectures hold: parallel sublayers under one LayerNorm without a bias, a SwiGLU MLP
    (StableLM's parallel form has LayerNorm biases; Phi's MLP is GELU)."""
    norm_bias = cfg.bias if cfg.norm_bias is None else cfg.norm_bias
    return cfg.parallel_shared_norm and cfg.mlp == "swiglu" and cfg.norm == "layernorm" and not norm_bias


def export_name(cfg: ModelConfig) -> str:
    """cohere2 with its windowed layers, cohere without; a UserError naming what neither has."""
    windowed = bool(cfg.sliding_window)
    raise_first([
        (cfg.norm != "layernorm" or cfg.norm_bias or cfg.bias or cfg.has_qkv_bias,
         "parallel sublayers under one norm with SwiGLU: Cohere, the architecture with them redline exports to, has "
         "LayerNorms without biases and no Linear biases"),
        (cfg.pos_emb != "rope" or cfg.rope_dims, "Cohere rotates whole heads with RoPE"),
        (cfg.qk_norm or cfg.head_bias or cfg.embed_multiplier or cfg.residual_multiplier or cfg.attn_scale
         or cfg.logit_softcap or cfg.attn_softcap or cfg.embed_scale or cfg.norm_unit_offset or cfg.moe_experts
         or cfg.conv_layers or cfg.value_embeddings,
         "QK-norm, a head bias, scalars other than the logits', caps, experts or convolutions with Cohere's parallel "
         "block: Cohere has none of them"),
        (cfg.head_size not in (None, cfg.n_embd // cfg.n_head), "model.head_size apart from n_embd / n_head: "
                                                                  "Cohere's heads are n_embd / n_head wide"),
        (windowed and not (cfg.sliding_window_pattern and cfg.nope_interval == cfg.sliding_window_pattern),
         "model.sliding_window with Cohere's block: Cohere2 has windowed layers that rotate and one full layer "
         "without RoPE in every N (model.sliding_window_pattern N with model.nope_interval N)"),
        (not windowed and cfg.nope_interval, "model.nope_interval without a window: Cohere rotates every layer"),
    ])
    return "cohere2" if windowed else "cohere"


def hf_config_for(name: str):
    def hf_config(cfg: ModelConfig) -> dict:
        out = {"model_type": name, "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
               "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer,
               "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads, "hidden_act": "silu",
               "max_position_embeddings": cfg.context_len, "layer_norm_eps": cfg.norm_eps,
               "logit_scale": 1 / cfg.logit_divisor if cfg.logit_divisor else 1.0,
               "rope_theta": cfg.rope_theta, "rope_scaling": llama.rope_scaling(cfg, name),
               "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "attention_dropout": 0.0,
               "initializer_range": 0.02, "use_cache": True}
        if name == "cohere2":
            out.update(sliding_window=cfg.sliding_window,
                       layer_types=["sliding_attention" if cfg.layer_window(i) else "full_attention"
                                    for i in range(cfg.n_layer)])
        else:
            out["use_qk_norm"] = False
        return out

    return hf_config


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    return permute_qk(llama.to_redline(src, cfg), cfg, inverse=True)


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    return llama.to_hf(permute_qk(dict(state), cfg, inverse=False), cfg, name=export_name(cfg))


FAMILIES = tuple(
    Family(name=n, architecture=arch, model_config=model_config_for(n), hf_config=hf_config_for(n),
           to_redline=to_redline, to_hf=to_hf, ignorable=llama._ignorable)
    for n, arch in (("cohere", "CohereForCausalLM"), ("cohere2", "Cohere2ForCausalLM"))
)
