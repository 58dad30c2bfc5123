"""Llama 4's text model (Meta's Llama 4 Scout and Maverick: Llama4ForCausalLM, model_type "llama4_text", and the
text model of Llama4ForConditionalGeneration, model_type "llama4", whose weights sit under language_model.; its
vision tower and projector are left unread).

Llama's names and pre-RMSNorm block (`feed_forward` where Llama has `mlp`), with:
- RoPE on interleaved pairs (dimensions (0, 1), (2, 3), ... of a head turn together: transformers' complex-valued
  apply_rotary_emb), with Llama 3's frequency scaling: import permutes each head's q and k rows into redline's
  (first half, second half) order (families.interleave_rope_rows), which leaves every q·k product as it was;
- layers without RoPE (`no_rope_layers`, 0 where a layer does not rotate): nope_interval where they fall on every
  N-th layer, else rope_layer_theta (0 on those layers);
- chunked attention on the layers that rotate (`attention_chunk_size`, their layer_types "chunked_attention"): a
  token attends only within its chunk of that many positions (model.attn_chunk); the others attend to everything;
- `use_qk_norm`: each head's rotated q and k RMS-normalized without a weight on the layers that rotate
  (model.rope_qk_norm);
- `attn_temperature_tuning`: the queries of the layers without RoPE scaled by 1 + attn_scale · ln(1 + floor((p + 1) /
  floor_scale)) at position p (model.nope_temperature, nope_temperature_floor);
- a mixture of experts on `moe_layers` (every `interleave_moe_layer_step`-th layer where not given; the others a dense
  SwiGLU `intermediate_size_mlp` wide): a router (feed_forward.router, (E, C)) sends each token to its top
  num_experts_per_tok experts, whose sigmoid scores multiply the token each takes (model.moe_weight_input), the
  experts stacked as feed_forward.experts.gate_up_proj (E, C, 2F: gate columns then up) and down_proj (E, F, C), plus
  an ungated shared expert `intermediate_size` wide (feed_forward.shared_expert.*).
Options redline cannot run (attention biases, an explicit layer_types other than the one the chunk size gives) are
refused by name. Semantics read from transformers' models/llama4/modeling_llama4.py and configuration_llama4.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, interleave_rope_rows, pad_rows, raise_first
from redline.interop.families import take_head
from redline.interop.llama import _rope, check_silu, rope_scaling, shape_fields
from redline.interop import multimodal
from redline.interop.multimodal import text_view
from redline.model import ModelConfig


def text_config(hf: dict) -> dict:
    """The text model's config: Llama4Config's text_config (the head's tying the top-level flag's, as transformers
    reads it: multimodal.text_config), or hf itself (a llama4_text config)."""
    return multimodal.text_config(hf, tie_default=False)


def _rope_flags(hf: dict) -> list[int]:
    """no_rope_layers as transformers builds it: 1 where a layer rotates, 0 where it does not."""
    n = hf["num_hidden_layers"]
    flags = hf.get("no_rope_layers") or [int((i + 1) % int(hf.get("no_rope_layer_interval") or 4) != 0)
                                         for i in range(n)]
    if len(flags) < n:
        raise UserError(f"no_rope_layers has {len(flags)} entries for {n} layers")
    return [int(bool(f)) for f in flags[:n]]


def _moe_layers(hf: dict) -> list[int]:
    n = hf["num_hidden_layers"]
    layers = hf.get("moe_layers")
    if layers is None:
        step = int(hf.get("interleave_moe_layer_step") or 1)
        layers = list(range(step - 1, n, step))
    return sorted(set(int(i) for i in layers))


def model_config(hf: dict) -> ModelConfig:
    hf = text_config(hf)
    check_silu(hf)
    if hf.get("attention_bias"):
        raise UserError("attention_bias=true: Llama 4's biases on q/k/v/o with none on its MLPs are not supported "
                        "(redline has biases on q/k/v alone or on every Linear layer)")
    n = hf["num_hidden_layers"]
    flags = _rope_flags(hf)
    chunk = int(hf.get("attention_chunk_size", 8192) or 0)  # (Llama4TextConfig's default where absent; None: off)
    derived = ["chunked_attention" if f and chunk else "full_attention" for f in flags]
    if hf.get("layer_types") and list(hf["layer_types"]) != derived:
        raise UserError(f"layer_types {hf['layer_types']}: redline's Llama 4 attends in chunks on exactly the layers "
                        f"that rotate (no_rope_layers 1) where attention_chunk_size is set: {derived}")
    rope = _rope(hf)
    nope = [i for i, f in enumerate(flags) if not f]
    positions: dict = {}
    if nope:
        interval = nope[0] + 1
        if flags == [int((i + 1) % interval != 0) for i in range(n)]:
            positions["nope_interval"] = interval
        else:  # any other pattern: a base a layer, 0 where it does not rotate
            positions["rope_layer_theta"] = tuple(rope["rope_theta"] if f else 0.0 for f in flags)
    temperature = float(hf.get("attn_scale", 0.1)) if hf.get("attn_temperature_tuning", True) and nope else 0.0
    fields = shape_fields(hf)
    moe_layers = _moe_layers(hf)
    if any(not 0 <= i < n for i in moe_layers):
        raise UserError(f"moe_layers {moe_layers}: each must be a layer in [0, {n})")
    dense = int(hf.get("intermediate_size_mlp") or 16384)
    experts: dict = {}
    if moe_layers:
        # (Llama4TextConfig's defaults where absent)
        count, top = int(hf.get("num_local_experts", 16)), int(hf.get("num_experts_per_tok", 1))
        if not 1 <= top <= count:
            raise UserError(f"num_experts_per_tok={top} with num_local_experts={count}: Llama 4's router needs "
                            f"1 <= num_experts_per_tok <= num_local_experts")
        experts = dict(moe_experts=count, moe_top_k=top, moe_gating="sigmoid", moe_norm_topk=False,
                       moe_shared_hidden=fields["mlp_hidden"], moe_shared_gate=False, moe_weight_input=True)
        if moe_layers != list(range(n)):  # the others dense, intermediate_size_mlp wide
            experts.update(moe_layers=tuple(moe_layers), moe_dense_hidden=dense)
    else:  # dense throughout
        fields["mlp_hidden"] = dense
    return ModelConfig(
        **fields, **experts, **rope, **positions, fused_qkv=True, pos_emb="rope", mlp="swiglu", fused_mlp=True,
        norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), attn_chunk=chunk,
        rope_qk_norm=bool(hf.get("use_qk_norm", True)), nope_temperature=temperature,
        nope_temperature_floor=int(hf.get("floor_scale", 8192)),
    )


def _permute_qk(qkv: torch.Tensor, cfg: ModelConfig, inverse: bool) -> torch.Tensor:
    """A fused [q; k; v] (rows, ...) with q's and k's rows moved between the interleaved RoPE order (inverse: into
    redline's) and redline's."""
    q, k, v = qkv.split([cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim])
    return torch.cat([interleave_rope_rows(q, cfg.n_head, inverse), interleave_rope_rows(k, cfg.kv_heads, inverse),
                      v])


def _mlp_names(cfg: ModelConfig, i: int) -> dict[str, str]:
    """redline's names of layer i's feed-forward weights -> Llama 4's after model.layers.i.feed_forward."""
    if cfg.layer_has_experts(i):
        return {"mlp.router.weight": "router.weight", "mlp.shared.fc.weight": "shared_expert.gate_up",
                "mlp.shared.proj.weight": "shared_expert.down_proj.weight", "mlp.fc": "experts.gate_up_proj",
                "mlp.proj": "experts.down_proj"}
    return {"mlp.fc.weight": "gate_up", "mlp.proj.weight": "down_proj.weight"}


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    src = text_view(src)  # Llama4ForConditionalGeneration's language_model.model. / .lm_head read as model. / lm_head
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
           "norm_f.weight": src.take("model.norm.weight")}
    out.update(take_head(src, cfg))
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        a, f = p + "self_attn.", p + "feed_forward."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        qkv = torch.cat([src.take(f"{a}{x}_proj.weight") for x in "qkv"])
        out[r + "attn.qkv.weight"] = _permute_qk(qkv, cfg, inverse=True)
        out[r + "attn.proj.weight"] = src.take(a + "o_proj.weight")
        for ours, theirs in _mlp_names(cfg, i).items():
            if theirs.endswith("gate_up"):  # separate gate_proj and up_proj -> redline's fused [gate; up]
                gate_up = [src.take(f"{f}{theirs[:-7]}{x}_proj.weight") for x in ("gate", "up")]
                out[r + ours] = torch.cat(gate_up)
            elif theirs.startswith("experts."):  # stacked (E, in, out) -> redline's (E, out, in)
                out[r + ours] = src.take(f + theirs).transpose(1, 2)
            else:
                out[r + ours] = src.take(f + theirs)
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size],
           "model.norm.weight": state["norm_f.weight"]}
    out.update(give_head(state, cfg))
    q_rows, kv_rows = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        a, f = p + "self_attn.", p + "feed_forward."
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
        q, k, v = _permute_qk(state[r + "attn.qkv.weight"], cfg, inverse=False).split([q_rows, kv_rows, kv_rows])
        out[a + "q_proj.weight"], out[a + "k_proj.weight"], out[a + "v_proj.weight"] = q, k, v
        out[a + "o_proj.weight"] = state[r + "attn.proj.weight"]
        for ours, theirs in _mlp_names(cfg, i).items():
            if theirs.endswith("gate_up"):
                gate, up = state[r + ours].chunk(2)
                out[f"{f}{theirs[:-7]}gate_proj.weight"], out[f"{f}{theirs[:-7]}up_proj.weight"] = gate, up
            elif theirs.startswith("experts."):
                out[f + theirs] = state[r + ours].transpose(1, 2)
            else:
                out[f + theirs] = state[r + ours]
    return {k: v.contiguous() for k, v in out.items()}


