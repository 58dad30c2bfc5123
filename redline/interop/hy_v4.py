"""HY-V4 (HYV4ForCausalLM, model_type "hy_v4": Hy4-preview; transformers' models/hy_v4): DeepSeek-V3's blocks
(deepseek.py's reading: latent attention with a q latent, RoPE on qk_rope_head_dim in (first half, second half)
pairs, dense first layers from mlp_layer_types, DeepSeek-V3's sigmoid router with e_score_correction_bias, an
ungated shared expert, stacked experts) with

- independent hyper-connections (iHC, HYV4HyperConnection): hc_mult residual streams, each sublayer reading their
  sum under pre = sigmoid(·) + hc_eps and its output joining stream i times post_i = hc_magnitude · sigmoid(·) +
  hc_eps, the streams otherwise left as they are (DeepSeek-V4's mHC without its Sinkhorn-mixed matrix:
  model.mhc_streams with mhc_sinkhorn_iters 0, mhc_post_scale = hc_magnitude); hc_head sums them before the final
  norm (redline's mhc_head);
- a sigmoid gate on each value of each head's output from the attention's input (gate_proj: attn_gate=element, in
  the model's dtype as HYV4Attention computes it) and a learned sink logit a head (sinks: attn_sinks);
- the routed experts' SwiGLU clamped at swiglu_limit (gate above, up both sides: model.moe_swiglu_limit; 0 or less
  none), the dense and shared MLPs unclamped;
- DeepSeek Sparse Attention: the lightning indexer on the "full" layers (indexer_types; the "shared" ones reuse the
  last full layer's choice) keeps the index_topk best keys of each query; over at most index_topk keys it keeps them
  all and the attention is the dense one (its mask then masks nothing): the import's context stops at index_topk,
  the indexers' weights left out, said in one line (as DeepSeek-V3.2's: deepseek_kin.py);
- the head in fp32 (HYV4ForCausalLM's lm_head), as redline's fp32 import computes it.

HY-V4-VL's text model (hy_v4_vl_text, the text model of HYV4VLForConditionalGeneration folders: VL_TEXT_FAMILY) is
HY-V4's with RoPE on interleaved pairs and its latents' norms at rms_norm_eps.

Import only: transformers' HY-V4 holds the indexers, which redline does not keep, and no architecture redline
exports to has mhc_streams (families.export_family refuses it by name). The multi-token-prediction layers
(model.mtp_layers.*), which transformers ignores too, are left out.
"""

from __future__ import annotations

import dataclasses
import re

from redline.errors import UserError
from redline.interop import deepseek
from redline.interop.deepseek_kin import leave_out_indexer
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig

_DEFAULTS = dict(vocab_size=120832, hidden_size=2816, intermediate_size=6912, moe_intermediate_size=768,
                 num_hidden_layers=34, num_attention_heads=32, rms_norm_eps=1e-5, tie_word_embeddings=False,
                 n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, routed_scaling_factor=2.827,
                 norm_topk_prob=True, n_group=1, topk_group=1, q_lora_rank=1536, kv_lora_rank=512,
                 qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256, max_position_embeddings=262144,
                 index_topk=2048, hc_mult=4, hc_magnitude=2.0, hc_eps=1e-6, swiglu_limit=10.0)
"""HYV4Config's defaults for the fields a config.json may leave out."""
_HUB = ((r"\.hc_pre\.hc_", ".hc_"), (r"\.learnable_sink_param$", ".sinks"), (r"\.linear_gate\.", ".gate_proj."),
        (r"\.hc_attn_layer\.hc_(fn|base|scale)$", r".attn_hc.\1"),
        (r"\.hc_mlp_layer\.hc_(fn|base|scale)$", r".ffn_hc.\1"),
        (r"\.hc_head_(fn|base|scale)$", r".hc_\1"))
"""The Hub's tensor names (what transformers' save_pretrained writes for hy_v4, its conversion mapping reversed)
-> transformers' module names, applied in turn; transformers' own names pass unchanged."""


def _module_names(src: TensorSource) -> TensorSource:
    """src under transformers' module names (_HUB), reading (and marking read) the tensors it holds."""
    names = {}
    for raw in src.names:
        name = raw
        for pattern, repl in _HUB:
            name = re.sub(pattern, repl, name)
        names[name] = raw
    return TensorSource(names, lambda name: src.take(names[name]), src.where)


