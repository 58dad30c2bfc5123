"""Kimi Linear (KimiLinearForCausalLM, model_type "kimi_linear": Kimi-Linear-48B-A3B): a hybrid of Kimi Delta Attention
and latent attention without positions, DeepSeek-V3's mixture of experts on its MLPs, as transformers'
models/kimi_linear computes it.

- linear_attention layers (three in four by default; the Hub's linear_attn_config lists kda_layers and
  full_attn_layers counting from 1): Kimi Delta Attention, redline's GatedDeltaNet with model.delta_decay=channel and
  delta_gate_rank. q, k and v (`self_attn.q_proj`, `k_proj`, `v_proj`, num_heads heads of head_dim each) through their
  causal convolutions (`q_conv1d`, `k_conv1d`, `v_conv1d`, (H·D, 1, K) each, or transformers' concatenated `conv1d`)
  and SiLU, q and k L2-normalized; β = sigmoid(`b_proj`); the decay one per key channel,
  −exp(`A_log`)·softplus(`f_b_proj`(`f_a_proj`(x)) + `dt_bias`) (the Hub keeps these under self_attn., transformers
  under self_attn.forget_gate.); the output RMS-normalized per head (`o_norm`) times
  sigmoid(`g_b_proj`(`g_a_proj`(x))), then `o_proj`. Imports put q, k and v into redline's in_proj ([q; k; v]) and the
  convolutions into one; exports write them apart again;
- full_attention layers: DeepSeek's multi-head latent attention (deepseek.py's tensors) whose qk_rope_head_dim part is
  shared by the heads but never rotated (NoPE: redline's latent attention with pos_emb=none);
- MLPs: dense SwiGLU on the first layers (mlp_layer_types "dense", else the first first_k_dense_replace),
  DeepSeek-V3's experts on the rest: sigmoid scores chosen with e_score_correction_bias within the topk_group best of
  num_expert_group groups, rescaled where moe_renormalize, times routed_scaling_factor, and an ungated shared expert
  num_shared_experts experts wide. The Hub holds them Mixtral's way (`block_sparse_moe.experts.j.w1` / `w3` / `w2`,
  `block_sparse_moe.gate`, `block_sparse_moe.shared_experts`), transformers stacked under mlp.: both are read; exports
  write the Hub's.

transformers' Kimi Linear ties no head, whatever tie_word_embeddings says: the head is read, and a tied redline model
exports its embedding as the head too. Refused by name: attention_bias, num_key_value_heads other than the heads,
qk_rope_head_dim 0, a router other than sigmoid, mla_use_nope false, dense layers after sparse ones. Semantics read
from transformers' models/kimi_linear/modeling_kimi_linear.py and its conversion mapping.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, pad_rows, raise_first, take_head
from redline.interop.llama import check_silu
from redline.model import ModelConfig

_MLA = {"q_a": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b": "q_b_proj", "q": "q_proj",
        "kv_a": "kv_a_proj_with_mqa", "kv_a_norm": "kv_a_layernorm", "kv_b": "kv_b_proj", "proj": "o_proj"}
"""redline's LatentAttention modules -> Kimi's (after self_attn.), DeepSeek's names."""
_KDA = {"attn.b": "b_proj", "attn.z_down": "g_a_proj", "attn.z": "g_b_proj", "attn.proj": "o_proj"}
"""redline's KDA projections -> Kimi's (after self_attn.), besides q/k/v and the forget gate's."""
_GATE = {"attn.a_down": "f_a_proj", "attn.a": "f_b_proj"}
"""The forget gate's projections: under self_attn. in the Hub's files, self_attn.forget_gate. in transformers'."""


def _get(hf: dict, *names, default=None):
    """The first of `names` hf gives (KimiLinearConfig's attribute_map: the Hub's names and transformers' alike)."""
    return next((hf[n] for n in names if hf.get(n) is not None), default)


