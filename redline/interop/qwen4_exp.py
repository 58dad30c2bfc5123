"""Qwen4-Exp (Qwen4ExpForCausalLM, model_type "qwen4_exp_text", and the text model of
Qwen4ExpForConditionalGeneration, "qwen4_exp", whose weights sit under model.language_model.): Qwen3.5-MoE's layers
(qwen3_5.py: gated delta nets, gated attention with QK-norm and partial RoPE, norms by 1 + weight, experts on every
layer with a shared expert under a sigmoid gate) on hyper-connected residual streams:

- hc_count streams (model.hc_streams), the embeddings copied into each. Each sublayer reads the streams through its
  Qwen4ExpTextGatedResidual (attn_hyper_connection, mlp_hyper_connection): hc_norm, an RMSNorm by 1 + weight of each
  stream (a (N·C,) weight read as (N, C)), input_mix_weight_down / _up (the rank hc_lowrank mixer: model.hc_rank)
  and block_inject_weight (each stream's share of the output), redline's Block.hyper_forward; there is no
  input_layernorm or post_attention_layernorm. The model's hyper_connection_mixer collapses the streams before the
  head, in place of a final norm (GPT.hc_out);
- a QSA token indexer on every attention layer (indexed_attention; the Hub's "full_attention"): per query, the
  indexer_budget / indexer_compress_ratio best blocks of compress_ratio keys plus the unfinished last block. While
  a query sees fewer than indexer_budget + indexer_compress_ratio keys, every block is kept and transformers' mask is
  the causal one (Qwen4ExpTextQSAIndexer), so the import caps context_len at indexer_budget + compress_ratio - 1 and
  attends densely, as deepseek_kin.py does for DeepSeek Sparse Attention; the indexer's weights (index_qk_proj,
  q_layernorm, k_layernorm) are kept as the attention's qsa_* buffers and written back on export.

- Per-Layer Embeddings (ple_layer_ids, one-indexed: model.ngram_layers, zero-indexed; Qwen4ExpTextPLELayer as
  redline's NGramEmbedding): the hashed n-gram table (ple_embedding.ngram_embedding, on disk split_ngram_parts
  shards ngram_embedding.shard_K.weight concatenated in order, written back so), key_proj, value_proj, norm_key,
  norm_query, norm_conv ((N·C,) read as (N, C)) and conv1d ((N·C, 1, K) as (N·C, K)); the hash's multipliers,
  table sizes and offsets are derived from the config (ngram_multipliers, ngram_table_sizes), checked against the
  checkpoint's buffers on import and written back on export.

Refused by name: an output gate other than SiLU on the delta nets (output_gate_type), attention layers
without the indexer's fields (transformers builds none), indexer_kv_heads other than 1, RoPE other than default;
and what qwen3_5.py refuses. Semantics read from transformers' models/qwen4_exp/modular_qwen4_exp.py.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop import multimodal, qwen3_5
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.multimodal import text_view
from redline.model import ModelConfig, ngram_multipliers, ngram_table_sizes

_INDEXER = {"attn.qsa_qk": "index_qk_proj.weight", "attn.qsa_q_norm": "q_layernorm.weight",
            "attn.qsa_k_norm": "k_layernorm.weight"}
"""redline's QSA buffers -> self_attn.indexer.* (after model.layers.N.)."""
_HC = {"norm": "hc_norm.weight", "down.weight": "input_mix_weight_down.weight",
       "up.weight": "input_mix_weight_up.weight", "inject.weight": "block_inject_weight.weight"}
"""A HyperConnection's tensors -> a Qwen4ExpTextGatedResidual's."""
_DEFAULTS = dict(vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                 num_key_value_heads=2, head_dim=256, max_position_embeddings=32768, rms_norm_eps=1e-6,
                 linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                 linear_num_value_heads=32, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                 num_experts_per_tok=10, num_experts=512, norm_topk_prob=True, hc_count=4, hc_lowrank=320)
"""Qwen4ExpTextConfig's defaults for the fields a config.json may leave out."""
_QSA_FIELDS = ("indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget", "indexer_compress_ratio")


def text_config(hf: dict) -> dict:
    return multimodal.text_config(hf, tie_default=False)


