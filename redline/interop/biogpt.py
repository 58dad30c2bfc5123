"""BioGPT (Microsoft's BioGptForCausalLM, model_type "biogpt": BioGPT, BioGPT-Large): XGLM's pre-LayerNorm block
(xglm.py) with a learned position table.

- the token embeddings scaled by sqrt(hidden_size) (scale_embedding, its default: redline's embed_scale), then the
  learned position table added: row p + 2 at position p (OPT's offset, OPTLearnedPositionalEmbedding's), so the
  import drops the first two rows and the export puts two zero rows back (read for no position);
- multi-head attention with biases on q/k/v and out_proj (BartAttention, scaled by 1 / sqrt(head width)), a GELU MLP
  (fc1, fc2; hidden_act "gelu" the erf form, "gelu_new" / "gelu_pytorch_tanh" the tanh one) with biases;
- LayerNorms with biases (self_attn_layer_norm, final_layer_norm, the model's layer_norm), all at nn.LayerNorm's
  eps of 1e-5: transformers builds them without the config's layer_norm_eps, which it never reads;
- the head (output_projection) tied to the embedding (its default).
Without scale_embedding the model is GPT-2's (export_family sends it there). A redline model with learned positions
and its embeddings scaled exports as BioGPT, the one architecture redline exports to that has both (an imported XGLM
too: its sinusoid is held as a learned table). Semantics read from transformers' models/biogpt/modular_biogpt.py
and models/bart/modeling_bart.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, give_head, give_weights_and_biases, multi_head_problems,
                                      pad_rows, qkv_apart, raise_first, take_weights_and_biases)
from redline.interop.xglm import _GELU, _LAYER
from redline.model import ModelConfig

OFFSET = 2  # the rows of BioGPT's position table before position 0's
NORM_EPS = 1e-5  # nn.LayerNorm's default, which every BioGPT LayerNorm takes


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "gelu")
    if act not in _GELU:
        raise UserError(f"hidden_act={act!r}: redline's BioGPT MLP computes {', '.join(_GELU)}")
    width = hf.get("hidden_size", 1024)
    return ModelConfig(
        vocab_size=hf.get("vocab_size", 42384), context_len=hf.get("max_position_embeddings", 1024),
        n_layer=hf.get("num_hidden_layers", 24), n_embd=width, n_head=hf.get("num_attention_heads", 16),
        fused_qkv=True, pos_emb="learned", embed_scale=bool(hf.get("scale_embedding", True)), mlp="gelu",
        gelu_approximate=_GELU[act], mlp_hidden=hf.get("intermediate_size", 4096), norm="layernorm",
        norm_eps=NORM_EPS, bias=True, tie_embeddings=bool(hf.get("tie_word_embeddings", True)))


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a learned-positions model with scaled embeddings that BioGPT has not."""
    what = "model.embed_scale with learned positions: BioGPT, the one architecture with them redline exports to,"
    named = [name for name in (
        "qk_norm", "embed_norm", "embed_multiplier", "residual_multiplier", "logit_divisor", "logit_softcap",
        "attn_softcap", "attn_scale", "attn_sinks", "value_embeddings", "moe_experts", "conv_layers", "delta_layers",
        "head_bias", "parallel_residual") if getattr(cfg, name)]
    raise_first([
        (bool(named), f"{what} has no model.{named[0] if named else ''}"),
        (cfg.norm != "layernorm" or not cfg.norm_affine or cfg.norm_position != "pre",
         f"{what} has pre-LayerNorm blocks with weights (model.norm, norm_position)"),
        (cfg.norm_eps != NORM_EPS, f"{what} takes LayerNorm's eps of {NORM_EPS:g} (model.norm_eps={cfg.norm_eps})"),
        (cfg.mlp != "gelu", f"{what} has a GELU MLP (model.mlp={cfg.mlp})"),
    ] + multi_head_problems(cfg, "model.embed_scale with learned positions", "BioGPT"))


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "model_type": "biogpt", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "intermediate_size": cfg.hidden_dim,
        "hidden_act": "gelu" if cfg.gelu_approximate == "none" else "gelu_new",
        "max_position_embeddings": cfg.context_len, "layer_norm_eps": cfg.norm_eps, "scale_embedding": True,
        "tie_word_embeddings": cfg.tie_embeddings, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        "activation_dropout": 0.0, "layerdrop": 0.0, "initializer_range": 0.02, "use_cache": True,
    }


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    table = src.take("biogpt.embed_positions.weight")
    if table.shape[0] != cfg.context_len + OFFSET:
        raise UserError(f"biogpt.embed_positions has {table.shape[0]} rows; max_position_embeddings="
                        f"{cfg.context_len} needs {cfg.context_len + OFFSET} (BioGPT's offset of {OFFSET})")
    out = {"wte.weight": pad_rows(src.take("biogpt.embed_tokens.weight"), cfg), "wpe.weight": table[OFFSET:],
           **take_weights_and_biases(src, {"norm_f": "layer_norm"}, "", "biogpt.")}
    head = "output_projection.weight"
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = pad_rows(src.take(head), cfg)
    elif head in src:  # a tied model's head stored anyway: the embedding again
        src.take(head)
    for i in range(cfg.n_layer):
        p, r = f"biogpt.layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[f"{r}attn.qkv.{kind}"] = torch.cat([src.take(f"{p}self_attn.{x}_proj.{kind}") for x in "qkv"])
        out.update(take_weights_and_biases(src, _LAYER, r, p))
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    table = state["wpe.weight"]
    out = {"biogpt.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size],
           "biogpt.embed_positions.weight": torch.cat([table.new_zeros(OFFSET, table.shape[1]), table]),
           **give_weights_and_biases(state, {"norm_f": "layer_norm"}, "", "biogpt."),
           **give_head(state, cfg, "output_projection.weight")}
    for i in range(cfg.n_layer):
        p, r = f"biogpt.layers.{i}.", f"blocks.{i}."
        out.update(qkv_apart(state, r, cfg, p + "self_attn."))
        out.update(give_weights_and_biases(state, _LAYER, r, p))
    return {k: v.contiguous() for k, v in out.items()}


FAMILY = Family(name="biogpt", architecture="BioGptForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf)