def _layer_kinds(hf: dict) -> list[str]:
    """layer_types as KimiLinearConfig sets them: given, else linear_attn_config's 1-based kda_layers and
    full_attn_layers, else full attention on every 4th layer from layer 4 (i % 4 == 0, i > 0)."""
    n = hf["num_hidden_layers"]
    linear = hf.get("linear_attn_config") or {}
    kinds = hf.get("layer_types")
    if kinds is None and "full_attn_layers" in linear and "kda_layers" in linear:
        kinds = [None] * n
        for i in linear["full_attn_layers"]:
            kinds[i - 1] = "full_attention"
        for i in linear["kda_layers"]:
            kinds[i - 1] = "linear_attention"
    if kinds is None:
        kinds = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
    if len(kinds) != n or not set(kinds) <= {"linear_attention", "full_attention"}:
        raise UserError(f"layer_types {kinds}: Kimi Linear takes {n} entries, each linear_attention or "
                        f"full_attention")
    return kinds


def _dense_layers(hf: dict) -> int:
    """The number of dense first layers (mlp_layer_types, else first_k_dense_replace, default 1)."""
    n = hf["num_hidden_layers"]
    kinds = hf.get("mlp_layer_types") or ["dense" if i < int(_get(hf, "first_k_dense_replace", default=1)) else
                                          "sparse" for i in range(n)]
    dense = kinds.count("dense")
    if len(kinds) != n or kinds != ["dense"] * dense + ["sparse"] * (n - dense):
        raise UserError(f"mlp_layer_types={kinds}: redline runs dense MLPs on the first layers and experts on all "
                        f"the others (num_hidden_layers={n})")
    return dense


def model_config(hf: dict) -> ModelConfig:
    from redline.interop.deepseek import _expert_fields

    check_silu(hf)
    heads = hf["num_attention_heads"]
    linear = hf.get("linear_attn_config") or {}
    raise_first([
        (bool(hf.get("attention_bias")), "attention_bias=true: Kimi Linear's latent attention has no biases in "
                                         "redline"),
        ((hf.get("num_key_value_heads") or heads) != heads,
         f"num_key_value_heads={hf.get('num_key_value_heads')} with num_attention_heads={heads}: latent attention "
         f"expands its keys and values to every head (set them equal)"),
        (not hf.get("qk_rope_head_dim"), "qk_rope_head_dim=0: redline's latent attention takes a shared key part of "
                                         "each head (qk_rope_head_dim > 0)"),
        (hf.get("mla_use_nope") is False, "mla_use_nope=false: transformers' Kimi Linear (and redline) runs its "
                                          "latent attention without RoPE"),
        (_get(hf, "moe_router_activation_func", default="sigmoid") != "sigmoid",
         f"moe_router_activation_func={hf.get('moe_router_activation_func')!r}: Kimi Linear's router scores by "
         f"sigmoid (DeepSeek-V3's), as transformers runs it"),
    ])
    nope, rope = int(hf["qk_nope_head_dim"]), int(hf["qk_rope_head_dim"])
    v = int(hf.get("v_head_dim") or nope)
    if v > nope + rope:
        raise UserError(f"v_head_dim={v} wider than qk_nope_head_dim + qk_rope_head_dim={nope + rope}: redline's "
                        f"latent attention pads values up to the q/k head width, not keys up to the values'")
    width = int(linear.get("head_dim", hf.get("linear_head_dim", 128)))
    kinds = _layer_kinds(hf)
    experts = {  # DeepSeek-V3's names for the same router (deepseek._expert_fields)
        "num_hidden_layers": hf["num_hidden_layers"], "first_k_dense_replace": _dense_layers(hf),
        "n_routed_experts": _get(hf, "num_experts", "n_routed_experts", "num_local_experts"),
        "n_shared_experts": _get(hf, "num_shared_experts", "n_shared_experts", default=1),
        "num_experts_per_tok": _get(hf, "num_experts_per_token", "num_experts_per_tok", default=8),
        "n_group": _get(hf, "num_expert_group", "n_group", default=1), "topk_group": _get(hf, "topk_group"),
        "norm_topk_prob": _get(hf, "moe_renormalize", "norm_topk_prob", default=True),
        "routed_scaling_factor": _get(hf, "routed_scaling_factor", default=2.446),
        "moe_intermediate_size": hf.get("moe_intermediate_size"), "intermediate_size": hf["intermediate_size"]}
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=int(_get(hf, "model_max_length", "max_position_embeddings",
                                                          default=4096)),
        n_layer=hf["num_hidden_layers"], n_embd=hf["hidden_size"], n_head=heads, n_kv_head=heads,
        head_size=nope + rope, rope_dims=rope, kv_lora_rank=int(hf["kv_lora_rank"]),
        q_lora_rank=int(hf.get("q_lora_rank") or 0), v_head_dim=v if v != nope + rope else 0, pos_emb="none",
        fused_qkv=False, mlp="swiglu", fused_mlp=True, norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=False, bias=False,  # transformers' Kimi Linear ties no head (_tied_weights_keys {})
        delta_layers=tuple(i for i, k in enumerate(kinds) if k == "linear_attention"),
        delta_heads=int(linear.get("num_heads", hf.get("linear_num_heads", 32))),
        delta_key_heads=int(linear.get("num_heads", hf.get("linear_num_heads", 32))),
        delta_key_dim=width, delta_value_dim=width, delta_decay="channel", delta_gate_rank=width,
        delta_conv_kernel=int(linear.get("short_conv_kernel_size", hf.get("linear_conv_kernel_dim", 4))),
        **_expert_fields(experts, "deepseek_v3"))


