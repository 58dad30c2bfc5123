"""DeepSeek-V4 (DeepseekV4ForCausalLM, model_type "deepseek_v4"):

- manifold-constrained hyper-connections around every sublayer (hc_mult streams: model.mhc_streams; hc_attn_*,
  hc_ffn_*, hc_head_* -> ManifoldHyperConnection's and ManifoldHyperHead's fn, base, scale);
- its attention (model.shared_kv_attention, SharedKVAttention in redline/model.py): wq_a, q_norm (the query latent's
  RMSNorm), wq_b; one key head wkv with its RMSNorm `norm` that is the value too; a sink per head (attn_sink:
  model.attn_sinks); the grouped output projection wo_a (o_groups blocks of o_lora_rank rows) and wo_b; every layer
  within sliding_window tokens. DeepSeek-V4 turns the last qk_rope_head_dim channels of a head as interleaved pairs;
  the import moves them first, in redline's halves (_rope_order), in wq_b's and wkv's rows, norm's weights and each
  head's columns of wo_a (and a compressor's rows, bias columns and norm), and the export moves them back;
- its compressed layers (layer_types, or the legacy compress_ratios 0 / 4 / 128), model.kv_compress_rates: beside the
  window, a key pooled from each whole window of m tokens (attn.compressor.wkv, wgate, ape, norm -> comp_kv,
  comp_gate, comp_bias, comp_norm), m = compress_rates' rate of the layer's kind; the compressed sparse attention
  layers' windows overlap (two series: model.kv_compress_overlap), and its lightning indexer picks index_topk of
  those keys a query. A query at position p sees (p + 1) // m of them, all of which the indexer keeps while that is
  at most index_topk: the import stops the context at (index_topk + 1)·m - 1 and attends to every compressed key,
  the indexer's tensors left out (said in one line on stderr), as deepseek_kin.py does for DeepSeek-V3.2's; the
  export writes an indexer of zeros that keeps every key of the context (index_topk = context // m). The compressed
  layers turn by compress_rope_theta, with YaRN where the config gives it (on those layers alone: the sliding layers'
  base is model.rope_unscaled_theta);
- experts on every layer (n_routed_experts, a shared expert as wide: model.moe_shared_hidden, ungated), SwiGLU with
  both halves clamped at swiglu_limit (mlp=swiglu_clipped), scored by scoring_func (sqrtsoftplus or sigmoid:
  model.moe_gating), chosen with the routing bias (ffn.gate.bias, e_score_correction_bias:
  moe_expert_bias), the chosen scores always rescaled to sum to 1 (plus 1e-20: moe_norm_eps) and times
  routed_scaling_factor; the mlp_layer_types "hash_moe" layers choose each token's experts from the stored table
  ffn.gate.tid2eid (model.moe_hash_layers), their scores still weighting them.

The names are those of DeepSeek's checkpoints, as transformers saves them too (its conversion mapping renames them
on load): embed / embed_tokens, layers.N.attn.*, layers.N.ffn.experts.J.w1 (gate), w3 (up), w2 (down), head; with
or without transformers' "model." prefix. The multi-token-prediction layers (mtp.*) are not part of the model and
are skipped, as transformers skips them.

Refused by name: quantized checkpoints (quantization_config); a main RoPE other than the default one, a compressed
one other than default or YaRN (or YaRN with compress_rope_theta equal to rope_theta beside sliding layers: one
table a base); mlp_bias; a hidden_act other than SiLU; attention dropout; scoring_func "softmax", which the config
names but transformers' DeepseekV4TopKRouter cannot build (ACT2FN has no softmax), so no reference computes it.
Semantics read from transformers' models/deepseek_v4 (modeling_deepseek_v4.py, configuration_deepseek_v4.py, and
its conversion_mapping.py entry for the names).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first
from redline.interop.llama import rope_scaling, yarn_parameters
from redline.model import ModelConfig

ARCHITECTURE = "DeepseekV4ForCausalLM"
_DEFAULTS = dict(vocab_size=129280, hidden_size=4096, moe_intermediate_size=2048, num_hidden_layers=43,
                 num_attention_heads=64, head_dim=512, q_lora_rank=1024, num_experts_per_tok=6, n_routed_experts=256,
                 scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, max_position_embeddings=1048576,
                 rope_theta=10000.0, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=10.0,
                 sliding_window=128, o_groups=8, o_lora_rank=1024, rms_norm_eps=1e-6, hidden_act="silu",
                 tie_word_embeddings=False,
                 compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128})
"""DeepseekV4Config's defaults for the fields a config.json may leave out."""
_NORM_EPS = 1e-20  # DeepseekV4TopKRouter's and DeepseekV4HashRouter's term on the chosen scores' sum
_SCORING = ("sqrtsoftplus", "sigmoid")  # transformers' ACT2FN has no "softmax", so its DeepSeek-V4 builds none
_HC = {"attn_mhc": "hc_attn", "mlp_mhc": "hc_ffn"}
"""redline's hyper-connections -> their names' stem in a layer (hc_attn_fn, hc_attn_base, hc_attn_scale)."""


