"""JetMoE (JetMoeForCausalLM, model_type "jetmoe": jetmoe/jetmoe-8b), as transformers' models/jetmoe computes it:
- a mixture of attention heads (JetMoeMoA) on every layer: num_local_experts experts, each a query projection to
  num_key_value_heads heads kv_channels wide (self_attention.experts.input_linear.weight, (E, KV·D, C)) and an
  output projection back (experts.output_linear.weight, (E, C, KV·D)); a router (experts.router.layer.weight,
  (E, C)) takes each token's num_experts_per_tok experts of highest logit, weighted by the softmax over those
  logits; every chosen expert's heads attend over the one set of keys and values (kv_proj, k and v stacked), and
  experts.bias (C,) joins the weighted sum. redline holds it as grouped-query attention over E·KV query heads ordered
  (KV head, expert), model.attn_gate=routed with model.attn_experts = E zeroing the unchosen experts' heads before
  the output projection (redline.model.Attention.routed): the q rows and the output projection's columns are
  reordered here, experts.bias is the output projection's bias (model.bias, the attention's alone: q/k/v have none,
  model.qkv_bias=false);
- a mixture of SwiGLU experts (JetMoeMoE) on every layer, GraniteMoE's stacked layout (mlp.input_linear.weight
  (E, 2F, C), rows [gate; up], mlp.output_linear.weight (E, C, F), mlp.router.layer.weight) with the same routing
  and a bias on the weighted sum (mlp.bias: model.moe_out_bias);
- RMSNorms: the blocks' at JetMoeRMSNorm's default eps 1e-6 whatever the config says, model.norm's at rms_norm_eps
  (redline has one eps: an rms_norm_eps other than 1e-6 is refused); RoPE on whole heads (rope_parameters: default,
  linear, llama3 or yarn).
Refused by name: an activation_function other than SiLU, output_router_logits (transformers' load-balancing loss over
both routers; redline's moe_aux_loss covers the MLP's alone). A redline model with routed attention heads exports as
JetMoE; PEFT adapters as transformers' Linear layers name them (kv_proj: redline's k and v rows; the routers and the
experts are not adapted); not as GGUF (llama.cpp has no JetMoE architecture).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, bias_or_zeros, give_head, pad_rows, raise_first, take_head
from redline.interop.llama import _rope, rope_scaling
from redline.model import ModelConfig

_BLOCK_EPS = 1e-6  # JetMoeDecoderLayer's norms: JetMoeRMSNorm(hidden_size) at its default eps


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("activation_function", "silu")
    if act not in ("silu", "swish"):
        raise UserError(f"activation_function={act!r}: redline reads JetMoE's SwiGLU experts (silu) alone")
    if hf.get("output_router_logits"):
        raise UserError("output_router_logits=true: transformers' JetMoE adds a load-balancing loss over its attention "
                        "and MLP routers, which redline has not (model.moe_aux_loss is the MLP's alone); set it to "
                        "false")
    eps = float(hf.get("rms_norm_eps", 1e-6))
    if eps != _BLOCK_EPS:
        raise UserError(f"rms_norm_eps={eps}: JetMoE's block norms keep eps 1e-6 whatever the config says and its "
                        f"final norm takes rms_norm_eps, where redline has one eps for all norms; set it to 1e-6")
    kv, experts = int(hf.get("num_key_value_heads", 16)), int(hf.get("num_local_experts", 8))
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=int(hf.get("max_position_embeddings", 4096)),
        n_layer=hf["num_hidden_layers"], n_embd=hf["hidden_size"], n_head=experts * kv, n_kv_head=kv,
        head_size=int(hf.get("kv_channels", 128)), fused_qkv=True, pos_emb="rope", **_rope(hf), mlp="swiglu",
        fused_mlp=True, mlp_hidden=hf["intermediate_size"], norm="rmsnorm", norm_eps=eps,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=True, qkv_bias=False, norm_bias=False,
        attn_gate="routed", attn_experts=experts, moe_experts=experts,
        moe_top_k=int(hf.get("num_experts_per_tok", 2)), moe_norm_topk=True, moe_out_bias=True)


def _queries_to_redline(w: torch.Tensor, kv: int) -> torch.Tensor:
    """experts.input_linear.weight (E, KV·D, C) -> redline's q rows (KV·E·D, C), head h·E + e expert e's over KV
    head h (JetMoeAttention repeats the KV heads once per chosen expert; grouped-query attention pairs query head i
    with KV head i // E)."""
    E, rows, C = w.shape
    return w.view(E, kv, rows // kv, C).transpose(0, 1).reshape(-1, C)


def _outputs_to_redline(w: torch.Tensor, kv: int) -> torch.Tensor:
    """experts.output_linear.weight (E, C, KV·D) -> redline's output projection (C, KV·E·D), columns as the q rows."""
    E, C, cols = w.shape
    return w.view(E, C, kv, cols // kv).permute(1, 2, 0, 3).reshape(C, -1)


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"norm_f.weight": src.take("model.norm.weight"),
           "wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg), **take_head(src, cfg)}
    kv = cfg.kv_heads
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        attn, moa = p + "self_attention.", p + "self_attention.experts."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        q = _queries_to_redline(src.take(moa + "input_linear.weight"), kv)
        out[r + "attn.qkv.weight"] = torch.cat([q, src.take(attn + "kv_proj.weight")])  # kv_proj: [k; v]
        out[r + "attn.proj.weight"] = _outputs_to_redline(src.take(moa + "output_linear.weight"), kv)
        out[r + "attn.proj.bias"] = src.take(moa + "bias")
        out[r + "attn.gate.weight"] = src.take(moa + "router.layer.weight")
        out[r + "mlp.router.weight"] = src.take(p + "mlp.router.layer.weight")
        out[r + "mlp.fc"] = src.take(p + "mlp.input_linear.weight")
        out[r + "mlp.proj"] = src.take(p + "mlp.output_linear.weight")
        out[r + "mlp.out_bias"] = src.take(p + "mlp.bias")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """redline's state -> JetMoE's names; biases the model lacks (the output projection's, the mixture's) as zeros."""
    out = {"model.norm.weight": state["norm_f.weight"], "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size],
           **give_head(state, cfg)}
    E, kv, D, C = cfg.attn_experts, cfg.kv_heads, cfg.head_dim, cfg.n_embd
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        attn, moa = p + "self_attention.", p + "self_attention.experts."
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
        q, kv_rows = state[r + "attn.qkv.weight"].split([E * kv * D, 2 * kv * D])
        out[moa + "input_linear.weight"] = q.view(kv, E, D, C).transpose(0, 1).reshape(E, kv * D, C)
        out[attn + "kv_proj.weight"] = kv_rows
        proj = state[r + "attn.proj.weight"]
        out[moa + "output_linear.weight"] = proj.view(C, kv, E, D).permute(2, 0, 1, 3).reshape(E, C, kv * D)
        out[moa + "bias"] = bias_or_zeros(state, r + "attn.proj.bias", proj)
        out[moa + "router.layer.weight"] = state[r + "attn.gate.weight"]
        out[p + "mlp.router.layer.weight"] = state[r + "mlp.router.weight"]
        out[p + "mlp.input_linear.weight"] = state[r + "mlp.fc"]
        out[p + "mlp.output_linear.weight"] = state[r + "mlp.proj"]
        out[p + "mlp.bias"] = bias_or_zeros(state, r + "mlp.out_bias", proj)
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "model_type": "jetmoe", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer, "num_key_value_heads": cfg.kv_heads, "kv_channels": cfg.head_dim,
        "intermediate_size": cfg.hidden_dim, "max_position_embeddings": cfg.context_len,
        "activation_function": "silu", "num_local_experts": cfg.attn_experts, "num_experts_per_tok": cfg.moe_top_k,
        "output_router_logits": False, "aux_loss_coef": 0.01, "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "rope_parameters": {"rope_theta": cfg.rope_theta, **(rope_scaling(cfg, "JetMoE") or {"rope_type": "default"})},
        "attention_dropout": 0.0, "initializer_range": 0.01, "use_cache": True, "pad_token_id": None,
        "bos_token_id": None, "eos_token_id": None,  # the writer sets them
    }


def wants_jetmoe(cfg: ModelConfig) -> bool:
    """Routed attention heads: JetMoE's alone."""
    return cfg.attn_gate == "routed"


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with routed attention heads that JetMoE does not have."""
    what = "routed attention heads (model.attn_gate=routed): JetMoE, the architecture with them,"
    named = [name for name in (
        "norm_unit_offset", "embed_norm", "embed_scale", "embed_multiplier", "residual_multiplier", "logit_divisor",
        "logit_softcap", "attn_softcap", "attn_scale", "attn_sinks", "value_embeddings", "nope_interval",
        "rope_layer_theta", "rope_local_theta", "sliding_window", "window_layers", "qk_norm", "rope_dims",
        "moe_layers", "moe_dense_layers", "moe_shared_hidden", "moe_bias", "moe_expert_bias", "moe_post_norm",
        "moe_weight_input", "parallel_residual", "kv_lora_rank", "attn_chunk", "conv_layers", "delta_layers",
        "mlp_free_layers", "mixer_free_layers", "head_bias", "qkv_clip", "v_norm", "diff_attention")
        if getattr(cfg, name, None)]
    raise_first([
        (bool(named), f"model.{named[0] if named else ''} with {what} has no such option"),
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or not cfg.norm_affine,
         f"{what} has pre-RMSNorm blocks (model.norm={cfg.norm}, norm_position={cfg.norm_position}, "
         f"norm_affine={cfg.norm_affine})"),
        (cfg.norm_eps != _BLOCK_EPS, f"model.norm_eps={cfg.norm_eps}: {what} keeps its block norms' eps at 1e-6"),
        (cfg.has_qkv_bias, f"model.qkv_bias with {what} has no biases on q, k or v"),
        (not cfg.moe_experts or cfg.moe_experts != cfg.attn_experts,
         f"{what} has as many experts in its MLP as in its attention (model.moe_experts={cfg.moe_experts}, "
         f"attn_experts={cfg.attn_experts})"),
        (cfg.mlp != "swiglu", f"{what} has SwiGLU experts (model.mlp={cfg.mlp})"),
        (cfg.moe_gating != "softmax" or not cfg.moe_norm_topk or cfg.moe_scale != 1.0 or cfg.moe_groups > 1
         or cfg.moe_norm_min, f"{what} weights the chosen experts by the softmax over their logits (model.moe_gating="
                              f"softmax, moe_norm_topk, no moe_scale, moe_groups or moe_norm_min)"),
        (cfg.pos_emb != "rope", f"{what} uses RoPE (model.pos_emb={cfg.pos_emb})"),
    ])


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


FAMILY = Family(name="jetmoe", architecture="JetMoeForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
