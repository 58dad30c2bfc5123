"""ModernBERT-Decoder (transformers' ModernBertDecoderForCausalLM, model_type "modernbert-decoder": the Ettin
decoders), as transformers' models/modernbert_decoder/modeling_modernbert_decoder.py computes it:

- the token embeddings LayerNormed (embeddings.norm: model.embed_norm), and layer 0's attention reading them with no
  norm of its own (its attn_norm an identity: model.first_norm_free); the other layers pre-LayerNorm blocks
  (attn_norm, mlp_norm), LayerNorms with a bias only where norm_bias says so;
- multi-head attention with separate q/k/v and Wo (biases where attention_bias), scores scaled by head_dim^-0.5,
  global (full) and local layers (layer_types; by default every global_attn_every_n_layers-th layer from 0 global),
  the local ones within a window of local_attention // 2 (the config's sliding_window, transformers' sliding-window
  mask), each kind with its own RoPE base (rope_parameters, or global_rope_theta / local_rope_theta as the Hub's
  configs give them: model.rope_theta, model.rope_local_theta);
- a GeGLU MLP: Wi's first half activated (hidden_activation), times its second half, then Wo (biases where
  mlp_bias);
- final_norm, then the prediction head lm_head (dense, classifier_activation, LayerNorm: model.head_transform) and
  the decoder (tied to the embedding by default, its bias where decoder_bias: model.head_bias).

Exported back as ModernBertDecoderForCausalLM: a redline model with model.head_transform or model.first_norm_free
(its other options refused by name where ModernBERT-Decoder has them not).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, pad_rows, raise_first
from redline.interop.llama import layer_windows
from redline.model import ModelConfig

_GELU = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}  # ACT2FN's names -> F.gelu's approximate


def _rope_bases(hf: dict) -> tuple[float, float]:
    """(the global layers' base, the local layers'), default RoPE on both (ModernBertDecoderConfig's defaults)."""
    params = hf.get("rope_parameters") or {}
    full = params.get("full_attention") or {}
    local = params.get("sliding_attention") or {}
    for kind, spec in (("full_attention", full), ("sliding_attention", local)):
        raise_first([(spec.get("rope_type", "default") != "default",
                      f"rope_parameters.{kind}.rope_type={spec.get('rope_type')!r}: redline reads ModernBERT-Decoder "
                      f"with default RoPE only")])
    return (float(full.get("rope_theta", hf.get("global_rope_theta", 160_000.0))),
            float(local.get("rope_theta", hf.get("local_rope_theta", 10_000.0))))


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_activation", "gelu")
    head_act = hf.get("classifier_activation", "gelu")
    attention_bias, mlp_bias = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
    raise_first([
        (act not in _GELU, f"hidden_activation={act!r}: redline's GeGLU takes GELU ({', '.join(_GELU)})"),
        (head_act != act, f"classifier_activation={head_act!r} with hidden_activation={act!r}: redline's prediction "
                          f"head (model.head_transform) takes the MLP's GELU"),
        (attention_bias != mlp_bias, f"attention_bias={attention_bias} with mlp_bias={mlp_bias}: redline's biases "
                                     f"(model.bias) sit on every layer's output projection and MLP together"),
        (bool(hf.get("classifier_bias", False)) != mlp_bias,
         f"classifier_bias={hf.get('classifier_bias')} with mlp_bias={mlp_bias}: redline's prediction head is biased "
         f"as the MLP is (model.bias)"),
    ])
    n_layer, width, heads = hf["num_hidden_layers"], hf["hidden_size"], hf["num_attention_heads"]
    every = hf.get("global_attn_every_n_layers", 3)
    default_kinds = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(n_layer)]
    local = hf.get("local_attention", 128)
    kinds = hf.get("layer_types") or default_kinds
    if "sliding_attention" in kinds and not local:
        raise UserError(f"local_attention={local} with local layers (layer_types): ModernBERT-Decoder's window is "
                        f"local_attention // 2")
    windows = layer_windows({"layer_types": kinds, "sliding_window": local // 2 if local else 0}, n_layer, kinds)
    full_theta, local_theta = _rope_bases(hf)
    local_theta = local_theta if windows["sliding_window"] and local_theta != full_theta else 0.0
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 8192), n_layer=n_layer,
        n_embd=width, n_head=heads, n_kv_head=heads, mlp_hidden=hf["intermediate_size"], fused_qkv=True,
        pos_emb="rope", rope_theta=full_theta, rope_local_theta=local_theta, **windows, mlp="geglu",
        gelu_approximate=_GELU[act], fused_mlp=True, norm="layernorm", norm_bias=bool(hf.get("norm_bias", False)),
        norm_eps=float(hf.get("norm_eps", 1e-5)), embed_norm=True, first_norm_free=True, head_transform=True,
        head_bias=bool(hf.get("decoder_bias", True)), tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        bias=mlp_bias, qkv_bias=attention_bias)


