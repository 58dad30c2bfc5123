"""Aria's text model (AriaTextForCausalLM, model_type "aria_text"; its multimodal AriaForConditionalGeneration, "aria":
rhymes-ai/Aria): Llama's attention and names with a mixture of experts as every layer's MLP, as transformers'
AriaTextMoELayer computes it:
- a router (mlp.router.weight, (E, C)) choosing moe_topk of moe_num_experts SiLU-gated experts by their logits, each
  weighted by the softmax over the chosen logits: the top k of the softmax rescaled to sum to 1 (moe_norm_topk);
- the experts stacked transposed, as grouped GEMMs read them: mlp.experts.gate_up_proj (E, C, 2F), columns [gate | up],
  and mlp.experts.down_proj (E, F, C), which the Hub's folders (and save_pretrained) name experts.fc1.weight and
  experts.fc2.weight, renamed by transformers on loading;
- moe_num_shared_experts SwiGLU experts fused into one shared MLP (mlp.shared_experts.*, moe_num_shared_experts x
  intermediate_size wide) that every token passes, its output added ungated (moe_shared_hidden, moe_shared_gate
  false).
That is GraniteMoeShared's mixture without Granite's scalars, where such a model exports (moe.export_name); written as
its own family it loads as AriaTextForCausalLM. The multimodal folder's text model is read by multimodal.py, its
Idefics3 vision tower and cross-attention projector left unread. Semantics read from transformers'
models/aria/modular_aria.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop import llama
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig

# AriaTextConfig's defaults for the fields redline reads, which transformers fills in where a config leaves them out
_DEFAULTS = dict(vocab_size=32_000, hidden_size=4096, intermediate_size=4096, num_hidden_layers=32,
                 num_attention_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 moe_num_experts=8, moe_topk=2, moe_num_shared_experts=2)
_STACKED = {"experts.gate_up_proj": "experts.fc1.weight", "experts.down_proj": "experts.fc2.weight"}


def model_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **hf}
    llama.check_silu(hf)
    raise_first([
        (bool(hf.get("attention_bias")), "attention_bias=true: Aria then has q/k/v/o biases beside experts without "
                                         "any, a mix redline does not have"),
        (bool(hf.get("mlp_bias")), "mlp_bias=true: Aria's shared experts then have biases its routed experts lack, "
                                   "which redline's mixtures of experts do not have"),
        (not hf["moe_num_shared_experts"], "moe_num_shared_experts=0: Aria then keeps an empty shared MLP, which "
                                           "redline does not read (give the folder's layers a shared expert)"),
    ])
    width = int(hf["intermediate_size"])
    return ModelConfig(
        **{**llama.shape_fields(hf), "mlp_hidden": width}, fused_qkv=True, pos_emb="rope", mlp="swiglu",
        fused_mlp=True, norm="rmsnorm", norm_eps=float(hf["rms_norm_eps"]),
        tie_embeddings=bool(hf["tie_word_embeddings"]), bias=False,
        moe_experts=int(hf["moe_num_experts"]), moe_top_k=int(hf["moe_topk"]), moe_norm_topk=True,
        moe_shared_hidden=int(hf["moe_num_shared_experts"]) * width, moe_shared_gate=False, **llama._rope(hf))


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    """Aria's names -> the ones moe.experts_to_redline reads (Qwen2-MoE's router and shared expert, experts stacked
    (E, 2F, C) and (E, C, F)), each stacked tensor transposed on reading."""
    theirs, transposed = {}, set()
    for name in src.names:
        ours = name.replace(".mlp.router.", ".mlp.gate.").replace(".mlp.shared_experts.", ".mlp.shared_expert.")
        for new, old in _STACKED.items():
            if ours.endswith(f".mlp.{old}") or ours.endswith(f".mlp.{new}"):
                ours = ours[:ours.rindex(".mlp.") + 5] + new
                transposed.add(ours)
        theirs[ours] = name

    def read(name: str) -> torch.Tensor:
        t = src.take(theirs[name])
        return t.transpose(1, 2) if name in transposed else t

    return llama.to_redline(TensorSource(theirs, read, src.where), cfg)


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming what Aria's text model lacks: GraniteMoeShared's options without Granite's scalars, a shared
    MLP a whole number of experts wide."""
    from redline.interop.granite import check_moe_exportable

    check_moe_exportable(cfg)
    raise_first([
        (cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.attn_scale,
         "Granite's scalars: Aria has none"),
        (not cfg.moe_shared_hidden or cfg.moe_shared_hidden % cfg.hidden_dim,
         f"model.moe_shared_hidden={cfg.moe_shared_hidden}: Aria's shared MLP is a whole number of experts wide "
         f"({cfg.hidden_dim} each)"),
        (cfg.head_size not in (None, cfg.n_embd // cfg.n_head), "model.head_size apart from n_embd / n_head: "
                                                                  "AriaTextConfig requires n_embd / n_head wide heads"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    out = llama.llama_shaped_hf_config(cfg, "aria_text")
    rope = {"rope_type": "default", "rope_theta": out.pop("rope_theta"), **(out.pop("rope_scaling") or {})}
    return {**out, "rope_parameters": rope, "moe_num_experts": cfg.moe_experts, "moe_topk": cfg.moe_top_k,
            "moe_num_shared_experts": cfg.moe_shared_hidden // cfg.hidden_dim, "attention_bias": False,
            "mlp_bias": False}


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = {name: t for name, t in llama.to_hf(state, cfg, "qwen2_moe").items() if ".mlp." not in name}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.mlp.", f"blocks.{i}.mlp."
        out[p + "router.weight"] = state[r + "router.weight"]
        # the stacked experts under the names transformers' save_pretrained writes (and the Hub's folders hold)
        out[p + _STACKED["experts.gate_up_proj"]] = state[r + "fc"].transpose(1, 2).contiguous()  # (E, C, 2F)
        out[p + _STACKED["experts.down_proj"]] = state[r + "proj"].transpose(1, 2).contiguous()  # (E, F, C)
        gate, up = state[r + "shared.fc.weight"].chunk(2)
        out[p + "shared_experts.gate_proj.weight"], out[p + "shared_experts.up_proj.weight"] = gate, up
        out[p + "shared_experts.down_proj.weight"] = state[r + "shared.proj.weight"]
    return out


FAMILY = Family(name="aria_text", architecture="AriaTextForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=llama._ignorable)
