"""EXAONE 4.0 (LG AI Research's Exaone4ForCausalLM: EXAONE-4.0-1.2B, EXAONE-4.0-32B): OLMo 2's block with QK-norm
per head.

Each block is h = x + norm(attn(x)), out = h + norm(mlp(h)), the norms on the sublayers' outputs (redline's
norm_position "output", OLMo 2's tensor names), with an RMSNorm over each head's q and k (qk_norm_scope "head", as
Qwen3's). The hybrid models interleave sliding-window layers, which rotate, with full layers, which do not (NoPE):
`layer_types` with one full layer in every N is redline's sliding_window_pattern N with nope_interval N. A model
whose config gives no window attends to the whole context on every layer, all of them rotating. Semantics read from
transformers' models/exaone4/modeling_exaone4.py. EXAONE-MoE below.
"""

from __future__ import annotations

from dataclasses import replace

from redline.errors import UserError
from redline.interop import dots1
from redline.interop.families import Family, raise_first
from redline.interop.llama import _ignorable, _rope, check_silu, hf_config_for, shape_fields, to_hf, to_redline
from redline.model import ModelConfig


def _layers(hf: dict) -> tuple[int, int]:
    """(sliding_window, its pattern N: layer i full and without RoPE where (i + 1) % N == 0; 0: every layer windowed)
    from sliding_window and layer_types (or sliding_window_pattern, as transformers builds layer_types from it)."""
    n = hf["num_hidden_layers"]
    window = int(hf.get("sliding_window") or 0)
    kinds = hf.get("layer_types")
    if kinds is None:
        pattern = hf.get("sliding_window_pattern")
        if not window:
            kinds = ["full_attention"] * n
        elif isinstance(pattern, str) and pattern:  # "LLLG": L local, G global, repeated from layer 0
            kinds = ["full_attention" if pattern[i % len(pattern)] == "G" else "sliding_attention" for i in range(n)]
        elif pattern:
            kinds = ["full_attention" if (i + 1) % int(pattern) == 0 else "sliding_attention" for i in range(n)]
        else:
            raise UserError("sliding_window is set without layer_types or sliding_window_pattern: which layers use "
                            "the window is not given")
    if len(kinds) != n:
        raise UserError(f"layer_types has {len(kinds)} entries for {n} layers")
    full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
    if not window:
        if len(full) != n:
            raise UserError("layer_types names sliding-window layers, but sliding_window is not set")
        return 0, 0
    if not full:
        return window, 0
    if len(full) == n:
        raise UserError("sliding_window is set with every layer full: EXAONE 4.0 then rotates no layer, which "
                        "redline does not express (its NoPE layers come one in every N)")
    interval = full[0] + 1
    if full != [i for i in range(n) if (i + 1) % interval == 0]:
        raise UserError(f"layer_types puts full-attention layers at {full}, not one in every {interval}; redline "
                        f"takes them at a fixed interval (model.sliding_window_pattern)")
    return window, interval


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    window, pattern = _layers(hf)
    return ModelConfig(
        **shape_fields(hf), qk_norm=True, qk_norm_scope="head", fused_qkv=True, pos_emb="rope", mlp="swiglu",
        fused_mlp=True, norm="rmsnorm", norm_position="output", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False, sliding_window=window,
        sliding_window_pattern=pattern, nope_interval=pattern, **_rope(hf))


def wants_exaone4(cfg: ModelConfig) -> bool:
    """Output norms with QK-norm per head: EXAONE 4.0's (OLMo 2 normalizes whole projections)."""
    return cfg.norm_position == "output" and cfg.qk_norm and cfg.qk_norm_scope == "head"


