"""MiniMax-M2 (MiniMaxM2ForCausalLM, model_type "minimax_m2": MiniMaxAI/MiniMax-M2, M2.1): Mixtral's block and names
with three changes, as transformers' models/minimax_m2 computes them:
- QK-norm over the whole q and k projections (q_norm (H·D,), k_norm (KV·D,): RMS over every head together, before
  the split into heads and before RoPE), OLMoE's kind (model.qk_norm_scope=all);
- RoPE on the first rotary_dim of each head (rope_parameters' partial_rotary_factor, which MiniMaxM2Config derives
  from rotary_dim: model.rope_dims), in (first half, second half) pairs as redline's;
- the router (block_sparse_moe.gate.weight (E, C)) scores each expert by its sigmoid (model.moe_gating=sigmoid);
  block_sparse_moe.e_score_correction_bias (E,) is added to choose the top num_experts_per_tok
  (model.moe_expert_bias), and the chosen sigmoid scores are divided by their sum with no epsilon
  (model.moe_norm_topk, moe_norm_eps=0), as MiniMaxM2TopKRouter computes them; every layer has the experts, SwiGLUs
  intermediate_size wide (block_sparse_moe.experts.j.w1 / w3 / w2, the Hub's and transformers' saved layout; the
  in-memory mlp.experts.gate_up_proj / down_proj stacks, and the bias as mlp.e_score_correction_bias, are read too).
The released checkpoints' fp8 weights (quantization_config fp8, e4m3 with a weight_scale_inv a 128 x 128 block, as
DeepSeek-V3's) are dequantized on import as deepseek.py dequantizes those. Refused by name: another quantization, an
activation other than SiLU, output_router_logits (transformers' load-balancing loss softmaxes the router logits; redline's is
over the sigmoid scores) and router_jitter_noise (noise on the experts' input in training). A redline model with
sigmoid-scored experts and QK-norm over whole projections exports as MiniMax-M2; PEFT adapters on the attention as
Llama's (the experts and router are no Linear layers in transformers); GGUF both ways as llama.cpp's minimax-m2
(gguf_file.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.deepseek import _Dequantizing
from redline.interop.llama import _qkv, _rope, check_silu, shape_fields
from redline.interop.moe import experts_to_hf, experts_to_redline
from redline.model import ModelConfig

_MOE = "block_sparse_moe."


def _rotary_dims(hf: dict, head_dim: int) -> int:
    """The rotated dimensions of each head: rope_parameters' partial_rotary_factor (transformers 5), else rotary_dim
    (MiniMax's own configs), else the whole head; transformers takes int(head_dim · factor)."""
    params = hf.get("rope_parameters") or {}
    fraction = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    rotated = int(head_dim * float(fraction)) if fraction is not None else int(hf.get("rotary_dim") or head_dim)
    if rotated <= 0 or rotated % 2 or rotated > head_dim:
        raise UserError(f"rotary_dim / partial_rotary_factor rotates {rotated} of each head's {head_dim} dimensions; "
                        f"redline needs an even number in (0, {head_dim}]")
    return rotated


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    quant = hf.get("quantization_config")
    if quant and (quant.get("quant_method") != "fp8" or list(quant.get("weight_block_size") or []) != [128, 128]
                  or quant.get("fmt", "e4m3") not in ("e4m3", "float8_e4m3fn")):
        raise UserError(f"quantization_config (quant_method={quant.get('quant_method')!r}, weight_block_size="
                        f"{quant.get('weight_block_size')}, fmt={quant.get('fmt')!r}): redline dequantizes fp8 e4m3 "
                        f"weights in 128 x 128 blocks (weight_scale_inv) alone; import a bf16 checkpoint of the model")
    if hf.get("output_router_logits"):
        raise UserError("output_router_logits=true: transformers' MiniMax-M2 trains with a load-balancing loss over "
                        "the softmax of the router logits, redline's over the sigmoid scores; set it to false")
    if float(hf.get("router_jitter_noise") or 0.0):
        raise UserError(f"router_jitter_noise={hf['router_jitter_noise']}: redline has no noise on the experts' input "
                        f"in training; set it to 0")
    if hf.get("use_qk_norm") is False or hf.get("qk_norm_type", "per_layer") != "per_layer":
        raise UserError(f"use_qk_norm={hf.get('use_qk_norm')}, qk_norm_type={hf.get('qk_norm_type')!r}: "
                        f"transformers' MiniMax-M2 always normalizes the whole q and k projections (per_layer)")
    count, top_k = hf.get("num_local_experts") or hf.get("num_experts"), hf.get("num_experts_per_tok")
    if not count or not top_k:
        raise UserError("config.json gives no num_local_experts or num_experts_per_tok: the mixture of experts' size "
                        "is unknown")
    if hf.get("scoring_func", "sigmoid") != "sigmoid":
        raise UserError(f"scoring_func={hf['scoring_func']!r}: transformers' MiniMax-M2 scores its experts by their "
                        f"sigmoid")
    shape = shape_fields(hf, context_len=196608)
    head_dim = shape["head_size"] or shape["n_embd"] // shape["n_head"]
    rotated = _rotary_dims(hf, head_dim)
    return ModelConfig(
        **shape, qk_norm=True, qk_norm_scope="all", fused_qkv=True, pos_emb="rope",
        rope_dims=0 if rotated == head_dim else rotated, mlp="swiglu", fused_mlp=True, norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=False, moe_experts=int(count), moe_top_k=int(top_k), moe_gating="sigmoid", moe_expert_bias=True,
        moe_norm_topk=True, moe_norm_eps=0.0, **_rope(hf))


def _prefix(src: TensorSource) -> str:
    return "" if "embed_tokens.weight" in src and "model.embed_tokens.weight" not in src else "model."


def to_redline(source: TensorSource, cfg: ModelConfig) -> dict:
    pre = _prefix(source)
    src = _Dequantizing(source)  # fp8 weights with a weight_scale_inv beside them: dequantized; the rest as stored
    out = {"norm_f.weight": src.take(pre + "norm.weight"),
           "wte.weight": pad_rows(src.take(pre + "embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        attn = p + "self_attn."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        out[r + "attn.qkv.weight"] = torch.cat([src.take(f"{attn}{x}_proj.weight") for x in "qkv"])
        out[r + "attn.proj.weight"] = src.take(attn + "o_proj.weight")
        out[r + "attn.q_norm.weight"] = src.take(attn + "q_norm.weight")  # (H·D,)
        out[r + "attn.k_norm.weight"] = src.take(attn + "k_norm.weight")  # (KV·D,)
        # the router and experts under Mixtral's names (block_sparse_moe.*) or transformers' in-memory ones (mlp.*)
        out.update(experts_to_redline(src, p, r, replace(cfg, moe_expert_bias=False)))
        bias = f"{p}{_MOE}e_score_correction_bias"
        out[r + "mlp.expert_bias"] = src.take(bias if bias in src else f"{p}mlp.e_score_correction_bias").float()
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.norm.weight": state["norm_f.weight"],
           "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size], **give_head(state, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        attn = p + "self_attn."
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
        for x, t in zip("qkv", _qkv(state, r, cfg, "weight")):
            out[f"{attn}{x}_proj.weight"] = t
        out[attn + "o_proj.weight"] = state[r + "attn.proj.weight"]
        out[attn + "q_norm.weight"] = state[r + "attn.q_norm.weight"]
        out[attn + "k_norm.weight"] = state[r + "attn.k_norm.weight"]
        # Mixtral's names, as the Hub's files hold them (transformers stacks them as it loads them)
        out.update(experts_to_hf(state, p, r, replace(cfg, moe_expert_bias=False), "mixtral"))
        bias = state.get(r + "mlp.expert_bias")  # zeros choose as no bias does
        out[f"{p}{_MOE}e_score_correction_bias"] = torch.zeros(cfg.moe_experts) if bias is None else bias.float()
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(cfg: ModelConfig) -> dict:
    rotated = cfg.rope_dims or cfg.head_dim
    from redline.interop.llama import rope_scaling

    scaling = rope_scaling(cfg, "minimax_m2")
    params = {"rope_type": "default", **(scaling or {}), "rope_theta": cfg.rope_theta,
              "partial_rotary_factor": rotated / cfg.head_dim}
    return {
        "model_type": "minimax_m2", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.context_len, "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "rope_parameters": params, "rotary_dim": rotated,
        "num_local_experts": cfg.moe_experts, "num_experts_per_tok": cfg.moe_top_k, "output_router_logits": False,
        "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "attention_dropout": 0.0,
        "initializer_range": 0.02, "use_cache": True, "pad_token_id": None, "bos_token_id": None,
        "eos_token_id": None,  # the writer sets them
        # MiniMax's own config keys, for readers of the Hub's configs (vLLM, llama.cpp's converter)
        "scoring_func": "sigmoid", "use_routing_bias": True, "use_qk_norm": True, "qk_norm_type": "per_layer",
    }


def wants_minimax_m2(cfg: ModelConfig) -> bool:
    """Experts scored by their sigmoid beside attention with QK-norm over whole projections: MiniMax-M2's alone (the
    other sigmoid-scored mixtures redline exports to, dots.llm1's and GLM-4-MoE's, normalize each head)."""
    return bool(cfg.moe_experts and cfg.moe_gating == "sigmoid" and cfg.qk_norm and cfg.qk_norm_scope == "all"
                and not (cfg.conv_layers or cfg.delta_layers or cfg.mlp_free_layers or cfg.mixer_free_layers))


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with sigmoid-scored experts and whole-projection QK-norm that
    MiniMax-M2 does not have."""
    what = "sigmoid-scored experts with QK-norm over whole projections: MiniMax-M2, the architecture with them,"
    named = [name for name in (
        "norm_unit_offset", "embed_norm", "embed_scale", "embed_multiplier", "residual_multiplier", "logit_divisor",
        "logit_softcap", "attn_softcap", "attn_scale", "attn_sinks", "value_embeddings", "nope_interval",
        "rope_layer_theta", "rope_local_theta", "sliding_window", "sliding_window_pattern", "window_layers",
        "head_bias", "qk_norm_after_rope", "moe_layers", "moe_dense_layers", "moe_shared_hidden", "moe_bias",
        "moe_aux_loss", "parallel_residual", "bias", "has_qkv_bias", "moe_weight_input", "kv_lora_rank",
        "attn_chunk") if getattr(cfg, name, None)]
    raise_first([
        (bool(named), f"model.{named[0] if named else ''} with {what} has no such option"),
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or not cfg.norm_affine,
         f"{what} has pre-RMSNorm blocks (model.norm_position, norm, norm_affine)"),
        (cfg.mlp != "swiglu", f"{what} has SwiGLU experts (model.mlp={cfg.mlp})"),
        (cfg.pos_emb != "rope", f"{what} uses RoPE (model.pos_emb={cfg.pos_emb})"),
        (cfg.rope_scaling not in ("none", "linear", "llama3", "yarn"),
         f"model.rope_scaling={cfg.rope_scaling}: {what} reads linear, Llama 3 or YaRN scaling"),
        (cfg.attn_gate != "none", f"{what} has no gate on its heads (model.attn_gate={cfg.attn_gate})"),
        (not cfg.moe_norm_topk or cfg.moe_norm_eps > 1e-20,
         f"model.moe_norm_topk={cfg.moe_norm_topk}, moe_norm_eps={cfg.moe_norm_eps}: {what} rescales the chosen "
         f"scores to sum to 1 with no epsilon (set moe_norm_topk=true, moe_norm_eps=0)"),
        (cfg.moe_scale != 1.0 or cfg.moe_groups > 1,
         f"model.moe_scale={cfg.moe_scale}, moe_groups={cfg.moe_groups}: {what} has no weight scale or groups"),
    ])


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


FAMILY = Family(name="minimax_m2", architecture="MiniMaxM2ForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
