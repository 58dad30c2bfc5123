"""Cohere's Command models (CohereForCausalLM, model_type "cohere": Command-R, Aya 23; Cohere2ForCausalLM,
"cohere2": Command R7B, Aya Expanse): the Llama layout's tensor names with parallel sublayers under one LayerNorm
without a bias, x + attn(ln(x)) + mlp(ln(x)) (redline's parallel_residual with parallel_shared_norm, norm_bias
false), SwiGLU, GQA, a tied head whose logits are multiplied by `logit_scale` (redline's logit_divisor, its
inverse), and RoPE on interleaved pairs (dimensions (0, 1), (2, 3), ... rotate together), which import permutes into
redline's (first half, second half) order as ernie.py does (every q·k product unchanged).

Cohere2 interleaves sliding-window layers, which rotate, with full layers, which do not (NoPE): `layer_types` (or the
older `sliding_window_pattern`) with one full layer in every N is redline's sliding_window_pattern N with
nope_interval N, as EXAONE 4.0's (exaone4._layers). Semantics read from transformers' models/cohere and
models/cohere2 modeling files. Cohere2 MoE and Cohere Compass (below) are Cohere2's block with experts, and with
RoPE per layer type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop import llama
from redline.interop.ernie import permute_qk
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig


def model_config_for(name: str):
    def model_config(hf: dict) -> ModelConfig:
        llama.check_silu(hf)
        if hf.get("attention_bias"):
            raise UserError("attention_bias=true: Cohere then has q/k/v/o biases with none in its MLP, a mix redline "
                            "does not have")
        if hf.get("use_qk_norm"):
            raise UserError("use_qk_norm=true: Cohere's QK-norm is a LayerNorm with weights of its own for every "
                            "head, which redline's per-head QK-norm (one set of weights for all heads) cannot hold")
        window, interval = 0, 0
        if name == "cohere2":
            from redline.interop.exaone4 import _layers

            if not hf.get("sliding_window"):
                raise UserError("a cohere2 config without sliding_window: its full-attention layers do not rotate, "
                                "so every layer would be position-free; redline does not run such a model")
            window, interval = _layers(hf)
        scale = float(hf.get("logit_scale") or 1.0)
        return ModelConfig(
            **llama.shape_fields(hf), fused_qkv=True, pos_emb="rope", mlp="swiglu",
            fused_mlp=True, norm="layernorm", norm_bias=False, norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
            parallel_residual=True, parallel_shared_norm=True, bias=False,
            tie_embeddings=bool(hf.get("tie_word_embeddings", True)), logit_divisor=0.0 if scale == 1.0 else 1 / scale,
            sliding_window=window, sliding_window_pattern=interval, nope_interval=interval, **llama._rope(hf),
        )

    return model_config


def wants_cohere(cfg: ModelConfig) -> bool:
    """A model only Cohere's architectures hold: parallel sublayers under one LayerNorm without a bias, a SwiGLU MLP
    (StableLM's parallel form has LayerNorm biases; Phi's MLP is GELU)."""
    norm_bias = cfg.bias if cfg.norm_bias is None else cfg.norm_bias
    return cfg.parallel_shared_norm and cfg.mlp == "swiglu" and cfg.norm == "layernorm" and not norm_bias


def export_name(cfg: ModelConfig) -> str:
    """cohere2 with its windowed layers, cohere without; a UserError naming what neither has."""
    windowed = bool(cfg.sliding_window)
    raise_first([
        (cfg.norm != "layernorm" or cfg.norm_bias or cfg.bias or cfg.has_qkv_bias,
         "parallel sublayers under one norm with SwiGLU: Cohere, the architecture with them redline exports to, has "
         "LayerNorms without biases and no Linear biases"),
        (cfg.pos_emb != "rope" or cfg.rope_dims, "Cohere rotates whole heads with RoPE"),
        (cfg.qk_norm or cfg.head_bias or cfg.embed_multiplier or cfg.residual_multiplier or cfg.attn_scale
         or cfg.logit_softcap or cfg.attn_softcap or cfg.embed_scale or cfg.norm_unit_offset or cfg.moe_experts
         or cfg.conv_layers or cfg.value_embeddings,
         "QK-norm, a head bias, scalars other than the logits', caps, experts or convolutions with Cohere's parallel "
         "block: Cohere has none of them"),
        (cfg.head_size not in (None, cfg.n_embd // cfg.n_head), "model.head_size apart from n_embd / n_head: "
                                                                  "Cohere's heads are n_embd / n_head wide"),
        (cfg.rope_layer_theta or cfg.rope_local_theta, "a RoPE base per layer with Cohere's parallel block: "
                                                       "Cohere rotates by one base"),
        (windowed and not (cfg.sliding_window_pattern and cfg.nope_interval == cfg.sliding_window_pattern),
         "model.sliding_window with Cohere's block: Cohere2 has windowed layers that rotate and one full layer "
         "without RoPE in every N (model.sliding_window_pattern N with model.nope_interval N)"),
        (not windowed and cfg.nope_interval, "model.nope_interval without a window: Cohere rotates every layer"),
    ])
    return "cohere2" if windowed else "cohere"


def hf_config_for(name: str):
    def hf_config(cfg: ModelConfig) -> dict:
        out = {"model_type": name, "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
               "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer,
               "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads, "hidden_act": "silu",
               "max_position_embeddings": cfg.context_len, "layer_norm_eps": cfg.norm_eps,
               "logit_scale": 1 / cfg.logit_divisor if cfg.logit_divisor else 1.0,
               "rope_theta": cfg.rope_theta, "rope_scaling": llama.rope_scaling(cfg, name),
               "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "attention_dropout": 0.0,
               "initializer_range": 0.02, "use_cache": True}
        if name == "cohere2":
            out.update(sliding_window=cfg.sliding_window,
                       layer_types=["sliding_attention" if cfg.layer_window(i) else "full_attention"
                                    for i in range(cfg.n_layer)])
        else:
            out["use_qk_norm"] = False
        return out

    return hf_config


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    return permute_qk(llama.to_redline(src, cfg), cfg, inverse=True)


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    return llama.to_hf(permute_qk(dict(state), cfg, inverse=False), cfg, name=export_name(cfg))


FAMILIES = tuple(
    Family(name=n, architecture=arch, model_config=model_config_for(n), hf_config=hf_config_for(n),
           to_redline=to_redline, to_hf=to_hf, ignorable=llama._ignorable)
    for n, arch in (("cohere", "CohereForCausalLM"), ("cohere2", "Cohere2ForCausalLM"))
)


# ----------------------------------------------------------------------------------------------------
# Cohere Compass (CohereCompassForCausalLM, model_type "cohere_compass_text"; its multimodal
# CohereCompassForConditionalGeneration, "cohere_compass": North-Micro-Vision) is Cohere2's parallel block and names
# with
# - RoPE on (first half, second half) pairs, redline's own order (Qwen3's apply_rotary_pos_emb: nothing to permute),
#   its multimodal sections (mrope_section) one position on text, as Qwen3-VL's (multimodal.py);
# - rope_parameters given per layer type, {"sliding_attention": {...}, "full_attention": {...} or None}: a base per
#   kind, None for a kind that does not rotate, so NoPE full layers one in every N (nope_interval N), one base for all
#   (rope_theta), or a base per layer (rope_layer_theta);
# - the window on the layers layer_types calls sliding (every layer full when it names none), heads hidden_size /
#   num_attention_heads wide whatever head_dim says, logits times logit_scale where given.
# Semantics read from transformers' models/cohere_compass/modular_cohere_compass.py. Imports export as Cohere
# (every layer rotating by one base, no window) or Cohere2 (windowed layers rotating, the full one in every N not);
# other layouts as Cohere Compass.

# CohereCompassTextConfig's defaults for the fields redline reads, which transformers fills in where a config leaves
# them out
_COMPASS_DEFAULTS = dict(vocab_size=256_000, hidden_size=8192, intermediate_size=22_528, num_hidden_layers=40,
                         num_attention_heads=64, max_position_embeddings=8192, layer_norm_eps=1e-5,
                         sliding_window=4096, tie_word_embeddings=True)


def _compass_thetas(hf: dict, kinds: list[str]) -> list[float]:
    """Each layer's RoPE base, 0 for a layer that does not rotate, from rope_parameters keyed by layer type."""
    params = hf.get("rope_parameters") or {}
    thetas = []
    for kind in kinds:
        if kind not in params:
            raise UserError(f"rope_parameters names no {kind!r}: Cohere Compass takes RoPE parameters per layer type "
                            f"(None for a kind that does not rotate)")
        spec = params[kind]
        if spec is None:
            thetas.append(0.0)
            continue
        kind_of = spec.get("rope_type", "default")
        if kind_of != "default":
            raise UserError(f"rope_parameters[{kind!r}].rope_type={kind_of!r}: redline reads Cohere Compass's "
                            f"unscaled RoPE (default) alone")
        thetas.append(float(spec["rope_theta"]))
    if not any(thetas):
        raise UserError("rope_parameters rotates no layer type: every layer would be position-free, which redline "
                        "does not run")
    return thetas