def wants_kimi_linear(cfg: ModelConfig) -> bool:
    """Kimi Delta Attention's per-channel decays and low-rank gates, or latent attention without positions: Kimi
    Linear's alone."""
    return bool(cfg.delta_gate_rank) or bool(cfg.kv_lora_rank and cfg.pos_emb == "none" and cfg.attn_gate == "none")


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option Kimi Linear, the one architecture with Kimi Delta Attention, has not."""
    what = ("model.delta_gate_rank (Kimi Delta Attention through low-rank gates) or NoPE latent attention: Kimi "
            "Linear, the one architecture with them,")
    raise_first([
        (cfg.delta_layers and (cfg.delta_rule != "gated_delta" or cfg.delta_decay != "channel"
                               or not cfg.delta_gate_rank),
         f"{what} runs Kimi Delta Attention on its linear layers (model.delta_decay=channel, softplus decays, with "
         f"delta_gate_rank)"),
        (cfg.delta_layers and (cfg.delta_heads != cfg.delta_key_heads or cfg.delta_key_dim != cfg.delta_value_dim
                               or cfg.delta_gate_rank != cfg.delta_key_dim),
         f"{what} has as many key heads as value heads (model.delta_key_heads = delta_heads), keys and values of one "
         f"width (delta_key_dim = delta_value_dim) and gates of that rank (delta_gate_rank)"),
        (cfg.delta_beta_scale != 1.0 or cfg.delta_norm_eps not in (0.0, cfg.norm_eps) or cfg.delta_norm_position,
         f"{what} takes β as sigmoid gives it, its output norm at the blocks' epsilon, in pre-norm blocks (no "
         f"model.delta_beta_scale, delta_norm_eps or delta_norm_position)"),
        (len(cfg.delta_layers) < cfg.n_layer and not (cfg.kv_lora_rank and cfg.pos_emb == "none"),
         f"{what} attends on its other layers with latent attention without positions (model.kv_lora_rank, "
         f"pos_emb=none)"),
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine
         or cfg.parallel_residual or cfg.embed_norm or cfg.mlp_free_layers or cfg.mixer_free_layers,
         f"{what} has pre-norm RMSNorm blocks of both sublayers"),
        (cfg.mlp != "swiglu" or cfg.conv_layers, f"{what} has SwiGLU MLPs (or experts) and no convolution layers"),
        (cfg.sliding_window or cfg.attn_softcap or cfg.attn_sinks or cfg.attn_scale or cfg.logit_softcap
         or cfg.logit_divisor or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.head_bias
         or cfg.moe_bias or cfg.moe_layers or cfg.bias,
         f"{what} has no windows, soft caps, sinks, score scale, scalars or biases"),
        (cfg.moe_experts and (not cfg.moe_shared_hidden or cfg.moe_shared_gate
                              or cfg.moe_shared_hidden % cfg.hidden_dim),
         f"{what} runs an ungated shared expert a whole number of expert widths ({cfg.hidden_dim}) wide beside its "
         f"experts (model.moe_shared_hidden, moe_shared_gate=false)"),
        (cfg.moe_experts and (cfg.moe_gating != "sigmoid" or cfg.moe_norm_topk and cfg.moe_norm_eps != 1e-20),
         f"{what} routes as DeepSeek-V3 does: sigmoid scores (model.moe_gating), rescaled with 1e-20 added to their "
         f"sum (model.moe_norm_eps)"),
    ])


def hybrid_config(cfg: ModelConfig, model_type: str) -> dict:
    """The config.json entries Kimi Linear and Ling 3 (bailing_hybrid.py) name alike: widths, the latent
    attention's, the layers' kinds (KDA or latent attention; dense or experts), DeepSeek-V3's routing."""
    D, R = cfg.head_dim, cfg.rope_dims
    experts = cfg.moe_experts
    dense = cfg.moe_dense_layers if experts else cfg.n_layer
    return {
        "model_type": model_type, "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": (cfg.moe_dense_hidden or cfg.hidden_dim) if experts else cfg.hidden_dim,
        "moe_intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_head, "kv_lora_rank": cfg.kv_lora_rank,
        "q_lora_rank": cfg.q_lora_rank or None, "qk_rope_head_dim": R, "qk_nope_head_dim": D - R,
        "v_head_dim": cfg.v_head_dim or D, "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps,
        "model_max_length": cfg.context_len, "tie_word_embeddings": False, "attention_bias": False,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        "layer_types": ["linear_attention" if i in cfg.delta_layers else "full_attention" for i in range(cfg.n_layer)],
        "mlp_layer_types": ["dense" if i < dense else "sparse" for i in range(cfg.n_layer)],
        "first_k_dense_replace": dense,
        "num_experts": experts or 1, "num_experts_per_token": cfg.moe_top_k if experts else 1,
        "num_shared_experts": cfg.moe_shared_hidden // cfg.hidden_dim if experts else 1,
        "num_expert_group": cfg.moe_groups, "topk_group": cfg.moe_topk_groups, "moe_renormalize": cfg.moe_norm_topk,
        "routed_scaling_factor": cfg.moe_scale,
    }


