"""Falcon-H1 (TII's FalconH1ForCausalLM, model_type "falcon_h1": tiiuae/Falcon-H1-0.5B, -1.5B, -3B, -7B, -34B and
their instruct models). Semantics read from transformers' models/falcon_h1/modular_falcon_h1.py.

Every layer runs attention and a Mamba-2 mixer side by side on the same normed input, their outputs summed into
the residual stream, then a SwiGLU MLP:
    h = input_layernorm(x); x = x + attn(h · attention_in_multiplier) · attention_out_multiplier
                                  + mamba(h) · ssm_out_multiplier;  x = x + feed_forward(pre_ff_layernorm(x))
(model.delta_parallel with every layer in model.delta_layers). The attention is Llama's with GQA and RoPE (k times
key_multiplier); the mixer is Bamba's / Granite 4.0's (granite.py's mixer map serves it) with its own inner width
mamba_d_ssm = mamba_n_heads · mamba_d_head, its input times ssm_in_multiplier and in_proj's z, x, B, C and dt
output sections times ssm_multipliers (its "mup_vector"), its output gated by SiLU(z) with no norm
(mamba_rms_norm=False) or a gated group RMSNorm before or after the gate (mamba_norm_before_gate:
model.delta_gate_norm); the MLP's gate times mlp_multipliers[0] and its output times mlp_multipliers[1].

Every µP multiplier inside a layer scales an input or an output of a Linear layer, so it is folded into the
weights on import (an input's scale into the weight; an output section's into those rows and their bias) and
written as 1.0 on export. embedding_multiplier and lm_head_multiplier are folded into the embedding and the head
when they are apart, else kept as model.embed_multiplier and model.logit_divisor (1 / lm_head_multiplier).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, raise_first
from redline.interop.granite import (_mixer_to_hf, _mixer_to_redline, bamba_ffn_to_hf, bamba_ffn_to_redline,
                                     bamba_outside_to_hf, bamba_outside_to_redline)
from redline.interop.llama import _ignorable, model_config_for, rope_scaling
from redline.model import ModelConfig

# FalconH1Config's defaults for what a config.json may leave out
_DEFAULTS = {"rms_norm_eps": 1e-5, "mamba_d_ssm": 1024, "mamba_n_heads": 128, "mamba_d_head": "auto",
             "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_conv_bias": True,
             "mamba_proj_bias": False, "mamba_norm_before_gate": True, "mamba_rms_norm": False,
             "projectors_bias": False, "tie_word_embeddings": False}
_SCALARS = ("embedding_multiplier", "lm_head_multiplier", "key_multiplier", "attention_in_multiplier",
            "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier")


def _float(x) -> float:
    """A JSON number, or transformers' {"__float__": "Infinity"}."""
    return float(x["__float__"]) if isinstance(x, dict) and "__float__" in x else float(x)


def _multipliers(hf: dict) -> dict:
    """The config's µP multipliers, 1.0 where it gives none: the scalars, ssm (5: z, x, B, C, dt) and mlp (gate,
    down)."""
    out = {k: 1.0 if hf.get(k) is None else float(hf[k]) for k in _SCALARS}
    out["ssm"] = [float(m) for m in hf.get("ssm_multipliers") or [1.0] * 5]
    out["mlp"] = [float(m) for m in hf.get("mlp_multipliers") or [1.0, 1.0]]
    if len(out["ssm"]) != 5 or len(out["mlp"]) != 2:
        raise UserError(f"ssm_multipliers={out['ssm']} / mlp_multipliers={out['mlp']}: Falcon-H1 takes 5 (z, x, B, C, "
                        f"dt) and 2 (gate, down)")
    if out["embedding_multiplier"] == 0 or out["lm_head_multiplier"] == 0:
        raise UserError("embedding_multiplier / lm_head_multiplier = 0: the model would output constant logits")
    return out


