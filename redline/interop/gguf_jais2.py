"""GGUF files of Jais 2 (Inception's Jais2ForCausalLM) as llama.cpp's jais2 architecture holds them (its
convert_hf_to_gguf.py Jais2Model, a plain TextModel; its loader and graph src/models/jais2.cpp). gguf_file.py calls in
here for that architecture; the tensors pass through transformers' names (llama.jais2_to_hf), so the map below is the
converter's own from those names (the gguf package's MODEL_TENSORS[JAIS2]).

What the file holds, and how llama.cpp's graph reads it:
- LayerNorms with their biases (attn_norm, ffn_norm, output_norm: weight and bias) at attention.layer_norm_epsilon;
- q/k/v/o with biases, q/k rows as transformers holds them (llama.cpp rotates jais2 as NeoX does), whole heads
  rotated, scores by head_dim ** -0.5;
- the ungated MLP ffn_down(relu(ffn_up(x))²) with both biases.
llama.cpp's loader requires every one of those biases and sizes each attention bias n_embd wide, so only a model with
biases, as many KV heads as heads and heads n_embd / n_head wide loads there: the others are refused by name, as is
RoPE scaling.
"""

from __future__ import annotations

from redline.interop.gguf_named import (TOP_NAMES, in_file_names, map_file_tensors, refuse, refuse_rope_scaling, source,
                                        text_config)
from redline.model import ModelConfig

ARCH = "jais2"
_BLOCK = {f"{theirs}.{kind}": f"{ours}.{kind}" for kind in ("weight", "bias") for theirs, ours in (
    ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"), ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"),
    ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down"))}
_TOP = {**TOP_NAMES, "model.norm.bias": "output_norm.bias"}


def check(cfg: ModelConfig) -> None:
    """A UserError for a Jais 2 model llama.cpp's jais2 would not load (llama.check_jais2_exportable, through
    export_family, has refused what Jais 2 itself lacks)."""
    refuse([
        (not cfg.bias, "a Jais 2 model without Linear biases (model.bias=false): llama.cpp's jais2 requires q/k/v/o "
                       "and MLP biases"),
        (cfg.kv_heads != cfg.n_head or cfg.head_dim * cfg.n_head != cfg.n_embd,
         f"model.kv_heads={cfg.kv_heads} (or model.head_size={cfg.head_dim}) with {cfg.n_head} heads: llama.cpp's "
         f"jais2 sizes every attention bias n_embd wide, so only as many KV heads as heads, n_embd / n_head wide, "
         f"load"),
        (cfg.rope_scaling != "none", f"model.rope_scaling={cfg.rope_scaling} on a Jais 2 model: redline writes jais2 "
                                     f"GGUF files without RoPE scaling"),
    ])


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for Jais2Model past the common ones."""
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_layer_norm_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_rope_dimension_count(cfg.head_dim)


def feed_forward_length(cfg: ModelConfig) -> int:
    return cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout (LayerNorm biases zero where the model has
    none, as jais2_to_hf writes them)."""
    from redline.interop.llama import jais2_to_hf

    return in_file_names(jais2_to_hf(state, cfg), _BLOCK, _TOP)


def hf_config(key, vocab: int, tensor_names: set[str]) -> dict:
    """A jais2 config.json for a jais2 GGUF, from the keys llama.cpp's loader reads."""
    refuse_rope_scaling(key, ARCH)
    config = text_config(key, vocab, tensor_names, "jais2", 8192, layer_norm=True)
    return {**config, "head_dim": config["hidden_size"] // config["num_attention_heads"], "hidden_act": "relu2",
            "attention_bias": True, "mlp_bias": True}


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of a jais2 file's tensors. A name outside the map is a UserError."""
    return source(map_file_tensors(file_names, read_file, _BLOCK, _TOP, ARCH))
