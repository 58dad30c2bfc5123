"""Gemma 3, text only (Google's Gemma3ForCausalLM with a Gemma3TextConfig, model_type "gemma3_text": gemma-3-270m,
gemma-3-1b): the Llama layout's tensor names with Gemma's block.

What differs from Llama, each a ModelConfig field (semantics read from transformers'
models/gemma3/modeling_gemma3.py and configuration_gemma3.py):
- sandwich norms: input_layernorm and pre_feedforward_layernorm on the sublayers' inputs, post_attention_layernorm
  and post_feedforward_layernorm on their outputs before the residual add (norm_position "sandwich");
- every RMSNorm (QK-norm and the final one included) scales by (1 + weight) in fp32 (norm_unit_offset);
- GeGLU MLP with tanh-GELU (mlp "geglu"); token embeddings times sqrt(hidden_size) in their dtype (embed_scale);
- attention scores scaled by query_pre_attn_scalar ** -0.5 (attn_scale), QK-norm per head;
- `layer_types`: sliding-window layers interleaved with full ones, by default five to one (sliding_window_pattern:
  redline expresses the layer i is full iff (i + 1) % pattern == 0 form, which transformers' default and the published
  models follow); the windowed layers rotate with their own unscaled base, rope_local_base_freq (rope_local_theta),
  the full ones with rope_theta and its scaling;
- final_logit_softcapping -> logit_softcap (Gemma 3 ships None). attn_logit_softcapping is refused: transformers'
  Gemma 3 applies it in its eager attention only (its SDPA path leaves it out), so such a file names no one model
  (Gemma 2, gemma2.py, caps its scores always: transformers runs it eagerly).
"""

from __future__ import annotations

from redline.errors import UserError
from redline.interop.families import Family, raise_first
from redline.interop.llama import _ignorable, _rope, shape_fields, to_hf, to_redline
from redline.model import ModelConfig

_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new")
_FULL, _SLIDING = "full_attention", "sliding_attention"


def _pattern(hf: dict) -> int:
    """sliding_window_pattern for the config's layer_types (transformers' default where it gives none: every
    sliding_window_pattern-th layer full, 6 unless given); a UserError for an order redline cannot express."""
    n = hf["num_hidden_layers"]
    every = int(hf.get("sliding_window_pattern") or 6)
    kinds = list(hf.get("layer_types") or [_FULL if (i + 1) % every == 0 else _SLIDING for i in range(n)])
    if len(kinds) != n or not set(kinds) <= {_FULL, _SLIDING}:
        raise UserError(f"layer_types must name {_SLIDING!r} or {_FULL!r} for each of the {n} layers, got {kinds}")
    if _FULL not in kinds:
        return 0  # every layer windowed
    pattern = kinds.index(_FULL) + 1
    if kinds != [_FULL if (i + 1) % pattern == 0 else _SLIDING for i in range(n)]:
        raise UserError(f"layer_types {kinds} is not a repeating pattern of sliding layers each group ended by a "
                        f"full one; redline expresses only that order (model.sliding_window_pattern)")
    return pattern


def _rope_fields(hf: dict, windowed: bool) -> dict:
    """rope_theta and its scaling from the full layers' RoPE, rope_local_theta from the sliding ones' (transformers 5
    nests both under rope_parameters; earlier configs give rope_theta + rope_scaling and rope_local_base_freq)."""
    params = hf.get("rope_parameters") or {}
    if _FULL in params or _SLIDING in params:
        full, local = dict(params.get(_FULL) or {}), dict(params.get(_SLIDING) or {})
    else:
        full = {"rope_theta": hf.get("rope_theta", 1_000_000.0), **dict(hf.get("rope_scaling") or {})}
        local = {"rope_theta": hf.get("rope_local_base_freq", 10_000.0)}
    full.setdefault("rope_theta", 1_000_000.0)
    out = _rope({"rope_parameters": full, "max_position_embeddings": hf.get("max_position_embeddings")})
    kind = local.get("rope_type", local.get("type", "default"))
    if kind != "default":
        raise UserError(f"the sliding-window layers' RoPE scaling {kind!r} is not supported; redline rotates them "
                        f"with an unscaled base of their own (rope_local_base_freq)")
    if windowed:
        out["rope_local_theta"] = float(local.get("rope_theta", 10_000.0))
    return out


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in _TANH_GELU:
        raise UserError(f"hidden_activation={act!r}: redline's GeGLU uses the tanh-approximated GELU "
                        f"({', '.join(_TANH_GELU)})")
    refused = [("attn_logit_softcapping", hf.get("attn_logit_softcapping") is not None,
                "transformers' Gemma 3 caps the scores in its eager attention and not in SDPA, so the file names no "
                "one model; redline caps Gemma 2's (model_type gemma2)"),
               ("use_bidirectional_attention", bool(hf.get("use_bidirectional_attention")),
                "redline's attention is causal"),
               ("attention_bias", bool(hf.get("attention_bias")),
                "a bias on o_proj without MLP biases is a mix redline does not have")]
    raise_first([(bad, f"{name}={hf.get(name)}: {why}") for name, bad, why in refused])
    pattern, window = _pattern(hf), int(hf.get("sliding_window") or 0)
    if pattern == 1 or not window:  # no layer windowed: every one attends to the whole context
        pattern, window = 0, 0
    softcap = hf.get("final_logit_softcapping")
    return ModelConfig(
        **shape_fields(hf, context_len=131_072), qk_norm=True, fused_qkv=True, sliding_window=window,
        sliding_window_pattern=pattern, attn_scale=float(hf.get("query_pre_attn_scalar", 256)) ** -0.5,
        pos_emb="rope", mlp="geglu", fused_mlp=True, norm="rmsnorm", norm_position="sandwich",
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), norm_unit_offset=True, embed_scale=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=False,
        logit_softcap=float(softcap or 0.0), **_rope_fields(hf, windowed=window > 0),
    )


