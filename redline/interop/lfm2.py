"""LFM2 (Liquid AI's Lfm2ForCausalLM: LFM2-350M, LFM2-700M, LFM2-1.2B and their fine-tunes): pre-norm blocks whose
token mixer is attention on a few layers and a gated short convolution on the others (redline's model.conv_layers,
ShortConv in model.py).

A block is h = x + mixer(operator_norm(x)), out = h + mlp(ffn_norm(h)). The attention layers have GQA, RoPE and
QK-norm per head (`q_layernorm`, `k_layernorm`) and an `out_proj`; a convolution layer projects to 3·C (`in_proj`),
splits (b, c, h), convolves b·h causally over `conv_L_cache` tokens with a depthwise kernel (`conv.weight`
(C, 1, L)) and returns out_proj(c · that). The MLP is SwiGLU (`w1` gate, `w3` up, `w2` down), its width adjusted from
`intermediate_size` as transformers does (`block_auto_adjust_ff_dim`: two thirds, times `block_ffn_dim_multiplier`,
rounded up to `block_multiple_of`); the final norm is named `embedding_norm`. Which layers attend: `layer_types`
("full_attention" or "conv"), else `full_attn_idxs`. Semantics read from transformers' models/lfm2/modeling_lfm2.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import _rope, _split_qkv, check_silu, rope_scaling
from redline.model import ModelConfig


def _conv_layers(hf: dict) -> tuple[int, ...]:
    n = hf["num_hidden_layers"]
    kinds = hf.get("layer_types")
    if kinds is None:
        full = hf.get("full_attn_idxs")
        full = range(n) if full is None else full
        kinds = ["full_attention" if i in full else "conv" for i in range(n)]
    if len(kinds) != n or not set(kinds) <= {"full_attention", "conv"}:
        raise UserError(f"layer_types {kinds}: LFM2 takes {n} entries, each full_attention or conv")
    return tuple(i for i, kind in enumerate(kinds) if kind == "conv")


def mlp_width(hf: dict) -> int:
    """The SwiGLU width transformers' Lfm2MLP builds from the config."""
    width = int(hf.get("block_ff_dim") or hf["intermediate_size"])
    if hf.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        multiplier = hf.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            multiple = int(hf.get("block_multiple_of", 256))
            width = int(multiplier * width)
            width = multiple * ((width + multiple - 1) // multiple)
    return width


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    if hf.get("conv_bias"):
        raise UserError("conv_bias=true: LFM2's convolution layers then have biases where its attention and MLP have "
                        "none, a mix redline does not have (biases on q/k/v alone, or on every Linear layer)")
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 2048),
        n_layer=hf["num_hidden_layers"], n_embd=width, n_head=heads,
        n_kv_head=hf.get("num_key_value_heads") or heads, mlp_hidden=mlp_width(hf), qk_norm=True, fused_qkv=True,
        pos_emb="rope", mlp="swiglu", fused_mlp=True, norm="rmsnorm", norm_eps=float(hf.get("norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", hf.get("tie_embedding", True))),
        bias=False, conv_layers=_conv_layers(hf),
        conv_kernel=int(hf.get("conv_L_cache", 3)), **_rope(hf),
    )


