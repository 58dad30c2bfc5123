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

import re

from redline.errors import UserError
from redline.interop.gguf_deepseek2 import MLP_NAMES, file_experts, map_file_tensors, write_expert_metadata
from redline.model import ModelConfig

ARCH = "dots1"
_BLOCK = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
          "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
          **MLP_NAMES}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def check(cfg: ModelConfig) -> None:
    """A UserError for a dots.llm1 model llama.cpp's dots1 would run as another (dots1.check_exportable, through
    export_family, has refused what dots.llm1 itself lacks)."""
    windowed = [i for i in range(cfg.n_layer) if cfg.layer_window(i)]
    for bad, what in ((cfg.moe_groups > 1, f"model.moe_groups={cfg.moe_groups}: llama.cpp's dots1 reads no expert "
                                           f"groups and routes over all experts"),
                      (windowed, f"windowed layers {windowed} (model.sliding_window={cfg.sliding_window}): llama.cpp's "
                                 f"dots1 attends to the whole context on every layer"),
                      (cfg.rope_scaling != "none", f"model.rope_scaling={cfg.rope_scaling} on a dots.llm1 model: "
                                                   f"redline writes dots1 GGUF files without RoPE scaling")):
        if bad:
            raise UserError(f"{what}; export with --format hf")


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for Dots1Model past the common ones."""
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    write_expert_metadata(writer, gguf, cfg)  # (sigmoid scores: dots.llm1's, export_family has checked)


def feed_forward_length(cfg: ModelConfig) -> int:
    return cfg.moe_dense_hidden or cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout (gguf_deepseek2.file_experts for the experts)."""
    from redline.interop.dots1 import to_hf

    out = {}
    for name, t in to_hf(state, cfg).items():
        if m := re.match(r"model\.layers\.(\d+)\.(.+)$", name):
            if m[2].startswith("mlp.experts.") or m[2] == "mlp.gate.e_score_correction_bias":
                continue
            out[f"blk.{m[1]}.{_BLOCK[m[2]]}"] = t
        else:
            out[_TOP[name]] = t
    return {**out, **file_experts(state, cfg)}


def hf_config(key, vocab: int, tensor_names: set[str]) -> dict:
    """A dots1 config.json for a dots1 GGUF, from the keys llama.cpp's loader reads."""
    if key("rope.scaling.type") not in (None, "none") or key("attention.sliding_window"):
        raise UserError("the GGUF's dots1 file scales its RoPE or gives a sliding window, neither of which llama.cpp's "
                        "dots1 reads as dots.llm1 has them; import the model's Hugging Face folder")
    if key("expert_gating_func") not in (None, 2):
        raise UserError(f"the GGUF's dots1 expert_gating_func is {key('expert_gating_func')}, not 2 (sigmoid): "
                        f"dots.llm1's router scores by sigmoid")
    width, heads = key("embedding_length"), key("attention.head_count")
    head_dim = int(key("attention.key_length") or width // heads)
    n = int(key("block_count"))
    return {
        "model_type": "dots1", "vocab_size": vocab, "hidden_size": width,
        "intermediate_size": key("feed_forward_length"), "moe_intermediate_size": key("expert_feed_forward_length"),
        "num_hidden_layers": n, "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv") or heads, "head_dim": head_dim, "hidden_act": "silu",
        "max_position_embeddings": key("context_length", 32768),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-6),
        "tie_word_embeddings": "output.weight" not in tensor_names, "attention_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(key("rope.freq_base", 10000.0))},
        "n_routed_experts": key("expert_count"), "num_experts_per_tok": key("expert_used_count"),
        "n_shared_experts": int(key("expert_shared_count") or 1),
        "first_k_dense_replace": int(key("leading_dense_block_count", 0)),
        "routed_scaling_factor": float(key("expert_weights_scale") or 1.0),
        "norm_topk_prob": bool(key("expert_weights_norm", False)), "n_group": 1, "topk_group": 1,
        "sliding_window": None, "layer_types": ["full_attention"] * n,
    }


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of a dots1 file's tensors: the stacked experts as mlp.experts.gate_up_proj
    (E, 2F, C) / down_proj (E, C, F). A name outside the map is a UserError."""
    names = map_file_tensors(file_names, read_file, _BLOCK, _TOP, ARCH)
    return set(names), lambda name: names[name]()