def model_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **{k: v for k, v in text_config(hf).items() if v is not None}}
    n = hf["num_hidden_layers"]
    kinds = hf.get("layer_types") or ["indexed_attention" if (i + 1) % int(hf.get("full_attention_interval", 4)) == 0
                                      else "linear_attention" for i in range(n)]
    kinds = ["full_attention" if k == "indexed_attention" else k for k in kinds]  # qwen3_5.py's names
    gate = hf.get("output_gate_type") or hf.get("hidden_act", "silu")
    qsa = {name: hf.get(name) for name in _QSA_FIELDS}
    attention = "full_attention" in kinds
    ple = sorted({int(i) for i in hf.get("ple_layer_ids") or ()})
    eos = hf.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    raise_first([
        (bool(ple) and eos is None, "eos_token_id unset: Qwen4-Exp's Per-Layer Embeddings (ple_layer_ids) need the "
                                    "end-of-text id, where every n-gram stops"),
        (gate != "silu", f"output_gate_type={gate!r}: redline's gated delta nets gate their output by SiLU"),
        (int(hf.get("hc_count", 4)) < 2, f"hc_count={hf.get('hc_count')}: Qwen4-Exp has 2 or more residual streams"),
        (attention and any(v is None for v in qsa.values()),
         f"{', '.join(k for k, v in qsa.items() if v is None)} unset: Qwen4-Exp's attention layers always carry a "
         f"QSA indexer, which transformers builds from these fields"),
        (attention and qsa["indexer_kv_heads"] != 1,
         f"indexer_kv_heads={qsa['indexer_kv_heads']}: Qwen4-Exp's QSA indexer has one key head"),
        (int(hf.get("num_experts") or 0) < 1, f"num_experts={hf.get('num_experts')}: every Qwen4-Exp layer is a "
                                              f"mixture of experts"),
    ])
    params = dict(hf.get("rope_parameters") or {})
    # Qwen4ExpTextRotaryEmbedding rotates the whole head where partial_rotary_factor is absent (Qwen3.5's default is
    # a quarter: qwen3_5.hybrid_config)
    params.setdefault("partial_rotary_factor", 1.0)
    plain = {**hf, "layer_types": kinds, "rope_parameters": params}
    fields = {**qwen3_5.shared_expert_fields(hf), "moe_norm_topk": bool(hf.get("norm_topk_prob", True))}
    cfg = qwen3_5.hybrid_config(plain, fields)
    extra = dict(hc_streams=int(hf.get("hc_count", 4)), hc_rank=int(hf.get("hc_lowrank", 320)))
    if ple:  # one-indexed layers (Qwen4ExpTextDecoderLayer) -> redline's zero-indexed
        extra.update(ngram_layers=tuple(i - 1 for i in ple), ngram_dim=int(hf.get("ple_embed_dim") or cfg.n_embd),
                     ngram_size=int(hf.get("ngram_size", 3)), ngram_heads=int(hf.get("heads_per_ngram", 8)),
                     ngram_vocab_base=int(hf.get("ngram_vocab_size_base", 20_000_000)),
                     ngram_vocab_multiple=int(hf.get("make_ngram_vocab_size_divisible_by", 128)),
                     ngram_seed=int(hf.get("seed", 1234)), ngram_conv_kernel=int(hf.get("ple_conv_kernel_size", 4)),
                     ngram_eos=int(eos))
    if attention:
        budget, block = int(qsa["indexer_budget"]), int(qsa["indexer_compress_ratio"])
        extra.update(qsa_heads=int(qsa["indexer_n_heads"]), qsa_head_dim=int(qsa["indexer_head_dim"]),
                     qsa_budget=budget, qsa_block=block,
                     context_len=min(cfg.context_len, budget + block - 1))  # the indexer keeps every key within
    return dataclasses.replace(cfg, **extra)


def wants_qwen4_exp(cfg: ModelConfig) -> bool:
    """Hyper-connections and the QSA indexer are Qwen4-Exp's alone."""
    return bool(cfg.hc_streams or cfg.qsa_heads)


