"""Step 3.5's text model (model_type "step3p5": transformers' Step3p7TextModel, the language model of Step 3.7's
Step3p7ForConditionalGeneration, model_type "step3p7": Step-3.7-Flash), as transformers' Step3p7DecoderLayer builds
it: pre-norm blocks whose RMSNorms scale by 1 + weight in fp32 (Gemma's: model.norm_unit_offset), with
- attention: q/k/v/o_proj without biases, a per-head QK-norm (1 + weight too) before RoPE, scores scaled by
  query_pre_attn_scalar ** -0.5 (model.attn_scale), a sigmoid gate on the heads' output (self_attn.g_proj: one a head,
  (H, C), with gating true or "per-head": model.attn_gate=head; else one an element, attn_gate=element); RoPE
  parameters per layer type (rope_parameters keyed by full_attention / sliding_attention: the full layers' base and
  scaling as rope_theta / rope_scaling, the windowed layers' base as rope_local_theta, each type's
  partial_rotary_factor as rope_dims / rope_local_dims); the sliding_attention layers of layer_types windowed, with
  their own query head count (num_sliding_attention_heads, applied through per_layer_config: model.window_n_head),
  the KV heads and head width the full layers';
- mlp_layer_types: dense layers a SwiGLU intermediate_size wide (moe_dense_layers where they come first, else
  moe_layers); sparse ones the router's sigmoid scores (mlp.gate.weight) plus a bias that chooses
  (e_score_correction_bias, the Hub's moe.router_bias: model.moe_expert_bias), the top num_experts_per_tok rescaled
  to sum to 1 without an epsilon, times moe_router_scaling_factor (model.moe_scale), SwiGLU experts
  moe_intermediate_size wide beside an ungated shared expert share_expert_dim wide (shared_experts, the Hub's
  share_expert);
- swiglu_limits (the routed experts) and swiglu_limits_shared (the shared expert and the dense MLPs): per-layer clamps
  after the activation, min(silu(gate), L) · clamp(up, -L, L), 0 or none for no clamp (model.moe_swiglu_act_limits,
  swiglu_act_limits).
The Hub's config form is read too: trailing multi-token-prediction entries (num_nextn_predict_layers) cut off the
per-layer lists and their layers left unread (transformers ignores them on load), moe_layers_enum,
attention_other_setting's head count, per-layer rope_theta and partial_rotary_factors lists; hidden_act is read as
SiLU whatever it says (the Hub's "swigluoai" names the clamp, which Step3p7TextConfig reads as silu).
Per-layer rope_theta and partial_rotary_factors are read as transformers reads them: each layer type's first layer's
value for every layer of that type. Refused by name: use_bidirectional_attention, attention_bias, mlp_bias, a
windowed head count of its own without a window, RoPE scaling on the windowed layers. Import only: no architecture
redline exports to has Step's windowed head count or its clamps, transformers has no text-only Step model
(Step3p7ForConditionalGeneration needs its vision tower's weights) and redline has no GGUF writer for llama.cpp's
step35. Semantics read from transformers' models/step3p7/modeling_step3p7.py and
configuration_step3p7.py.
"""

from __future__ import annotations

import re

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, pad_rows, raise_first, take_head
from redline.interop.gemma3 import _rope_fields
from redline.interop.llama import layer_windows, shape_fields
from redline.interop.windowed_moe import _mlp_layers
from redline.model import ModelConfig

_FULL, _SLIDING = "full_attention", "sliding_attention"
_LAYER = re.compile(r"model\.layers\.(\d+)\..*")
# Step3p7TextConfig.attribute_map: the Hub's names for its fields
_ALIASES = {"num_local_experts": "n_routed_experts", "moe_num_experts": "n_routed_experts",
            "num_attention_groups": "num_key_value_heads", "moe_top_k": "num_experts_per_tok",
            "share_expert_dims": "share_expert_dim", "num_mtp_layers": "num_nextn_predict_layers"}
# Step3p7TextConfig's defaults for the fields redline reads, which transformers fills in where a config leaves them out
DEFAULTS = dict(vocab_size=128_815, hidden_size=4096, intermediate_size=11_264, num_hidden_layers=45,
                num_attention_heads=64, num_key_value_heads=8, head_dim=128, max_position_embeddings=128_000,
                rms_norm_eps=1e-5, num_experts_per_tok=8, moe_intermediate_size=1280, n_routed_experts=288,
                share_expert_dim=1280, tie_word_embeddings=False)


def _rotated(params: dict, head_dim: int) -> int:
    """The dimensions of each head a layer type's RoPE turns (transformers' int(head_dim · partial_rotary_factor))."""
    return int(head_dim * float(params.get("partial_rotary_factor", 1.0)))


def _per_type(values: list, kinds: list[str]) -> dict:
    """{layer type: its value} from a per-layer list: each type's first layer's, as Step3p7TextConfig builds
    rope_parameters (its RoPE has one table a layer type, whatever the other layers' entries say)."""
    out = {}
    for kind, value in zip(kinds, values):
        out.setdefault(kind, value)
    return out


