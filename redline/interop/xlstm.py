"""xLSTM (xLSTMForCausalLM, model_type "xlstm": NX-AI/xLSTM-7b): every block pre-RMSNorm → an mLSTM layer →
residual, pre-RMSNorm → a SwiGLU feed-forward → residual; an RMSNorm last, the logits soft-capped.

- mLSTM layer (redline's delta_rule=mlstm on every layer, MLSTM): q, k (hidden_size·qk_dim_factor), v and the
  output gate (hidden_size·v_dim_factor) in num_heads heads, input and forget gates a head (with biases) soft-capped at
  gate_soft_cap (model.delta_gate_softcap), the matrix memory in fp32, a LayerNorm per head at norm_eps (its weight,
  no bias), times the sigmoid output gate, out_proj;
- feed-forward: SiLU(proj_up_gate) · proj_up, proj_down, round_up(hidden_size·ffn_proj_factor,
  ffn_round_up_to_multiple_of) wide (model.mlp=swiglu);
- weight_mode "single" (q, k, v, ogate_preact, igate_preact, fgate_preact; proj_up_gate, proj_up) or "fused"
  (qkv_opreact, ifgate_preact; proj_up_gate_z), read into the same layers and written back as "single".

The kernels (chunkwise_kernel, sequence_kernel, step_kernel, mode, chunk_size) and their dtypes
(autocast_kernel_dtype, inference_state_dtype) choose how transformers computes the same recurrence: redline computes
it chunk by chunk in fp32 (recurrent.mlstm) whatever they say. add_out_norm is read and not refused: transformers'
own xLSTMModel applies out_norm whatever it says, and so is tie_word_embeddings: transformers' xLSTM never ties
its lm_head to the embeddings (it declares no tied weights), so neither does the import. Refused: use_bias (biases on
every projection and norm), a cell eps other than 1e-6 (the mLSTM's denominator term, redline's MLSTM_EPS),
dimensions that are not whole heads.
Semantics read from transformers' models/xlstm/modeling_xlstm.py (its native kernels, used without the xlstm
package).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, pad_rows, raise_first, take_head
from redline.model import MLSTM_EPS, ModelConfig

_LAYER = {"q": "q", "k": "k", "v": "v", "ogate_preact": "o", "igate_preact": "igate", "fgate_preact": "fgate",
          "out_proj": "proj"}  # theirs -> ours (weight_mode single)


def _round_up(x: float, multiple: int) -> int:
    """transformers' round_up_to_next_multiple_of, as it computes it (floor division of a float: x itself rounded
    down where multiple is 1)."""
    return int(((x + multiple - 1) // multiple) * multiple)


def model_config(hf: dict) -> ModelConfig:
    if hf.get("use_bias", False):
        raise UserError("use_bias=true: redline's mLSTM layers and RMSNorms have no biases (xLSTM-7b has none); only "
                        "use_bias=false models are supported")
    eps = float(hf.get("eps", 1e-6))
    if eps != MLSTM_EPS:
        raise UserError(f"eps={eps}: redline's mLSTM cell adds 1e-6 to its denominator (xLSTM's default); only "
                        f"eps=1e-6 is supported")
    if hf.get("weight_mode", "single") not in ("single", "fused"):
        raise UserError(f"weight_mode={hf['weight_mode']!r}: xLSTM's layers are single or fused")
    width = hf.get("hidden_size") or hf["embedding_dim"]
    heads = hf.get("num_heads", 8)
    n = hf.get("num_hidden_layers") or hf["num_blocks"]
    # transformers' xLSTMLayer truncates (int), its cache rounds up to 64 (qk_dim): the weights follow the layer
    qk, v = int(width * hf.get("qk_dim_factor", 0.5)), int(width * hf.get("v_dim_factor", 1.0))
    if qk % heads or v % heads:
        raise UserError(f"qk_dim_factor and v_dim_factor give {qk} and {v} channels, not whole heads of "
                        f"num_heads={heads}")
    norm_eps = float(hf.get("norm_eps", 1e-6))
    layers = tuple(range(n))
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=int(hf.get("max_position_embeddings") or 4096), n_layer=n,
        n_embd=width, n_head=1, pos_emb="none", norm="rmsnorm", norm_eps=norm_eps, bias=False,
        mlp="swiglu", fused_mlp=True,
        mlp_hidden=_round_up(width * hf.get("ffn_proj_factor", 2.667), hf.get("ffn_round_up_to_multiple_of", 64)),
        logit_softcap=float(hf.get("output_logit_soft_cap", 30.0) or 0.0),
        tie_embeddings=False, delta_layers=layers, delta_rule="mlstm",
        delta_heads=heads, delta_key_heads=heads, delta_key_dim=qk // heads, delta_value_dim=v // heads,
        delta_gate_softcap=float(hf.get("gate_soft_cap", 15.0) or 0.0))


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("backbone.embeddings.weight"), cfg),
           "norm_f.weight": src.take("backbone.out_norm.weight"), **take_head(src, cfg)}
    H, qk, v = cfg.delta_heads, cfg.delta_heads * cfg.delta_key_dim, cfg.delta_heads * cfg.delta_value_dim
    for i in range(cfg.n_layer):
        p, r = f"backbone.blocks.{i}.", f"blocks.{i}."
        m, a = p + "mlstm_layer.", r + "attn."
        out[r + "norm1.weight"] = src.take(p + "norm_mlstm.weight")
        out[r + "norm2.weight"] = src.take(p + "norm_ffn.weight")
        if m + "qkv_opreact.weight" in src:  # weight_mode fused: [q; k; v; o] and [i; f] rows
            for ours, w in zip("qkvo", src.take(m + "qkv_opreact.weight").split([qk, qk, v, v])):
                out[f"{a}{ours}.weight"] = w
            for kind in ("weight", "bias"):
                i_gate, f_gate = src.take(f"{m}ifgate_preact.{kind}").split([H, H])
                out[f"{a}igate.{kind}"], out[f"{a}fgate.{kind}"] = i_gate, f_gate
            out[a + "proj.weight"] = src.take(m + "out_proj.weight")
        else:
            out.update({f"{a}{ours}.weight": src.take(f"{m}{theirs}.weight") for theirs, ours in _LAYER.items()})
            for gate in ("igate", "fgate"):
                out[f"{a}{gate}.bias"] = src.take(f"{m}{gate}_preact.bias")
        out[a + "norm"] = src.take(m + "multihead_norm.weight")
        f = p + "ffn."
        if f + "proj_up_gate_z.weight" in src:  # fused: [gate; z], redline's fused fc as it is
            out[r + "mlp.fc.weight"] = src.take(f + "proj_up_gate_z.weight")
        else:
            out[r + "mlp.fc.weight"] = torch.cat([src.take(f + "proj_up_gate.weight"), src.take(f + "proj_up.weight")])
        out[r + "mlp.proj.weight"] = src.take(f + "proj_down.weight")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    # transformers' xLSTM never ties its head (no _tied_weights_keys): a tied model's head is written as a copy
    out = {"backbone.embeddings.weight": state["wte.weight"][:cfg.vocab_size],
           "backbone.out_norm.weight": state["norm_f.weight"],
           "lm_head.weight": state["lm_head.weight"][:cfg.vocab_size].clone()}
    for i in range(cfg.n_layer):
        p, r = f"backbone.blocks.{i}.", f"blocks.{i}."
        m, a = p + "mlstm_layer.", r + "attn."
        out[p + "norm_mlstm.weight"], out[p + "norm_ffn.weight"] = state[r + "norm1.weight"], state[r + "norm2.weight"]
        out.update({f"{m}{theirs}.weight": state[f"{a}{ours}.weight"] for theirs, ours in _LAYER.items()})
        for gate in ("igate", "fgate"):
            out[f"{m}{gate}_preact.bias"] = state[f"{a}{gate}.bias"]
        out[m + "multihead_norm.weight"] = state[a + "norm"]
        f = p + "ffn."
        out[f + "proj_up_gate.weight"], out[f + "proj_up.weight"] = state[r + "mlp.fc.weight"].chunk(2)
        out[f + "proj_down.weight"] = state[r + "mlp.proj.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def wants_xlstm(cfg: ModelConfig) -> bool:
    """A model with mLSTM layers: xLSTM's, the one architecture that has them."""
    return bool(cfg.delta_layers) and cfg.delta_rule == "mlstm"


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a model with mLSTM layers that transformers' xLSTM has not."""
    what = "mLSTM layers (model.delta_rule=mlstm): xLSTM, the one architecture with them,"
    every = tuple(range(cfg.n_layer))
    raise_first([
        (cfg.delta_layers != every or cfg.mlp_free_layers or cfg.mixer_free_layers,
         f"{what} has an mLSTM layer and a feed-forward in every block (model.delta_layers naming every layer)"),
        (cfg.norm != "rmsnorm" or not cfg.norm_affine or cfg.norm_unit_offset or cfg.norm_position != "pre"
         or cfg.parallel_residual or cfg.embed_norm or (cfg.delta_norm_eps and cfg.delta_norm_eps != cfg.norm_eps),
         f"{what} has pre-RMSNorm blocks with weights, its heads' norms at the same epsilon (model.norm=rmsnorm, "
         f"norm_position=pre, no embed_norm or delta_norm_eps of their own)"),
        (cfg.mlp != "swiglu" or not cfg.fused_mlp or cfg.moe_experts or cfg.bias,
         f"{what} has a SwiGLU feed-forward without biases or experts (model.mlp=swiglu, fused_mlp, bias=false)"),
        (cfg.pos_emb != "none", f"model.pos_emb={cfg.pos_emb}: {what} has no positions"),
        (not cfg.delta_gate_softcap or not cfg.logit_softcap,
         f"{what} soft-caps its gates and its logits (model.delta_gate_softcap, logit_softcap > 0: a cap of 0 is "
         f"no number there)"),
        (cfg.value_embeddings or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier
         or cfg.logit_divisor or cfg.head_bias or cfg.head_vocab or cfg.residual_scales or cfg.layer_scalars
         or cfg.per_layer_embd or cfg.rescale_every,
         f"{what} has no embedding scale, scalars, head bias or further streams"),
    ])


