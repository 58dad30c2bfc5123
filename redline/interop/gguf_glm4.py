"""GGUF files of GLM-4 (GLM-4-9B-0414, GLM-Z1: Glm4ForCausalLM) as llama.cpp's glm4 architecture holds them (its
convert_hf_to_gguf.py Glm4Model; its loader llama_model_glm4 and src/models/glm4.cpp). gguf_file.py calls in here for
that architecture; the tensors pass through transformers' names (glm.to_hf_for("glm4")), so the map below is the
converter's own from those names (the gguf package's MODEL_TENSORS[GLM4]).

What the file holds, and how llama.cpp's graph reads it:
- the sandwich norms: attn_norm before attention, post_attention_norm on its output, ffn_norm before the MLP,
  post_ffw_norm on its output (transformers' input_layernorm, post_self_attn_layernorm, post_attention_layernorm,
  post_mlp_layernorm), each a plain RMSNorm weight;
- q/k/v with their biases where the model has them, o without; q/k rows as transformers holds them: RoPE on the first
  rope.dimension_count dimensions of each head in interleaved pairs, which llama.cpp rotates so (its NORM RoPE for
  glm4 without multimodal sections), the frequencies counted over those dimensions as transformers counts them;
  scores by head_dim ** -0.5;
- the MLP's fused gate_up_proj as ffn_up (2F, C), gate rows first (llama.cpp's SwiGLU takes the first half through
  SiLU), and ffn_down;
- nextn_predict_layers: multi-token-prediction layers after the last (GLM-OCR's), which llama.cpp loads and does not
  run; redline writes none and leaves a file's out on import.
Read back refused by name: multimodal RoPE sections (GLM-4V's) and RoPE scaling, which redline's GLM-4 has not.
"""

from __future__ import annotations

from redline.errors import UserError
from redline.interop.gguf_named import (ATTENTION_NAMES, QKV_BIAS_NAMES, TOP_NAMES, in_file_names, map_file_tensors,
                                        source, text_config, write_attention_metadata)
from redline.model import ModelConfig

ARCH = "glm4"
_BLOCK = {"input_layernorm.weight": "attn_norm.weight", "post_self_attn_layernorm.weight": "post_attention_norm.weight",
          "post_attention_layernorm.weight": "ffn_norm.weight", "post_mlp_layernorm.weight": "post_ffw_norm.weight",
          **ATTENTION_NAMES, **QKV_BIAS_NAMES, "mlp.gate_up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight"}


def check(cfg: ModelConfig) -> None:
    """Nothing past glm.check_glm4_exportable (export_family): llama.cpp's glm4 computes every GLM-4 redline
    exports (no RoPE scaling, no QK-norm, sandwich norms, partial interleaved RoPE)."""


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for Glm4Model past the common ones."""
    write_attention_metadata(writer, cfg, cfg.rope_dims)


def feed_forward_length(cfg: ModelConfig) -> int:
    return cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout."""
    from redline.interop.glm import to_hf_for

    return in_file_names(to_hf_for("glm4")(state, cfg), _BLOCK)


def hf_config(key, vocab: int, tensor_names: set[str]) -> dict:
    """A glm4 config.json for a glm4 GGUF, from the keys llama.cpp's loader reads."""
    if key("rope.dimension_sections") or key("rope.scaling.type") not in (None, "none"):
        raise UserError("the GGUF's glm4 file gives multimodal RoPE sections or scales its RoPE, which GLM-4's text "
                        "model does not have; import the model's Hugging Face folder")
    config = text_config(key, vocab, tensor_names, "glm4", 131072)
    head_dim = config["head_dim"]
    return {
        **config, "num_hidden_layers": config["num_hidden_layers"] - int(key("nextn_predict_layers", 0)),
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "rope_parameters": {**config["rope_parameters"],
                            "partial_rotary_factor": int(key("rope.dimension_count", head_dim)) / head_dim},
    }


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of a glm4 file's tensors; the multi-token-prediction layers past the last left
    out. A name outside the map is a UserError."""
    return source(map_file_tensors(file_names, read_file, _BLOCK, TOP_NAMES, ARCH, layers=config["num_hidden_layers"]))
