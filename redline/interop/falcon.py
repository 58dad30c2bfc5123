"""Falcon (TII's FalconForCausalLM, model_type "falcon": falcon-7b, falcon-40b, falcon-180B, falcon-11B and their
instruct models; Falcon3 is Llama and imports as Llama): LayerNorm blocks with RoPE on whole heads, a GELU MLP of
ffn_hidden_size (4 × the width where absent), biases on every Linear layer or none (`bias`), LayerNorms always with
biases, a head without a bias tied to the embedding unless tie_word_embeddings=false.

Blocks, as transformers' FalconDecoderLayer computes them:
- new_decoder_architecture (falcon-40b/180B/11B): attention and MLP side by side, x + attn(ln_attn(x)) + mlp(ln_mlp(x))
  with num_ln_in_parallel_attn 2 (the default there: redline's parallel_residual), one input_layernorm for both with
  1 (parallel_shared_norm); num_kv_heads KV heads (GQA).
- otherwise parallel_attn (falcon-7b): x + attn(ln(x)) + mlp(ln(x)) under one input_layernorm (parallel_shared_norm);
  multi_query: one KV head, else num_kv_heads (which must then be num_attention_heads, as transformers reshapes so).
- otherwise: sequential pre-LN blocks, input_layernorm and post_attention_layernorm.

The fused query_key_value (FalconAttention._split_heads) holds its rows in KV groups, (KV, H/KV + 2, D): each
group's H/KV query heads, then its key head, then its value head. That one layout covers all three variants:
multi-query is KV = 1 ([q_0 .. q_{H-1}, k, v]), plain multi-head KV = H ([q_h, k_h, v_h] per head), the new decoder
architecture any KV. Query head g·(H/KV) + j reads KV head g, as redline's GQA does. redline's qkv holds all q rows,
then k, then v, (H·D + 2·KV·D): the rows (and biases) are regrouped on import and back on export.

Refused by name: alibi=true (Falcon-RW): transformers' Falcon adds the ALiBi bias before the scores are scaled, so
each slope is divided by sqrt(head width) (FalconAttention's `(scores + alibi) * inv_norm_factor`, and the same
`alibi / sqrt(head_dim)` in the mask FalconModel builds for SDPA), and build_alibi_tensor rounds every slope ×
position to bfloat16; redline's pos_emb=alibi adds -m_h·(i - j) in fp32, unscaled (BLOOM's and MPT's), a different
function. Also refused: new_decoder_architecture with parallel_attn=false, and parallel_attn with
num_ln_in_parallel_attn=2 outside the new decoder architecture (transformers' layer then builds norms its forward
does not read and fails), multi-head attention with num_kv_heads ≠ num_attention_heads (the same), an activation
other than the GELUs. Export: a redline model whose blocks are Falcon's and which no other architecture takes —
parallel sublayers under two LayerNorms with GQA or multi-query attention, GELU and RoPE (falcon-40b/180B's) — is
written as Falcon (wants_falcon); Falcon models that other architectures take export as those: one norm for parallel
sublayers (falcon-7b, Falcon2-11B) as Phi, sequential blocks as GPT-NeoX or StarCoder2 (docs/import_export.md).
Semantics read from transformers' models/falcon/modeling_falcon.py and configuration_falcon.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, bias_or_zeros, give_head, pad_rows, take_head
from redline.interop.llama import _rope, rope_scaling
from redline.model import ModelConfig

# transformers' get_activation names of the two GELUs redline computes
_GELU = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}
_LAYER = {"attn.proj": "self_attention.dense", "mlp.fc": "mlp.dense_h_to_4h", "mlp.proj": "mlp.dense_4h_to_h"}


def _get(hf: dict, *names: str, default=None):
    """The first of `names` that hf has (the Hub's older configs: n_embed, n_head, n_layer, n_head_kv)."""
    for name in names:
        if hf.get(name) is not None:
            return hf[name]
    return default


def model_config(hf: dict) -> ModelConfig:
    if hf.get("alibi"):
        raise UserError("alibi=true (Falcon-RW): transformers' Falcon divides its ALiBi bias by sqrt(head width) with "
                        "the scores and rounds slope × position to bfloat16, which redline's model.pos_emb=alibi "
                        "(BLOOM's and MPT's unscaled fp32 bias) does not compute; run it in transformers")
    width = _get(hf, "hidden_size", "n_embed")
    heads = _get(hf, "num_attention_heads", "n_head")
    layers = _get(hf, "num_hidden_layers", "n_layer")
    if not (width and heads and layers):
        raise UserError("a Falcon config needs hidden_size, num_attention_heads and num_hidden_layers")
    if width % heads:
        raise UserError(f"hidden_size={width} does not divide by num_attention_heads={heads}: Falcon's heads are "
                        f"hidden_size / num_attention_heads wide")
    act = hf.get("activation", "gelu")
    if act not in _GELU:
        raise UserError(f"activation={act!r}: redline's Falcon MLP computes {', '.join(_GELU)}")
    new = bool(hf.get("new_decoder_architecture", False))
    parallel = bool(hf.get("parallel_attn", True))
    norms = hf.get("num_ln_in_parallel_attn")
    kv_given = _get(hf, "num_kv_heads", "n_head_kv", default=heads)
    if new:
        if not parallel:
            raise UserError("new_decoder_architecture=true with parallel_attn=false: transformers' Falcon layer "
                            "then builds no ln_attn / ln_mlp and fails; set parallel_attn=true")
        kv, shared = kv_given, (norms if norms is not None else 2) == 1
    else:
        if parallel and norms == 2:
            raise UserError("num_ln_in_parallel_attn=2 without new_decoder_architecture: transformers' Falcon layer "
                            "then reads an input_layernorm it never built; set new_decoder_architecture=true")
        if hf.get("multi_query", True):
            kv = 1
        elif kv_given != heads:
            raise UserError(f"num_kv_heads={kv_given} with multi_query=false: Falcon's multi-head attention has as "
                            f"many KV heads as heads ({heads}); set new_decoder_architecture=true for GQA")
        else:
            kv = heads
        shared = parallel
    if heads % kv:
        raise UserError(f"num_kv_heads={kv} does not divide num_attention_heads={heads}")
    bias = bool(hf.get("bias", False))
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=int(hf.get("max_position_embeddings") or 2048), n_layer=layers,
        n_embd=width, n_head=heads, n_kv_head=None if kv == heads else kv, qk_norm=False, fused_qkv=True,
        pos_emb="rope", mlp="gelu", gelu_approximate=_GELU[act],
        mlp_hidden=int(hf.get("ffn_hidden_size") or 4 * width), norm="layernorm",
        norm_eps=float(hf.get("layer_norm_epsilon") or 1e-5), parallel_residual=parallel or new,
        parallel_shared_norm=shared, tie_embeddings=bool(hf.get("tie_word_embeddings", True)), bias=bias,
        qkv_bias=bias, norm_bias=True, **_rope(hf),
    )