def compass_model_config(hf: dict) -> ModelConfig:
    hf = {**_COMPASS_DEFAULTS, **hf}
    hf.pop("head_dim", None)  # CohereCompassTextConfig sets it to hidden_size / num_attention_heads
    n = hf["num_hidden_layers"]
    kinds = hf.get("layer_types") or ["full_attention"] * n
    windows = llama.layer_windows(hf, n, kinds)
    thetas = _compass_thetas(hf, kinds)
    nope = [i for i, t in enumerate(thetas) if not t]
    bases = {t for t in thetas if t}
    interval = nope[0] + 1 if nope else 0
    if len(bases) == 1 and (not nope or nope == [i for i in range(n) if (i + 1) % interval == 0]):
        rope = dict(rope_theta=bases.pop(), nope_interval=interval)
    else:
        rope = dict(rope_theta=max(bases), rope_layer_theta=tuple(thetas))
    cfg = model_config_for("cohere")({**hf, "rope_parameters": None, "rope_theta": rope["rope_theta"]})
    return replace(cfg, **windows, **rope)


def _compass_theta(cfg: ModelConfig, layer: int) -> float:
    """The RoPE base layer `layer` rotates by, 0 for none (nope_interval, rope_local_theta, rope_layer_theta)."""
    return cfg.rope_bases[cfg.layer_rope_table(layer)][0] if cfg.layer_rope(layer) else 0.0


