"""Phi (Microsoft's PhiForCausalLM: phi-1, phi-1.5, phi-2): one LayerNorm a block feeding attention and MLP side by
side, RoPE on part of each head, tanh-GELU, biases on every Linear layer, the head's included.

Each block is x + attn(ln(x)) + mlp(ln(x)) (redline's parallel_residual with parallel_shared_norm); RoPE rotates the
first partial_rotary_factor of each head's dimensions in (first half, second half) pairs (rope_dims); lm_head has a
bias (head_bias); q, k and v are separate Linear layers (fused into redline's qkv on the way in, split on the way
out), grouped-query attention where num_key_value_heads says so. Semantics read from transformers'
models/phi/modeling_phi.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, bias_or_zeros, give_weights_and_biases, pad_rows,
                                      qkv_apart, raise_first, take_head, take_weights_and_biases)
from redline.interop.llama import _rope, rope_scaling
from redline.model import ModelConfig

_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}  # transformers' ACT2FN names


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "gelu_new")
    if act not in _GELU:
        raise UserError(f"hidden_act={act!r}: redline's Phi MLP computes {', '.join(_GELU)}")
    if hf.get("qk_layernorm"):
        raise UserError("qk_layernorm=true: Phi's QK-norm is a LayerNorm with a bias, redline's an RMSNorm")
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = width // heads
    fraction = float((hf.get("rope_parameters") or {}).get("partial_rotary_factor",
                                                             hf.get("partial_rotary_factor", 0.5)))
    rotated = int(head_dim * fraction)  # transformers' rotary_ndims
    if rotated <= 0 or rotated % 2:
        raise UserError(f"partial_rotary_factor={fraction} rotates {rotated} of each head's {head_dim} dimensions; "
                        f"redline needs an even number above 0")
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 2048),
        n_layer=hf["num_hidden_layers"], n_embd=width, n_head=heads,
        n_kv_head=hf.get("num_key_value_heads") or heads, qk_norm=False, fused_qkv=True, pos_emb="rope",
        rope_dims=0 if rotated == head_dim else rotated, mlp="gelu", gelu_approximate=_GELU[act],
        mlp_hidden=hf["intermediate_size"], norm="layernorm", norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
        parallel_residual=True, parallel_shared_norm=True, head_bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=True, **_rope(hf),
    )


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with one norm a block (parallel_shared_norm) that Phi does not have."""
    when = "model.parallel_shared_norm"
    raise_first([
        (cfg.norm != "layernorm", f"model.norm=rmsnorm with {when}: Phi, the one architecture with one norm a block "
                                  f"redline exports to, uses LayerNorm"),
        (cfg.pos_emb != "rope", f"model.pos_emb={cfg.pos_emb} with {when}: Phi uses RoPE"),
        (cfg.mlp != "gelu", f"model.mlp={cfg.mlp} with {when}: Phi's MLP is GELU"),
        (cfg.qk_norm, f"model.qk_norm with {when}: redline's QK-norm is an RMSNorm, Phi's a LayerNorm"),
        (cfg.sliding_window > 0, f"model.sliding_window with {when}: Phi attends to the whole context"),
        (cfg.head_dim * cfg.n_head != cfg.n_embd, f"model.head_size with {when}: Phi's heads are n_embd / n_head "
                                                  f"wide"),
        (cfg.has_qkv_bias != cfg.bias, "model.qkv_bias apart from model.bias: Phi has biases on every layer"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    rope = {"rope_theta": cfg.rope_theta, "rope_scaling": rope_scaling(cfg, "phi")}
    fraction = (cfg.rope_dims or cfg.head_dim) / cfg.head_dim
    return {
        "model_type": "phi", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "hidden_act": "gelu" if cfg.gelu_approximate == "none" else "gelu_new",
        "max_position_embeddings": cfg.context_len, "layer_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "qk_layernorm": False,
        "rope_parameters": {**(rope["rope_scaling"] or {"rope_type": "default"}), "rope_theta": rope["rope_theta"],
                            "partial_rotary_factor": fraction},
        # what transformers before 5 reads instead of rope_parameters
        "rope_theta": cfg.rope_theta, "partial_rotary_factor": fraction, "rope_scaling": rope["rope_scaling"],
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0, "initializer_range": 0.02,
        "use_cache": True,
    }


_LAYER = {"norm1": "input_layernorm", "attn.proj": "self_attn.dense", "mlp.fc": "mlp.fc1", "mlp.proj": "mlp.fc2"}


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
           "norm_f.weight": src.take("model.final_layernorm.weight"),
           "norm_f.bias": src.take("model.final_layernorm.bias"),
           "lm_head.bias": pad_rows(src.take("lm_head.bias"), cfg)}
    out.update(take_head(src, cfg))
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        for kind in ("weight", "bias"):
            out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat([src.take(f"{p}self_attn.{x}_proj.{kind}") for x in "qkv"])
        out.update(take_weights_and_biases(src, _LAYER, f"blocks.{i}.", p))
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    V = cfg.vocab_size
    head = state["lm_head.weight"] if "lm_head.weight" in state else state["wte.weight"]
    out = {"model.embed_tokens.weight": state["wte.weight"][:V],
           "model.final_layernorm.weight": state["norm_f.weight"],
           "model.final_layernorm.bias": bias_or_zeros(state, "norm_f.bias", state["norm_f.weight"]),
           "lm_head.bias": bias_or_zeros(state, "lm_head.bias", head)[:V]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = head[:V]
    for i in range(cfg.n_layer):
        r, p = f"blocks.{i}.", f"model.layers.{i}."
        out.update(qkv_apart(state, r, cfg, f"{p}self_attn."))
        out.update(give_weights_and_biases(state, _LAYER, r, p))
    return {k: v.contiguous() for k, v in out.items()}


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")  # a buffer older transformers saved; recomputed from the config


FAMILY = Family(name="phi", architecture="PhiForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
