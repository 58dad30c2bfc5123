"""Gemma 3n's text model (Google's Gemma3nForCausalLM with a Gemma3nTextConfig, model_type "gemma3n_text": gemma-3n-E2B
and E4B), and the text model of Gemma3nForConditionalGeneration's folders (model_type "gemma3n": text_config nested
in config.json, the text weights under model.language_model., the vision and audio towers and their embedders left
unread).

Gemma 3n is Gemma 4's attention and per-layer inputs (gemma4.py: plain RMSNorms, QK-norm, values RMS-normed without a
weight, unscaled scores, the last num_kv_shared_layers layers reading an earlier layer's keys and values, sliding and
full layers each with a RoPE base of its own, the logits soft-capped) inside a residual stream of its own, each a
ModelConfig field (semantics read from transformers' models/gemma3n/modeling_gemma3n.py):
- AltUp (altup_num_inputs -> altup_streams): N streams, each layer predicting them from one another, running its
  sublayers on the first and correcting them all (altup_correct_scale, altup_coef_clip as they are);
- LAuReL (laurel_rank): a low-rank branch beside attention;
- activation sparsity (activation_sparsity_pattern -> mlp_sparsity): a Gaussian top-k on the first layers' gates.
Refused by name: AltUp's active stream other than the first (altup_active_idx; transformers stacks the embeddings
first and adds the per-layer input to streams 1.. whatever it is), MLP widths that differ between layers
(intermediate_size as a list), biases (attention_bias), RoPE kinds other than default, an activation other than
tanh-GELU. A multimodal folder's token ids from the vision embedder's vocab_offset up are its image and audio soft
tokens, which Gemma3nModel embeds through embed_vision / embed_audio: the text model reads them as text rows.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.gemma4 import text_config
from redline.interop.llama import NORM_NAMES
from redline.interop.multimodal import text_view
from redline.model import ModelConfig

_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new")
_FULL, _SLIDING = "full_attention", "sliding_attention"
_TOWERS = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")
_KV = ("k_proj", "v_proj", "k_norm", "v_norm")  # what a kv-shared layer's attention does not read
# redline's block -> transformers' Gemma3nTextDecoderLayer names, besides the sandwich norms and the attention
_BLOCK = {"altup_router.weight": "altup.modality_router.weight", "altup_router_norm.weight": "altup.router_norm.weight",
          "altup_predict.weight": "altup.prediction_coefs.weight",
          "altup_correct.weight": "altup.correction_coefs.weight",
          "laurel_left.weight": "laurel.linear_left.weight", "laurel_right.weight": "laurel.linear_right.weight",
          "laurel_norm.weight": "laurel.post_laurel_norm.weight",
          "ple_gate.weight": "per_layer_input_gate.weight", "ple_proj.weight": "per_layer_projection.weight",
          "ple_norm.weight": "post_per_layer_input_norm.weight"}
_MODEL = {"ple_table.weight": "model.embed_tokens_per_layer.weight",
          "ple_proj.weight": "model.per_layer_model_projection.weight",
          "ple_norm.weight": "model.per_layer_projection_norm.weight", "norm_f.weight": "model.norm.weight"}


def _kinds(hf: dict) -> list[str]:
    """layer_types, transformers' default where the config gives none (four sliding layers to one full)."""
    n = hf["num_hidden_layers"]
    kinds = list(hf.get("layer_types") or [_FULL if (i + 1) % 5 == 0 else _SLIDING for i in range(n)])
    if len(kinds) != n or not set(kinds) <= {_FULL, _SLIDING}:
        raise UserError(f"layer_types must name {_SLIDING!r} or {_FULL!r} for each of the {n} layers, got {kinds}")
    return kinds


def _width(hf: dict) -> int:
    """The MLP width: intermediate_size, one for every layer (a list of equal values, as transformers writes it)."""
    width = hf.get("intermediate_size", 16_384)
    widths = set(width) if isinstance(width, list) else {width}
    if len(widths) != 1:
        raise UserError(f"intermediate_size={width}: redline's layers share one MLP width; import a Gemma 3n whose "
                        f"layers are all as wide")
    return int(widths.pop())


