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

from redline.errors import UserError
from redline.interop.gguf_deepseek2 import MLP_NAMES, expert_config, write_expert_metadata
from redline.interop.gguf_named import (ATTENTION_NAMES, QK_NORM_NAMES, QKV_BIAS_NAMES, TOP_NAMES, expert_tensor,
                                        file_experts, in_file_names, map_file_tensors, source,
                                        text_config, write_attention_metadata)
from redline.model import ModelConfig

ARCH = "glm4moe"
_BLOCK = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
          **ATTENTION_NAMES, **QKV_BIAS_NAMES, **QK_NORM_NAMES, **MLP_NAMES}


def check(cfg: ModelConfig) -> None:
    """A UserError for a GLM-4-MoE model llama.cpp's glm4moe would run as another."""
    if cfg.moe_groups > 1:
        raise UserError(f"model.moe_groups={cfg.moe_groups}: llama.cpp's glm4moe reads no expert groups and routes "
                        f"over all experts; export with --format hf")


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for Glm4MoeModel past the common ones."""
    write_attention_metadata(writer, cfg, cfg.rope_dims)
    write_expert_metadata(writer, gguf, cfg)  # (sigmoid scores: GLM-4-MoE's, export_family has checked)
    writer.add_nextn_predict_layers(0)


def feed_forward_length(cfg: ModelConfig) -> int:
    return cfg.moe_dense_hidden or cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout (gguf_named.file_experts for the experts)."""
    from redline.interop.glm import to_hf_for

    return {**in_file_names(to_hf_for("glm4_moe")(state, cfg), _BLOCK, skip=expert_tensor), **file_experts(state, cfg)}


def hf_config(key, vocab: int, tensor_names: set[str]) -> dict:
    """A glm4_moe config.json for a glm4moe GGUF, from the keys llama.cpp's loader reads."""
    if key("rope.scaling.type") not in (None, "none") or key("rope.dimension_sections"):
        raise UserError("the GGUF's glm4moe file scales its RoPE or gives multimodal RoPE sections, which GLM-4-MoE "
                        "text models do not have; import the model's Hugging Face folder")
    if key("expert_gating_func") not in (None, 2):
        raise UserError(f"the GGUF's glm4moe expert_gating_func is {key('expert_gating_func')}, not 2 (sigmoid): "
                        f"GLM-4-MoE's router scores by sigmoid")
    config = text_config(key, vocab, tensor_names, "glm4_moe", 131072)
    head_dim = config["head_dim"]
    return {
        **config, "num_hidden_layers": config["num_hidden_layers"] - int(key("nextn_predict_layers", 0)),
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "use_qk_norm": "blk.0.attn_q_norm.weight" in tensor_names,
        "rope_parameters": {**config["rope_parameters"],
                            "partial_rotary_factor": int(key("rope.dimension_count", head_dim)) / head_dim},
        **expert_config(key), "first_k_dense_replace": int(key("leading_dense_block_count", 0)), "n_group": 1,
        "topk_group": 1,
    }


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of a glm4moe file's tensors: the stacked experts as mlp.experts.gate_up_proj
    (E, 2F, C) / down_proj (E, C, F); the multi-token-prediction layers past the last left out. A name outside the
    map is a UserError."""
    return source(map_file_tensors(file_names, read_file, _BLOCK, TOP_NAMES, ARCH, layers=config["num_hidden_layers"]))
