"""GPT-NeoX (EleutherAI's GPTNeoXForCausalLM: the Pythia suite, GPT-NeoX-20B's layout): LayerNorm with biases, RoPE on
part of each head, attention and MLP side by side, exact GELU, an untied head.

Each block is x + attn(ln1(x)) + mlp(ln2(x)) (use_parallel_residual, the default; false gives the sequential
x' = x + attn(ln1(x)), x' + mlp(ln2(x'))); RoPE rotates the first rotary_pct of each head's dimensions in (first half,
second half) pairs and leaves the rest (redline's rope_dims); hidden_act "gelu" is the erf form (redline's
gelu_approximate "none"). `query_key_value` holds q, k and v per head, (heads, 3, head width) in its rows, where
redline's fused projection holds all queries, then all keys, then all values: its rows are regrouped on the way in
and back on the way out. Semantics read from transformers' models/gpt_neox/modeling_gpt_neox.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, bias_or_zeros, give_head, give_weights_and_biases,
                                      multi_head_problems, pad_rows, qkv_apart, raise_first, take_weights_and_biases)
from redline.interop.llama import _rope, rope_scaling
from redline.model import ModelConfig

# transformers' ACT2FN names of the two GELUs redline computes
_GELU = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


def _rotary_fraction(hf: dict) -> float:
    """rope_parameters' partial_rotary_factor (transformers >= 5), else the older rotary_pct (Pythia's files)."""
    params = hf.get("rope_parameters") or {}
    return float(params.get("partial_rotary_factor", hf.get("rotary_pct", 0.25)))


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "gelu")
    if act not in _GELU:
        raise UserError(f"hidden_act={act!r}: redline's GPT-NeoX MLP computes {', '.join(_GELU)}")
    if not hf.get("attention_bias", True):  # the MLP keeps its biases: redline's `bias` covers them together
        raise UserError("attention_bias=false: GPT-NeoX then has MLP biases but none in its attention, a mix redline "
                        "does not have (biases on every Linear layer, or on q/k/v alone)")
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = width // heads
    rotated = int(head_dim * _rotary_fraction(hf))  # transformers' rotary_ndims
    if rotated <= 0 or rotated % 2:
        raise UserError(f"rotary_pct={_rotary_fraction(hf)} rotates {rotated} of each head's {head_dim} dimensions; "
                        f"redline needs an even number above 0")
    if "rotary_emb_base" in hf and not (hf.get("rope_parameters") or {}).get("rope_theta"):
        hf = {**hf, "rope_theta": hf["rotary_emb_base"]}  # Pythia's config.json names the base so
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 2048),
        n_layer=hf["num_hidden_layers"], n_embd=width, n_head=heads, n_kv_head=None, qk_norm=False, fused_qkv=True,
        pos_emb="rope", rope_dims=0 if rotated == head_dim else rotated, mlp="gelu", gelu_approximate=_GELU[act],
        mlp_hidden=hf["intermediate_size"], norm="layernorm", norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
        parallel_residual=bool(hf.get("use_parallel_residual", True)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=True, **_rope(hf),
    )


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a RoPE model with LayerNorm, partial RoPE or parallel sublayers that GPT-NeoX,
    the one architecture with these redline exports to, does not have."""
    problems = [
        (cfg.norm != "layernorm", "model.norm=rmsnorm with model.parallel_residual, model.rope_dims or exact GELU: "
                                  "GPT-NeoX, the one architecture with these redline exports to, uses LayerNorm"),
        (cfg.pos_emb != "rope", f"model.pos_emb={cfg.pos_emb}: GPT-NeoX uses RoPE"),
        (cfg.mlp != "gelu", f"model.mlp={cfg.mlp} with LayerNorm and RoPE: GPT-NeoX's MLP is GELU"),
        (cfg.qk_norm, "model.qk_norm with LayerNorm and RoPE: GPT-NeoX has no QK-norm"),
    ]
    raise_first(problems + multi_head_problems(cfg, "LayerNorm and RoPE", "GPT-NeoX"))