def wants_compass(cfg: ModelConfig) -> bool:
    """Cohere's parallel block (wants_cohere) with what only Cohere Compass's RoPE per layer type gives: a base per
    layer or for the windowed layers, windowed layers beside full ones that rotate too, or windows on other layers
    than all but every N-th."""
    if not wants_cohere(cfg) or cfg.moe_experts or cfg.attn_sinks:  # Cohere2 MoE's; Granite SWA's sinks
        return False
    cohere2 = cfg.sliding_window_pattern and cfg.nope_interval == cfg.sliding_window_pattern and not cfg.window_layers
    return bool(cfg.rope_layer_theta or cfg.rope_local_theta or (cfg.sliding_window and not cohere2))


def check_compass_exportable(cfg: ModelConfig) -> None:
    """A UserError naming what Cohere Compass's layer types cannot give: one base (or none) for the windowed layers
    and one for the full ones, unscaled."""
    kinds = {}
    for i in range(cfg.n_layer):
        kinds.setdefault(cfg.layer_window(i) > 0, set()).add(_compass_theta(cfg, i))
    export_name(replace(cfg, sliding_window=0, nope_interval=0, rope_layer_theta=(), rope_local_theta=0.0))
    raise_first([
        (any(len(t) > 1 for t in kinds.values()),
         "model.rope_layer_theta with Cohere's parallel block: Cohere Compass, the architecture with a RoPE base per "
         "layer type redline exports to, takes one base (or none) for its windowed layers and one for its full ones"),
        (cfg.rope_scaling != "none", f"model.rope_scaling={cfg.rope_scaling} with Cohere's parallel block and a RoPE "
                                     f"base per layer type: Cohere Compass's RoPE is unscaled"),
    ])


def compass_hf_config(cfg: ModelConfig) -> dict:
    check_compass_exportable(cfg)
    out = hf_config_for("cohere")(cfg)
    for key in ("rope_theta", "rope_scaling", "use_qk_norm"):
        out.pop(key)
    kinds = ["sliding_attention" if cfg.layer_window(i) else "full_attention" for i in range(cfg.n_layer)]
    rope = {}
    for i, kind in enumerate(kinds):
        theta = _compass_theta(cfg, i)
        rope[kind] = {"rope_type": "default", "rope_theta": theta} if theta else None
    return {**out, "model_type": "cohere_compass_text", "layer_types": kinds, "rope_parameters": rope,
            "sliding_window": cfg.sliding_window or cfg.context_len}


def compass_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    return llama.to_hf(state, cfg, name="cohere")


COMPASS_FAMILY = Family(name="cohere_compass_text", architecture="CohereCompassForCausalLM",
                        model_config=compass_model_config, hf_config=compass_hf_config, to_redline=llama.to_redline,
                        to_hf=compass_to_hf, ignorable=llama._ignorable)


