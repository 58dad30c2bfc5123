"""GLM-5.3-Next's text model (model_type "glm5_next_text", the text model of Glm5NextForConditionalGeneration
folders, model_type "glm5_next": multimodal.py), as transformers' models/glm5_next/modeling_glm5_next.py computes it:

- linear_attention layers: Kimi Delta Attention (kimi_linear.py's reading: redline's GatedDeltaNet with a decay per
  key channel and gates of rank linear_head_dim, model.delta_gate_rank). q, k and v (q/k/v_proj, linear_num_heads
  heads of linear_head_dim) through one concatenated causal convolution (conv1d, (3·H·D, 1, K)) and SiLU, q and k
  L2-normalized; β = sigmoid(b_proj); the decay bounded below by linear_lower_bound (Glm5NextTextForgetGate's safe
  gate: lower_bound·sigmoid(exp(A_log)·(f_b_proj(f_a_proj(x)) + dt_bias)), model.delta_decay=bounded), or, where
  linear_lower_bound is null, −exp(A_log)·softplus(·) (delta_decay=channel); the output RMS-normalized per head
  times sigmoid(g_b_proj(g_a_proj(x))), then o_proj;
- indexed_attention layers: DeepSeek's latent attention with a query latent and no RoPE (qk_rope_head_dim 0: kv_a
  gives the latent alone, kv_b each head's whole key and value; redline's NoPE latent layers, model.nope_interval 1),
  scaled by qk_nope_head_dim^-0.5. Its DSA indexer (on the indexer_types "full" layers; the "shared" ones reuse the
  last full layer's choice) scores pooled groups of index_kpool keys and keeps the index_topk / index_kpool best
  groups a query, plus, with index_kpool_always_select_tail, the incomplete group after the last whole one. A query
  that sees n keys sees n // index_kpool whole groups: while that is at most index_topk / index_kpool, that is
  while n < index_topk + index_kpool, the indexer keeps every key and the attention is the dense causal one. The
  import's context stops at index_topk + index_kpool - 1 and the indexers' weights are left out, said in one line on
  stderr (as DeepSeek-V3.2's: deepseek_kin.py);
- manifold-constrained hyper-connections around both sublayers (hc_mult streams, Sinkhorn-mixed: DeepSeek-V4's,
  model.mhc_streams; hc_attn_* / hc_ffn_* or attn_hc.* / ffn_hc.*: fn, base, scale), the streams' plain mean
  before the final norm (Glm5NextTextHyperHead: model.mhc_head_mean);
- every MLP (dense, shared expert and routed experts) a SwiGLU of clamped halves (gate above, up both sides, at
  swiglu_limit: mlp=swiglu_clipped, DeepSeek-V4's); dense on the first layers (mlp_layer_types), DeepSeek-V3's
  experts on the rest (sigmoid scores chosen with e_score_correction_bias within the topk_group best of n_group
  groups, rescaled where norm_topk_prob (plus 1e-20), times routed_scaling_factor, an ungated shared expert).

A folder of transformers' headless Glm5NextTextModel is refused by name (no logits to read). Import only: redline
keeps no DSA indexer to write back, and transformers has no text-only GLM-5.3-Next model with a head to load one
into (export_family refuses model.mhc_head_mean by name, for HF, GGUF and PEFT alike). Refused by name:
index_kpool_always_select_tail false with index_kpool above 1 (a query would never see the keys after its last whole
group, its own among them), qk_rope_head_dim above 0, attention_bias, other layer or MLP kinds, dense layers after
sparse ones, a linear_lower_bound of 0 or more, hc_sinkhorn_iters 0 (transformers still divides the mixing matrix by
its column sums once; redline's mhc_sinkhorn_iters 0 is HY-V4's streams without a matrix).
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, pad_rows, raise_first, take_head
from redline.interop.kimi_linear import _dense_layers, kda_to_redline
from redline.interop.llama import check_silu
from redline.model import ModelConfig

_DEFAULTS = dict(vocab_size=154880, hidden_size=4096, intermediate_size=12288, moe_intermediate_size=2048,
                 num_hidden_layers=45, num_attention_heads=64, n_shared_experts=1, n_routed_experts=288,
                 routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=0, v_head_dim=256,
                 qk_nope_head_dim=256, n_group=1, topk_group=1, num_experts_per_tok=8, norm_topk_prob=True,
                 hidden_act="silu", max_position_embeddings=1048576, rms_norm_eps=1e-5, tie_word_embeddings=False,
                 index_topk=2048, swiglu_limit=10.0, linear_head_dim=128, linear_num_heads=64,
                 linear_conv_kernel_dim=4, hc_mult=4, hc_eps=1e-6, hc_sinkhorn_iters=20, index_kpool=16,
                 index_kpool_always_select_tail=True)
"""Glm5NextTextConfig's defaults for the fields a config.json may leave out."""
_LOWER_BOUND = -5.0  # Glm5NextTextConfig's linear_lower_bound default (a null one is kept: the softplus decay)
_MLA = {"q_a": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b": "q_b_proj", "kv_a": "kv_a_proj_with_mqa",
        "kv_a_norm": "kv_a_layernorm", "kv_b": "kv_b_proj", "proj": "o_proj"}
