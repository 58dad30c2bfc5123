"""Gemma (Google's first GemmaForCausalLM, model_type "gemma": gemma-2b, gemma-7b, CodeGemma, gemma-1.1): the Llama
layout's tensor names and pre-norm block with Gemma's own parts, each a ModelConfig field: RMSNorm scaling by
(1 + weight) in fp32 (norm_unit_offset), a GeGLU MLP with tanh-GELU (mlp "geglu"; the released configs' legacy
hidden_act "gelu" means it, as transformers reads them), the token embeddings times sqrt(hidden_size) in their
dtype (embed_scale), head_dim apart from width / heads (gemma-7b: 16 heads of 256 in a width of 3072). No window, no
QK-norm, no caps (Gemma 2 and 3 add those: gemma2.py, gemma3.py). Semantics read from transformers'
models/gemma/modeling_gemma.py.
"""

from __future__ import annotations

from redline.errors import UserError
from redline.interop.families import Family, raise_first
from redline.interop.llama import _ignorable, _rope, rope_scaling, shape_fields, to_hf, to_redline
from redline.model import ModelConfig

_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new", "gelu")  # "gelu": the released configs' name for the tanh one


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in _TANH_GELU:
        raise UserError(f"hidden_act={act!r}: redline's GeGLU uses the tanh-approximated GELU, which Gemma's configs "
                        f"name {', '.join(_TANH_GELU)}")
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: Gemma then has biases on q/k/v/o but none in its MLP, a mix redline "
                        "does not have (biases on q/k/v alone, or on every Linear layer)")
    if hf.get("use_bidirectional_attention"):
        raise UserError("use_bidirectional_attention=true: redline's models attend causally")
    return ModelConfig(
        **shape_fields(hf, context_len=8192), fused_qkv=True, pos_emb="rope", mlp="geglu", fused_mlp=True,
        norm="rmsnorm", norm_unit_offset=True, embed_scale=True, norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=False, **_rope(hf))


def wants_gemma(cfg: ModelConfig) -> bool:
    """Gemma's own norms or embedding scale on pre-norm blocks (Gemma 2 and 3 have sandwich norms)."""
    return cfg.norm_position == "pre" and (cfg.norm_unit_offset or cfg.embed_scale)


def check_exportable(cfg: ModelConfig) -> None:
    what = "model.norm_unit_offset or model.embed_scale with pre-norm blocks: Gemma, the one architecture with them " \
           "redline exports to,"
    raise_first([
        (not (cfg.norm_unit_offset and cfg.embed_scale and cfg.norm == "rmsnorm"),
         f"{what} has both, with RMSNorm"),
        (cfg.mlp != "geglu" or cfg.gelu_approximate != "tanh", f"{what} has a GeGLU MLP with tanh-GELU "
                                                               f"(model.mlp={cfg.mlp})"),
        (cfg.parallel_residual, f"{what} has sequential sublayers (model.parallel_residual)"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_local_theta,
         f"{what} rotates every layer's whole heads with one RoPE"),
        (cfg.qk_norm, f"{what} has no QK-norm (Gemma 3 does, with sandwich norms)"),
        (cfg.sliding_window > 0, f"{what} attends to the whole context (Gemma 2 and 3 window theirs)"),
        (cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap,
         f"{what} scales its scores by 1 / sqrt(head_dim) and caps nothing (model.attn_scale, attn_softcap, "
         f"logit_softcap: Gemma 2's and 3's)"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no biases (model.bias, model.qkv_bias)"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    rope = {"rope_theta": cfg.rope_theta, "rope_scaling": rope_scaling(cfg, "gemma")}
    return {
        "model_type": "gemma", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": cfg.context_len,
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True, **rope,
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,  # the writer sets the token ids
    }


FAMILY = Family(name="gemma", architecture="GemmaForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
