"""OLMo Hybrid (AI2's OlmoHybridForCausalLM, model_type "olmo_hybrid": OLMo-Hybrid-7B): gated delta nets on most
layers and OLMo 3's attention on the others, three to one by default (layer_types "linear_attention" /
"full_attention", else every fourth layer full).

- full_attention layers are OLMo 3's blocks: norms on the sublayers' outputs (post_attention_layernorm,
  post_feedforward_layernorm: norm_position "output"), QK-norm over the whole q and k projections (qk_norm_scope
  "all"), RoPE where rope_parameters give a theta, else none at all (the released checkpoints: pos_emb "none");
- linear_attention layers are pre-norm blocks (input_layernorm, post_attention_layernorm on the MLP's input:
  delta_norm_position "pre"; the files name them attention_layer_norm and feedforward_layer_norm) around a gated
  delta net with its projections apart (linear_attn.q_proj, k_proj and v_proj, stacked as redline's in_proj; g_proj
  the output gate, redline's z; a_proj, b_proj), a causal depthwise convolution without bias (q_conv1d, k_conv1d and
  v_conv1d in the files, stacked as transformers' conv1d), β = sigmoid(b·x) times 2 where linear_allow_neg_eigval
  (delta_beta_scale), and the gated output norm o_norm with its own epsilon 1e-5 (delta_norm_eps);
- SwiGLU MLPs, RMSNorms by their weight, no biases.
Semantics read from transformers' models/olmo_hybrid/modular_olmo_hybrid.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import _ignorable, _rope, check_silu, shape_fields
from redline.model import ModelConfig

O_NORM_EPS = 1e-5  # OlmoHybridGatedDeltaNet's o_norm, fixed in transformers' code
# redline's Linear layers of a delta net (after blocks.N.attn.) -> linear_attn.* (in_proj: q_proj, k_proj, v_proj)
_DELTA = {"z": "g_proj", "b": "b_proj", "a": "a_proj", "proj": "o_proj"}
# the delta-net blocks' norms as the files name them -> redline's. transformers renames attention_layer_norm to
# input_layernorm and feedforward_layer_norm to post_attention_layernorm on loading, and back on saving, so that the
# attention blocks' post_attention_layernorm is written as feedforward_layer_norm too: either name is read.
_DELTA_NORMS = {"attention_layer_norm": "norm1", "feedforward_layer_norm": "norm2"}
_LOADED_NAMES = {"attention_layer_norm": "input_layernorm", "feedforward_layer_norm": "post_attention_layernorm",
                 "post_attention_layernorm": "feedforward_layer_norm"}


def _take_norm(src: TensorSource, p: str, name: str) -> torch.Tensor:
    """Block p's norm `name`, or the same norm under the name transformers' renaming gives it."""
    return src.take(f"{p}{name if f'{p}{name}.weight' in src else _LOADED_NAMES[name]}.weight")


def _kinds(hf: dict) -> list[bool]:
    """Each layer: True for a delta net (transformers' default: every fourth layer attention, the last at least)."""
    n = hf["num_hidden_layers"]
    kinds = hf.get("layer_types") or ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
    if len(kinds) != n or not set(kinds) <= {"linear_attention", "full_attention"}:
        raise UserError(f"layer_types {kinds}: OLMo Hybrid takes {n} entries, each linear_attention or full_attention")
    return [kind == "linear_attention" for kind in kinds]


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: OLMo Hybrid's MLPs and delta nets have no biases, and redline's biases "
                        "cover them with the attention")
    fields = shape_fields(hf)
    heads, width = fields["n_head"], fields["n_embd"]
    key_heads = int(hf.get("linear_num_key_heads") or heads)
    key_dim = int(hf.get("linear_key_head_dim") or int(0.75 * width / key_heads))
    params = hf.get("rope_parameters")
    rope = params is not None and params.get("rope_theta") is not None  # none: the released checkpoints' NoPE
    return ModelConfig(
        **fields, qk_norm=True, qk_norm_scope="all", fused_qkv=True, mlp="swiglu", fused_mlp=True, norm="rmsnorm",
        norm_position="output", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False,
        **(dict(pos_emb="rope", **_rope(hf)) if rope else dict(pos_emb="none")),
        delta_layers=tuple(i for i, linear in enumerate(_kinds(hf)) if linear), delta_norm_position="pre",
        delta_heads=int(hf.get("linear_num_value_heads") or heads), delta_key_heads=key_heads,
        delta_key_dim=key_dim, delta_value_dim=int(hf.get("linear_value_head_dim") or 2 * key_dim),
        delta_conv_kernel=int(hf.get("linear_conv_kernel_dim", 4)),
        delta_beta_scale=2.0 if hf.get("linear_allow_neg_eigval", True) else 1.0, delta_norm_eps=O_NORM_EPS,
    )