def normalized(hf: dict) -> dict:
    """The text config as Step3p7TextConfig.__post_init__ reads it: the Hub's form (MTP entries past the last layer,
    moe_layers_enum, attention_other_setting, per-layer rope_theta / partial_rotary_factors) as transformers' saved
    form (mlp_layer_types, num_sliding_attention_heads, rope_parameters keyed by layer type)."""
    hf = dict(hf)
    for alias, field in _ALIASES.items():  # Step3p7TextConfig.attribute_map: the alias sets the field
        if alias in hf:
            hf[field] = hf.pop(alias)
    n, mtp = hf["num_hidden_layers"], int(hf.get("num_nextn_predict_layers") or 0)
    for key in ("layer_types", "mlp_layer_types", "swiglu_limits", "swiglu_limits_shared", "rope_theta",
                "partial_rotary_factors"):
        if isinstance(hf.get(key), list) and len(hf[key]) == n + mtp:
            hf[key] = hf[key][:n]
    kinds = hf.get("layer_types") or [_FULL] * n
    hf["layer_types"] = kinds
    if not hf.get("mlp_layer_types"):
        enum = hf.get("moe_layers_enum")
        if enum is not None:
            items = enum.split(",") if isinstance(enum, str) else enum
            sparse = {int(i) for i in items if str(i).strip()}
        else:
            sparse = set(range(3, n))
        hf["mlp_layer_types"] = ["sparse" if i in sparse else "dense" for i in range(n)]
    if hf.get("num_sliding_attention_heads") is None:
        other = hf.get("attention_other_setting") or {}
        hf["num_sliding_attention_heads"] = other.get("num_attention_heads", hf["num_attention_heads"])
    params = hf.get("rope_parameters") or {}
    if not all(isinstance(params.get(kind), dict) for kind in set(kinds)):
        thetas = hf.get("rope_theta", 10_000.0)
        thetas = _per_type(thetas if isinstance(thetas, list) else [thetas] * n, kinds)
        factors = hf.get("partial_rotary_factors")
        factors = _per_type(factors, kinds) if factors else {}
        params = {kind: {"rope_type": "default", "rope_theta": thetas[kind],
                         **({"partial_rotary_factor": factors[kind]} if factors else {})} for kind in set(kinds)}
        if hf.get("rope_scaling") and _FULL in params:
            params[_FULL].update(hf["rope_scaling"])
    hf["rope_parameters"] = params
    return hf


def _limits(values: list | None, n: int) -> tuple[float, ...]:
    """A per-layer clamp list as ModelConfig takes it: 0 where none (None or 0), () where no layer is clamped."""
    limits = tuple(float(v or 0.0) for v in (values or [0.0] * n))
    if len(limits) != n:
        raise UserError(f"swiglu_limits {values}: expected one entry a layer ({n})")
    return limits if any(limits) else ()


def model_config(hf: dict) -> ModelConfig:
    hf = normalized({**DEFAULTS, **hf})
    raise_first([
        (bool(hf.get("use_bidirectional_attention")), "use_bidirectional_attention=true: redline's attention is "
                                                      "causal; Step's bidirectional windows are not read"),
        (bool(hf.get("attention_bias")), "attention_bias=true: Step then has biases on q/k/v and o_proj, which "
                                         "redline's mixtures of experts do not have"),
        (bool(hf.get("mlp_bias")), "mlp_bias=true: Step then has biases in its dense and shared MLPs, which redline's "
                                   "mixtures of experts do not have")])
    n, heads = hf["num_hidden_layers"], hf["num_attention_heads"]
    kinds = hf["layer_types"]
    windows = layer_windows(hf, n, kinds)
    windowed = bool(windows["sliding_window"])
    window_heads = int(hf["num_sliding_attention_heads"])
    if window_heads != heads and not windowed:
        raise UserError(f"num_sliding_attention_heads={window_heads} without windowed layers (sliding_window="
                        f"{hf.get('sliding_window')}): redline gives a windowed layer's own head count to windowed "
                        f"layers alone")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    params = hf["rope_parameters"]
    full_dims = _rotated(params.get(_FULL) or params.get(_SLIDING), head_dim)
    local_dims = _rotated(params.get(_SLIDING) or {}, head_dim) if windowed else full_dims
    mlp_kinds = hf["mlp_layer_types"]
    if len(mlp_kinds) != n or not set(mlp_kinds) <= {"sparse", "dense"}:
        raise UserError(f"mlp_layer_types {mlp_kinds}: expected {n} entries of sparse / dense")
    experts = int(hf["n_routed_experts"])
    scalar = float(hf.get("query_pre_attn_scalar") or head_dim)
    gating = hf.get("gating", True)
    rope = {**params, _FULL: params.get(_FULL) or params.get(_SLIDING) or {}}  # every layer windowed: one table
    return ModelConfig(
        **{**shape_fields(hf), "mlp_hidden": int(hf["moe_intermediate_size"])}, qk_norm=True,
        qk_norm_scope="head", fused_qkv=True, attn_gate="head" if gating is True or gating == "per-head" else "element",
        attn_scale=scalar ** -0.5 if scalar != head_dim else 0.0, pos_emb="rope", mlp="swiglu", fused_mlp=True,
        norm="rmsnorm", norm_unit_offset=True, norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False,
        moe_experts=experts, moe_top_k=int(hf["num_experts_per_tok"]), moe_gating="sigmoid",
        moe_expert_bias=True, moe_norm_topk=True, moe_norm_eps=0.0,
        moe_scale=float(hf.get("moe_router_scaling_factor") or 1.0),
        moe_shared_hidden=int(hf["share_expert_dim"]), moe_shared_gate=False,
        window_n_head=window_heads if window_heads != heads else 0,
        swiglu_act_limits=_limits(hf.get("swiglu_limits_shared"), n),
        moe_swiglu_act_limits=_limits(hf.get("swiglu_limits"), n),
        rope_dims=full_dims if full_dims != head_dim else 0,
        rope_local_dims=local_dims if local_dims != full_dims else 0, **windows,
        **_rope_fields({**hf, "rope_parameters": rope}, windowed=windowed),
        **_mlp_layers([k == "sparse" for k in mlp_kinds], hf))