def model_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **hf}
    if hf["mamba_proj_bias"] != hf["projectors_bias"]:
        raise UserError(f"mamba_proj_bias={hf['mamba_proj_bias']} with projectors_bias={hf['projectors_bias']}: "
                        f"redline's Mamba-2 mixer has biases on both in_proj and out_proj or on neither")
    width = hf["mamba_d_ssm"] or int(hf["mamba_expand"]) * hf["hidden_size"]
    heads, groups = int(hf["mamba_n_heads"]), int(hf["mamba_n_groups"])
    head = width // heads if hf["mamba_d_head"] in (None, "auto") else int(hf["mamba_d_head"])
    if head * heads != width or heads % groups:
        raise UserError(f"mamba_n_heads={heads} x mamba_d_head={head} != mamba_d_ssm={width}, or mamba_n_groups="
                        f"{groups} does not divide the heads: not a Mamba-2 mixer redline can build")
    limit = [_float(x) for x in hf.get("time_step_limit") or (0.0, float("inf"))]
    if len(limit) != 2 or limit[1] != float("inf") or limit[0] < 0:
        raise UserError(f"time_step_limit={limit}: redline floors Mamba-2's time step (model.delta_dt_min) and caps "
                        f"it nowhere; it takes (min >= 0, inf)")
    gate_norm = "none" if not hf["mamba_rms_norm"] else "before_gate" if hf["mamba_norm_before_gate"] else "after_gate"
    m = _multipliers(hf)
    tied = bool(hf["tie_word_embeddings"])
    n = hf["num_hidden_layers"]
    cfg = model_config_for("llama")(hf)  # Llama's attention, MLP, RoPE and biases (attention_bias == mlp_bias)
    return replace(cfg, norm_eps=float(hf["rms_norm_eps"]), delta_layers=tuple(range(n)), delta_rule="mamba2",
                   delta_parallel=True, delta_heads=heads, delta_key_heads=groups,
                   delta_key_dim=int(hf["mamba_d_state"]), delta_value_dim=head,
                   delta_conv_kernel=int(hf["mamba_d_conv"]), delta_conv_bias=bool(hf["mamba_conv_bias"]),
                   delta_proj_bias=bool(hf["mamba_proj_bias"]), delta_dt_min=limit[0], delta_gate_norm=gate_norm,
                   # apart, the embedding and head multipliers are folded into them (fold)
                   embed_multiplier=m["embedding_multiplier"] if tied and m["embedding_multiplier"] != 1 else 0.0,
                   logit_divisor=1 / m["lm_head_multiplier"] if tied and m["lm_head_multiplier"] != 1 else 0.0)


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    """Bamba's layout (granite.py's maps), each layer with both mixers: attention as blocks.i.attn, the Mamba-2
    mixer as blocks.i.mamba."""
    out = bamba_outside_to_redline(src, cfg)
    for i in range(cfg.n_layer):
        out.update(bamba_ffn_to_redline(src, cfg, i), **_mixer_to_redline(src, cfg, i, recurrent=False),
                   **_mixer_to_redline(src, cfg, i, recurrent=True, module="mamba"))
    return out


def _scale(state: dict, name: str, factor: float, rows: slice = slice(None), bias: bool = True) -> None:
    """state[name + ".weight"][rows] (and the bias's rows, where bias and the layer has one) times factor."""
    if factor == 1.0:
        return
    for part in ("weight", "bias") if bias else ("weight",):
        key = f"{name}.{part}"
        if key in state:
            t = state[key].clone()
            t[rows] = t[rows] * factor
            state[key] = t


