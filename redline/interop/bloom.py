"""BLOOM (BigScience's BloomForCausalLM: bloom-560m, 1b1, 1b7, 3b, 7b1, bloom, and the bloomz fine-tunes): ALiBi
positions (model.pos_emb=alibi), a LayerNorm on the embeddings (word_embeddings_layernorm: redline's embed_norm),
pre-LayerNorm blocks with biases everywhere, a tanh-GELU MLP 4 × the width, multi-head attention, the head tied to
the embedding.

BLOOM's fused query_key_value holds each head's q, k and v rows together, (H, 3, D) rows ([q_0, k_0, v_0, q_1, ...]);
redline's qkv holds all q rows, then all k, then all v, (3, H, D): the rows (and the bias) are regrouped on import
and back on export. bloom_gelu_forward is the tanh approximation (its constant 0.79788456 is sqrt(2/π) to 8 places,
a relative difference of 1e-9). BLOOM has no position table and so no maximum length in its config: the import
takes `seq_length` where a config has it, else the 2048 tokens the released models were trained on (ALiBi runs past
it). Refused by name: apply_residual_connection_post_layernorm=true (the residual taken after the norm, which no
redline block does); pretraining_tp and slow_but_exact only re-slice the same products, and are ignored. A redline
model without biases exports with zero biases, which computes the same function. Semantics read from transformers'
models/bloom/modeling_bloom.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, bias_or_zeros, give_head, pad_rows, take_head
from redline.model import ModelConfig

_LAYER = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm", "attn.proj": "self_attention.dense",
          "mlp.fc": "mlp.dense_h_to_4h", "mlp.proj": "mlp.dense_4h_to_h"}

# fields that choose how a model trains or runs, not the function it computes: never a reason to refuse an export
_NOT_ARCHITECTURE = {"dropout", "attn_backend", "doc_attention", "pad_vocab_to", "ce_chunk_tokens", "zero_init_proj",
                     "fused_qkv", "fused_mlp"}


def _inert(name: str, cfg: ModelConfig) -> bool:
    """A field that has no effect on this config (RoPE's without RoPE, the experts' without experts, ...)."""
    # a RoPE scaling's parameters without that scaling (rope_factor, rope_beta_fast, ...)
    unscaled = cfg.rope_scaling == "none" and name not in ("rope_theta", "rope_scaling", "rope_dims",
                                                            "rope_local_theta", "rope_layer_theta")
    return ((name.startswith("rope_") and (cfg.pos_emb != "rope" or unscaled))
            or (name.startswith("delta_") and name != "delta_layers" and not cfg.delta_layers)
            or (name.startswith("moe_") and name != "moe_experts" and not cfg.moe_experts)
            or (name == "conv_kernel" and not cfg.conv_layers)
            or (name == "swiglu_limit" and cfg.mlp != "swiglu_clamped")
            or (name in ("qk_norm_scope", "qk_norm_after_rope") and not cfg.qk_norm)
            or (name == "gelu_approximate" and cfg.mlp not in ("gelu", "geglu")))


def _effective(cfg: ModelConfig) -> dict:
    """cfg's fields with the ones that default to another field's value resolved (n_kv_head None is n_head, ...)."""
    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    out.update(n_kv_head=cfg.kv_heads, head_size=cfg.head_dim, mlp_hidden=cfg.hidden_dim, qkv_bias=cfg.has_qkv_bias,
               norm_bias=cfg.bias if cfg.norm_bias is None else cfg.norm_bias)
    return out


def check_round_trip(cfg: ModelConfig, arch: str, model_config: Callable[[dict], ModelConfig],
                     hf_config: Callable[[ModelConfig], dict], free: tuple[str, ...] = (),
                     chosen_by: str = "model.pos_emb=alibi", fix: str = "change it or train without ALiBi") -> None:
    """A UserError naming the first option of `cfg` that the architecture cannot hold: the config written for it
    (hf_config) and read back (model_config) must be cfg again, field by field, but for those that do not change the
    function (_NOT_ARCHITECTURE, inert ones) and `free` (options the writer expresses some other way, such as zero
    biases for a model without them); `chosen_by` names the options that chose the architecture, `fix` the way out."""
    try:
        back = model_config(hf_config(cfg))
    except UserError as e:
        raise UserError(f"{arch} cannot hold this model: {e}") from None
    ours, theirs = _effective(cfg), _effective(back)
    for name, value in ours.items():
        if name in _NOT_ARCHITECTURE or name in free or _inert(name, cfg) or value == theirs[name]:
            continue
        raise UserError(f"model.{name}={value!r}: {arch}, the architecture a model with {chosen_by} exports as "
                        f"here, has {name}={theirs[name]!r}; {fix}")


def model_config(hf: dict) -> ModelConfig:
    if hf.get("apply_residual_connection_post_layernorm"):
        raise UserError("apply_residual_connection_post_layernorm=true: the residual taken after each block's "
                        "LayerNorm is not a block redline has (BLOOM's released models set it false)")
    width = hf.get("hidden_size") or hf.get("n_embed")  # n_embed: the older configs' name
    heads = hf.get("n_head", hf.get("num_attention_heads"))
    layers = hf.get("n_layer", hf.get("num_hidden_layers"))
    if not (width and heads and layers):
        raise UserError("a BLOOM config needs hidden_size (or n_embed), n_head and n_layer")
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=int(hf.get("seq_length") or 2048), n_layer=layers, n_embd=width,
        n_head=heads, n_kv_head=None, qk_norm=False, fused_qkv=True, pos_emb="alibi", mlp="gelu",
        gelu_approximate="tanh", mlp_hidden=4 * width, norm="layernorm",
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), embed_norm=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=True,
    )


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of an ALiBi model with a norm on its embeddings that BLOOM does not have (biases
    of any kind may be missing: they export as zeros)."""
    check_round_trip(cfg, "BLOOM", model_config, hf_config, free=("bias", "qkv_bias", "norm_bias"))


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "model_type": "bloom", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd, "n_head": cfg.n_head,
        "n_layer": cfg.n_layer, "seq_length": cfg.context_len, "layer_norm_epsilon": cfg.norm_eps,
        "apply_residual_connection_post_layernorm": False, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "pretraining_tp": 1, "slow_but_exact": False, "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": 0.02, "use_cache": True,
    }