_CSA, _HCA, _SLIDING = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
_RATIO_KINDS = {0: _SLIDING, 4: _CSA, 128: _HCA}  # DeepseekV4Config's reading of the legacy compress_ratios


def _layer_kinds(hf: dict) -> tuple[list[str], list[str]]:
    """(layer_types, mlp_layer_types) as DeepseekV4Config settles them, legacy fields included."""
    n = int(hf["num_hidden_layers"])
    kinds = hf.get("layer_types")
    if kinds is None and hf.get("compress_ratios") is not None:  # legacy per-layer ratios
        kinds = [_RATIO_KINDS.get(r, f"compress_ratios {r}") for r in hf["compress_ratios"]]
    if kinds is None:  # V4-Pro's default: two heavily compressed layers, then the two kinds in turn
        kinds = [_HCA] * min(n, 2) + [_CSA if i % 2 else _HCA for i in range(max(n - 2, 0))]
    mlp = hf.get("mlp_layer_types")
    if mlp is None:
        hashed = hf.get("num_hash_layers", 3)
        mlp = ["hash_moe"] * min(n, hashed) + ["moe"] * max(0, n - hashed)
    return list(kinds[:n]), list(mlp[:n])


def _rope_dims(hf: dict) -> int:
    """qk_rope_head_dim: head_dim times partial_rotary_factor (DeepseekV4Config's default 64 / 512)."""
    if hf.get("qk_rope_head_dim"):
        return int(hf["qk_rope_head_dim"])
    factor = hf.get("partial_rotary_factor") or ((hf.get("rope_parameters") or {}).get("main") or {}).get(
        "partial_rotary_factor") or 64 / 512
    return int(int(hf["head_dim"]) * factor)


def _rope_parts(hf: dict) -> tuple[dict, dict]:
    """The main and compress RoPE parameters as DeepseekV4Config nests them (rope_parameters main / compress, or a
    flat rope_parameters that the compress one takes with compress_rope_theta)."""
    rp = hf.get("rope_parameters") or {}
    if isinstance(rp.get("main"), dict) and isinstance(rp.get("compress"), dict):
        return rp["main"], rp["compress"]
    flat = {k: v for k, v in rp.items() if k not in ("main", "compress")}
    if not flat and hf.get("rope_scaling"):  # DeepSeek's own config.json: YaRN in rope_scaling
        flat = dict(hf["rope_scaling"])
    if "type" in flat:
        flat["rope_type"] = flat.pop("type")
    compress = {**flat, "rope_theta": hf["compress_rope_theta"]}
    if compress.get("rope_type") == "yarn":  # DeepseekV4Config's: no YaRN scale on the tables
        compress.setdefault("attention_factor", 1.0)
    return {"rope_theta": hf["rope_theta"]}, compress


def _rates(hf: dict) -> dict:
    rates = {**_DEFAULTS["compress_rates"], **(hf.get("compress_rates") or {})}
    for kind, legacy in ((_CSA, "compress_rate_csa"), (_HCA, "compress_rate_hca")):
        if hf.get(legacy) is not None:
            rates[kind] = hf[legacy]
    return rates


