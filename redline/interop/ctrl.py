"""CTRL (Salesforce's CTRLLMHeadModel, model_type "ctrl"): a pre-LayerNorm decoder of fixed sinusoidal positions.

- the token embeddings (`transformer.w`) scaled by sqrt(n_embd) (redline's embed_scale), then a sinusoidal position
  table added: at position p, [sin(p·r_0..r_{h-1}), cos(p·r_0..r_{h-1})] with r_j = 10000^(-2j / n_embd),
  h = n_embd / 2 (transformers' positional_encoding). transformers computes the table and stores none of it: the
  import writes its n_positions rows into redline's learned position table (pos_emb=learned), which holds the same
  values (and trains, as any learned table, under `train --init-from`);
- multi-head attention with biases on Wq, Wk, Wv (fused into redline's qkv) and dense, a ReLU MLP (ffn.0, ffn.2) with
  biases, LayerNorms with biases: the blocks' at eps 1e-6 always (transformers builds them so), the final one at
  layer_norm_epsilon, so a config whose epsilon is other than 1e-6 is refused by name;
- the head tied to the embedding with a bias of its own (lm_head.bias: redline's head_bias).
redline does not write CTRL (its positions are not weights, so a model whose table trained has no CTRL form), and no
architecture it exports to has a head bias beside scaled embeddings: the export is refused by name. Semantics read
from transformers' models/ctrl/modeling_ctrl.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, pad_rows, take_weights_and_biases
from redline.model import ModelConfig

BLOCK_NORM_EPS = 1e-6  # EncoderLayer's LayerNorms, whatever the config says
_LAYER = {"norm1": "layernorm1", "norm2": "layernorm2", "attn.proj": "multi_head_attention.dense",
          "mlp.fc": "ffn.0", "mlp.proj": "ffn.2"}


def sinusoidal_table(rows: int, width: int) -> torch.Tensor:
    """CTRL's position table (rows, width) in fp32: the sines of p · 10000^(-2j / width), then their cosines."""
    rates = 1 / torch.pow(10000, torch.arange(0, width, 2, dtype=torch.float32) / width)
    angles = torch.arange(rows, dtype=torch.float32)[:, None] * rates[None]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def model_config(hf: dict) -> ModelConfig:
    eps = float(hf.get("layer_norm_epsilon", BLOCK_NORM_EPS))
    if eps != BLOCK_NORM_EPS:
        raise UserError(f"layer_norm_epsilon={eps}: CTRL's block LayerNorms take {BLOCK_NORM_EPS:g} whatever the "
                        f"config says, and redline has one eps for every norm")
    width = hf.get("n_embd", 1280)
    if width % 2:
        raise UserError(f"n_embd={width}: CTRL's sinusoidal table needs an even width")
    return ModelConfig(
        vocab_size=hf.get("vocab_size", 246534), context_len=hf.get("n_positions", 256), n_layer=hf.get("n_layer", 48),
        n_embd=width, n_head=hf.get("n_head", 16), fused_qkv=True, pos_emb="learned", embed_scale=True, mlp="relu",
        mlp_hidden=hf.get("dff", 8192), norm="layernorm", norm_eps=eps, bias=True, head_bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)))


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("transformer.w.weight"), cfg),
           "wpe.weight": sinusoidal_table(cfg.context_len, cfg.n_embd),
           "norm_f.weight": src.take("transformer.layernorm.weight"),
           "norm_f.bias": src.take("transformer.layernorm.bias"),
           "lm_head.bias": pad_rows(src.take("lm_head.bias")[:, None], cfg)[:, 0]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = pad_rows(src.take("lm_head.weight"), cfg)
    elif "lm_head.weight" in src:  # a tied model's head stored anyway: the embedding again
        src.take("lm_head.weight")
    for i in range(cfg.n_layer):
        p, r = f"transformer.h.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[f"{r}attn.qkv.{kind}"] = torch.cat([src.take(f"{p}multi_head_attention.W{x}.{kind}") for x in "qkv"])
        out.update(take_weights_and_biases(src, _LAYER, r, p))
    return out


def _refused(_) -> dict:
    raise UserError("model.head_bias with scaled embeddings and learned positions: CTRL's positions are a fixed "
                    "sinusoid, not weights; redline does not write CTRL")


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    return _refused(cfg)


FAMILY = Family(name="ctrl", architecture="CTRLLMHeadModel", model_config=model_config, hf_config=_refused,
                to_redline=to_redline, to_hf=to_hf)