"""redline's LatentAttention modules -> GLM-5.3-Next's (after self_attn.)."""
_KDA = {"attn.b": "b_proj", "attn.z_down": "g_a_proj", "attn.z": "g_b_proj", "attn.proj": "o_proj"}
_GATE = {"attn.a_down": "f_a_proj", "attn.a": "f_b_proj"}
"""The forget gate's projections: under self_attn. in the saved files, self_attn.forget_gate. in transformers'."""
_HC = {"attn_mhc": "attn_hc", "mlp_mhc": "ffn_hc"}
_INDEXER = ".self_attn.indexer."


def _settled(hf: dict) -> dict:
    """hf with Glm5NextTextConfig's defaults and its __post_init__'s readings: layer_types (KDA except every 4th
    layer; full_attention read as indexed_attention), mlp_layer_types (the first 3 dense), linear_attn_config's
    fields."""
    lower = hf.get("linear_lower_bound", _LOWER_BOUND)
    hf = {**_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    hf["linear_lower_bound"] = lower
    n = int(hf["num_hidden_layers"])
    if (linear := hf.get("linear_attn_config")) is not None:
        hf["linear_head_dim"] = linear.get("head_dim", hf["linear_head_dim"])
        hf["linear_num_heads"] = linear.get("num_heads", hf["linear_num_heads"])
        hf["linear_conv_kernel_dim"] = linear.get("short_conv_kernel_size", hf["linear_conv_kernel_dim"])
        hf["linear_lower_bound"] = linear.get("gate_lower_bound", hf["linear_lower_bound"])
        if linear.get("safe_gate", True) and hf["linear_lower_bound"] is None:
            hf["linear_lower_bound"] = _LOWER_BOUND
    kinds = hf.get("layer_types") or ["indexed_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
    hf["layer_types"] = ["indexed_attention" if k == "full_attention" else k for k in kinds]
    hf.setdefault("mlp_layer_types", ["dense"] * min(3, n) + ["sparse"] * max(n - 3, 0))
    return hf


def context_cap(hf: dict) -> int:
    """The longest context over which GLM-5.3-Next's pooled-group indexer keeps every key (module docstring)."""
    topk, pool = int(hf["index_topk"]), int(hf["index_kpool"])
    return topk + pool - 1 if hf["index_kpool_always_select_tail"] else topk


def model_config(hf: dict) -> ModelConfig:
    from redline.interop.deepseek import _expert_fields

    hf = _settled(hf)
    check_silu(hf)
    n, heads = int(hf["num_hidden_layers"]), int(hf["num_attention_heads"])
    kinds = hf["layer_types"]
    unknown = sorted(set(kinds) - {"linear_attention", "indexed_attention"})
    pool, topk = int(hf["index_kpool"]), int(hf["index_topk"])
    raise_first([
        ("Glm5NextTextModel" in (hf.get("architectures") or ()),
         "architectures ['Glm5NextTextModel']: transformers' GLM-5.3-Next text model alone has no head, so no logits "
         "to read; import the Glm5NextForConditionalGeneration folder (model_type glm5_next) or a text-only one"),
        (len(kinds) != n or bool(unknown), f"layer_types {unknown or kinds}: GLM-5.3-Next takes {n} entries, each "
                                           f"linear_attention or indexed_attention"),
        (int(hf["qk_rope_head_dim"]) > 0, f"qk_rope_head_dim={hf['qk_rope_head_dim']}: GLM-5.3-Next's latent "
                                          f"attention is without RoPE (transformers refuses it too)"),
        (bool(hf.get("attention_bias")), "attention_bias=true: GLM-5.3-Next's latent attention has no biases in "
                                         "redline"),
        ((hf.get("num_key_value_heads") or heads) != heads,
         f"num_key_value_heads={hf.get('num_key_value_heads')} with num_attention_heads={heads}: latent attention "
         f"expands its keys and values to every head (set them equal)"),
        (not hf.get("q_lora_rank"), "q_lora_rank null: GLM-5.3-Next's DSA layers take a query latent (transformers "
                                    "requires one)"),
        (pool < 1 or topk < pool or topk % pool, f"index_topk={topk}, index_kpool={pool}: the indexer keeps whole "
                                                 f"groups, index_topk a positive multiple of index_kpool"),
        (pool > 1 and not hf["index_kpool_always_select_tail"],
         f"index_kpool_always_select_tail=false with index_kpool={pool}: the indexer then never keeps the keys "
         f"after a query's last whole group of {pool} (its own among them), which no dense attention is; redline "
         f"reads GLM-5.3-Next with the tail kept"),
        (float(hf["swiglu_limit"]) <= 0, f"swiglu_limit={hf['swiglu_limit']}: GLM-5.3-Next clamps its SwiGLU "
                                         f"halves at a limit above 0"),
        (hf["linear_lower_bound"] is not None and float(hf["linear_lower_bound"]) >= 0,
         f"linear_lower_bound={hf['linear_lower_bound']}: the KDA decay's bound is a least log decay, below 0 "
         f"(GLM-5.3-Next's -5), or null for the softplus decay"),
        (int(hf["hc_mult"]) < 1 or int(hf["hc_sinkhorn_iters"]) < 1,
         f"hc_mult={hf['hc_mult']}, hc_sinkhorn_iters={hf['hc_sinkhorn_iters']}: GLM-5.3-Next's hyper-connections "
         f"take one stream or more and a Sinkhorn-mixed matrix (one step or more)"),
    ])
    nope, v = int(hf["qk_nope_head_dim"]), int(hf.get("v_head_dim") or hf["qk_nope_head_dim"])
    if v > nope:
        raise UserError(f"v_head_dim={v} wider than qk_nope_head_dim={nope}: redline's latent attention pads values "
                        f"up to the q/k head width, not keys up to the values'")
    experts = {"num_hidden_layers": n, "first_k_dense_replace": _dense_layers(hf),
               **{k: hf[k] for k in ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "n_group",
                                     "topk_group", "norm_topk_prob", "routed_scaling_factor",
                                     "moe_intermediate_size", "intermediate_size")}}
    width, lower = int(hf["linear_head_dim"]), hf["linear_lower_bound"]
    linear = tuple(i for i, k in enumerate(kinds) if k == "linear_attention")
    return ModelConfig(
        vocab_size=int(hf["vocab_size"]), context_len=min(int(hf["max_position_embeddings"]), context_cap(hf)),
        n_layer=n, n_embd=int(hf["hidden_size"]), n_head=heads, n_kv_head=heads, head_size=nope,
        kv_lora_rank=int(hf["kv_lora_rank"]), q_lora_rank=int(hf["q_lora_rank"]), v_head_dim=v if v != nope else 0,
        pos_emb="rope", nope_interval=1,  # every latent layer without RoPE (kv_a the latent alone)
        fused_qkv=False, mlp="swiglu_clipped", swiglu_limit=float(hf["swiglu_limit"]), fused_mlp=True,
        norm="rmsnorm", norm_eps=float(hf["rms_norm_eps"]), tie_embeddings=bool(hf["tie_word_embeddings"]),
        bias=False,
        **(dict(delta_layers=linear, delta_heads=int(hf["linear_num_heads"]),
                delta_key_heads=int(hf["linear_num_heads"]), delta_key_dim=width, delta_value_dim=width,
                delta_gate_rank=width, delta_decay="channel" if lower is None else "bounded",
                delta_decay_floor=0.0 if lower is None else float(lower),
                delta_conv_kernel=int(hf["linear_conv_kernel_dim"])) if linear else {}),
        mhc_streams=int(hf["hc_mult"]), mhc_sinkhorn_iters=int(hf["hc_sinkhorn_iters"]),
        mhc_eps=float(hf["hc_eps"]), mhc_head_mean=True, latent_norm_eps=float(hf["rms_norm_eps"]),
        **_expert_fields(experts, "deepseek_v3"))  # DeepSeek-V3's router (Glm5NextTextTopkRouter)


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    """The text model's tensors under the text-only names (multimodal.text_view's model.*, lm_head.weight); the
    indexers marked read, left out (module docstring)."""
    from redline.interop.moe import deepseek_experts_to_redline

    out = {"norm_f.weight": src.take("model.norm.weight"),
           "wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        for ours, theirs in _HC.items():
            for part in ("fn", "base", "scale"):  # the saved files' hc_attn_fn, transformers' attn_hc.fn
                saved, module = f"{p}hc_{theirs.split('_')[0]}_{part}", f"{p}{theirs}.{part}"
                out[f"{r}{ours}.{part}"] = src.take(saved if saved in src else module)
        a = p + "self_attn."
        if i in cfg.delta_layers:
            out.update(kda_to_redline(src, a, r, _KDA, _GATE, gate_prefix="forget_gate."))
        else:
            for ours, theirs in _MLA.items():
                out[f"{r}attn.{ours}.weight"] = src.take(f"{a}{theirs}.weight")
        if cfg.layer_has_experts(i):
            out.update(deepseek_experts_to_redline(src, p, r, cfg))
        else:
            out[r + "mlp.fc.weight"] = torch.cat([src.take(p + "mlp.gate_proj.weight"),
                                                  src.take(p + "mlp.up_proj.weight")])
            out[r + "mlp.proj.weight"] = src.take(p + "mlp.down_proj.weight")
    indexer = sorted(name for name in src.names if _INDEXER in name)
    src.used.update(indexer)  # read by name, not loaded: redline attends densely (module docstring)
    if indexer:
        print(f"{src.where}: the sparse attention's indexer ({len(indexer)} tensors) is left out: within "
              f"{cfg.context_len} tokens (the context, at most index_topk + index_kpool - 1) it keeps every key, so "
              f"redline runs the dense latent attention that equals it", file=sys.stderr)
    return out


def _no_export(cfg: ModelConfig) -> dict:
    raise UserError("GLM-5.3-Next is import only: redline keeps no DSA indexer, and transformers has no text-only "
                    "GLM-5.3-Next model with a head to load one into")


def _ignorable(name: str) -> bool:
    """The multi-token-prediction layer past the last (layers.45.) and its shared_head, which transformers ignores
    on load (Glm5NextPreTrainedModel._keys_to_ignore_on_load_unexpected)."""
    return ".shared_head." in name or ".layers.45." in name


FAMILY = Family(name="glm5_next_text", architecture="Glm5NextForConditionalGeneration", model_config=model_config,
                hf_config=_no_export, to_redline=to_redline, to_hf=_no_export, ignorable=_ignorable)
"""GLM-5.3-Next's text model: import only."""