def _swiglu(src: TensorSource, prefix: str) -> torch.Tensor:
    """(gate; up) rows of the SwiGLU under prefix, as redline's fused fc."""
    return torch.cat([src.take(prefix + "gate_proj.weight"), src.take(prefix + "up_proj.weight")])


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    """The text model's tensors, under the Hub's names (moe.*, share_expert.*, as save_pretrained writes them) or
    transformers' in-memory ones (mlp.gate.*, mlp.experts.gate_up_proj, mlp.shared_experts.*)."""
    out = {"norm_f.weight": src.take("model.norm.weight"),
           "wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        attn = p + "self_attn."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        out[r + "attn.qkv.weight"] = torch.cat([src.take(f"{attn}{x}_proj.weight") for x in "qkv"])
        out[r + "attn.proj.weight"] = src.take(attn + "o_proj.weight")
        out[r + "attn.q_norm.weight"] = src.take(attn + "q_norm.weight")
        out[r + "attn.k_norm.weight"] = src.take(attn + "k_norm.weight")
        out[r + "attn.gate.weight"] = src.take(attn + "g_proj.weight")
        if not cfg.layer_has_experts(i):
            out[r + "mlp.fc.weight"] = _swiglu(src, p + "mlp.")
            out[r + "mlp.proj.weight"] = src.take(p + "mlp.down_proj.weight")
            continue
        if p + "moe.gate.weight" in src:  # the Hub's: gate_proj and up_proj (E, F, C) each, down_proj (E, C, F)
            out[r + "mlp.router.weight"] = src.take(p + "moe.gate.weight")
            out[r + "mlp.expert_bias"] = src.take(p + "moe.router_bias").float()
            out[r + "mlp.fc"] = torch.cat([src.take(p + "moe.gate_proj.weight"), src.take(p + "moe.up_proj.weight")],
                                          dim=1)
            out[r + "mlp.proj"] = src.take(p + "moe.down_proj.weight")
            shared = p + "share_expert."
        else:  # transformers' in-memory: gate_up_proj (E, 2F, C) rows [gate; up], down_proj (E, C, F)
            out[r + "mlp.router.weight"] = src.take(p + "mlp.gate.weight")
            out[r + "mlp.expert_bias"] = src.take(p + "mlp.gate.e_score_correction_bias").float()
            out[r + "mlp.fc"] = src.take(p + "mlp.experts.gate_up_proj")
            out[r + "mlp.proj"] = src.take(p + "mlp.experts.down_proj")
            shared = p + "mlp.shared_experts."
        out[r + "mlp.shared.fc.weight"] = _swiglu(src, shared)
        out[r + "mlp.shared.proj.weight"] = src.take(shared + "down_proj.weight")
    # the Hub's multi-token-prediction layers after the last (num_nextn_predict_layers): no part of the causal LM,
    # which transformers ignores on load too (marked read, unread)
    src.used.update(n for n in src.names if (m := _LAYER.fullmatch(n)) and int(m.group(1)) >= cfg.n_layer)
    return out


def _import_only(cfg: ModelConfig) -> dict:
    raise UserError("Step 3.5's text model is imported alone: transformers has no text-only Step model "
                    "(Step3p7ForConditionalGeneration needs its vision tower's weights)")


TEXT_FAMILY = Family(name="step3p5", architecture="Step3p5ForCausalLM", model_config=model_config,
                     hf_config=_import_only, to_redline=to_redline, to_hf=_import_only)
"""Step 3.5's text model: its own folders (Step-3.5-Flash's, the Hub's names) and inside Step 3.7's (multimodal.py);
import only."""
