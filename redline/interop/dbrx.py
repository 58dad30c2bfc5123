"""DBRX (DbrxForCausalLM, model_type "dbrx": databricks/dbrx-base, dbrx-instruct), as transformers' models/dbrx
computes it:
- pre-LayerNorm blocks without biases (norm_attn_norm.norm_1 / norm_2, transformer.norm_f: weights alone, eps 1e-5,
  nn.LayerNorm's default): model.norm=layernorm, norm_bias=false;
- attention through one fused Wqkv (rows [q; k; v], redline's qkv as it is) with attn_config.kv_n_heads KV heads, its
  output clamped to ±attn_config.clip_qkv (model.qkv_clip), RoPE on whole heads, out_proj; no biases anywhere;
- a mixture of ffn_config.moe_num_experts SwiGLU experts ffn_hidden_size wide, stored as one fused tensor per
  projection: ffn.experts.mlp.w1 (gate) and v1 (up), (E·F, C) each, and w2 (E·F, C), each expert's down projection
  transposed (redline's proj (E, C, F) is its (F, C) block's transpose); the router (ffn.router.layer (E, C)) takes
  the softmax over the experts, the top moe_top_k, divided by their p-norm for p = moe_normalize_expert_weights:
  p = 1 is the sum, redline's moe_norm_topk (null: not rescaled; any other p is refused by name);
- in training, the router scales the mixture's input by uniform noise in [1 - moe_jitter_eps, 1 + moe_jitter_eps]
  (in place: the experts see it too): model.moe_input_jitter.
transformers 5 reads RoPE's base from rope_parameters alone (10000 where a config gives none) and not from
attn_config.rope_theta, where the Hub's configs keep DBRX's 500000: a config whose two disagree is refused by
name (add rope_parameters to say which). Also refused by name: an activation other than SiLU, dropout
(resid_pdrop, emb_pdrop, attn_pdrop), output_router_logits (transformers' load-balancing loss), a tied head
(transformers refuses it too). A redline model with clamped q/k/v and LayerNorm experts exports as DBRX; PEFT adapters
on Wqkv (redline's qkv as it is) and out_proj; not as GGUF (no writer here for llama.cpp's dbrx).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import rope_scaling
from redline.model import ModelConfig

_DEFAULT_THETA = 10000.0  # transformers' where rope_parameters gives none
# transformers' DbrxAttention clamps its Wqkv output even where clip_qkv is null (and torch.clamp then fails on two
# None bounds): a model without a clamp is written with a bound past every finite float32 and bfloat16 value
_NO_CLIP = float(torch.finfo(torch.float32).max)


def _theta(hf: dict) -> float:
    attn = hf.get("attn_config") or {}
    params = hf.get("rope_parameters") or {}
    if params.get("rope_type", "default") != "default":
        raise UserError(f"rope_parameters' rope_type {params['rope_type']!r} on a DBRX model: redline reads DBRX's "
                        f"unscaled RoPE")
    theta = float(params.get("rope_theta", hf.get("rope_theta", _DEFAULT_THETA)))
    if attn.get("rope_theta") is not None and float(attn["rope_theta"]) != theta:
        raise UserError(f"attn_config.rope_theta={attn['rope_theta']} while transformers reads RoPE's base "
                        f"{theta:g} from rope_parameters (its default where none is given): add rope_parameters "
                        f"{{\"rope_type\": \"default\", \"rope_theta\": ...}} to config.json with the base to run")
    return theta


def model_config(hf: dict) -> ModelConfig:
    attn, ffn = hf.get("attn_config") or {}, hf.get("ffn_config") or {}
    act = (ffn.get("ffn_act_fn") or {"name": "silu"}).get("name", "silu")
    if act not in ("silu", "swish"):
        raise UserError(f"ffn_config.ffn_act_fn={act!r}: redline's SwiGLU experts use SiLU")
    for key, value in (("resid_pdrop", hf.get("resid_pdrop")), ("emb_pdrop", hf.get("emb_pdrop")),
                       ("attn_config.attn_pdrop", attn.get("attn_pdrop"))):
        if value:
            raise UserError(f"{key}={value}: redline's DBRX trains without dropout; set it to 0")
    if hf.get("output_router_logits"):
        raise UserError("output_router_logits=true: redline trains DBRX without transformers' load-balancing loss; "
                        "set it to false")
    if hf.get("tie_word_embeddings"):
        raise UserError("tie_word_embeddings=true: DBRX's head is its own (transformers refuses a tied one)")
    p = ffn.get("moe_normalize_expert_weights", 1.0)
    if p is not None and float(p) != 1.0:
        raise UserError(f"ffn_config.moe_normalize_expert_weights={p}: redline rescales the top-k weights by their "
                        f"sum (p = 1) or not at all (null); the {p}-norm is not supported")
    width, heads = int(hf["d_model"]), int(hf["n_heads"])
    clip = attn.get("clip_qkv")
    clip = None if clip is not None and float(clip) >= _NO_CLIP else clip  # redline's export of no clamp
    return ModelConfig(
        vocab_size=int(hf["vocab_size"]), context_len=int(hf.get("max_seq_len", 2048)), n_layer=int(hf["n_layers"]),
        n_embd=width, n_head=heads, n_kv_head=int(attn.get("kv_n_heads", 1)), mlp_hidden=int(ffn.get(
            "ffn_hidden_size", 3584)), fused_qkv=True, qkv_clip=float(clip or 0.0), pos_emb="rope",
        rope_theta=_theta(hf), mlp="swiglu", fused_mlp=True, norm="layernorm", norm_bias=False, norm_eps=1e-5,
        tie_embeddings=False, bias=False, moe_experts=int(ffn.get("moe_num_experts", 4)),
        moe_top_k=int(ffn.get("moe_top_k", 1)), moe_norm_topk=p is not None,
        moe_input_jitter=float(ffn.get("moe_jitter_eps") or 0.0))


def _prefix(src: TensorSource) -> str:
    return "" if "wte.weight" in src and "transformer.wte.weight" not in src else "transformer."


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = _prefix(src)
    E, F_, C = cfg.moe_experts, cfg.hidden_dim, cfg.n_embd
    out = {"norm_f.weight": src.take(pre + "norm_f.weight"), "wte.weight": pad_rows(src.take(pre + "wte.weight"), cfg),
           **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"{pre}blocks.{i}.", f"blocks.{i}."
        block = p + "norm_attn_norm."
        out[r + "norm1.weight"] = src.take(block + "norm_1.weight")
        out[r + "norm2.weight"] = src.take(block + "norm_2.weight")
        out[r + "attn.qkv.weight"] = src.take(block + "attn.Wqkv.weight")
        out[r + "attn.proj.weight"] = src.take(block + "attn.out_proj.weight")
        experts = p + "ffn.experts.mlp."
        gate, up = (src.take(experts + n).reshape(E, F_, C) for n in ("w1", "v1"))
        out[r + "mlp.fc"] = torch.cat([gate, up], dim=1)  # (E, 2F, C), rows [gate; up]
        out[r + "mlp.proj"] = src.take(experts + "w2").reshape(E, F_, C).transpose(1, 2)  # (E, C, F)
        out[r + "mlp.router.weight"] = src.take(p + "ffn.router.layer.weight")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    E, F_, C = cfg.moe_experts, cfg.hidden_dim, cfg.n_embd
    out = {"transformer.norm_f.weight": state["norm_f.weight"],
           "transformer.wte.weight": state["wte.weight"][:cfg.vocab_size], **give_head(state, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"transformer.blocks.{i}.", f"blocks.{i}."
        block = p + "norm_attn_norm."
        out[block + "norm_1.weight"] = state[r + "norm1.weight"]
        out[block + "norm_2.weight"] = state[r + "norm2.weight"]
        out[block + "attn.Wqkv.weight"] = state[r + "attn.qkv.weight"]
        out[block + "attn.out_proj.weight"] = state[r + "attn.proj.weight"]
        gate, up = state[r + "mlp.fc"].chunk(2, dim=1)  # (E, F, C) each
        experts = p + "ffn.experts.mlp."
        out[experts + "w1"], out[experts + "v1"] = gate.reshape(E * F_, C), up.reshape(E * F_, C)
        out[experts + "w2"] = state[r + "mlp.proj"].transpose(1, 2).reshape(E * F_, C)
        out[p + "ffn.router.layer.weight"] = state[r + "mlp.router.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(cfg: ModelConfig) -> dict:
    rope_scaling(cfg, "dbrx")  # a UserError for any scaling
    return {
        "model_type": "dbrx", "vocab_size": cfg.vocab_size, "d_model": cfg.n_embd, "n_heads": cfg.n_head,
        "n_layers": cfg.n_layer, "max_seq_len": cfg.context_len, "resid_pdrop": 0.0, "emb_pdrop": 0.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attn_config": {"attn_pdrop": 0.0, "clip_qkv": cfg.qkv_clip or _NO_CLIP, "kv_n_heads": cfg.kv_heads,
                        "rope_theta": cfg.rope_theta},
        "ffn_config": {"ffn_act_fn": {"name": "silu"}, "ffn_hidden_size": cfg.hidden_dim,
                       "moe_num_experts": cfg.moe_experts, "moe_top_k": cfg.moe_top_k,
                       "moe_jitter_eps": cfg.moe_input_jitter or None, "moe_loss_weight": 0.01,
                       "moe_normalize_expert_weights": 1.0 if cfg.moe_norm_topk else None},
        "tie_word_embeddings": False, "output_router_logits": False, "initializer_range": 0.02, "use_cache": True,
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,  # the writer sets them
    }


def wants_dbrx(cfg: ModelConfig) -> bool:
    """Clamped q/k/v projections (DBRX's alone of the architectures redline exports to), or softmax-routed experts in
    pre-LayerNorm blocks."""
    return bool(cfg.qkv_clip or (cfg.moe_experts and cfg.norm == "layernorm" and cfg.moe_gating == "softmax"
                                 and not cfg.parallel_residual))


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option DBRX does not have."""
    what = ("model.qkv_clip" if cfg.qkv_clip else "softmax-routed experts with LayerNorm") + ": DBRX, the " \
           "architecture with it,"
    named = [name for name in (
        "norm_unit_offset", "embed_norm", "embed_scale", "embed_multiplier", "residual_multiplier", "logit_divisor",
        "logit_softcap", "attn_softcap", "attn_scale", "attn_sinks", "value_embeddings", "nope_interval",
        "rope_layer_theta", "rope_local_theta", "sliding_window", "sliding_window_pattern", "window_layers",
        "qk_norm", "rope_dims", "head_bias", "moe_layers", "moe_dense_layers", "moe_shared_hidden", "moe_bias",
        "moe_expert_bias", "moe_aux_loss", "moe_weight_input", "moe_norm_min", "parallel_residual", "bias",
        "has_qkv_bias", "norm_bias", "kv_lora_rank", "attn_chunk", "conv_layers", "delta_layers", "mlp_free_layers",
        "mixer_free_layers") if getattr(cfg, name, None)]
    raise_first([
        (bool(named), f"model.{named[0] if named else ''} with {what} has no such option"),
        (not cfg.moe_experts, f"{what} has experts on every layer (model.moe_experts)"),
        (cfg.norm_position != "pre" or cfg.norm != "layernorm" or not cfg.norm_affine,
         f"{what} has pre-LayerNorm blocks without biases (model.norm={cfg.norm}, norm_position="
         f"{cfg.norm_position}, norm_affine={cfg.norm_affine})"),
        (cfg.mlp != "swiglu", f"{what} has SwiGLU experts (model.mlp={cfg.mlp})"),
        (cfg.moe_gating != "softmax" or cfg.moe_scale != 1.0 or cfg.moe_groups > 1,
         f"{what} routes by a softmax, unscaled, without groups (model.moe_gating={cfg.moe_gating}, moe_scale="
         f"{cfg.moe_scale}, moe_groups={cfg.moe_groups})"),
        (cfg.pos_emb != "rope", f"{what} uses RoPE (model.pos_emb={cfg.pos_emb})"),
        (cfg.head_dim * cfg.n_head != cfg.n_embd, f"{what} has heads n_embd / n_head wide (model.head_size)"),
        (not cfg.fused_qkv, f"{what} fuses q/k/v in one Wqkv (model.fused_qkv=false)"),
        (cfg.attn_gate != "none", f"{what} has no gate on its heads (model.attn_gate={cfg.attn_gate})"),
        (cfg.tie_embeddings, f"{what} has a head of its own (model.tie_embeddings)"),
    ])


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


FAMILY = Family(name="dbrx", architecture="DbrxForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
