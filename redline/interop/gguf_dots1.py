"""GGUF files of dots.llm1 (rednote-hilab's Dots1ForCausalLM) as llama.cpp's dots1 architecture holds them (its
convert_hf_to_gguf.py Dots1Model; its loader llama_model_dots1 and graph src/models/dots1.cpp). gguf_file.py calls in
here for that architecture; the tensors pass through transformers' names (dots1.to_hf), so the map below is the
converter's own from those names (the gguf package's MODEL_TENSORS[DOTS1]).

What the file holds, and how llama.cpp's graph reads it:
- Qwen3's attention: q/k/v/o without biases, the per-head QK-norm before RoPE as attn_q_norm / attn_k_norm, q/k rows
  as transformers holds them (llama.cpp rotates dots1 as NeoX does), whole heads rotated, scores by
  head_dim ** -0.5, every layer attending to the whole context;
- leading_dense_block_count dense SwiGLU layers feed_forward_length wide, then the router ffn_gate_inp with its routing
  bias exp_probs_b.bias, the stacked experts ffn_{gate,up}_exps (E, F, C) / ffn_down_exps (E, C, F),
  expert_shared_count shared experts as one ungated MLP (ffn_*_shexp), sigmoid scores (expert_gating_func), the
  chosen ones rescaled where expert_weights_norm, times expert_weights_scale;
- llama.cpp floors the rescaled scores' sum at 6.1e-5 (build_moe_ffn's fp16 guard) where transformers adds 1e-20:
  the two differ only where the chosen experts' sigmoid scores sum below 6.1e-5 (every chosen logit below about
  -9.7).
Refused by name: expert groups (llama.cpp's dots1 reads no group keys and routes over all experts), windowed layers
(its dots1 has no sliding window), RoPE scaling.
"""

from __future__ import annotations

from redline.errors import UserError
from redline.interop.gguf_deepseek2 import MLP_NAMES, expert_config, write_expert_metadata
from redline.interop.gguf_named import (LLAMA_BLOCK_NAMES, QK_NORM_NAMES, TOP_NAMES, expert_tensor, file_experts,
                                        in_file_names, map_file_tensors, refuse, source, text_config,
                                        write_attention_metadata)
from redline.model import ModelConfig

ARCH = "dots1"
_BLOCK = {**LLAMA_BLOCK_NAMES, **QK_NORM_NAMES, **MLP_NAMES}


def check(cfg: ModelConfig) -> None:
    """A UserError for a dots.llm1 model llama.cpp's dots1 would run as another (dots1.check_exportable, through
    export_family, has refused what dots.llm1 itself lacks)."""
    windowed = [i for i in range(cfg.n_layer) if cfg.layer_window(i)]
    refuse([
        (cfg.moe_groups > 1, f"model.moe_groups={cfg.moe_groups}: llama.cpp's dots1 reads no expert groups and routes "
                             f"over all experts"),
        (windowed, f"windowed layers {windowed} (model.sliding_window={cfg.sliding_window}): llama.cpp's dots1 "
                   f"attends to the whole context on every layer"),
        (cfg.rope_scaling != "none", f"model.rope_scaling={cfg.rope_scaling} on a dots.llm1 model: redline writes "
                                     f"dots1 GGUF files without RoPE scaling"),
    ])


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for Dots1Model past the common ones."""
    write_attention_metadata(writer, cfg)
    write_expert_metadata(writer, gguf, cfg)  # (sigmoid scores: dots.llm1's, export_family has checked)


def feed_forward_length(cfg: ModelConfig) -> int:
    return cfg.moe_dense_hidden or cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout (gguf_named.file_experts for the experts)."""
    from redline.interop.dots1 import to_hf

    return {**in_file_names(to_hf(state, cfg), _BLOCK, skip=expert_tensor), **file_experts(state, cfg)}


def hf_config(key, vocab: int, tensor_names: set[str]) -> dict:
    """A dots1 config.json for a dots1 GGUF, from the keys llama.cpp's loader reads."""
    if key("rope.scaling.type") not in (None, "none") or key("attention.sliding_window"):
        raise UserError("the GGUF's dots1 file scales its RoPE or gives a sliding window, neither of which llama.cpp's "
                        "dots1 reads as dots.llm1 has them; import the model's Hugging Face folder")
    if key("expert_gating_func") not in (None, 2):
        raise UserError(f"the GGUF's dots1 expert_gating_func is {key('expert_gating_func')}, not 2 (sigmoid): "
                        f"dots.llm1's router scores by sigmoid")
    config = text_config(key, vocab, tensor_names, "dots1", 32768, eps=1e-6)
    return {
        **config, "attention_bias": False, **expert_config(key),
        "first_k_dense_replace": int(key("leading_dense_block_count", 0)), "n_group": 1, "topk_group": 1,
        "sliding_window": None, "layer_types": ["full_attention"] * config["num_hidden_layers"],
    }


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of a dots1 file's tensors: the stacked experts as mlp.experts.gate_up_proj
    (E, 2F, C) / down_proj (E, C, F). A name outside the map is a UserError."""
    return source(map_file_tensors(file_names, read_file, _BLOCK, TOP_NAMES, ARCH))