def _sparsity(hf: dict, n: int) -> tuple[float, ...]:
    """activation_sparsity_pattern per layer (transformers' default: 0.95 on the first 10 of more than 10), () where
    every layer is dense."""
    pattern = hf.get("activation_sparsity_pattern")
    if pattern is None:
        sparse = 10 if n > 10 else 0
        pattern = [0.95] * sparse + [0.0] * (n - sparse)
    elif not isinstance(pattern, list):
        pattern = [pattern] * n
    if len(pattern) != n:
        raise UserError(f"activation_sparsity_pattern={pattern} must give one value for each of the {n} layers")
    return tuple(float(s) for s in pattern) if any(pattern) else ()


def _rope_fields(hf: dict, kinds: list[str]) -> dict:
    """rope_theta from the full layers' rope_parameters, rope_local_theta from the sliding ones' (default RoPE both,
    at Gemma3nTextConfig's bases where none is given; rope_theta and rope_local_base_freq as older configs name them)."""
    params = hf.get("rope_parameters") or {}
    full = dict(params.get(_FULL) or {})
    local = dict(params.get(_SLIDING) or {})
    for kind, part in ((_FULL, full), (_SLIDING, local)):
        if part.get("rope_type", "default") != "default":
            raise UserError(f"the {kind} layers' RoPE {part.get('rope_type')!r}: redline reads Gemma 3n's default "
                            f"RoPE (rope_type default)")
    out = {"rope_theta": float(full.get("rope_theta", hf.get("rope_theta", 1_000_000.0)))}
    if _SLIDING in kinds:
        out["rope_local_theta"] = float(local.get("rope_theta", hf.get("rope_local_base_freq", 10_000.0)))
    return out


def model_config(hf: dict) -> ModelConfig:
    hf = text_config(hf)
    act = hf.get("hidden_activation") or "gelu_pytorch_tanh"
    per_layer = int(hf.get("hidden_size_per_layer_input", 256) or 0)
    refused = [
        ("altup_active_idx", int(hf.get("altup_active_idx") or 0) != 0,
         "transformers' Gemma 3n stacks the embeddings as stream 0 and adds the per-layer inputs to streams 1 on "
         "whichever is active; redline runs the sublayers on stream 0"),
        ("attention_bias", bool(hf.get("attention_bias")), "Gemma 3n's published models have none and redline has "
                                                            "no bias on q/k/v/o without the MLP's"),
        ("hidden_activation", act not in _TANH_GELU, "redline's GeGLU uses the tanh-approximated GELU"),
        ("hidden_size_per_layer_input", per_layer <= 0, "Gemma 3n's layers each read a per-layer input; give its "
                                                         "width"),
        ("altup_num_inputs", int(hf.get("altup_num_inputs", 4)) < 1, "AltUp needs at least one stream"),
        ("laurel_rank", int(hf.get("laurel_rank", 64) or 0) <= 0, "redline's Gemma 3n layers hold a LAuReL branch "
                                                                  "of rank >= 1"),
    ]
    raise_first([(bad, f"{name}={hf.get(name)!r}: {why}") for name, bad, why in refused])
    kinds = _kinds(hf)
    n = hf["num_hidden_layers"]
    sliding = [i for i, kind in enumerate(kinds) if kind == _SLIDING]
    window = int(hf.get("sliding_window", 512) or 0) if sliding else 0  # Gemma3nTextConfig's default
    if sliding and not window:
        raise UserError("layer_types names sliding layers but sliding_window is 0; give the window")
    heads = hf.get("num_attention_heads", 8)
    softcap = hf.get("final_logit_softcapping", 30.0)
    clip = hf.get("altup_coef_clip", 120.0)
    return ModelConfig(
        vocab_size=hf.get("vocab_size", 262_400), context_len=hf.get("max_position_embeddings", 32_768), n_layer=n,
        n_embd=hf.get("hidden_size", 2048), n_head=heads, n_kv_head=hf.get("num_key_value_heads", 2),
        head_size=hf.get("head_dim") or 256, mlp_hidden=_width(hf), v_norm=True, qk_norm=True, fused_qkv=False,
        sliding_window=window, window_layers=tuple(sliding) if window else (), attn_scale=1.0, pos_emb="rope",
        mlp="geglu", fused_mlp=True, norm="rmsnorm", norm_position="sandwich",
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), embed_scale=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=False, logit_softcap=float(softcap or 0.0),
        kv_shared_layers=int(hf.get("num_kv_shared_layers", 15) or 0), per_layer_embd=per_layer,
        per_layer_vocab=int(hf.get("vocab_size_per_layer_input", 262_144)),
        altup_streams=int(hf.get("altup_num_inputs", 4)), altup_correct_scale=bool(hf.get("altup_correct_scale", True)),
        altup_coef_clip=float(clip or 0.0), laurel_rank=int(hf.get("laurel_rank", 64) or 0),
        mlp_sparsity=_sparsity(hf, n), **_rope_fields(hf, kinds),
    )


