"""Mamba (MambaForCausalLM, model_type "mamba": state-spaces/mamba-130m-hf ... mamba-2.8b-hf) and Falcon-Mamba
(FalconMambaForCausalLM, model_type "falcon_mamba": tiiuae/falcon-mamba-7b): every layer a Mamba-1 mixer alone,
x + mixer(RMSNorm(x)) (model.delta_rule=mamba1 on every layer, model.mlp_free_layers every layer).

Names: backbone.embeddings (the legacy backbone.embedding, which transformers' MambaModel renames on load, is read
too), backbone.layers.i.norm, backbone.layers.i.mixer.{in_proj, conv1d, x_proj, dt_proj, A_log, D, out_proj},
backbone.norm_f, lm_head, tied or not. The mixer: intermediate_size channels (expand x hidden_size where it is not
given; written back as both, expand rounded) (redline's
delta_heads, with delta_value_dim = 1 and delta_key_heads = 1), state_size (delta_key_dim), conv_kernel,
time_step_rank ("auto": ceil(hidden_size / 16); delta_dt_rank), use_conv_bias (delta_conv_bias), use_bias on
in_proj and out_proj (delta_proj_bias); dt_proj always has a bias. conv1d's weight (I, 1, K) is redline's conv
(I, K). Falcon-Mamba adds RMS norms without weights on dt, B and C after x_proj at mixer_rms_eps
(model.delta_bcdt_norm_eps; their dummy weights are non-persistent buffers, in no checkpoint).

Read and not refused: residual_in_fp32 (a model in fp32 runs so anyway; redline's runs in the dtype it is given),
the initialisation fields (time_step_min/max/scale/floor/init_scheme, rescale_prenorm_residual, initializer_range)
and the implementation choices (use_mambapy, use_falcon_mambapy, use_associative_scan). Refused: a hidden_act
other than silu (the convolution's activation; the gate is SiLU whatever it says in transformers' code, and
redline runs SiLU in both places). Export refuses what neither architecture has, by name (check_exportable); a
model with delta_bcdt_norm_eps set is written as Falcon-Mamba with it as mixer_rms_eps. Semantics read from
transformers' models/mamba/modeling_mamba.py and models/falcon_mamba/modeling_falcon_mamba.py (Gu and Dao 2023).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.model import ModelConfig

_MIXER = ("in_proj", "x_proj", "dt_proj")  # Linear layers of the same name in both (weights; in_proj's bias apart)
# Jamba's weighted norms on dt (R,), B and C (N,) after x_proj: redline's name -> Jamba's (a .weight each)
BCDT_NORMS = {"dt_norm": "dt_layernorm", "B_norm": "b_layernorm", "C_norm": "c_layernorm"}


def _model_config(hf: dict, falcon: bool) -> ModelConfig:
    if hf.get("hidden_act", "silu") != "silu":
        raise UserError(f"hidden_act={hf['hidden_act']!r}: Mamba's convolution is followed by SiLU, the one redline "
                        f"runs; only hidden_act=silu models are supported")
    width, n = hf["hidden_size"], hf["num_hidden_layers"]
    # transformers' config derives intermediate_size from expand unless it is given (kwargs are set after it)
    inner = int(hf.get("intermediate_size") or int(hf.get("expand", 2) * width))
    rank = hf.get("time_step_rank", "auto")
    rank = math.ceil(width / 16) if rank == "auto" else int(rank)
    eps = float(hf.get("mixer_rms_eps", 1e-6)) if falcon else 0.0
    if falcon and eps <= 0:
        raise UserError(f"mixer_rms_eps={eps}: Falcon-Mamba's B, C and dt norms take an epsilon above 0")
    layers = tuple(range(n))
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 4096), n_layer=n, n_embd=width,
        n_head=1, pos_emb="none", norm="rmsnorm", norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=False, mlp_free_layers=layers,
        delta_layers=layers, delta_rule="mamba1", delta_heads=inner, delta_key_heads=1, delta_value_dim=1,
        delta_key_dim=int(hf.get("state_size", 16)), delta_conv_kernel=int(hf.get("conv_kernel", 4)),
        delta_conv_bias=bool(hf.get("use_conv_bias", True)), delta_proj_bias=bool(hf.get("use_bias", False)),
        delta_dt_rank=rank, delta_bcdt_norm_eps=eps)


def model_config(hf: dict) -> ModelConfig:
    return _model_config(hf, falcon=False)


def falcon_model_config(hf: dict) -> ModelConfig:
    return _model_config(hf, falcon=True)


def mixer_to_redline(src: TensorSource, m: str, a: str, cfg: ModelConfig) -> dict:
    """One Mamba-1 mixer's tensors under HF prefix m (".../mixer." here, Jamba's ".../mamba.") -> redline's under a
    ("blocks.i.attn."); Jamba's weighted dt, B and C norms where model.delta_bcdt_norm_weight says."""
    out = {f"{a}{name}.weight": src.take(f"{m}{name}.weight") for name in _MIXER}
    out[a + "dt_proj.bias"] = src.take(m + "dt_proj.bias")
    out[a + "conv"] = src.take(m + "conv1d.weight").reshape(cfg.delta_heads, cfg.delta_conv_kernel)
    out[a + "A_log"], out[a + "D"] = src.take(m + "A_log"), src.take(m + "D")
    out[a + "proj.weight"] = src.take(m + "out_proj.weight")
    if cfg.delta_conv_bias:
        out[a + "conv_bias"] = src.take(m + "conv1d.bias")
    if cfg.delta_proj_bias:
        out[a + "in_proj.bias"], out[a + "proj.bias"] = src.take(m + "in_proj.bias"), src.take(m + "out_proj.bias")
    if cfg.delta_bcdt_norm_weight:
        out.update({a + ours: src.take(f"{m}{theirs}.weight") for ours, theirs in BCDT_NORMS.items()})
    return out


