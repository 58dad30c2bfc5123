"""Zamba2 (Zamba2ForCausalLM, model_type "zamba2": Zyphra's Zamba2-1.2B, 2.7B, 7B): Mamba-2 layers, some of which
(layers_block_type "hybrid") first call one of num_mem_blocks transformer blocks whose weights they share.

- every layer: x + mamba(norm(x + t)), a Mamba-2 mixer alone (model.delta_layers with delta_rule=mamba2 and
  mlp_free_layers; Bamba's mixer, granite.py's maps): n_mamba_heads heads of mamba_expand·hidden_size / n_mamba_heads,
  mamba_ngroups groups of B and C of mamba_d_state, mamba_d_conv, a convolution bias (always: transformers' Zamba2
  builds one whatever use_conv_bias says; exports write zeros where redline has none), the gated norm at 1e-5
  (transformers builds it at that epsilon, not rms_norm_eps: model.delta_norm_eps), dt floored at time_step_min
  (model.delta_dt_min, as transformers' chunked scan does); t = 0 on a "linear_attention" layer;
- a "hybrid" layer's t = linear(block(cat(x, x0))), x0 the token embeddings: model.shared_attn_layers. The j-th hybrid
  layer calls block j % num_mem_blocks (model.shared_attn_blocks; GPT.shared_blocks, SharedBlock): RMSNorm over the 2C
  channels, attention from 2C channels in heads of 2C / num_attention_heads (GQA by num_key_value_heads), its scores
  scaled by (head_dim / 2)^-0.5 (model.attn_scale), RoPE over whole heads where use_mem_rope, o_proj back to C, an
  RMSNorm, a GeGLU MLP (gate_up_proj [gate; up], intermediate_size wide; hidden_act gelu exact or gelu_pytorch_tanh),
  no residual inside. Each call adds its own adapters, B(A(u)) of adapter_rank, to the MLP's gate_up_proj and, with
  use_shared_attention_adapter, to q, k and v (model.shared_attn_adapter_rank, shared_attn_qkv_adapters), and has its
  own `linear` (SharedBlockCall.shared_in) and KV cache.
The shared weights are read where save_pretrained writes them, under the block's first caller
(model.layers.{first}.shared_transformer.*), the j-th call's adapters in its block's lists at index j
(linear_q_adapter_list.j.0 = A, .1 = B); copies under the other callers' names, which transformers ties to the first,
are read and dropped. Refused by name: add_bias_linear (biases on the mixers and the block's MLP), a hidden_act or
rope_type redline's block does not run, adapter_rank 0. Export writes the same layout (tie_word_embeddings as the
model has it). Semantics read from transformers' models/zamba2/modular_zamba2.py and configuration_zamba2.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.granite import _mixer_to_hf, _mixer_to_redline
from redline.model import ModelConfig

_KINDS = {"linear_attention": "linear_attention", "mamba": "linear_attention", "hybrid": "hybrid"}
# layers_block_type's names, the legacy "mamba" as transformers' remap_legacy_layer_types reads it
_GELU = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}  # hidden_act -> model.gelu_approximate
GATE_NORM_EPS = 1e-5  # Zamba2MambaMixer's Zamba2RMSNormGated(eps=1e-5), whatever rms_norm_eps is


def _default_kinds() -> list[str]:
    """Zamba2Config's default layers_block_type (Zamba2-2.7B's 54 layers)."""
    return (["linear_attention"] + (["linear_attention"] * 5 + ["hybrid"]) * 7 + ["linear_attention"] * 4
            + ["hybrid"] + ["linear_attention"] * 3 + ["hybrid"] + ["linear_attention"] * 2)


def layer_kinds(hf: dict) -> list[str]:
    kinds = hf.get("layers_block_type") or hf.get("layer_types") or _default_kinds()
    if not set(kinds) <= set(_KINDS):
        raise UserError(f"layers_block_type {sorted(set(kinds) - set(_KINDS))}: Zamba2's layers are "
                        f"linear_attention (Mamba-2) or hybrid")
    return [_KINDS[k] for k in kinds]


def model_config(hf: dict) -> ModelConfig:
    kinds = layer_kinds(hf)
    C = int(hf.get("hidden_size", 2560))
    H = int(hf.get("num_attention_heads", 32))
    act = hf.get("hidden_act", "gelu")
    if act not in _GELU:
        raise UserError(f"hidden_act={act!r}: Zamba2's shared MLP in redline is GeGLU (gelu or gelu_pytorch_tanh)")
    if hf.get("add_bias_linear"):
        raise UserError("add_bias_linear=true: redline's shared block has no biases (and Zamba2 puts them on its "
                        "mixers and the block's MLP together)")
    rank = int(hf.get("adapter_rank", 128))
    if rank <= 0:
        raise UserError(f"adapter_rank={rank}: Zamba2's shared MLP has its adapters (a rank of 1 or more)")
    if (2 * C) % H:
        raise UserError(f"num_attention_heads={H} does not divide 2 x hidden_size={2 * C}: Zamba2's heads are "
                        f"2·hidden_size / num_attention_heads wide")
    heads, expand = int(hf.get("n_mamba_heads", 8)), int(hf.get("mamba_expand", 2))
    if (expand * C) % heads:
        raise UserError(f"n_mamba_heads={heads} does not divide mamba_expand x hidden_size={expand * C}")
    D = 2 * C // H
    KV = int(hf.get("num_key_value_heads") or H)
    if hf.get("use_shared_attention_adapter") and KV != H:
        raise UserError(f"num_key_value_heads={KV} with use_shared_attention_adapter=true: Zamba2's k and v adapters "
                        f"write 2·hidden_size channels, which k and v have only with {H} KV heads")
    rope = {"pos_emb": "none"}
    if hf.get("use_mem_rope"):
        params = dict(hf.get("rope_parameters") or {})
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            raise UserError(f"rope_parameters.rope_type={kind!r}: redline reads Zamba2's default RoPE only")
        rope = {"pos_emb": "rope", "rope_theta": float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))}
    dt_min = float(hf.get("time_step_min", 0.001))
    if dt_min < 0:
        raise UserError(f"time_step_min={dt_min}: Mamba-2's least time step is not below 0")
    every = tuple(range(len(kinds)))
    hybrid = tuple(i for i, k in enumerate(kinds) if k == "hybrid")
    tied = bool(hf.get("tie_word_embeddings", True))
    # transformers ties the blocks (its _tied_weights_keys) only with tie_word_embeddings: untied, every hybrid layer
    # has a block of its own
    blocks = max(1, min(int(hf.get("num_mem_blocks", 1)), len(hybrid)) if tied else len(hybrid))
    context = 16384 if hf.get("use_long_context") else int(hf.get("max_position_embeddings", 4096))
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=context, n_layer=len(kinds), n_embd=C, n_head=H,
        n_kv_head=KV, head_size=D, attn_scale=(D / 2) ** -0.5,
        mlp_hidden=int(hf.get("intermediate_size") or 4 * C), mlp="geglu", gelu_approximate=_GELU[act],
        fused_qkv=True, fused_mlp=True, norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-5)), bias=False,
        tie_embeddings=tied, **rope,
        delta_layers=every, mlp_free_layers=every, delta_rule="mamba2", delta_heads=heads,
        delta_key_heads=int(hf.get("mamba_ngroups", 1)), delta_key_dim=int(hf.get("mamba_d_state", 64)),
        delta_value_dim=expand * C // heads, delta_conv_kernel=int(hf.get("mamba_d_conv", 4)),
        delta_conv_bias=True, delta_dt_min=dt_min, delta_norm_eps=GATE_NORM_EPS,
        shared_attn_layers=hybrid, shared_attn_blocks=blocks, shared_attn_adapter_rank=rank,
        shared_attn_qkv_adapters=bool(hf.get("use_shared_attention_adapter", False)))


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with shared blocks (model.shared_attn_layers) that Zamba2 has not."""
    what = "model.shared_attn_layers: Zamba2, the one architecture with shared blocks redline exports to,"
    every = tuple(range(cfg.n_layer))
    D = cfg.head_dim
    raise_first([
        (tuple(cfg.delta_layers) != every or tuple(cfg.mlp_free_layers) != every or cfg.mixer_free_layers
         or cfg.conv_layers, f"{what} has a Mamba-2 mixer alone on every layer (model.delta_layers and "
                             f"mlp_free_layers on all {cfg.n_layer})"),
        (cfg.delta_gate_norm != "after_gate" or cfg.delta_norm_eps != GATE_NORM_EPS or cfg.delta_proj_bias,
         f"{what} gates its mixers' output before a grouped RMSNorm at {GATE_NORM_EPS} and has no biases "
         f"(model.delta_gate_norm, delta_norm_eps, delta_proj_bias)"),
        (cfg.delta_dt_min <= 0, f"model.delta_dt_min={cfg.delta_dt_min}: {what} takes the logarithm of its "
                                f"time_step_min (> 0) as transformers builds it"),
        ((cfg.delta_heads * cfg.delta_value_dim) % cfg.n_embd,
         f"{what} has mixers of a whole multiple of n_embd channels (mamba_expand: delta_heads x delta_value_dim)"),
        (D * cfg.n_head != 2 * cfg.n_embd or cfg.attn_scale != (D / 2) ** -0.5,
         f"{what} attends in heads of 2·n_embd / n_head (model.head_size) scaled by (head_size / 2)^-0.5 "
         f"(model.attn_scale)"),
        (cfg.mlp != "geglu" or not cfg.shared_attn_adapter_rank,
         f"{what} has a GeGLU MLP with adapters (model.mlp=geglu, shared_attn_adapter_rank > 0)"),
        (cfg.pos_emb not in ("rope", "none") or cfg.rope_dims or cfg.rope_scaling != "none" or cfg.nope_interval
         or cfg.rope_layer_theta or cfg.rope_local_theta,
         f"{what} rotates whole heads with one unscaled RoPE, or none"),
        (cfg.norm_unit_offset or cfg.embed_norm or not cfg.norm_affine or cfg.embed_scale or cfg.embed_multiplier
         or cfg.residual_multiplier or cfg.logit_divisor or cfg.logit_softcap or cfg.head_bias or cfg.moe_experts,
         f"{what} has plain RMSNorms and no scales, caps or experts"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    out = {
        "model_type": "zamba2", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer, "max_position_embeddings": cfg.context_len,
        "layers_block_type": ["hybrid" if i in cfg.shared_attn_layers else "linear_attention"
                              for i in range(cfg.n_layer)],
        "mamba_d_state": cfg.delta_key_dim, "mamba_d_conv": cfg.delta_conv_kernel,
        "mamba_expand": cfg.delta_heads * cfg.delta_value_dim // cfg.n_embd, "mamba_ngroups": cfg.delta_key_heads,
        "n_mamba_heads": cfg.delta_heads, "time_step_min": cfg.delta_dt_min,
        "time_step_max": max(0.1, cfg.delta_dt_min), "time_step_floor": min(1e-4, cfg.delta_dt_min),
        "use_conv_bias": True, "add_bias_linear": False, "intermediate_size": cfg.hidden_dim,
        "hidden_act": "gelu" if cfg.gelu_approximate == "none" else "gelu_pytorch_tanh",
        "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads,
        "num_mem_blocks": cfg.shared_attn_blocks, "use_shared_attention_adapter": cfg.shared_attn_qkv_adapters,
        "adapter_rank": cfg.shared_attn_adapter_rank, "use_mem_rope": cfg.pos_emb == "rope",
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "use_long_context": False,
        "initializer_range": 0.02, "use_cache": True,
    }
    if cfg.pos_emb == "rope":
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    return out


def _callers(cfg: ModelConfig) -> list[tuple[int, int, str]]:
    """Per hybrid layer: (layer, j its index among them, the prefix its block's weights are stored under: the
    block's first caller's model.layers.{first}.shared_transformer.)."""
    hybrid, n = cfg.shared_attn_layers, cfg.shared_attn_blocks
    return [(i, j, f"model.layers.{hybrid[j % n]}.shared_transformer.") for j, i in enumerate(hybrid)]


def _block_names() -> dict[str, str]:
    """A shared block's weights: redline's (after shared_blocks.b.) -> transformers' (after shared_transformer.);
    qkv is q_proj, k_proj and v_proj stacked."""
    return {"norm1.weight": "input_layernorm.weight", "proj.weight": "self_attn.o_proj.weight",
            "norm2.weight": "pre_ff_layernorm.weight", "mlp_fc.weight": "feed_forward.gate_up_proj.weight",
            "mlp_proj.weight": "feed_forward.down_proj.weight"}


def _adapter_names(cfg: ModelConfig, j: int) -> dict[str, str]:
    """Call j's adapters: redline's (after blocks.i.attn.adapters.) -> transformers' (after shared_transformer.)."""
    out = {"fc_a.weight": f"feed_forward.gate_up_proj_adapter_list.{j}.0.weight",
           "fc_b.weight": f"feed_forward.gate_up_proj_adapter_list.{j}.1.weight"}
    if cfg.shared_attn_qkv_adapters:
        for x in "qkv":
            out[f"{x}_a.weight"] = f"self_attn.linear_{x}_adapter_list.{j}.0.weight"
            out[f"{x}_b.weight"] = f"self_attn.linear_{x}_adapter_list.{j}.1.weight"
    return out


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
           "norm_f.weight": src.take("model.final_layernorm.weight"), **take_head(src, cfg)}
    hybrid = set(cfg.shared_attn_layers)
    for i in range(cfg.n_layer):
        layer = "model.layers.{i}.mamba_decoder." if i in hybrid else "model.layers.{i}."
        out[f"blocks.{i}.norm1.weight"] = src.take(layer.format(i=i) + "input_layernorm.weight")
        out.update(_mixer_to_redline(src, cfg, i, layer, recurrent=True, module="mamba" if i in hybrid else "attn"))
    for b in range(min(cfg.shared_attn_blocks, len(cfg.shared_attn_layers))):
        s, r = f"model.layers.{cfg.shared_attn_layers[b]}.shared_transformer.", f"shared_blocks.{b}."
        out.update({r + ours: src.take(s + theirs) for ours, theirs in _block_names().items()})
        out[r + "qkv.weight"] = torch.cat([src.take(f"{s}self_attn.{x}_proj.weight") for x in "qkv"])
    for i, j, s in _callers(cfg):
        r = f"blocks.{i}.attn."
        out[r + "shared_in.weight"] = src.take(f"model.layers.{i}.linear.weight")
        out.update({f"{r}adapters.{ours}": src.take(s + theirs) for ours, theirs in _adapter_names(cfg, j).items()})
    # what transformers does not run: a tied block's copies under its other callers' names (tied to the first's as
    # it loads), an untied block's adapters of the other calls (each layer runs its own)
    shared = re.compile(r"model\.layers\.\d+\.shared_transformer\.")
    for name in sorted(src.names - src.used):
        if shared.match(name):
            src.take(name)
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    V = cfg.vocab_size
    out = {"model.embed_tokens.weight": state["wte.weight"][:V], "model.final_layernorm.weight": state["norm_f.weight"],
           **give_head(state, cfg)}
    hybrid = set(cfg.shared_attn_layers)
    for i in range(cfg.n_layer):
        layer = "model.layers.{i}.mamba_decoder." if i in hybrid else "model.layers.{i}."
        out[layer.format(i=i) + "input_layernorm.weight"] = state[f"blocks.{i}.norm1.weight"]
        out.update(_mixer_to_hf(state, cfg, i, layer, recurrent=True, module="mamba" if i in hybrid else "attn"))
        if not cfg.delta_conv_bias:  # Zamba2's convolution always has a bias: zeros compute as none
            conv = out[layer.format(i=i) + "mamba.conv1d.weight"]
            out[layer.format(i=i) + "mamba.conv1d.bias"] = conv.new_zeros(conv.shape[0])
    D, KV, n = cfg.head_dim, cfg.kv_heads, cfg.shared_attn_blocks
    callers = _callers(cfg)
    # tied, transformers reads each block from its first caller; untied, every caller holds its own copy, its
    # adapter lists each call's of the same block (the others' entries unused, but expected)
    writers = callers[:n] if cfg.tie_embeddings else callers
    for i, j, _ in writers:
        s, r = f"model.layers.{i}.shared_transformer.", f"shared_blocks.{j % n}."
        block = {s + theirs: state[r + ours] for ours, theirs in _block_names().items()}
        q, k, v = state[r + "qkv.weight"].split([cfg.n_head * D, KV * D, KV * D])
        block.update({f"{s}self_attn.q_proj.weight": q, f"{s}self_attn.k_proj.weight": k,
                      f"{s}self_attn.v_proj.weight": v})
        for c, call, _ in callers:
            if call % n == j % n:
                a = f"blocks.{c}.attn.adapters."
                block.update({s + theirs: state[a + ours] for ours, theirs in _adapter_names(cfg, call).items()})
        # a copy apart from the first caller's (safetensors refuses tensors that share memory)
        out.update({name: t.clone() if j >= n else t for name, t in block.items()})
    for i, _, _ in callers:
        out[f"model.layers.{i}.linear.weight"] = state[f"blocks.{i}.attn.shared_in.weight"]
    return {k: v.contiguous() for k, v in out.items()}


FAMILY = Family(name="zamba2", architecture="Zamba2ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf)
