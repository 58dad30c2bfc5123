"""Ling 3 (BailingHybridForCausalLM, model_type "bailing_hybrid": inclusionAI's Ling-3.0-Flash): Kimi Delta Attention
with full-rank gates and a bounded decay beside DeepSeek-V3's latent attention with a gate on each head, DeepSeek-V3's
mixture of experts on its MLPs, as transformers' models/bailing_hybrid computes it.

- linear_attention layers (all but every layer_group_size-th): Kimi Delta Attention (redline's GatedDeltaNet with
  model.delta_decay), q, k and v of num_attention_heads heads of head_dim through their causal convolutions; the decay
  one per key channel, kda_lower_bound·sigmoid(exp(A_log)·(f_proj(x) + dt_bias)) where kda_safe_gate (its default:
  delta_decay=bounded, delta_decay_floor), −exp(A_log)·softplus(f_proj(x) + dt_bias) otherwise (channel), f_proj
  full-rank (delta_gate_rank 0); the output RMS-normalized per head (o_norm) times sigmoid(g_proj(x)), then o_proj;
- full_attention layers: DeepSeek-V3's latent attention, RoPE on interleaved pairs of the qk_rope_head_dim part (its
  rows permuted into redline's halves on import and back on export, as deepseek.py does), each head's output times
  sigmoid(g_proj(x)) (model.attn_gate=head) before o_proj;
- MLPs: dense SwiGLU on the first layers (mlp_layer_types, else first_k_dense_replace), DeepSeek-V3's experts and
  router on the rest (sigmoid scores, a choosing bias, topk_group of num_expert_group groups, rescaled where
  moe_renormalize, times routed_scaling_factor, num_shared_experts ungated shared experts).

The Hub's names (as transformers' save_pretrained writes them back): model.word_embeddings, layers.N.attention.*
with o_proj as `dense`, the forget gate's f_proj / dt_bias / A_log beside the projections, the convolutions apart
(q_conv1d, k_conv1d, v_conv1d), the routing bias as mlp.gate.expert_bias, one tensor per expert; transformers'
in-memory names are read as well. Exports write the Hub's. No head is tied (transformers' _tied_weights_keys is
empty); the multi-token-prediction layers past the last are left out, as transformers leaves them. Refused by name:
attention_bias, num_key_value_heads other than the heads, a RoPE scaling, dense layers after sparse ones.
Semantics read from transformers' models/bailing_hybrid/modular_bailing_hybrid.py and its conversion mapping.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, pad_rows, raise_first
from redline.interop.llama import check_silu
from redline.model import ModelConfig

_MLA = {"q_a": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b": "q_b_proj", "q": "q_proj",
        "kv_a": "kv_a_proj_with_mqa", "kv_a_norm": "kv_a_layernorm", "kv_b": "kv_b_proj", "proj": "dense",
        "gate": "g_proj"}
"""redline's LatentAttention modules -> the Hub's (after attention.)."""
_KDA = {"attn.b": "b_proj", "attn.z": "g_proj", "attn.proj": "dense"}
"""redline's KDA projections -> the Hub's (after attention.), besides q/k/v and the forget gate's."""
_GATE = {"attn.a": "f_proj"}
"""The forget gate's projection: under attention. in the Hub's files, self_attn.forget_gate. in transformers'."""
_TO_MEMORY = ((".attention.dense.", ".self_attn.o_proj."), (".attention.f_proj.", ".self_attn.forget_gate.f_proj."),
              (".attention.dt_bias", ".self_attn.forget_gate.dt_bias"),
              (".attention.A_log", ".self_attn.forget_gate.A_log"), (".attention.", ".self_attn."),
              ("model.word_embeddings.", "model.embed_tokens."),
              (".gate.expert_bias", ".gate.e_score_correction_bias"))
"""The Hub's names -> transformers' in-memory ones (its conversion mapping's renames), in order."""


def _in_memory(name: str) -> str:
    for hub, memory in _TO_MEMORY:
        if hub in name:
            return name.replace(hub, memory)
    return name


def _on_hub(name: str) -> str:
    for hub, memory in _TO_MEMORY:
        if memory in name:
            return name.replace(memory, hub)
    return name


class _EitherNames:
    """A TensorSource read by the Hub's names or transformers' in-memory ones, whichever the folder holds."""

    def __init__(self, src: TensorSource):
        self.src = src

    def _name(self, name: str) -> str:
        return next((n for n in (name, _in_memory(name), _on_hub(name)) if n in self.src), name)

    def __contains__(self, name: str) -> bool:
        return self._name(name) in self.src

    def take(self, name: str) -> torch.Tensor:
        return self.src.take(self._name(name))


