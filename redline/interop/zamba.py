"""Zamba (ZambaForCausalLM, model_type "zamba": Zyphra's Zamba-7B-v1): Mamba-1 layers, some of which (layers_block_type
"hybrid") first call one transformer block whose weights they share, as transformers' models/zamba computes them.

- every layer: x + mamba(norm(x + t)), a Mamba-1 mixer alone (model.delta_layers with delta_rule=mamba1 and
  mlp_free_layers): in_proj's rows interleave each channel's x and gate (transformers views them as (I, 2)), read
  here as redline's [x; z]; the mamba_expand·hidden_size channels split into n_mamba_heads heads, each with its own
  x_proj and dt_proj (x_proj_weight (heads, R + 2N, I / heads), dt_proj_weight (heads, I / heads, R), dt_proj_bias):
  model.delta_key_heads, redline.model.HeadLinear; A_log (heads, I / heads, N) and D stacked back into I channels;
  t = 0 on a "mamba" layer;
- a "hybrid" layer's t = linear(block(cat(x, x0))), x0 the token embeddings: model.shared_attn_layers. The block
  (shared_transf): RMSNorm over the 2C channels, attention from 2C channels in heads attention_head_dim wide (GQA by
  num_key_value_heads) without positions, its scores scaled by (head_dim / 2)^-0.5 (model.attn_scale), o_proj back
  to C, an RMSNorm, a gated MLP (gate_proj, up_proj, down_proj: GeGLU for gelu / gelu_pytorch_tanh, SwiGLU for silu),
  no residual inside; each call its own `linear` and KV cache. transformers ties every hybrid layer's block to the
  first's only with tie_word_embeddings: untied, each has its own (model.shared_attn_blocks).
Refused by name: hidden_mamba_act other than SiLU, an attention_hidden_size other than 2·hidden_size, a hidden_act
redline's gated MLPs do not run. Export writes the same layout; PEFT adapters are refused by name (in_proj's
interleaved rows and the heads' bare tensors are no Linear layers redline's adapters split onto); not as GGUF
(llama.cpp has no Zamba architecture).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.model import ModelConfig

_ACT = {"gelu": ("geglu", "none"), "gelu_pytorch_tanh": ("geglu", "tanh"), "gelu_new": ("geglu", "tanh"),
        "silu": ("swiglu", "tanh")}  # hidden_act -> (model.mlp, model.gelu_approximate)
_KINDS = {"mamba": "mamba", "linear_attention": "mamba", "hybrid": "hybrid"}


def _default_kinds(n: int, period: int, offset: int) -> list[str]:
    """ZambaConfig's layers_block_type where none is given."""
    return ["mamba", "mamba", "hybrid"] + ["hybrid" if i % period == offset else "mamba" for i in range(n - 3)]


def layer_kinds(hf: dict) -> list[str]:
    n = int(hf.get("num_hidden_layers", 76))
    kinds = hf.get("layers_block_type") or hf.get("layer_types") or _default_kinds(
        n, int(hf.get("attn_layer_period", 6)), int(hf.get("attn_layer_offset", 4)))
    if not set(kinds) <= set(_KINDS):
        raise UserError(f"layers_block_type {sorted(set(kinds) - set(_KINDS))}: Zamba's layers are mamba or hybrid")
    return [_KINDS[k] for k in kinds]


