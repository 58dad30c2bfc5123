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

Refused by name: Per-Layer Embeddings (ple_layer_ids: hashed n-gram tables and a dilated convolution, which redline's
model and engine have not), an output gate other than SiLU on the delta nets (output_gate_type), attention layers
without the indexer's fields (transformers builds none), indexer_kv_heads other than 1, RoPE other than default;
and what qwen3_5.py refuses. Semantics read from transformers' models/qwen4_exp/modular_qwen4_exp.py.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop import multimodal, qwen3_5
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.interop.multimodal import text_view
from redline.model import ModelConfig

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
    raise_first([
        (bool(hf.get("ple_layer_ids")), f"ple_layer_ids={hf.get('ple_layer_ids')}: Qwen4-Exp's Per-Layer Embeddings "
                                        f"(hashed n-gram tables and a dilated convolution) are not in redline's model "
                                        f"or engine; read a config without them"),
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
           "hc_count": cfg.hc_streams, "hc_lowrank": cfg.hc_rank, "ple_layer_ids": []}
    out["layer_types"] = ["linear_attention" if i in cfg.delta_layers else "indexed_attention"
                          for i in range(cfg.n_layer)]
    if cfg.qsa_heads:
        out.update(indexer_n_heads=cfg.qsa_heads, indexer_kv_heads=1, indexer_head_dim=cfg.qsa_head_dim,
                   indexer_budget=cfg.qsa_budget, indexer_compress_ratio=cfg.qsa_block)
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