def model_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    kinds, mlp_kinds = _layer_kinds(hf)
    n = int(hf["num_hidden_layers"])
    main, compress = _rope_parts(hf)
    rates = _rates(hf)
    compressed = [k for k in kinds if k != _SLIDING]
    yarn = bool(compressed) and compress.get("rope_type") == "yarn"
    unknown = sorted({k for k in kinds if k not in (_SLIDING, _CSA, _HCA)})
    raise_first([
        (bool(unknown), f"layer_types {unknown}: DeepSeek-V4's layers are {_SLIDING}, {_CSA} or {_HCA}"),
        (bool(compressed) and compress.get("rope_type", "default") not in ("default", "yarn"),
         f"rope_parameters.compress.rope_type={compress.get('rope_type')!r}: redline turns DeepSeek-V4's compressed "
         f"layers by the plain RoPE or YaRN"),
        (yarn and _SLIDING in kinds and float(compress["rope_theta"]) == float(main.get("rope_theta", 0.0)),
         f"compress_rope_theta={compress['rope_theta']} equal to rope_theta with YaRN on the compressed layers alone: "
         f"redline holds one RoPE table a base"),
        (any(int(rates[k]) < 1 for k in set(compressed) - set(unknown)),
         f"compress_rates={rates}: a rate of 1 or more a kind"),
        (len(kinds) != n or len(mlp_kinds) != n or any(k not in ("hash_moe", "moe") for k in mlp_kinds),
         f"mlp_layer_types={mlp_kinds}: one of hash_moe or moe for each of the {n} layers"),
        (hf["scoring_func"] not in _SCORING, f"scoring_func={hf['scoring_func']!r}: transformers' DeepSeek-V4 "
                                             f"scores its experts by {' or '.join(_SCORING)} alone (ACT2FN), and so "
                                             f"does redline's"),
        (hf["hidden_act"] not in ("silu", "swish"), f"hidden_act={hf['hidden_act']!r}: DeepSeek-V4's experts are a "
                                                    f"clamped SwiGLU"),
        (bool(hf.get("quantization_config")), "quantization_config: redline reads DeepSeek-V4's weights unquantized "
                                              "(dequantize the FP8 / FP4 checkpoint to bf16 first)"),
        (main.get("rope_type", "default") != "default", f"rope_parameters.main.rope_type={main.get('rope_type')!r}: "
                                                        f"DeepSeek-V4's sliding layers turn by the plain RoPE"),
        (bool(hf.get("mlp_bias")), "mlp_bias: DeepSeek-V4's shared expert with biases is not redline's"),
        (bool(hf.get("attention_dropout")), f"attention_dropout={hf.get('attention_dropout')}: redline's sink "
                                            f"attention has no dropout"),
    ])
    experts = int(hf["n_routed_experts"])
    hashed = tuple(i for i, k in enumerate(mlp_kinds) if k == "hash_moe")
    width = int(hf["moe_intermediate_size"])
    context = int(hf["max_position_embeddings"])
    if _CSA in kinds:  # the indexer keeps every compressed key while a query sees no more than index_topk of them
        context = min(context, (int(hf.get("index_topk", 512)) + 1) * int(rates[_CSA]) - 1)
    thetas = [float(main.get("rope_theta", hf["rope_theta"])) if k == _SLIDING else float(compress["rope_theta"])
              for k in kinds]
    return ModelConfig(
        vocab_size=int(hf["vocab_size"]), context_len=context, n_layer=n,
        n_embd=int(hf["hidden_size"]), n_head=int(hf["num_attention_heads"]), n_kv_head=1,
        head_size=int(hf["head_dim"]), shared_kv_attention=True, q_lora_rank=int(hf["q_lora_rank"]),
        o_groups=int(hf["o_groups"]), o_lora_rank=int(hf["o_lora_rank"]), attn_sinks=True,
        sliding_window=int(hf["sliding_window"]), pos_emb="rope",
        rope_theta=thetas[0], rope_layer_theta=tuple(thetas) if len(set(thetas)) > 1 else (),
        **(yarn_parameters(compress, compress.get("original_max_position_embeddings")
                           or hf["max_position_embeddings"]) if yarn else {}),
        rope_unscaled_theta=thetas[kinds.index(_SLIDING)] if yarn and _SLIDING in kinds else 0.0,
        rope_dims=_rope_dims(hf),
        kv_compress_rates=tuple(int(rates[k]) if k != _SLIDING else 0 for k in kinds) if compressed else (),
        kv_compress_overlap=tuple(i for i, k in enumerate(kinds) if k == _CSA),
        mlp="swiglu_clipped", swiglu_limit=float(hf["swiglu_limit"]), fused_mlp=True, mlp_hidden=width,
        moe_experts=experts, moe_top_k=int(hf["num_experts_per_tok"]), moe_norm_topk=True,
        moe_gating=hf["scoring_func"], moe_norm_eps=_NORM_EPS, moe_scale=float(hf["routed_scaling_factor"]),
        moe_expert_bias=len(hashed) < n, moe_hash_layers=hashed, moe_shared_hidden=width, moe_shared_gate=False,
        moe_aux_loss=float(hf.get("router_aux_loss_coef", 0.001)) if hf.get("output_router_logits") else 0.0,
        mhc_streams=int(hf["hc_mult"]), mhc_sinkhorn_iters=int(hf["hc_sinkhorn_iters"]),
        mhc_eps=float(hf["hc_eps"]), norm="rmsnorm", norm_eps=float(hf["rms_norm_eps"]), bias=False,
        tie_embeddings=bool(hf["tie_word_embeddings"]),
    )


