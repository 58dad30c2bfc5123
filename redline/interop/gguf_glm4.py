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

import re

from redline.errors import UserError
from redline.model import ModelConfig

ARCH = "glm4"
_BLOCK = {"input_layernorm.weight": "attn_norm.weight", "post_self_attn_layernorm.weight": "post_attention_norm.weight",
          "post_attention_layernorm.weight": "ffn_norm.weight", "post_mlp_layernorm.weight": "post_ffw_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
          "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
          "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def check(cfg: ModelConfig) -> None:
    """Nothing past glm.check_glm4_exportable (export_family): llama.cpp's glm4 computes every GLM-4 redline
    exports (no RoPE scaling, no QK-norm, sandwich norms, partial interleaved RoPE)."""


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for Glm4Model past the common ones."""
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_rope_dimension_count(cfg.rope_dims or cfg.head_dim)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)


def feed_forward_length(cfg: ModelConfig) -> int:
    return cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout."""
    from redline.interop.glm import to_hf_for

    out = {}
    for name, t in to_hf_for("glm4")(state, cfg).items():
        if m := re.match(r"model\.layers\.(\d+)\.(.+)$", name):
            out[f"blk.{m[1]}.{_BLOCK[m[2]]}"] = t
        else:
            out[_TOP[name]] = t
    return out


def hf_config(key, vocab: int, tensor_names: set[str]) -> dict:
    """A glm4 config.json for a glm4 GGUF, from the keys llama.cpp's loader reads."""
    if key("rope.dimension_sections") or key("rope.scaling.type") not in (None, "none"):
        raise UserError("the GGUF's glm4 file gives multimodal RoPE sections or scales its RoPE, which GLM-4's text "
                        "model does not have; import the model's Hugging Face folder")
    width, heads = key("embedding_length"), key("attention.head_count")
    head_dim = int(key("attention.key_length") or width // heads)
    return {
        "model_type": "glm4", "vocab_size": vocab, "hidden_size": width, "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": int(key("block_count")) - int(key("nextn_predict_layers", 0)),
        "num_attention_heads": heads, "num_key_value_heads": key("attention.head_count_kv") or heads,
        "head_dim": head_dim, "hidden_act": "silu", "max_position_embeddings": key("context_length", 131072),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-5),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(key("rope.freq_base", 10000.0)),
                            "partial_rotary_factor": int(key("rope.dimension_count", head_dim)) / head_dim},
    }


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of a glm4 file's tensors; the multi-token-prediction layers past the last left
    out. A name outside the map is a UserError."""
    from redline.interop.gguf_deepseek2 import map_file_tensors

    names = map_file_tensors(file_names, read_file, _BLOCK, _TOP, ARCH, layers=config["num_hidden_layers"])
    return set(names), lambda name: names[name]()
