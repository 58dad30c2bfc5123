"""XGLM (Meta's XGLMForCausalLM, model_type "xglm": xglm-564M, 1.7B, 2.9B, 4.5B, 7.5B): a pre-LayerNorm decoder of
fixed sinusoidal positions.

- the token embeddings scaled by sqrt(d_model) (scale_embedding, its default: redline's embed_scale), then the
  sinusoidal position table added: row p + 2 (the table's offset, fairseq's) at position p, each row
  [sin(p·f_0..f_{h-1}), cos(p·f_0..f_{h-1})] with f_i = exp(-i·ln(10000) / (h - 1)), h = d_model / 2. transformers
  computes the table and stores none of it: the import writes its rows into redline's learned position table
  (pos_emb=learned), which holds the same values (and trains, as any learned table, under `train --init-from`);
- multi-head attention with biases on q/k/v and out_proj, an exact-GELU MLP (fc1, fc2) with biases, LayerNorms with
  biases (self_attn_layer_norm, final_layer_norm, the model's layer_norm), the head tied to the embedding (its
  default).
redline does not write XGLM (its positions are not weights, so a model whose table trained has no XGLM form): the
export goes to BioGPT (biogpt.py), the same block with a learned table, which holds the sinusoid's rows. Semantics read from transformers' models/xglm/modeling_xglm.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, pad_rows, take_head, take_weights_and_biases
from redline.model import ModelConfig

OFFSET = 2  # XGLMSinusoidalPositionalEmbedding.offset
_GELU = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
_LAYER = {"norm1": "self_attn_layer_norm", "norm2": "final_layer_norm", "attn.proj": "self_attn.out_proj",
          "mlp.fc": "fc1", "mlp.proj": "fc2"}


def sinusoidal_table(rows: int, width: int) -> torch.Tensor:
    """XGLM's position table (rows, width) from row 0 (tensor2tensor's layout: sines, then cosines)."""
    half = width // 2
    freqs = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000) / (half - 1)))
    angles = torch.arange(rows, dtype=torch.float32)[:, None] * freqs[None]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("activation_function", "gelu")
    if act not in _GELU:
        raise UserError(f"activation_function={act!r}: redline's XGLM MLP computes {', '.join(_GELU)}")
    width, heads = hf["d_model"], hf["attention_heads"]
    if width % 2 or width // 2 < 2:
        raise UserError(f"d_model={width}: XGLM's sinusoidal table needs an even width of 4 or more")
    if not hf.get("scale_embedding", True):
        raise UserError("scale_embedding=false: redline's XGLM scales its embeddings by sqrt(d_model), as XGLM's "
                        "released models do")
    if hf.get("add_cross_attention"):
        raise UserError("add_cross_attention=true: redline's XGLM is a decoder alone, without cross-attention")
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 2048), n_layer=hf["num_layers"],
        n_embd=width, n_head=heads, fused_qkv=True, pos_emb="learned", embed_scale=True, mlp="gelu",
        gelu_approximate=_GELU[act], mlp_hidden=hf["ffn_dim"], norm="layernorm", norm_eps=1e-5, bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)))


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
           "wpe.weight": sinusoidal_table(cfg.context_len + OFFSET, cfg.n_embd)[OFFSET:],
           **take_weights_and_biases(src, {"norm_f": "layer_norm"}, "", "model."), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[f"{r}attn.qkv.{kind}"] = torch.cat([src.take(f"{p}self_attn.{x}_proj.{kind}") for x in "qkv"])
        out.update(take_weights_and_biases(src, _LAYER, r, p))
    return out


def _refused(_) -> dict:
    raise UserError("model.embed_scale with learned positions: XGLM's positions are a fixed sinusoid, not weights; "
                    "redline does not write XGLM")


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    return _refused(cfg)


def _ignorable(name: str) -> bool:
    return name.endswith("embed_positions.weights")  # the sinusoidal table, where a file stores it


FAMILY = Family(name="xglm", architecture="XGLMForCausalLM", model_config=model_config, hf_config=_refused,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
