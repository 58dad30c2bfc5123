"""Nemotron-H and Mamba-2: models whose layers are one sublayer each, x + mixer(norm(x)) with an RMSNorm
(model.mlp_free_layers: a token mixer alone; model.mixer_free_layers: an MLP alone).

Nemotron-H (NemotronHForCausalLM, model_type "nemotron_h": Nemotron-H-8B/47B, NVIDIA-Nemotron-Nano-9B/12B-v2), its
layers by layers_block_type (or the legacy hybrid_override_pattern string, one letter a layer):
- "linear_attention" / "M": a Mamba-2 mixer, the one Granite 4.0 and Bamba have (granite.py's maps, under
  backbone.layers.i.mixer.*): mamba_num_heads heads of mamba_head_dim, n_groups groups of B and C of
  ssm_state_size, use_conv_bias on the convolution, use_bias on in_proj and out_proj, its gated norm at
  layer_norm_epsilon;
- "full_attention" / "*": attention without positions (no RoPE), q/k/v/o_proj without biases, head_dim wide;
- "mlp" / "-": up_proj, ReLU², down_proj (mlp_hidden_act relu2), no gate;
- "moe" / "E": a mixture of experts alone (model.moe_layers; the "-" layers' MLPs are model.moe_dense_hidden =
  intermediate_size wide), as transformers' NemotronHMoE computes it (DeepSeek-V3's router): mixer.gate.weight
  (E, C) scores each expert by its sigmoid (model.moe_gating=sigmoid), mixer.gate.e_score_correction_bias
  (model.moe_expert_bias) added to choose the top num_experts_per_tok among the topk_group best of n_group groups
  (model.moe_groups, moe_topk_groups), the chosen scores renormalised with 1e-20 where norm_topk_prob
  (model.moe_norm_eps) and scaled by routed_scaling_factor (model.moe_scale); n_routed_experts ungated ReLU² experts
  moe_intermediate_size wide (mixer.experts.j.up_proj, down_proj, as the Hub's files hold them, or stacked as
  transformers' module holds them: model.mlp=relu2 with experts, fc the up rows alone) and an ungated ReLU² shared
  expert moe_shared_expert_intermediate_size wide (mixer.shared_experts.*: model.moe_shared_hidden,
  moe_shared_gate=false). Latent projections around the experts (moe_latent_size, fc1/fc2_latent_proj) are refused.
transformers' mixer ignores time_step_limit and floors dt at time_step_min in its chunked (prompt) scan,
(time_step_min, inf): that is model.delta_dt_min. Its one-token decode step has no floor; redline floors every
token, which is the same wherever softplus(dt + dt_bias) is above time_step_min (0.001 in the released models).
The multi-token-prediction layers (num_nextn_predict_layers > 0, weights mtp.*) are ignored on import, as
transformers ignores them: they are not needed to compute the model's logits. Legacy config names (mamba_n_groups,
mamba_d_conv, mamba_dt_min, mamba_conv_bias, ...) are read where present, winning as NemotronHConfig's
__post_init__ lets them. The released checkpoints' names start with backbone. (a state dict of transformers' module
with model.; both are read). The MLP's and attention's bias fields (mlp_bias, attention_bias) are refused when
set, residual_in_fp32 and sliding_window are ignored, as transformers' model ignores them.
Export writes the layout back with backbone. names and time_step_min = model.delta_dt_min (time_step_limit alike, a
field transformers' mixer does not read); a model with Mamba-2 layers and delta_dt_min = 0 is refused, since
transformers takes the logarithm of time_step_min when it builds the model. A tied head is written as lm_head,
a copy of the embeddings, with tie_word_embeddings false: transformers' Nemotron-H ties no weights.
Semantics read from transformers' models/nemotron_h/modular_nemotron_h.py and configuration_nemotron_h.py.

Mamba-2 (Mamba2ForCausalLM, model_type "mamba2": state-spaces' mamba2 models converted, Mamba-Codestral-7B): every
layer a Mamba-2 mixer alone (backbone.layers.i.norm, backbone.layers.i.mixer.*), backbone.embeddings,
backbone.norm_f, lm_head, tied or not; num_heads heads of head_dim (= expand x hidden_size), n_groups, state_size,
conv_kernel, use_conv_bias, use_bias. time_step_limit (min, inf) is model.delta_dt_min (an upper bound refused);
residual_in_fp32 keeps transformers' residual stream in fp32, which is what a model in fp32 does anyway (redline's
runs in the dtype it is given). The legacy fields rms_norm=false (LayerNorm blocks) and norm_before_gate=true,
which transformers' Mamba2 does not read, are refused: the weights were trained for a function it does not run.
With no attention layer, n_head is only validated: num_heads where it divides hidden_size, else 1. Semantics read
from transformers' models/mamba2/modeling_mamba2.py and configuration_mamba2.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.granite import _mixer_to_hf, _mixer_to_redline, time_step_floor, time_step_limit
from redline.model import ModelConfig

_LETTERS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}  # transformers' remap_legacy_layer_types
_KINDS = {"linear_attention", "full_attention", "mlp", "moe"}


def _legacy(hf: dict, legacy: str, name: str, default):
    """A NemotronHConfig field under its legacy name (which its __post_init__ prefers) or its own."""
    return hf[legacy] if legacy in hf else hf.get(name, default)


def layer_kinds(hf: dict) -> list[str]:
    """Each layer's kind: linear_attention, full_attention, mlp or moe."""
    kinds = hf.get("layers_block_type") or hf.get("layer_types")
    if kinds is None and hf.get("hybrid_override_pattern") is not None:
        pattern = hf["hybrid_override_pattern"]
        if not isinstance(pattern, str) or not set(pattern) <= set(_LETTERS):
            raise UserError(f"hybrid_override_pattern={pattern!r}: Nemotron-H's layers are letters of M (Mamba-2), "
                            f"* (attention), - (MLP) and E (experts)")
        kinds = [_LETTERS[c] for c in pattern]
    if not kinds:
        raise UserError("a Nemotron-H config.json without layers_block_type or hybrid_override_pattern: the layers "
                        "are not known")
    kinds = [_LEGACY.get(k, k) for k in kinds]
    if not set(kinds) <= _KINDS:
        raise UserError(f"layers_block_type {sorted(set(kinds) - _KINDS)}: Nemotron-H's layers are "
                        f"linear_attention, full_attention, mlp or moe")
    return kinds