def check_exportable(cfg: ModelConfig) -> None:
    what = "norm_position=output with per-head QK-norm: EXAONE 4.0, the one architecture with it redline exports to,"
    raise_first([
        (cfg.norm != "rmsnorm" or cfg.mlp != "swiglu", f"{what} has RMSNorm and SwiGLU (model.norm={cfg.norm}, "
                                                       f"model.mlp={cfg.mlp})"),
        (cfg.pos_emb != "rope" or cfg.rope_dims, f"{what} rotates whole heads with RoPE"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no biases (model.bias, model.qkv_bias)"),
        (cfg.nope_interval != (cfg.sliding_window_pattern if cfg.sliding_window else 0),
         f"{what} leaves RoPE out of exactly its full-attention layers (model.nope_interval="
         f"{cfg.nope_interval}, model.sliding_window_pattern={cfg.sliding_window_pattern})"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    out = hf_config_for("llama")(cfg)
    for key in ("pretraining_tp", "attention_bias", "mlp_bias"):
        out.pop(key, None)
    window = cfg.sliding_window
    kinds = ["sliding_attention" if window and cfg.layer_window(i) else "full_attention" for i in range(cfg.n_layer)]
    return {**out, "model_type": "exaone4", "sliding_window": window or None,
            "sliding_window_pattern": cfg.sliding_window_pattern if window else None, "layer_types": kinds,
            "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}  # the writer sets the token ids


FAMILY = Family(name="exaone4", architecture="Exaone4ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# EXAONE-MoE (ExaoneMoeForCausalLM, model_type "exaone_moe": K-EXAONE-236B-A23B): EXAONE 4.0's attention (QK-norm per
# head, windowed layers that rotate and full ones that do not) in pre-norm blocks (OLMoE's: input_layernorm,
# post_attention_layernorm), with dots.llm1's tensors and DeepSeek-V3's mixture of experts after the dense first
# layers (mlp_layer_types, or first_k_dense_replace): sigmoid scores, e_score_correction_bias choosing the top k
# among the best groups, the chosen rescaled (norm_topk_prob) and scaled by routed_scaling_factor, plus an ungated
# shared SwiGLU num_shared_experts x moe_intermediate_size wide. The Hub's files name the bias
# mlp.e_score_correction_bias (transformers moves it under mlp.gate on loading). Semantics read from transformers'
# models/exaone_moe/modular_exaone_moe.py.


def moe_model_config(hf: dict) -> ModelConfig:
    n = hf["num_hidden_layers"]
    first = int(hf.get("first_k_dense_replace", 1) or 0)
    kinds = hf.get("mlp_layer_types") or ["dense" if i < first else "sparse" for i in range(n)]
    dense = next((i for i, kind in enumerate(kinds) if kind != "dense"), len(kinds))
    if kinds != ["dense"] * dense + ["sparse"] * (n - dense) or dense == n:
        raise UserError(f"mlp_layer_types={kinds}: redline's EXAONE-MoE takes its dense layers first, then sparse "
                        f"ones (model.moe_dense_layers), with at least one sparse layer")
    experts, top_k = int(hf.get("num_experts") or 0), int(hf.get("num_experts_per_tok") or 0)
    shared, width = int(hf.get("num_shared_experts") or 0), int(hf.get("moe_intermediate_size", 1024))
    if not experts or not top_k or not shared:
        raise UserError(f"num_experts={hf.get('num_experts')}, num_experts_per_tok={hf.get('num_experts_per_tok')}, "
                        f"num_shared_experts={hf.get('num_shared_experts')}: EXAONE-MoE's mixtures have routed and "
                        f"shared experts; the config must give all three")
    groups = int(hf.get("n_group") or 1)
    aux = float(hf.get("router_aux_loss_coef") or 0.0) if hf.get("output_router_logits") else 0.0
    return replace(
        model_config(hf), norm_position="pre", mlp_hidden=width, moe_experts=experts, moe_top_k=top_k,
        moe_dense_layers=dense, moe_dense_hidden=int(hf.get("intermediate_size", 16384)) if dense else None,
        moe_gating="sigmoid", moe_expert_bias=True, moe_norm_topk=bool(hf.get("norm_topk_prob", True)),
        moe_norm_eps=1e-20, moe_scale=float(hf.get("routed_scaling_factor", 2.5)), moe_groups=groups,
        moe_topk_groups=int(hf.get("topk_group") or 1) if groups > 1 else 1, moe_shared_hidden=shared * width,
        moe_shared_gate=False, moe_aux_loss=aux)


def wants_exaone_moe(cfg: ModelConfig) -> bool:
    """Sigmoid-scored experts with EXAONE 4.0's NoPE full layers among windowed ones (dots.llm1 rotates every
    layer)."""
    return dots1.wants_dots1(cfg) and bool(cfg.nope_interval)


def check_moe_exportable(cfg: ModelConfig) -> None:
    if not cfg.sliding_window or cfg.nope_interval != cfg.sliding_window_pattern:
        raise UserError(f"model.nope_interval={cfg.nope_interval} with sigmoid-scored experts: EXAONE-MoE, the one "
                        f"architecture with both redline exports to, leaves RoPE out of exactly its full-attention "
                        f"layers (model.sliding_window_pattern={cfg.sliding_window_pattern}, with a window)")
    dots1.check_exportable(replace(cfg, nope_interval=0))


def moe_hf_config(cfg: ModelConfig) -> dict:
    out = {**dots1.hf_config(cfg), **hf_config(cfg)}
    for key in ("n_routed_experts", "n_shared_experts", "max_window_layers"):
        out.pop(key, None)
    out.update(model_type="exaone_moe", num_experts=cfg.moe_experts, num_shared_experts=cfg.moe_shared_hidden //
               cfg.hidden_dim, mlp_layer_types=["dense" if i < cfg.moe_dense_layers else "sparse"
                                                for i in range(cfg.n_layer)],
               intermediate_size=cfg.moe_dense_hidden or cfg.hidden_dim, output_router_logits=bool(cfg.moe_aux_loss),
               router_aux_loss_coef=cfg.moe_aux_loss or 0.001)
    return out


def _moe_ignorable(name: str) -> bool:
    return _ignorable(name) or name.startswith("mtp.")  # the multi-token prediction layers transformers drops


def moe_to_hf(state, cfg: ModelConfig) -> dict:
    """dots.llm1's tensors with the choosing bias where EXAONE-MoE's Hub files keep it (mlp.e_score_correction_bias)."""
    suffix = "mlp.gate.e_score_correction_bias"
    return {(k[:-len(suffix)] + "mlp.e_score_correction_bias" if k.endswith(suffix) else k): v
            for k, v in dots1.to_hf(state, cfg).items()}


MOE_FAMILY = Family(name="exaone_moe", architecture="ExaoneMoeForCausalLM", model_config=moe_model_config,
                    hf_config=moe_hf_config, to_redline=dots1.to_redline, to_hf=moe_to_hf, ignorable=_moe_ignorable)