def hf_config(cfg: ModelConfig) -> dict:
    return {**hybrid_config(cfg, "kimi_linear"), "linear_head_dim": cfg.delta_key_dim,
            "linear_num_heads": cfg.delta_heads, "linear_conv_kernel_dim": cfg.delta_conv_kernel}


class _EitherPrefix:
    """A TensorSource read under either name of a layer's MLP: the Hub's block_sparse_moe. (also on dense layers,
    as transformers writes them back) or transformers' mlp."""

    def __init__(self, src: TensorSource):
        self.src = src

    def _name(self, name: str) -> str:
        if name in self.src:
            return name
        other = (name.replace(".mlp.", ".block_sparse_moe.") if ".mlp." in name
                 else name.replace(".block_sparse_moe.", ".mlp."))
        return other if other in self.src else name

    def __contains__(self, name: str) -> bool:
        return self._name(name) in self.src

    def take(self, name: str) -> torch.Tensor:
        return self.src.take(self._name(name))


def _take_either(src: TensorSource, *names: str) -> torch.Tensor:
    """The first of `names` src holds (a UserError naming the first where none)."""
    return src.take(next((n for n in names if n in src), names[0]))


def kda_to_redline(src, a: str, r: str, projections: dict, gate: dict, gate_prefix: str | None = None) -> dict:
    """One Kimi Delta Attention layer's tensors (a: its attention's prefix, model.layers.N.<attention>.) as redline's
    (r: blocks.N.), Kimi Linear's and Ling 3's alike: q/k/v_proj into in_proj (3·H·Dk, C), the three q/k/v_conv1d
    (or transformers' in-memory conv1d, the three concatenated) into conv (channels, K), `projections` and the
    forget gate's `gate` projections (redline's name -> theirs), A_log (H,), dt_bias and o_norm. The forget gate's
    tensors are read under a, or under a + gate_prefix where the source holds them there."""
    def gate_take(name: str) -> torch.Tensor:
        return _take_either(src, a + name, *(() if gate_prefix is None else (a + gate_prefix + name,)))

    if a + "conv1d.weight" in src:  # transformers' in-memory layout: the three concatenated
        conv = src.take(a + "conv1d.weight")
    else:
        conv = torch.cat([src.take(f"{a}{x}_conv1d.weight") for x in "qkv"])
    out = {r + "attn.in_proj.weight": torch.cat([src.take(f"{a}{x}_proj.weight") for x in "qkv"]),
           r + "attn.conv": conv[:, 0]}  # (channels, 1, K) -> (channels, K)
    for ours, theirs in projections.items():
        out[f"{r}{ours}.weight"] = src.take(f"{a}{theirs}.weight")
    for ours, theirs in gate.items():
        out[f"{r}{ours}.weight"] = gate_take(f"{theirs}.weight")
    out[r + "attn.A_log"] = gate_take("A_log").reshape(-1)
    out[r + "attn.dt_bias"] = gate_take("dt_bias")
    out[r + "attn.norm"] = src.take(a + "o_norm.weight")
    return out


