"""MiMo-V2-Flash (MiMoV2FlashForCausalLM, model_type "mimo_v2_flash"), as transformers' models/mimo_v2_flash
computes it: grouped-query attention on windowed and full layers with DeepSeek-V3's router on experts.

- attention (Llama's names, `self_attn.q_proj` / `k_proj` / `v_proj` / `o_proj`, no biases): heads `head_dim` wide
  for q and k, values `v_head_dim` wide; the windowed layers (`layer_types` "sliding_attention", `sliding_window`
  keys: model.window_layers) have twice `num_key_value_heads` KV heads and a sink logit a head
  (`self_attn.attention_sink_bias` in the Hub's files, transformers' self_attn.sinks: model.attn_sinks with
  attn_sinks_windowed), the full layers `num_key_value_heads` (model.global_kv_head) and no
  sink; RoPE on the first int(head_dim · partial_rotary_factor) dimensions (model.rope_dims) in (first half, second
  half) pairs, a base per layer kind (rope_parameters' full_attention / sliding_attention: rope_theta, and
  rope_local_theta for the windowed layers); the score scale 1 / sqrt(head_dim);
- values narrower than keys: redline's attention takes values as wide as keys, so each KV head's v_proj rows are
  padded with zero rows up to head_dim and o_proj's input columns with zero columns to match. A padded value
  dimension is 0 in every output, and o_proj reads it with a zero column: the same function (the export writes
  the padded widths as they are);
- the values times `attention_value_scale` (0.707): folded into v_proj's rows on import (a linear map of its
  weight), written back as 1.0;
- MLPs: dense SwiGLU on the layers `mlp_layer_types` calls "dense" (the first ones: model.moe_dense_layers),
  experts `moe_intermediate_size` wide on the others, no shared expert, routed as DeepSeek-V3 routes (sigmoid scores,
  `e_score_correction_bias` choosing, `topk_group` of `n_group` groups, rescaled with 1e-20 where `norm_topk_prob`,
  times `routed_scaling_factor`, null on the Hub: 1).

Refused by name: attention_bias, RoPE scalings, an odd rope_dims, v_head_dim wider than head_dim, a dense layer
after a sparse one; the multi-token-prediction layers (`model.mtp.*`) are left out, as transformers leaves them.
Exported as MiMo-V2-Flash wherever a model has model.attn_sinks_windowed (no other architecture has such sinks),
values written as wide as keys (v_head_dim = head_dim, the padding kept: the same function) and
attention_value_scale 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.moe import experts_to_hf, experts_to_redline
from redline.model import ModelConfig

_DEFAULTS = dict(vocab_size=152576, intermediate_size=16384, moe_intermediate_size=2048, num_hidden_layers=48,
                 num_attention_heads=64, num_key_value_heads=4, n_routed_experts=256, num_experts_per_tok=8,
                 routed_scaling_factor=1.0, head_dim=192, v_head_dim=128, sliding_window=129, n_group=1,
                 topk_group=1, norm_topk_prob=True, rms_norm_eps=1e-5, max_position_embeddings=131072,
                 attention_value_scale=0.707, tie_word_embeddings=False)
"""MiMoV2FlashConfig's defaults for the fields a config.json may leave out (null routed_scaling_factor and
attention_value_scale: 1)."""
_ROPE_DEFAULTS = {"full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0,
                                        "partial_rotary_factor": 0.334}}


def _layer_types(hf: dict) -> list[str]:
    n = hf["num_hidden_layers"]
    return list(hf.get("layer_types") or ["full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention"
                                          for i in range(n)])


def model_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    n, heads, kv = hf["num_hidden_layers"], hf["num_attention_heads"], hf["num_key_value_heads"]
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true on mimo_v2_flash: redline reads MiMo-V2-Flash's attention without "
                        "biases (its released models have none)")
    if hf.get("hidden_act", "silu") != "silu":
        raise UserError(f"hidden_act={hf['hidden_act']!r} on mimo_v2_flash: redline's SwiGLU is SiLU-gated")
    kinds = _layer_types(hf)
    if len(kinds) != n or set(kinds) - {"full_attention", "sliding_attention"}:
        raise UserError(f"layer_types={kinds}: redline reads full_attention and sliding_attention layers, one a layer "
                        f"(num_hidden_layers={n})")
    windowed = tuple(i for i, k in enumerate(kinds) if k == "sliding_attention")
    rope = {**_ROPE_DEFAULTS, **(hf.get("rope_parameters") or {})}
    D, V = int(hf["head_dim"]), int(hf["v_head_dim"])
    fractions = set()
    for kind in ("full_attention", "sliding_attention"):
        spec = rope[kind]
        if spec.get("rope_type", "default") != "default":
            raise UserError(f"rope_parameters.{kind}.rope_type={spec['rope_type']!r} on mimo_v2_flash: redline reads "
                            f"its RoPE unscaled")
        fractions.add(float(spec.get("partial_rotary_factor", 0.334)))
    rope_dims = {int(D * f) for f in fractions}  # MiMoV2FlashRotaryEmbedding's int(head_dim · factor)
    if len(rope_dims) != 1 or next(iter(rope_dims)) % 2:
        raise UserError(f"rope_parameters' partial_rotary_factor {sorted(fractions)} on mimo_v2_flash gives "
                        f"{sorted(rope_dims)} rotated dimensions of {D}: redline rotates one even number of them "
                        f"on every layer")
    if V > D:
        raise UserError(f"v_head_dim={V} wider than head_dim={D}: redline pads values up to the key width, not keys "
                        f"up to the values'")
    mlp_kinds = list(hf.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1))
    dense = mlp_kinds.count("dense")
    if len(mlp_kinds) != n or mlp_kinds != ["dense"] * dense + ["sparse"] * (n - dense):
        raise UserError(f"mlp_layer_types={mlp_kinds}: redline runs dense MLPs on the first layers and experts on all "
                        f"the others (num_hidden_layers={n})")
    full_theta, local_theta = (float(rope[k]["rope_theta"]) for k in ("full_attention", "sliding_attention"))
    fields = dict(
        vocab_size=hf["vocab_size"], context_len=int(hf["max_position_embeddings"]), n_layer=n,
        n_embd=hf["hidden_size"], n_head=heads, n_kv_head=2 * kv if windowed else kv, head_size=D,
        rope_dims=next(iter(rope_dims)), rope_theta=full_theta, pos_emb="rope", fused_qkv=False, mlp="swiglu",
        fused_mlp=True, norm="rmsnorm", norm_eps=float(hf["rms_norm_eps"]), bias=False,
        tie_embeddings=bool(hf["tie_word_embeddings"]))
    if windowed:
        # the Hub's sliding_window_size counts the keys before the query: one fewer (MiMoV2FlashConfig adds it)
        window = hf["sliding_window_size"] + 1 if hf.get("sliding_window_size") is not None else hf["sliding_window"]
        fields.update(sliding_window=int(window), attn_sinks=True, attn_sinks_windowed=True,
                      rope_local_theta=local_theta if local_theta != full_theta else 0.0)
        if len(windowed) < n:
            fields.update(window_layers=windowed, global_kv_head=kv)
    experts = int(hf["n_routed_experts"])
    if dense < n and experts:
        groups = int(hf["n_group"] or 1)
        fields.update(moe_experts=experts, moe_top_k=int(hf["num_experts_per_tok"]),
                      mlp_hidden=int(hf["moe_intermediate_size"]), moe_dense_layers=dense,
                      moe_dense_hidden=int(hf["intermediate_size"]) if dense else None, moe_gating="sigmoid",
                      moe_expert_bias=True, moe_groups=groups,
                      moe_topk_groups=int(hf["topk_group"] or groups) if groups > 1 else 1,
                      moe_norm_topk=bool(hf["norm_topk_prob"]), moe_norm_eps=1e-20,
                      moe_scale=float(hf["routed_scaling_factor"]))
    else:
        fields.update(mlp_hidden=int(hf["intermediate_size"]))
    return ModelConfig(**fields)


def _v_head_dim(hf: dict) -> int:
    return int({**_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}["v_head_dim"])


def _value_scale(hf: dict) -> float:
    scale = hf.get("attention_value_scale", _DEFAULTS["attention_value_scale"])
    return 1.0 if scale is None else float(scale)


def _pad_values(v: torch.Tensor, kv: int, V: int, D: int, scale: float) -> torch.Tensor:
    """v_proj (kv · V, C) -> (kv · D, C): each head's rows times `scale`, then D - V zero rows."""
    heads = v.reshape(kv, V, -1) * scale
    return torch.cat([heads, heads.new_zeros(kv, D - V, heads.shape[-1])], dim=1).reshape(kv * D, -1)