def _get(hf: dict, *names, default=None):
    """The first of `names` hf gives (BailingHybridConfig's attribute_map: both spellings)."""
    return next((hf[n] for n in names if hf.get(n) is not None), default)


def model_config(hf: dict) -> ModelConfig:
    from redline.interop.deepseek import _expert_fields
    from redline.interop.kimi_linear import _dense_layers

    check_silu(hf)
    heads, n = hf["num_attention_heads"], hf["num_hidden_layers"]
    params = dict(hf.get("rope_parameters") or {})
    kind = params.get("rope_type", params.get("type", "default"))
    raise_first([
        (bool(hf.get("attention_bias")), "attention_bias=true: Ling 3's latent attention has no biases in redline"),
        ((hf.get("num_key_value_heads") or heads) != heads,
         f"num_key_value_heads={hf.get('num_key_value_heads')} with num_attention_heads={heads}: latent attention "
         f"expands its keys and values to every head (set them equal)"),
        (kind != "default" or hf.get("rope_scaling"),
         f"rope_parameters.rope_type={kind!r}: redline reads Ling 3's unscaled RoPE only"),
        (not hf.get("qk_rope_head_dim", 64), "qk_rope_head_dim=0: redline's latent attention rotates a key part every "
                                             "head shares (qk_rope_head_dim > 0)"),
    ])
    size = int(hf.get("layer_group_size") or 6)
    kinds = hf.get("layer_types") or ["full_attention" if (i + 1) % size == 0 else "linear_attention"
                                      for i in range(n)]
    if len(kinds) != n or not set(kinds) <= {"linear_attention", "full_attention"}:
        raise UserError(f"layer_types {kinds}: Ling 3 takes {n} entries, each linear_attention or full_attention")
    nope, rope = int(hf.get("qk_nope_head_dim", 128)), int(hf.get("qk_rope_head_dim", 64))
    v = int(hf.get("v_head_dim") or 128)
    if v > nope + rope:
        raise UserError(f"v_head_dim={v} wider than qk_nope_head_dim + qk_rope_head_dim={nope + rope}: redline's "
                        f"latent attention pads values up to the q/k head width, not keys up to the values'")
    width = int(hf.get("head_dim") or 128)
    safe = bool(hf.get("kda_safe_gate", True))
    experts = {  # DeepSeek-V3's names for the same router (deepseek._expert_fields)
        "num_hidden_layers": n, "first_k_dense_replace": _dense_layers({"first_k_dense_replace": 2, **hf}),
        "n_routed_experts": _get(hf, "num_experts", "num_local_experts", "n_routed_experts", default=512),
        "n_shared_experts": _get(hf, "num_shared_experts", "n_shared_experts", default=1),
        "num_experts_per_tok": _get(hf, "num_experts_per_token", "num_experts_per_tok", default=8),
        "n_group": _get(hf, "num_expert_group", "n_group", default=8), "topk_group": _get(hf, "topk_group", default=4),
        "norm_topk_prob": _get(hf, "moe_renormalize", "norm_topk_prob", default=True),
        "routed_scaling_factor": _get(hf, "routed_scaling_factor", default=2.5),
        "moe_intermediate_size": hf.get("moe_intermediate_size", 768), "intermediate_size": hf["intermediate_size"]}
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=int(_get(hf, "model_max_length", "max_position_embeddings",
                                                          default=4096)),
        n_layer=n, n_embd=hf["hidden_size"], n_head=heads, n_kv_head=heads, head_size=nope + rope, rope_dims=rope,
        kv_lora_rank=int(hf.get("kv_lora_rank", 512)), q_lora_rank=int(hf.get("q_lora_rank") or 0),
        v_head_dim=v if v != nope + rope else 0, pos_emb="rope",
        rope_theta=float(params.get("rope_theta", hf.get("rope_theta", 6_000_000.0))), attn_gate="head",
        fused_qkv=False, mlp="swiglu", fused_mlp=True, norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=False, bias=False,  # transformers' BailingHybridForCausalLM ties no head
        delta_layers=tuple(i for i, k in enumerate(kinds) if k == "linear_attention"), delta_heads=heads,
        delta_key_heads=heads, delta_key_dim=width, delta_value_dim=width,
        delta_conv_kernel=int(_get(hf, "short_conv_kernel_size", "linear_conv_kernel_dim", default=4)),
        delta_decay="bounded" if safe else "channel",
        delta_decay_floor=float(hf.get("kda_lower_bound", -5.0)) if safe else 0.0,
        **_expert_fields(experts, "deepseek_v3"))


