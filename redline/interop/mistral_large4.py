"""Mistral Large 4's text model (model_type "mistral_large4_text", transformers' models/mistral_large4), read from
its multimodal folders (MistralLarge4ForConditionalGeneration, "mistral_large4": multimodal.py, a Pixtral tower
left out): Mistral 4's latent attention and grouped softmax experts (deepseek_kin.py) with

- no Q-LoRA: one q_proj (C -> H·(qk_nope_head_dim + qk_rope_head_dim)), redline's q (model.q_lora_rank 0);
- layers without RoPE where no_rope_layers holds 0 (by default every fourth: no_rope_layer_interval 4): their kv_a
  gives the latent alone and kv_b each head's whole key, qk_nope_head_dim + qk_rope_head_dim wide (redline's latent
  NoPE layers, model.nope_interval where the pattern is one in N, else model.rope_layer_theta with 0 on them);
- the queries of every layer scaled per head by scale · ln(p + 1) + bias after RoPE (softmax_scaling.scale, .bias:
  model.q_position_scale);
- RoPE's frequencies times exp(alpha), rotary_emb.alpha learned once for the model (LeRoPE): read into the config
  as model.rope_pair_log_scales (a constant in redline, not trained), the rotated rows interleaved as DeepSeek's;
- KV caches shared across layers: a layer whose kv_source_layers entry names an earlier layer has no
  kv_a_proj_with_mqa or kv_a_layernorm and reads that layer's normalized latent and rotated key part
  (model.kv_source_layers; transformers reads the last earlier layer that shares its cache and rotates as it does,
  which is the named one in a config transformers accepts, else the import refuses it by name);
- DeepSeek Sparse Attention: a lightning indexer on the "full" layers (indexer_types; "shared" ones reuse the last
  full layer's choice) keeps the index_topk best keys of each query. Over at most index_topk keys it keeps every one,
  and the attention is the dense latent attention (transformers' mask then masks nothing): the import's context stops
  at index_topk and the indexers' weights are left out, said in one line (as DeepSeek-V3.2's: deepseek_kin.py);
- the kv_a_layernorm at rms_norm_eps (model.latent_norm_eps), the logits soft-capped at final_logit_softcapping
  (model.logit_softcap), the router Mistral 4's with its top-k weights always rescaled.

Import only: transformers has no text-only Mistral Large 4 model with a head (MistralLarge4ForConditionalGeneration
holds the vision tower, and the indexers, which redline does not keep), so families.export_family refuses these
options by name. The multi-token-prediction head (mtp_dspark.*), which transformers ignores too, is left out.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from redline.errors import UserError
from redline.interop import deepseek
from redline.interop.deepseek_kin import leave_out_indexer
from redline.interop.families import Family, TensorSource, pad_rows, raise_first, take_head
from redline.model import ModelConfig

_DEFAULTS = dict(vocab_size=204800, hidden_size=6144, intermediate_size=24576, moe_intermediate_size=6144,
                 num_hidden_layers=72, num_attention_heads=64, n_shared_experts=1, n_routed_experts=128,
                 routed_scaling_factor=1.0, kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128,
                 qk_nope_head_dim=64, n_group=1, topk_group=1, num_experts_per_tok=4, max_position_embeddings=1048576,
                 rms_norm_eps=1e-5, tie_word_embeddings=False, index_topk=2048, first_k_dense_replace=1,
                 final_logit_softcapping=30.0)
"""MistralLarge4TextConfig's defaults for the fields a config.json may leave out."""
_ROPE_DEFAULT = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2048.0, "original_max_position_embeddings": 512,
                 "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.0}
"""MistralLarge4TextConfig's rope_parameters where none are given."""
_LOG_SCALES = "rope_pair_log_scales"
"""The text config's key under which settle_text puts rotary_emb.alpha (a list of floats)."""


def no_rope_layers(hf: dict) -> list[int]:
    """1 for each layer that rotates, 0 for one without RoPE: no_rope_layers, else every no_rope_layer_interval-th
    layer (4 by default) without, as MistralLarge4TextConfig derives it."""
    n = hf["num_hidden_layers"]
    given = hf.get("no_rope_layers")
    if given is None:
        every = int(hf.get("no_rope_layer_interval") or 4)
        return [int((i + 1) % every != 0) for i in range(n)]
    if len(given) < n:
        raise UserError(f"no_rope_layers has {len(given)} entries for {n} layers")
    return [int(bool(r)) for r in given[:n]]