def _pad_columns(o: torch.Tensor, heads: int, V: int, D: int) -> torch.Tensor:
    """o_proj (C, H · V) -> (C, H · D): zero columns after each head's V."""
    cols = o.reshape(o.shape[0], heads, V)
    return torch.cat([cols, cols.new_zeros(o.shape[0], heads, D - V)], dim=2).reshape(o.shape[0], heads * D)


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"norm_f.weight": src.take("model.norm.weight"),
           "wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        for ours, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("proj", "o_proj")):
            out[f"{r}attn.{ours}.weight"] = src.take(f"{p}self_attn.{theirs}.weight")
        if cfg.attn_sinks and cfg.layer_window(i):  # the Hub's name (transformers renames it self_attn.sinks)
            sinks = p + "self_attn.attention_sink_bias"
            out[r + "attn.sinks"] = src.take(sinks if sinks in src else p + "self_attn.sinks")
        if not cfg.layer_has_experts(i):
            out[r + "mlp.fc.weight"] = torch.cat([src.take(p + "mlp.gate_proj.weight"),
                                                  src.take(p + "mlp.up_proj.weight")])
            out[r + "mlp.proj.weight"] = src.take(p + "mlp.down_proj.weight")
            continue
        out.update(experts_to_redline(src, p, r, replace(cfg, moe_expert_bias=False)))
        out[r + "mlp.expert_bias"] = src.take(p + "mlp.gate.e_score_correction_bias").float()
    # the multi-token-prediction layers: no part of the causal LM; transformers ignores them on load too
    src.used.update(n for n in src.names if n.startswith("model.mtp."))
    return out


