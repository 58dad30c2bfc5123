"""Qwen3-Next (Qwen3NextForCausalLM, model_type "qwen3_next": Qwen3-Next-80B-A3B): Qwen3.5's hybrid (qwen3_5.py: gated
delta nets, full attention whose q_proj holds each head's queries then its output gate, norms by 1 + weight) with
Qwen3.5-MoE's experts and shared expert, and two differences of layout:

- a delta net's input projections are two tensors, each grouped by key head: in_proj_qkvz (Hk groups of [q (Dk),
  k (Dk), v (r·Dv), z (r·Dv)] rows, r = value heads per key head) and in_proj_ba (Hk groups of [b (r), a (r)]);
  transformers' fix_query_key_value_ordering takes them apart into the q, k, v, z, b, a that Qwen3.5 projects one
  by one, the convolution then running over [all q; all k; all v] as Qwen3.5's does. Imports regroup the rows into
  redline's in_proj ([q; k; v]), z, b and a; exports group them again;
- layer i has a dense SwiGLU MLP (intermediate_size wide, mlp.gate_proj / up_proj / down_proj) where it is in
  mlp_only_layers or (i + 1) is not a multiple of decoder_sparse_step, experts otherwise, whose top k are rescaled
  where norm_topk_prob says (default true). redline's mixtures have their dense layers first (moe_dense_layers,
  moe_dense_hidden): other layouts are refused by name. A config with num_experts 0 is dense throughout.
Semantics read from transformers' models/qwen3_next/modular_qwen3_next.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import torch

from redline.errors import UserError
from redline.interop import qwen3_5
from redline.interop.families import Family, TensorSource
from redline.model import ModelConfig


def model_config(hf: dict) -> ModelConfig:
    experts = int(hf.get("num_experts") or 0)
    if not experts:
        return qwen3_5.hybrid_config(hf, {"mlp_hidden": int(hf["intermediate_size"])})
    step = int(hf.get("decoder_sparse_step") or 1)
    only = sorted(hf.get("mlp_only_layers") or [])
    if step < 1:
        raise UserError(f"decoder_sparse_step={step}: Qwen3-Next puts experts on every decoder_sparse_step-th layer, "
                        f"a step of 1 or more")
    dense = [i for i in range(hf["num_hidden_layers"]) if i in only or (i + 1) % step]
    if dense != list(range(len(dense))):
        raise UserError(f"decoder_sparse_step={step} / mlp_only_layers={only}: dense MLPs on layers {dense}; "
                        f"redline's mixtures of experts have their dense layers first (model.moe_dense_layers)")
    fields = {**qwen3_5.shared_expert_fields(hf), "moe_norm_topk": bool(hf.get("norm_topk_prob", True))}
    if dense:
        fields.update(moe_dense_layers=len(dense), moe_dense_hidden=int(hf["intermediate_size"]))
    return qwen3_5.hybrid_config(hf, fields)


def hf_config(cfg: ModelConfig) -> dict:
    out = {**qwen3_5.hf_config(cfg), "model_type": "qwen3_next",
           "intermediate_size": cfg.moe_dense_hidden or cfg.hidden_dim}  # the dense layers' width
    if not cfg.moe_experts:
        return {**out, "num_experts": 0}
    return {**out, **qwen3_5.expert_config(cfg), "norm_topk_prob": cfg.moe_norm_topk, "decoder_sparse_step": 1,
            "mlp_only_layers": list(range(cfg.moe_dense_layers))}


def _widths(cfg: ModelConfig) -> tuple[int, int, int, int]:
    """(key heads Hk, Dk, Dv, value heads per key head r)."""
    return cfg.delta_key_heads, cfg.delta_key_dim, cfg.delta_value_dim, cfg.delta_heads // cfg.delta_key_heads


def take_delta_projections(src: TensorSource, d: str, cfg: ModelConfig) -> dict:
    """in_proj_qkvz (Hk·(2·Dk + 2·r·Dv), C) and in_proj_ba (Hk·2r, C), grouped by key head -> redline's
    attn.in_proj ([all q; all k; all v]), attn.z, attn.b and attn.a, value heads in the order g·r + j (key head g's
    j-th)."""
    Hk, Dk, Dv, r = _widths(cfg)
    qkvz = src.take(d + "in_proj_qkvz.weight")
    C = qkvz.shape[-1]
    q, k, v, z = qkvz.view(Hk, -1, C).split([Dk, Dk, r * Dv, r * Dv], dim=1)  # (Hk, rows, C) each
    b, a = src.take(d + "in_proj_ba.weight").view(Hk, 2 * r, C).split([r, r], dim=1)
    return {"attn.in_proj": torch.cat([q.reshape(-1, C), k.reshape(-1, C), v.reshape(-1, C)]),
            "attn.z": z.reshape(-1, C), "attn.b": b.reshape(-1, C), "attn.a": a.reshape(-1, C)}


def give_delta_projections(weights: Mapping[str, torch.Tensor], d: str, cfg: ModelConfig) -> dict:
    """take_delta_projections' inverse: redline's four projections grouped by key head again."""
    Hk, Dk, Dv, r = _widths(cfg)
    q, k, v = weights["attn.in_proj"].split([Hk * Dk, Hk * Dk, Hk * r * Dv])
    C = q.shape[-1]
    qkvz = torch.cat([q.view(Hk, Dk, C), k.view(Hk, Dk, C), v.view(Hk, r * Dv, C),
                      weights["attn.z"].view(Hk, r * Dv, C)], dim=1)
    ba = torch.cat([weights["attn.b"].view(Hk, r, C), weights["attn.a"].view(Hk, r, C)], dim=1)
    return {d + "in_proj_qkvz.weight": qkvz.reshape(-1, C), d + "in_proj_ba.weight": ba.reshape(-1, C)}


FAMILY = Family(name="qwen3_next", architecture="Qwen3NextForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=partial(qwen3_5.to_redline, take_projections=take_delta_projections),
                to_hf=partial(qwen3_5.to_hf, give_projections=give_delta_projections), ignorable=qwen3_5.ignorable)
