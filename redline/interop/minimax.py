"""MiniMax-Text-01 and MiniMax-M1 (MiniMaxForCausalLM, model_type "minimax"). Semantics read from transformers'
models/minimax/modular_minimax.py and configuration.

Mixtral's model (moe.py: RoPE attention with GQA, a softmax router's top k experts rescaled to sum to one, RMSNorm)
with two changes:
- the layers layer_types marks "linear_attention" run lightning attention in attention's place (model.delta_layers
  with delta_rule=lightning, model.py's Lightning: self_attn.qkv_proj, output_gate, norm and out_proj; the decay
  rates are fixed by the head, the layer and the depth, lightning_slopes). The files also hold the decays as buffers
  (self_attn.slope_rate, query_decay, key_decay, diagonal_decay): slope_rate is checked against redline's rates at
  import, the others (the same rates tabulated for transformers' blocks of block_size tokens) are derived; exports
  write all four as transformers computes them;
- each sublayer's residual is its normed input: x ← α·norm(x) + β·f(norm(x)), (α, β) the config's
  full_attn_*_factor, linear_attn_*_factor and mlp_*_factor (model.normed_residual).
The lightning output norm is MiniMaxRMSNorm at its default epsilon, 1e-6 (model.delta_norm_eps), whatever
rms_norm_eps is. Refused by name: hidden_act other than silu, RoPE on part of each head (rotary_dim or
partial_rotary_factor: transformers' MiniMax rotates whole heads), decay buffers other than transformers' rates.
Exports: a model with lightning layers or normed residuals (MiniMax's alone), its MLPs Mixtral's experts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.moe import check_exportable as check_moe_exportable
from redline.interop.moe import experts_to_hf, experts_to_redline, hf_config_for_moe, model_config_for
from redline.model import ModelConfig, lightning_slopes

_LIGHTNING_EPS = 1e-6  # MiniMaxRMSNorm's default, the lightning output norm's (its config's rms_norm_eps unused)
_BLOCK_SIZE = 256  # MiniMaxConfig's block_size: how transformers tiles its lightning attention (no effect on outputs)
_SCALES = ("full_attn_alpha_factor", "full_attn_beta_factor", "linear_attn_alpha_factor", "linear_attn_beta_factor",
           "mlp_alpha_factor", "mlp_beta_factor")  # model.normed_residual's order
_LIGHTNING = ("qkv_proj", "output_gate", "out_proj")  # the same names in redline's Lightning and transformers'


def _layer_types(hf: dict) -> list[str]:
    n = int(hf["num_hidden_layers"])
    kinds = hf.get("layer_types") or ["full_attention" if (i + 1) % 2 else "linear_attention" for i in range(n)]
    if len(kinds) != n or set(kinds) - {"full_attention", "linear_attention"}:
        raise UserError(f"layer_types={kinds}: MiniMax takes num_hidden_layers={n} entries, each full_attention or "
                        f"linear_attention")
    return kinds


def model_config(hf: dict) -> ModelConfig:
    hf = {k: v for k, v in hf.items() if v is not None}
    heads = int(hf["num_attention_heads"])
    head_dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)
    rotary = hf.get("rotary_dim")
    partial = (hf.get("rope_parameters") or {}).get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if (rotary is not None and int(rotary) != head_dim) or float(partial) != 1.0:
        raise UserError(f"rotary_dim={rotary} / partial_rotary_factor={partial} with head_dim={head_dim}: "
                        f"transformers' MiniMax rotates whole heads, so which part a checkpoint rotates is unclear; "
                        f"only whole-head RoPE is supported")
    base = model_config_for("mixtral")(hf)  # Mixtral's attention and experts: shapes, RoPE, window, top k
    kinds = _layer_types(hf)
    scales = tuple(float(hf.get(name, 1.0)) for name in _SCALES)
    linear = tuple(i for i, kind in enumerate(kinds) if kind == "linear_attention")
    return replace(base, delta_layers=linear, delta_rule="lightning", delta_heads=heads, delta_key_heads=heads,
                   delta_key_dim=head_dim, delta_value_dim=head_dim, delta_norm_eps=_LIGHTNING_EPS,
                   normed_residual=scales)


def _decays(cfg: ModelConfig, layer: int) -> dict[str, torch.Tensor]:
    """Transformers' lightning buffers of layer `layer` (MiniMaxLightningAttention.decay_factors, blocks of
    _BLOCK_SIZE tokens): slope_rate (H, 1, 1), query_decay and key_decay (H, block, 1), diagonal_decay
    (1, H, block, block)."""
    rate = lightning_slopes(cfg.delta_heads, layer, cfg.n_layer)[:, None, None]
    steps = torch.arange(_BLOCK_SIZE) + 1
    gaps = (steps[:, None] - steps[None, :])[None, None] * rate
    return {"slope_rate": rate, "query_decay": torch.exp(-rate * steps[:, None]),
            "key_decay": torch.exp(-rate * (_BLOCK_SIZE - steps[:, None])),
            "diagonal_decay": torch.exp(torch.where(gaps >= 0, -gaps, float("-inf")))}


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"norm_f.weight": src.take("model.norm.weight"),
           "wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        a = p + "self_attn."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        if i in cfg.delta_layers:
            for name in _LIGHTNING:
                out[f"{r}attn.{name}.weight"] = src.take(f"{a}{name}.weight")
            out[r + "attn.norm"] = src.take(a + "norm.weight")
            if a + "slope_rate" in src:  # transformers runs the stored rates: they must be redline's
                stored = src.take(a + "slope_rate").float().flatten()
                want = lightning_slopes(cfg.delta_heads, i, cfg.n_layer)
                if stored.shape != want.shape or not torch.allclose(stored, want, rtol=1e-5, atol=0):
                    raise UserError(f"{a}slope_rate holds decay rates other than MiniMax's for layer {i} of "
                                    f"{cfg.n_layer}; redline's lightning attention fixes them by layer and depth")
            for name in ("query_decay", "key_decay", "diagonal_decay"):  # derived from the rates: marked read
                if a + name in src:
                    src.take(a + name)
        else:
            out[r + "attn.qkv.weight"] = torch.cat([src.take(f"{a}{x}_proj.weight") for x in "qkv"])
            out[r + "attn.proj.weight"] = src.take(a + "o_proj.weight")
        out.update(experts_to_redline(src, p, r, cfg))
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.norm.weight": state["norm_f.weight"],
           "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size], **give_head(state, cfg)}
    q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        a = p + "self_attn."
        out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
        if i in cfg.delta_layers:
            for name in _LIGHTNING:
                out[f"{a}{name}.weight"] = state[f"{r}attn.{name}.weight"]
            out[a + "norm.weight"] = state[r + "attn.norm"]
            out.update({a + name: t for name, t in _decays(cfg, i).items()})
        else:
            out.update(zip((a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
                           state[r + "attn.qkv.weight"].split([q, kv, kv])))
            out[a + "o_proj.weight"] = state[r + "attn.proj.weight"]
        out.update(experts_to_hf(state, p, r, cfg, "mixtral"))
    return {k: v.contiguous() for k, v in out.items()}


def wants_minimax(cfg: ModelConfig) -> bool:
    """Lightning attention or normed residuals: MiniMax's alone."""
    return bool(cfg.normed_residual) or (bool(cfg.delta_layers) and cfg.delta_rule == "lightning")


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option that MiniMax (Mixtral's attention and experts, lightning attention, normed
    residuals) does not have."""
    what = "MiniMax, the architecture with lightning attention and normed residuals,"
    named = [(name, getattr(cfg, name)) for name in (
        "qk_norm", "qkv_bias", "attn_sinks", "window_layers", "attn_scale", "moe_shared_hidden", "moe_layers",
        "mlp_free_layers", "mixer_free_layers", "conv_layers", "value_embeddings", "embed_norm", "attn_softcap",
        "logit_softcap", "rope_dims", "kv_lora_rank")]
    eps = cfg.delta_norm_eps or cfg.norm_eps
    raise_first([(bool(value), f"model.{name}: {what} has no such option") for name, value in named] + [
        (not cfg.normed_residual, f"model.normed_residual=(): {what} has residuals from the normed inputs (give its "
                                  f"six scales, 1.0 each for MiniMax's defaults)"),
        (bool(cfg.delta_layers) and cfg.delta_rule != "lightning",
         f"model.delta_rule={cfg.delta_rule}: {what} has lightning attention alone among recurrent layers"),
        (not cfg.moe_experts, f"model.moe_experts=0: {what} has a mixture of experts in every layer"),
        (bool(cfg.delta_layers) and (cfg.delta_heads != cfg.n_head or cfg.delta_key_dim != cfg.head_dim),
         f"model.delta_heads={cfg.delta_heads}, delta_key_dim={cfg.delta_key_dim}: {what} has lightning heads as "
         f"many and as wide as attention's ({cfg.n_head} of {cfg.head_dim})"),
        (bool(cfg.delta_layers) and eps != _LIGHTNING_EPS,
         f"model.delta_norm_eps={eps}: {what} norms the lightning output at {_LIGHTNING_EPS}"),
        (cfg.attn_gate != "none", f"model.attn_gate={cfg.attn_gate}: {what} has no gate on its attention heads"),
        (not cfg.moe_norm_topk, f"model.moe_norm_topk=false: {what} rescales its top k expert weights to sum to 1"),
    ])
    check_moe_exportable(cfg)


def hf_config(cfg: ModelConfig) -> dict:
    out = hf_config_for_moe("mixtral")(cfg)
    out.update(model_type="minimax", head_dim=cfg.head_dim, block_size=_BLOCK_SIZE,
               layer_types=["linear_attention" if i in cfg.delta_layers else "full_attention"
                            for i in range(cfg.n_layer)],
               **dict(zip(_SCALES, cfg.normed_residual)))
    return out


FAMILY = Family(name="minimax", architecture="MiniMaxForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf)