def _expert_fields(hf: dict, experts: tuple[int, ...], dense: bool) -> dict:
    """The ModelConfig fields of the mixtures of experts on layers `experts` (dense: there are "-" layers too)."""
    if not experts:
        return {}
    if hf.get("moe_latent_size") is not None:
        raise UserError(f"moe_latent_size={hf['moe_latent_size']}: Nemotron-H's experts then work in a latent space "
                        f"between fc1_latent_proj and fc2_latent_proj, which redline's experts do not have")
    count, top_k = int(hf.get("n_routed_experts", 8)), int(hf.get("num_experts_per_tok", 2))
    groups, topk_groups = int(hf.get("n_group") or 1), int(hf.get("topk_group") or 1)
    shared = int(hf.get("moe_shared_expert_intermediate_size", 7688))
    if shared <= 0:
        raise UserError(f"moe_shared_expert_intermediate_size={shared}: Nemotron-H's expert layers have a shared "
                        f"expert")
    width = int(hf.get("moe_intermediate_size", 7688))
    return dict(moe_experts=count, moe_top_k=top_k, moe_layers=experts, mlp_hidden=width,
                moe_dense_hidden=int(hf.get("intermediate_size", 21504)) if dense else None, moe_gating="sigmoid",
                moe_expert_bias=True, moe_norm_topk=bool(hf.get("norm_topk_prob", True)), moe_norm_eps=1e-20,
                moe_scale=float(hf.get("routed_scaling_factor", 1.0)), moe_groups=groups,
                moe_topk_groups=topk_groups if groups > 1 else 1, moe_shared_hidden=shared, moe_shared_gate=False)