def fold(hf: dict, cfg: ModelConfig, state: dict) -> dict:
    """attention_value_scale into v_proj, and the values padded up to the key width (module docstring)."""
    V, D, scale = _v_head_dim(hf), cfg.head_dim, _value_scale(hf)
    out = dict(state)
    for i in range(cfg.n_layer):
        r = f"blocks.{i}.attn."
        out[r + "v.weight"] = _pad_values(state[r + "v.weight"], cfg.layer_kv_heads(i), V, D, scale)
        out[r + "proj.weight"] = _pad_columns(state[r + "proj.weight"], cfg.n_head, V, D)
    return out


def check_exportable(cfg: ModelConfig) -> None:
    """What MiMo-V2-Flash has not, by name: export_family sends it every model with model.attn_sinks_windowed."""
    full = [i for i in range(cfg.n_layer) if not cfg.layer_window(i)]
    raise_first([
        (cfg.kv_lora_rank or cfg.global_head_size or cfg.global_values_from_keys or cfg.kv_shared_layers
         or cfg.v_norm or cfg.per_layer_embd or cfg.value_embeddings,
         "latent attention or Gemma 4's layer geometry with model.attn_sinks_windowed: MiMo-V2-Flash's attention is "
         "grouped-query attention of one head width"),
        (full and cfg.layer_kv_heads(full[0]) * 2 != cfg.n_kv_head,
         f"model.n_kv_head={cfg.n_kv_head} with global_kv_head={cfg.global_kv_head}: MiMo-V2-Flash's windowed layers "
         f"have twice the full layers' KV heads"),
        (not full and cfg.n_kv_head % 2, f"model.n_kv_head={cfg.n_kv_head}: MiMo-V2-Flash's windowed layers have "
                                         f"twice num_key_value_heads, an even count"),
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine
         or cfg.parallel_residual or cfg.mlp != "swiglu",
         "norms other than pre-norm RMSNorms or MLPs other than SwiGLU with model.attn_sinks_windowed: "
         "MiMo-V2-Flash's blocks are Llama's"),
        (cfg.bias or cfg.has_qkv_bias or cfg.qk_norm or cfg.attn_gate != "none" or cfg.attn_softcap
         or cfg.logit_softcap or cfg.logit_divisor or cfg.embed_scale or cfg.embed_multiplier
         or cfg.residual_multiplier or cfg.head_bias or cfg.attn_scale or cfg.embed_norm or cfg.nope_interval
         or cfg.rope_layer_theta or cfg.attn_chunk or cfg.rope_scaling != "none" or cfg.pos_emb != "rope",
         "biases, QK-norm, gates, soft caps, score or stream scalars, layers without RoPE or RoPE scaling with "
         "model.attn_sinks_windowed: MiMo-V2-Flash has none of them"),
        (cfg.moe_experts and (cfg.moe_gating != "sigmoid" or cfg.moe_shared_hidden or cfg.moe_layers
                              or cfg.moe_post_norm or cfg.moe_bias or cfg.moe_weight_input
                              or (cfg.moe_norm_topk and cfg.moe_norm_eps != 1e-20)),
         "experts other than DeepSeek-V3's (sigmoid scores, model.moe_norm_eps=1e-20, no shared expert, on every layer "
         "from moe_dense_layers) with model.attn_sinks_windowed: MiMo-V2-Flash routes as DeepSeek-V3"),
    ])