def check_exportable(cfg: ModelConfig) -> None:
    """Qwen3.5's exportable options (qwen3_5.check_exportable) and what Qwen4-Exp's layers add."""
    qwen3_5.check_exportable(cfg)
    what = "model.hc_streams or model.qsa_heads: Qwen4-Exp, the one architecture with them,"
    named = [name for name in ("v_norm", "kv_shared_layers", "global_head_size", "global_kv_head",
                               "global_values_from_keys", "mlp_sparsity", "attn_chunk", "nope_temperature",
                               "rope_qk_norm", "qk_layernorm", "moe_post_norm", "sub_norms", "value_embeddings",
                               "value_embed_layers", "smear_gate", "moe_expert_bias")
             if getattr(cfg, name, None)]
    named += ["moe_groups"] * (cfg.moe_groups > 1) + ["bitlinear"] * (cfg.bitlinear != "off")
    raise_first([
        (bool(named), f"{what} has no such option (model.{named[0] if named else ''})"),
        (not cfg.hc_streams, f"{what} runs every layer on hyper-connected streams (model.hc_streams)"),
        (not cfg.moe_experts or cfg.moe_dense_layers, f"{what} has experts on every layer (model.moe_experts)"),
        (cfg.delta_rule != "gated_delta" or cfg.delta_beta_scale != 1.0 or cfg.delta_norm_eps
         or cfg.delta_conv_bias or cfg.delta_proj_bias, f"{what} has Qwen3.5's gated delta nets (model.delta_rule)"),
        (len(cfg.delta_layers) < cfg.n_layer and not cfg.qsa_heads,
         f"{what} carries a QSA indexer on every attention layer (model.qsa_heads, qsa_head_dim, qsa_budget, "
         f"qsa_block)"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    out = {**qwen3_5.moe_hf_config(cfg), "model_type": "qwen4_exp_text", "norm_topk_prob": cfg.moe_norm_topk,
           "hc_count": cfg.hc_streams, "hc_lowrank": cfg.hc_rank, "ple_layer_ids": [i + 1 for i in cfg.ngram_layers]}
    if cfg.ngram_layers:
        out.update(ple_embed_dim=cfg.ngram_dim, ngram_size=cfg.ngram_size, heads_per_ngram=cfg.ngram_heads,
                   ngram_vocab_size_base=cfg.ngram_vocab_base,
                   make_ngram_vocab_size_divisible_by=cfg.ngram_vocab_multiple, seed=cfg.ngram_seed,
                   ple_conv_kernel_size=cfg.ngram_conv_kernel, split_ngram_parts=ngram_parts(cfg),
                   eos_token_id=cfg.ngram_eos)
    out["layer_types"] = ["linear_attention" if i in cfg.delta_layers else "indexed_attention"
                          for i in range(cfg.n_layer)]
    if cfg.qsa_heads:
        out.update(indexer_n_heads=cfg.qsa_heads, indexer_kv_heads=1, indexer_head_dim=cfg.qsa_head_dim,
                   indexer_budget=cfg.qsa_budget, indexer_compress_ratio=cfg.qsa_block)
    return out


_PLE = {"key.weight": "key_proj.weight", "value.weight": "value_proj.weight", "key_norm": "norm_key.weight",
        "query_norm": "norm_query.weight", "conv_norm": "norm_conv.weight", "conv": "conv1d.weight"}
"""An NGramEmbedding's tensors -> a Qwen4ExpTextPLELayer's (after model.layers.N.ple.), but for the table."""
_PLE_TABLE = "ple_embedding.ngram_embedding"


def ngram_parts(cfg: ModelConfig) -> int:
    """The shards each n-gram table is written in (split_ngram_parts): the most, up to transformers' default 512,
    that split every layer's table into equal ones (torch.chunk's, as transformers' Chunk writes them)."""
    parts = 512
    for i in cfg.ngram_layers:
        rows = sum(ngram_table_sizes(cfg, cfg.ngram_layers.index(i)))
        parts = math.gcd(parts, -(-rows // cfg.ngram_vocab_multiple) * cfg.ngram_vocab_multiple)
    return parts


def _ngram_buffers(cfg: ModelConfig, index: int) -> dict[str, torch.Tensor]:
    """The hash's constants transformers keeps as the index-th PLE layer's buffers (after ple.ple_embedding.)."""
    sizes = ngram_table_sizes(cfg, index)
    return {"layer_multipliers": torch.tensor(ngram_multipliers(cfg.vocab_size, cfg.ngram_size, index,
                                                                cfg.ngram_seed)),
            "ngram_heads_vocab_sizes": torch.tensor(sizes),
            "ngram_heads_offsets": torch.tensor([sum(sizes[:k]) for k in range(len(sizes))])}


def _take_ngrams(src: TensorSource, p: str, r: str, cfg: ModelConfig, i: int) -> dict:
    """Layer i's PLE (model.layers.i.ple.) -> redline's blocks.i.ngram.; the table from its shards where the
    checkpoint has them (ngram_embedding.shard_0.weight, ...), concatenated in order."""
    N, C = cfg.hc_streams, cfg.n_embd
    out = {}
    for ours, theirs in _PLE.items():
        t = src.take(f"{p}ple.{theirs}")
        if ours.endswith("norm"):
            t = t.view(N, C)
        elif ours == "conv":  # (N·C, 1, K) -> (N·C, K)
            t = t.reshape(N * C, -1)
        out[r + "ngram." + ours] = t
    table = f"{p}ple.{_PLE_TABLE}."
    if table + "weight" in src:
        out[r + "ngram.table.weight"] = src.take(table + "weight")
    else:
        shards, k = [], 0
        while f"{table}shard_{k}.weight" in src:
            shards.append(src.take(f"{table}shard_{k}.weight"))
            k += 1
        out[r + "ngram.table.weight"] = torch.cat(shards) if shards else src.take(table + "weight")
    index = cfg.ngram_layers.index(i)
    for name, derived in _ngram_buffers(cfg, index).items():
        where = f"{p}ple.ple_embedding.{name}"
        if where in src and not torch.equal(src.take(where).long(), derived):
            raise UserError(f"{src.where}: {where} differs from what the config derives (seed, vocab_size, "
                            f"ngram_size, ngram_vocab_size_base): the hash cannot be reproduced")
    return out


def _give_ngrams(state: Mapping[str, torch.Tensor], p: str, r: str, cfg: ModelConfig, i: int) -> dict:
    """redline's blocks.i.ngram. -> model.layers.i.ple., the table in ngram_parts shards."""
    out = {}
    for ours, theirs in _PLE.items():
        t = state[r + "ngram." + ours]
        out[f"{p}ple.{theirs}"] = t.reshape(-1) if ours.endswith("norm") else t[:, None] if ours == "conv" else t
    for k, shard in enumerate(torch.chunk(state[r + "ngram.table.weight"], ngram_parts(cfg))):
        out[f"{p}ple.{_PLE_TABLE}.shard_{k}.weight"] = shard
    for name, t in _ngram_buffers(cfg, cfg.ngram_layers.index(i)).items():
        out[f"{p}ple.ple_embedding.{name}"] = t
    return out


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    src = text_view(src)  # Qwen4ExpForConditionalGeneration's model.language_model. read as model.
    if cfg.qsa_heads:
        print(f"{src.where}: the QSA indexer keeps every key within indexer_budget + indexer_compress_ratio - 1 = "
              f"{cfg.qsa_budget + cfg.qsa_block - 1} tokens, so redline attends densely and its context stops at "
              f"{cfg.context_len}; the indexer's weights are kept to be written back", file=sys.stderr)
    N, C = cfg.hc_streams, cfg.n_embd
    out = {"wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg)}
    out.update(take_head(src, cfg))

    def take_hc(theirs: str, ours: str, inject: bool = True) -> None:
        for mine, name in _HC.items():
            if mine == "inject.weight" and not inject:
                continue
            t = src.take(theirs + name)
            out[ours + mine] = t.view(N, C) if mine == "norm" else t

    take_hc("model.hyper_connection_mixer.", "hc_out.", inject=False)
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        take_hc(p + "attn_hyper_connection.", r + "attn_hc.")
        take_hc(p + "mlp_hyper_connection.", r + "mlp_hc.")
        out.update(qwen3_5.layer_to_redline(src, p, r, cfg, i))
        if i in cfg.ngram_layers:
            out.update(_take_ngrams(src, p, r, cfg, i))
        if i not in cfg.delta_layers:
            for ours, theirs in _INDEXER.items():
                out[r + ours] = src.take(f"{p}self_attn.indexer.{theirs}")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    out = {"model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size]}
    out.update(give_head(state, cfg))

    def give_hc(ours: str, theirs: str, inject: bool = True) -> None:
        for mine, name in _HC.items():
            if mine == "inject.weight" and not inject:
                continue
            out[theirs + name] = state[ours + mine].reshape(-1) if mine == "norm" else state[ours + mine]

    give_hc("hc_out.", "model.hyper_connection_mixer.", inject=False)
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        give_hc(r + "attn_hc.", p + "attn_hyper_connection.")
        give_hc(r + "mlp_hc.", p + "mlp_hyper_connection.")
        out.update(qwen3_5.layer_to_hf(state, p, r, cfg, i))
        if i in cfg.ngram_layers:
            out.update(_give_ngrams(state, p, r, cfg, i))
        if i not in cfg.delta_layers:
            for ours, theirs in _INDEXER.items():
                out[f"{p}self_attn.indexer.{theirs}"] = state[r + ours]
    return {k: v.contiguous() for k, v in out.items()}


TEXT_FAMILY = Family(name="qwen4_exp_text", architecture="Qwen4ExpForCausalLM", model_config=model_config,
                     hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=qwen3_5.ignorable)
# Qwen4ExpForConditionalGeneration's folders: the text model is read (its vision tower left); exports are the text
# model (TEXT_FAMILY)
FAMILY = multimodal.multimodal_family("qwen4_exp", "Qwen4ExpForCausalLM", {"qwen4_exp_text": TEXT_FAMILY},
                                      "qwen4_exp_text", tie_default=False)