def model_config(hf: dict) -> ModelConfig:
    kinds = layer_kinds(hf)
    C, H = int(hf.get("hidden_size", 3712)), int(hf.get("num_attention_heads", 16))
    act = hf.get("hidden_act", "gelu")
    if act not in _ACT:
        raise UserError(f"hidden_act={act!r}: redline runs Zamba's shared MLP as GeGLU (gelu, gelu_pytorch_tanh) or "
                        f"SwiGLU (silu)")
    if hf.get("hidden_mamba_act", "silu") not in ("silu", "swish"):
        raise UserError(f"hidden_mamba_act={hf['hidden_mamba_act']!r}: redline's Mamba-1 mixers use SiLU")
    if int(hf.get("attention_hidden_size") or 2 * C) != 2 * C:
        raise UserError(f"attention_hidden_size={hf['attention_hidden_size']}: Zamba's block reads cat(x, x0), "
                        f"2·hidden_size={2 * C} channels, in redline")
    heads, expand = int(hf.get("n_mamba_heads", 2)), int(hf.get("mamba_expand", 2))
    if (expand * C) % heads:
        raise UserError(f"n_mamba_heads={heads} does not divide mamba_expand x hidden_size={expand * C}")
    D = int(hf.get("attention_head_dim") or 2 * C // H)
    rank = hf.get("mamba_dt_rank", "auto")
    every = tuple(range(len(kinds)))
    hybrid = tuple(i for i, k in enumerate(kinds) if k == "hybrid")
    tied = bool(hf.get("tie_word_embeddings", True))
    mlp, gelu = _ACT[act]
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=int(hf.get("max_position_embeddings", 4096)), n_layer=len(kinds),
        n_embd=C, n_head=H, n_kv_head=int(hf.get("num_key_value_heads") or H), head_size=D,
        attn_scale=(D / 2) ** -0.5, pos_emb="none", mlp_hidden=int(hf.get("intermediate_size") or 4 * C), mlp=mlp,
        gelu_approximate=gelu, fused_qkv=True, fused_mlp=True, norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)), bias=False, tie_embeddings=tied,
        delta_layers=every, mlp_free_layers=every, delta_rule="mamba1", delta_heads=expand * C,
        delta_key_heads=heads, delta_key_dim=int(hf.get("mamba_d_state", 16)), delta_value_dim=1,
        delta_conv_kernel=int(hf.get("mamba_d_conv", 4)), delta_conv_bias=bool(hf.get("mamba_conv_bias", True)),
        delta_proj_bias=bool(hf.get("mamba_proj_bias", False)),
        delta_dt_rank=math.ceil(C / 16) if rank == "auto" else int(rank),
        shared_attn_layers=hybrid, shared_attn_blocks=max(1, 1 if tied else len(hybrid)))


def _mixer_prefix(cfg: ModelConfig, i: int) -> tuple[str, str]:
    """(transformers' prefix of layer i's Mamba decoder layer, redline's of its mixer)."""
    if i in cfg.shared_attn_layers:
        return f"model.layers.{i}.mamba_decoder.", f"blocks.{i}.mamba."
    return f"model.layers.{i}.", f"blocks.{i}.attn."


