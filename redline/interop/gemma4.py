"""Gemma 4, text only (Google's Gemma4ForCausalLM with a Gemma4TextConfig, model_type "gemma4_text"), and the text
model of Gemma4ForConditionalGeneration's folders (model_type "gemma4": text_config nested in config.json, the
text weights under model.language_model., the vision and audio towers left unread).

What differs from Gemma 3 (gemma3.py), each a ModelConfig field (semantics read from transformers'
models/gemma4/modeling_gemma4.py and configuration_gemma4.py):
- plain RMSNorms (weight · x, not 1 + weight), attention scores unscaled (attn_scale 1: QK-norm sets their size) and
  values RMS-normed per head without a weight (v_norm);
- the full-attention layers have heads of their own width and count (global_head_size, global_kv_head: the
  config's per_layer_config, or global_head_dim and num_global_key_value_heads as older configs give them) and may
  take their values from the key projection (attention_k_eq_v -> global_values_from_keys); they rotate with
  "proportional" RoPE (rope_scaling proportional: a partial_rotary_factor share of each head's pairs turns, the
  frequencies counted over the whole head), the sliding ones with an unscaled base of their own (rope_local_theta);
- layer_types: sliding and full layers in any order (window_layers);
- the last num_kv_shared_layers layers attend over the keys and values of the last earlier layer of their kind
  (kv_shared_layers), with twice the MLP width where use_double_wide_mlp (kv_shared_mlp_hidden);
- per-layer inputs (hidden_size_per_layer_input -> per_layer_embd, vocab_size_per_layer_input -> per_layer_vocab)
  and each layer's stored output scale (layer_scalar -> layer_scalars);
- final_logit_softcapping -> logit_softcap;
- enable_moe_block (gemma-4-26B-A4B): num_experts GeGLU experts moe_intermediate_size wide beside each layer's dense
  MLP (moe_beside_dense, moe_dense_hidden = intermediate_size), the top_k_experts of a softmax router renormalized
  and scaled by each expert's per_expert_scale, the router reading RMS(x) · scale · hidden_size^-0.5.
Refused by name: bidirectional attention over text (use_bidirectional_attention "all"; redline is a causal LM;
"vision", bidirectional over image tokens alone, leaves text causal and is read), biases
(attention_bias), RoPE kinds the published models do not use.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import NORM_NAMES
from redline.interop import multimodal
from redline.interop.multimodal import text_view
from redline.model import ModelConfig

_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new")
_FULL, _SLIDING = "full_attention", "sliding_attention"
_TOWERS = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")


def text_config(hf: dict) -> dict:
    """The text model's config: Gemma4Config's text_config (the head's tying the top-level flag's, as
    transformers reads it: multimodal.text_config), or hf itself."""
    return multimodal.text_config(hf, tie_default=True)


def _kinds(hf: dict) -> list[str]:
    """layer_types, transformers' default where the config gives none (five sliding layers to one full), the last
    layer full as transformers forces it."""
    n = hf["num_hidden_layers"]
    kinds = list(hf.get("layer_types") or [_FULL if (i + 1) % 6 == 0 else _SLIDING for i in range(n)])
    if len(kinds) != n or not set(kinds) <= {_FULL, _SLIDING}:
        raise UserError(f"layer_types must name {_SLIDING!r} or {_FULL!r} for each of the {n} layers, got {kinds}")
    kinds[-1] = _FULL
    return kinds


def _full_geometry(hf: dict, kinds: list[str]) -> tuple[int, int]:
    """(head width, KV heads) of the full-attention layers: per_layer_config's overrides (transformers 5 writes them,
    the same for every full layer and none for the sliding ones), else global_head_dim (512 by default) and, with
    attention_k_eq_v, num_global_key_value_heads."""
    kv = hf.get("num_key_value_heads") or hf["num_attention_heads"]
    per_layer = hf.get("per_layer_config")
    if per_layer is None:
        heads = hf.get("num_global_key_value_heads") if hf.get("attention_k_eq_v") else None
        return int(hf.get("global_head_dim") or 512), int(heads or kv)
    overrides = {int(i): dict(v) for i, v in per_layer.items()}
    full = [i for i, kind in enumerate(kinds) if kind == _FULL]
    seen = {tuple(sorted(overrides.get(i, {}).items())) for i in full}
    if any(i not in full for i in overrides) or len(seen) != 1 or not set(dict(seen.pop())) <= {
            "head_dim", "num_key_value_heads"}:
        raise UserError(f"per_layer_config={per_layer}: redline gives the full-attention layers one head width and "
                        f"KV head count of their own (head_dim, num_key_value_heads) and the sliding ones none")
    first = overrides.get(full[0], {})
    return int(first.get("head_dim", hf.get("head_dim") or 256)), int(first.get("num_key_value_heads", kv))


def _rope_fields(hf: dict, kinds: list[str]) -> dict:
    """rope_theta and proportional scaling from the full layers' rope_parameters, rope_local_theta from the sliding
    ones' (default RoPE: the only kinds Gemma 4's models use)."""
    params = hf.get("rope_parameters") or {}
    full = dict(params.get(_FULL) or {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                      "rope_theta": 1_000_000.0})
    local = dict(params.get(_SLIDING) or {"rope_type": "default", "rope_theta": 10_000.0})
    out = {"rope_theta": float(full.get("rope_theta", 10_000.0))}
    kind = full.get("rope_type", "default")
    if kind == "proportional":
        out.update(rope_scaling="proportional", rope_proportion=float(full.get("partial_rotary_factor", 1.0)),
                   rope_factor=float(full.get("factor", 1.0)))
    elif kind != "default":
        raise UserError(f"the full-attention layers' RoPE {kind!r}: redline reads Gemma 4's proportional RoPE or "
                        f"default")
    if local.get("rope_type", "default") != "default":
        raise UserError(f"the sliding-window layers' RoPE {local.get('rope_type')!r}: redline rotates them with an "
                        f"unscaled base of their own (rope_type default)")
    if _SLIDING in kinds:
        out["rope_local_theta"] = float(local.get("rope_theta", 10_000.0))
    return out


def model_config(hf: dict) -> ModelConfig:
    hf = text_config(hf)
    act = hf.get("hidden_activation") or "gelu_pytorch_tanh"
    refused = [
        # "vision" makes image tokens attend both ways and leaves text causal: the text model redline imports
        ("use_bidirectional_attention", hf.get("use_bidirectional_attention") not in (None, False, "vision"),
         "redline is a causal language model; import a causal Gemma 4"),
        ("enable_moe_block", bool(hf.get("enable_moe_block")) and not (
            hf.get("num_experts") and hf.get("top_k_experts") and hf.get("moe_intermediate_size")),
         "the experts need num_experts, top_k_experts and moe_intermediate_size"),
        ("attention_bias", bool(hf.get("attention_bias")), "Gemma 4's published models have none and redline has no "
                                                            "bias on q/k/v/o without the MLP's"),
        ("hidden_activation", act not in _TANH_GELU, "redline's GeGLU uses the tanh-approximated GELU"),
    ]
    raise_first([(bad, f"{name}={hf.get(name)!r}: {why}") for name, bad, why in refused])
    kinds = _kinds(hf)
    sliding = [i for i, kind in enumerate(kinds) if kind == _SLIDING]
    window = int(hf.get("sliding_window", 512) or 0) if sliding else 0  # Gemma4TextConfig's default
    if sliding and not window:
        raise UserError("layer_types names sliding layers but sliding_window is 0; give the window")
    heads, kv = hf["num_attention_heads"], hf.get("num_key_value_heads") or hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or 256
    full_dim, full_kv = _full_geometry(hf, kinds)
    geometry = dict(head_size=head_dim, n_kv_head=kv, global_head_size=full_dim, global_kv_head=full_kv)
    if not sliding:  # every layer full: their geometry is the model's
        geometry = dict(head_size=full_dim, n_kv_head=full_kv, global_head_size=0, global_kv_head=0)
    shared = int(hf.get("num_kv_shared_layers") or 0)
    width = int(hf["intermediate_size"])
    experts = {}
    if hf.get("enable_moe_block"):  # the experts beside each layer's dense MLP (intermediate_size wide)
        experts = dict(moe_experts=int(hf["num_experts"]), moe_top_k=int(hf["top_k_experts"]), moe_norm_topk=True,
                       moe_beside_dense=True, moe_dense_hidden=width, mlp_hidden=int(hf["moe_intermediate_size"]))
    per_layer = int(hf.get("hidden_size_per_layer_input") or 0)
    softcap = hf.get("final_logit_softcapping")
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 131_072),
        n_layer=hf["num_hidden_layers"], n_embd=hf["hidden_size"], n_head=heads, **{"mlp_hidden": width, **experts},
        **geometry,
        global_values_from_keys=bool(hf.get("attention_k_eq_v")), v_norm=True,
        qk_norm=True, fused_qkv=False, sliding_window=window, window_layers=tuple(sliding) if window else (),
        attn_scale=1.0, pos_emb="rope", mlp="geglu", fused_mlp=True, norm="rmsnorm", norm_position="sandwich",
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), embed_scale=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=False, logit_softcap=float(softcap or 0.0),
        kv_shared_layers=shared,
        kv_shared_mlp_hidden=2 * width if shared and hf.get("use_double_wide_mlp") else 0,
        per_layer_embd=per_layer,
        per_layer_vocab=int(hf.get("vocab_size_per_layer_input") or hf["vocab_size"]) if per_layer else 0,
        layer_scalars=True, **_rope_fields(hf, kinds),
    )


# -- export ------------------------------------------------------------------------------------------------------


def wants_gemma4(cfg: ModelConfig) -> bool:
    """Whether a model is Gemma 4's: an option of its own that no other architecture redline writes has."""
    return bool(cfg.v_norm or cfg.layer_scalars or cfg.per_layer_embd or cfg.kv_shared_layers or cfg.moe_beside_dense
                or cfg.global_head_size or cfg.global_kv_head or cfg.global_values_from_keys)