def _mamba2_fields(layers: tuple[int, ...], heads: int, head: int, groups: int, state: int, kernel: int,
                   conv_bias: bool, proj_bias: bool, dt_min: float, what: str) -> dict:
    """The ModelConfig fields of Mamba-2 mixers on `layers` (what: the config's names, for the error)."""
    if heads <= 0 or head <= 0 or groups <= 0 or heads % groups:
        raise UserError(f"{what}: {groups} groups do not divide {heads} heads of {head}: not a Mamba-2 layer redline "
                        f"can build")
    return dict(delta_layers=layers, delta_rule="mamba2", delta_heads=heads, delta_key_heads=groups,
                delta_key_dim=state, delta_value_dim=head, delta_conv_kernel=kernel, delta_conv_bias=conv_bias,
                delta_proj_bias=proj_bias, delta_dt_min=dt_min)


def model_config(hf: dict) -> ModelConfig:
    kinds = layer_kinds(hf)
    for key, want in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        if hf.get(key, want) != want:
            raise UserError(f"{key}={hf[key]!r}: Nemotron-H's is {want}, the one redline runs")
    if hf.get("mlp_bias"):
        raise UserError("mlp_bias=true: Nemotron-H's attention has no biases, and redline's biases cover the attention "
                        "and the MLP together")
    width, heads = hf["hidden_size"], hf.get("num_attention_heads", 32)
    head_dim = hf.get("head_dim") or 128  # NemotronHConfig's default
    mamba = tuple(i for i, k in enumerate(kinds) if k == "linear_attention")
    fields = _expert_fields(hf, tuple(i for i, k in enumerate(kinds) if k == "moe"), "mlp" in kinds)
    if mamba:
        dt_min = float(_legacy(hf, "mamba_dt_min", "time_step_min", 0.001))
        if dt_min < 0:
            raise UserError(f"time_step_min={dt_min}: Mamba-2's least time step is not below 0")
        fields |= _mamba2_fields(
            mamba, int(hf.get("mamba_num_heads", 128)), int(hf.get("mamba_head_dim", 64)),
            int(_legacy(hf, "mamba_n_groups", "n_groups", 8)), int(hf.get("ssm_state_size", 128)),
            int(_legacy(hf, "mamba_d_conv", "conv_kernel", 4)), bool(_legacy(hf, "mamba_conv_bias", "use_conv_bias",
                                                                            True)),
            bool(hf.get("use_bias", False)), dt_min, "mamba_num_heads, mamba_head_dim, n_groups")
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 4096), n_layer=len(kinds),
        n_embd=width, n_head=heads, n_kv_head=hf.get("num_key_value_heads") or heads,
        head_size=head_dim if head_dim * heads != width else None,
        **{"mlp_hidden": hf.get("intermediate_size", 21504), **fields},  # the experts' width where there are some
        fused_qkv=True, pos_emb="none", mlp="relu2", norm="rmsnorm", norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False,
        mlp_free_layers=tuple(i for i, k in enumerate(kinds) if k not in ("mlp", "moe")),
        mixer_free_layers=tuple(i for i, k in enumerate(kinds) if k in ("mlp", "moe")))


