"""GPT-Neo (EleutherAI's GPTNeoForCausalLM: gpt-neo-125m, 1.3B, 2.7B): GPT-2's block (learned positions,
pre-LayerNorm, a GELU MLP, a tied head) with attention layers alternating global and local, and scores left unscaled.

`attention_types` ([[["global", "local"], 12]]: the pattern and how many times it repeats) expands to one type a
layer (transformers' `attention_layers`); a local layer attends to the last `window_size` tokens, itself included
(its causal mask XOR the mask `window_size` below the diagonal: redline's sliding_window, the local layers as
window_layers). The scores are q·k with no 1/sqrt(head width) (redline's attn_scale=1.0). q, k and v are separate
Linear layers without biases (fused into redline's qkv on the way in, split on the way out: qkv_bias=false),
out_proj and the MLP's c_fc / c_proj have biases (nn.Linear, not GPT-2's Conv1D). Dropouts change nothing in eval.
Refused by name: attention types other than global and local, activations other than the GELUs. Semantics read
from transformers' models/gpt_neo/modeling_gpt_neo.py and configuration_gpt_neo.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, give_weights_and_biases, plain_block_problems,
                                      qkv_apart, raise_first, take_weights_and_biases)
from redline.interop.gpt2 import outside_to_hf, outside_to_redline
from redline.model import ModelConfig

_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}  # transformers' ACT2FN names


def attention_layers(hf: dict) -> list[str]:
    """Each layer's attention type, as GPTNeoConfig.expand_attention_types_params expands attention_types."""
    types = hf.get("attention_types") or [[["global", "local"], 12]]
    layers = [kind for pattern, times in types for _ in range(times) for kind in pattern]
    if len(layers) != hf["num_layers"]:
        raise UserError(f"attention_types={types} gives {len(layers)} layers, num_layers is {hf['num_layers']}; the "
                        f"config is inconsistent")
    unknown = sorted(set(layers) - {"global", "local"})
    if unknown:
        raise UserError(f"attention_types holds {', '.join(map(repr, unknown))}: GPT-Neo's layers are 'global' or "
                        f"'local'")
    return layers


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("activation_function", "gelu_new")
    if act not in _GELU:
        raise UserError(f"activation_function={act!r}: redline's GPT-Neo MLP computes {', '.join(_GELU)}")
    layers = attention_layers(hf)
    local = tuple(i for i, kind in enumerate(layers) if kind == "local")
    window = int(hf.get("window_size", 256)) if local else 0
    width = hf["hidden_size"]
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 2048), n_layer=hf["num_layers"],
        n_embd=width, n_head=hf["num_heads"], n_kv_head=None, qk_norm=False, fused_qkv=True, pos_emb="learned",
        mlp="gelu", gelu_approximate=_GELU[act], mlp_hidden=hf.get("intermediate_size") or 4 * width,
        norm="layernorm", norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), attn_scale=1.0,
        sliding_window=window, window_layers=local if len(local) < len(layers) else (),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=True, qkv_bias=False,
    )


def wants_gpt_neo(cfg: ModelConfig) -> bool:
    """A learned-positions GELU model GPT-Neo is the export for: windowed layers, or unscaled multi-head scores with
    no q/k/v biases (GPTBigCode takes those with them, and one KV head)."""
    return cfg.pos_emb == "learned" and cfg.mlp == "gelu" and (
        cfg.sliding_window > 0 or (cfg.attn_scale == 1.0 and not cfg.has_qkv_bias and cfg.kv_heads == cfg.n_head))


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a learned-positions model with windowed layers or unscaled scores that
    GPT-Neo does not have."""
    when, arch = "learned positions and windowed layers", "GPT-Neo"
    raise_first(plain_block_problems(cfg, when, arch) + [
        (cfg.attn_scale != 1.0, f"model.attn_scale={cfg.attn_scale} with {when}: {arch} leaves its scores unscaled "
                                f"(model.attn_scale=1.0)"),
        (cfg.kv_heads != cfg.n_head, f"model.n_kv_head={cfg.kv_heads} with {when}: {arch} is multi-head"),
        (cfg.has_qkv_bias, f"q/k/v biases (model.bias or model.qkv_bias) with {when}: {arch}'s q/k/v have none"),
        (cfg.parallel_residual, f"model.parallel_residual with {when}: {arch}'s sublayers run one after the other"),
        (cfg.head_bias, f"model.head_bias with {when}: {arch}'s head has no bias"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    kinds = ["local" if cfg.layer_window(i) else "global" for i in range(cfg.n_layer)]
    return {
        "model_type": "gpt_neo", "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.context_len,
        "hidden_size": cfg.n_embd, "num_layers": cfg.n_layer, "num_heads": cfg.n_head,
        "intermediate_size": cfg.hidden_dim, "attention_types": [[kinds, 1]],
        "window_size": cfg.sliding_window or 256,  # read only by local layers
        "activation_function": "gelu" if cfg.gelu_approximate == "none" else "gelu_new",
        "layer_norm_epsilon": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "resid_dropout": 0.0,
        "embed_dropout": 0.0, "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    }


_LAYER = {"norm1": "ln_1", "norm2": "ln_2", "attn.proj": "attn.attention.out_proj", "mlp.fc": "mlp.c_fc",
          "mlp.proj": "mlp.c_proj"}


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = outside_to_redline(src, cfg)
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        out[f"blocks.{i}.attn.qkv.weight"] = torch.cat([src.take(f"{p}attn.attention.{x}_proj.weight")
                                                        for x in "qkv"])  # (3C, C): [q; k; v]
        out.update(take_weights_and_biases(src, _LAYER, f"blocks.{i}.", p))
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = outside_to_hf(state, cfg)
    for i in range(cfg.n_layer):
        r, p = f"blocks.{i}.", f"transformer.h.{i}."
        apart = qkv_apart(state, r, cfg, f"{p}attn.attention.")
        out.update({k: v for k, v in apart.items() if k.endswith(".weight")})  # no q/k/v biases (checked: none)
        out.update(give_weights_and_biases(state, _LAYER, r, p))
    return {k: v.contiguous() for k, v in out.items()}


def _ignorable(name: str) -> bool:
    # the causal (and local) mask buffers older transformers saved with every attention layer
    return name.endswith((".attn.attention.bias", ".attn.attention.masked_bias"))


FAMILY = Family(name="gpt_neo", architecture="GPTNeoForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
