"""MiniMax-M3's text model (MiniMaxM3VLForCausalLM, model_type "minimax_m3_vl_text"; its multimodal
MiniMaxM3SparseForConditionalGeneration, "minimax_m3_vl", read by multimodal.py), as transformers'
models/minimax_m3_vl/modular_minimax_m3_vl.py computes it:
- Mixtral's pre-norm block with Gemma's RMSNorms (x · (1 + weight): model.norm_unit_offset) on the block, the final
  norm and a per-head QK-norm before RoPE (q_norm, k_norm (D,));
- RoPE on the first partial_rotary_factor of each head (rope_parameters; the whole head where it gives none: rotary_dim
  is not read by transformers), in (first half, second half) pairs as redline's (model.rope_dims);
- GPT-OSS's clamped SwiGLU ((up + 1) · gate · sigmoid(1.702 · gate), gate clamped above at swiglu_limit, up to
  ±swiglu_limit: model.mlp=swiglu_clamped) in every MLP: dense layers (mlp_layer_types "dense",
  dense_intermediate_size wide), the experts and the shared expert;
- experts chosen as MiniMax-M2's (sigmoid scores plus e_score_correction_bias choose, the chosen sigmoid scores divided
  by their sum), times routed_scaling_factor (model.moe_scale), beside an ungated shared expert
  (shared_intermediate_size);
- "minimax_m3_sparse" layers attend through a lightning indexer to the index_topk_blocks best blocks of
  index_block_size keys (with the index_local_blocks before the query always kept): within index_topk_blocks x
  index_block_size tokens every block is kept, the attention dense, so such a model is read with that context
  (context_len) and its indexer weights left unread, as deepseek_kin.py reads DeepSeek-V3.2's.
Tensor names: transformers' in-memory ones (mlp.gate_up_proj, mlp.experts.gate_up_proj (E, 2F, C) rows [gate; up],
mlp.gate.e_score_correction_bias, mlp.shared_experts.gate_up_proj), as MiniMaxM3VLForCausalLM saves them, and the Hub's
(mlp.gate_proj / up_proj, block_sparse_moe.experts.j.w1 / w3 / w2, block_sparse_moe.e_score_correction_bias,
block_sparse_moe.shared_experts.*), as the multimodal model saves them. Import only: no architecture redline exports to
has Gemma's norms with these experts (export_family names the option).
"""

from __future__ import annotations

import torch

from redline.errors import UserError
from redline.interop import llama
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig

# MiniMaxM3VLTextConfig's defaults for the fields redline reads, which transformers fills in where a config leaves
# them out
_DEFAULTS = dict(vocab_size=200_064, hidden_size=6144, intermediate_size=3072, dense_intermediate_size=12_288,
                 shared_intermediate_size=3072, num_hidden_layers=60, num_attention_heads=64, num_key_value_heads=4,
                 head_dim=128, max_position_embeddings=524_288, rms_norm_eps=1e-6, num_local_experts=128,
                 num_experts_per_tok=4, routed_scaling_factor=2.0, swiglu_alpha=1.702, swiglu_limit=7.0,
                 index_block_size=128, index_topk_blocks=16, tie_word_embeddings=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0})


def _dense_placement(hf: dict, n: int) -> dict:
    """ModelConfig's dense-layer fields from mlp_layer_types: the first k dense (moe_dense_layers, their own width),
    or dense layers anywhere as wide as the experts (moe_layers)."""
    kinds = hf.get("mlp_layer_types") or ["sparse"] * n
    if len(kinds) != n or not set(kinds) <= {"dense", "sparse"}:
        raise UserError(f"mlp_layer_types {kinds}: expected {n} entries of dense / sparse")
    dense = [i for i, kind in enumerate(kinds) if kind == "dense"]
    width, dense_width = int(hf["intermediate_size"]), int(hf["dense_intermediate_size"])
    if dense == list(range(len(dense))):
        return dict(moe_dense_layers=len(dense), moe_dense_hidden=dense_width if dense and dense_width != width
                    else None)
    if dense_width == width:
        return dict(moe_layers=tuple(i for i, kind in enumerate(kinds) if kind == "sparse"))
    raise UserError(f"mlp_layer_types={kinds} with dense_intermediate_size={dense_width} != intermediate_size="
                    f"{width}: redline's dense layers among the expert layers are as wide as the experts")