def wants_falcon(cfg: ModelConfig) -> bool:
    """A model Falcon is the export for: parallel sublayers under two LayerNorms with GQA or multi-query attention, a
    GELU MLP and RoPE (Falcon's new decoder architecture). GPT-NeoX's parallel blocks with two norms are multi-head;
    one norm for both sublayers goes to Phi (GQA included) or GPT-J, which take it already."""
    return (cfg.pos_emb == "rope" and cfg.parallel_residual and not cfg.parallel_shared_norm
            and cfg.kv_heads != cfg.n_head and cfg.mlp == "gelu" and cfg.norm == "layernorm")


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a parallel-block GQA model with LayerNorm and GELU that Falcon lacks: its
    config written and read back must be the model's again (biases it lacks are written as zeros)."""
    from redline.interop.bloom import check_round_trip

    check_round_trip(cfg, "Falcon", model_config, hf_config, free=("bias", "qkv_bias", "norm_bias"),
                     chosen_by="parallel sublayers under two LayerNorms with GQA and GELU",
                     fix="change it or give the model as many KV heads as heads")


def hf_config(cfg: ModelConfig) -> dict:
    """Falcon's config for cfg: falcon-7b's flavour (new_decoder_architecture false, one norm, multi_query or plain
    multi-head) where it fits, the new decoder architecture for other KV counts or two norms; sequential blocks with
    parallel_attn=false (multi-query or multi-head)."""
    rope = rope_scaling(cfg, "falcon")
    kv, heads = cfg.kv_heads, cfg.n_head
    new = cfg.parallel_residual and (not cfg.parallel_shared_norm or kv not in (1, heads))
    out = {
        "model_type": "falcon", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": heads, "num_kv_heads": kv,
        "new_decoder_architecture": new, "multi_query": kv == 1 and kv != heads,
        "parallel_attn": cfg.parallel_residual, "num_ln_in_parallel_attn": (1 if cfg.parallel_shared_norm else 2)
        if new else None, "alibi": False, "bias": bool(cfg.bias or cfg.has_qkv_bias),
        "ffn_hidden_size": cfg.hidden_dim, "activation": "gelu" if cfg.gelu_approximate == "none"
        else "gelu_pytorch_tanh", "layer_norm_epsilon": cfg.norm_eps, "max_position_embeddings": cfg.context_len,
        "rope_parameters": {**(rope or {"rope_type": "default"}), "rope_theta": cfg.rope_theta},
        # what transformers before 5 reads instead of rope_parameters
        "rope_theta": cfg.rope_theta, "rope_scaling": rope,
        "tie_word_embeddings": cfg.tie_embeddings, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "initializer_range": 0.02, "use_cache": True,
    }
    if not cfg.parallel_residual and kv not in (1, heads):
        raise UserError(f"model.n_kv_head={kv} with sequential blocks: Falcon's sequential blocks are multi-query or "
                        f"multi-head (its GQA is the new decoder architecture's, parallel)")
    return out