def dense_width(cfg: ModelConfig) -> int:
    """Gemma 4's intermediate_size: the dense MLP's width (beside the experts, moe_dense_hidden)."""
    return cfg.moe_dense_hidden if cfg.moe_beside_dense else cfg.hidden_dim


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a Gemma-4-like model that Gemma 4 does not have."""
    problems = [
        (cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine or cfg.norm_position != "sandwich",
         "Gemma 4's blocks have RMSNorms scaling by their weight on both sides of each sublayer (model.norm=rmsnorm, "
         "norm_position=sandwich, no norm_unit_offset)"),
        (cfg.mlp != "geglu" or cfg.gelu_approximate != "tanh", f"model.mlp={cfg.mlp}: Gemma 4's MLP is tanh GeGLU"),
        (cfg.pos_emb != "rope" or cfg.rope_scaling not in ("none", "proportional") or cfg.rope_dims
         or cfg.nope_interval or cfg.rope_layer_theta,
         f"model.rope_scaling={cfg.rope_scaling}: Gemma 4 rotates whole heads, its full layers by default or "
         f"proportional RoPE"),
        (cfg.sliding_window and not cfg.rope_local_theta, "Gemma 4's sliding layers rotate with a base of their own "
                                                          "(model.rope_local_theta)"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "head" or cfg.qk_norm_after_rope,
         "Gemma 4 normalizes each head's q and k before RoPE (model.qk_norm)"),
        (not cfg.v_norm or not cfg.layer_scalars or not cfg.embed_scale or cfg.attn_scale != 1.0,
         "Gemma 4 norms its values (model.v_norm), scales each layer's output (layer_scalars) and its embeddings "
         "(embed_scale) and leaves its scores unscaled (attn_scale=1)"),
        (cfg.moe_experts and (not cfg.moe_beside_dense or not cfg.moe_norm_topk or cfg.moe_scale != 1.0),
         "Gemma 4's experts run beside the dense MLP (model.moe_beside_dense) with their top-k weights renormalized "
         "(moe_norm_topk) and no moe_scale"),
        (cfg.bias or cfg.has_qkv_bias or cfg.attn_softcap or cfg.attn_sinks or cfg.attn_gate != "none"
         or cfg.logit_divisor or cfg.embed_multiplier or cfg.residual_multiplier
         or cfg.embed_norm or cfg.head_bias or cfg.parallel_residual,
         "Gemma 4 has no biases, score caps, sinks, gates, experts or multipliers"),
        (cfg.kv_shared_mlp_hidden not in (0, 2 * dense_width(cfg)),
         f"model.kv_shared_mlp_hidden={cfg.kv_shared_mlp_hidden}: Gemma 4's shared layers' MLP is twice the others' "
         f"(use_double_wide_mlp) or as wide"),
        (cfg.layer_window(cfg.n_layer - 1) > 0, "a windowed last layer: Gemma 4's last layer attends to the whole "
                                                "context (transformers makes it full)"),
    ]
    raise_first(problems)


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    kinds = [_SLIDING if cfg.layer_window(i) else _FULL for i in range(cfg.n_layer)]
    full = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "proportional":
        full = {"rope_type": "proportional", "partial_rotary_factor": cfg.rope_proportion,
                "rope_theta": cfg.rope_theta, **({"factor": cfg.rope_factor} if cfg.rope_factor != 1 else {})}
    local = {"rope_type": "default", "rope_theta": cfg.rope_local_theta or cfg.rope_theta}
    full_dim, full_kv = cfg.layer_head_dim(kinds.index(_FULL)), cfg.layer_kv_heads(kinds.index(_FULL))
    return {
        "model_type": "gemma4_text", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": dense_width(cfg), "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": cfg.context_len, "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "attention_dropout": 0.0,
        "sliding_window": cfg.sliding_window or cfg.context_len, "layer_types": kinds,
        "final_logit_softcapping": cfg.logit_softcap or None, "use_bidirectional_attention": None,
        "rope_parameters": {_FULL: full, _SLIDING: local},
        "hidden_size_per_layer_input": cfg.per_layer_embd,
        "vocab_size_per_layer_input": cfg.per_layer_vocab or cfg.vocab_size,
        "attention_k_eq_v": cfg.global_values_from_keys, "num_kv_shared_layers": cfg.kv_shared_layers,
        "use_double_wide_mlp": bool(cfg.kv_shared_mlp_hidden), "enable_moe_block": cfg.moe_beside_dense,
        **({"num_experts": cfg.moe_experts, "top_k_experts": cfg.moe_top_k, "moe_intermediate_size": cfg.hidden_dim}
           if cfg.moe_beside_dense else {}),
        # the full layers' geometry as transformers 5 writes it (its __post_init__ reads no global_head_dim then)
        "per_layer_config": {str(i): {"head_dim": full_dim, "num_key_value_heads": full_kv}
                             for i, kind in enumerate(kinds) if kind == _FULL},
        "initializer_range": 0.02, "use_cache": True,
    }


# -- weights -----------------------------------------------------------------------------------------------------

_KV = ("k_proj", "v_proj", "k_norm", "v_norm")  # what a kv-shared layer's attention reads from its source
# redline's experts beside the dense MLP (moe_beside_dense) -> transformers' Gemma4TextDecoderLayer names: the
# stacked experts' [gate; up] rows and output projections as redline stacks them, the router's parts, the norms
_EXPERTS = {"moe.fc": "experts.gate_up_proj", "moe.proj": "experts.down_proj",
            "moe.router.weight": "router.proj.weight", "moe.router_scale": "router.scale",
            "moe.expert_scale": "router.per_expert_scale",
            "moe.input_norm.weight": "pre_feedforward_layernorm_2.weight",
            "dense_out_norm.weight": "post_feedforward_layernorm_1.weight",
            "moe_out_norm.weight": "post_feedforward_layernorm_2.weight"}


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    src = text_view(src)  # Gemma4ForConditionalGeneration's model.language_model. read as model.
    out = {"norm_f.weight": src.take("model.norm.weight"),
           "wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg), **take_head(src, cfg)}
    if cfg.per_layer_embd:
        out["ple_table.weight"] = src.take("model.embed_tokens_per_layer.weight")
        out["ple_proj.weight"] = src.take("model.per_layer_model_projection.weight")
        out["ple_norm.weight"] = src.take("model.per_layer_projection_norm.weight")
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
            if not (cfg.global_values_from_keys and not cfg.layer_window(i)):
                out[r + "attn.v.weight"] = src.take(a + "v_proj.weight")
        else:  # a checkpoint may hold the shared layers' unused projections (transformers ignores them)
            for name in _KV:
                if f"{a}{name}.weight" in src:
                    src.take(f"{a}{name}.weight")
        out[r + "mlp.fc.weight"] = torch.cat([src.take(p + "mlp.gate_proj.weight"), src.take(p + "mlp.up_proj.weight")])
        out[r + "mlp.proj.weight"] = src.take(p + "mlp.down_proj.weight")
        if cfg.per_layer_embd:
            out[r + "ple_gate.weight"] = src.take(p + "per_layer_input_gate.weight")
            out[r + "ple_proj.weight"] = src.take(p + "per_layer_projection.weight")
            out[r + "ple_norm.weight"] = src.take(p + "post_per_layer_input_norm.weight")
        if cfg.moe_beside_dense:
            out.update({r + ours: src.take(p + theirs) for ours, theirs in _EXPERTS.items()})
        out[r + "layer_scalar"] = src.take(p + "layer_scalar").reshape(1)
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.norm.weight": state["norm_f.weight"],
           "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size], **give_head(state, cfg)}
    if cfg.per_layer_embd:
        out["model.embed_tokens_per_layer.weight"] = state["ple_table.weight"]
        out["model.per_layer_model_projection.weight"] = state["ple_proj.weight"]
        out["model.per_layer_projection_norm.weight"] = state["ple_norm.weight"]
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
            if r + "attn.v.weight" in state:
                out[a + "v_proj.weight"] = state[r + "attn.v.weight"]
        gate, up = state[r + "mlp.fc.weight"].chunk(2)
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate, up
        out[p + "mlp.down_proj.weight"] = state[r + "mlp.proj.weight"]
        if cfg.per_layer_embd:
            out[p + "per_layer_input_gate.weight"] = state[r + "ple_gate.weight"]
            out[p + "per_layer_projection.weight"] = state[r + "ple_proj.weight"]
            out[p + "post_per_layer_input_norm.weight"] = state[r + "ple_norm.weight"]
        if cfg.moe_beside_dense:
            out.update({p + theirs: state[r + ours] for ours, theirs in _EXPERTS.items()})
        out[p + "layer_scalar"] = state[r + "layer_scalar"]
    return {k: v.contiguous() for k, v in out.items()}


def ignorable(name: str) -> bool:
    """The multimodal folders' vision and audio towers and their embedders, which the text model does not run."""
    return name.startswith(_TOWERS)


