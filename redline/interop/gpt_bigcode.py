"""GPTBigCode (BigCode's GPTBigCodeForCausalLM: SantaCoder, StarCoderBase-1B/3B/7B/15B, tiny_starcoder): GPT-2's
block (learned positions, pre-LayerNorm with biases, a GELU MLP, biases on every Linear layer, a tied head) with
multi-query attention.

`multi_query` (the default) gives one key/value head shared by every query head (redline's n_kv_head=1), and
`c_attn`'s rows are then [q (C); k (D); v (D)], redline's fused order as it is; without it the attention is
multi-head and `c_attn`'s rows hold each head's (q, k, v) together, (H, 3, D), regrouped into redline's
(3, H, D) on the way in and back on the way out. Unlike GPT-2, its layers are nn.Linear (out, in): nothing is
transposed. `scale_attn_weights=false` leaves the scores unscaled (redline's attn_scale=1.0); the softmax-in-fp32
switches and the dropouts change nothing in an fp32 forward pass. Refused by name: cross-attention
(`add_cross_attention`) and activations other than the GELUs. Semantics read from transformers'
models/gpt_bigcode/modeling_gpt_bigcode.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, give_weights_and_biases, plain_block_problems,
                                      qkv_apart, raise_first, take_weights_and_biases)
from redline.interop.gpt2 import outside_to_hf, outside_to_redline
from redline.model import ModelConfig

# transformers' ACT2FN names of the two GELUs redline computes: the tanh approximation and the erf form
_GELU = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "none"}


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("activation_function", "gelu_pytorch_tanh")
    if act not in _GELU:
        raise UserError(f"activation_function={act!r}: redline's GPTBigCode MLP computes {', '.join(_GELU)}")
    if hf.get("add_cross_attention"):
        raise UserError("add_cross_attention=true: a decoder attending to an encoder's states is not a model redline "
                        "builds")
    width, heads = hf["n_embd"], hf["n_head"]
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("n_positions", 1024), n_layer=hf["n_layer"], n_embd=width,
        n_head=heads, n_kv_head=1 if hf.get("multi_query", True) else None, qk_norm=False, fused_qkv=True,
        pos_emb="learned", mlp="gelu", gelu_approximate=_GELU[act], mlp_hidden=hf.get("n_inner") or 4 * width,
        norm="layernorm", norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        attn_scale=0.0 if hf.get("scale_attn_weights", True) else 1.0,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=True,
    )


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a learned-positions model with multi-query attention or unscaled scores that
    GPTBigCode does not have."""
    when, arch = "learned positions and multi-query attention or unscaled scores", "GPTBigCode"
    raise_first(plain_block_problems(cfg, when, arch) + [
        (cfg.kv_heads not in (1, cfg.n_head), f"model.n_kv_head={cfg.kv_heads} with {when}: {arch}'s attention is "
                                              f"multi-query (one KV head) or multi-head, not grouped (GQA)"),
        (cfg.sliding_window > 0, f"model.sliding_window with {when}: {arch} attends to the whole context"),
        (cfg.attn_scale not in (0.0, 1.0), f"model.attn_scale={cfg.attn_scale} with {when}: {arch} scales its "
                                            f"scores by 1/sqrt(head width) or not at all (1.0)"),
        (cfg.parallel_residual, f"model.parallel_residual with {when}: {arch}'s sublayers run one after the other"),
        (cfg.head_bias, f"model.head_bias with {when}: {arch}'s head has no bias"),
        (cfg.has_qkv_bias != cfg.bias, f"model.qkv_bias apart from model.bias: {arch} has biases on every layer"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "model_type": "gpt_bigcode", "vocab_size": cfg.vocab_size, "n_positions": cfg.context_len,
        "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": cfg.hidden_dim,
        "multi_query": cfg.kv_heads == 1 and cfg.n_head > 1,
        "activation_function": "gelu" if cfg.gelu_approximate == "none" else "gelu_pytorch_tanh",
        "layer_norm_epsilon": cfg.norm_eps, "scale_attn_weights": cfg.attn_scale != 1.0,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_softmax_in_fp32": True,
        "scale_attention_softmax_in_fp32": True, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "initializer_range": 0.02, "use_cache": True,
    }


def _multi_query(cfg: ModelConfig) -> bool:
    """c_attn laid out as [q; k; v] (multi-query), else by head. One head is multi-head either way: hf_config writes
    multi_query false for it, and transformers' per-head layout of one head is [q; k; v] too."""
    return cfg.kv_heads == 1 and cfg.n_head > 1


def _regroup(t: torch.Tensor, cfg: ModelConfig, to_hf: bool) -> torch.Tensor:
    """Multi-head c_attn rows (weight (3·H·D, C) or bias (3·H·D,)) between transformers' (H, 3, D) grouping and
    redline's (3, H, D); multi-query rows move as they are."""
    if _multi_query(cfg):
        return t
    H, D = cfg.n_head, cfg.head_dim
    shape = (3, H, D) if to_hf else (H, 3, D)
    return t.reshape(*shape, *t.shape[1:]).transpose(0, 1).reshape(t.shape).contiguous()


_LAYER = {"norm1": "ln_1", "norm2": "ln_2", "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc",
          "mlp.proj": "mlp.c_proj"}


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = outside_to_redline(src, cfg)
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        for kind in ("weight", "bias"):
            out[f"blocks.{i}.attn.qkv.{kind}"] = _regroup(src.take(f"{p}attn.c_attn.{kind}"), cfg, to_hf=False)
        out.update(take_weights_and_biases(src, _LAYER, f"blocks.{i}.", p))
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = outside_to_hf(state, cfg)
    for i in range(cfg.n_layer):
        r, p = f"blocks.{i}.", f"transformer.h.{i}."
        apart = qkv_apart(state, r, cfg, "")  # fused or separate q/k/v, a missing bias as zeros
        for kind in ("weight", "bias"):
            stacked = torch.cat([apart[f"{x}_proj.{kind}"] for x in "qkv"])
            out[f"{p}attn.c_attn.{kind}"] = _regroup(stacked, cfg, to_hf=True)
        out.update(give_weights_and_biases(state, _LAYER, r, p))
    return {k: v.contiguous() for k, v in out.items()}


def _ignorable(name: str) -> bool:
    # the causal-mask buffers older transformers saved (transformer.bias, attn.masked_bias)
    return name in ("transformer.bias",) or name.endswith((".attn.bias", ".attn.masked_bias"))


FAMILY = Family(name="gpt_bigcode", architecture="GPTBigCodeForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
