"""OPT (Meta's OPTForCausalLM: opt-125m, opt-1.3b, and the larger ones of the same layout): learned positions,
pre-LayerNorm with biases, a ReLU MLP, multi-head attention, the head tied to the embedding.

OPT's position table has two rows more than its context (OPTLearnedPositionalEmbedding's offset of 2: the token at
position p reads row p + 2), so the import drops the first two rows and the export puts two zero rows back (they
are read only for padding, which attends to nothing). q, k and v are separate Linear layers (fused into redline's
qkv on the way in, split on the way out). Not expressed, and refused by name: post-norm blocks (opt-350m's
do_layer_norm_before=false) and an embedding narrower than the model (word_embed_proj_dim, opt-350m's
project_in / project_out). Semantics read from transformers' models/opt/modeling_opt.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, bias_or_zeros, give_head, give_weights_and_biases,
                                      multi_head_problems, pad_rows, qkv_apart, raise_first, take_head)
from redline.model import ModelConfig

OFFSET = 2  # the rows of OPT's position table before position 0's
_LAYER = {"norm1": "self_attn_layer_norm", "norm2": "final_layer_norm", "attn.proj": "self_attn.out_proj",
          "mlp.fc": "fc1", "mlp.proj": "fc2"}


def model_config(hf: dict) -> ModelConfig:
    width = hf["hidden_size"]
    refused = [("do_layer_norm_before", hf.get("do_layer_norm_before", True) is False,
                "post-norm blocks (opt-350m's) are not ones redline exports or decodes as OPT"),
               ("word_embed_proj_dim", hf.get("word_embed_proj_dim", width) != width,
                f"an embedding {hf.get('word_embed_proj_dim')} wide projected to the model's {width} (project_in / "
                f"project_out) is not a layer redline has"),
               ("layer_norm_elementwise_affine", hf.get("layer_norm_elementwise_affine", True) is False,
                "LayerNorms without weights are not ones redline has"),
               ("_remove_final_layer_norm", bool(hf.get("_remove_final_layer_norm")),
                "a model without its final LayerNorm is not one redline builds")]
    raise_first([(bad, f"{name}={hf.get(name)}: {why}") for name, bad, why in refused])
    act = hf.get("activation_function", "relu")
    if act != "relu":
        raise UserError(f"activation_function={act!r}: redline's OPT MLP is ReLU")
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 2048),
        n_layer=hf["num_hidden_layers"], n_embd=width, n_head=hf["num_attention_heads"], n_kv_head=None,
        qk_norm=False, fused_qkv=True, pos_emb="learned", mlp="relu", mlp_hidden=hf["ffn_dim"], norm="layernorm",
        norm_bias=True, norm_eps=1e-5, tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        bias=bool(hf.get("enable_bias", True)),
    )


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a learned-positions model with a ReLU MLP that OPT does not have."""
    when = "learned positions and a ReLU MLP"
    raise_first([
        (cfg.norm != "layernorm", f"model.norm=rmsnorm with {when}: OPT uses LayerNorm"),
        (cfg.norm_bias is False, f"model.norm_bias=false with {when}: OPT's LayerNorms have biases"),
        (cfg.norm_eps != 1e-5, f"model.norm_eps={cfg.norm_eps} with {when}: OPT's LayerNorms take 1e-5"),
        (cfg.qk_norm, f"model.qk_norm with {when}: OPT has no QK-norm"),
        (cfg.parallel_residual, f"model.parallel_residual with {when}: OPT's sublayers run one after the other"),
        (cfg.head_bias, f"model.head_bias with {when}: OPT's head has no bias"),
    ] + multi_head_problems(cfg, when, "OPT"))


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "model_type": "opt", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "ffn_dim": cfg.hidden_dim,
        "max_position_embeddings": cfg.context_len, "word_embed_proj_dim": cfg.n_embd, "do_layer_norm_before": True,
        "activation_function": "relu", "enable_bias": True, "layer_norm_elementwise_affine": True,
        "tie_word_embeddings": cfg.tie_embeddings, "dropout": 0.0, "attention_dropout": 0.0, "layerdrop": 0.0,
        "init_std": 0.02, "use_cache": True,
    }


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = "model.decoder."
    positions = src.take(pre + "embed_positions.weight")
    if positions.shape[0] != cfg.context_len + OFFSET:
        raise UserError(f"{src.where}: model.decoder.embed_positions has {positions.shape[0]} rows, the config's "
                        f"context {cfg.context_len} + OPT's offset {OFFSET} gives {cfg.context_len + OFFSET}")
    out = {"wte.weight": pad_rows(src.take(pre + "embed_tokens.weight"), cfg), "wpe.weight": positions[OFFSET:],
           "norm_f.weight": src.take(pre + "final_layer_norm.weight"),
           "norm_f.bias": src.take(pre + "final_layer_norm.bias")}
    out.update(take_head(src, cfg))
    kinds = ("weight", "bias") if cfg.bias else ("weight",)  # enable_bias=false: no Linear biases
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        for kind in kinds:
            out[f"{r}attn.qkv.{kind}"] = torch.cat([src.take(f"{p}self_attn.{x}_proj.{kind}") for x in "qkv"])
        for mine, other in _LAYER.items():
            for kind in ("weight", "bias") if mine.startswith("norm") else kinds:
                out[f"{r}{mine}.{kind}"] = src.take(f"{p}{other}.{kind}")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    V, pre = cfg.vocab_size, "model.decoder."
    wpe = state["wpe.weight"]
    out = {pre + "embed_tokens.weight": state["wte.weight"][:V],
           pre + "embed_positions.weight": torch.cat([wpe.new_zeros(OFFSET, wpe.shape[1]), wpe]),
           pre + "final_layer_norm.weight": state["norm_f.weight"],
           pre + "final_layer_norm.bias": bias_or_zeros(state, "norm_f.bias", state["norm_f.weight"])}
    out.update(give_head(state, cfg))
    for i in range(cfg.n_layer):
        r, p = f"blocks.{i}.", f"{pre}layers.{i}."
        out.update(qkv_apart(state, r, cfg, f"{p}self_attn."))
        out.update(give_weights_and_biases(state, _LAYER, r, p))
    return {k: v.contiguous() for k, v in out.items()}


FAMILY = Family(name="opt", architecture="OPTForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf)