def kda_to_hf(state: Mapping[str, torch.Tensor], a: str, r: str, projections: dict, a_log_shape=None,
              dt_bias_shape=None) -> dict:
    """kda_to_redline's inverse: in_proj split into q/k/v_proj, conv into q/k/v_conv1d (channels, 1, K) each,
    `projections` (redline's name -> theirs, the forget gate's among them), A_log and dt_bias (in the shapes given,
    else as redline holds them), o_norm."""
    out = {}
    for x, w in zip("qkv", state[r + "attn.in_proj.weight"].chunk(3)):
        out[f"{a}{x}_proj.weight"] = w
    for x, w in zip("qkv", state[r + "attn.conv"].chunk(3)):
        out[f"{a}{x}_conv1d.weight"] = w[:, None]
    for ours, theirs in projections.items():
        out[f"{a}{theirs}.weight"] = state[f"{r}{ours}.weight"]
    a_log, dt_bias = state[r + "attn.A_log"], state[r + "attn.dt_bias"]
    out[a + "A_log"] = a_log if a_log_shape is None else a_log.reshape(a_log_shape)
    out[a + "dt_bias"] = dt_bias if dt_bias_shape is None else dt_bias.reshape(dt_bias_shape)
    out[a + "o_norm.weight"] = state[r + "attn.norm"]
    return out


def kda_in_proj_parts(a: str, cfg: ModelConfig) -> list:
    """PEFT's modules for a KDA layer's in_proj: q/k/v_proj under a, each with its rows."""
    width = cfg.delta_heads * cfg.delta_key_dim
    return [(f"{a}{x}_proj", slice(j * width, (j + 1) * width)) for j, x in enumerate("qkv")]