def kv_sources(hf: dict, rotates: list[int]) -> tuple[int, ...]:
    """Each layer's cache source, as transformers' MistralLarge4TextAttention reads it: its own where
    kv_source_layers names itself; else the last earlier layer that stores its cache for others (one that a later
    entry names) and rotates as it does (KVSharingDict's "rope" or "nope" slot). A UserError where that is not the
    named layer, or there is none."""
    n = hf["num_hidden_layers"]
    named = list(hf.get("kv_source_layers") or range(n))
    if len(named) != n or any(not 0 <= j <= i or named[j] != j for i, j in enumerate(named)):
        raise UserError(f"kv_source_layers={named}: each layer reads its own cache or that of an earlier layer that "
                        f"reads its own ({n} layers)")
    stores = {j for i, j in enumerate(named) if j != i}
    out = []
    for i, j in enumerate(named):
        if j == i:
            out.append(i)
            continue
        read = max((s for s in stores if s < i and rotates[s] == rotates[i]), default=None)
        if read != j:
            raise UserError(f"kv_source_layers[{i}]={j}: transformers' Mistral Large 4 reads the last earlier "
                            f"shared cache of a layer that rotates as layer {i} does ({read}), not the one named")
        out.append(j)
    return tuple(out)


def model_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    raise_first([(hf.get("q_lora_rank"), f"q_lora_rank={hf.get('q_lora_rank')} on mistral_large4_text: its "
                                         f"queries come from one q_proj")])
    n = hf["num_hidden_layers"]
    if not hf.get("mlp_layer_types"):  # the first first_k_dense_replace layers dense, as the config derives them
        dense = min(int(hf["first_k_dense_replace"]), n)
        hf["mlp_layer_types"] = ["dense"] * dense + ["sparse"] * (n - dense)
    hf.setdefault("rope_parameters", None)
    if hf["rope_parameters"] is None:
        hf["rope_parameters"] = dict(_ROPE_DEFAULT)
    plain = deepseek.lite_as_deepseek_v3({**hf, "rope_interleave": True, "q_lora_rank": None,
                                          "norm_topk_prob": True}, defaults={})
    cfg = deepseek.model_config_for("deepseek_v3")(plain)
    if cfg.moe_experts:  # Mistral 4's router: softmax scores, no routing bias (deepseek_kin.mistral4_model_config)
        cfg = dataclasses.replace(cfg, moe_gating="softmax", moe_expert_bias=False,
                                  moe_norm_eps=ModelConfig.moe_norm_eps)
    topk = int(hf["index_topk"])
    if topk < 1:
        raise UserError(f"index_topk={topk} on mistral_large4_text: the indexer keeps at least one key a query")
    rotates = no_rope_layers(hf)
    rope: dict = {}
    if not all(rotates):
        every = next((k for k in range(2, n + 1) if rotates == [int((i + 1) % k != 0) for i in range(n)]), 0)
        rope = (dict(nope_interval=every) if every
                else dict(rope_layer_theta=tuple(cfg.rope_theta if r else 0.0 for r in rotates)))
    sources = kv_sources(hf, rotates)
    scales = tuple(float(a) for a in hf.get(_LOG_SCALES) or ())
    return dataclasses.replace(
        cfg, **rope, context_len=min(cfg.context_len, topk), q_position_scale=True,
        kv_source_layers=sources if any(j != i for i, j in enumerate(sources)) else (),
        rope_pair_log_scales=scales if any(scales) else (), latent_norm_eps=float(hf["rms_norm_eps"]),
        logit_softcap=float(hf.get("final_logit_softcapping") or 0.0))


def settle_text(text: dict, src: TensorSource) -> dict:
    """The text config with the learned RoPE frequencies' log scales (rotary_emb.alpha, (qk_rope_head_dim / 2,)
    fp32) under rope_pair_log_scales, which model_config reads."""
    names = [n for n in src.names if n.endswith("rotary_emb.alpha") or n == "lerope.alpha"]
    if not names:
        return text
    return {**text, _LOG_SCALES: src.take(names[0]).float().tolist()}