def wants_llama4(cfg: ModelConfig) -> bool:
    """A model with an option only Llama 4 has among the architectures redline exports to: chunked attention,
    weightless QK-norm after RoPE, the query temperature of the layers without RoPE, experts weighted on their input."""
    return bool(cfg.attn_chunk or cfg.rope_qk_norm or cfg.nope_temperature or cfg.moe_weight_input)


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option that Llama 4 does not have."""
    what = "Llama 4, the one architecture redline exports to with chunked attention, weightless QK-norm after RoPE, " \
           "the query temperature or experts weighted on their input,"
    thetas = {t for t in cfg.rope_layer_theta if t}
    raise_first([
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine
         or cfg.parallel_residual or cfg.embed_norm, f"{what} has pre-RMSNorm blocks, sublayers in turn"),
        (cfg.mlp != "swiglu" or cfg.bias or cfg.has_qkv_bias or cfg.head_bias,
         f"{what} has SwiGLU MLPs and no biases (model.mlp={cfg.mlp}, bias, qkv_bias, head_bias)"),
        (cfg.qk_norm, f"{what} has no learned QK-norm (model.qk_norm; its own is model.rope_qk_norm)"),
        (cfg.kv_lora_rank, f"{what} has no latent attention (model.kv_lora_rank)"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.rope_local_theta or len(thetas) > 1
         or cfg.rope_scaling not in ("none", "llama3") or (thetas and thetas != {cfg.rope_theta}),
         f"{what} rotates whole heads by one RoPE (Llama 3 scaling or none) on the layers that rotate"),
        (cfg.sliding_window or cfg.attn_scale or cfg.attn_softcap or cfg.attn_sinks or cfg.attn_gate != "none",
         f"{what} has no window, score scale, cap, sinks or gates"),
        (cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.logit_softcap
         or cfg.value_embeddings, f"{what} has no embedding, residual or logit scalars and no value embeddings"),
        (cfg.conv_layers or cfg.delta_layers or cfg.mlp_free_layers or cfg.mixer_free_layers,
         f"{what} has attention and an MLP on every layer"),
        (cfg.moe_experts and not cfg.moe_weight_input,
         f"{what} weights its experts' input by the router's scores (model.moe_weight_input)"),
        (cfg.moe_experts and (cfg.moe_gating != "sigmoid" or cfg.moe_norm_topk or cfg.moe_scale != 1.0
                              or cfg.moe_expert_bias or cfg.moe_bias or cfg.moe_groups > 1 or cfg.moe_dense_layers),
         f"{what} routes by unrescaled sigmoid scores (model.moe_gating=sigmoid, moe_norm_topk=false) with no "
         f"scale, bias, groups or dense first layers"),
        (cfg.moe_experts and (cfg.moe_shared_hidden != cfg.hidden_dim or cfg.moe_shared_gate),
         f"{what} has an ungated shared expert as wide as its experts (model.moe_shared_hidden={cfg.hidden_dim}, "
         f"moe_shared_gate=false)"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    n = cfg.n_layer
    rotating = [int(cfg.layer_rope(i)) for i in range(n)]
    moe_layers = [i for i in range(n) if cfg.layer_has_experts(i)]
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(rope_scaling(cfg, "llama4_text") or {})}
    return {
        "model_type": "llama4_text", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim,
        "intermediate_size_mlp": (cfg.moe_dense_hidden or cfg.hidden_dim) if cfg.moe_experts else cfg.hidden_dim,
        "num_hidden_layers": n, "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "max_position_embeddings": cfg.context_len,
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "num_local_experts": cfg.moe_experts or 1, "num_experts_per_tok": cfg.moe_top_k if cfg.moe_experts else 1,
        "moe_layers": moe_layers, "use_qk_norm": cfg.rope_qk_norm, "no_rope_layers": rotating,
        "attention_chunk_size": cfg.attn_chunk or None,
        "layer_types": ["chunked_attention" if r and cfg.attn_chunk else "full_attention" for r in rotating],
        "attn_temperature_tuning": bool(cfg.nope_temperature), "attn_scale": cfg.nope_temperature or 0.1,
        "floor_scale": cfg.nope_temperature_floor, "rope_parameters": rope, "initializer_range": 0.02,
        "attention_dropout": 0.0, "use_cache": True,
    }


def ignorable(name: str) -> bool:
    """The multimodal checkpoints' vision model and projector, which the text model does not run."""
    return name.startswith(("vision_model.", "multi_modal_projector.", "model.vision_model.",
                            "model.multi_modal_projector."))


TEXT_FAMILY = Family(name="llama4_text", architecture="Llama4ForCausalLM", model_config=model_config,
                     hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=ignorable)
# Llama4ForConditionalGeneration's folders: the text model is read; exports are the text model (TEXT_FAMILY)
FAMILY = Family(name="llama4", architecture="Llama4ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=ignorable)