def wants_bailing_hybrid(cfg: ModelConfig) -> bool:
    """A bounded KDA decay, full-rank KDA gates, or latent attention with a gate on each head: Ling 3's alone."""
    return (cfg.delta_decay == "bounded" or (cfg.delta_decay == "channel" and not cfg.delta_gate_rank)
            or bool(cfg.kv_lora_rank and cfg.attn_gate == "head"))


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option Ling 3 (BailingHybridForCausalLM) has not."""
    what = "Ling 3 (BailingHybridForCausalLM), the one architecture with full-rank or bounded KDA gates,"
    raise_first([
        (not cfg.delta_layers or cfg.delta_decay == "head" or cfg.delta_gate_rank or cfg.delta_heads != cfg.n_head
         or cfg.delta_key_heads != cfg.n_head or cfg.delta_key_dim != cfg.delta_value_dim,
         f"{what} runs Kimi Delta Attention with full-rank gates (model.delta_decay channel or bounded, "
         f"delta_gate_rank 0) on its linear layers, as many heads as its attention (delta_heads = delta_key_heads = "
         f"n_head) of one width"),
        (cfg.delta_beta_scale != 1.0 or cfg.delta_norm_eps not in (0.0, cfg.norm_eps) or cfg.delta_norm_position,
         f"{what} takes β as sigmoid gives it, its output norm at the blocks' epsilon, in pre-norm blocks"),
        (len(cfg.delta_layers) < cfg.n_layer and not (cfg.kv_lora_rank and cfg.pos_emb == "rope"
                                                     and cfg.attn_gate == "head"),
         f"{what} attends on its other layers with latent attention under RoPE, its heads gated (model.kv_lora_rank, "
         f"attn_gate=head)"),
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine
         or cfg.parallel_residual or cfg.embed_norm or cfg.mlp_free_layers or cfg.mixer_free_layers
         or cfg.mlp != "swiglu" or cfg.conv_layers, f"{what} has pre-norm RMSNorm blocks of both sublayers, SwiGLU"),
        (cfg.latent_key_norm or cfg.latent_norm_eps, f"{what} has no norm on the RoPE key part and normalizes its "
                                                      f"latents at 1e-6"),
        (cfg.sliding_window or cfg.attn_softcap or cfg.attn_sinks or cfg.attn_scale or cfg.logit_softcap
         or cfg.logit_divisor or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.head_bias
         or cfg.moe_bias or cfg.moe_layers or cfg.bias or cfg.rope_scaling != "none",
         f"{what} has no windows, soft caps, sinks, score scale, scalars, biases or RoPE scaling"),
        (cfg.moe_experts and (not cfg.moe_shared_hidden or cfg.moe_shared_gate
                              or cfg.moe_shared_hidden % cfg.hidden_dim or cfg.moe_gating != "sigmoid"
                              or (cfg.moe_norm_topk and cfg.moe_norm_eps != 1e-20)),
         f"{what} routes as DeepSeek-V3 does (sigmoid scores rescaled with 1e-20, model.moe_norm_eps) beside an "
         f"ungated shared expert a whole number of expert widths wide"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    from redline.interop.kimi_linear import hybrid_config

    return {**hybrid_config(cfg, "bailing_hybrid"), "head_dim": cfg.delta_key_dim,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "short_conv_kernel_size": cfg.delta_conv_kernel, "kda_safe_gate": cfg.delta_decay == "bounded",
            "kda_lower_bound": cfg.delta_decay_floor or -5.0, "num_nextn_predict_layers": 0}


def _rotated_rows(state: dict, cfg: ModelConfig, inverse: bool) -> dict:
    """The attention layers' rotated rows of q_b (q) and kv_a from the interleaved pair order to redline's halves
    (inverse) or back (deepseek.py's permutation)."""
    from redline.interop.deepseek import kv_rope_rows, q_rope_rows

    for i in range(cfg.n_layer):
        if i in cfg.delta_layers:
            continue
        r = f"blocks.{i}.attn."
        q = r + ("q_b.weight" if cfg.q_lora_rank else "q.weight")
        state[q] = q_rope_rows(state[q], cfg, inverse)
        state[r + "kv_a.weight"] = kv_rope_rows(state[r + "kv_a.weight"], cfg, inverse)
    return state


def _modules(cfg: ModelConfig) -> list[str]:
    skip = ("q",) if cfg.q_lora_rank else ("q_a", "q_a_norm", "q_b")
    return [m for m in _MLA if m not in skip]


def to_redline(source: TensorSource, cfg: ModelConfig) -> dict:
    from redline.interop.kimi_linear import kda_to_redline
    from redline.interop.moe import deepseek_experts_to_redline

    src = _EitherNames(source)
    out = {"norm_f.weight": src.take("model.norm.weight"),
           "wte.weight": pad_rows(src.take("model.word_embeddings.weight"), cfg),
           "lm_head.weight": pad_rows(src.take("lm_head.weight"), cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        a = p + "attention."
        if i in cfg.delta_layers:  # (_EitherNames finds the forget gate's under either name)
            out.update(kda_to_redline(src, a, r, _KDA, _GATE))
        else:
            for ours in _modules(cfg):
                out[f"{r}attn.{ours}.weight"] = src.take(f"{a}{_MLA[ours]}.weight")
        if cfg.layer_has_experts(i):
            out.update(deepseek_experts_to_redline(src, p, r, cfg))
        else:
            out[r + "mlp.fc.weight"] = torch.cat([src.take(p + "mlp.gate_proj.weight"),
                                                  src.take(p + "mlp.up_proj.weight")])
            out[r + "mlp.proj.weight"] = src.take(p + "mlp.down_proj.weight")
    # the multi-token-prediction layers past the last (num_mtp_layers of them): no part of the causal LM
    # (transformers ignores them too)
    source.used.update(n for n in source.names if n.startswith("model.layers.")
                       and int(n.split(".")[2]) >= cfg.n_layer)
    return _rotated_rows(out, cfg, inverse=True)


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    from dataclasses import replace

    from redline.interop.kimi_linear import kda_to_hf
    from redline.interop.moe import experts_to_hf

    state = _rotated_rows(dict(state), cfg, inverse=False)
    V = cfg.vocab_size
    out = {"model.norm.weight": state["norm_f.weight"], "model.word_embeddings.weight": state["wte.weight"][:V],
           "lm_head.weight": state["wte.weight" if cfg.tie_embeddings else "lm_head.weight"][:V].clone()}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
        a = p + "attention."
        if i in cfg.delta_layers:
            out.update(kda_to_hf(state, a, r, {**_KDA, **_GATE}))
        else:
            for ours in _modules(cfg):
                out[f"{a}{_MLA[ours]}.weight"] = state[f"{r}attn.{ours}.weight"]
        m = p + "mlp."
        if not cfg.layer_has_experts(i):
            out[m + "gate_proj.weight"], out[m + "up_proj.weight"] = state[r + "mlp.fc.weight"].chunk(2)
            out[m + "down_proj.weight"] = state[r + "mlp.proj.weight"]
            continue
        out.update(experts_to_hf(state, p, r, replace(cfg, moe_expert_bias=False, moe_shared_hidden=0), "qwen3_moe"))
        bias = state.get(f"{r}mlp.expert_bias")  # zeros where redline has none: they choose as no bias does
        out[m + "gate.expert_bias"] = torch.zeros(cfg.moe_experts) if bias is None else bias.float()
        shared = m + "shared_experts."
        out[shared + "gate_proj.weight"], out[shared + "up_proj.weight"] = state[f"{r}mlp.shared.fc.weight"].chunk(2)
        out[shared + "down_proj.weight"] = state[f"{r}mlp.shared.proj.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def adapter_parts(layer: str, rest: str, base: str, out_features: int, cfg: ModelConfig):
    """PEFT's modules for redline layer `layer` (rest: its name after blocks.N.; base: "model.layers.N."), each with
    its rows, under transformers' in-memory names (the module paths PEFT adapts): a KDA layer's q/k/v (in_proj's
    rows), b_proj, g_proj, forget_gate.f_proj and o_proj; the latent attention's, their rotated rows interleaved again
    as to_hf writes them; a UserError for the MLPs (PEFT moves gate/up/down_proj adapters onto the experts)."""
    from redline.interop.deepseek import kv_rope_rows, q_rope_rows
    from redline.interop.kimi_linear import kda_in_proj_parts

    i, a = int(base.split(".")[2]), base + "self_attn."
    kda = {"attn.b": "b_proj", "attn.z": "g_proj", "attn.a": "forget_gate.f_proj", "attn.proj": "o_proj"}
    if rest.startswith("attn.") and i in cfg.delta_layers:
        if rest == "attn.in_proj":
            return kda_in_proj_parts(a, cfg)
        if rest in kda:
            return [(a + kda[rest], slice(0, out_features))]
    elif rest.startswith("attn."):
        module = rest[len("attn."):]
        if module in _MLA and not module.endswith("_norm"):
            rows = torch.arange(out_features)
            if module in ("q", "q_b"):
                rows = q_rope_rows(rows[:, None], cfg, inverse=False)[:, 0]
            elif module == "kv_a":
                rows = kv_rope_rows(rows, cfg, inverse=False)
            name = "o_proj" if module == "proj" else _MLA[module]
            return [(a + name, rows)]
    raise UserError(f"the adapter on {layer} has no counterpart PEFT loads onto BailingHybridForCausalLM (the MLPs, "
                    f"whose gate_proj / up_proj / down_proj adapters PEFT moves onto the experts); train with "
                    f"lora.targets attn.* or export with --merge")


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


FAMILY = Family(name="bailing_hybrid", architecture="BailingHybridForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