def _regroup(t: torch.Tensor, heads: int, kv: int, to_redline: bool) -> torch.Tensor:
    """query_key_value's rows, KV groups of (H/KV queries, key, value) heads of D rows, (KV, H/KV + 2, D), <->
    redline's qkv rows, (H·D queries, KV·D keys, KV·D values); t: the weight (rows, C) or the bias (rows,)."""
    rows, rest = t.shape[0], t.shape[1:]
    G = heads // kv
    D = rows // (heads + 2 * kv)
    if to_redline:
        groups = t.reshape(kv, G + 2, D, *rest)
        parts = [groups[:, :G], groups[:, G:G + 1], groups[:, G + 1:]]  # (KV, G | 1 | 1, D, ...)
        return torch.cat([p.reshape(-1, *rest) for p in parts])
    q, k, v = t.split([heads * D, kv * D, kv * D])
    groups = torch.cat([q.reshape(kv, G, D, *rest), k.reshape(kv, 1, D, *rest), v.reshape(kv, 1, D, *rest)], dim=1)
    return groups.reshape(rows, *rest)


def _norms(cfg: ModelConfig) -> dict:
    """redline's block norms -> Falcon's for cfg's variant."""
    if not cfg.parallel_residual:
        return {"norm1": "input_layernorm", "norm2": "post_attention_layernorm"}
    if cfg.parallel_shared_norm:
        return {"norm1": "input_layernorm"}
    return {"norm1": "ln_attn", "norm2": "ln_mlp"}


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = "transformer." if "transformer.word_embeddings.weight" in src else ""  # "": saved from FalconModel
    out = {"wte.weight": pad_rows(src.take(pre + "word_embeddings.weight"), cfg),
           "norm_f.weight": src.take(pre + "ln_f.weight"), "norm_f.bias": src.take(pre + "ln_f.bias")}
    out.update(take_head(src, cfg))
    kinds = ("weight", "bias") if cfg.bias else ("weight",)
    for i in range(cfg.n_layer):
        p, r = f"{pre}h.{i}.", f"blocks.{i}."
        for kind in kinds:
            out[f"{r}attn.qkv.{kind}"] = _regroup(src.take(f"{p}self_attention.query_key_value.{kind}"), cfg.n_head,
                                                  cfg.kv_heads, to_redline=True)
            for mine, other in _LAYER.items():
                out[f"{r}{mine}.{kind}"] = src.take(f"{p}{other}.{kind}")
        for mine, other in _norms(cfg).items():
            for kind in ("weight", "bias"):
                out[f"{r}{mine}.{kind}"] = src.take(f"{p}{other}.{kind}")
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    V, pre = cfg.vocab_size, "transformer."
    biased = bool(cfg.bias or cfg.has_qkv_bias)  # Falcon's `bias` is on every Linear layer or none

    def layer(ours: str, theirs: str, with_bias: bool) -> dict:
        weight = state[f"{ours}.weight"]
        out = {f"{theirs}.weight": weight}
        if with_bias:
            out[f"{theirs}.bias"] = bias_or_zeros(state, f"{ours}.bias", weight)
        return out

    out = {pre + "word_embeddings.weight": state["wte.weight"][:V], **layer("norm_f", pre + "ln_f", True)}
    out.update(give_head(state, cfg))
    for i in range(cfg.n_layer):
        r, p = f"blocks.{i}.", f"{pre}h.{i}."
        if cfg.fused_qkv:
            qkv = layer(f"{r}attn.qkv", "qkv", True)
        else:  # separate q/k/v layers: their rows stacked, as the fused layer's
            weights = [state[f"{r}attn.{x}.weight"] for x in "qkv"]
            qkv = {"qkv.weight": torch.cat(weights),
                   "qkv.bias": torch.cat([bias_or_zeros(state, f"{r}attn.{x}.bias", w)
                                          for x, w in zip("qkv", weights)])}
        for kind in ("weight", "bias") if biased else ("weight",):
            out[f"{p}self_attention.query_key_value.{kind}"] = _regroup(qkv[f"qkv.{kind}"], cfg.n_head, cfg.kv_heads,
                                                                         to_redline=False)
        for mine, other in _LAYER.items():
            out.update(layer(r + mine, p + other, biased))
        for mine, other in _norms(cfg).items():
            out.update(layer(r + mine, p + other, True))
    return {k: v.contiguous() for k, v in out.items()}


FAMILY = Family(name="falcon", architecture="FalconForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=lambda name: name.endswith("rotary_emb.inv_freq"))
