"""MPT (MosaicML's MptForCausalLM: mpt-1b-redpajama-200b, mpt-7b and its instruct, chat and storywriter models,
mpt-30b): ALiBi positions (model.pos_emb=alibi), pre-LayerNorm blocks with no biases at all (LayerNorms without
one: norm_bias=false; MPT's "low_precision_layernorm" is a LayerNorm computed in the input's dtype, the same in
fp32), one fused Wqkv projection ([q; k; v] rows, redline's layout as it is), an exact-GELU MLP expansion_ratio × the
width, the head tied to the embedding.

attn_config's softmax_scale is redline's attn_scale; alibi_bias_max 8 gives BLOOM's slopes (redline's
alibi_slopes), and transformers builds MPT's bias with 8 whatever the config says, so any other value is refused.
logit_scale multiplies the logits in MosaicML's own code (a number, or "inv_sqrt_d_model"): it is imported as
logit_divisor = 1 / logit_scale, though transformers' MptForCausalLM leaves it out; for that reason the export
writes no logit_scale and refuses a logit_divisor. Likewise expansion_ratio: imported as the checkpoint's MLP width,
while transformers builds 4 × d_model whatever it says, so the export refuses another width. Refused by name, as
transformers does not compute them or redline has no such layer: attn_config's clip_qkv (q, k and v clamped),
qk_ln (LayerNorms on q and k), alibi=false (learned positions, which transformers' MPT does not build), prefix_lm,
attn_type multiquery_attention, alibi_bias_max other than 8; no_bias=false (biases transformers' MPT has no place
for); a norm_type other than a LayerNorm. Semantics read from transformers' models/mpt/modeling_mpt.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.bloom import check_round_trip
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.model import ModelConfig

_LAYER = {"norm1": "norm_1", "norm2": "norm_2", "attn.qkv": "attn.Wqkv", "attn.proj": "attn.out_proj",
          "mlp.fc": "ffn.up_proj", "mlp.proj": "ffn.down_proj"}
_NORMS = ("low_precision_layernorm", "layernorm")


def _logit_scale(hf: dict) -> float:
    """logit_scale as a number: None is 1, "inv_sqrt_d_model" is 1 / sqrt(d_model) (MosaicML's code)."""
    scale = hf.get("logit_scale")
    if scale is None:
        return 1.0
    if scale == "inv_sqrt_d_model":
        return 1 / math.sqrt(hf["d_model"])
    if isinstance(scale, str) or scale <= 0:
        raise UserError(f"logit_scale={scale!r}: redline reads a positive number or \"inv_sqrt_d_model\"")
    return float(scale)


def model_config(hf: dict) -> ModelConfig:
    attn = hf.get("attn_config") or {}
    raise_first([
        (attn.get("clip_qkv") is not None, f"attn_config.clip_qkv={attn.get('clip_qkv')}: q, k and v clamped to "
                                           f"±clip_qkv is not a layer redline has"),
        (bool(attn.get("qk_ln")), "attn_config.qk_ln=true: MPT's LayerNorms on q and k are not computed by "
                                  "transformers and not a norm redline has (its QK-norm is an RMSNorm)"),
        (attn.get("alibi", True) is False, "attn_config.alibi=false: transformers' MPT always adds ALiBi and builds "
                                           "no learned positions"),
        (attn.get("alibi_bias_max", 8) != 8, f"attn_config.alibi_bias_max={attn.get('alibi_bias_max')}: redline's "
                                             f"ALiBi slopes (and transformers' MPT) are those of 8"),
        (bool(attn.get("prefix_lm")), "attn_config.prefix_lm=true: a bidirectional prefix is not attention "
                                      "redline has"),
        (attn.get("attn_type", "multihead_attention") != "multihead_attention",
         f"attn_config.attn_type={attn.get('attn_type')!r}: transformers' MPT is multi-head attention"),
        (hf.get("no_bias", True) is False, "no_bias=false: transformers' MPT has no biases to load"),
        (hf.get("norm_type", "low_precision_layernorm") not in _NORMS,
         f"norm_type={hf.get('norm_type')!r}: redline's MPT reads {' or '.join(_NORMS)}"),
    ])
    width = hf["d_model"]
    scale = _logit_scale(hf)
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=int(hf.get("max_seq_len", 2048)), n_layer=hf["n_layers"],
        n_embd=width, n_head=hf["n_heads"], n_kv_head=None, qk_norm=False, fused_qkv=True, pos_emb="alibi",
        attn_scale=float(attn.get("softmax_scale") or 0.0), mlp="gelu", gelu_approximate="none",
        mlp_hidden=int(hf.get("expansion_ratio", 4) * width), norm="layernorm", norm_bias=False,
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), logit_divisor=0.0 if scale == 1.0 else 1 / scale,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=False,
    )


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of an ALiBi model without a norm on its embeddings that MPT (as transformers
    computes it) does not have."""
    norm_bias = cfg.bias if cfg.norm_bias is None else cfg.norm_bias
    raise_first([
        (cfg.bias or cfg.has_qkv_bias or (cfg.norm == "layernorm" and norm_bias),
         "model.bias (or qkv_bias, norm_bias) with model.pos_emb=alibi: MPT has no biases; BLOOM, which has them, "
         "also has a LayerNorm on its embeddings (model.embed_norm=true)"),
        (cfg.logit_divisor != 0, f"model.logit_divisor={cfg.logit_divisor}: MPT's logit_scale is left out by "
                                 f"transformers' MptForCausalLM, so the exported model would compute other logits"),
        (cfg.hidden_dim != 4 * cfg.n_embd, f"model.mlp_hidden={cfg.hidden_dim}: transformers' MPT builds its MLP "
                                           f"4 × d_model = {4 * cfg.n_embd} wide"),
    ])
    check_round_trip(cfg, "MPT", model_config, hf_config)


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "model_type": "mpt", "vocab_size": cfg.vocab_size, "d_model": cfg.n_embd, "n_heads": cfg.n_head,
        "n_layers": cfg.n_layer, "expansion_ratio": cfg.hidden_dim // cfg.n_embd, "max_seq_len": cfg.context_len,
        "layer_norm_epsilon": cfg.norm_eps, "no_bias": True, "norm_type": "low_precision_layernorm",
        "learned_pos_emb": False, "logit_scale": None if not cfg.logit_divisor else 1 / cfg.logit_divisor,
        "attn_config": {"attn_type": "multihead_attention", "softmax_scale": cfg.attn_scale or None,
                        "clip_qkv": None, "qk_ln": False, "alibi": True, "alibi_bias_max": 8, "prefix_lm": False,
                        "attn_pdrop": 0},
        "tie_word_embeddings": cfg.tie_embeddings, "resid_pdrop": 0.0, "emb_pdrop": 0.0, "use_cache": True,
        "initializer_range": 0.02,
    }


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = "transformer." if "transformer.wte.weight" in src else ""  # "": saved from MptModel
    out = {"wte.weight": pad_rows(src.take(pre + "wte.weight"), cfg), "norm_f.weight": src.take(pre + "norm_f.weight")}
    out.update(take_head(src, cfg))
    for i in range(cfg.n_layer):
        for mine, other in _LAYER.items():
            out[f"blocks.{i}.{mine}.weight"] = src.take(f"{pre}blocks.{i}.{other}.weight")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    pre = "transformer."
    out = {pre + "wte.weight": state["wte.weight"][:cfg.vocab_size], pre + "norm_f.weight": state["norm_f.weight"]}
    out.update(give_head(state, cfg))
    for i in range(cfg.n_layer):
        r = f"blocks.{i}."
        if not cfg.fused_qkv:  # separate q/k/v layers: Wqkv is their rows stacked
            state = {**state, f"{r}attn.qkv.weight": torch.cat([state[f"{r}attn.{x}.weight"] for x in "qkv"])}
        for mine, other in _LAYER.items():
            out[f"{pre}blocks.{i}.{other}.weight"] = state[f"{r}{mine}.weight"]
    return {k: v.contiguous() for k, v in out.items()}


FAMILY = Family(name="mpt", architecture="MptForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf)