def moe_model_config(hf: dict) -> ModelConfig:
    """LFM2-MoE (Lfm2MoeForCausalLM: LFM2-8B-A1B): LFM2's blocks with the MLPs of all but the first num_dense_layers
    a mixture of experts (`feed_forward.gate`, experts `feed_forward.experts.j.w1/w3/w2`), routed by each expert's
    sigmoid score plus `expert_bias` (to choose, not to weight), the chosen scores rescaled to sum to 1 where
    norm_topk_prob, times routed_scaling_factor; the dense MLPs intermediate_size wide, as given (no adjusting)."""
    cfg = model_config({**hf, "block_auto_adjust_ff_dim": False})
    return replace(cfg, moe_experts=int(hf["num_experts"]), moe_top_k=int(hf["num_experts_per_tok"]),
                   mlp_hidden=int(hf["moe_intermediate_size"]), moe_dense_layers=int(hf.get("num_dense_layers", 0)),
                   moe_dense_hidden=int(hf["intermediate_size"]), moe_gating="sigmoid",
                   moe_expert_bias=bool(hf.get("use_expert_bias", True)),
                   moe_scale=float(hf.get("routed_scaling_factor") or 1.0),
                   moe_norm_topk=bool(hf.get("norm_topk_prob", True)))


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with short-convolution layers that LFM2 does not have."""
    raise_first([
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset,
         "model.conv_layers: LFM2, the one architecture with short convolutions redline exports to, has pre-RMSNorm "
         "blocks"),
        (cfg.mlp != "swiglu", f"model.mlp={cfg.mlp} with model.conv_layers: LFM2's MLPs are SwiGLU"),
        (cfg.moe_experts and (cfg.moe_gating != "sigmoid" or cfg.moe_shared_hidden),
         "experts with model.conv_layers: LFM2-MoE's route by sigmoid scores (model.moe_gating=sigmoid) and have no "
         "shared expert"),
        (cfg.moe_experts and cfg.moe_norm_topk and cfg.moe_norm_eps != 1e-6,
         f"model.moe_norm_eps={cfg.moe_norm_eps} with model.conv_layers: LFM2-MoE rescales the chosen scores with "
         f"1e-6; set model.moe_norm_eps=1e-6"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "head" or cfg.qk_norm_after_rope,
         "model.conv_layers without per-head QK-norm before RoPE: LFM2's attention layers normalize q and k so"),
        (cfg.bias or cfg.has_qkv_bias, "model.bias or model.qkv_bias with model.conv_layers: LFM2's attention and "
                                       "MLP have no biases"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval, "model.conv_layers: LFM2 rotates every "
                                                                      "attention layer's whole heads"),
        (cfg.sliding_window or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap or cfg.parallel_residual
         or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor
         or cfg.head_bias or cfg.head_size not in (None, cfg.n_embd // cfg.n_head),
         "a window, scales, caps or parallel sublayers with model.conv_layers: LFM2 has none of them"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    if cfg.moe_experts:
        return {**_dense_hf_config(cfg), "model_type": "lfm2_moe", "intermediate_size": cfg.moe_dense_hidden or
                cfg.hidden_dim, "moe_intermediate_size": cfg.hidden_dim, "num_dense_layers": cfg.moe_dense_layers,
                "num_experts": cfg.moe_experts, "num_experts_per_tok": cfg.moe_top_k,
                "use_expert_bias": cfg.moe_expert_bias, "routed_scaling_factor": cfg.moe_scale,
                "norm_topk_prob": cfg.moe_norm_topk}
    return _dense_hf_config(cfg)


def _dense_hf_config(cfg: ModelConfig) -> dict:
    return {"model_type": "lfm2", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
            "intermediate_size": cfg.hidden_dim, "block_auto_adjust_ff_dim": False,
            "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.kv_heads, "max_position_embeddings": cfg.context_len,
            "norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta, "rope_scaling": rope_scaling(cfg, "lfm2"),
            "tie_word_embeddings": cfg.tie_embeddings, "conv_bias": False, "conv_L_cache": cfg.conv_kernel,
            "layer_types": ["conv" if i in cfg.conv_layers else "full_attention" for i in range(cfg.n_layer)],
            "hidden_act": "silu", "initializer_range": 0.02, "use_cache": True}


def _names(cfg: ModelConfig, i: int) -> dict[str, str]:
    """redline's names of block i (after blocks.i.) -> Hugging Face's (after model.layers.i.), but the fused
    projections and the convolution's kernel (shaped apart)."""
    out = {"norm1": "operator_norm", "norm2": "ffn_norm"}
    if not _moe_layer(cfg, i):
        out["mlp.proj"] = "feed_forward.w2"
    if i in cfg.conv_layers:
        out.update({"attn.in_proj": "conv.in_proj", "attn.proj": "conv.out_proj"})
    else:
        out.update({"attn.proj": "self_attn.out_proj", "attn.q_norm": "self_attn.q_layernorm",
                    "attn.k_norm": "self_attn.k_layernorm"})
    return out