def _regroup(t: torch.Tensor, heads: int, to_redline: bool) -> torch.Tensor:
    """query_key_value's rows (H, 3, D) <-> redline's qkv rows (3, H, D); t: the weight (3·H·D, C) or the bias
    (3·H·D,)."""
    rows = t.shape[0]
    D = rows // (3 * heads)
    shape = (heads, 3, D) if to_redline else (3, heads, D)
    return t.reshape(*shape, *t.shape[1:]).transpose(0, 1).reshape(rows, *t.shape[1:])


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = "transformer." if "transformer.word_embeddings.weight" in src else ""  # "": saved from BloomModel
    out = {"wte.weight": pad_rows(src.take(pre + "word_embeddings.weight"), cfg),
           "embed_norm.weight": src.take(pre + "word_embeddings_layernorm.weight"),
           "embed_norm.bias": src.take(pre + "word_embeddings_layernorm.bias"),
           "norm_f.weight": src.take(pre + "ln_f.weight"), "norm_f.bias": src.take(pre + "ln_f.bias")}
    out.update(take_head(src, cfg))
    for i in range(cfg.n_layer):
        p, r = f"{pre}h.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[f"{r}attn.qkv.{kind}"] = _regroup(src.take(f"{p}self_attention.query_key_value.{kind}"), cfg.n_head,
                                                  to_redline=True)
            for mine, other in _LAYER.items():
                out[f"{r}{mine}.{kind}"] = src.take(f"{p}{other}.{kind}")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    V, pre = cfg.vocab_size, "transformer."

    def weight_and_bias(ours: str, theirs: str) -> dict:
        weight = state[f"{ours}.weight"]
        return {f"{theirs}.weight": weight, f"{theirs}.bias": bias_or_zeros(state, f"{ours}.bias", weight)}

    out = {pre + "word_embeddings.weight": state["wte.weight"][:V],
           **weight_and_bias("embed_norm", pre + "word_embeddings_layernorm"),
           **weight_and_bias("norm_f", pre + "ln_f")}
    out.update(give_head(state, cfg))
    for i in range(cfg.n_layer):
        r, p = f"blocks.{i}.", f"{pre}h.{i}."
        if cfg.fused_qkv:
            qkv = weight_and_bias(f"{r}attn.qkv", "qkv")
        else:  # separate q/k/v layers: their rows stacked, as the fused layer's
            weights = [state[f"{r}attn.{x}.weight"] for x in "qkv"]
            qkv = {"qkv.weight": torch.cat(weights),
                   "qkv.bias": torch.cat([bias_or_zeros(state, f"{r}attn.{x}.bias", w)
                                          for x, w in zip("qkv", weights)])}
        for kind in ("weight", "bias"):
            out[f"{p}self_attention.query_key_value.{kind}"] = _regroup(qkv[f"qkv.{kind}"], cfg.n_head,
                                                                         to_redline=False)
        for mine, other in _LAYER.items():
            out.update(weight_and_bias(r + mine, p + other))
    return {k: v.contiguous() for k, v in out.items()}


FAMILY = Family(name="bloom", architecture="BloomForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf)
