"""StarCoder2 (BigCode's Starcoder2ForCausalLM: starcoder2-3b, 7b, 15b): pre-LayerNorm blocks (LayerNorms with biases)
with q/k/v/o under Llama's names, a plain tanh-GELU MLP (`c_fc`, `c_proj`), biases on every Linear layer where
`use_bias` (the LayerNorms keep theirs either way: redline's norm_bias), grouped-query attention, RoPE on whole
heads, a sliding window on every layer where the config gives one, a tied head. Semantics read from transformers'
models/starcoder2/modeling_starcoder2.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, give_head, give_weights_and_biases, pad_rows, qkv_apart,
                                      raise_first, take_head, take_weights_and_biases)
from redline.interop.llama import _ignorable, _rope, rope_scaling, shape_fields
from redline.model import ModelConfig

_GELU = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "none"}  # transformers' ACT2FN names
_LAYER = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm", "attn.proj": "self_attn.o_proj",
          "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "gelu_pytorch_tanh")
    if act not in _GELU:
        raise UserError(f"hidden_act={act!r}: redline's StarCoder2 MLP computes {', '.join(_GELU)}")
    bias = bool(hf.get("use_bias", True))
    return ModelConfig(
        **shape_fields(hf, context_len=4096), fused_qkv=True, pos_emb="rope", mlp="gelu",
        gelu_approximate=_GELU[act], norm="layernorm", norm_bias=True, norm_eps=float(hf.get("norm_epsilon", 1e-5)),
        sliding_window=int(hf.get("sliding_window") or 0), tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        bias=bias, **_rope(hf))


def wants_starcoder2(cfg: ModelConfig) -> bool:
    """RoPE with LayerNorm and a GELU MLP on sequential blocks that GPT-NeoX cannot hold: grouped-query attention or
    a sliding window."""
    return (cfg.pos_emb == "rope" and cfg.norm == "layernorm" and cfg.mlp == "gelu" and not cfg.parallel_residual
            and (cfg.kv_heads != cfg.n_head or cfg.sliding_window > 0))


def check_exportable(cfg: ModelConfig) -> None:
    what = "RoPE and LayerNorm with GQA or a sliding window: StarCoder2, the one architecture with them redline " \
           "exports to,"
    raise_first([
        (cfg.rope_dims or cfg.nope_interval, f"{what} rotates every layer's whole heads (model.rope_dims, "
                                             f"model.nope_interval)"),
        (cfg.qk_norm, f"{what} has no QK-norm"),
        (cfg.has_qkv_bias != cfg.bias, f"{what} has biases on every Linear layer or none (model.qkv_bias)"),
        (cfg.norm_bias is False, f"{what} has LayerNorms with biases (model.norm_bias)"),
        (cfg.head_dim * cfg.n_head != cfg.n_embd, f"{what} has heads n_embd / n_head wide (model.head_size)"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    rope = {"rope_theta": cfg.rope_theta, "rope_scaling": rope_scaling(cfg, "starcoder2")}
    return {
        "model_type": "starcoder2", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads,
        "hidden_act": "gelu" if cfg.gelu_approximate == "none" else "gelu_pytorch_tanh",
        "max_position_embeddings": cfg.context_len, "norm_epsilon": cfg.norm_eps, "use_bias": cfg.bias,
        "sliding_window": cfg.sliding_window or None, "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": 0.0, "residual_dropout": 0.0, "embedding_dropout": 0.0, "initializer_range": 0.02,
        "use_cache": True, **rope, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
    }


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
           "norm_f.weight": src.take("model.norm.weight"), "norm_f.bias": src.take("model.norm.bias")}
    out.update(take_head(src, cfg))
    kinds = ("weight", "bias") if cfg.bias else ("weight",)
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        for kind in kinds:
            out[f"{r}attn.qkv.{kind}"] = torch.cat([src.take(f"{p}self_attn.{x}_proj.{kind}") for x in "qkv"])
        if cfg.bias:
            out.update(take_weights_and_biases(src, _LAYER, r, p))
        else:  # the LayerNorms' biases, the Linear layers' weights alone
            for mine, theirs in _LAYER.items():
                out[f"{r}{mine}.weight"] = src.take(f"{p}{theirs}.weight")
                if mine.startswith("norm"):
                    out[f"{r}{mine}.bias"] = src.take(f"{p}{theirs}.bias")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    V = cfg.vocab_size
    out = {"model.embed_tokens.weight": state["wte.weight"][:V], "model.norm.weight": state["norm_f.weight"],
           "model.norm.bias": state["norm_f.bias"]}
    out.update(give_head(state, cfg))
    for i in range(cfg.n_layer):
        r, p = f"blocks.{i}.", f"model.layers.{i}."
        layer = {**qkv_apart(state, r, cfg, f"{p}self_attn."), **give_weights_and_biases(state, _LAYER, r, p)}
        if not cfg.bias:  # no Linear biases in the file (use_bias false); the norms keep theirs
            layer = {k: v for k, v in layer.items() if not k.endswith(".bias") or "layernorm" in k}
        out.update(layer)
    return {k: v.contiguous() for k, v in out.items()}


FAMILY = Family(name="starcoder2", architecture="Starcoder2ForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