def hf_config(cfg: ModelConfig) -> dict:
    rope = {"rope_theta": cfg.rope_theta, "rope_scaling": rope_scaling(cfg, "gpt_neox")}
    fraction = (cfg.rope_dims or cfg.head_dim) / cfg.head_dim
    parameters = {**(rope["rope_scaling"] or {"rope_type": "default"}), "rope_theta": rope["rope_theta"],
                  "partial_rotary_factor": fraction}
    return {
        "model_type": "gpt_neox", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "intermediate_size": cfg.hidden_dim,
        "hidden_act": "gelu" if cfg.gelu_approximate == "none" else "gelu_new",
        "max_position_embeddings": cfg.context_len, "layer_norm_eps": cfg.norm_eps,
        "use_parallel_residual": cfg.parallel_residual, "attention_bias": True,
        "tie_word_embeddings": cfg.tie_embeddings, "rope_parameters": parameters,
        # what transformers before 5 reads instead of rope_parameters
        "rotary_pct": fraction, "rotary_emb_base": cfg.rope_theta, "rope_scaling": rope["rope_scaling"],
        "attention_dropout": 0.0, "hidden_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    }


def _regroup(t: torch.Tensor, cfg: ModelConfig, to_neox: bool) -> torch.Tensor:
    """query_key_value's rows (weight (3·H·D, C) or bias (3·H·D,)) between GPT-NeoX's (H, 3, D) grouping and
    redline's (3, H, D)."""
    H, D = cfg.n_head, cfg.head_dim
    shape = (3, H, D) if to_neox else (H, 3, D)
    return t.reshape(*shape, *t.shape[1:]).transpose(0, 1).reshape(t.shape).contiguous()


_LAYER = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm", "attn.proj": "attention.dense",
          "mlp.fc": "mlp.dense_h_to_4h", "mlp.proj": "mlp.dense_4h_to_h"}


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("gpt_neox.embed_in.weight"), cfg),
           "norm_f.weight": src.take("gpt_neox.final_layer_norm.weight"),
           "norm_f.bias": src.take("gpt_neox.final_layer_norm.bias")}
    head = "embed_out.weight" if "embed_out.weight" in src else "lm_head.weight"  # the Hub's files, transformers 5's
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = pad_rows(src.take(head), cfg)
    elif head in src:
        src.take(head)  # the tied head, stored anyway
    for i in range(cfg.n_layer):
        p = f"gpt_neox.layers.{i}."
        for kind in ("weight", "bias"):
            out[f"blocks.{i}.attn.qkv.{kind}"] = _regroup(src.take(f"{p}attention.query_key_value.{kind}"), cfg,
                                                          to_neox=False)
        out.update(take_weights_and_biases(src, _LAYER, f"blocks.{i}.", p))
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    V = cfg.vocab_size
    out = {"gpt_neox.embed_in.weight": state["wte.weight"][:V],
           "gpt_neox.final_layer_norm.weight": state["norm_f.weight"],
           "gpt_neox.final_layer_norm.bias": bias_or_zeros(state, "norm_f.bias", state["norm_f.weight"])}
    out.update(give_head(state, cfg, "embed_out.weight"))  # the Hub's name, which transformers 5 renames
    for i in range(cfg.n_layer):
        r, p = f"blocks.{i}.", f"gpt_neox.layers.{i}."
        apart = qkv_apart(state, r, cfg, "")
        for kind in ("weight", "bias"):
            stacked = torch.cat([apart[f"{x}_proj.{kind}"] for x in "qkv"])
            out[f"{p}attention.query_key_value.{kind}"] = _regroup(stacked, cfg, to_neox=True)
        out.update(give_weights_and_biases(state, _LAYER, r, p))
    return {k: v.contiguous() for k, v in out.items()}


def _ignorable(name: str) -> bool:
    # buffers older transformers saved with every attention layer: the causal mask and RoPE's frequencies
    return name.endswith(("attention.bias", "attention.masked_bias", "rotary_emb.inv_freq"))


FAMILY = Family(name="gpt_neox", architecture="GPTNeoXForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
