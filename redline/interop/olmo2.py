"""OLMo 2 (AI2's Olmo2ForCausalLM): the Llama layout with its norms moved and QK-norm over whole projections; the
original OLMo and OLMo 3 below.

Each block is h = x + norm(attn(x)), out = h + norm(mlp(h)): the norms (post_attention_layernorm,
post_feedforward_layernorm) sit on the sublayers' outputs, before the residual add, and nothing normalizes their
inputs (redline's norm_position "output"); a final norm follows the last block. QK-norm is an RMSNorm over the whole
q projection (num_heads · head_dim weights) and the whole k projection (num_kv_heads · head_dim) before the split
into heads (redline's qk_norm_scope "all"). The rest is Llama's: SwiGLU, RoPE on (first half, second half) pairs,
grouped-query attention, an untied head by default. Tensor names are Llama's (llama.py's maps, NORM_NAMES["output"]
for the norms). Semantics read from transformers' models/olmo2/modeling_olmo2.py.
"""

from __future__ import annotations

from dataclasses import replace

from redline.errors import UserError
from redline.interop.families import Family, raise_first
from redline.interop.llama import (_ignorable, _rope, check_silu, hf_config_for, shape_fields, to_hf,
                                   to_redline)
from redline.model import ModelConfig


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    if hf.get("attention_bias"):  # q/k/v/o biases with none in the MLP: redline's `bias` covers o_proj and the MLP
        raise UserError("attention_bias=true: OLMo 2 then has a bias on o_proj but none in its MLP, a mix redline "
                        "does not have (biases on q/k/v alone, or on every Linear layer)")
    return ModelConfig(
        **shape_fields(hf), qk_norm=True, qk_norm_scope="all", fused_qkv=True, pos_emb="rope", mlp="swiglu",
        fused_mlp=True, norm="rmsnorm", norm_position="output",
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=False, **_rope(hf),
    )


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of an output-norm model (norm_position "output") that OLMo 2 does not have."""
    problems = [
        (cfg.norm != "rmsnorm", "model.norm=layernorm with norm_position=output: OLMo 2 uses RMSNorm"),
        (cfg.mlp != "swiglu", f"model.mlp={cfg.mlp} with norm_position=output: OLMo 2's MLP is SwiGLU"),
        (cfg.pos_emb != "rope", f"model.pos_emb={cfg.pos_emb} with norm_position=output: OLMo 2 uses RoPE"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "all", "norm_position=output without model.qk_norm=true and "
                                                         "model.qk_norm_scope=all: OLMo 2 normalizes its whole q and "
                                                         "k projections"),
        (cfg.nope_interval, "model.nope_interval with norm_position=output and QK-norm over whole projections: "
                            "OLMo 2 and 3 rotate every layer"),
        (cfg.sliding_window_pattern and not cfg.sliding_window, "model.sliding_window_pattern without a window"),
        (cfg.rope_local_theta and not cfg.sliding_window, "model.rope_local_theta without windowed layers: OLMo 3 "
                                                          "gives its windowed layers a RoPE of their own"),
        (cfg.bias, "model.bias=true with norm_position=output: OLMo 2 has no MLP biases"),
    ]
    raise_first(problems)


def _hf_config(cfg: ModelConfig) -> dict:
    out = hf_config_for("olmo2")(cfg)
    out["attention_bias"] = cfg.has_qkv_bias  # redline's q/k/v-only biases get a zero o_proj bias (llama.to_hf)
    return out


FAMILY = Family(name="olmo2", architecture="Olmo2ForCausalLM", model_config=model_config, hf_config=_hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# OLMo 3 (Olmo3ForCausalLM, model_type "olmo3": OLMo-3-7B, OLMo-3-32B): OLMo 2's block with sliding-window layers,
# three in every four by default (`layer_types`: redline's sliding_window_pattern), each kind of layer with RoPE
# parameters of its own (`rope_parameters` keyed by layer type, as Gemma 3's: the full layers' base and scaling as
# rope_theta / rope_scaling, the windowed layers' unscaled base as rope_local_theta where it differs). Semantics read
# from transformers' models/olmo3/modeling_olmo3.py.


def olmo3_model_config(hf: dict) -> ModelConfig:
    from redline.interop.gemma3 import _pattern, _rope_fields

    window = int(hf.get("sliding_window") or 0)
    pattern = _pattern({"sliding_window_pattern": 4, **hf}) if window else 0
    if not window and any(kind == "sliding_attention" for kind in hf.get("layer_types") or []):
        raise UserError("layer_types names sliding-window layers, but sliding_window is not set")
    cfg = replace(model_config({**hf, "rope_parameters": None}), **_rope_fields(hf, bool(window)),
                  sliding_window=window, sliding_window_pattern=pattern)
    if cfg.rope_scaling == "none" and cfg.rope_local_theta == cfg.rope_theta:
        cfg = replace(cfg, rope_local_theta=0.0)  # one RoPE for every layer
    return cfg


def _olmo3_hf_config(cfg: ModelConfig) -> dict:
    out = _hf_config(cfg)
    scaling = out.pop("rope_scaling") or {}
    full = {"rope_type": "default", "rope_theta": out.pop("rope_theta"), **scaling}
    local = {"rope_type": "default", "rope_theta": cfg.rope_local_theta or cfg.rope_theta}
    kinds = ["sliding_attention" if cfg.layer_window(i) else "full_attention" for i in range(cfg.n_layer)]
    return {**out, "model_type": "olmo3", "sliding_window": cfg.sliding_window, "layer_types": kinds,
            "rope_parameters": {"full_attention": full, "sliding_attention": local}}


OLMO3_FAMILY = Family(name="olmo3", architecture="Olmo3ForCausalLM", model_config=olmo3_model_config,
                      hf_config=_olmo3_hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# OLMo (OlmoForCausalLM, model_type "olmo": OLMo-1B-hf, OLMo-7B-hf, OLMo-1B-0724-hf, OLMo-7B-0424-hf): Llama's block
# and names with LayerNorms that have neither weight nor bias (redline's norm_affine=false; eps fixed at 1e-5), so no
# norm tensors at all. Semantics read from transformers' models/olmo/modular_olmo.py.

OLMO_EPS = 1e-5  # OlmoLayerNorm's, fixed in its code (no config key)


def olmo_model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    if hf.get("clip_qkv") is not None:
        raise UserError(f"clip_qkv={hf['clip_qkv']}: redline does not clamp the q/k/v projections (OLMo-7B-0424's "
                        f"option); this model is not supported")
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: OLMo then has a bias on o_proj but none in its MLP, a mix redline "
                        "does not have (biases on q/k/v alone, or on every Linear layer)")
    return ModelConfig(
        **shape_fields(hf), fused_qkv=True, pos_emb="rope", mlp="swiglu", fused_mlp=True, norm="layernorm",
        norm_affine=False, norm_eps=OLMO_EPS, tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=False, **_rope(hf))


def check_olmo_exportable(cfg: ModelConfig) -> None:
    """The options of a model with weightless LayerNorms (chosen by norm_affine=false) that OLMo has not."""
    what = "OLMo, the one architecture with weightless LayerNorms redline exports to,"
    raise_first([
        (cfg.norm_position != "pre" or cfg.parallel_residual, f"{what} has pre-norm blocks of sequential sublayers"),
        (cfg.norm_eps != OLMO_EPS, f"model.norm_eps={cfg.norm_eps}: {what} normalizes with eps {OLMO_EPS}"),
        (cfg.mlp != "swiglu", f"model.mlp={cfg.mlp}: {what} has a SwiGLU MLP"),
        (cfg.qk_norm, f"{what} has no QK-norm (model.qk_norm)"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_local_theta,
         f"{what} rotates every layer's whole heads with one RoPE"),
        (cfg.sliding_window > 0, f"{what} attends to the whole context (model.sliding_window)"),
        (cfg.bias or cfg.has_qkv_bias or cfg.head_bias, f"{what} has no biases (model.bias, qkv_bias, head_bias)"),
        (cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap,
         f"{what} scales its scores by 1/sqrt(head_dim) and caps nothing"),
        (cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor,
         f"{what} has no embedding, residual or logit scalars"),
        (cfg.value_embeddings or cfg.moe_experts or cfg.conv_layers,
         f"{what} has attention and one dense MLP in every layer (model.value_embeddings, moe_experts, conv_layers)"),
    ])


def _olmo_hf_config(cfg: ModelConfig) -> dict:
    out = hf_config_for("olmo")(cfg)
    out.pop("rms_norm_eps")  # OlmoLayerNorm's eps is fixed
    return {**out, "attention_bias": False, "clip_qkv": None, "pad_token_id": None, "bos_token_id": None,
            "eos_token_id": None}  # the writer sets the token ids


OLMO_FAMILY = Family(name="olmo", architecture="OlmoForCausalLM", model_config=olmo_model_config,
                     hf_config=_olmo_hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