def _rotary_fraction(rope_dims: int, head_dim: int) -> float:
    """partial_rotary_factor whose int(head_dim · factor) is rope_dims (MiMoV2FlashRotaryEmbedding truncates)."""
    fraction = rope_dims / head_dim
    while int(head_dim * fraction) < rope_dims:
        fraction = math.nextafter(fraction, 2.0)
    return fraction


def hf_config(cfg: ModelConfig) -> dict:
    """MiMo-V2-Flash's config: values as wide as keys (v_head_dim = head_dim: redline's, padding included) and
    attention_value_scale 1 (folded into v_proj on import)."""
    check_exportable(cfg)
    kinds = ["sliding_attention" if cfg.layer_window(i) else "full_attention" for i in range(cfg.n_layer)]
    full = kinds.index("full_attention") if "full_attention" in kinds else None
    kv = cfg.layer_kv_heads(full) if full is not None else cfg.n_kv_head // 2
    fraction = _rotary_fraction(cfg.rope_dims or cfg.head_dim, cfg.head_dim)
    dense = cfg.moe_dense_layers if cfg.moe_experts else cfg.n_layer
    return {
        "model_type": "mimo_v2_flash", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": (cfg.moe_dense_hidden or cfg.hidden_dim) if cfg.moe_experts else cfg.hidden_dim,
        "moe_intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": kv, "head_dim": cfg.head_dim,
        "v_head_dim": cfg.head_dim, "attention_value_scale": 1.0, "sliding_window": cfg.sliding_window,
        "layer_types": kinds, "mlp_layer_types": ["dense"] * dense + ["sparse"] * (cfg.n_layer - dense),
        "n_routed_experts": cfg.moe_experts or 1, "num_experts_per_tok": cfg.moe_top_k if cfg.moe_experts else 1,
        "n_group": cfg.moe_groups, "topk_group": cfg.moe_topk_groups, "norm_topk_prob": cfg.moe_norm_topk,
        "routed_scaling_factor": cfg.moe_scale, "hidden_act": "silu", "max_position_embeddings": cfg.context_len,
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                               "partial_rotary_factor": fraction},
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_local_theta or cfg.rope_theta,
                                  "partial_rotary_factor": fraction}},
    }


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.norm.weight": state["norm_f.weight"],
           "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size], **give_head(state, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
        for ours, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("proj", "o_proj")):
            out[f"{p}self_attn.{theirs}.weight"] = state[f"{r}attn.{ours}.weight"]
        if r + "attn.sinks" in state:
            out[p + "self_attn.attention_sink_bias"] = state[r + "attn.sinks"]
        if not cfg.layer_has_experts(i):
            out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = state[r + "mlp.fc.weight"].chunk(2)
            out[p + "mlp.down_proj.weight"] = state[r + "mlp.proj.weight"]
            continue
        out.update(experts_to_hf(state, p, r, replace(cfg, moe_expert_bias=False), "qwen3_moe"))
        bias = state.get(r + "mlp.expert_bias")  # transformers' router always holds one: zeros choose as none does
        out[p + "mlp.gate.e_score_correction_bias"] = torch.zeros(cfg.moe_experts) if bias is None else bias.float()
    return out


FAMILY = Family(name="mimo_v2_flash", architecture="MiMoV2FlashForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf,
                ignorable=lambda name: name.endswith("inv_freq"), fold=fold)
"""MiMo-V2-Flash: imported, and exported wherever a model has model.attn_sinks_windowed (its alone)."""