def query_pre_attn_scalar(cfg: ModelConfig) -> int:
    """Gemma 3's query_pre_attn_scalar (an integer in transformers' config) for the model's attention scale."""
    if not cfg.attn_scale:
        return cfg.head_dim
    value = cfg.attn_scale ** -2
    if abs(value - round(value)) > 1e-6 * value:
        raise UserError(f"model.attn_scale={cfg.attn_scale}: Gemma 3 scales attention by query_pre_attn_scalar ** "
                        f"-0.5 with an integer query_pre_attn_scalar, and {value:g} is none")
    return int(round(value))


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a sandwich-norm model that Gemma 3 does not have."""
    problems = [
        (cfg.norm != "rmsnorm" or not cfg.norm_unit_offset, "norm_position=sandwich without model.norm=rmsnorm and "
                                                            "model.norm_unit_offset=true: Gemma 3's norms scale by "
                                                            "1 + weight"),
        (cfg.mlp != "geglu", f"model.mlp={cfg.mlp} with norm_position=sandwich: Gemma 3's MLP is GeGLU"),
        (cfg.pos_emb != "rope", f"model.pos_emb={cfg.pos_emb} with norm_position=sandwich: Gemma 3 uses RoPE"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "head", "norm_position=sandwich without model.qk_norm=true per "
                                                         "head: Gemma 3 normalizes each head's q and k"),
        (not cfg.embed_scale, "norm_position=sandwich without model.embed_scale=true: Gemma 3 scales its embeddings "
                              "by sqrt(n_embd)"),
        (cfg.bias or cfg.has_qkv_bias, "model.bias / model.qkv_bias with norm_position=sandwich: Gemma 3 has no "
                                       "biases redline can write"),
        (cfg.attn_softcap, f"model.attn_softcap={cfg.attn_softcap} with model.qk_norm: Gemma 2, the architecture with "
                           f"capped attention scores redline exports to, has no QK-norm"),
    ]
    raise_first(problems)
    query_pre_attn_scalar(cfg)


def _rope_spec(cfg: ModelConfig) -> dict:
    """The full layers' rope_parameters entry."""
    spec = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "linear":
        spec.update(rope_type="linear", factor=cfg.rope_factor)
    elif cfg.rope_scaling != "none":
        raise UserError(f"model.rope_scaling={cfg.rope_scaling} with norm_position=sandwich: redline writes Gemma 3 "
                        f"with linear RoPE scaling or none (the scaling its published models use)")
    return spec


def hf_config(cfg: ModelConfig) -> dict:
    full = _rope_spec(cfg)
    local = {"rope_type": "default", "rope_theta": cfg.rope_local_theta} if cfg.rope_local_theta else dict(full)
    kinds = ["sliding_attention" if cfg.layer_window(i) else "full_attention" for i in range(cfg.n_layer)]
    return {
        "model_type": "gemma3_text", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": cfg.context_len, "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "attention_dropout": 0.0,
        # without windowed layers, still a window (the context) for transformers, which builds the sliding mask
        # whatever layer_types say (and uses none of it when every layer is full)
        "query_pre_attn_scalar": query_pre_attn_scalar(cfg), "sliding_window": cfg.sliding_window or cfg.context_len,
        "layer_types": kinds, "final_logit_softcapping": cfg.logit_softcap or None,
        "attn_logit_softcapping": None, "use_bidirectional_attention": False,
        "rope_parameters": {"full_attention": full, "sliding_attention": local},
        "initializer_range": 0.02, "use_cache": True,
    }


FAMILY = Family(name="gemma3_text", architecture="Gemma3ForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
