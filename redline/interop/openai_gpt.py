"""GPT-1 (OpenAI's openai-gpt, OpenAIGPTLMHeadModel, model_type "openai-gpt"): learned positions, post-LayerNorm
blocks x = ln_1(x + attn(x)); x = ln_2(x + mlp(x)) with no final norm (redline's norm_position=post, whose norm_f is
none), a tanh-GELU MLP 4 · n_embd wide (`afn` "gelu" is transformers' gelu_new; "relu" too), multi-head attention
scaled by 1 / sqrt(head width), biases everywhere, the head tied to the embeddings.

Its Linear weights are Conv1D, (in, out), transposed on the way in and out as GPT-2's; `c_attn` is one fused
[q; k; v] projection, as redline's. Its causal mask adds -1e4 rather than -inf to the masked scores, which underflows
to the same zero weights in fp32 softmax at any score a trained model reaches. Its token-type embeddings (read from
the token table) are for its fine-tuning heads, not the causal LM. A redline model with post-norm blocks exports as
GPT-1, the one architecture redline exports to that has them. Semantics read from transformers'
models/openai/modeling_openai.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, bias_or_zeros, give_head, multi_head_problems, pad_rows,
                                      raise_first, take_head)
from redline.model import ModelConfig

_MLP = {"gelu": ("gelu", "tanh"), "relu": ("relu", "tanh")}  # afn -> (redline's mlp, gelu_approximate)
_LAYERS = {"attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
_NORMS = {"norm1": "ln_1", "norm2": "ln_2"}


def model_config(hf: dict) -> ModelConfig:
    afn = hf.get("afn", "gelu")
    if afn not in _MLP:
        raise UserError(f"afn={afn!r}: redline's GPT-1 MLP computes {' or '.join(_MLP)} (its SiLU MLP is no "
                        f"layer redline has ungated)")
    mlp, approximate = _MLP[afn]
    width = hf.get("n_embd", 768)
    return ModelConfig(
        vocab_size=hf.get("vocab_size", 40478), context_len=hf.get("n_positions", 512), n_layer=hf.get("n_layer", 12),
        n_embd=width, n_head=hf.get("n_head", 12), fused_qkv=True, pos_emb="learned", mlp=mlp,
        gelu_approximate=approximate, mlp_hidden=4 * width, norm="layernorm", norm_position="post",
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        bias=True)


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a post-norm model that GPT-1 does not have."""
    what = "model.norm_position=post: GPT-1, the one architecture with post-norm blocks redline exports to,"
    named = [name for name in (
        "qk_norm", "sliding_window", "embed_norm", "embed_scale", "embed_multiplier", "residual_multiplier",
        "logit_divisor", "logit_softcap", "attn_softcap", "attn_scale", "attn_sinks", "value_embeddings",
        "moe_experts", "conv_layers", "delta_layers", "head_bias") if getattr(cfg, name)]
    raise_first([
        (bool(named), f"{what} has no model.{named[0] if named else ''}"),
        (cfg.pos_emb != "learned", f"{what} has learned positions (model.pos_emb={cfg.pos_emb})"),
        (cfg.norm != "layernorm" or not cfg.norm_affine, f"{what} has LayerNorms with weights (model.norm)"),
        (cfg.mlp not in ("gelu", "relu") or (cfg.mlp == "gelu" and cfg.gelu_approximate != "tanh"),
         f"{what} has a tanh-GELU or ReLU MLP (model.mlp={cfg.mlp}, gelu_approximate={cfg.gelu_approximate})"),
        (cfg.hidden_dim != 4 * cfg.n_embd, f"{what} has an MLP 4 x n_embd wide (model.mlp_hidden={cfg.hidden_dim})"),
    ] + multi_head_problems(cfg, "model.norm_position=post", "GPT-1"))


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "model_type": "openai-gpt", "vocab_size": cfg.vocab_size, "n_positions": cfg.context_len,
        "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "afn": cfg.mlp,
        "layer_norm_epsilon": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "resid_pdrop": 0.0,
        "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02,
    }


def _prefix(src: TensorSource) -> str:
    """"transformer." for an OpenAIGPTLMHeadModel state dict, "" for one saved from OpenAIGPTModel."""
    return "" if "tokens_embed.weight" in src and "transformer.tokens_embed.weight" not in src else "transformer."


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = _prefix(src)
    out = {"wte.weight": pad_rows(src.take(pre + "tokens_embed.weight"), cfg),
           "wpe.weight": src.take(pre + "positions_embed.weight"), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        for ours, theirs in {**_NORMS, **_LAYERS}.items():
            weight = src.take(f"{pre}h.{i}.{theirs}.weight")
            out[f"blocks.{i}.{ours}.weight"] = weight if ours in _NORMS else weight.t()  # Conv1D: (in, out)
            out[f"blocks.{i}.{ours}.bias"] = src.take(f"{pre}h.{i}.{theirs}.bias")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"transformer.tokens_embed.weight": state["wte.weight"][:cfg.vocab_size],
           "transformer.positions_embed.weight": state["wpe.weight"], **give_head(state, cfg)}
    for i in range(cfg.n_layer):
        r, p = f"blocks.{i}.", f"transformer.h.{i}."
        if not cfg.fused_qkv:  # separate q/k/v Linear layers: c_attn is their rows stacked
            state = {**state, **{f"{r}attn.qkv.{kind}": torch.cat([state[f"{r}attn.{x}.{kind}"] for x in "qkv"])
                                 for kind in ("weight", "bias") if f"{r}attn.q.{kind}" in state}}
        for ours, theirs in {**_NORMS, **_LAYERS}.items():
            weight = state[f"{r}{ours}.weight"]
            out[f"{p}{theirs}.weight"] = weight if ours in _NORMS else weight.t()  # (out, in) -> Conv1D's (in, out)
            out[f"{p}{theirs}.bias"] = bias_or_zeros(state, f"{r}{ours}.bias", weight)
    return {k: v.contiguous() for k, v in out.items()}


def _ignorable(name: str) -> bool:
    return name.endswith(".attn.bias")  # the causal-mask buffer older transformers saved with every layer


FAMILY = Family(name="openai-gpt", architecture="OpenAIGPTLMHeadModel", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