def model_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    n = hf["num_hidden_layers"]
    if not hf.get("mlp_layer_types"):  # HYV4Config's: the first layer dense, the others sparse
        hf["mlp_layer_types"] = ["dense"] * min(1, n) + ["sparse"] * max(n - 1, 0)
    raise_first([(int(hf["hc_mult"]) < 1, f"hc_mult={hf['hc_mult']} on hy_v4: iHC keeps one stream or more"),
                 (int(hf["index_topk"]) < 1, f"index_topk={hf['index_topk']} on hy_v4: the indexer keeps at least "
                                             f"one key a query"),
                 (float(hf["hc_magnitude"]) <= 0, f"hc_magnitude={hf['hc_magnitude']} on hy_v4: iHC's post gate "
                                                  f"scale is above 0 in redline (model.mhc_post_scale)")])
    # DeepSeek-V3's reading of the dense-then-sparse layers; RoPE in (first half, second half) pairs
    plain = deepseek.lite_as_deepseek_v3({**hf, "rope_interleave": False}, defaults={})
    cfg = deepseek.model_config_for("deepseek_v3")(plain)
    limit = float(hf["swiglu_limit"])
    return dataclasses.replace(
        cfg, context_len=min(cfg.context_len, int(hf["index_topk"])), mhc_streams=int(hf["hc_mult"]),
        mhc_sinkhorn_iters=0, mhc_post_scale=float(hf["hc_magnitude"]), mhc_eps=float(hf["hc_eps"]),
        attn_gate="element", attn_sinks=True, moe_swiglu_limit=limit if limit > 0 and cfg.moe_experts else 0.0)


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    """DeepSeek-V3's tensors (deepseek.to_redline), then each layer's gate_proj, sinks and two hyper-connections
    (attn_hc, ffn_hc: fn, base, scale) and the head's (hc_head: hc_fn, hc_base, hc_scale); the indexers marked read,
    left out."""
    raw, src = src, _module_names(src)
    out = deepseek.to_redline(src, cfg)
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[r + "attn.gate.weight"] = src.take(p + "self_attn.gate_proj.weight")
        out[r + "attn.sinks"] = src.take(p + "self_attn.sinks")
        for theirs, ours in (("attn_hc", "attn_mhc"), ("ffn_hc", "mlp_mhc")):
            for name in ("fn", "base", "scale"):
                out[f"{r}{ours}.{name}"] = src.take(f"{p}{theirs}.{name}")
    for name in ("fn", "base", "scale"):
        out[f"mhc_head.{name}"] = src.take(f"model.hc_head.hc_{name}")
    leave_out_indexer(raw, cfg)
    return out


def _no_export(cfg: ModelConfig) -> dict:
    raise UserError("HY-V4 is import only: redline keeps no DSA indexer for transformers' HYV4ForCausalLM")


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq") or name.startswith("model.mtp_layers.")  # as the Hub names them


FAMILY = Family(name="hy_v4", architecture="HYV4ForCausalLM", model_config=model_config, hf_config=_no_export,
                to_redline=to_redline, to_hf=_no_export, ignorable=_ignorable)
"""HY-V4: import only (export_family refuses mhc_streams by name)."""
def vl_text_model_config(hf: dict) -> ModelConfig:
    """HY-V4's reading, the q and kv latents' norms at rms_norm_eps (HYV4VLAttention's; HY-V4's take 1e-6)."""
    cfg = model_config(hf)
    return dataclasses.replace(cfg, latent_norm_eps=cfg.norm_eps)


VL_TEXT_FAMILY = dataclasses.replace(FAMILY, name="hy_v4_vl_text", model_config=vl_text_model_config,
                                     fold=deepseek.fold_for("deepseek_v3"))
"""HY-V4-VL's text model (HYV4VLTextModel, read from its multimodal folders: multimodal.py): HY-V4's with its latents'
norms at rms_norm_eps and RoPE on interleaved pairs (HYV4VL's apply_rotary_pos_emb: each pair's cos and sin repeated,
the interleaved rotate_half), so the rotated rows of q_b and kv_a are put in redline's halves as DeepSeek-V3's are;
its multimodal RoPE (mrope_section of the time, height and width positions) is plain RoPE on text alone, where the
three are the token's one position. Import only."""