def mixer_to_hf(state: Mapping[str, torch.Tensor], m: str, a: str, cfg: ModelConfig) -> dict:
    """mixer_to_redline's inverse (no dt, B and C norm weights: the caller writes what its architecture wants)."""
    out = {f"{m}{name}.weight": state[f"{a}{name}.weight"] for name in _MIXER}
    out[m + "dt_proj.bias"] = state[a + "dt_proj.bias"]
    out[m + "conv1d.weight"] = state[a + "conv"][:, None, :]  # (I, 1, K): a depthwise Conv1d's
    out[m + "A_log"], out[m + "D"] = state[a + "A_log"], state[a + "D"]
    out[m + "out_proj.weight"] = state[a + "proj.weight"]
    if cfg.delta_conv_bias:
        out[m + "conv1d.bias"] = state[a + "conv_bias"]
    if cfg.delta_proj_bias:
        out[m + "in_proj.bias"], out[m + "out_proj.bias"] = state[a + "in_proj.bias"], state[a + "proj.bias"]
    return out


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    embed = "backbone.embeddings.weight" if "backbone.embeddings.weight" in src else "backbone.embedding.weight"
    out = {"norm_f.weight": src.take("backbone.norm_f.weight"), "wte.weight": pad_rows(src.take(embed), cfg),
           **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"backbone.layers.{i}.", f"blocks.{i}."
        out[r + "norm1.weight"] = src.take(p + "norm.weight")
        out.update(mixer_to_redline(src, p + "mixer.", r + "attn.", cfg))
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"backbone.norm_f.weight": state["norm_f.weight"],
           "backbone.embeddings.weight": state["wte.weight"][:cfg.vocab_size], **give_head(state, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"backbone.layers.{i}.", f"blocks.{i}."
        out[p + "norm.weight"] = state[r + "norm1.weight"]
        out.update(mixer_to_hf(state, p + "mixer.", r + "attn.", cfg))
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(cfg: ModelConfig) -> dict:
    out = {"model_type": "falcon_mamba" if cfg.delta_bcdt_norm_eps else "mamba", "vocab_size": cfg.vocab_size,
           "hidden_size": cfg.n_embd, "num_hidden_layers": cfg.n_layer, "state_size": cfg.delta_key_dim,
           "expand": max(1, round(cfg.delta_heads / cfg.n_embd)), "intermediate_size": cfg.delta_heads,
           "conv_kernel": cfg.delta_conv_kernel, "use_bias": cfg.delta_proj_bias,
           "use_conv_bias": cfg.delta_conv_bias, "hidden_act": "silu", "time_step_rank": cfg.dt_rank,
           "layer_norm_epsilon": cfg.norm_eps, "residual_in_fp32": True,  # exact in fp32; the released default
           "tie_word_embeddings": cfg.tie_embeddings, "use_cache": True}
    if cfg.delta_bcdt_norm_eps:
        out["mixer_rms_eps"] = cfg.delta_bcdt_norm_eps
    return out


def wants_mamba(cfg: ModelConfig) -> bool:
    """A model with Mamba-1 layers: Mamba's or Falcon-Mamba's, the architectures that have them."""
    return bool(cfg.delta_layers) and cfg.delta_rule == "mamba1"


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with Mamba-1 layers that Mamba and Falcon-Mamba do not have."""
    what = "Mamba-1 layers (model.delta_rule=mamba1): Mamba and Falcon-Mamba, the architectures with them,"
    every = set(range(cfg.n_layer))
    raise_first([
        (set(cfg.delta_layers) != every or set(cfg.mlp_free_layers) != every,
         f"{what} have a Mamba-1 mixer alone on every layer (model.delta_layers and mlp_free_layers naming every "
         f"layer, not {cfg.delta_layers} and {cfg.mlp_free_layers})"),
        (cfg.norm != "rmsnorm" or not cfg.norm_affine or cfg.norm_unit_offset or cfg.norm_bias or cfg.embed_norm,
         f"{what} have RMSNorms with a weight and no offset or bias (model.norm={cfg.norm}, norm_unit_offset, "
         f"norm_bias, norm_affine, embed_norm)"),
        (cfg.delta_bcdt_norm_weight, f"{what} have no weights on the dt, B and C norms "
                                     f"(model.delta_bcdt_norm_weight: Jamba's)"),
        (cfg.delta_key_heads > 1, f"model.delta_key_heads={cfg.delta_key_heads}: {what} have one x_proj and dt_proj "
                                  f"a layer (Mamba-1 heads are Zamba's, whose layers call shared blocks: "
                                  f"model.shared_attn_layers)"),
        (cfg.moe_experts or cfg.conv_layers or cfg.value_embeddings,
         f"{what} have no experts, short convolutions or value embeddings (model.moe_experts, conv_layers, "
         f"value_embeddings)"),
        (cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.logit_softcap
         or cfg.head_bias, f"{what} have no embedding scale, scalars, logit cap or head bias"),
    ])


def export_name(cfg: ModelConfig) -> str:
    """falcon_mamba where the model has the B, C and dt norms, mamba otherwise (a UserError naming the option
    neither has)."""
    check_exportable(cfg)
    return "falcon_mamba" if cfg.delta_bcdt_norm_eps else "mamba"


FAMILY = Family(name="mamba", architecture="MambaForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf)
FALCON_FAMILY = Family(name="falcon_mamba", architecture="FalconMambaForCausalLM", model_config=falcon_model_config,
                       hf_config=hf_config, to_redline=to_redline, to_hf=to_hf)
