"""BitNet b1.58 (Microsoft's BitNetForCausalLM, model_type "bitnet": bitnet-b1.58-2B-4T and its -bf16 master
weights): Llama's names and attention with an RMSNorm before each output projection (attn_sub_norm before o_proj,
ffn_sub_norm before down_proj: redline's model.sub_norms), a gated ReLU² MLP (down(norm(relu(gate(x))² · up(x))):
mlp=relu2_glu) and RoPE base 500000 where the config gives none.

transformers runs the block's Linear layers as its quantization_config says (integrations/bitnet.py, redline's
model.bitlinear):
- none: plain Linear layers (bitlinear=off);
- linear_class "autobitlinear", quantization_mode "online" (the -bf16 master weights): each projection's input
  rounded to 8 bits per token, its weight to {-1, 0, 1} times its mean absolute value on every call
  (bitlinear=online; trainable, a straight-through estimator);
- linear_class "bitlinear" (either mode; the packed checkpoint): weights stored packed, four ternary rows to a uint8
  row (packed row r holds rows r, r + R, r + 2R, r + 3R in bit pairs 0-1, 2-3, 4-5, 6-7, each value + 1), and
  `weight_scale` (1,) that the product is divided by; "autobitlinear" "offline": ternary weights (packed or not) and
  a `weight_scale` the product is multiplied by. Both import as bitlinear=offline with the weights unpacked and
  scaled (W = ternary / scale or ternary · scale), only the input rounded on each call.
The head (lm_head) stays a plain Linear layer in every case, as transformers leaves it.

An export writes the master weights (bitlinear=online, the autobitlinear online config), plain weights (off), or an
offline model's ternary weights with their scales as autobitlinear offline, unpacked. Semantics read from
transformers' models/bitnet/modeling_bitnet.py, integrations/bitnet.py and quantizers/quantizer_bitnet.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop import llama
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.model import ModelConfig

_LINEARS = {"self_attn.q_proj": "attn.q", "self_attn.k_proj": "attn.k", "self_attn.v_proj": "attn.v",
            "self_attn.o_proj": "attn.proj", "mlp.gate_proj": "mlp.fc", "mlp.up_proj": "mlp.up",
            "mlp.down_proj": "mlp.proj"}
_NORMS = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2", "self_attn.attn_sub_norm": "attn.proj.norm",
          "mlp.ffn_sub_norm": "mlp.proj.norm"}
_SCALE = ".weight_scale"  # an offline checkpoint's per-projection scale, folded into the weights (fold)
ROWS_PER_BYTE = 4  # transformers' VALUES_PER_ITEM: four 2-bit ternary values a uint8


def quantization(hf: dict) -> tuple[str, str]:
    """(model.bitlinear, the checkpoint's linear_class or "") for a BitNet config.json, or a UserError naming the
    quantization option redline does not compute."""
    q = hf.get("quantization_config")
    if not q:
        return "off", ""
    if q.get("quant_method", "bitnet") != "bitnet":
        raise UserError(f"quantization_config.quant_method={q.get('quant_method')!r}: a BitNet model is read with "
                        f"BitNet's own quantization alone")
    if q.get("use_rms_norm"):
        raise UserError("quantization_config.use_rms_norm=true (an RMSNorm inside every BitLinear layer) is not "
                        "implemented in redline; only BitNet's sub-norms (attn_sub_norm, ffn_sub_norm) are")
    kept = [m for m in q.get("modules_to_not_convert") or [] if m not in ("lm_head", "lm_head.weight")]
    if kept:
        raise UserError(f"quantization_config.modules_to_not_convert={kept}: redline's model.bitlinear quantizes "
                        f"every block projection alike (the head alone stays full precision)")
    linear_class, mode = q.get("linear_class", "bitlinear"), q.get("quantization_mode", "offline")
    if linear_class not in ("bitlinear", "autobitlinear") or mode not in ("online", "offline"):
        raise UserError(f"quantization_config linear_class={linear_class!r}, quantization_mode={mode!r}: transformers "
                        f"knows bitlinear and autobitlinear, online and offline")
    online = linear_class == "autobitlinear" and mode == "online"  # BitLinear is packed whatever the mode says
    return ("online" if online else "offline"), linear_class


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "relu2")
    if act != "relu2":
        raise UserError(f"hidden_act={act!r}: redline's BitNet has its gated ReLU² MLP (hidden_act relu2) alone")
    if hf.get("attention_bias"):  # q/k/v/o biases with none in the MLP: redline's `bias` covers the MLP too
        raise UserError("attention_bias=true: BitNet then has biases on q/k/v/o but none in its MLP, a mix redline "
                        "does not have")
    rope = dict(hf.get("rope_parameters") or {})
    if "rope_theta" not in rope and "rope_theta" not in hf:  # BitNetConfig's default_theta
        hf = {**hf, "rope_theta": 500000.0}
    return ModelConfig(
        **llama.shape_fields(hf), fused_qkv=False, pos_emb="rope", mlp="relu2_glu", fused_mlp=False, norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=False, sub_norms=True, bitlinear=quantization(hf)[0], **llama._rope(hf))


def unpack_ternary(packed: torch.Tensor) -> torch.Tensor:
    """packed (R, in) uint8 -> (4R, in) int8 in {-1, 0, 1}: packed row r holds rows r + k·R in bits 2k, 2k + 1, each
    value stored plus one (transformers' unpack_weights)."""
    parts = [((packed.to(torch.int16) >> (2 * k)) & 3) - 1 for k in range(ROWS_PER_BYTE)]
    return torch.cat(parts).to(torch.int8)


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = llama._prefix(src)
    out = {"norm_f.weight": src.take(f"{pre}norm.weight"),
           "wte.weight": pad_rows(src.take(f"{pre}embed_tokens.weight"), cfg)}
    out.update(take_head(src, cfg))
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        for theirs, ours in _NORMS.items():
            out[f"{r}{ours}.weight"] = src.take(f"{p}{theirs}.weight")
        for theirs, ours in _LINEARS.items():
            w = src.take(f"{p}{theirs}.weight")
            if cfg.bitlinear == "offline":  # ternary (packed or not) beside its scale: fold scales it
                out[f"{r}{ours}{_SCALE}"] = src.take(f"{p}{theirs}{_SCALE}").reshape(-1)[:1]
                w = unpack_ternary(w) if w.dtype == torch.uint8 else w
            out[f"{r}{ours}.weight"] = w
    return out


def fold(hf: dict, cfg: ModelConfig, state: dict) -> dict:
    """An offline checkpoint's ternary weights times their scale, in the scale's dtype: divided by it for
    linear_class bitlinear (BitLinear's product / (weight_scale · input scale)), multiplied for autobitlinear
    (AutoBitLinear's product · weight_scale)."""
    if cfg.bitlinear != "offline":
        return state
    divide = quantization(hf)[1] == "bitlinear"
    out = {}
    for name, t in state.items():
        if name.endswith(_SCALE):
            continue
        scale = state.get(name.removesuffix(".weight") + _SCALE)
        if scale is not None:
            ternary, s = t.float(), scale.float()
            t = (ternary / s if divide else ternary * s).to(scale.dtype)
        out[name] = t
    return out


def ternary_parts(w: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """An offline model's weight w (out, in) -> (its ternary values in w's dtype, scale (1,)), w = ternary · scale;
    a UserError where w is not of that form (an offline model's weights are never trained)."""
    scale = w.float().abs().amax().clamp(min=torch.finfo(torch.float32).tiny)
    ternary = (w.float() / scale).round().clamp(-1, 1)
    if not torch.equal((ternary * scale).to(w.dtype), w):
        raise UserError(f"{name} is not ternary times one scale, which model.bitlinear=offline holds; export a model "
                        f"of model.bitlinear=online or off")
    return ternary.to(w.dtype), scale.reshape(1).to(w.dtype)


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {"model.norm.weight": state["norm_f.weight"],
           "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size]}
    out.update(give_head(state, cfg))
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        for theirs, ours in _NORMS.items():
            out[f"{p}{theirs}.weight"] = state[f"{r}{ours}.weight"]
        # q/k/v and gate/up apart whether the model holds them fused (bitlinear=off may) or not
        q, k, v = llama._qkv(state, r, cfg, "weight")
        gate, up = llama._mlp_parts(state, r, cfg, "weight")
        weights = {"self_attn.q_proj": q, "self_attn.k_proj": k, "self_attn.v_proj": v,
                   "self_attn.o_proj": state[r + "attn.proj.weight"], "mlp.gate_proj": gate, "mlp.up_proj": up,
                   "mlp.down_proj": state[r + "mlp.proj.weight"]}
        for theirs, ours in _LINEARS.items():
            w = weights[theirs]
            if cfg.bitlinear == "offline":
                w, out[f"{p}{theirs}{_SCALE}"] = ternary_parts(w, f"{r}{ours}.weight")
            out[f"{p}{theirs}.weight"] = w
    return {k: v.contiguous() for k, v in out.items()}


def wants_bitnet(cfg: ModelConfig) -> bool:
    """BitNet's options, which no other architecture redline exports to has."""
    return cfg.bitlinear != "off" or cfg.sub_norms or cfg.mlp == "relu2_glu"


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option BitNet, the one architecture with sub-norms, ternary projections and a gated
    ReLU² MLP redline exports to, does not have."""
    what = "BitNet, the one architecture with model.bitlinear, sub_norms or mlp=relu2_glu redline exports to,"
    raise_first([
        (not cfg.sub_norms or cfg.mlp != "relu2_glu",
         f"{what} has both sub-norms (model.sub_norms) and the gated ReLU² MLP (model.mlp=relu2_glu)"),
        (cfg.norm_position != "pre" or cfg.parallel_residual or cfg.norm != "rmsnorm" or cfg.norm_unit_offset
         or not cfg.norm_affine or cfg.embed_norm, f"{what} has pre-RMSNorm blocks of sequential sublayers"),
        (cfg.qk_norm or cfg.v_norm, f"{what} has no QK-norm"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_local_theta or cfg.rope_layer_theta,
         f"{what} rotates every layer's whole heads with one RoPE"),
        (cfg.sliding_window > 0, f"{what} attends to the whole context (model.sliding_window)"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no Linear biases (model.bias, model.qkv_bias)"),
        (cfg.attn_sinks or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap or cfg.embed_scale
         or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.head_bias
         or cfg.value_embeddings or cfg.layer_scalars or cfg.per_layer_embd,
         f"{what} has no sinks, scales, caps or scalars"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    out = llama.llama_shaped_hf_config(cfg, "bitnet")
    rope = {"rope_type": "default", "rope_theta": out.pop("rope_theta"), **(out.pop("rope_scaling") or {})}
    out.update(hidden_act="relu2", attention_bias=False, rope_parameters=rope, pad_token_id=None, bos_token_id=None,
               eos_token_id=None)  # the writer sets the token ids
    if cfg.bitlinear != "off":
        out["quantization_config"] = {"quant_method": "bitnet", "linear_class": "autobitlinear",
                                      "quantization_mode": cfg.bitlinear, "use_rms_norm": False,
                                      "modules_to_not_convert": None}
    return out


FAMILY = Family(name="bitnet", architecture="BitNetForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=llama._ignorable, fold=fold)
