"""Apertus (Swiss AI's ApertusForCausalLM, model_type "apertus": Apertus-8B/70B): Llama's attention and names with
Qwen3's per-head QK-norm (before RoPE), Llama 3 RoPE scaling, and an ungated MLP down_proj(xielu(up_proj(x))) whose
activation, xIELU, has two learned scalars a layer (redline's mlp=xielu, model.xielu). Its block norms are named
`attention_layernorm` and `feedforward_layernorm`.

transformers' XIELUActivation (activations.py) keeps alpha_p and alpha_n raw, each (1,), as the softplus inverses of
the slopes it uses, and beta and eps as 0-d buffers that every checkpoint stores; redline holds the raw scalars as
each MLP's parameters and beta and eps as config fields (model.xielu_beta, xielu_eps), so an import checks that every
layer's stored beta and eps are the config's (rounded to the stored dtype) and refuses a checkpoint whose layers
differ. Semantics read from transformers' models/apertus/modeling_apertus.py.

Apertus 1.5 (model_type "apertus1p5_text", Apertus1p5TextForCausalLM; and "apertus1p5", its multimodal
Apertus1p5ForConditionalGeneration) is Apertus's text model unchanged over a vocabulary extended with image and audio
code ranges: images and audio are tokenized by a VQ image tokenizer and a WavTokenizer encoder (model.vision_tokenizer,
model.audio_tokenizer, left unread) into ids of that vocabulary, whose rows of the shared embedding are the features,
so on text the multimodal model is its text model (transformers' models/apertus1p5/modular_apertus1p5.py). Both
export as Apertus. The released checkpoints prune the head to the text ids: output_vocab_size below vocab_size, an
lm_head of that many rows, the first ids', and logits that wide, while the embedding keeps every id for inputs.
redline's model.head_vocab is that width; a model with it exports as Apertus1p5TextForCausalLM, the one
architecture with such a head (ApertusForCausalLM's has vocab_size rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop import llama
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig

_NORMS = {"attention_layernorm": "input_layernorm", "feedforward_layernorm": "post_attention_layernorm"}
_ACT = "mlp.act_fn."


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "xielu")
    if act != "xielu":
        raise UserError(f"hidden_act={act!r}: redline's Apertus has the xIELU MLP (hidden_act xielu) alone")
    if hf.get("attention_bias"):  # q/k/v/o biases with none in the MLP: redline's `bias` covers o_proj and the MLP
        raise UserError("attention_bias=true: Apertus then has biases on q/k/v/o but none in its MLP, a mix redline "
                        "does not have (biases on q/k/v alone, or on every Linear layer)")
    return ModelConfig(
        **llama.shape_fields(hf), qk_norm=True, fused_qkv=True, pos_emb="rope", mlp="xielu", fused_mlp=True,
        norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False, **llama._rope(hf))


def _stored_scalar(src: TensorSource, names: list[str], wanted: float, what: str) -> None:
    """Every layer's stored beta or eps (0-d) equal to the config's `wanted` in the stored dtype, read as used."""
    for name in names:
        t = src.take(name)
        if float(t) != float(torch.tensor(wanted, dtype=t.dtype)):
            raise UserError(f"{name} is {float(t)}, not xIELU's {what}={wanted}: redline's Apertus takes one {what} "
                            f"for every layer (model.xielu_{what})")


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    theirs = {}
    for name in src.names:
        ours = name
        for old, new in _NORMS.items():
            ours = ours.replace(f".{old}.", f".{new}.")
        theirs[ours] = name
    out = llama.to_redline(TensorSource(theirs, lambda name: src.take(theirs[name]), src.where), cfg)
    pre = llama._prefix(src)
    layers = [f"{pre}layers.{i}.{_ACT}" for i in range(cfg.n_layer)]
    for i, p in enumerate(layers):
        out[f"blocks.{i}.mlp.alpha_p"] = src.take(p + "alpha_p").reshape(1)
        out[f"blocks.{i}.mlp.alpha_n"] = src.take(p + "alpha_n").reshape(1)
    _stored_scalar(src, [p + "beta" for p in layers], cfg.xielu_beta, "beta")
    _stored_scalar(src, [p + "eps" for p in layers], cfg.xielu_eps, "eps")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {}
    for name, t in llama.to_hf(state, cfg, "llama").items():
        for old, new in _NORMS.items():
            name = name.replace(f".{new}.", f".{old}.")
        out[name] = t
    for i in range(cfg.n_layer):
        p, alpha = f"model.layers.{i}.{_ACT}", state[f"blocks.{i}.mlp.alpha_p"]
        out[p + "alpha_p"], out[p + "alpha_n"] = alpha, state[f"blocks.{i}.mlp.alpha_n"]
        out[p + "beta"] = torch.tensor(cfg.xielu_beta, dtype=alpha.dtype)  # 0-d, as XIELUActivation's buffers
        out[p + "eps"] = torch.tensor(cfg.xielu_eps, dtype=alpha.dtype)
    return out


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option that Apertus, the one architecture with the xIELU MLP redline exports to, does
    not have."""
    what = "model.mlp=xielu: Apertus, the one architecture with it redline exports to,"
    raise_first([
        (cfg.norm_position != "pre" or cfg.parallel_residual or cfg.norm != "rmsnorm" or cfg.norm_unit_offset
         or not cfg.norm_affine or cfg.embed_norm, f"{what} has pre-RMSNorm blocks of sequential sublayers"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "head" or cfg.qk_norm_after_rope,
         f"{what} has a per-head QK-norm before RoPE (model.qk_norm)"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_local_theta or cfg.rope_layer_theta,
         f"{what} rotates every layer's whole heads with one RoPE"),
        (cfg.sliding_window > 0, f"{what} attends to the whole context (model.sliding_window)"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no Linear biases (model.bias, model.qkv_bias)"),
        (cfg.conv_layers or cfg.delta_layers or cfg.mlp_free_layers or cfg.mixer_free_layers,
         f"{what} has attention and an MLP on every layer"),
        (cfg.attn_sinks or cfg.attn_gate != "none" or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap
         or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.head_bias
         or cfg.value_embeddings, f"{what} has no sinks, gates, scales, caps or scalars"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    out = llama.llama_shaped_hf_config(cfg, "apertus")
    rope = {"rope_type": "default", "rope_theta": out.pop("rope_theta"), **(out.pop("rope_scaling") or {})}
    for key in ("mlp_bias",):
        out.pop(key, None)
    return {**out, "hidden_act": "xielu", "attention_bias": False, "rope_parameters": rope, "pad_token_id": None,
            "bos_token_id": None, "eos_token_id": None}  # the writer sets the token ids


# Apertus1p5TextConfig's defaults for the fields redline reads, which transformers fills in where a config leaves
# them out (save_pretrained writes a nested text_config's fields that differ from them)
_APERTUS1P5_DEFAULTS = dict(
    vocab_size=266_752, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32, num_attention_heads=32,
    max_position_embeddings=65_536, rms_norm_eps=1e-5, tie_word_embeddings=False,
    rope_parameters={"rope_type": "llama3", "rope_theta": 12_000_000.0, "factor": 8.0,
                     "original_max_position_embeddings": 8192, "low_freq_factor": 1.0, "high_freq_factor": 4.0})


def apertus1p5_config(hf: dict) -> ModelConfig:
    """Apertus 1.5's text config (its class's defaults where it leaves a field out): Apertus's, its head pruned to
    output_vocab_size rows where that is below vocab_size (model.head_vocab)."""
    hf = {**_APERTUS1P5_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    rows, vocab = hf.get("output_vocab_size"), hf["vocab_size"]
    if rows is None or rows == vocab:
        return model_config(hf)
    if not 1 <= rows <= vocab:
        raise UserError(f"output_vocab_size={rows} is outside [1, vocab_size={vocab}]: the config is damaged")
    if hf["tie_word_embeddings"]:  # transformers would tie a (rows, C) head to the (vocab, C) embedding
        raise UserError(f"output_vocab_size={rows} with tie_word_embeddings=true: a head pruned below vocab_size="
                        f"{vocab} cannot be the embedding; redline takes a pruned head untied")
    return replace(model_config(hf), head_vocab=rows)


def apertus1p5_hf_config(cfg: ModelConfig) -> dict:
    return {**hf_config(cfg), "model_type": "apertus1p5_text", "output_vocab_size": cfg.head_vocab or None}


FAMILY = Family(name="apertus", architecture="ApertusForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=llama._ignorable)

def apertus1p5_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    """The text model's tensors, under model.* or, as Apertus1p5TextForCausalLM also loads them, under a multimodal
    save's model.language_model.*."""
    from redline.interop.multimodal import text_view

    return to_redline(text_view(src), cfg)


TEXT_1P5_FAMILY = Family(name="apertus1p5_text", architecture="Apertus1p5TextForCausalLM",
                         model_config=apertus1p5_config, hf_config=apertus1p5_hf_config,
                         to_redline=apertus1p5_to_redline, to_hf=to_hf,
                         # Apertus1p5TextForCausalLM leaves a multimodal save's tokenizers unread too
                         ignorable=lambda n: llama._ignorable(n) or n.startswith(_TOKENIZERS))
_TOKENIZERS = ("model.vision_tokenizer.", "model.audio_tokenizer.")