def _rope_order(cfg: ModelConfig) -> torch.Tensor:
    """A head's channel order from DeepSeek-V4's ([nope; rope], the rope channels interleaved pairs) to redline's
    ([rope; nope], the pairs in halves: apply_rope's): redline's channel j is DeepSeek-V4's order[j]."""
    D = cfg.head_dim
    R = cfg.rope_dims or D
    nope = D - R
    return torch.cat([torch.arange(nope, D, 2), torch.arange(nope + 1, D, 2), torch.arange(nope)])


def _heads(w: torch.Tensor, heads: int, order: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """w with each of `heads` heads' channels along `dim` taken in `order`."""
    D = order.numel()
    index = (torch.arange(heads)[:, None] * D + order[None, :]).flatten()
    return w.index_select(dim, index)


def _prefix(src: TensorSource) -> str:
    """"model." where the names carry transformers' base-model prefix (save_pretrained's), "" for DeepSeek's own."""
    return "model." if any(name.startswith("model.layers.") for name in src.names) else ""


def _take_first(src: TensorSource, *names: str) -> torch.Tensor:
    for name in names:
        if name in src:
            return src.take(name)
    return src.take(names[0])  # the error names the first


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = _prefix(src)
    H, G = cfg.n_head, cfg.o_groups
    order = _rope_order(cfg)
    out = {"wte.weight": pad_rows(_take_first(src, f"{pre}embed_tokens.weight", f"{pre}embed.weight"), cfg),
           "norm_f.weight": src.take(f"{pre}norm.weight")}
    for ours, theirs in (("fn", "fn"), ("base", "base"), ("scale", "scale")):
        out[f"mhc_head.{ours}"] = _take_first(src, f"{pre}hc_head.hc_{theirs}", f"{pre}hc_head_{theirs}")
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = pad_rows(_take_first(src, "head.weight", "lm_head.weight"), cfg, head=True)
    else:
        for name in ("head.weight", "lm_head.weight"):
            if name in src:
                src.take(name)
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        a = p + "attn."
        out[r + "norm1.weight"] = src.take(p + "attn_norm.weight")
        out[r + "norm2.weight"] = src.take(p + "ffn_norm.weight")
        for ours, theirs in _HC.items():
            for part in ("fn", "base", "scale"):
                out[f"{r}{ours}.{part}"] = src.take(f"{p}{theirs}_{part}")
        out[r + "attn.q_a.weight"] = src.take(a + "wq_a.weight")
        out[r + "attn.q_a_norm.weight"] = src.take(a + "q_norm.weight")
        out[r + "attn.q_b.weight"] = _heads(src.take(a + "wq_b.weight"), H, order)
        out[r + "attn.kv.weight"] = _heads(src.take(a + "wkv.weight"), 1, order)
        out[r + "attn.kv_norm.weight"] = _heads(src.take(a + "norm.weight"), 1, order)
        wo_a = _heads(src.take(a + "wo_a.weight"), H // G, order, dim=1)  # (G·r, H·D/G): each group's heads alike
        out[r + "attn.o_a.weight"] = wo_a.view(G, cfg.o_lora_rank, -1)
        out[r + "attn.proj.weight"] = src.take(a + "wo_b.weight")
        out[r + "attn.sinks"] = src.take(a + "attn_sink")
        if cfg.kv_compress_rates and cfg.kv_compress_rates[i]:  # its compressor: 1 or 2 series of D
            series = 2 if i in cfg.kv_compress_overlap else 1
            c = a + "compressor."
            out[r + "attn.comp_kv.weight"] = _heads(src.take(c + "wkv.weight"), series, order)
            out[r + "attn.comp_gate.weight"] = _heads(src.take(c + "wgate.weight"), series, order)
            out[r + "attn.comp_bias"] = _heads(src.take(c + "ape"), series, order, dim=1).float()
            out[r + "attn.comp_norm.weight"] = _heads(src.take(c + "norm.weight"), 1, order)
            indexer = sorted(name for name in src.names if name.startswith(a + "indexer."))
            src.used.update(indexer)  # read by name, not loaded: within context_len it keeps every key
        f, m = p + "ffn.", r + "mlp."
        out[m + "router.weight"] = src.take(f + "gate.weight")
        if i in cfg.moe_hash_layers:
            out[m + "tid2eid"] = src.take(f + "gate.tid2eid").long()
            if cfg.moe_expert_bias:  # a hash layer chooses by its table: its bias is never read
                out[m + "expert_bias"] = torch.zeros(cfg.moe_experts)
        else:
            out[m + "expert_bias"] = src.take(f + "gate.bias").float()
        e = range(cfg.moe_experts)
        out[m + "fc"] = torch.stack([torch.cat([src.take(f"{f}experts.{j}.w1.weight"),
                                                src.take(f"{f}experts.{j}.w3.weight")]) for j in e])
        out[m + "proj"] = torch.stack([src.take(f"{f}experts.{j}.w2.weight") for j in e])
        out[m + "shared.fc.weight"] = torch.cat([src.take(f + "shared_experts.w1.weight"),
                                                 src.take(f + "shared_experts.w3.weight")])
        out[m + "shared.proj.weight"] = src.take(f + "shared_experts.w2.weight")
    if cfg.kv_compress_overlap:
        print(f"{src.where}: the lightning indexers of the compressed sparse attention layers are left out: over at "
              f"most index_topk compressed keys they keep them all, so redline attends to every one, its context "
              f"stopped at {cfg.context_len}", file=sys.stderr)
    return out


def wants_deepseek_v4(cfg: ModelConfig) -> bool:
    """A config with a layer of DeepSeek-V4's alone: hyper-connections, its attention, hash routing, its clamp or
    its scores."""
    return bool(cfg.mhc_streams or cfg.shared_kv_attention or cfg.moe_hash_layers or cfg.mlp == "swiglu_clipped"
                or cfg.moe_gating == "sqrtsoftplus")


def _kinds(cfg: ModelConfig) -> list[str]:
    """Each layer's DeepSeek-V4 layer type."""
    rates = cfg.kv_compress_rates or (0,) * cfg.n_layer
    return [_SLIDING if not rates[i] else _CSA if i in cfg.kv_compress_overlap else _HCA for i in range(cfg.n_layer)]


def _kind_values(cfg: ModelConfig, values) -> dict[str, set]:
    """{layer type: the distinct values its layers have} of per-layer `values`."""
    out: dict[str, set] = {}
    for kind, value in zip(_kinds(cfg), values):
        out.setdefault(kind, set()).add(value)
    return out


def _theta(cfg: ModelConfig, layer: int) -> float:
    return cfg.rope_layer_theta[layer] if cfg.rope_layer_theta else cfg.rope_theta


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the first option a DeepSeek-V4 model does not have."""
    why = "DeepSeek-V4, the one architecture redline exports to with "
    rates = _kind_values(cfg, cfg.kv_compress_rates or (0,) * cfg.n_layer)
    thetas = _kind_values(cfg, [_theta(cfg, i) for i in range(cfg.n_layer)])
    raise_first([
        (any(len(v) > 1 for v in rates.values()),
         f"model.kv_compress_rates={cfg.kv_compress_rates}: DeepSeek-V4 has one compression rate for its overlapping "
         f"layers and one for the others (compress_rates)"),
        (len(thetas.get(_SLIDING, set())) > 1 or len(thetas.get(_CSA, set()) | thetas.get(_HCA, set())) > 1
         or 0.0 in {t for v in thetas.values() for t in v},
         f"model.rope_layer_theta={cfg.rope_layer_theta}: DeepSeek-V4 turns its sliding layers by one RoPE base "
         f"(rope_theta) and its compressed layers by another (compress_rope_theta), every layer turning"),
        (cfg.mhc_sinkhorn_iters < 1 or cfg.mhc_post_scale != 2.0,
         f"model.mhc_sinkhorn_iters={cfg.mhc_sinkhorn_iters}, mhc_post_scale={cfg.mhc_post_scale}: DeepSeek-V4's "
         f"hyper-connections mix their streams by a Sinkhorn matrix (iterations >= 1) and scale the post gate by 2 "
         f"; HY-V4's iHC, read import only, has neither"),
        (not (cfg.mhc_streams and cfg.shared_kv_attention and cfg.attn_sinks),
         why + "mHC streams, its attention, hash routing, clamped SwiGLU or sqrtsoftplus scores, has all of "
               "model.mhc_streams, shared_kv_attention and attn_sinks"),
        (not cfg.sliding_window or cfg.sliding_window_pattern or cfg.window_layers or cfg.attn_chunk,
         "DeepSeek-V4's sliding layers all attend within one window (model.sliding_window > 0, no "
         "sliding_window_pattern, window_layers or attn_chunk)"),
        (cfg.rope_scaling not in ("none", "yarn") or cfg.attn_scale or cfg.attn_softcap,
         "DeepSeek-V4 turns by the plain RoPE (YaRN on its compressed layers), scales scores by 1/sqrt(head_dim) "
         "and caps none (model.rope_scaling, attn_scale, attn_softcap)"),
        (cfg.rope_scaling == "yarn" and (not cfg.kv_compress_rates or (_SLIDING in _kinds(cfg) and any(
            cfg.rope_unscaled_theta != _theta(cfg, i) for i, k in enumerate(_kinds(cfg)) if k == _SLIDING))),
         "model.rope_scaling=yarn: DeepSeek-V4 scales the RoPE of its compressed layers alone (model.kv_compress_rates;"
         " its sliding layers' base model.rope_unscaled_theta)"),
        (not cfg.moe_experts or cfg.mlp != "swiglu_clipped" or cfg.moe_shared_hidden != cfg.hidden_dim
         or cfg.moe_shared_gate or cfg.moe_dense_layers or cfg.moe_layers or cfg.moe_beside_dense,
         "DeepSeek-V4 has experts on every layer (model.moe_experts) of mlp=swiglu_clipped, with an ungated shared "
         "expert as wide as they are (moe_shared_hidden = mlp_hidden, moe_shared_gate=false)"),
        (cfg.moe_gating not in _SCORING or not cfg.moe_norm_topk or cfg.moe_norm_min or cfg.moe_groups > 1
         or cfg.moe_bias or cfg.moe_weight_input or cfg.moe_identity_experts or cfg.moe_post_norm or cfg.moe_out_bias
         or cfg.moe_bias_on_logits or cfg.moe_norm_eps != _NORM_EPS,
         f"DeepSeek-V4's routers rescale the chosen {'/'.join(_SCORING)} scores to sum to 1 plus {_NORM_EPS} "
         f"(model.moe_norm_topk, moe_norm_eps) with no groups, biases, input weighting or extra experts"),
        (cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine or cfg.embed_norm
         or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor
         or cfg.logit_softcap or cfg.head_bias or cfg.head_vocab or cfg.dropout or cfg.value_embeddings
         or cfg.smear_gate or cfg.layer_lambdas or cfg.backout,
         "DeepSeek-V4's blocks are plain RMSNorms with weights and no embedding, residual or logit scalars"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    rotary = (cfg.rope_dims or cfg.head_dim) / cfg.head_dim
    kinds = _kinds(cfg)
    rates = {kind: next(iter(v)) for kind, v in _kind_values(cfg, cfg.kv_compress_rates or (0,) * cfg.n_layer).items()}
    main = next((_theta(cfg, i) for i, k in enumerate(kinds) if k == _SLIDING), cfg.rope_theta)
    compress = next((_theta(cfg, i) for i, k in enumerate(kinds) if k != _SLIDING), cfg.rope_theta)
    csa = rates.get(_CSA, _DEFAULTS["compress_rates"][_CSA])
    return {
        "model_type": "deepseek_v4", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "moe_intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": 1, "head_dim": cfg.head_dim,
        "q_lora_rank": cfg.q_lora_rank, "o_groups": cfg.o_groups, "o_lora_rank": cfg.o_lora_rank,
        "num_experts_per_tok": cfg.moe_top_k, "n_routed_experts": cfg.moe_experts, "n_shared_experts": 1,
        "scoring_func": cfg.moe_gating, "norm_topk_prob": True, "routed_scaling_factor": cfg.moe_scale,
        "max_position_embeddings": cfg.context_len, "rope_theta": main, "compress_rope_theta": compress,
        "partial_rotary_factor": rotary, "layer_types": kinds,
        "rope_parameters": {"main": {"rope_type": "default", "rope_theta": main, "partial_rotary_factor": rotary},
                            "compress": {**(rope_scaling(cfg, "deepseek_v4") or {"rope_type": "default"}),
                                         "rope_theta": compress, "partial_rotary_factor": rotary}},
        "compress_rates": {_CSA: csa, _HCA: rates.get(_HCA, _DEFAULTS["compress_rates"][_HCA])},
        # an indexer of zeros (_indexer_of_zeros) keeping every compressed key within the context
        "index_n_heads": 1, "index_head_dim": cfg.rope_dims or cfg.head_dim,
        "index_topk": max(1, cfg.context_len // csa),
        "mlp_layer_types": ["hash_moe" if i in cfg.moe_hash_layers else "moe" for i in range(cfg.n_layer)],
        "hc_mult": cfg.mhc_streams, "hc_sinkhorn_iters": cfg.mhc_sinkhorn_iters, "hc_eps": cfg.mhc_eps,
        "swiglu_limit": cfg.swiglu_limit, "sliding_window": cfg.sliding_window, "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "mlp_bias": False, "attention_dropout": 0.0, "output_router_logits": bool(cfg.moe_aux_loss),
        "router_aux_loss_coef": cfg.moe_aux_loss or 0.001, "initializer_range": 0.02, "use_cache": True,
    }


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """redline's state dict -> DeepSeek-V4's checkpoint names under transformers' "model." prefix, as its
    save_pretrained writes them; a router without a bias (model.moe_expert_bias off) gets zeros."""
    H, G, V = cfg.n_head, cfg.o_groups, cfg.vocab_size
    back = torch.argsort(_rope_order(cfg))  # DeepSeek-V4's channel j is redline's back[j]
    out = {"model.embed_tokens.weight": state["wte.weight"][:V], "model.norm.weight": state["norm_f.weight"]}
    out.update({"head.weight": v for v in give_head(state, cfg).values()})
    for part in ("fn", "base", "scale"):
        out[f"model.hc_head.hc_{part}"] = state[f"mhc_head.{part}"]
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        a, f, m = p + "attn.", p + "ffn.", r + "mlp."
        out[p + "attn_norm.weight"] = state[r + "norm1.weight"]
        out[p + "ffn_norm.weight"] = state[r + "norm2.weight"]
        for ours, theirs in _HC.items():
            for part in ("fn", "base", "scale"):
                out[f"{p}{theirs}_{part}"] = state[f"{r}{ours}.{part}"]
        out[a + "wq_a.weight"] = state[r + "attn.q_a.weight"]
        out[a + "q_norm.weight"] = state[r + "attn.q_a_norm.weight"]
        out[a + "wq_b.weight"] = _heads(state[r + "attn.q_b.weight"], H, back)
        out[a + "wkv.weight"] = _heads(state[r + "attn.kv.weight"], 1, back)
        out[a + "norm.weight"] = _heads(state[r + "attn.kv_norm.weight"], 1, back)
        o_a = state[r + "attn.o_a.weight"]  # (G, r, H·D/G)
        out[a + "wo_a.weight"] = _heads(o_a.reshape(G * cfg.o_lora_rank, -1), H // G, back, dim=1)
        out[a + "wo_b.weight"] = state[r + "attn.proj.weight"]
        out[a + "attn_sink"] = state[r + "attn.sinks"]
        if cfg.kv_compress_rates and cfg.kv_compress_rates[i]:
            series = 2 if i in cfg.kv_compress_overlap else 1
            c = a + "compressor."
            out[c + "wkv.weight"] = _heads(state[r + "attn.comp_kv.weight"], series, back)
            out[c + "wgate.weight"] = _heads(state[r + "attn.comp_gate.weight"], series, back)
            out[c + "ape"] = _heads(state[r + "attn.comp_bias"], series, back, dim=1).float()
            out[c + "norm.weight"] = _heads(state[r + "attn.comp_norm.weight"], 1, back)
            if series == 2:
                out.update(_indexer_of_zeros(a, cfg, out[a + "wq_a.weight"]))
        router = state[m + "router.weight"]
        out[f + "gate.weight"] = router
        if i in cfg.moe_hash_layers:
            out[f + "gate.tid2eid"] = state[m + "tid2eid"]
        else:
            out[f + "gate.bias"] = state.get(m + "expert_bias", router.new_zeros(cfg.moe_experts)).float()
        fc, proj, F_ = state[m + "fc"], state[m + "proj"], cfg.hidden_dim
        for j in range(cfg.moe_experts):
            out[f"{f}experts.{j}.w1.weight"], out[f"{f}experts.{j}.w3.weight"] = fc[j, :F_], fc[j, F_:]
            out[f"{f}experts.{j}.w2.weight"] = proj[j]
        shared = state[m + "shared.fc.weight"]
        out[f + "shared_experts.w1.weight"], out[f + "shared_experts.w3.weight"] = shared[:F_], shared[F_:]
        out[f + "shared_experts.w2.weight"] = state[m + "shared.proj.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def _indexer_of_zeros(a: str, cfg: ModelConfig, like: torch.Tensor) -> dict:
    """A compressed sparse attention layer's lightning indexer (after its attn.), all zeros: one head of
    rope_dims, its scores all 0, so it keeps every compressed key up to index_topk (hf_config's: the context's),
    which is what redline computes (the import leaves the indexer out)."""
    Di, rate = cfg.rope_dims or cfg.head_dim, cfg.kv_compress_rates[cfg.kv_compress_overlap[0]]
    i = a + "indexer."
    zeros = {i + "compressor.ape": (rate, 2 * Di), i + "compressor.norm.weight": (Di,),
             i + "compressor.wgate.weight": (2 * Di, cfg.n_embd), i + "compressor.wkv.weight": (2 * Di, cfg.n_embd),
             i + "weights_proj.weight": (1, cfg.n_embd), i + "wq_b.weight": (Di, cfg.q_lora_rank)}
    return {name: like.new_zeros(shape, dtype=torch.float32 if name.endswith("ape") else like.dtype)
            for name, shape in zeros.items()}


_ADAPTED = {"q_a": "q_a_proj", "q_b": "q_b_proj", "kv": "kv_proj", "proj": "o_b_proj"}
"""redline's attention Linear layers -> transformers' DeepseekV4Attention modules, as PEFT names them."""


def adapter_parts(layer: str, rest: str, base: str, out_features: int, cfg: ModelConfig) -> list:
    """PEFT's module for redline layer `layer` (rest: its name after blocks.N.) with its B rows (peft_adapter's
    _parts): q_b's, kv's and a compressor's kv and gate projections' in DeepSeek-V4's RoPE order, as to_hf writes the
    weights. The grouped o_a is no Linear
    layer in redline (a HeadLinear) and the MLPs' adapters PEFT would move onto the experts: refused."""
    module = rest.removeprefix("attn.")
    if module in ("comp_kv", "comp_gate"):  # a compressed layer's compressor: its series' rows in DeepSeek-V4's order
        series = 2 if int(layer.split(".")[1]) in cfg.kv_compress_overlap else 1
        rows = _heads(torch.arange(out_features), series, torch.argsort(_rope_order(cfg)))
        return [(f"{base}self_attn.compressor.{module.removeprefix('comp_')}_proj", rows)]
    if module not in _ADAPTED:
        raise UserError(f"the adapter on {layer} has no counterpart in {ARCHITECTURE} (PEFT adapts its attention's "
                        f"q_a, q_b, kv and proj; its MLPs' adapters it would move onto the experts); train with "
                        f"lora.targets attn.* or export with --merge")
    rows = torch.arange(out_features)
    if module in ("q_b", "kv"):
        rows = _heads(rows, cfg.n_head if module == "q_b" else 1, torch.argsort(_rope_order(cfg)))
    return [(f"{base}self_attn.{_ADAPTED[module]}", rows)]


def _ignorable(name: str) -> bool:
    """The multi-token-prediction layers (mtp.*), which transformers skips too."""
    return name.startswith(("mtp.", "model.mtp."))


FAMILY = Family(name="deepseek_v4", architecture=ARCHITECTURE, model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