def _norm_kinds(cfg: ModelConfig) -> tuple[str, ...]:
    return ("weight", "bias") if cfg.norm_bias else ("weight",)


def _biased(cfg: ModelConfig) -> tuple[str, ...]:
    return ("weight", "bias") if cfg.bias else ("weight",)


def _names(cfg: ModelConfig) -> dict[str, str]:
    """redline's name -> ModernBERT-Decoder's, for every tensor but the fused q/k/v and the head (weight or bias)."""
    names = {}
    for kind in _norm_kinds(cfg):
        names |= {f"embed_norm.{kind}": f"model.embeddings.norm.{kind}", f"norm_f.{kind}": f"model.final_norm.{kind}",
                  f"head_transform.norm.{kind}": f"lm_head.norm.{kind}"}
        for i in range(cfg.n_layer):
            if i:  # layer 0 reads the normed embeddings (first_norm_free)
                names[f"blocks.{i}.norm1.{kind}"] = f"model.layers.{i}.attn_norm.{kind}"
            names[f"blocks.{i}.norm2.{kind}"] = f"model.layers.{i}.mlp_norm.{kind}"
    for kind in _biased(cfg):
        names[f"head_transform.dense.{kind}"] = f"lm_head.dense.{kind}"
        for i in range(cfg.n_layer):
            r, p = f"blocks.{i}.", f"model.layers.{i}."
            names |= {f"{r}attn.proj.{kind}": f"{p}attn.Wo.{kind}", f"{r}mlp.fc.{kind}": f"{p}mlp.Wi.{kind}",
                      f"{r}mlp.proj.{kind}": f"{p}mlp.Wo.{kind}"}
    return names


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {ours: src.take(theirs) for ours, theirs in _names(cfg).items()}
    out["wte.weight"] = pad_rows(src.take("model.embeddings.tok_embeddings.weight"), cfg)
    for i in range(cfg.n_layer):
        attn = f"model.layers.{i}.attn."
        for kind in ("weight", "bias") if cfg.has_qkv_bias else ("weight",):
            out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat([src.take(f"{attn}{x}_proj.{kind}") for x in "qkv"])
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = pad_rows(src.take("decoder.weight"), cfg, head=True)
    elif "decoder.weight" in src:  # the embedding again, where a file stores it
        src.take("decoder.weight")
    if cfg.head_bias:  # the padded rows' logits are never used
        out["lm_head.bias"] = pad_rows(src.take("decoder.bias"), cfg, head=True)
    return out


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with a prediction head or a norm-free first layer that
    ModernBERT-Decoder, the one architecture with them redline exports to, has not."""
    what = "model.head_transform or model.first_norm_free: ModernBERT-Decoder, the one architecture with them " \
           "redline exports to,"
    raise_first([
        (not (cfg.head_transform and cfg.first_norm_free and cfg.embed_norm),
         f"{what} has all three of them and model.embed_norm"),
        (cfg.norm != "layernorm" or cfg.norm_unit_offset or not cfg.norm_affine,
         f"{what} has learned LayerNorms (model.norm=layernorm)"),
        (cfg.mlp != "geglu" or not cfg.fused_mlp, f"{what} has a GeGLU MLP (model.mlp={cfg.mlp})"),
        (cfg.kv_heads != cfg.n_head or cfg.head_size not in (None, cfg.n_embd // cfg.n_head),
         f"{what} has multi-head attention over whole-width heads (model.n_kv_head, model.head_size)"),
        (cfg.pos_emb != "rope" or cfg.rope_scaling != "none" or cfg.rope_dims or cfg.nope_interval
         or cfg.rope_layer_theta or cfg.rope_local_dims, f"{what} rotates whole heads with default RoPE"),
        (cfg.attn_chunk, f"{what} has no attention chunks (model.attn_chunk)"),
        (cfg.has_qkv_bias != cfg.bias, f"{what} biases q/k/v where it biases every other layer (model.qkv_bias)"),
        (cfg.qk_norm or cfg.attn_scale or cfg.attn_softcap or cfg.attn_sinks or cfg.attn_gate != "none"
         or cfg.logit_softcap or cfg.logit_divisor or cfg.embed_scale or cfg.embed_multiplier
         or cfg.residual_multiplier or cfg.parallel_residual or cfg.norm_position != "pre",
         f"{what} has plain pre-norm blocks: no QK-norm, score scale, caps, sinks, gates or multipliers"),
        (cfg.moe_experts or cfg.conv_layers or cfg.delta_layers or cfg.mlp_free_layers or cfg.mixer_free_layers
         or cfg.value_tables or cfg.kv_lora_rank, f"{what} has attention and a dense MLP on every layer"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    kinds = ["sliding_attention" if cfg.layer_window(i) else "full_attention" for i in range(cfg.n_layer)]
    local_theta = cfg.rope_local_theta or cfg.rope_theta
    return {
        "model_type": "modernbert-decoder", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "hidden_activation": "gelu" if cfg.gelu_approximate == "none" else "gelu_pytorch_tanh",
        "classifier_activation": "gelu" if cfg.gelu_approximate == "none" else "gelu_pytorch_tanh",
        "max_position_embeddings": cfg.context_len, "norm_eps": cfg.norm_eps, "norm_bias": bool(cfg.norm_bias),
        "attention_bias": cfg.has_qkv_bias, "mlp_bias": cfg.bias, "classifier_bias": cfg.bias,
        "decoder_bias": cfg.head_bias, "tie_word_embeddings": cfg.tie_embeddings, "layer_types": kinds,
        "local_attention": 2 * (cfg.sliding_window or 64), "embedding_dropout": 0.0, "attention_dropout": 0.0,
        "mlp_dropout": 0.0, "classifier_dropout": 0.0,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
                            "sliding_attention": {"rope_type": "default", "rope_theta": local_theta}},
        # the writer sets the EOS, BOS and padding ids the tokenizer has; ModernBertDecoderConfig takes no None for
        # BOS, padding, CLS or SEP: where the tokenizer has none, its class's defaults stand
        "eos_token_id": None,
    }


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {theirs: state[ours] for ours, theirs in _names(cfg).items()}
    out["model.embeddings.tok_embeddings.weight"] = state["wte.weight"][:cfg.vocab_size]
    q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    for i in range(cfg.n_layer):
        for kind in ("weight", "bias") if cfg.has_qkv_bias else ("weight",):
            parts = state[f"blocks.{i}.attn.qkv.{kind}"].split([q, kv, kv])
            out |= {f"model.layers.{i}.attn.{x}_proj.{kind}": t for x, t in zip("qkv", parts)}
    if not cfg.tie_embeddings:
        out["decoder.weight"] = state["lm_head.weight"][:cfg.vocab_size]
    if cfg.head_bias:
        out["decoder.bias"] = state["lm_head.bias"][:cfg.vocab_size]
    return out


FAMILY = Family(name="modernbert-decoder", architecture="ModernBertDecoderForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf)