def _prefix(src: TensorSource) -> str:
    """backbone. as the released checkpoints (and save_pretrained) name the model, model. as transformers' module
    does."""
    return "model." if "model.embeddings.weight" in src and "backbone.embeddings.weight" not in src else "backbone."


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = _prefix(src)
    out = {"norm_f.weight": src.take(pre + "norm_f.weight"),
           "wte.weight": pad_rows(src.take(pre + "embeddings.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        if i in cfg.mixer_free_layers and cfg.layer_has_experts(i):  # experts alone
            out[r + "norm2.weight"] = src.take(p + "norm.weight")
            out.update(_experts_to_redline(src, p + "mixer.", r + "mlp.", cfg))
        elif i in cfg.mixer_free_layers:  # an MLP alone: its norm is the block's MLP norm
            out[r + "norm2.weight"] = src.take(p + "norm.weight")
            out[r + "mlp.fc.weight"] = src.take(p + "mixer.up_proj.weight")
            out[r + "mlp.proj.weight"] = src.take(p + "mixer.down_proj.weight")
        else:  # Mamba-2 or attention, under mixer. alike
            out[r + "norm1.weight"] = src.take(p + "norm.weight")
            out.update(_mixer_to_redline(src, cfg, i, pre + "layers.{i}.", "mixer.", "mixer."))
    return out


def _experts_to_redline(src: TensorSource, p: str, r: str, cfg: ModelConfig) -> dict:
    """An E layer's router, experts and shared expert (p: "backbone.layers.N.mixer.") -> redline's MoE (r:
    "blocks.N.mlp."): fc (E, F, C) the experts' up_proj, proj (E, C, F) their down_proj."""
    out = {r + "router.weight": src.take(p + "gate.weight"),
           r + "expert_bias": src.take(p + "gate.e_score_correction_bias").float()}
    if p + "experts.up_proj" in src:  # stacked, as transformers' module holds them
        out[r + "fc"], out[r + "proj"] = src.take(p + "experts.up_proj"), src.take(p + "experts.down_proj")
    else:  # one tensor per expert, as the Hub's files hold them
        e = [f"{p}experts.{j}." for j in range(cfg.moe_experts)]
        out[r + "fc"] = torch.stack([src.take(x + "up_proj.weight") for x in e])
        out[r + "proj"] = torch.stack([src.take(x + "down_proj.weight") for x in e])
    out[r + "shared.fc.weight"] = src.take(p + "shared_experts.up_proj.weight")
    out[r + "shared.proj.weight"] = src.take(p + "shared_experts.down_proj.weight")
    return out


def _experts_to_hf(state: Mapping[str, torch.Tensor], p: str, r: str, cfg: ModelConfig) -> dict:
    """redline's MoE of block r -> an E layer's names (one tensor per expert, the Hub's layout, which transformers
    stacks as it loads them); a model without the routing bias gets zeros, which choose as none does."""
    bias = state.get(r + "expert_bias")
    out = {p + "gate.weight": state[r + "router.weight"],
           p + "gate.e_score_correction_bias": torch.zeros(cfg.moe_experts) if bias is None else bias.float(),
           p + "shared_experts.up_proj.weight": state[r + "shared.fc.weight"],
           p + "shared_experts.down_proj.weight": state[r + "shared.proj.weight"]}
    for j, (fc, proj) in enumerate(zip(state[r + "fc"], state[r + "proj"])):
        out[f"{p}experts.{j}.up_proj.weight"], out[f"{p}experts.{j}.down_proj.weight"] = fc, proj
    return out


def _fused_qkv(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> Mapping[str, torch.Tensor]:
    """state with each attention layer's q, k and v as one attn.qkv (rows [q; k; v]), as granite.py's maps read it,
    where the model keeps them apart (model.fused_qkv=false)."""
    if cfg.fused_qkv:
        return state
    state = dict(state)
    for i in cfg.attention_layers:
        r = f"blocks.{i}.attn."
        state[r + "qkv.weight"] = torch.cat([state[f"{r}{x}.weight"] for x in "qkv"])
    return state


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    state = _fused_qkv(state, cfg)
    # transformers' Nemotron-H ties nothing: a tied head is written out as a copy of the embeddings (its own
    # storage: safetensors refuses tensors that share it)
    head = state["wte.weight"][:cfg.vocab_size].clone() if cfg.tie_embeddings else state["lm_head.weight"]
    out = {"backbone.norm_f.weight": state["norm_f.weight"],
           "backbone.embeddings.weight": state["wte.weight"][:cfg.vocab_size], "lm_head.weight": head[:cfg.vocab_size]}
    for i in range(cfg.n_layer):
        p, r = f"backbone.layers.{i}.", f"blocks.{i}."
        if i in cfg.mixer_free_layers and cfg.layer_has_experts(i):
            out[p + "norm.weight"] = state[r + "norm2.weight"]
            out.update(_experts_to_hf(state, p + "mixer.", r + "mlp.", cfg))
        elif i in cfg.mixer_free_layers:
            out[p + "norm.weight"] = state[r + "norm2.weight"]
            out[p + "mixer.up_proj.weight"] = state[r + "mlp.fc.weight"]
            out[p + "mixer.down_proj.weight"] = state[r + "mlp.proj.weight"]
        else:
            out[p + "norm.weight"] = state[r + "norm1.weight"]
            out.update(_mixer_to_hf(state, cfg, i, "backbone.layers.{i}.", "mixer.", "mixer."))
    return {k: v.contiguous() for k, v in out.items()}


def _kind(cfg: ModelConfig, i: int) -> str:
    if i in cfg.mixer_free_layers:
        return "moe" if cfg.layer_has_experts(i) else "mlp"
    return "linear_attention" if i in cfg.delta_layers else "full_attention"


def hf_config(cfg: ModelConfig) -> dict:
    out = {"model_type": "nemotron_h", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
           "layers_block_type": [_kind(cfg, i) for i in range(cfg.n_layer)],
           "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
           "max_position_embeddings": cfg.context_len, "attention_bias": False, "attention_dropout": 0.0,
           "intermediate_size": cfg.moe_dense_hidden or cfg.hidden_dim, "mlp_hidden_act": "relu2", "mlp_bias": False,
           "layer_norm_epsilon": cfg.norm_eps, "tie_word_embeddings": False, "residual_in_fp32": False,
           "num_nextn_predict_layers": 0, "use_cache": True, "initializer_range": 0.02}
    if cfg.delta_layers:
        inner = cfg.delta_heads * cfg.delta_value_dim
        out.update(mamba_num_heads=cfg.delta_heads, mamba_head_dim=cfg.delta_value_dim,
                   n_groups=cfg.delta_key_heads, ssm_state_size=cfg.delta_key_dim, conv_kernel=cfg.delta_conv_kernel,
                   use_conv_bias=cfg.delta_conv_bias, use_bias=cfg.delta_proj_bias, mamba_hidden_act="silu",
                   time_step_min=cfg.delta_dt_min, time_step_limit=time_step_limit(cfg),
                   time_step_max=max(0.1, cfg.delta_dt_min),  # the dt_bias initialisation's range, above the floor
                   **({"expand": inner // cfg.n_embd} if inner % cfg.n_embd == 0 else {}))
    if cfg.moe_experts:
        out.update(n_routed_experts=cfg.moe_experts, num_experts_per_tok=cfg.moe_top_k,
                   moe_intermediate_size=cfg.hidden_dim, moe_shared_expert_intermediate_size=cfg.moe_shared_hidden,
                   n_shared_experts=1, moe_latent_size=None, n_group=cfg.moe_groups, topk_group=cfg.moe_topk_groups,
                   norm_topk_prob=cfg.moe_norm_topk, routed_scaling_factor=cfg.moe_scale)
    return out


def _ignorable(name: str) -> bool:
    return name.startswith(("mtp.", "model.mtp.", "backbone.mtp."))  # multi-token prediction, which transformers drops


def _one_sublayer_problems(cfg: ModelConfig, what: str) -> list[tuple[bool, str]]:
    """What neither Nemotron-H nor Mamba2 has, for raise_first: pre-RMSNorm blocks and nothing else of redline's."""
    return [
        (cfg.norm != "rmsnorm" or not cfg.norm_affine or cfg.norm_unit_offset or cfg.norm_bias or cfg.embed_norm,
         f"{what} has RMSNorms with a weight and no offset or bias (model.norm={cfg.norm}, norm_unit_offset, "
         f"norm_bias, norm_affine, embed_norm)"),
        (cfg.delta_layers and cfg.delta_rule != "mamba2",
         f"{what} has Mamba-2 mixers, not gated delta nets (model.delta_rule={cfg.delta_rule})"),
        (cfg.conv_layers or cfg.value_embeddings,
         f"{what} has no short convolutions or value embeddings (model.conv_layers, value_embeddings)"),
        (cfg.delta_norm_eps not in (0.0, cfg.norm_eps),
         f"{what} gives its Mamba-2 layers' gated norm the blocks' epsilon (model.delta_norm_eps="
         f"{cfg.delta_norm_eps}, model.norm_eps={cfg.norm_eps})"),
        (cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.logit_softcap
         or cfg.head_bias, f"{what} has no embedding scale, scalars, logit cap or head bias"),
    ]


def _expert_problems(cfg: ModelConfig, what: str) -> list[tuple[bool, str]]:
    """What Nemotron-H's expert layers (NemotronHMoE: DeepSeek-V3's router, ReLU² experts) do not have."""
    if not cfg.moe_experts:
        return []
    return [  # (a layer with a mixer and an MLP is refused by check_exportable)
        (cfg.moe_gating != "sigmoid", f"{what} scores its experts by their sigmoid (model.moe_gating={cfg.moe_gating})"),
        (cfg.moe_norm_topk and cfg.moe_norm_eps > 1e-20,
         f"{what} adds 1e-20 to the chosen scores' sum (model.moe_norm_eps={cfg.moe_norm_eps}: set it to 1e-20)"),
        (not cfg.moe_shared_hidden or cfg.moe_shared_gate,
         f"{what} has an ungated shared expert on each expert layer (model.moe_shared_hidden="
         f"{cfg.moe_shared_hidden}, moe_shared_gate={cfg.moe_shared_gate}: set moe_shared_hidden and "
         f"moe_shared_gate=false)"),
        (cfg.moe_bias, f"{what} has no biases on its router or experts (model.moe_bias)"),
    ]


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model of one-sublayer blocks that Nemotron-H does not have."""
    what = "blocks of one sublayer (model.mlp_free_layers, mixer_free_layers): Nemotron-H, the architecture with them,"
    both = [i for i in range(cfg.n_layer) if i not in cfg.mlp_free_layers and i not in cfg.mixer_free_layers]
    raise_first([
        (bool(both), f"{what} has a token mixer or an MLP on each layer, never both (layers {both} have both: name "
                     f"them in model.mlp_free_layers or mixer_free_layers)"),
        *_one_sublayer_problems(cfg, what),
        (cfg.mixer_free_layers and cfg.mlp != "relu2", f"{what} has ReLU² MLPs (model.mlp={cfg.mlp})"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no biases on its attention or MLP (model.bias, qkv_bias)"),
        (cfg.attention_layers and cfg.pos_emb != "none",
         f"{what} has attention without positions (model.pos_emb={cfg.pos_emb})"),
        (cfg.attention_layers and (cfg.qk_norm or cfg.attn_gate != "none" or cfg.sliding_window or cfg.attn_sinks
                                   or cfg.attn_scale or cfg.attn_softcap),
         f"{what} has plain attention: no QK-norm, gates, window, sinks, score scale or cap"),
        *_expert_problems(cfg, what),
        (cfg.delta_layers and not cfg.delta_dt_min,
         "model.delta_dt_min=0: Nemotron-H floors Mamba-2's time step at time_step_min, which transformers needs above "
         "0 (it takes its logarithm); set model.delta_dt_min (Nemotron-H's default is 0.001)"),
    ])


def wants_mamba2(cfg: ModelConfig) -> bool:
    """Every layer a Mamba-2 mixer alone: Mamba2's layout."""
    every = set(range(cfg.n_layer))
    return set(cfg.delta_layers) == every == set(cfg.mlp_free_layers) and cfg.delta_rule == "mamba2"


def export_name(cfg: ModelConfig) -> str:
    """mamba2 where every layer is a Mamba-2 mixer alone, nemotron_h otherwise (a UserError naming the option either
    lacks)."""
    if wants_mamba2(cfg):
        check_mamba2_exportable(cfg)
        return "mamba2"
    check_exportable(cfg)
    return "nemotron_h"


# ----------------------------------------------------------------------------------------------------
# Mamba-2 (Mamba2ForCausalLM): see the module docstring.


def mamba2_model_config(hf: dict) -> ModelConfig:
    if hf.get("hidden_act", "silu") != "silu":
        raise UserError(f"hidden_act={hf['hidden_act']!r}: Mamba-2's convolution is followed by SiLU, the one redline "
                        f"runs")
    if hf.get("rms_norm") is False:
        raise UserError("rms_norm=false: this Mamba-2 model's blocks are LayerNorms, which transformers' Mamba2 (and "
                        "its weights' names) do not hold; only rms_norm=true models are supported")
    if hf.get("norm_before_gate"):
        raise UserError("norm_before_gate=true: transformers' Mamba2 gates before its norm; only "
                        "norm_before_gate=false models are supported")
    width, n = hf["hidden_size"], hf["num_hidden_layers"]
    heads, head = int(hf.get("num_heads", 128)), int(hf.get("head_dim", 64))
    if heads * head != int(hf.get("expand", 2) * width):
        raise UserError(f"num_heads={heads} x head_dim={head} != expand x hidden_size = "
                        f"{hf.get('expand', 2) * width}: not a Mamba-2 model transformers builds")
    layers = tuple(range(n))
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 4096), n_layer=n, n_embd=width,
        n_head=heads if width % heads == 0 else 1, pos_emb="none", norm="rmsnorm",
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=False, mlp_free_layers=layers,
        **_mamba2_fields(layers, heads, head, int(hf.get("n_groups", 8)), int(hf.get("state_size", 128)),
                         int(hf.get("conv_kernel", 4)), bool(hf.get("use_conv_bias", True)),
                         bool(hf.get("use_bias", False)), time_step_floor(hf), "num_heads, head_dim, n_groups"))


def mamba2_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"norm_f.weight": src.take("backbone.norm_f.weight"),
           "wte.weight": pad_rows(src.take("backbone.embeddings.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        out[f"blocks.{i}.norm1.weight"] = src.take(f"backbone.layers.{i}.norm.weight")
        out.update(_mixer_to_redline(src, cfg, i, "backbone.layers.{i}.", "mixer."))
    return out


def mamba2_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"backbone.norm_f.weight": state["norm_f.weight"],
           "backbone.embeddings.weight": state["wte.weight"][:cfg.vocab_size], **give_head(state, cfg)}
    for i in range(cfg.n_layer):
        out[f"backbone.layers.{i}.norm.weight"] = state[f"blocks.{i}.norm1.weight"]
        out.update(_mixer_to_hf(state, cfg, i, "backbone.layers.{i}.", "mixer."))
    return {k: v.contiguous() for k, v in out.items()}


def mamba2_hf_config(cfg: ModelConfig) -> dict:
    return {"model_type": "mamba2", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
            "num_hidden_layers": cfg.n_layer, "num_heads": cfg.delta_heads, "head_dim": cfg.delta_value_dim,
            "expand": cfg.delta_heads * cfg.delta_value_dim // cfg.n_embd, "n_groups": cfg.delta_key_heads,
            "state_size": cfg.delta_key_dim, "conv_kernel": cfg.delta_conv_kernel, "use_conv_bias": cfg.delta_conv_bias,
            "use_bias": cfg.delta_proj_bias, "hidden_act": "silu", "layer_norm_epsilon": cfg.norm_eps,
            "time_step_limit": time_step_limit(cfg), "residual_in_fp32": True,  # exact in fp32; the released default
            "tie_word_embeddings": cfg.tie_embeddings, "use_cache": True}


def check_mamba2_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model of Mamba-2 mixers alone that Mamba2 does not have."""
    what = "Mamba-2 mixers alone on every layer: Mamba2, the architecture of them,"
    raise_first([
        (cfg.moe_experts, f"{what} has no experts (model.moe_experts)"),
        *_one_sublayer_problems(cfg, what),
        ((cfg.delta_heads * cfg.delta_value_dim) % cfg.n_embd,
         f"{what} makes its layers' inner width (model.delta_heads x model.delta_value_dim = "
         f"{cfg.delta_heads * cfg.delta_value_dim}) a whole multiple of model.n_embd={cfg.n_embd} (expand)"),
    ])


FAMILY = Family(name="nemotron_h", architecture="NemotronHForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
MAMBA2_FAMILY = Family(name="mamba2", architecture="Mamba2ForCausalLM", model_config=mamba2_model_config,
                       hf_config=mamba2_hf_config, to_redline=mamba2_to_redline, to_hf=mamba2_to_hf)
