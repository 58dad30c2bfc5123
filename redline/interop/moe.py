"""Mixtures of experts on the Llama layout: Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE (and GraniteMoE's experts, whose
family is in granite.py).

Each is its dense sibling's block (Mistral's, Qwen2's, Qwen3's, and Llama's with OLMo 2's QK-norm over whole
projections) with the MLP replaced by a router and E SwiGLU experts, every token sent to the top k (redline's
model.moe_experts, model.moe_top_k; MoE in model.py):
- Mixtral: `block_sparse_moe.gate` (E, C), experts `block_sparse_moe.experts.j.w1` (gate), `w3` (up), `w2` (down);
  the top k probabilities rescaled to sum to 1; a sliding window on every layer where the config gives one;
- Qwen2-MoE: `mlp.gate`, `mlp.experts.j.gate_proj` / `up_proj` / `down_proj`, and a shared expert every token passes
  through (`mlp.shared_expert.*`), scaled by sigmoid(`mlp.shared_expert_gate` · x); biases on q/k/v (`qkv_bias`);
  `norm_topk_prob` says whether the top k are rescaled;
- Qwen3-MoE: Qwen3's attention (QK-norm per head, its own head width) with Qwen2-MoE's experts and no shared one;
- OLMoE: QK-norm over the whole q and k projections (OLMo 2's), pre-norm blocks, Qwen-MoE's expert names;
- FlexOlmo: OLMoE's attention and experts in OLMo 2's block (norms on the sublayers' outputs, norm_position
  "output", olmo2.py), with no clip_qkv.
Every layer sparse: configs with dense layers among the sparse ones (`mlp_only_layers`, `decoder_sparse_step` > 1)
are refused by name. Files saved with the experts already stacked (`mlp.experts.gate_up_proj` (E, 2F, C) and
`mlp.experts.down_proj` (E, C, F), transformers' in-memory layout) are read as well; exports write one tensor per
expert, the layout of the Hub's checkpoints, which transformers stacks as it loads them. Semantics read from
transformers' models/mixtral, qwen2_moe, qwen3_moe, olmoe and flex_olmo modeling files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, raise_first
from redline.interop.llama import _ignorable, _rope, _window, check_silu, hf_config_for, shape_fields, to_hf, to_redline
from redline.model import ModelConfig

# (router, an expert's gate, up and down) after model.layers.N., by the family's naming
_MIXTRAL = ("block_sparse_moe.", "w1", "w3", "w2")
_QWEN = ("mlp.", "gate_proj", "up_proj", "down_proj")
_LFM2 = ("feed_forward.", "w1", "w3", "w2")  # LFM2-MoE's (lfm2.py), with feed_forward.expert_bias
_GRANITE = "block_sparse_moe."  # GraniteMoE: router.layer (E, C), input_linear (E, 2F, C), output_linear (E, C, F)
# GraniteMoeSWA's: transformers' in-memory names of the same tensors, as it saves them (no conversion mapping renames
# them on loading): router (E, C), experts.gate_up_proj (E, 2F, C), experts.down_proj (E, C, F)
_GRANITE_STACKED = ("router.weight", "experts.gate_up_proj", "experts.down_proj")
NAMES = {"mixtral": _MIXTRAL, "qwen2_moe": _QWEN, "qwen3_moe": _QWEN, "olmoe": _QWEN, "flex_olmo": _QWEN,
         "lfm2_moe": _LFM2, "mellum": _QWEN, "flint": _QWEN,  # Mellum's and Flint's: windowed_moe.py
         "laguna": _QWEN}
_ARCHITECTURES = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                  "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM",
                  "flex_olmo": "FlexOlmoForCausalLM"}
_WHOLE_QK_NORM = ("olmoe", "flex_olmo")  # OLMo 2's QK-norm over whole projections


def _sparse_everywhere(hf: dict) -> None:
    if int(hf.get("decoder_sparse_step") or 1) != 1 or hf.get("mlp_only_layers"):
        raise UserError(f"decoder_sparse_step={hf.get('decoder_sparse_step')} / mlp_only_layers="
                        f"{hf.get('mlp_only_layers')}: dense MLP layers among the expert layers are not supported; "
                        f"redline's mixtures of experts route every layer")


def expert_fields(hf: dict, hidden: str) -> dict:
    """ModelConfig's expert fields: count (Mixtral's num_local_experts, the others' num_experts, which transformers 5
    saves under Mixtral's name), top k, each expert's width; the load-balancing loss where the config trains with it
    (output_router_logits, as transformers adds router_aux_loss_coef times it only then)."""
    count = hf.get("num_local_experts") or hf.get("num_experts")
    if not count or not hf.get("num_experts_per_tok"):
        raise UserError("config.json gives no num_experts / num_local_experts or num_experts_per_tok: the mixture of "
                        "experts' size is unknown")
    aux = float(hf.get("router_aux_loss_coef") or 0.0) if hf.get("output_router_logits") else 0.0
    return dict(moe_experts=int(count), moe_top_k=int(hf["num_experts_per_tok"]), mlp_hidden=int(hf[hidden]),
                moe_aux_loss=aux)


def model_config_for(name: str):
    def model_config(hf: dict) -> ModelConfig:
        check_silu(hf)
        if name != "mixtral":
            _sparse_everywhere(hf)
            if hf.get("use_sliding_window") and hf.get("sliding_window"):
                raise UserError(f"use_sliding_window=true on a {name} model is not supported (of the mixtures of "
                                f"experts, redline takes Mixtral's window)")
        if name == "olmoe" and hf.get("clip_qkv") is not None:
            raise UserError(f"clip_qkv={hf['clip_qkv']}: OLMoE's clamping of q, k and v is not supported")
        width = "moe_intermediate_size" if name in ("qwen2_moe", "qwen3_moe") else "intermediate_size"
        experts = expert_fields(hf, width)
        norm_topk = name == "mixtral" or bool(hf.get("norm_topk_prob", False))
        qkv_bias = bool(hf.get("qkv_bias", True)) if name == "qwen2_moe" else bool(hf.get("attention_bias", False))
        # attention_bias: o_proj too, where redline has q/k/v alone
        if qkv_bias and name in ("qwen3_moe", *_WHOLE_QK_NORM):
            raise UserError(f"attention_bias=true: {name} then has a bias on o_proj as well, which redline's mixtures "
                            f"of experts do not have (biases on q/k/v alone)")
        fields = {**shape_fields(hf), **experts}
        return ModelConfig(
            **fields, qk_norm=name in ("qwen3_moe", *_WHOLE_QK_NORM),
            qk_norm_scope="all" if name in _WHOLE_QK_NORM else "head",
            norm_position="output" if name == "flex_olmo" else "pre",
            fused_qkv=True, sliding_window=_window(hf, "mistral") if name == "mixtral" else 0, pos_emb="rope",
            mlp="swiglu", fused_mlp=True, norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False, qkv_bias=qkv_bias,
            moe_norm_topk=norm_topk, moe_shared_hidden=int(hf.get("shared_expert_intermediate_size") or 0)
            if name == "qwen2_moe" else 0, **_rope(hf),
        )

    return model_config


def export_name(cfg: ModelConfig) -> str:
    """Which family a mixture of experts exports as: GraniteMoE with Granite's scalars (granite.py), OLMoE with QK-norm
    over whole projections, FlexOlmo with that and OLMo 2's norms on the sublayers' outputs, Qwen3-MoE with QK-norm
    per head, Qwen2-MoE with a shared expert, biases on q/k/v or unrescaled top-k weights, Mixtral otherwise."""
    from redline.interop import granite

    if granite.wants_granite(cfg) or (cfg.moe_shared_hidden and not cfg.moe_shared_gate):
        return granite.moe_export_name(cfg)  # GraniteMoE, or GraniteMoeShared (its shared MLP is ungated)
    if cfg.norm_position == "output":  # FlexOlmo: OLMoE in OLMo 2's block
        check_exportable(replace(cfg, norm_position="pre"))
        if not cfg.qk_norm or cfg.qk_norm_scope != "all":
            raise UserError("model.norm_position=output with model.moe_experts needs model.qk_norm=true and "
                            "model.qk_norm_scope=all: FlexOlmo normalizes its whole q and k projections")
        return "flex_olmo"
    check_exportable(cfg)
    if cfg.qk_norm:
        return "olmoe" if cfg.qk_norm_scope == "all" else "qwen3_moe"
    if cfg.moe_shared_hidden or cfg.has_qkv_bias or not cfg.moe_norm_topk:
        if cfg.sliding_window:
            raise UserError("model.sliding_window with a shared expert, q/k/v biases or model.moe_norm_topk=false: "
                            "Qwen2-MoE, the mixture of experts redline exports these to, attends to the whole "
                            "context (Mixtral, which has the window, has none of them)")
        return "qwen2_moe"
    return "mixtral"


def check_exportable(cfg: ModelConfig, granite: bool = False) -> None:
    """A UserError naming the option of a mixture of experts that none of Mixtral, Qwen2/3-MoE, OLMoE has (granite:
    GraniteMoE's scalars allowed, its other options checked by granite.check_moe_exportable)."""
    scales = cfg.attn_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor
    problems = [
        (cfg.norm_position != "pre", f"model.norm_position={cfg.norm_position} with model.moe_experts: Mixtral, "
                                     f"Qwen2/3-MoE and OLMoE have pre-norm blocks (FlexOlmo output norms)"),
        (cfg.norm != "rmsnorm" or cfg.norm_unit_offset, "a LayerNorm or 1 + weight norm with model.moe_experts: the "
                                                        "mixtures of experts redline exports to use RMSNorm"),
        (cfg.mlp != "swiglu", f"model.mlp={cfg.mlp} with model.moe_experts: their experts are SwiGLU"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval,
         "positions other than RoPE on every layer's whole heads with model.moe_experts"),
        (cfg.parallel_residual, "model.parallel_residual with model.moe_experts: their sublayers run in turn"),
        (cfg.bias, "model.bias=true with model.moe_experts: their experts and o_proj have no biases"),
        (cfg.qk_norm and cfg.has_qkv_bias, "q/k/v biases with QK-norm and model.moe_experts: Qwen3-MoE and OLMoE "
                                           "then put a bias on o_proj too"),
        (cfg.qk_norm and cfg.moe_shared_hidden, "model.moe_shared_hidden with QK-norm: of the mixtures of experts "
                                                "redline exports to, only Qwen2-MoE has a shared expert"),
        (cfg.qk_norm and cfg.sliding_window, "model.sliding_window with QK-norm and model.moe_experts: Qwen3-MoE and "
                                             "OLMoE attend to the whole context"),
        (cfg.sliding_window_pattern or cfg.rope_local_theta or cfg.embed_scale or (scales and not granite),
         "Gemma's or Granite's scales and window layouts with model.moe_experts (of the mixtures of experts redline "
         "exports to, GraniteMoE has Granite's scalars)"),
        (cfg.moe_gating != "softmax" or cfg.moe_expert_bias or cfg.moe_scale != 1.0 or cfg.moe_dense_layers,
         "sigmoid scores, an expert bias, a weight scale or dense first layers with model.moe_experts: LFM2-MoE's "
         "(with model.conv_layers); Mixtral, Qwen2/3-MoE, OLMoE and GraniteMoE have none of them"),
        (cfg.logit_softcap or cfg.attn_softcap or cfg.head_bias or cfg.value_embeddings or cfg.qk_norm_after_rope,
         "soft caps, a head bias, value embeddings or QK-norm after RoPE with model.moe_experts: Mixtral, Qwen2/3-MoE "
         "and OLMoE have none of them"),
    ]
    raise_first(problems)


def hf_config_for_moe(name: str):
    dense = hf_config_for({"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3"}.get(name, "llama"))

    def hf_config(cfg: ModelConfig) -> dict:
        out = dense(cfg)
        out.update(model_type=name, num_experts_per_tok=cfg.moe_top_k, output_router_logits=bool(cfg.moe_aux_loss),
                   router_aux_loss_coef=cfg.moe_aux_loss or 0.001)
        for key in ("attention_bias", "mlp_bias", "pretraining_tp"):
            out.pop(key, None)
        if name == "mixtral":
            out.update(num_local_experts=cfg.moe_experts, router_jitter_noise=0.0)
            return out
        out.update(num_experts=cfg.moe_experts, norm_topk_prob=cfg.moe_norm_topk, decoder_sparse_step=1,
                   mlp_only_layers=[])
        if name in _WHOLE_QK_NORM:  # their experts are intermediate_size wide
            out["attention_bias"] = False
            if name == "olmoe":
                out["clip_qkv"] = None
        else:
            out["moe_intermediate_size"] = cfg.hidden_dim
        if name == "qwen2_moe":
            out.update(qkv_bias=cfg.has_qkv_bias, shared_expert_intermediate_size=cfg.moe_shared_hidden)
        if name == "qwen3_moe":
            out["attention_bias"] = False
        return out

    return hf_config


def experts_to_redline(src: TensorSource, p: str, r: str, cfg: ModelConfig) -> dict:
    """Block p's router and experts (HF names after model.layers.N.) -> redline's (r: "blocks.N.")."""
    if f"{p}{_GRANITE}router.layer.weight" in src:  # GraniteMoE: stacked as redline's, rows [gate; up]
        return {f"{r}mlp.router.weight": src.take(f"{p}{_GRANITE}router.layer.weight"),
                f"{r}mlp.fc": src.take(f"{p}{_GRANITE}input_linear.weight"),
                f"{r}mlp.proj": src.take(f"{p}{_GRANITE}output_linear.weight")}
    if f"{p}{_GRANITE}router.weight" in src:
        router, fc, proj = (src.take(p + _GRANITE + n) for n in _GRANITE_STACKED)
        return {f"{r}mlp.router.weight": router, f"{r}mlp.fc": fc, f"{r}mlp.proj": proj}
    names = next((n for n in (_MIXTRAL, _LFM2) if f"{p}{n[0]}gate.weight" in src), _QWEN)
    moe, gate, up, down = names
    out = {f"{r}mlp.router.weight": src.take(f"{p}{moe}gate.weight")}
    if cfg.moe_expert_bias:
        out[f"{r}mlp.expert_bias"] = src.take(f"{p}{moe}expert_bias").float()
    if f"{p}{moe}experts.gate_proj.weight" in src:  # stacked apart (E, F, C) each, as GGUF files hold them
        out[f"{r}mlp.fc"] = torch.cat([src.take(f"{p}{moe}experts.gate_proj.weight"),
                                       src.take(f"{p}{moe}experts.up_proj.weight")], dim=1)
        out[f"{r}mlp.proj"] = src.take(f"{p}{moe}experts.down_proj.weight")
    elif f"{p}{moe}experts.gate_up_proj" in src:  # stacked already (E, 2F, C) and (E, C, F)
        out[f"{r}mlp.fc"] = src.take(f"{p}{moe}experts.gate_up_proj")
        out[f"{r}mlp.proj"] = src.take(f"{p}{moe}experts.down_proj")
    else:
        e = [f"{p}{moe}experts.{j}." for j in range(cfg.moe_experts)]
        out[f"{r}mlp.fc"] = torch.stack([torch.cat([src.take(f"{x}{gate}.weight"), src.take(f"{x}{up}.weight")])
                                         for x in e])
        out[f"{r}mlp.proj"] = torch.stack([src.take(f"{x}{down}.weight") for x in e])
    if cfg.moe_shared_hidden:
        shared = f"{p}mlp.shared_expert."
        out[f"{r}mlp.shared.fc.weight"] = torch.cat([src.take(shared + "gate_proj.weight"),
                                                     src.take(shared + "up_proj.weight")])
        out[f"{r}mlp.shared.proj.weight"] = src.take(shared + "down_proj.weight")
        if cfg.moe_shared_gate:
            out[f"{r}mlp.shared_gate.weight"] = src.take(f"{p}mlp.shared_expert_gate.weight")
    return out


def experts_to_hf(state: Mapping[str, torch.Tensor], p: str, r: str, cfg: ModelConfig, name: str) -> dict:
    """redline's router and experts of block r -> the HF names of family `name` (one tensor per expert; GraniteMoE's
    stacked)."""
    if name == "granitemoe_swa":
        return {p + _GRANITE + n: state[f"{r}mlp.{t}"]
                for n, t in zip(_GRANITE_STACKED, ("router.weight", "fc", "proj"))}
    if name == "granitemoe":
        return {f"{p}{_GRANITE}router.layer.weight": state[f"{r}mlp.router.weight"],
                f"{p}{_GRANITE}input_linear.weight": state[f"{r}mlp.fc"],
                f"{p}{_GRANITE}output_linear.weight": state[f"{r}mlp.proj"]}
    moe, gate, up, down = NAMES[name]
    out = {f"{p}{moe}gate.weight": state[f"{r}mlp.router.weight"]}
    if cfg.moe_expert_bias:
        out[f"{p}{moe}expert_bias"] = state[f"{r}mlp.expert_bias"]
    for j, (fc, proj) in enumerate(zip(state[f"{r}mlp.fc"], state[f"{r}mlp.proj"])):
        x = f"{p}{moe}experts.{j}."
        out[f"{x}{gate}.weight"], out[f"{x}{up}.weight"] = fc.chunk(2)
        out[f"{x}{down}.weight"] = proj
    if cfg.moe_shared_hidden:
        shared = f"{p}mlp.shared_expert."
        out[shared + "gate_proj.weight"], out[shared + "up_proj.weight"] = state[f"{r}mlp.shared.fc.weight"].chunk(2)
        out[shared + "down_proj.weight"] = state[f"{r}mlp.shared.proj.weight"]
        if cfg.moe_shared_gate:
            out[f"{p}mlp.shared_expert_gate.weight"] = state[f"{r}mlp.shared_gate.weight"]
    return out


def deepseek_experts_to_redline(src: TensorSource, p: str, r: str, cfg: ModelConfig) -> dict:
    """DeepSeek-V3's mixture as GLM-4-MoE and dots.llm1 name it too: Qwen-MoE's router and experts (one tensor per
    expert, or stacked), the choosing bias as mlp.gate.e_score_correction_bias, and the ungated shared experts as one
    MLP, mlp.shared_experts (p: "model.layers.N.", r: "blocks.N.")."""
    out = experts_to_redline(src, p, r, replace(cfg, moe_expert_bias=False, moe_shared_hidden=0))
    if cfg.moe_expert_bias:  # EXAONE-MoE's Hub files hold it as mlp.e_score_correction_bias
        bias = f"{p}mlp.gate.e_score_correction_bias"
        out[f"{r}mlp.expert_bias"] = src.take(bias if bias in src else f"{p}mlp.e_score_correction_bias").float()
    shared = f"{p}mlp.shared_experts."
    out[f"{r}mlp.shared.fc.weight"] = torch.cat([src.take(shared + "gate_proj.weight"),
                                                 src.take(shared + "up_proj.weight")])
    out[f"{r}mlp.shared.proj.weight"] = src.take(shared + "down_proj.weight")
    return out


def deepseek_experts_to_hf(state: Mapping[str, torch.Tensor], p: str, r: str, cfg: ModelConfig,
                           bias: bool = True) -> dict:
    """deepseek_experts_to_redline's inverse; bias: the architecture's router holds e_score_correction_bias (written
    as zeros where redline has none: they choose as no bias does), as DeepSeek-V3's, GLM-4-MoE's and dots.llm1's do
    and DeepSeek-V2's does not."""
    out = experts_to_hf(state, p, r, replace(cfg, moe_expert_bias=False, moe_shared_hidden=0), "qwen3_moe")
    if bias:
        b = state.get(f"{r}mlp.expert_bias")
        out[f"{p}mlp.gate.e_score_correction_bias"] = torch.zeros(cfg.moe_experts) if b is None else b.float()
    shared = f"{p}mlp.shared_experts."
    out[shared + "gate_proj.weight"], out[shared + "up_proj.weight"] = state[f"{r}mlp.shared.fc.weight"].chunk(2)
    out[shared + "down_proj.weight"] = state[f"{r}mlp.shared.proj.weight"]
    return out


FAMILIES = tuple(
    Family(name=n, architecture=arch, model_config=model_config_for(n), hf_config=hf_config_for_moe(n),
           to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
    for n, arch in _ARCHITECTURES.items()
)