def to_redline(source: TensorSource, cfg: ModelConfig) -> dict:
    from redline.interop.moe import deepseek_experts_to_redline

    src = _EitherPrefix(source)
    out = {"norm_f.weight": src.take("model.norm.weight"),
           "wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        a = p + "self_attn."
        if i in cfg.delta_layers:
            out.update(kda_to_redline(src, a, r, _KDA, _GATE, gate_prefix="forget_gate."))
        else:
            skip = ("q",) if cfg.q_lora_rank else ("q_a", "q_a_norm", "q_b")
            for ours, theirs in _MLA.items():
                if ours not in skip:
                    out[f"{r}attn.{ours}.weight"] = src.take(f"{a}{theirs}.weight")
        if cfg.layer_has_experts(i):
            out.update(deepseek_experts_to_redline(src, p, r, cfg))
        else:
            out[r + "mlp.fc.weight"] = torch.cat([src.take(p + "mlp.gate_proj.weight"),
                                                  src.take(p + "mlp.up_proj.weight")])
            out[r + "mlp.proj.weight"] = src.take(p + "mlp.down_proj.weight")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """redline's tensors -> the Hub's names (transformers' conversion mapping stacks and renames them on loading)."""
    from dataclasses import replace

    from redline.interop.moe import experts_to_hf

    out = {"model.norm.weight": state["norm_f.weight"],
           "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size],  # a tied head written as its own
           "lm_head.weight": state["wte.weight" if cfg.tie_embeddings else "lm_head.weight"][:cfg.vocab_size].clone()}
    H, D = cfg.delta_heads, cfg.delta_key_dim
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
        a = p + "self_attn."
        if i in cfg.delta_layers:
            out.update(kda_to_hf(state, a, r, {**_KDA, **_GATE}, a_log_shape=(1, 1, H, 1), dt_bias_shape=H * D))
        else:
            skip = ("q",) if cfg.q_lora_rank else ("q_a", "q_a_norm", "q_b")
            for ours, theirs in _MLA.items():
                if ours not in skip:
                    out[f"{a}{theirs}.weight"] = state[f"{r}attn.{ours}.weight"]
        if not cfg.layer_has_experts(i):
            m = p + "mlp."
            out[m + "gate_proj.weight"], out[m + "up_proj.weight"] = state[r + "mlp.fc.weight"].chunk(2)
            out[m + "down_proj.weight"] = state[r + "mlp.proj.weight"]
            continue
        # Mixtral's names for the router and experts, then the choosing bias (zeros where redline has none: they
        # choose as no bias does) and the shared experts beside them
        out.update(experts_to_hf(state, p, r, replace(cfg, moe_expert_bias=False, moe_shared_hidden=0), "mixtral"))
        moe = p + "block_sparse_moe."
        bias = state.get(f"{r}mlp.expert_bias")
        out[moe + "gate.e_score_correction_bias"] = torch.zeros(cfg.moe_experts) if bias is None else bias.float()
        shared = moe + "shared_experts."
        out[shared + "gate_proj.weight"], out[shared + "up_proj.weight"] = state[f"{r}mlp.shared.fc.weight"].chunk(2)
        out[shared + "down_proj.weight"] = state[f"{r}mlp.shared.proj.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def adapter_parts(layer: str, rest: str, base: str, out_features: int, cfg: ModelConfig):
    """PEFT's modules for redline layer `layer` (rest: its name after blocks.N.; base: "model.layers.N."), each with
    its rows, under transformers' in-memory module paths: a KDA layer's q/k/v (in_proj's rows), b_proj, g_a_proj,
    g_b_proj, forget_gate.f_a_proj / f_b_proj and o_proj, the latent attention's DeepSeek names; a UserError for the
    MLPs (PEFT moves gate/up/down_proj adapters onto the experts)."""
    i = int(base.split(".")[2])
    if rest.startswith("attn.") and i in cfg.delta_layers:
        if rest == "attn.in_proj":
            return kda_in_proj_parts(base + "self_attn.", cfg)
        if rest in _KDA:
            return [(f"{base}self_attn.{_KDA[rest]}", slice(0, out_features))]
        if rest in _GATE:
            return [(f"{base}self_attn.forget_gate.{_GATE[rest]}", slice(0, out_features))]
    elif rest.startswith("attn."):
        module = rest[len("attn."):]
        if module in _MLA and not module.endswith("_norm"):
            return [(f"{base}self_attn.{_MLA[module]}", slice(0, out_features))]
    raise UserError(f"the adapter on {layer} has no counterpart PEFT loads onto KimiLinearForCausalLM (the MLPs, "
                    f"whose gate_proj / up_proj / down_proj adapters PEFT moves onto the experts); train with "
                    f"lora.targets attn.* or export with --merge")


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


FAMILY = Family(name="kimi_linear", architecture="KimiLinearForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
