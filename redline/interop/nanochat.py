"""nanochat (NanoChatForCausalLM, model_type "nanochat": karpathy/nanochat-d20, -d32 and the models trained with it).

Llama's tensor names for attention, with a block of its own: RMSNorms without weights (redline's norm_affine=false),
one of them on the token embeddings before the first block (embed_norm), a per-head QK-norm (weightless too),
a ReLU² MLP of two bias-free layers (`mlp.fc1`, `mlp.fc2`), an untied head and Gemma 2's logit soft-capping
(`final_logit_softcapping`). Semantics read from transformers' models/nanochat/modular_nanochat.py.

Its RoPE rotates the other way: its rotate_half gives (x2, -x1) where Llama's gives (-x2, x1), a rotation by -θ.
With D negating the second half of a head, that rotation is D·R(θ)·D, so q and k projections whose second-half rows
are negated run under redline's rotation as D times nanochat's rotated q and k; a weightless RMSNorm keeps D (it
scales each row by one number) and D·D = 1 in every q·k product, so the scores, and the model, are nanochat's. The
same weightless norm is why nanochat's norm-after-RoPE order is redline's norm-before-RoPE: a rotation keeps a
head's RMS. Importing and exporting both negate those rows (the map is its own inverse).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import _ignorable, _prefix, _qkv, _rope, rope_scaling, shape_fields
from redline.model import ModelConfig


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "relu2")
    if act != "relu2":
        raise UserError(f"hidden_act={act!r}: nanochat's MLP is ReLU² (relu2); redline's nanochat has no other")
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: redline's nanochat has no biases (nanochat's models have none)")
    cap = hf.get("final_logit_softcapping")
    return ModelConfig(
        **shape_fields(hf), qk_norm=True, fused_qkv=True, pos_emb="rope", mlp="relu2", norm="rmsnorm",
        norm_affine=False, embed_norm=True, norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False, logit_softcap=float(cap or 0.0),
        **_rope(hf))


def check_exportable(cfg: ModelConfig) -> None:
    """The redline options nanochat has no place for, chosen by model.embed_norm or model.norm_affine=false."""
    what = "nanochat, the one architecture with norms without weights or a norm on the embeddings redline exports to,"
    raise_first([
        (cfg.norm_affine, f"model.embed_norm with norms that have weights (model.norm_affine=true): {what} has no "
                          f"norm weights"),
        (not cfg.embed_norm, f"model.norm_affine=false without model.embed_norm: {what} normalizes its embeddings "
                             f"(OLMo, with weightless norms too, has LayerNorm: model.norm=layernorm)"),
        (cfg.norm != "rmsnorm" or cfg.norm_position != "pre" or cfg.parallel_residual,
         f"{what} has pre-RMSNorm blocks of sequential sublayers"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "head", f"{what} has a QK-norm per head (model.qk_norm)"),
        (cfg.mlp != "relu2", f"model.mlp={cfg.mlp}: {what} has a ReLU² MLP (model.mlp=relu2)"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_local_theta,
         f"{what} rotates every layer's whole heads with one RoPE"),
        (cfg.sliding_window > 0, f"{what} attends to the whole context (model.sliding_window)"),
        (cfg.bias or cfg.has_qkv_bias or cfg.head_bias, f"{what} has no biases (model.bias, qkv_bias, head_bias)"),
        (cfg.attn_scale or cfg.attn_softcap, f"{what} scales its scores by 1/sqrt(head_dim), uncapped"),
        (cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor,
         f"{what} has no embedding, residual or logit scalars"),
        (cfg.value_embeddings, f"{what} has no value embeddings (model.value_embeddings)"),
        (cfg.moe_experts or cfg.conv_layers, f"{what} has attention and one dense MLP in every layer "
                                             f"(model.moe_experts, model.conv_layers)"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "model_type": "nanochat", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "relu2",
        "max_position_embeddings": cfg.context_len, "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                            **(rope_scaling(cfg, "nanochat") or {})},
        "final_logit_softcapping": cfg.logit_softcap or None, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": cfg.tie_embeddings, "initializer_range": 0.02, "use_cache": True,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,  # the writer sets the token ids
    }


def flip_rope_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """q or k rows (heads * D, C) with each head's second half negated: nanochat's rotation by -θ as redline's by θ
    (the module docstring); its own inverse."""
    D = w.shape[0] // heads
    return (w.reshape(heads, 2, D // 2, -1) * w.new_tensor([1.0, -1.0]).view(1, 2, 1, 1)).reshape(w.shape)


def _to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = _prefix(src)
    out = {"wte.weight": pad_rows(src.take(f"{pre}embed_tokens.weight"), cfg)}
    out.update(take_head(src, cfg))
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        q, k, v = (src.take(f"{p}self_attn.{x}_proj.weight") for x in "qkv")
        out[r + "attn.qkv.weight"] = torch.cat([flip_rope_rows(q, cfg.n_head), flip_rope_rows(k, cfg.kv_heads), v])
        out[r + "attn.proj.weight"] = src.take(p + "self_attn.o_proj.weight")
        out[r + "mlp.fc.weight"] = src.take(p + "mlp.fc1.weight")
        out[r + "mlp.proj.weight"] = src.take(p + "mlp.fc2.weight")
    return out


def _to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    V = cfg.vocab_size
    out = {"model.embed_tokens.weight": state["wte.weight"][:V]}
    out.update(give_head(state, cfg))
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        q, k, v = _qkv(state, r, cfg, "weight")
        out[p + "self_attn.q_proj.weight"] = flip_rope_rows(q, cfg.n_head)
        out[p + "self_attn.k_proj.weight"] = flip_rope_rows(k, cfg.kv_heads)
        out[p + "self_attn.v_proj.weight"] = v
        out[p + "self_attn.o_proj.weight"] = state[r + "attn.proj.weight"]
        out[p + "mlp.fc1.weight"] = state[r + "mlp.fc.weight"]
        out[p + "mlp.fc2.weight"] = state[r + "mlp.proj.weight"]
    return {k: t.contiguous() for k, t in out.items()}


FAMILY = Family(name="nanochat", architecture="NanoChatForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=_to_redline, to_hf=_to_hf, ignorable=_ignorable)