_NATIVE = ((r"^tok_embeddings\.", "model.embed_tokens."), (r"^norm\.", "model.norm."), (r"^output\.", "lm_head."),
           (r"^lerope\.alpha$", "model.rotary_emb.alpha"), (r"^layers\.", "model.layers."),
           (r"\.attention\.", ".self_attn."), (r"\.wq\.", ".q_proj."),
           (r"\.wkv_a_with_mqa\.", ".kv_a_proj_with_mqa."), (r"\.wkv_b\.", ".kv_b_proj."), (r"\.wo\.", ".o_proj."),
           (r"\.kv_a_norm\.", ".kv_a_layernorm."), (r"\.attention_norm\.", ".input_layernorm."),
           (r"\.ffn_norm\.", ".post_attention_layernorm."), (r"\.ssmax_scaling\.s$", ".softmax_scaling.scale"),
           (r"\.ssmax_scaling\.b$", ".softmax_scaling.bias"), (r"\.feed_forward\.", ".mlp."),
           (r"\.(gate|experts|shared_experts)\.", r".mlp.\1."), (r"\.w1\.", ".gate_proj."), (r"\.w2\.", ".down_proj."),
           (r"\.w3\.", ".up_proj."))
"""Mistral's own tensor names (consolidated checkpoints; what transformers' save_pretrained writes for
mistral_large4, its conversion mapping reversed) -> transformers' text model's, applied in turn: the experts one
tensor each (experts.E.w1/w2/w3), which moe.py reads as Qwen-MoE's."""
_NATIVE_TOWER = ("vision_encoder.", "patch_merger.", "pre_mm_projector_norm.", "vision_language_adapter.")
"""The Pixtral tower and projector under Mistral's own names, which text does not run."""


def view(src: TensorSource, cfg: ModelConfig) -> TensorSource:
    """The text model's tensors under transformers' text names: from Mistral's own names (_NATIVE) where the folder
    has them, else as multimodal.text_view renames transformers' (model.language_model.*). The indexers' tensors
    are marked read in src (to_redline leaves them out)."""
    from redline.interop.multimodal import text_view

    if "tok_embeddings.weight" not in src:
        text = text_view(src)
        src.used.update(n for n in src.names if ".indexer." in n)
        return text
    names = {}
    for raw in src.names:
        if raw.startswith(_NATIVE_TOWER) or raw.startswith("mtp_dspark."):
            continue
        name = raw
        for pattern, repl in _NATIVE:
            name = re.sub(pattern, repl, name)
        names[name] = raw
        if ".indexer." in raw:
            src.used.add(raw)
    return TensorSource(names, lambda name: src.take(names[name]), src.where)


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"norm_f.weight": src.take("model.norm.weight"),
           "wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        a = p + "self_attn."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        own = ("kv_a", "kv_a_norm") if cfg.kv_source(i) is None else ()
        for ours in ("q", *own, "kv_b", "proj"):
            out[f"{r}attn.{ours}.weight"] = src.take(f"{a}{deepseek._ATTN[ours]}.weight")
        out[r + "attn.q_pos_scale"] = src.take(a + "softmax_scaling.scale")
        out[r + "attn.q_pos_bias"] = src.take(a + "softmax_scaling.bias")
        out.update(deepseek._mlp_to_redline(src, p, r, cfg, cfg.layer_has_experts(i)))
    leave_out_indexer(src, cfg)
    return out


def fold(hf: dict, cfg: ModelConfig, state: dict) -> dict:
    """The rotating layers' rotated rows of q and (where the layer has its own) kv_a from the interleaved pair order
    (apply_rotary_pos_emb_interleave's) into redline's halves."""
    out = dict(state)
    for i in range(cfg.n_layer):
        if not cfg.layer_rope(i):
            continue
        r = f"blocks.{i}.attn."
        out[r + "q.weight"] = deepseek.q_rope_rows(out[r + "q.weight"], cfg, inverse=True)
        if r + "kv_a.weight" in out:
            out[r + "kv_a.weight"] = deepseek.kv_rope_rows(out[r + "kv_a.weight"], cfg, inverse=True)
    return out


def _no_export(cfg: ModelConfig) -> dict:
    raise UserError("Mistral Large 4 is import only: transformers has no text-only Mistral Large 4 model to load")


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq") or name.startswith(("mtp_dspark.", *_NATIVE_TOWER))


def wants_mistral_large4(cfg: ModelConfig) -> bool:
    """The options Mistral Large 4 alone has among the architectures redline reads: its queries' position scale,
    caches shared between latent layers, learned RoPE frequencies, latent layers without RoPE."""
    return bool(cfg.q_position_scale or cfg.kv_source_layers or cfg.rope_pair_log_scales
                or cfg.kv_lora_rank and (cfg.nope_interval or cfg.rope_layer_theta))


FAMILY = Family(name="mistral_large4_text", architecture="MistralLarge4ForConditionalGeneration",
                model_config=model_config, hf_config=_no_export, to_redline=to_redline, to_hf=_no_export,
                ignorable=_ignorable, fold=fold)
"""Mistral Large 4's text model: import only (export_family refuses its options by name)."""
