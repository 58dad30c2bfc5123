"""GGUF files of GLM-4-MoE (GLM-4.5, GLM-4.5-Air, GLM-4.6) as llama.cpp's glm4moe architecture holds them (its
convert_hf_to_gguf.py Glm4MoeModel; its loader llama_model_glm4_moe and src/models/glm4-moe.cpp). gguf_file.py calls
in here for that architecture; the tensors pass through transformers' names (glm.to_hf_for("glm4_moe")), so the map
below is the converter's own from those names (the gguf package's MODEL_TENSORS[GLM4_MOE]).

What the file holds, and how llama.cpp reads it:
- Llama's attention names with q/k/v biases where the model has them and the per-head QK-norm (attn_q_norm /
  attn_k_norm, before RoPE) where it has one; the MLP's norm as post_attention_norm;
- RoPE on the first rope.dimension_count of each head in (first half, second half) pairs (llama.cpp rotates glm4moe
  as NeoX does; transformers' Glm4Moe and redline alike): q/k rows as they are; the scores by head_dim ** -0.5;
- the first leading_dense_block_count layers a SwiGLU feed_forward_length wide; the others the router ffn_gate_inp,
  its routing bias exp_probs_b.bias, the stacked experts ffn_{gate,up}_exps (E, F, C) / ffn_down_exps (E, C, F),
  expert_shared_count shared experts (ffn_*_shexp, added ungated); sigmoid scores (expert_gating_func),
  expert_weights_norm and expert_weights_scale;
- nextn_predict_layers: the multi-token-prediction layers after the last, which llama.cpp loads and does not run;
  redline writes none (0) and leaves a file's out on import, as transformers leaves them out.
Refused by name: expert groups (n_group > 1: llama.cpp's glm4moe reads no group keys and routes over all experts).
"""

from __future__ import annotations

import re

from redline.errors import UserError
from redline.interop.gguf_deepseek2 import MLP_NAMES, file_experts, map_file_tensors, write_expert_metadata
from redline.model import ModelConfig

ARCH = "glm4moe"
_BLOCK = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
          "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
          "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
          "self_attn.k_norm.weight": "attn_k_norm.weight", **MLP_NAMES}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def check(cfg: ModelConfig) -> None:
    """A UserError for a GLM-4-MoE model llama.cpp's glm4moe would run as another."""
    if cfg.moe_groups > 1:
        raise UserError(f"model.moe_groups={cfg.moe_groups}: llama.cpp's glm4moe reads no expert groups and routes "
                        f"over all experts; export with --format hf")


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for Glm4MoeModel past the common ones."""
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_rope_dimension_count(cfg.rope_dims or cfg.head_dim)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    write_expert_metadata(writer, gguf, cfg)  # (sigmoid scores: GLM-4-MoE's, export_family has checked)
    writer.add_nextn_predict_layers(0)


def feed_forward_length(cfg: ModelConfig) -> int:
    return cfg.moe_dense_hidden or cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout (gguf_deepseek2.file_experts for the experts)."""
    from redline.interop.glm import to_hf_for

    out = {}
    for name, t in to_hf_for("glm4_moe")(state, cfg).items():
        if m := re.match(r"model\.layers\.(\d+)\.(.+)$", name):
            if m[2].startswith("mlp.experts.") or m[2] == "mlp.gate.e_score_correction_bias":
                continue
            out[f"blk.{m[1]}.{_BLOCK[m[2]]}"] = t
        else:
            out[_TOP[name]] = t
    return {**out, **file_experts(state, cfg)}


def hf_config(key, vocab: int, tensor_names: set[str]) -> dict:
    """A glm4_moe config.json for a glm4moe GGUF, from the keys llama.cpp's loader reads."""
    if key("rope.scaling.type") not in (None, "none") or key("rope.dimension_sections"):
        raise UserError("the GGUF's glm4moe file scales its RoPE or gives multimodal RoPE sections, which GLM-4-MoE "
                        "text models do not have; import the model's Hugging Face folder")
    if key("expert_gating_func") not in (None, 2):
        raise UserError(f"the GGUF's glm4moe expert_gating_func is {key('expert_gating_func')}, not 2 (sigmoid): "
                        f"GLM-4-MoE's router scores by sigmoid")
    width, heads = key("embedding_length"), key("attention.head_count")
    head_dim = int(key("attention.key_length") or width // heads)
    n = int(key("block_count")) - int(key("nextn_predict_layers", 0))
    return {
        "model_type": "glm4_moe", "vocab_size": vocab, "hidden_size": width,
        "intermediate_size": key("feed_forward_length"), "moe_intermediate_size": key("expert_feed_forward_length"),
        "num_hidden_layers": n, "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv") or heads, "head_dim": head_dim, "hidden_act": "silu",
        "max_position_embeddings": key("context_length", 131072),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-5),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "use_qk_norm": "blk.0.attn_q_norm.weight" in tensor_names,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(key("rope.freq_base", 10000.0)),
                            "partial_rotary_factor": int(key("rope.dimension_count", head_dim)) / head_dim},
        "n_routed_experts": key("expert_count"), "num_experts_per_tok": key("expert_used_count"),
        "n_shared_experts": int(key("expert_shared_count") or 1),
        "first_k_dense_replace": int(key("leading_dense_block_count", 0)),
        "routed_scaling_factor": float(key("expert_weights_scale") or 1.0),
        "norm_topk_prob": bool(key("expert_weights_norm", False)), "n_group": 1, "topk_group": 1,
    }


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of a glm4moe file's tensors: the stacked experts as mlp.experts.gate_up_proj
    (E, 2F, C) / down_proj (E, C, F); the multi-token-prediction layers past the last left out. A name outside the
    map is a UserError."""
    names = map_file_tensors(file_names, read_file, _BLOCK, _TOP, ARCH, layers=config["num_hidden_layers"])
    return set(names), lambda name: names[name]()
