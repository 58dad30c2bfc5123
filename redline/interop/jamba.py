"""Jamba (AI21's JambaForCausalLM, model_type "jamba": ai21labs/Jamba-v0.1, AI21-Jamba-1.5-Mini,
AI21-Jamba-Reasoning-3B, Jamba-tiny-dev). Semantics read from transformers' models/jamba/modeling_jamba.py and
configuration_jamba.py (Lieber et al. 2024).

Every layer is pre-RMSNorm: x = x + mixer(input_layernorm(x)); x = x + feed_forward(pre_ff_layernorm(x)). The mixer
is attention on layers i with i % attn_layer_period == attn_layer_offset (or where a layers_block_type list says
"attention"), a Mamba-1 mixer on the others (model.delta_layers with delta_rule=mamba1): Mamba's (mamba.py's weight
names under mamba.) with RMSNorms *with weights* on dt (R), B and C (N) after x_proj, at rms_norm_eps
(model.delta_bcdt_norm_eps = norm_eps, model.delta_bcdt_norm_weight; redline's attn.dt_norm, B_norm, C_norm). Its
inner width is mamba_expand · hidden_size, its dt rank mamba_dt_rank ("auto": ceil(hidden_size / 16)). Attention has
no positional encoding (model.pos_emb=none), GQA, scores scaled by 1/sqrt(head_dim), no biases.

The feed_forward is a SwiGLU (gate_proj, up_proj, down_proj) or, on layers i with i % expert_layer_period ==
expert_layer_offset (or where layers_num_experts gives more than one), a mixture of num_experts SwiGLU experts of the
same intermediate_size: a router (feed_forward.router, (E, C), no bias) whose softmax's top num_experts_per_tok are
the experts' weights, not renormalized (model.moe_norm_topk=false) (model.moe_layers: the layers with experts).
Checkpoints hold one tensor per expert (feed_forward.experts.j.gate_proj / up_proj / down_proj), which transformers
stacks as it loads them; files with them stacked already (experts.gate_up_proj (E, 2F, C), experts.down_proj
(E, C, F)) are read too. Exports write one per expert.

Read and not refused: use_mamba_kernels, use_mambapy, use_associative_scan (implementation choices), the
initialisation fields; output_router_logits with router_aux_loss_coef becomes model.moe_aux_loss. Refused by name:
hidden_act other than silu. Export refuses what Jamba cannot express (check_exportable), among them layer kinds or
expert layers that no (period, offset) pair lays out, and Mamba-1 layers without the dt, B and C norms (Mamba's) or
with an epsilon apart from the blocks' norms'. Norms without weights (Falcon-Mamba's) are written as weights of one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, raise_first
from redline.interop.granite import _mixer_to_redline, bamba_outside_to_hf, bamba_outside_to_redline
from redline.interop.llama import _mlp_parts, _qkv, shape_fields
from redline.interop.mamba import BCDT_NORMS, mixer_to_hf, mixer_to_redline
from redline.model import ModelConfig

# JambaConfig's defaults for what a config.json may leave out
_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 262144,
             "num_experts_per_tok": 2, "num_experts": 16, "expert_layer_period": 2, "expert_layer_offset": 1,
             "attn_layer_period": 8, "attn_layer_offset": 4, "mamba_d_state": 16, "mamba_d_conv": 4,
             "mamba_expand": 2, "mamba_dt_rank": "auto", "mamba_conv_bias": True, "mamba_proj_bias": False,
             "hidden_act": "silu"}


def _periodic(n: int, period: int, offset: int, what: str) -> list[int]:
    if not 0 <= offset < period:
        raise UserError(f"{what}_offset={offset} with {what}_period={period}: Jamba takes 0 <= offset < period")
    return [i for i in range(n) if i % period == offset]


def _attention_layers(hf: dict, n: int) -> list[int]:
    """The layers whose mixer is attention: a layers_block_type list where the config gives one (newer configs),
    else every attn_layer_period-th from attn_layer_offset (JambaConfig.layers_block_type)."""
    kinds = hf.get("layers_block_type")
    if isinstance(kinds, list):
        if len(kinds) != n or set(kinds) - {"attention", "mamba"}:
            raise UserError(f"layers_block_type={kinds}: Jamba takes num_hidden_layers={n} entries, each "
                            f"\"attention\" or \"mamba\"")
        return [i for i, kind in enumerate(kinds) if kind == "attention"]
    return _periodic(n, int(hf["attn_layer_period"]), int(hf["attn_layer_offset"]), "attn_layer")


def _expert_layers(hf: dict, n: int) -> list[int]:
    """The layers whose feed_forward is the mixture: a layers_num_experts list where the config gives one, else
    every expert_layer_period-th from expert_layer_offset (JambaConfig.layers_num_experts), none with one expert."""
    counts = hf.get("layers_num_experts")
    if isinstance(counts, list):
        if len(counts) != n or set(counts) - {1, int(hf["num_experts"])}:
            raise UserError(f"layers_num_experts={counts}: Jamba takes num_hidden_layers={n} entries, each 1 or "
                            f"num_experts={hf['num_experts']}")
        layers = [i for i, c in enumerate(counts) if c > 1]
    else:
        layers = _periodic(n, int(hf["expert_layer_period"]), int(hf["expert_layer_offset"]), "expert_layer")
    return layers if int(hf["num_experts"]) > 1 else []


def model_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    if hf["hidden_act"] not in ("silu", "swish"):
        raise UserError(f"hidden_act={hf['hidden_act']!r}: Jamba's MLPs and Mamba convolution run SiLU, the one "
                        f"redline runs there; only hidden_act=silu models are supported")
    n, width = int(hf["num_hidden_layers"]), int(hf["hidden_size"])
    attention, experts = _attention_layers(hf, n), _expert_layers(hf, n)
    rank = hf["mamba_dt_rank"]
    rank = math.ceil(width / 16) if rank == "auto" else int(rank)
    eps = float(hf["rms_norm_eps"])
    moe = {}
    if experts:
        aux = float(hf.get("router_aux_loss_coef") or 0.0) if hf.get("output_router_logits") else 0.0
        moe = dict(moe_experts=int(hf["num_experts"]), moe_top_k=int(hf["num_experts_per_tok"]),
                   moe_norm_topk=False, moe_aux_loss=aux,
                   moe_layers=() if len(experts) == n else tuple(experts))  # (): every layer
    return ModelConfig(
        **shape_fields(hf, context_len=int(hf["max_position_embeddings"])), pos_emb="none", fused_qkv=True,
        mlp="swiglu", fused_mlp=True, norm="rmsnorm", norm_eps=eps, bias=False,
        tie_embeddings=bool(hf["tie_word_embeddings"]),
        delta_layers=tuple(i for i in range(n) if i not in attention), delta_rule="mamba1",
        delta_heads=int(hf["mamba_expand"]) * width, delta_key_heads=1, delta_value_dim=1,
        delta_key_dim=int(hf["mamba_d_state"]), delta_conv_kernel=int(hf["mamba_d_conv"]),
        delta_conv_bias=bool(hf["mamba_conv_bias"]), delta_proj_bias=bool(hf["mamba_proj_bias"]),
        delta_dt_rank=rank, delta_bcdt_norm_eps=eps, delta_bcdt_norm_weight=True, **moe)


def _ffn_names(i: int) -> tuple[str, str, str]:
    """(HF layer prefix, HF feed_forward prefix, redline block prefix) of layer i."""
    return f"model.layers.{i}.", f"model.layers.{i}.feed_forward.", f"blocks.{i}."


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = bamba_outside_to_redline(src, cfg)  # final_layernorm, embed_tokens, lm_head: Bamba's names
    for i in range(cfg.n_layer):
        p, f, r = _ffn_names(i)
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "pre_ff_layernorm.weight")
        if i in cfg.delta_layers:
            out.update(mixer_to_redline(src, p + "mamba.", r + "attn.", cfg))
        else:  # self_attn.q/k/v/o_proj: Granite 4.0's attention layers' names
            out.update(_mixer_to_redline(src, cfg, i, recurrent=False))
        if not cfg.layer_has_experts(i):
            out[r + "mlp.fc.weight"] = torch.cat([src.take(f + "gate_proj.weight"), src.take(f + "up_proj.weight")])
            out[r + "mlp.proj.weight"] = src.take(f + "down_proj.weight")
            continue
        out[r + "mlp.router.weight"] = src.take(f + "router.weight")
        e = f + "experts."
        if e + "gate_up_proj" in src:  # stacked already: (E, 2F, C) rows [gate; up] as redline's, (E, C, F)
            out[r + "mlp.fc"], out[r + "mlp.proj"] = src.take(e + "gate_up_proj"), src.take(e + "down_proj")
        else:  # one tensor per expert, the Hub's layout
            x = [f"{e}{j}." for j in range(cfg.moe_experts)]
            out[r + "mlp.fc"] = torch.stack([torch.cat([src.take(k + "gate_proj.weight"),
                                                        src.take(k + "up_proj.weight")]) for k in x])
            out[r + "mlp.proj"] = torch.stack([src.take(k + "down_proj.weight") for k in x])
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = bamba_outside_to_hf(state, cfg)
    for i in range(cfg.n_layer):
        p, f, r = _ffn_names(i)
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "pre_ff_layernorm.weight"] = state[r + "norm2.weight"]
        if i in cfg.delta_layers:
            m, a = p + "mamba.", r + "attn."
            out.update(mixer_to_hf(state, m, a, cfg))
            for ours, theirs in BCDT_NORMS.items():  # weightless norms (Falcon-Mamba's): the same norm times one
                out[f"{m}{theirs}.weight"] = (state[a + ours] if cfg.delta_bcdt_norm_weight
                                              else state[a + "D"].new_ones(cfg.dt_rank if ours == "dt_norm"
                                                                           else cfg.delta_key_dim))
        else:  # q/k/v from redline's fused qkv or its separate layers
            a = p + "self_attn."
            out.update({f"{a}{x}_proj.weight": t for x, t in zip("qkv", _qkv(state, r, cfg, "weight"))})
            out[a + "o_proj.weight"] = state[r + "attn.proj.weight"]
        if not cfg.layer_has_experts(i):
            out[f + "gate_proj.weight"], out[f + "up_proj.weight"] = _mlp_parts(state, r, cfg, "weight")
            out[f + "down_proj.weight"] = state[r + "mlp.proj.weight"]
            continue
        out[f + "router.weight"] = state[r + "mlp.router.weight"]
        for j, (fc, proj) in enumerate(zip(state[r + "mlp.fc"], state[r + "mlp.proj"])):
            k = f"{f}experts.{j}."
            out[k + "gate_proj.weight"], out[k + "up_proj.weight"] = fc.chunk(2)
            out[k + "down_proj.weight"] = proj
    return {k: v.contiguous() for k, v in out.items()}


def _period(layers: list[int], n: int) -> tuple[int, int] | None:
    """(period, offset) with {i < n : i % period == offset} == layers and offset < period, or None where no pair
    lays them out (no layers: an offset no layer reaches)."""
    if not layers:
        return n + 1, n
    offset = layers[0]
    for period in range(offset + 1, n + 1):
        if [i for i in range(n) if i % period == offset] == layers:
            return period, offset
    return None


def wants_jamba(cfg: ModelConfig) -> bool:
    """A model with Mamba-1 layers that Mamba and Falcon-Mamba cannot hold and Jamba may: attention or an MLP on
    some layer, weights on the dt, B and C norms, or experts."""
    return cfg.delta_rule == "mamba1" and bool(cfg.delta_layers) and (
        set(range(cfg.n_layer)) != set(cfg.delta_layers) or set(range(cfg.n_layer)) != set(cfg.mlp_free_layers)
        or cfg.delta_bcdt_norm_weight or bool(cfg.moe_experts))


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a Mamba-1 model that Jamba, the one architecture with Mamba-1 layers beside
    attention or MLPs that redline exports to, does not have."""
    what = "Jamba, the architecture with Mamba-1 layers beside attention and MLPs,"
    n = cfg.n_layer
    attention = [i for i in range(n) if i not in cfg.delta_layers]
    experts = [i for i in range(n) if cfg.layer_has_experts(i)]
    named = [(name, getattr(cfg, name)) for name in (
        "mlp_free_layers", "mixer_free_layers", "conv_layers", "delta_parallel", "qk_norm", "attn_sinks",
        "sliding_window", "window_layers", "value_embeddings", "embed_norm", "embed_scale", "embed_multiplier",
        "residual_multiplier", "logit_divisor", "logit_softcap", "attn_softcap", "attn_scale", "head_bias",
        "norm_unit_offset", "bias", "moe_shared_hidden", "moe_expert_bias", "moe_bias")]
    raise_first([(bool(value), f"model.{name}: {what} has no such option") for name, value in named] + [
        (cfg.norm != "rmsnorm" or not cfg.norm_affine or cfg.norm_position != "pre" or cfg.parallel_residual,
         f"model.norm={cfg.norm}, norm_affine, norm_position={cfg.norm_position}, parallel_residual: {what} has "
         f"pre-RMSNorm blocks with weights, its sublayers in turn"),
        (cfg.mlp != "swiglu", f"model.mlp={cfg.mlp}: {what} has SwiGLU MLPs"),
        (cfg.delta_key_heads > 1, f"model.delta_key_heads={cfg.delta_key_heads}: {what} has one x_proj and dt_proj a "
                                  f"Mamba-1 layer (Mamba-1 heads are Zamba's)"),
        (cfg.has_qkv_bias, f"q/k/v biases (model.qkv_bias): {what} has none"),
        (cfg.attn_gate != "none", f"model.attn_gate={cfg.attn_gate}: {what} has no gate on its heads"),
        (cfg.pos_emb != "none", f"model.pos_emb={cfg.pos_emb}: {what} has no positional encoding (set "
                                f"model.pos_emb=none)"),
        (cfg.head_dim * cfg.n_head != cfg.n_embd, f"model.head_size: {what} has heads n_embd / n_head wide"),
        (cfg.delta_heads % cfg.n_embd, f"model.delta_heads={cfg.delta_heads}: {what} has an inner width of "
                                       f"mamba_expand x n_embd={cfg.n_embd} (a whole multiple)"),
        (not cfg.delta_bcdt_norm_eps, f"Mamba-1 layers without dt, B and C norms (model.delta_bcdt_norm_eps=0, "
                                      f"Mamba's): {what} has them; set model.delta_bcdt_norm_eps=model.norm_eps"),
        (cfg.delta_bcdt_norm_eps != cfg.norm_eps, f"model.delta_bcdt_norm_eps={cfg.delta_bcdt_norm_eps} apart from "
                                                  f"model.norm_eps={cfg.norm_eps}: {what} has one rms_norm_eps"),
        (_period(attention, n) is None, f"attention on layers {attention} (those off model.delta_layers): {what} "
                                        f"has it every attn_layer_period-th layer from an offset"),
        (_period(experts, n) is None, f"experts on layers {experts} (model.moe_layers): {what} has them every "
                                      f"expert_layer_period-th layer from an offset"),
        (cfg.moe_experts and (cfg.moe_norm_topk or cfg.moe_gating != "softmax" or cfg.moe_scale != 1.0),
         f"model.moe_norm_topk, moe_gating={cfg.moe_gating}, moe_scale={cfg.moe_scale}: {what} weights its experts "
         f"by their softmax probabilities as they are (set model.moe_norm_topk=false)"),
        (cfg.moe_dense_hidden not in (None, cfg.hidden_dim), f"model.moe_dense_hidden: {what} has one MLP width"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    n = cfg.n_layer
    attn = _period([i for i in range(n) if i not in cfg.delta_layers], n)
    experts = [i for i in range(n) if cfg.layer_has_experts(i)]
    expert = _period(experts, n)
    return {"model_type": "jamba", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
            "intermediate_size": cfg.hidden_dim, "num_hidden_layers": n, "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.kv_heads, "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps,
            "tie_word_embeddings": cfg.tie_embeddings, "max_position_embeddings": cfg.context_len,
            "attn_layer_period": attn[0], "attn_layer_offset": attn[1],
            # no experts: one "expert" on the matching layers, JambaMLP everywhere
            "num_experts": cfg.moe_experts if experts else 1, "num_experts_per_tok": cfg.moe_top_k if experts else 1,
            "expert_layer_period": expert[0], "expert_layer_offset": expert[1],
            "output_router_logits": bool(cfg.moe_aux_loss), "router_aux_loss_coef": cfg.moe_aux_loss or 0.001,
            "mamba_d_state": cfg.delta_key_dim, "mamba_d_conv": cfg.delta_conv_kernel,
            "mamba_expand": cfg.delta_heads // cfg.n_embd, "mamba_dt_rank": cfg.dt_rank,
            "mamba_conv_bias": cfg.delta_conv_bias, "mamba_proj_bias": cfg.delta_proj_bias, "use_cache": True}


FAMILY = Family(name="jamba", architecture="JambaForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf)