def _moe_layer(cfg: ModelConfig, i: int) -> bool:
    return bool(cfg.moe_experts) and i >= cfg.moe_dense_layers


def to_redline(src: TensorSource, cfg: ModelConfig, names=_names) -> dict:
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
           "norm_f.weight": src.take("model.embedding_norm.weight")}
    out.update(take_head(src, cfg))
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        for ours, theirs in names(cfg, i).items():
            out[f"{r}{ours}.weight"] = src.take(f"{p}{theirs}.weight")
        if _moe_layer(cfg, i):  # moe.py's map, LFM2-MoE's names
            from redline.interop.moe import experts_to_redline

            out.update(experts_to_redline(src, p, r, cfg))
        else:
            out[r + "mlp.fc.weight"] = torch.cat([src.take(p + "feed_forward.w1.weight"),
                                                  src.take(p + "feed_forward.w3.weight")])
        if i in cfg.conv_layers:
            out[r + "attn.weight"] = src.take(p + "conv.conv.weight")[:, 0]  # (C, 1, L) -> (C, L)
        else:
            out[r + "attn.qkv.weight"] = torch.cat([src.take(f"{p}self_attn.{x}_proj.weight") for x in "qkv"])
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig, names=_names) -> dict:
    V = cfg.vocab_size
    out = {"model.embed_tokens.weight": state["wte.weight"][:V], "model.embedding_norm.weight": state["norm_f.weight"]}
    out.update(give_head(state, cfg))
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        for ours, theirs in names(cfg, i).items():
            out[f"{p}{theirs}.weight"] = state[f"{r}{ours}.weight"]
        if _moe_layer(cfg, i):
            from redline.interop.moe import experts_to_hf

            out.update(experts_to_hf(state, p, r, cfg, "lfm2_moe"))
        else:
            out[p + "feed_forward.w1.weight"], out[p + "feed_forward.w3.weight"] = state[r + "mlp.fc.weight"].chunk(2)
        if i in cfg.conv_layers:
            out[p + "conv.conv.weight"] = state[r + "attn.weight"][:, None]
        else:
            for x, t in zip("qkv", _split_qkv(state[r + "attn.qkv.weight"], cfg)):
                out[f"{p}self_attn.{x}_proj.weight"] = t
    return {k: v.contiguous() for k, v in out.items()}