def wants_olmo_hybrid(cfg: ModelConfig) -> bool:
    """Gated delta nets beside blocks with norms on their sublayers' outputs, or with norms placed apart."""
    return bool(cfg.delta_layers) and cfg.delta_rule == "gated_delta" and (
        cfg.norm_position == "output" or bool(cfg.delta_norm_position))


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option that OLMo Hybrid, the one architecture with gated delta nets beside OLMo's
    blocks redline exports to, does not have."""
    what = "gated delta nets with norms on the sublayers' outputs: OLMo Hybrid, the architecture with them,"
    raise_first([
        (cfg.norm_position != "output" or cfg.delta_norm_position != "pre",
         f"{what} puts its attention blocks' norms on the sublayers' outputs (model.norm_position=output) and its "
         f"delta nets' on their inputs (model.delta_norm_position=pre)"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "all", f"{what} normalizes its whole q and k projections "
                                                        f"(model.qk_norm, qk_norm_scope=all)"),
        (cfg.norm != "rmsnorm" or cfg.norm_unit_offset or cfg.mlp != "swiglu" or cfg.bias or cfg.has_qkv_bias
         or cfg.moe_experts or cfg.conv_layers, f"{what} has RMSNorms, dense SwiGLU MLPs and no biases"),
        (cfg.delta_norm_eps != O_NORM_EPS, f"{what} fixes its gated output norm's epsilon at {O_NORM_EPS} "
                                           f"(model.delta_norm_eps)"),
        (cfg.delta_beta_scale not in (1.0, 2.0), f"{what} scales β by 2 or not at all (model.delta_beta_scale)"),
        (cfg.pos_emb == "learned" or cfg.rope_dims or cfg.rope_scaling != "none" or cfg.nope_interval
         or cfg.rope_layer_theta or cfg.rope_local_theta,
         f"{what} rotates whole heads with one unscaled RoPE, or has no positions"),
        (cfg.attn_gate != "none" or cfg.sliding_window or cfg.attn_sinks or cfg.attn_scale or cfg.attn_softcap
         or cfg.logit_softcap or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier
         or cfg.logit_divisor or cfg.head_bias or cfg.value_embeddings,
         f"{what} has no gates, windows, sinks, scales, caps or scalars"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "model_type": "olmo_hybrid", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "hidden_act": "silu", "max_position_embeddings": cfg.context_len,
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta} if cfg.pos_emb == "rope" else None,
        "layer_types": ["linear_attention" if i in cfg.delta_layers else "full_attention" for i in range(cfg.n_layer)],
        "linear_num_key_heads": cfg.delta_key_heads, "linear_num_value_heads": cfg.delta_heads,
        "linear_key_head_dim": cfg.delta_key_dim, "linear_value_head_dim": cfg.delta_value_dim,
        "linear_conv_kernel_dim": cfg.delta_conv_kernel, "linear_allow_neg_eigval": cfg.delta_beta_scale == 2.0,
    }


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
           "norm_f.weight": src.take("model.norm.weight"), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        mlp = p + "mlp."
        out[r + "mlp.fc.weight"] = torch.cat([src.take(mlp + "gate_proj.weight"), src.take(mlp + "up_proj.weight")])
        out[r + "mlp.proj.weight"] = src.take(mlp + "down_proj.weight")
        if i in cfg.delta_layers:
            d = p + "linear_attn."
            for theirs, ours in _DELTA_NORMS.items():
                out[f"{r}{ours}.weight"] = _take_norm(src, p, theirs)
            out[r + "attn.in_proj.weight"] = torch.cat([src.take(f"{d}{x}_proj.weight") for x in "qkv"])
            for ours, theirs in _DELTA.items():
                out[f"{r}attn.{ours}.weight"] = src.take(f"{d}{theirs}.weight")
            conv = (torch.cat([src.take(f"{d}{x}_conv1d.weight") for x in "qkv"]) if f"{d}q_conv1d.weight" in src
                    else src.take(d + "conv1d.weight"))
            out[r + "attn.conv"] = conv[:, 0]  # (channels, 1, K) -> (channels, K)
            out[r + "attn.A_log"], out[r + "attn.dt_bias"] = src.take(d + "A_log"), src.take(d + "dt_bias")
            out[r + "attn.norm"] = src.take(d + "o_norm.weight")
            continue
        a = p + "self_attn."
        out[r + "attn_out_norm.weight"] = _take_norm(src, p, "post_attention_layernorm")
        out[r + "mlp_out_norm.weight"] = src.take(p + "post_feedforward_layernorm.weight")
        out[r + "attn.qkv.weight"] = torch.cat([src.take(f"{a}{x}_proj.weight") for x in "qkv"])
        out[r + "attn.proj.weight"] = src.take(a + "o_proj.weight")
        out[r + "attn.q_norm.weight"] = src.take(a + "q_norm.weight")
        out[r + "attn.k_norm.weight"] = src.take(a + "k_norm.weight")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size],
           "model.norm.weight": state["norm_f.weight"], **give_head(state, cfg)}
    D, KV = cfg.head_dim, cfg.kv_heads
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = state[r + "mlp.fc.weight"].chunk(2)
        out[p + "mlp.down_proj.weight"] = state[r + "mlp.proj.weight"]
        if i in cfg.delta_layers:
            d = p + "linear_attn."
            for theirs, ours in _DELTA_NORMS.items():
                out[f"{p}{theirs}.weight"] = state[f"{r}{ours}.weight"]
            widths = [cfg.delta_key_heads * cfg.delta_key_dim] * 2 + [cfg.delta_heads * cfg.delta_value_dim]
            for x, w, c in zip("qkv", state[r + "attn.in_proj.weight"].split(widths),
                               state[r + "attn.conv"][:, None].split(widths)):
                out[f"{d}{x}_proj.weight"], out[f"{d}{x}_conv1d.weight"] = w, c
            for ours, theirs in _DELTA.items():
                out[f"{d}{theirs}.weight"] = state[f"{r}attn.{ours}.weight"]
            out[d + "A_log"], out[d + "dt_bias"] = state[r + "attn.A_log"], state[r + "attn.dt_bias"]
            out[d + "o_norm.weight"] = state[r + "attn.norm"]
            continue
        a = p + "self_attn."
        out[p + "post_attention_layernorm.weight"] = state[r + "attn_out_norm.weight"]
        out[p + "post_feedforward_layernorm.weight"] = state[r + "mlp_out_norm.weight"]
        q, k, v = state[r + "attn.qkv.weight"].split([cfg.n_head * D, KV * D, KV * D])
        out.update({a + "q_proj.weight": q, a + "k_proj.weight": k, a + "v_proj.weight": v,
                    a + "o_proj.weight": state[r + "attn.proj.weight"],
                    a + "q_norm.weight": state[r + "attn.q_norm.weight"],
                    a + "k_norm.weight": state[r + "attn.k_norm.weight"]})
    return {k: v.contiguous() for k, v in out.items()}


FAMILY = Family(name="olmo_hybrid", architecture="OlmoHybridForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