# ----------------------------------------------------------------------------------------------------
# Cohere2 MoE (Cohere2MoeForCausalLM, model_type "cohere2_moe"): Cohere2's parallel block (one norm, an RMSNorm where
# rms_norm_eps is given, else Cohere's LayerNorm without a bias; interleaved RoPE on the windowed layers alone) with a
# mixture of experts as each layer's MLP, as transformers' Cohere2MoeSparseMoeBlock computes it:
# - routing: the top k of the router's logits, their softmax (the top k of the softmax scores rescaled to sum to 1:
#   moe_norm_topk) or their sigmoid (moe_gating sigmoid, unrescaled; rescaled is refused: redline adds 1e-6 to that
#   sum, as LFM2-MoE does);
# - num_shared_experts SwiGLU experts fused into one ungated shared MLP (mlp.shared_experts.*), added to the routed
#   sum ("sum") or averaged with it ("average": moe_scale 0.5 on the routed weights, the shared MLP's down_proj halved
#   on import, doubled on export, both exact);
# - dense SwiGLU MLPs (prefix_dense_intermediate_size wide) on the layers mlp_layer_types names "dense": first layers
#   (moe_dense_layers), or any where they are as wide as the experts (moe_layers); a dense layer rotates even when
#   full where prefix_dense_sliding_window_pattern is 1 (force_rope), so the layers without RoPE are the full layers
#   otherwise: nope_interval where they fall on every N-th layer, else a base per layer (rope_layer_theta, 0 for
#   none).
# Semantics read from transformers' models/cohere2_moe/modeling_cohere2_moe.py.


def _moe_layer_kinds(hf: dict) -> tuple[list[str], list[str]]:
    """(layer_types, mlp_layer_types), built from first_k_dense_replace and the two window patterns where the config
    does not give them, as Cohere2MoeConfig builds them."""
    n, dense = hf["num_hidden_layers"], int(hf.get("first_k_dense_replace") or 0)
    kinds = hf.get("layer_types")
    if kinds is None:
        prefix, rest = int(hf.get("prefix_dense_sliding_window_pattern") or 1), int(hf.get("sliding_window_pattern", 4))
        kinds = (["full_attention" if (i + 1) % prefix == 0 else "sliding_attention" for i in range(dense)]
                 + ["full_attention" if (i + 1) % rest == 0 else "sliding_attention" for i in range(n - dense)])
    mlp = hf.get("mlp_layer_types") or ["dense" if i < dense else "sparse" for i in range(n)]
    if len(kinds) != n or len(mlp) != n or not set(mlp) <= {"dense", "sparse"}:
        raise UserError(f"layer_types / mlp_layer_types {kinds} / {mlp}: expected {n} entries each, of "
                        f"sliding_attention / full_attention and dense / sparse")
    return list(kinds), list(mlp)