FAMILY = Family(name="lfm2", architecture="Lfm2ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf)
MOE_FAMILY = Family(name="lfm2_moe", architecture="Lfm2MoeForCausalLM", model_config=moe_model_config,
                    hf_config=hf_config, to_redline=to_redline, to_hf=to_hf)


# ----------------------------------------------------------------------------------------------------
# LFM3 (Lfm3ForCausalLM, model_type "lfm3": LFM3-1.7B): LFM2's short convolutions and attention layers, with
# - windowed attention layers besides the full ones, anywhere (layer_types: conv, sliding_attention, full_attention;
#   by default full where i % 4 == 2, windowed where i % 4 == 0 past layer 0, convolutions elsewhere): conv_layers
#   and window_layers;
# - a RoPE of each attention kind (rope_parameters nested by layer type): the full layers' as rope_theta with its
#   scaling, by default "proportional" (half of each head's pairs turning: rope_proportion), the windowed layers'
#   unscaled as rope_local_theta;
# - Qwen3's attention names (q_proj, k_proj, v_proj, o_proj, per-head q_norm / k_norm before RoPE) with a sigmoid
#   gate per head on the attention's output (use_attention_gate: attn_gate=head; gate_proj in the files, renamed
#   g_proj by transformers' loader);
# - norms on each sublayer's output too (post_operator_norm, post_ffn_norm, use_sandwich_norm: norm_position
#   sandwich), and an MLP intermediate_size wide as given (w1 gate, w3 up, w2 down).
# Semantics read from transformers' models/lfm3/modular_lfm3.py and modeling_rope_utils.py's proportional RoPE.

LFM3_KINDS = ("conv", "sliding_attention", "full_attention")


def _lfm3_kinds(hf: dict) -> list[str]:
    n = hf["num_hidden_layers"]
    kinds = hf.get("layer_types") or ["full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i
                                      else "conv" for i in range(n)]  # Lfm3Config's default
    if len(kinds) != n or not set(kinds) <= set(LFM3_KINDS):
        raise UserError(f"layer_types {kinds}: LFM3 takes {n} entries, each of {', '.join(LFM3_KINDS)}")
    return kinds


def _lfm3_rope(hf: dict, kinds: list[str]) -> dict:
    """The full layers' RoPE as rope_theta and its scaling, the windowed layers' (unscaled) as rope_local_theta."""
    params = hf.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5}}
    if not set(params) & {"full_attention", "sliding_attention"}:  # one RoPE for both kinds
        params = {"full_attention": params, "sliding_attention": params}
    full, local = params.get("full_attention"), params.get("sliding_attention")
    out: dict = {}
    if full is not None and "full_attention" in kinds:
        kind = full.get("rope_type", "default")
        if kind == "proportional":
            out = {"rope_theta": float(full["rope_theta"]), "rope_scaling": "proportional",
                   "rope_factor": float(full.get("factor", 1.0)),
                   "rope_proportion": float(full.get("partial_rotary_factor", 1.0))}
        elif full.get("partial_rotary_factor", 1.0) != 1.0:
            raise UserError(f"rope_parameters.full_attention: partial_rotary_factor with rope_type {kind!r}; redline "
                            f"reads LFM3's partial RoPE as the proportional kind")
        else:
            out = _rope({"rope_parameters": full, "max_position_embeddings": hf.get("max_position_embeddings")})
    if local is not None and "sliding_attention" in kinds:
        if local.get("rope_type", "default") != "default" or local.get("partial_rotary_factor", 1.0) != 1.0:
            raise UserError(f"rope_parameters.sliding_attention {local}: redline rotates LFM3's windowed layers with "
                            f"an unscaled RoPE of whole heads (rope_type default)")
        theta = float(local.get("rope_theta", 10_000.0))
        if not out:
            out = {"rope_theta": theta}
        elif out != {"rope_theta": theta}:  # a table of their own
            out["rope_local_theta"] = theta
    return out


def lfm3_model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    for key in ("conv_bias", "attention_bias"):
        if hf.get(key):
            raise UserError(f"{key}=true: LFM3's biases are not supported (its other layers have none, and redline's "
                            f"biases cover every Linear layer)")
    kinds = _lfm3_kinds(hf)
    window = int(hf.get("sliding_window", 256) or 0)
    windowed = tuple(i for i, kind in enumerate(kinds) if kind == "sliding_attention") if window else ()
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim", 128) or width // heads
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 2048),
        n_layer=hf["num_hidden_layers"], n_embd=width, n_head=heads,
        n_kv_head=hf.get("num_key_value_heads") or heads, head_size=head_dim if head_dim * heads != width else None,
        mlp_hidden=int(hf["intermediate_size"]), qk_norm=True, fused_qkv=True, pos_emb="rope", mlp="swiglu",
        fused_mlp=True, norm="rmsnorm", norm_eps=float(hf.get("norm_eps", hf.get("rms_norm_eps", 1e-5))),
        norm_position="sandwich" if hf.get("use_sandwich_norm", True) else "pre",
        attn_gate="head" if hf.get("use_attention_gate", True) else "none",
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=False,
        conv_layers=tuple(i for i, kind in enumerate(kinds) if kind == "conv"),
        conv_kernel=int(hf.get("conv_L_cache", 7)), sliding_window=window if windowed else 0,
        window_layers=windowed if windowed and len(windowed) < len(kinds) else (), **_lfm3_rope(hf, kinds),
    )


def wants_lfm3(cfg: ModelConfig) -> bool:
    """A model only LFM3 holds: a gate on the heads, proportional RoPE, or short convolutions with output norms, a
    window or the windowed layers' own RoPE."""
    return cfg.attn_gate == "head" or cfg.rope_scaling == "proportional" or bool(cfg.conv_layers and (
        cfg.norm_position == "sandwich" or cfg.sliding_window or cfg.rope_local_theta))