# -- export ------------------------------------------------------------------------------------------------------


def wants_gemma3n(cfg: ModelConfig) -> bool:
    """Whether a model is Gemma 3n's: AltUp streams, LAuReL or activation sparsity, which no other architecture redline
    writes has."""
    return bool(cfg.altup_streams or cfg.laurel_rank or cfg.mlp_sparsity)


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a Gemma-3n-like model that Gemma 3n does not have."""
    problems = [
        (not cfg.altup_streams, "Gemma 3n's layers run inside AltUp streams (model.altup_streams)"),
        (not cfg.per_layer_embd or not cfg.laurel_rank, "Gemma 3n's layers each read a per-layer input "
                                                        "(model.per_layer_embd) and hold a LAuReL branch (laurel_rank)"),
        (cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine,
         "Gemma 3n's norms are RMSNorms scaling by their weight (model.norm=rmsnorm, no norm_unit_offset)"),
        (cfg.mlp != "geglu" or cfg.gelu_approximate != "tanh", f"model.mlp={cfg.mlp}: Gemma 3n's MLP is tanh GeGLU"),
        (cfg.pos_emb != "rope" or cfg.rope_scaling != "none" or cfg.rope_dims or cfg.nope_interval
         or cfg.rope_layer_theta, f"model.rope_scaling={cfg.rope_scaling}: Gemma 3n rotates whole heads, unscaled"),
        (cfg.sliding_window and not cfg.rope_local_theta, "Gemma 3n's sliding layers rotate with a base of their own "
                                                          "(model.rope_local_theta)"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "head" or cfg.qk_norm_after_rope,
         "Gemma 3n normalizes each head's q and k before RoPE (model.qk_norm)"),
        (not cfg.v_norm or not cfg.embed_scale or cfg.attn_scale != 1.0,
         "Gemma 3n norms its values (model.v_norm), scales its embeddings (embed_scale) and leaves its scores unscaled "
         "(attn_scale=1)"),
        (cfg.global_head_size or cfg.global_kv_head or cfg.global_values_from_keys or cfg.kv_shared_mlp_hidden,
         "Gemma 3n's layers share one head geometry and MLP width (no model.global_head_size, global_kv_head, "
         "global_values_from_keys or kv_shared_mlp_hidden)"),
        (not cfg.logit_softcap or not cfg.altup_coef_clip,
         "Gemma 3n soft-caps its logits (model.logit_softcap) and clamps its AltUp coefficients in training "
         "(altup_coef_clip; the published models': 30 and 120): transformers' Gemma3nTextConfig takes no None"),
        (cfg.bias or cfg.has_qkv_bias or cfg.attn_softcap or cfg.attn_sinks or cfg.attn_gate != "none"
         or cfg.logit_divisor or cfg.embed_multiplier or cfg.residual_multiplier or cfg.embed_norm or cfg.head_bias,
         "Gemma 3n has no biases, score caps, sinks, gates or multipliers"),
    ]
    raise_first(problems)


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    kinds = [_SLIDING if cfg.layer_window(i) else _FULL for i in range(cfg.n_layer)]
    return {
        "model_type": "gemma3n_text", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": [cfg.hidden_dim] * cfg.n_layer, "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": cfg.context_len,
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "attention_dropout": 0.0, "sliding_window": cfg.sliding_window or cfg.context_len, "layer_types": kinds,
        "final_logit_softcapping": cfg.logit_softcap,
        "rope_parameters": {_FULL: {"rope_type": "default", "rope_theta": cfg.rope_theta},
                            _SLIDING: {"rope_type": "default", "rope_theta": cfg.rope_local_theta or cfg.rope_theta}},
        "hidden_size_per_layer_input": cfg.per_layer_embd,
        "vocab_size_per_layer_input": cfg.per_layer_vocab or cfg.vocab_size,
        "altup_active_idx": 0, "altup_num_inputs": cfg.altup_streams, "altup_correct_scale": cfg.altup_correct_scale,
        "altup_coef_clip": cfg.altup_coef_clip, "laurel_rank": cfg.laurel_rank,
        "num_kv_shared_layers": cfg.kv_shared_layers,
        "activation_sparsity_pattern": list(cfg.mlp_sparsity) or [0.0] * cfg.n_layer,
        "initializer_range": 0.02, "use_cache": True,
    }


# -- weights -----------------------------------------------------------------------------------------------------


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    src = text_view(src)  # Gemma3nForConditionalGeneration's model.language_model. read as model.
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg), **take_head(src, cfg),
           **{ours: src.take(theirs) for ours, theirs in _MODEL.items()}}
    for i in range(cfg.altup_streams - 1):
        out[f"altup_in.{i}.weight"] = src.take(f"model.altup_projections.{i}.weight")
        out[f"altup_out.{i}.weight"] = src.take(f"model.altup_unembed_projections.{i}.weight")
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        a = p + "self_attn."
        for ours, theirs in NORM_NAMES["sandwich"].items():
            out[f"{r}{ours}.weight"] = src.take(f"{p}{theirs}.weight")
        out[r + "attn.q.weight"] = src.take(a + "q_proj.weight")
        out[r + "attn.q_norm.weight"] = src.take(a + "q_norm.weight")
        out[r + "attn.proj.weight"] = src.take(a + "o_proj.weight")
        if cfg.kv_source(i) is None:
            out[r + "attn.k.weight"] = src.take(a + "k_proj.weight")
            out[r + "attn.k_norm.weight"] = src.take(a + "k_norm.weight")
            out[r + "attn.v.weight"] = src.take(a + "v_proj.weight")
        else:  # a checkpoint may hold the shared layers' unused projections (transformers ignores them)
            for name in _KV:
                if f"{a}{name}.weight" in src:
                    src.take(f"{a}{name}.weight")
        out[r + "mlp.fc.weight"] = torch.cat([src.take(p + "mlp.gate_proj.weight"), src.take(p + "mlp.up_proj.weight")])
        out[r + "mlp.proj.weight"] = src.take(p + "mlp.down_proj.weight")
        out.update({r + ours: src.take(p + theirs) for ours, theirs in _BLOCK.items()})
        scale = src.take(p + "altup.correct_output_scale")
        if cfg.altup_correct_scale:  # stored whether transformers applies it or not
            out[r + "altup_scale"] = scale
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size], **give_head(state, cfg),
           **{theirs: state[ours] for ours, theirs in _MODEL.items()}}
    for i in range(cfg.altup_streams - 1):
        out[f"model.altup_projections.{i}.weight"] = state[f"altup_in.{i}.weight"]
        out[f"model.altup_unembed_projections.{i}.weight"] = state[f"altup_out.{i}.weight"]
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        a = p + "self_attn."
        for ours, theirs in NORM_NAMES["sandwich"].items():
            out[f"{p}{theirs}.weight"] = state[f"{r}{ours}.weight"]
        out[a + "q_proj.weight"] = state[r + "attn.q.weight"]
        out[a + "q_norm.weight"] = state[r + "attn.q_norm.weight"]
        out[a + "o_proj.weight"] = state[r + "attn.proj.weight"]
        if cfg.kv_source(i) is None:
            out[a + "k_proj.weight"] = state[r + "attn.k.weight"]
            out[a + "k_norm.weight"] = state[r + "attn.k_norm.weight"]
            out[a + "v_proj.weight"] = state[r + "attn.v.weight"]
        gate, up = state[r + "mlp.fc.weight"].chunk(2)
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate, up
        out[p + "mlp.down_proj.weight"] = state[r + "mlp.proj.weight"]
        out.update({p + theirs: state[r + ours] for ours, theirs in _BLOCK.items()})
        scale = state.get(r + "altup_scale")
        out[p + "altup.correct_output_scale"] = scale if scale is not None else torch.zeros(cfg.n_embd)
    return {k: v.contiguous() for k, v in out.items()}


def ignorable(name: str) -> bool:
    """The multimodal folders' vision and audio towers and their embedders, which the text model does not run."""
    return name.startswith(_TOWERS)


FAMILY = Family(name="gemma3n_text", architecture="Gemma3nForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=ignorable)
# Gemma3nForConditionalGeneration's folders: the text model is read; exports are the text model (FAMILY's)
MULTIMODAL_FAMILY = Family(name="gemma3n", architecture="Gemma3nForCausalLM", model_config=model_config,
                           hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=ignorable)