def _block_names() -> dict[str, str]:
    """The shared block's weights: redline's (after shared_blocks.b.) -> transformers' (after shared_transf.)."""
    return {"norm1.weight": "input_layernorm.weight", "proj.weight": "self_attn.o_proj.weight",
            "norm2.weight": "pre_ff_layernorm.weight", "mlp_proj.weight": "feed_forward.down_proj.weight"}


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg),
           "norm_f.weight": src.take("model.final_layernorm.weight"), **take_head(src, cfg)}
    I, C = cfg.delta_heads, cfg.n_embd
    for i in range(cfg.n_layer):
        p, r = _mixer_prefix(cfg, i)
        m = p + "mamba."
        out[f"blocks.{i}.norm1.weight"] = src.take(p + "input_layernorm.weight")
        # in_proj (2I, C), rows (channel, [x, gate]) -> [x rows; gate rows]
        out[r + "in_proj.weight"] = src.take(m + "in_proj.weight").view(I, 2, C).transpose(0, 1).reshape(2 * I, C)
        out[r + "conv"] = src.take(m + "conv1d.weight")[:, 0]  # (I, 1, kernel) -> (I, kernel)
        if cfg.delta_conv_bias:
            out[r + "conv_bias"] = src.take(m + "conv1d.bias")
        # (heads, R + 2N, I / heads) and (heads, I / heads, R); one head: Mamba's Linear layers' weights
        one = cfg.delta_key_heads == 1
        for ours, theirs in (("x_proj.weight", "x_proj_weight"), ("dt_proj.weight", "dt_proj_weight")):
            out[r + ours] = src.take(m + theirs)[0] if one else src.take(m + theirs)
        out[r + "dt_proj.bias"] = src.take(m + "dt_proj_bias").reshape(I)
        out[r + "A_log"] = src.take(m + "A_log").reshape(I, -1)
        out[r + "D"] = src.take(m + "D").reshape(I)
        out[r + "proj.weight"] = src.take(m + "out_proj.weight")
        if cfg.delta_proj_bias:
            in_bias = src.take(m + "in_proj.bias")
            out[r + "in_proj.bias"] = in_bias.view(I, 2).t().reshape(2 * I)
            out[r + "proj.bias"] = src.take(m + "out_proj.bias")
    for b in range(cfg.shared_attn_blocks):
        s, r = f"model.layers.{cfg.shared_attn_layers[b]}.shared_transf.", f"shared_blocks.{b}."
        out.update({r + ours: src.take(s + theirs) for ours, theirs in _block_names().items()})
        out[r + "qkv.weight"] = torch.cat([src.take(f"{s}self_attn.{x}_proj.weight") for x in "qkv"])
        out[r + "mlp_fc.weight"] = torch.cat([src.take(f"{s}feed_forward.{x}_proj.weight") for x in ("gate", "up")])
    for i in cfg.shared_attn_layers:
        out[f"blocks.{i}.attn.shared_in.weight"] = src.take(f"model.layers.{i}.linear.weight")
    # a tied block's copies under the other callers' names, which transformers ties to the first's as it loads
    shared = re.compile(r"model\.layers\.\d+\.shared_transf\.")
    for name in sorted(src.names - src.used):
        if shared.match(name):
            src.take(name)
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size],
           "model.final_layernorm.weight": state["norm_f.weight"], **give_head(state, cfg)}
    I, C, h = cfg.delta_heads, cfg.n_embd, cfg.delta_key_heads
    for i in range(cfg.n_layer):
        p, r = _mixer_prefix(cfg, i)
        m = p + "mamba."
        out[p + "input_layernorm.weight"] = state[f"blocks.{i}.norm1.weight"]
        out[m + "in_proj.weight"] = state[r + "in_proj.weight"].view(2, I, C).transpose(0, 1).reshape(2 * I, C)
        out[m + "conv1d.weight"] = state[r + "conv"][:, None]
        conv_bias = state.get(r + "conv_bias")
        out[m + "conv1d.bias"] = conv_bias if conv_bias is not None else state[r + "conv"].new_zeros(I)
        for ours, theirs in (("x_proj.weight", "x_proj_weight"), ("dt_proj.weight", "dt_proj_weight")):
            weight = state[r + ours]  # one head: a Linear layer's (out, in), stacked as the heads' are
            out[m + theirs] = weight.reshape(h, -1, weight.shape[-1])
        out[m + "dt_proj_bias"] = state[r + "dt_proj.bias"].view(h, I // h)
        out[m + "A_log"] = state[r + "A_log"].view(h, I // h, -1)
        out[m + "D"] = state[r + "D"].view(h, I // h)
        out[m + "out_proj.weight"] = state[r + "proj.weight"]
        if cfg.delta_proj_bias:
            out[m + "in_proj.bias"] = state[r + "in_proj.bias"].view(2, I).t().reshape(2 * I)
            out[m + "out_proj.bias"] = state[r + "proj.bias"]
    D, KV, n = cfg.head_dim, cfg.kv_heads, cfg.shared_attn_blocks
    for j, i in enumerate(cfg.shared_attn_layers):
        if j >= n and cfg.tie_embeddings:
            continue  # tied: transformers reads the block from its first caller alone
        s, r = f"model.layers.{i}.shared_transf.", f"shared_blocks.{j % n}."
        block = {s + theirs: state[r + ours] for ours, theirs in _block_names().items()}
        block.update(zip((f"{s}self_attn.{x}_proj.weight" for x in "qkv"),
                         state[r + "qkv.weight"].split([cfg.n_head * D, KV * D, KV * D])))
        block.update(zip((f"{s}feed_forward.{x}_proj.weight" for x in ("gate", "up")),
                         state[r + "mlp_fc.weight"].chunk(2)))
        out.update({name: t.clone() if j >= n else t for name, t in block.items()})
        out[f"model.layers.{i}.linear.weight"] = state[f"blocks.{i}.attn.shared_in.weight"]
    for i in cfg.shared_attn_layers[n:] if cfg.tie_embeddings else ():
        out[f"model.layers.{i}.linear.weight"] = state[f"blocks.{i}.attn.shared_in.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def wants_zamba(cfg: ModelConfig) -> bool:
    """Shared blocks called before Mamba-1 mixers: Zamba's alone."""
    return bool(cfg.shared_attn_layers) and cfg.delta_rule == "mamba1"


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with shared blocks before Mamba-1 mixers that Zamba has not."""
    what = "model.shared_attn_layers with Mamba-1 mixers: Zamba, the architecture with them,"
    every = tuple(range(cfg.n_layer))
    D = cfg.head_dim
    blocks = 1 if cfg.tie_embeddings else len(cfg.shared_attn_layers)
    raise_first([
        (tuple(cfg.delta_layers) != every or tuple(cfg.mlp_free_layers) != every or cfg.mixer_free_layers
         or cfg.conv_layers, f"{what} has a Mamba-1 mixer alone on every layer (model.delta_layers and "
                             f"mlp_free_layers on all {cfg.n_layer})"),
        (cfg.delta_bcdt_norm_eps, f"model.delta_bcdt_norm_eps with {what} has no dt, B and C norms"),
        (cfg.delta_heads % cfg.n_embd, f"{what} has mixers of a whole multiple of n_embd channels (mamba_expand: "
                                       f"model.delta_heads)"),
        (cfg.shared_attn_blocks != blocks, f"model.shared_attn_blocks={cfg.shared_attn_blocks}: {what} shares one "
                                           f"block among its callers where the embeddings are tied, none where not"),
        (cfg.shared_attn_adapter_rank, f"model.shared_attn_adapter_rank with {what} has no adapters"),
        (cfg.attn_scale != (D / 2) ** -0.5, f"{what} scales its scores by (head_size / 2)^-0.5 (model.attn_scale)"),
        (cfg.mlp not in ("geglu", "swiglu"), f"{what} has a gated MLP (model.mlp={cfg.mlp})"),
        (cfg.pos_emb != "none", f"{what} has no positions (model.pos_emb={cfg.pos_emb})"),
        (cfg.norm_unit_offset or cfg.embed_norm or not cfg.norm_affine or cfg.embed_scale or cfg.embed_multiplier
         or cfg.residual_multiplier or cfg.logit_divisor or cfg.logit_softcap or cfg.head_bias or cfg.moe_experts,
         f"{what} has plain RMSNorms and no scales, caps or experts"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    act = "silu" if cfg.mlp == "swiglu" else "gelu" if cfg.gelu_approximate == "none" else "gelu_pytorch_tanh"
    return {
        "model_type": "zamba", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "attention_hidden_size": 2 * cfg.n_embd, "attention_head_dim": cfg.head_dim,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "n_mamba_heads": cfg.delta_key_heads, "hidden_act": act,
        "hidden_mamba_act": "silu", "max_position_embeddings": cfg.context_len, "rms_norm_eps": cfg.norm_eps,
        "layers_block_type": ["hybrid" if i in cfg.shared_attn_layers else "mamba" for i in range(cfg.n_layer)],
        "mamba_d_state": cfg.delta_key_dim, "mamba_d_conv": cfg.delta_conv_kernel,
        "mamba_expand": cfg.delta_heads // cfg.n_embd, "mamba_dt_rank": cfg.dt_rank, "mamba_conv_bias": True,
        "mamba_proj_bias": cfg.delta_proj_bias, "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True, "pad_token_id": None,
        "bos_token_id": None, "eos_token_id": None,  # the writer sets them
    }


FAMILY = Family(name="zamba", architecture="ZambaForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf)
