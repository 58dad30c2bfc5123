"""Chameleon (Meta's ChameleonForConditionalGeneration, model_type "chameleon": chameleon-7b, chameleon-30b): an
early-fusion model whose VQ-VAE turns images into tokens of its own vocabulary, so its text model is the whole
language model; the VQ-VAE (model.vqmodel.*) is left unread. Its block is Llama's (flat config.json, Llama's tensor
names) with two differences, read from transformers' models/chameleon/modeling_chameleon.py:

- QK-norm before RoPE is a LayerNorm over each head's D channels with a weight and a bias of its own per head
  (ChameleonLayerNorm: q_norm (H, D), k_norm (KV, D); its eps fixed at 1e-5): model.qk_layernorm_per_head;
- the logits of the image tokens (vocabulary_map's "IMGIMG" entries) are set to the dtype's minimum, so text
  generation never emits them: the head's bias (model.head_bias) holds float32's minimum at those ids and zero
  elsewhere, which leaves logits of exactly that value (a row's product is below its ulp) and the others unchanged.

swin_norm (Chameleon-30B's norms on the sublayers' outputs, before the residual add) is refused by name. Import only:
no architecture redline writes has per-head QK LayerNorms.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop import llama
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig

CHAMELEON_QK_EPS = 1e-5  # ChameleonLayerNorm's, fixed in its code (no config key)


def image_token_ids(hf: dict) -> list[int]:
    """The ids of vocabulary_map's image tokens (names starting with "IMGIMG"), whose logits Chameleon masks
    (transformers' ChameleonImageVocabularyMapping.image_tokens)."""
    return sorted(int(i) for name, i in (hf.get("vocabulary_map") or {}).items() if name.startswith("IMGIMG"))


def model_config(hf: dict) -> ModelConfig:
    eps = float(hf.get("rms_norm_eps", 1e-5))
    raise_first([
        (bool(hf.get("swin_norm")), "swin_norm=true: Chameleon's norms then sit on the sublayers' outputs, which "
                                    "redline's pre-norm Llama block with a LayerNorm QK-norm does not have"),
        (eps != CHAMELEON_QK_EPS, f"rms_norm_eps={eps}: Chameleon's QK LayerNorms keep eps 1e-5, redline's share the "
                                  f"model's norm eps"),
        (bool(hf.get("attention_bias")) != bool(hf.get("mlp_bias")),
         f"attention_bias={hf.get('attention_bias')} with mlp_bias={hf.get('mlp_bias')}: redline's biases sit on "
         f"every Linear layer or none"),
    ])
    cfg = llama.model_config_for("llama")({**hf, "model_type": "llama"})
    return replace(cfg, qk_norm=True, qk_layernorm=True, qk_layernorm_per_head=True,
                   head_bias=bool(image_token_ids(hf)))


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    """Llama's tensors, plus each layer's q_norm / k_norm bias ((H, D), (KV, D)) beside their weights."""
    out = llama.to_redline(src, cfg)
    for i in range(cfg.n_layer):
        for norm in ("q_norm", "k_norm"):
            out[f"blocks.{i}.attn.{norm}.bias"] = src.take(f"model.layers.{i}.self_attn.{norm}.bias")
    return out


def _fold(hf: dict, cfg: ModelConfig, state: dict) -> dict:
    """The image tokens' logit mask as the head's bias: float32's minimum at their ids, zero elsewhere."""
    if not cfg.head_bias:
        return state
    head = state["lm_head.weight"]
    bias = torch.zeros(head.shape[0], dtype=torch.float32)
    bias[image_token_ids(hf)] = torch.finfo(torch.float32).min
    return {**state, "lm_head.bias": bias.to(head.dtype)}


def _not_written(cfg: ModelConfig) -> dict:
    raise UserError("model.qk_layernorm_per_head: Chameleon is imported only; no architecture redline writes has a "
                    "QK LayerNorm of its own per head")


FAMILY = Family(name="chameleon", architecture="ChameleonForConditionalGeneration", model_config=model_config,
                hf_config=_not_written, to_redline=to_redline, to_hf=lambda state, cfg: _not_written(cfg),
                ignorable=lambda name: name.startswith("model.vqmodel.") or llama._ignorable(name), fold=_fold)
