"""RecurrentGemma (Google's RecurrentGemmaForCausalLM, model_type "recurrent_gemma": recurrentgemma-2b/9b, Griffin's
architecture): Gemma's embeddings and norms with blocks of two kinds in a repeating pattern (block_types, two
recurrent layers to one attention layer by default), each block temporal_pre_norm → its temporal block → residual,
channel_pre_norm → a GeGLU MLP with biases → residual; the head tied and its logits soft-capped.

- recurrent layers: Griffin's RG-LRU block (redline's delta_rule=rglru, RGLRU): linear_y, linear_x, a causal conv_1d
  and the real-gated linear recurrence (rg_lru: block-diagonal gates over num_attention_heads blocks, recurrent_param),
  linear_out, all with biases;
- attention layers: local attention over attention_window_size tokens, RoPE on partial_rotary_factor (0.5) of each
  head, grouped or multi-query, no q/k/v biases, o_proj with one;
- the embeddings times sqrt(hidden_size) rounded to bf16 (the model's `normalizer` buffer is bf16): embed_multiplier.

Semantics read from transformers' models/recurrent_gemma/modeling_recurrent_gemma.py and its configuration.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.model import ModelConfig

_RG = {"linear_y": "attn.linear_y", "linear_x": "attn.linear_x", "linear_out": "attn.proj"}
_GATES = {"rg_lru.input_gate_weight": "attn.input_gate", "rg_lru.input_gate_bias": "attn.input_gate_bias",
          "rg_lru.recurrent_gate_weight": "attn.recurrent_gate", "rg_lru.recurrent_gate_bias":
          "attn.recurrent_gate_bias", "rg_lru.recurrent_param": "attn.recurrent_param"}
_MLP = {"gate_proj": 0, "up_proj": 1}


def _layer_kinds(hf: dict) -> list[str]:
    kinds = list(hf.get("block_types") or ("recurrent", "recurrent", "attention"))
    if not kinds or set(kinds) - {"recurrent", "attention"}:
        raise UserError(f"block_types={kinds}: RecurrentGemma's layers are recurrent or attention")
    n = hf["num_hidden_layers"]
    return (kinds * (n // len(kinds) + 1))[:n]


def _rotary_dims(hf: dict, head_dim: int) -> int:
    params = dict(hf.get("rope_parameters") or {})
    if params.get("rope_type", "default") != "default":
        raise UserError(f"rope_parameters.rope_type={params['rope_type']!r}: RecurrentGemma's RoPE is the default one "
                        f"(transformers refuses others too)")
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.5))
    return int(head_dim * factor)


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_new"):
        raise UserError(f"hidden_activation={act!r}: redline's RecurrentGemma has the tanh-GELU (gelu_pytorch_tanh)")
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    lru = hf.get("lru_width") or width
    if lru % heads:
        raise UserError(f"lru_width={lru} is not a multiple of num_attention_heads={heads} (the RG-LRU's gate blocks)")
    head_dim = width // heads
    kinds = _layer_kinds(hf)
    params = dict(hf.get("rope_parameters") or {})
    normalizer = float(torch.tensor(width ** 0.5, dtype=torch.bfloat16))  # RecurrentGemmaModel.normalizer
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=int(hf.get("max_position_embeddings", 8192)),
        n_layer=hf["num_hidden_layers"], n_embd=width, n_head=heads,
        n_kv_head=hf.get("num_key_value_heads") or heads, fused_qkv=True, pos_emb="rope",
        rope_theta=float(params.get("rope_theta", hf.get("rope_theta", 10000.0))),
        rope_dims=_rotary_dims(hf, head_dim), sliding_window=int(hf.get("attention_window_size", 2048)),
        mlp="geglu", gelu_approximate="tanh", fused_mlp=True, mlp_hidden=hf["intermediate_size"] // 2,
        norm="rmsnorm", norm_unit_offset=True, norm_eps=float(hf.get("rms_norm_eps", 1e-6)), bias=True,
        qkv_bias=bool(hf.get("attention_bias", False)), embed_multiplier=normalizer,
        logit_softcap=float(hf.get("logits_soft_cap") or 0.0),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        delta_layers=tuple(i for i, k in enumerate(kinds) if k == "recurrent"), delta_rule="rglru",
        delta_heads=heads, delta_key_heads=1, delta_key_dim=1, delta_value_dim=lru // heads,
        delta_conv_kernel=int(hf.get("conv1d_width", 4)), delta_conv_bias=True, delta_proj_bias=True)


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
           "norm_f.weight": src.take("model.final_norm.weight")}
    out.update(take_head(src, cfg))
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        t = p + "temporal_block."
        out[r + "norm1.weight"] = src.take(p + "temporal_pre_norm.weight")
        out[r + "norm2.weight"] = src.take(p + "channel_pre_norm.weight")
        if i in cfg.delta_layers:
            for theirs, ours in _RG.items():
                for kind in ("weight", "bias"):
                    out[f"{r}{ours}.{kind}"] = src.take(f"{t}{theirs}.{kind}")
            out[r + "attn.conv"] = src.take(t + "conv_1d.weight")[:, 0]  # (I, 1, K) -> (I, K), oldest first
            out[r + "attn.conv_bias"] = src.take(t + "conv_1d.bias")
            for theirs, ours in _GATES.items():
                out[r + ours] = src.take(t + theirs)
        else:
            out[r + "attn.qkv.weight"] = torch.cat([src.take(f"{t}{x}_proj.weight") for x in "qkv"])
            if cfg.has_qkv_bias:
                out[r + "attn.qkv.bias"] = torch.cat([src.take(f"{t}{x}_proj.bias") for x in "qkv"])
            out[r + "attn.proj.weight"] = src.take(t + "o_proj.weight")
            out[r + "attn.proj.bias"] = src.take(t + "o_proj.bias")
        m = p + "mlp_block."
        for kind in ("weight", "bias"):
            out[f"{r}mlp.fc.{kind}"] = torch.cat([src.take(f"{m}gate_proj.{kind}"), src.take(f"{m}up_proj.{kind}")])
            out[f"{r}mlp.proj.{kind}"] = src.take(f"{m}down_proj.{kind}")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size],
           "model.final_norm.weight": state["norm_f.weight"]}
    out.update(give_head(state, cfg))
    q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        t = p + "temporal_block."
        out[p + "temporal_pre_norm.weight"] = state[r + "norm1.weight"]
        out[p + "channel_pre_norm.weight"] = state[r + "norm2.weight"]
        if i in cfg.delta_layers:
            for theirs, ours in _RG.items():
                for kind in ("weight", "bias"):
                    out[f"{t}{theirs}.{kind}"] = state[f"{r}{ours}.{kind}"]
            out[t + "conv_1d.weight"] = state[r + "attn.conv"][:, None]
            out[t + "conv_1d.bias"] = state[r + "attn.conv_bias"]
            for theirs, ours in _GATES.items():
                out[t + theirs] = state[r + ours]
        else:
            for x, w in zip("qkv", state[r + "attn.qkv.weight"].split([q, kv, kv])):
                out[f"{t}{x}_proj.weight"] = w
            if cfg.has_qkv_bias:
                for x, b in zip("qkv", state[r + "attn.qkv.bias"].split([q, kv, kv])):
                    out[f"{t}{x}_proj.bias"] = b
            out[t + "o_proj.weight"] = state[r + "attn.proj.weight"]
            out[t + "o_proj.bias"] = state[r + "attn.proj.bias"]
        m = p + "mlp_block."
        for kind in ("weight", "bias"):
            out[f"{m}gate_proj.{kind}"], out[f"{m}up_proj.{kind}"] = state[f"{r}mlp.fc.{kind}"].chunk(2)
            out[f"{m}down_proj.{kind}"] = state[f"{r}mlp.proj.{kind}"]
    return {k: v.contiguous() for k, v in out.items()}


def wants_recurrent_gemma(cfg: ModelConfig) -> bool:
    return bool(cfg.delta_layers) and cfg.delta_rule == "rglru"


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option RecurrentGemma, the one architecture with Griffin's recurrent layers redline
    exports to, does not have."""
    what = "model.delta_rule=rglru: RecurrentGemma, the one architecture with it redline exports to,"
    attention = [i for i in range(cfg.n_layer) if i not in cfg.delta_layers]
    raise_first([
        (cfg.norm_position != "pre" or cfg.parallel_residual or cfg.norm != "rmsnorm" or not cfg.norm_unit_offset,
         f"{what} has pre-RMSNorm blocks scaling by 1 + weight (model.norm_unit_offset)"),
        (cfg.mlp != "geglu" or cfg.gelu_approximate != "tanh" or cfg.moe_experts or not cfg.fused_mlp,
         f"{what} has a GeGLU MLP (model.mlp=geglu, fused_mlp, tanh GELU)"),
        (not cfg.bias or not cfg.delta_proj_bias or not cfg.delta_conv_bias,
         f"{what} has biases on its MLP, output and recurrent projections (model.bias, delta_proj_bias, "
         f"delta_conv_bias)"),
        (not attention or cfg.pos_emb != "rope" or not cfg.rope_dims or cfg.rope_scaling != "none"
         or cfg.nope_interval or cfg.rope_local_theta or cfg.rope_layer_theta,
         f"{what} has attention layers rotating part of each head (model.rope_dims) with unscaled RoPE"),
        (not cfg.sliding_window or cfg.sliding_window_pattern or cfg.window_layers,
         f"{what} has local attention on every attention layer (model.sliding_window)"),
        (cfg.head_dim * cfg.n_head != cfg.n_embd or cfg.delta_heads != cfg.n_head,
         f"{what} has heads n_embd / n_head wide and its RG-LRU gates in n_head blocks (model.delta_heads)"),
        (cfg.qk_norm or cfg.attn_sinks or cfg.attn_gate != "none" or cfg.attn_scale or cfg.attn_softcap
         or cfg.embed_scale or cfg.residual_multiplier or cfg.logit_divisor or cfg.head_bias or cfg.value_embeddings
         or cfg.conv_layers or cfg.mlp_free_layers or cfg.mixer_free_layers or cfg.sub_norms
         or cfg.bitlinear != "off" or cfg.diff_attention,
         f"{what} has no other norms, gates, scales, caps or mixers"),
        (cfg.embed_multiplier != float(torch.tensor(cfg.n_embd ** 0.5, dtype=torch.bfloat16)),
         f"{what} scales its embeddings by sqrt(n_embd) rounded to bf16 (model.embed_multiplier="
         f"{float(torch.tensor(cfg.n_embd ** 0.5, dtype=torch.bfloat16))})"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    return {"model_type": "recurrent_gemma", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
            "intermediate_size": 2 * cfg.hidden_dim, "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads,
            "lru_width": cfg.delta_heads * cfg.delta_value_dim, "attention_window_size": cfg.sliding_window,
            "conv1d_width": cfg.delta_conv_kernel, "logits_soft_cap": cfg.logit_softcap or None,
            "rms_norm_eps": cfg.norm_eps, "hidden_activation": "gelu_pytorch_tanh",
            "block_types": ["recurrent" if i in cfg.delta_layers else "attention" for i in range(cfg.n_layer)],
            "attention_bias": cfg.has_qkv_bias, "tie_word_embeddings": cfg.tie_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                                "partial_rotary_factor": cfg.rope_dims / cfg.head_dim},
            "max_position_embeddings": cfg.context_len, "pad_token_id": None, "bos_token_id": None,
            "eos_token_id": None}


FAMILY = Family(name="recurrent_gemma", architecture="RecurrentGemmaForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf,
                ignorable=lambda name: name.endswith(("rotary_emb.inv_freq", "normalizer")))