def moe_model_config(hf: dict) -> ModelConfig:
    from redline.interop.moe import expert_fields

    llama.check_silu(hf)
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: Cohere then has q/k/v/o biases with none in its MLP, a mix redline "
                        "does not have")
    window = int(hf.get("sliding_window") or 0)
    if not window:
        raise UserError("a cohere2_moe config without sliding_window: its full-attention layers do not rotate, so "
                        "every layer would be position-free; redline does not run such a model")
    n = hf["num_hidden_layers"]
    kinds, mlp = _moe_layer_kinds(hf)
    force = int(hf.get("prefix_dense_sliding_window_pattern") or 1) == 1
    rope = [kind == "sliding_attention" or (mlp[i] == "dense" and force) for i, kind in enumerate(kinds)]
    fields = llama.layer_windows({**hf, "layer_types": kinds}, n, kinds)
    interval = next((i + 1 for i, r in enumerate(rope) if not r), 0)
    if interval and rope != [(i + 1) % interval != 0 for i in range(n)]:  # no fixed step: a base per layer
        theta = llama._rope(hf)["rope_theta"]
        fields["rope_layer_theta"] = tuple(theta if r else 0.0 for r in rope)
    elif interval:
        fields["nope_interval"] = interval
    selection = hf.get("expert_selection_fn", "softmax")
    if selection not in ("softmax", "sigmoid") or (selection == "sigmoid" and hf.get("norm_topk_prob", True)):
        raise UserError(f"expert_selection_fn={selection!r} with norm_topk_prob={hf.get('norm_topk_prob', True)}: "
                        f"redline takes softmax, or sigmoid scores not rescaled (it adds 1e-6 to their sum, as "
                        f"LFM2-MoE does)")
    strategy = hf.get("shared_expert_combination_strategy", "average")
    shared = int(hf.get("num_shared_experts") or 0) * int(hf["intermediate_size"])
    if shared and strategy not in ("sum", "average"):
        raise UserError(f"shared_expert_combination_strategy={strategy!r}: redline takes sum or average")
    width, dense_width = int(hf["intermediate_size"]), int(hf.get("prefix_dense_intermediate_size") or
                                                           hf["intermediate_size"])
    dense = [i for i, kind in enumerate(mlp) if kind == "dense"]
    if not dense or dense == list(range(len(dense))):
        placement = dict(moe_dense_layers=len(dense), moe_dense_hidden=dense_width if dense_width != width else None)
    elif dense_width == width:
        placement = dict(moe_layers=tuple(i for i, kind in enumerate(mlp) if kind == "sparse"))
    else:
        raise UserError(f"mlp_layer_types={mlp} with prefix_dense_intermediate_size={dense_width} != "
                        f"intermediate_size={width}: redline's dense layers among the expert layers are as wide as "
                        f"the experts")
    scale = float(hf.get("logit_scale") or 1.0)
    norm = dict(norm="rmsnorm", norm_eps=float(hf["rms_norm_eps"])) if hf.get("rms_norm_eps") is not None else \
        dict(norm="layernorm", norm_bias=False, norm_eps=float(hf.get("layer_norm_eps", 1e-5)))
    return ModelConfig(
        **{**llama.shape_fields(hf), **expert_fields(hf, "intermediate_size")}, **placement, **norm, **fields,
        fused_qkv=True, pos_emb="rope", mlp="swiglu", fused_mlp=True, parallel_residual=True,
        parallel_shared_norm=True, bias=False, tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        logit_divisor=0.0 if scale == 1.0 else 1 / scale, moe_gating=selection, moe_norm_topk=selection == "softmax",
        moe_shared_hidden=shared, moe_shared_gate=False,
        moe_scale=0.5 if shared and strategy == "average" else 1.0, **llama._rope(hf))


def _halve_shared(hf: dict, cfg: ModelConfig, state: dict) -> dict:
    """"average": the shared MLP's output halved, folded into its down_proj (exact: a power of 2)."""
    if cfg.moe_shared_hidden and cfg.moe_scale == 0.5:
        for name in [n for n in state if n.endswith("mlp.shared.proj.weight")]:
            state[name] = state[name] * 0.5
    return state


def wants_cohere2_moe(cfg: ModelConfig) -> bool:
    """Experts in a parallel block under one norm: Cohere2 MoE's alone among the architectures redline exports to."""
    return bool(cfg.moe_experts and cfg.parallel_shared_norm)


def _force_rope(cfg: ModelConfig) -> bool:
    """Whether the exported config forces RoPE on its full dense layers (prefix_dense_sliding_window_pattern 1)."""
    return any(not cfg.layer_has_experts(i) and not cfg.layer_window(i) and cfg.layer_rope(i)
               for i in range(cfg.n_layer))