FAMILY = Family(name="gemma4_text", architecture="Gemma4ForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=ignorable)
# Gemma 4 Unified's text model (Gemma4UnifiedForCausalLM, model_type "gemma4_unified_text"): Gemma 4's text model
# without per-layer inputs or experts (its config has neither field), the same names and layers (transformers'
# models/gemma4_unified/modular_gemma4_unified.py); its class's own defaults filled in where a config leaves them out.
# It exports as Gemma 4's text model, the same model.
_UNIFIED_DEFAULTS = {"sliding_window": 1024, "max_position_embeddings": 262_144}


def unified_model_config(hf: dict) -> ModelConfig:
    """Gemma4UnifiedTextConfig's fields, its defaults where the config (or a multimodal config's text_config) leaves
    them out."""
    if "text_config" in hf:
        return model_config({**hf, "text_config": {**_UNIFIED_DEFAULTS, **hf["text_config"]}})
    return model_config({**_UNIFIED_DEFAULTS, **hf})


def unified_ignorable(name: str) -> bool:
    """The multimodal folder's patch embedder (Gemma 4 Unified has no vision or audio tower: its embedders project
    raw patches and audio frames), which the text model does not run."""
    return ignorable(name) or name.startswith(("model.vision_embedder.", "vision_embedder.", "embed_vision.",
                                               "embed_audio."))


UNIFIED_TEXT_FAMILY = Family(name="gemma4_unified_text", architecture="Gemma4ForCausalLM",
                             model_config=unified_model_config, hf_config=hf_config, to_redline=to_redline,
                             to_hf=to_hf, ignorable=ignorable)
# Gemma4UnifiedForConditionalGeneration's folders (model_type "gemma4_unified"): the text model under
# model.language_model.* is read as Gemma 4's multimodal folders' is, the embedders left out
UNIFIED_FAMILY = Family(name="gemma4_unified", architecture="Gemma4ForCausalLM", model_config=unified_model_config,
                        hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=unified_ignorable)
# Gemma4ForConditionalGeneration's folders: the text model is read; exports are the text model (FAMILY's)
MULTIMODAL_FAMILY = Family(name="gemma4", architecture="Gemma4ForCausalLM", model_config=model_config,
                           hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=ignorable)