def _factor(width: int, of: int) -> float:
    """A dimension factor whose product with `of` transformers truncates (int) to `width`: width / of where that
    product is exact, else half a channel more."""
    return width / of if of * (width / of) == width else (width + 0.5) / of


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    H, C, F = cfg.delta_heads, cfg.n_embd, cfg.hidden_dim
    # the feed-forward's width as round_up(C·factor, multiple): xLSTM-7b's 2.667 and 64 where they give it, else F / C
    # rounded up to a multiple of F itself (F whatever C·(F / C) rounds to)
    ffn = (2.667, 64) if F == _round_up(C * 2.667, 64) else (F / C, F)
    return {"model_type": "xlstm", "vocab_size": cfg.vocab_size, "hidden_size": C, "embedding_dim": C,
            "num_hidden_layers": cfg.n_layer, "num_blocks": cfg.n_layer, "num_heads": H,
            "qk_dim_factor": _factor(H * cfg.delta_key_dim, C), "v_dim_factor": _factor(H * cfg.delta_value_dim, C),
            "ffn_proj_factor": ffn[0], "ffn_round_up_to_multiple_of": ffn[1], "use_bias": False,
            "norm_eps": cfg.norm_eps, "eps": MLSTM_EPS, "gate_soft_cap": cfg.delta_gate_softcap,
            "output_logit_soft_cap": cfg.logit_softcap, "weight_mode": "single", "add_out_norm": True,
            "tie_word_embeddings": False, "max_position_embeddings": cfg.context_len,
            "mode": "inference", "use_cache": True}


FAMILY = Family(name="xlstm", architecture="xLSTMForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf)
