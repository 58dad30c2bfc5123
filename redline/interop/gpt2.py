"""GPT-2: learned positions, pre-LayerNorm with biases, tanh-GELU MLP, multi-head attention, tied head.

Hugging Face's GPT-2 keeps its Linear weights in Conv1D layout, (in, out): each is transposed on the way in and on
the way out. `c_attn` is already one fused [q; k; v] projection, as redline's. A redline model without biases
exports with zero biases (GPT-2 always has them), which computes the same function.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, bias_or_zeros, give_head, multi_head_problems, pad_rows,
                                      raise_first, take_head)
from redline.model import ModelConfig

# transformers' ACT2FN names of the two GELUs redline computes: the tanh approximation (GPT-2's own) and the erf form
_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("activation_function", "gelu_new")
    if act not in _GELU:
        raise UserError(f"activation_function={act!r}: redline's GPT-2 MLP computes {', '.join(_GELU)}")
    if hf.get("scale_attn_by_inverse_layer_idx"):
        raise UserError("scale_attn_by_inverse_layer_idx=true is not supported (redline scales attention by "
                        "1/sqrt(head width) in every layer)")
    if hf.get("scale_attn_weights") is False:
        raise UserError("scale_attn_weights=false is not supported (redline scales attention by 1/sqrt(head width))")
    width = hf["n_embd"]
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("n_positions", 1024), n_layer=hf["n_layer"], n_embd=width,
        n_head=hf["n_head"], n_kv_head=None, qk_norm=False, fused_qkv=True, pos_emb="learned", mlp="gelu",
        gelu_approximate=_GELU[act],
        mlp_hidden=hf.get("n_inner") or 4 * width, norm="layernorm", norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=True,
    )


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a learned-positions model that GPT-2 does not have."""
    problems = [
        (cfg.norm != "layernorm", "model.norm=rmsnorm with learned positions: GPT-2, the one architecture with "
                                  "learned positions redline exports to, uses LayerNorm"),
        (cfg.mlp != "gelu", f"model.mlp={cfg.mlp} with learned positions: GPT-2's MLP is GELU"),
        (cfg.parallel_residual, "model.parallel_residual with learned positions: GPT-2's sublayers run one after "
                                "the other"),
        (cfg.qk_norm, "model.qk_norm with learned positions: GPT-2 has no QK-norm"),
    ]
    raise_first(problems + multi_head_problems(cfg, "learned positions", "GPT-2"))


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "model_type": "gpt2", "vocab_size": cfg.vocab_size, "n_positions": cfg.context_len, "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": cfg.hidden_dim,
        "activation_function": "gelu" if cfg.gelu_approximate == "none" else "gelu_new",
        "layer_norm_epsilon": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "scale_attn_weights": True,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02, "use_cache": True,
    }


def _prefix(src: TensorSource) -> str:
    """"transformer." for a GPT2LMHeadModel state dict, "" for one saved from GPT2Model (OpenAI's gpt2 files)."""
    return "" if "wte.weight" in src and "transformer.wte.weight" not in src else "transformer."


def outside_to_redline(src: TensorSource, cfg: ModelConfig, pre: str = "transformer.") -> dict:
    """GPT-2's embeddings (wte), position table (wpe), final LayerNorm (ln_f) and head -> redline's; GPTBigCode and
    GPT-Neo name them alike."""
    return {"wte.weight": pad_rows(src.take(pre + "wte.weight"), cfg), "wpe.weight": src.take(pre + "wpe.weight"),
            "norm_f.weight": src.take(pre + "ln_f.weight"), "norm_f.bias": src.take(pre + "ln_f.bias"),
            **take_head(src, cfg)}


def outside_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """outside_to_redline's inverse (a LayerNorm without a bias written with zeros)."""
    return {"transformer.wte.weight": state["wte.weight"][:cfg.vocab_size],
            "transformer.wpe.weight": state["wpe.weight"], "transformer.ln_f.weight": state["norm_f.weight"],
            "transformer.ln_f.bias": bias_or_zeros(state, "norm_f.bias", state["norm_f.weight"]),
            **give_head(state, cfg)}


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = _prefix(src)
    out = outside_to_redline(src, cfg, pre)
    names = {"norm1": "ln_1", "norm2": "ln_2", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj",
             "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
    for i in range(cfg.n_layer):
        for ours, theirs in names.items():
            weight = src.take(f"{pre}h.{i}.{theirs}.weight")
            out[f"blocks.{i}.{ours}.weight"] = weight if ours.startswith("norm") else weight.t()  # Conv1D: (in, out)
            out[f"blocks.{i}.{ours}.bias"] = src.take(f"{pre}h.{i}.{theirs}.bias")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    def bias(name: str, like: torch.Tensor) -> torch.Tensor:
        return bias_or_zeros(state, name, like)

    out = outside_to_hf(state, cfg)
    for i in range(cfg.n_layer):
        r, p = f"blocks.{i}.", f"transformer.h.{i}."
        for ours, theirs in (("norm1", "ln_1"), ("norm2", "ln_2")):
            weight = state[f"{r}{ours}.weight"]
            out[f"{p}{theirs}.weight"], out[f"{p}{theirs}.bias"] = weight, bias(f"{r}{ours}.bias", weight)
        if not cfg.fused_qkv:  # separate q/k/v Linear layers: GPT-2's c_attn is their rows stacked
            state = {**state, **{f"{r}attn.qkv.{kind}": torch.cat([state[f"{r}attn.{x}.{kind}"] for x in "qkv"])
                                 for kind in ("weight", "bias") if f"{r}attn.q.{kind}" in state}}
        for ours, theirs in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"),
                             ("mlp.proj", "mlp.c_proj")):
            weight = state[f"{r}{ours}.weight"]  # (out, in) -> Conv1D's (in, out)
            out[f"{p}{theirs}.weight"], out[f"{p}{theirs}.bias"] = weight.t(), bias(f"{r}{ours}.bias", weight)
    return {k: v.contiguous() for k, v in out.items()}


def _ignorable(name: str) -> bool:
    # the causal-mask buffers older transformers saved with every attention layer
    return name.endswith((".attn.bias", ".attn.masked_bias"))


FAMILY = Family(name="gpt2", architecture="GPT2LMHeadModel", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