def check_moe_exportable(cfg: ModelConfig) -> None:
    what = "experts in a parallel block under one norm: Cohere2 MoE, the one architecture with them redline exports to,"
    norm_bias = cfg.bias if cfg.norm_bias is None else cfg.norm_bias
    force = _force_rope(cfg)
    raise_first([
        (not cfg.parallel_residual or cfg.norm_unit_offset or not cfg.norm_affine or cfg.embed_norm
         or (cfg.norm == "layernorm" and norm_bias), f"{what} has RMSNorms or LayerNorms without biases"),
        (cfg.mlp != "swiglu" or cfg.bias or cfg.has_qkv_bias or cfg.moe_bias,
         f"{what} has SwiGLU experts and no Linear biases"),
        (cfg.qk_norm or cfg.pos_emb != "rope" or cfg.rope_dims or cfg.rope_local_theta
         or any(theta not in (0.0, cfg.rope_theta) for theta in cfg.rope_layer_theta),
         f"{what} has no QK-norm and rotates whole heads with one RoPE (model.rope_theta's)"),
        (not cfg.sliding_window, f"{what} rotates its windowed layers alone: it needs model.sliding_window"),
        (any(cfg.layer_rope(i) != (bool(cfg.layer_window(i)) or (force and not cfg.layer_has_experts(i)))
             for i in range(cfg.n_layer)),
         f"{what} rotates its windowed layers, and its full dense layers all or none, and no full expert layer"),
        (cfg.moe_expert_bias or cfg.moe_groups > 1 or cfg.moe_norm_min
         or (cfg.moe_gating == "softmax") != cfg.moe_norm_topk,
         f"{what} rescales the top k of softmax scores, or leaves sigmoid scores as they are, with no bias, floor or "
         f"groups"),
        (cfg.moe_scale != (0.5 if cfg.moe_shared_hidden else 1.0) and cfg.moe_scale != 1.0,
         f"{what} scales the routed weights by 0.5 alone, averaging them with its shared experts (model.moe_scale)"),
        (cfg.moe_shared_hidden and (cfg.moe_shared_gate or cfg.moe_shared_hidden % cfg.hidden_dim),
         f"{what} has ungated shared experts as wide as the routed ones (model.moe_shared_gate=false, "
         f"moe_shared_hidden a multiple of mlp_hidden)"),
        (cfg.moe_layers and cfg.moe_dense_hidden, f"{what} has dense layers among its expert layers only as wide"),
        (cfg.attn_sinks or cfg.attn_gate != "none" or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap
         or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.head_bias or cfg.value_embeddings
         or cfg.conv_layers or cfg.delta_layers or cfg.qk_norm_after_rope,
         f"{what} has no sinks, gates, scales other than the logits', caps or other token mixers"),
    ])


def moe_hf_config(cfg: ModelConfig) -> dict:
    out = {"model_type": "cohere2_moe", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
           "intermediate_size": cfg.hidden_dim,
           "prefix_dense_intermediate_size": cfg.moe_dense_hidden or cfg.hidden_dim,
           "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads,
           "head_dim": cfg.head_dim, "hidden_act": "silu", "max_position_embeddings": cfg.context_len,
           "rms_norm_eps": cfg.norm_eps if cfg.norm == "rmsnorm" else None, "layer_norm_eps": cfg.norm_eps,
           "logit_scale": 1 / cfg.logit_divisor if cfg.logit_divisor else 1.0, "rope_theta": cfg.rope_theta,
           "rope_scaling": llama.rope_scaling(cfg, "cohere2_moe"), "tie_word_embeddings": cfg.tie_embeddings,
           "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
           "sliding_window": cfg.sliding_window, "num_experts": cfg.moe_experts, "num_experts_per_tok": cfg.moe_top_k,
           "num_shared_experts": cfg.moe_shared_hidden // cfg.hidden_dim,
           "shared_expert_combination_strategy": "average" if cfg.moe_scale == 0.5 else "sum",
           "expert_selection_fn": cfg.moe_gating, "norm_topk_prob": cfg.moe_norm_topk,
           "prefix_dense_sliding_window_pattern": 1 if _force_rope(cfg) else 2,
           "layer_types": ["sliding_attention" if cfg.layer_window(i) else "full_attention"
                           for i in range(cfg.n_layer)],
           "mlp_layer_types": ["sparse" if cfg.layer_has_experts(i) else "dense" for i in range(cfg.n_layer)],
           "output_router_logits": bool(cfg.moe_aux_loss), "router_aux_loss_coef": cfg.moe_aux_loss or 0.001}
    return out


_SHARED = (".mlp.shared_experts.", ".mlp.shared_expert.")  # Cohere2 MoE's name, moe.py's


def moe_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    theirs = {name.replace(*_SHARED): name for name in src.names}
    return to_redline(TensorSource(theirs, lambda name: src.take(theirs[name]), src.where), cfg)


def moe_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {}  # llama.to_hf names the experts as Qwen-MoE's, which Cohere2 MoE's are
    average = cfg.moe_shared_hidden and cfg.moe_scale == 0.5
    for name, t in llama.to_hf(permute_qk(dict(state), cfg, inverse=False), cfg, name="qwen2_moe").items():
        name = name.replace(_SHARED[1], _SHARED[0])
        out[name] = t * 2.0 if average and name.endswith("shared_experts.down_proj.weight") else t
    return out


MOE_FAMILY = Family(name="cohere2_moe", architecture="Cohere2MoeForCausalLM", model_config=moe_model_config,
                    hf_config=moe_hf_config, to_redline=moe_to_redline, to_hf=moe_to_hf, ignorable=llama._ignorable,
                    fold=_halve_shared)
