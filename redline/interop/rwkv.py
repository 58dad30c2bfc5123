"""RWKV-4 (RwkvForCausalLM, model_type "rwkv": RWKV/rwkv-4-169m-pile ... rwkv-raven-14b): every layer RWKV-4's
time mixing then its channel mixing, each on a pre-LayerNorm (ln1, ln2), a LayerNorm on the embeddings before the
first (the first block's pre_ln: model.embed_norm), ln_out last, no positions.

- time mixing (redline's delta_rule=rwkv on every layer, RWKVTimeMix): key, value and receptance of the token
  blended with its predecessor (time_mix_key/value/receptance, (1, 1, C) each), the WKV recurrence a channel over
  attention_hidden_size channels (time_decay, time_first; model.delta_value_dim), output;
- channel mixing (model.mlp=rwkv, RWKVChannelMix): key (intermediate_size), receptance, value;
- rescale_every: in eval mode transformers divides each block's attention.output and feed_forward.value weights by
  2^(i // rescale_every) and halves the stream after every rescale_every blocks. Every LayerNorm then reads its
  input over 2^n: exactly a LayerNorm of the unscaled stream at eps·4^n (model.rescale_every), so the logits are
  those of the unscaled weights with those epsilons (and differ from training mode's, whose norms take eps alone).

Names: rwkv.embeddings, rwkv.blocks.i.{pre_ln (i = 0), ln1, ln2, attention.*, feed_forward.*}, rwkv.ln_out, head
(tied to the embeddings where tie_word_embeddings). Refused: a layer_norm_epsilon other than 1e-5 (ln_out is
built at LayerNorm's default 1e-5 whatever the config says; redline's norms share one epsilon). Semantics read from
transformers' models/rwkv/modeling_rwkv.py (its CPU path, rwkv_linear_attention_cpu, as the reference recurrence).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, pad_rows, raise_first
from redline.model import ModelConfig

_TIME = {"key": "key", "value": "value", "receptance": "receptance", "output": "proj"}  # theirs -> ours, Linear
_CHANNEL = {"key": "fc", "value": "proj", "receptance": "receptance"}
LN_OUT_EPS = 1e-5  # transformers' RwkvModel.ln_out: nn.LayerNorm(hidden_size), its default epsilon


def model_config(hf: dict) -> ModelConfig:
    eps = float(hf.get("layer_norm_epsilon", 1e-5))
    if eps != LN_OUT_EPS:
        raise UserError(f"layer_norm_epsilon={eps}: RWKV's ln_out keeps LayerNorm's default 1e-5 whatever the config "
                        f"says, and redline's norms share one epsilon; only layer_norm_epsilon=1e-5 is supported")
    width, n = hf["hidden_size"], hf["num_hidden_layers"]
    layers = tuple(range(n))
    rescale = int(hf.get("rescale_every", 6))
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=int(hf.get("context_length", 1024)), n_layer=n, n_embd=width,
        n_head=1, pos_emb="none", norm="layernorm", norm_bias=True, norm_eps=eps, bias=False, embed_norm=True,
        rescale_every=max(rescale, 0), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        mlp="rwkv", mlp_hidden=int(hf.get("intermediate_size") or 4 * width), delta_layers=layers, delta_rule="rwkv",
        delta_heads=1, delta_key_heads=1, delta_key_dim=1,
        delta_value_dim=int(hf.get("attention_hidden_size") or width))


def _norm(src: TensorSource, theirs: str, ours: str) -> dict:
    return {f"{ours}.{kind}": src.take(f"{theirs}.{kind}") for kind in ("weight", "bias")}


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("rwkv.embeddings.weight"), cfg),
           **_norm(src, "rwkv.blocks.0.pre_ln", "embed_norm"), **_norm(src, "rwkv.ln_out", "norm_f")}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = pad_rows(src.take("head.weight"), cfg, head=True)
    elif "head.weight" in src:  # the embedding again
        src.take("head.weight")
    for i in range(cfg.n_layer):
        p, r = f"rwkv.blocks.{i}.", f"blocks.{i}."
        out.update({**_norm(src, p + "ln1", r + "norm1"), **_norm(src, p + "ln2", r + "norm2")})
        a, f = p + "attention.", p + "feed_forward."
        out.update({f"{r}attn.{ours}.weight": src.take(f"{a}{theirs}.weight") for theirs, ours in _TIME.items()})
        out.update({f"{r}mlp.{ours}.weight": src.take(f"{f}{theirs}.weight") for theirs, ours in _CHANNEL.items()})
        out[r + "attn.time_decay"], out[r + "attn.time_first"] = src.take(a + "time_decay"), src.take(a + "time_first")
        for x in ("key", "value", "receptance"):  # (1, 1, C) -> (C,)
            out[f"{r}attn.mix_{x}"] = src.take(f"{a}time_mix_{x}").reshape(-1)
        for x in ("key", "receptance"):
            out[f"{r}mlp.mix_{x}"] = src.take(f"{f}time_mix_{x}").reshape(-1)
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    def norm(ours: str, theirs: str) -> dict:
        return {f"{theirs}.{kind}": state[f"{ours}.{kind}"] for kind in ("weight", "bias")}

    out = {"rwkv.embeddings.weight": state["wte.weight"][:cfg.vocab_size],
           **norm("embed_norm", "rwkv.blocks.0.pre_ln"), **norm("norm_f", "rwkv.ln_out")}
    if not cfg.tie_embeddings:  # a tied head is the embedding (transformers' _tied_weights_keys)
        out["head.weight"] = state["lm_head.weight"][:cfg.vocab_size]
    C = cfg.n_embd
    for i in range(cfg.n_layer):
        p, r = f"rwkv.blocks.{i}.", f"blocks.{i}."
        out.update({**norm(r + "norm1", p + "ln1"), **norm(r + "norm2", p + "ln2")})
        a, f = p + "attention.", p + "feed_forward."
        out.update({f"{a}{theirs}.weight": state[f"{r}attn.{ours}.weight"] for theirs, ours in _TIME.items()})
        out.update({f"{f}{theirs}.weight": state[f"{r}mlp.{ours}.weight"] for theirs, ours in _CHANNEL.items()})
        out[a + "time_decay"], out[a + "time_first"] = state[r + "attn.time_decay"], state[r + "attn.time_first"]
        for x in ("key", "value", "receptance"):
            out[f"{a}time_mix_{x}"] = state[f"{r}attn.mix_{x}"].reshape(1, 1, C)
        for x in ("key", "receptance"):
            out[f"{f}time_mix_{x}"] = state[f"{r}mlp.mix_{x}"].reshape(1, 1, C)
    return {k: v.contiguous() for k, v in out.items()}


def wants_rwkv(cfg: ModelConfig) -> bool:
    """A model with RWKV-4's time or channel mixing, or norms whose epsilon grows every few blocks
    (model.rescale_every): RWKV's, the one architecture that has them."""
    return (bool(cfg.delta_layers) and cfg.delta_rule == "rwkv") or cfg.mlp == "rwkv" or cfg.rescale_every > 0


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with RWKV-4's layers that transformers' RWKV has not."""
    what = "RWKV-4's layers (model.delta_rule=rwkv, mlp=rwkv): RWKV, the one architecture with them,"
    raise_first([
        (cfg.mlp != "rwkv" or cfg.delta_rule != "rwkv" or cfg.delta_layers != tuple(range(cfg.n_layer)),
         f"{what} has time mixing (model.delta_rule=rwkv on every layer) then channel mixing (model.mlp=rwkv) in "
         f"every block"),
        (cfg.norm != "layernorm" or not cfg.norm_affine or cfg.norm_unit_offset or cfg.norm_bias is False
         or not cfg.embed_norm or cfg.norm_eps != LN_OUT_EPS,
         f"{what} has LayerNorms with weights and biases at epsilon 1e-5, one on the embeddings (model.norm="
         f"layernorm, norm_bias, embed_norm, norm_eps=1e-5)"),
        (cfg.pos_emb != "none", f"model.pos_emb={cfg.pos_emb}: {what} has no positions"),
        (cfg.value_embeddings or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier
         or cfg.logit_divisor or cfg.logit_softcap or cfg.head_bias or cfg.head_vocab or cfg.residual_scales
         or cfg.layer_scalars or cfg.smear_gate or cfg.layer_lambdas or cfg.backout or cfg.per_layer_embd,
         f"{what} has no embedding scale, scalars, logit cap, head bias or further streams"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    return {"model_type": "rwkv", "vocab_size": cfg.vocab_size, "context_length": cfg.context_len,
            "hidden_size": cfg.n_embd, "num_hidden_layers": cfg.n_layer, "attention_hidden_size": cfg.delta_value_dim,
            "intermediate_size": cfg.hidden_dim, "layer_norm_epsilon": cfg.norm_eps,
            "rescale_every": cfg.rescale_every, "tie_word_embeddings": cfg.tie_embeddings, "use_cache": True}


FAMILY = Family(name="rwkv", architecture="RwkvForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf)