def check_lfm3_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option that LFM3, the one architecture with a gate on each head's output, proportional
    RoPE, or short convolutions with output norms or windows redline exports to, does not have."""
    what = ("LFM3, the architecture redline exports a model with model.attn_gate, proportional RoPE or "
            "model.conv_layers with norm_position=sandwich or a window to,")
    raise_first([
        (cfg.norm_position not in ("pre", "sandwich") or cfg.norm != "rmsnorm" or cfg.norm_unit_offset
         or not cfg.norm_affine or cfg.embed_norm or cfg.parallel_residual,
         f"{what} has RMSNorms with weights on each sublayer's input (and output: norm_position=sandwich), "
         f"sublayers in turn"),
        (cfg.mlp != "swiglu" or cfg.moe_experts, f"{what} has a dense SwiGLU MLP (model.mlp={cfg.mlp})"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "head" or cfg.qk_norm_after_rope,
         f"{what} normalizes q and k per head before RoPE (model.qk_norm)"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no biases (model.bias, model.qkv_bias)"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_layer_theta
         or cfg.rope_scaling == "longrope",
         f"{what} rotates every attention layer with RoPE, by the full layers' (any scaling but longrope) or the "
         f"windowed layers' own base"),
        (cfg.rope_local_theta and not any(cfg.layer_window(i) for i in range(cfg.n_layer)),
         f"{what} gives a RoPE of their own to windowed layers only (model.rope_local_theta without a window)"),
        (cfg.attn_sinks or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap or cfg.value_embeddings
         or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.head_bias,
         f"{what} has no sinks, scales, caps, value embeddings or scalars"),
    ])


def lfm3_hf_config(cfg: ModelConfig) -> dict:
    from redline.interop.llama import rope_scaling as llama_scaling

    full = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "proportional":
        full.update(rope_type="proportional", partial_rotary_factor=cfg.rope_proportion)
        if cfg.rope_factor != 1.0:  # transformers' checks list no factor for this kind, though it divides by one
            full["factor"] = cfg.rope_factor
    elif cfg.rope_scaling != "none":
        full.update(llama_scaling(cfg, "lfm3"))
    local = {"rope_type": "default", "rope_theta": cfg.rope_local_theta} if cfg.rope_local_theta else dict(full)
    kinds = ["conv" if i in cfg.conv_layers else "sliding_attention" if cfg.layer_window(i) else "full_attention"
             for i in range(cfg.n_layer)]
    return {"model_type": "lfm3", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
            "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "max_position_embeddings": cfg.context_len,
            "norm_eps": cfg.norm_eps, "rope_parameters": {"full_attention": full, "sliding_attention": local},
            "tie_word_embeddings": cfg.tie_embeddings, "conv_bias": False, "conv_L_cache": cfg.conv_kernel,
            "layer_types": kinds, "sliding_window": cfg.sliding_window or None,
            "use_sandwich_norm": cfg.norm_position == "sandwich", "use_attention_gate": cfg.attn_gate == "head",
            "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True}


def _lfm3_names(cfg: ModelConfig, i: int) -> dict[str, str]:
    out = {"norm1": "operator_norm", "norm2": "ffn_norm", "mlp.proj": "feed_forward.w2"}
    if cfg.norm_position == "sandwich":
        out.update({"attn_out_norm": "post_operator_norm", "mlp_out_norm": "post_ffn_norm"})
    if i in cfg.conv_layers:
        out.update({"attn.in_proj": "conv.in_proj", "attn.proj": "conv.out_proj"})
    else:
        out.update({"attn.proj": "self_attn.o_proj", "attn.q_norm": "self_attn.q_norm",
                    "attn.k_norm": "self_attn.k_norm"})
        if cfg.attn_gate == "head":  # g_proj in transformers' module, gate_proj in the files it reads and writes
            out["attn.gate"] = "self_attn.gate_proj"
    return out


def lfm3_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    return to_redline(src, cfg, _lfm3_names)


def lfm3_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    return to_hf(state, cfg, _lfm3_names)


LFM3_FAMILY = Family(name="lfm3", architecture="Lfm3ForCausalLM", model_config=lfm3_model_config,
                     hf_config=lfm3_hf_config, to_redline=lfm3_to_redline, to_hf=lfm3_to_hf)