def model_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **hf}
    n = hf["num_hidden_layers"]
    raise_first([
        (float(hf["swiglu_alpha"]) != 1.702, f"swiglu_alpha={hf['swiglu_alpha']}: redline's clamped SwiGLU has "
                                             f"GPT-OSS's 1.702"),
        (bool(hf.get("output_router_logits")), "output_router_logits=true: transformers' load-balancing loss "
                                               "softmaxes the router logits; redline's is over the sigmoid scores"),
        (bool(hf.get("router_jitter_noise")), f"router_jitter_noise={hf.get('router_jitter_noise')}: noise on the "
                                              f"experts' input in training, which redline does not add"),
        (bool(hf.get("attention_bias")), "attention_bias=true: MiniMax-M3's attention then has biases its experts "
                                         "lack, a mix redline does not have"),
        (not hf["shared_intermediate_size"], "shared_intermediate_size=0: MiniMax-M3 then keeps an empty shared "
                                             "expert, which redline does not read"),
    ])
    kinds = hf.get("layer_types") or ["full_attention"] * n
    if len(kinds) != n or not set(kinds) <= {"full_attention", "minimax_m3_sparse"}:
        raise UserError(f"layer_types {kinds}: expected {n} entries of full_attention / minimax_m3_sparse")
    context = int(hf["max_position_embeddings"])
    if "minimax_m3_sparse" in kinds:  # every key block kept up to here: dense attention
        context = min(context, int(hf["index_topk_blocks"]) * int(hf["index_block_size"]))
    head_dim = int(hf["head_dim"] or hf["hidden_size"] // hf["num_attention_heads"])
    factor = float((hf.get("rope_parameters") or {}).get("partial_rotary_factor") or 1.0)
    rotated = int(head_dim * factor)
    return ModelConfig(
        **{**llama.shape_fields(hf), "context_len": context, "mlp_hidden": int(hf["intermediate_size"])},
        qk_norm=True, fused_qkv=True, pos_emb="rope", rope_dims=rotated if rotated != head_dim else 0,
        mlp="swiglu_clamped", swiglu_limit=float(hf["swiglu_limit"]), fused_mlp=True, norm="rmsnorm",
        norm_unit_offset=True, norm_eps=float(hf["rms_norm_eps"]), tie_embeddings=bool(hf["tie_word_embeddings"]),
        bias=False, moe_experts=int(hf["num_local_experts"]), moe_top_k=int(hf["num_experts_per_tok"]),
        moe_gating="sigmoid", moe_expert_bias=True, moe_norm_topk=True, moe_norm_eps=0.0,
        moe_scale=float(hf["routed_scaling_factor"]), moe_shared_hidden=int(hf["shared_intermediate_size"]),
        moe_shared_gate=False, **_dense_placement(hf, n), **llama._rope(hf))


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    """Both namings -> the ones llama.to_redline and moe.experts_to_redline read (Qwen2-MoE's, or Mixtral's for the
    Hub's block_sparse_moe), fused gate_up_proj Linear layers split into gate_proj and up_proj on reading."""
    view: dict[str, tuple[str, int | None]] = {}  # our name -> (theirs, half of a fused [gate; up] or None)
    for name in src.names:
        ours, half = name, None
        for moe in (".mlp.", ".block_sparse_moe."):
            if f"{moe}shared_experts." in name:  # the shared expert: Qwen2-MoE's name for it
                ours = name.replace(f"{moe}shared_experts.", ".mlp.shared_expert.")
        if ours.endswith(".mlp.gate.e_score_correction_bias"):
            ours = ours.replace(".mlp.gate.e_score_correction_bias", ".mlp.expert_bias")
        elif ours.endswith(".block_sparse_moe.e_score_correction_bias"):
            ours = ours.replace(".e_score_correction_bias", ".expert_bias")
        if ours.endswith("gate_up_proj.weight"):  # a fused Linear (E-less): rows [gate; up]
            for i, part in enumerate(("gate_proj", "up_proj")):
                view[ours.replace("gate_up_proj", part)] = (name, i)
            continue
        view[ours] = (name, half)

    def read(name: str) -> torch.Tensor:
        theirs, half = view[name]
        t = src.take(theirs)
        return t if half is None else t.chunk(2)[half]

    return llama.to_redline(TensorSource(view, read, src.where), cfg)


def ignorable(name: str) -> bool:
    """The sparse layers' indexer (selection alone, all blocks kept within the context read) and the multi-token
    prediction layers transformers leaves unread."""
    return (llama._ignorable(name) or ".self_attn.indexer." in name or ".self_attn.index_" in name
            or name.startswith(("mtp.", "model.mtp.")))


def _not_written(cfg: ModelConfig) -> dict:
    raise UserError("MiniMax-M3 is imported only: redline writes no MiniMaxM3VLForCausalLM folder")


FAMILY = Family(name="minimax_m3_vl_text", architecture="MiniMaxM3VLForCausalLM", model_config=model_config,
                hf_config=_not_written, to_redline=to_redline, to_hf=lambda state, cfg: _not_written(cfg),
                ignorable=ignorable)