def fold(hf: dict, cfg: ModelConfig, state: dict) -> dict:
    """The µP multipliers folded into the imported weights: what each scales is the input or an output section of a
    Linear layer, y = W(x·a) + b = (aW)x + b, y·m = (mW)x + mb (exact up to one rounding of each weight)."""
    m, state = _multipliers({**_DEFAULTS, **hf}), dict(state)
    q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    inner, heads = cfg.delta_heads * cfg.delta_value_dim, cfg.delta_heads
    groups = cfg.delta_key_heads * cfg.delta_key_dim
    # in_proj's output sections: z (inner), x (inner), B (groups), C (groups), dt (heads)
    bounds = [0, inner, 2 * inner, 2 * inner + groups, 2 * inner + 2 * groups, 2 * inner + 2 * groups + heads]
    for i in range(cfg.n_layer):
        a, s, mlp = f"blocks.{i}.attn.", f"blocks.{i}.mamba.", f"blocks.{i}.mlp."
        _scale(state, a + "qkv", m["attention_in_multiplier"], bias=False)  # the input of q, k and v
        _scale(state, a + "qkv", m["key_multiplier"], slice(q, q + kv))  # k's rows (RoPE is linear: before or after)
        _scale(state, a + "proj", m["attention_out_multiplier"])
        _scale(state, s + "in_proj", m["ssm_in_multiplier"], bias=False)
        for k, factor in enumerate(m["ssm"]):
            _scale(state, s + "in_proj", factor, slice(bounds[k], bounds[k + 1]))
        _scale(state, s + "proj", m["ssm_out_multiplier"])
        _scale(state, mlp + "fc", m["mlp"][0], slice(0, cfg.hidden_dim))  # the gate's rows of [gate; up]
        _scale(state, mlp + "proj", m["mlp"][1])
    if not cfg.tie_embeddings:  # tied: model.embed_multiplier and logit_divisor (model_config)
        _scale(state, "wte", m["embedding_multiplier"], bias=False)
        _scale(state, "lm_head", m["lm_head_multiplier"], bias=False)
    return state


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = bamba_outside_to_hf(state, cfg)
    for i in range(cfg.n_layer):
        out.update(bamba_ffn_to_hf(state, cfg, i), **_mixer_to_hf(state, cfg, i, recurrent=False),
                   **_mixer_to_hf(state, cfg, i, recurrent=True, module="mamba"))
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(cfg: ModelConfig) -> dict:
    """FalconH1Config's entries, every µP multiplier inside a layer 1.0 (the weights carry them)."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(rope_scaling(cfg, "Falcon-H1") or {})}
    return {
        "model_type": "falcon_h1", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.context_len, "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": cfg.bias, "mlp_bias": cfg.bias,
        "projectors_bias": cfg.delta_proj_bias, "rope_parameters": rope, "attention_dropout": 0.0,
        "initializer_range": 0.02, "use_cache": True,
        "mamba_d_ssm": cfg.delta_heads * cfg.delta_value_dim, "mamba_n_heads": cfg.delta_heads,
        "mamba_d_head": cfg.delta_value_dim, "mamba_n_groups": cfg.delta_key_heads,
        "mamba_d_state": cfg.delta_key_dim, "mamba_d_conv": cfg.delta_conv_kernel,
        "mamba_conv_bias": cfg.delta_conv_bias, "mamba_proj_bias": cfg.delta_proj_bias,
        "mamba_rms_norm": cfg.delta_gate_norm != "none", "mamba_norm_before_gate": cfg.delta_gate_norm != "after_gate",
        "time_step_limit": [cfg.delta_dt_min, float("inf")],
        "embedding_multiplier": cfg.embed_multiplier or 1.0,
        "lm_head_multiplier": 1 / cfg.logit_divisor if cfg.logit_divisor else 1.0,
        **{name: 1.0 for name in _SCALARS if name not in ("embedding_multiplier", "lm_head_multiplier")},
        "ssm_multipliers": [1.0] * 5, "mlp_multipliers": [1.0, 1.0],
    }


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with Mamba-2 beside attention (model.delta_parallel) that Falcon-H1,
    the one architecture with such layers redline exports to, does not have."""
    what = "model.delta_parallel: Falcon-H1, the one architecture with Mamba-2 beside attention redline exports to,"
    raise_first([
        (cfg.delta_layers != tuple(range(cfg.n_layer)), f"{what} has both on every layer (model.delta_layers="
                                                        f"{cfg.delta_layers} of {cfg.n_layer})"),
        (cfg.norm != "rmsnorm" or cfg.mlp != "swiglu" or not cfg.norm_affine or cfg.norm_unit_offset,
         f"{what} has RMSNorms with weights and SwiGLU MLPs (model.norm={cfg.norm}, model.mlp={cfg.mlp})"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_layer_theta or cfg.rope_local_theta,
         f"{what} rotates whole heads of every layer with one RoPE"),
        (cfg.qk_norm or cfg.attn_gate != "none" or cfg.attn_sinks or cfg.attn_softcap or cfg.attn_scale
         or cfg.sliding_window, f"{what} has Llama's attention: no QK-norm, gates, sinks, caps, score scale or window"),
        (cfg.moe_experts or cfg.conv_layers or cfg.value_embeddings or cfg.embed_norm or cfg.embed_scale,
         f"{what} has dense MLPs and no short convolutions, value embeddings or embedding norm or scale"),
        (cfg.residual_multiplier or cfg.logit_softcap or cfg.head_bias,
         f"{what} has no residual multiplier, logit cap or head bias"),
        (cfg.has_qkv_bias != cfg.bias, f"{what} has biases on every attention and MLP Linear layer or none "
                                       f"(model.qkv_bias)"),
        (cfg.delta_norm_eps not in (0.0, cfg.norm_eps), f"{what} norms the mixer's output with the blocks' epsilon "
                                                         f"(model.delta_norm_eps={cfg.delta_norm_eps})"),
    ])
    rope_scaling(cfg, "Falcon-H1")  # linear, llama3 and yarn, as Llama's rotary embedding reads them


FAMILY = Family(name="falcon_h1", architecture="FalconH1ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable, fold=fold)
