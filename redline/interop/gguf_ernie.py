"""GGUF files of ERNIE 4.5 MoE (ERNIE-4.5-21B-A3B, -300B-A47B: Ernie4_5_MoeForCausalLM) as llama.cpp's ernie4_5-moe
architecture holds them (its convert_hf_to_gguf.py Ernie4_5MoeModel, built on Ernie4_5Model; its loader in
src/models/ernie4-5.cpp and graph src/models/ernie4-5-moe.cpp). gguf_file.py calls in here for that architecture;
the tensors pass through the original checkpoints' names (ernie.MOE_FAMILY.to_hf), so the map below is the
converter's own from those names (the gguf package's MODEL_TENSORS[ERNIE4_5_MOE]).

What the file holds, and how llama.cpp's graph reads it:
- Llama's attention names, q/k rows as the checkpoints hold them (interleaved pairs, which llama.cpp rotates so: its
  NORM RoPE for ernie4_5-moe), whole heads rotated, scores by head_dim ** -0.5, no biases;
- leading_dense_block_count dense SwiGLU layers feed_forward_length wide, then experts on every layer after
  (llama.cpp's loader creates the experts' tensors on every layer from there and no dense ones, whatever
  interleave_moe_layer_step says, so only a step of 1 loads): the router ffn_gate_inp, the routing bias
  exp_probs_b.bias (E,) that chooses and does not weight, the experts ffn_{gate,up}_exps (E, F, C) / ffn_down_exps
  (E, C, F), softmax scores, the chosen ones rescaled to sum to 1; the shared experts fused into one ungated MLP
  ffn_*_shexp, expert_shared_feed_forward_length wide (its presence is what llama.cpp reads: the converter's value,
  intermediate_size / num_key_value_heads, is that width in the released checkpoints; redline writes the width);
- llama.cpp floors the chosen scores' sum at 6.1e-5 (build_moe_ffn's fp16 guard) where transformers floors it at
  moe_norm_min (1e-12): the two differ only where the chosen experts' softmax scores sum below 6.1e-5, which the
  routing bias alone can bring about.
Refused by name: experts on layers other than every one from the first (an interleave or an end index), RoPE scaling.
"""

from __future__ import annotations

import re

from redline.errors import UserError
from redline.model import ModelConfig

ARCH = "ernie4_5-moe"
_BLOCK = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
          "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
          "mlp.moe_statics.e_score_correction_bias": "exp_probs_b.bias",
          "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
          "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
          "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def _lead(cfg: ModelConfig) -> int:
    """The first layer with experts (ernie.check_moe_exportable has made sure one has)."""
    return next(i for i in range(cfg.n_layer) if cfg.layer_has_experts(i))


def check(cfg: ModelConfig) -> None:
    """A UserError for an ERNIE 4.5 MoE model llama.cpp's ernie4_5-moe would not load or would run as another
    (ernie.check_moe_exportable, through export_family, has refused what ERNIE 4.5 MoE itself lacks)."""
    lead = _lead(cfg)
    if any(not cfg.layer_has_experts(i) for i in range(lead, cfg.n_layer)):
        raise UserError(f"experts on layers {[i for i in range(cfg.n_layer) if cfg.layer_has_experts(i)]}: llama.cpp's "
                        f"ernie4_5-moe loads experts on every layer from leading_dense_block_count on and no dense "
                        f"MLP among them; export with --format hf")
    if cfg.rope_scaling != "none":
        raise UserError(f"model.rope_scaling={cfg.rope_scaling} on an ERNIE 4.5 MoE model: redline writes "
                        f"ernie4_5-moe GGUF files without RoPE scaling; export with --format hf")


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for Ernie4_5MoeModel past the common ones (the shared experts' true
    width: see the module's docstring)."""
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_expert_count(cfg.moe_experts)
    writer.add_expert_used_count(cfg.moe_top_k)
    writer.add_interleave_moe_layer_step(1)
    writer.add_leading_dense_block_count(_lead(cfg))
    writer.add_expert_feed_forward_length(cfg.hidden_dim)
    writer.add_expert_shared_count(cfg.moe_shared_hidden // cfg.hidden_dim)
    if cfg.moe_shared_hidden:
        writer.add_expert_shared_feed_forward_length(cfg.moe_shared_hidden)


def feed_forward_length(cfg: ModelConfig) -> int:
    """The leading dense layers' width; the experts' is expert_feed_forward_length."""
    return cfg.moe_dense_hidden or cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout (gguf_deepseek2.file_experts for the experts and
    the routing bias)."""
    from redline.interop.ernie import MOE_FAMILY
    from redline.interop.gguf_deepseek2 import file_experts

    out = {}
    for name, t in MOE_FAMILY.to_hf(state, cfg).items():
        if m := re.match(r"model\.layers\.(\d+)\.(.+)$", name):
            if m[2].startswith("mlp.experts.") or m[2].endswith("e_score_correction_bias"):
                continue
            out[f"blk.{m[1]}.{_BLOCK[m[2]]}"] = t
        else:
            out[_TOP[name]] = t
    return {**out, **file_experts(state, cfg)}


def hf_config(key, vocab: int, tensor_names: set[str]) -> dict:
    """An ernie4_5_moe config.json for an ernie4_5-moe GGUF, from the keys llama.cpp's loader reads."""
    if key("rope.scaling.type") not in (None, "none"):
        raise UserError(f"the GGUF's ernie4_5-moe RoPE scaling {key('rope.scaling.type')!r} is not read by redline; "
                        f"import the model's Hugging Face folder")
    if int(key("interleave_moe_layer_step", 1)) != 1:
        raise UserError(f"the GGUF's ernie4_5-moe.interleave_moe_layer_step is {key('interleave_moe_layer_step')}: "
                        f"llama.cpp's loader puts experts on every layer from leading_dense_block_count on and its "
                        f"graph runs dense MLPs between, so no such file loads there; redline reads a step of 1")
    width, heads = key("embedding_length"), key("attention.head_count")
    head_dim = int(key("attention.key_length") or width // heads)
    n, expert = int(key("block_count")), int(key("expert_feed_forward_length"))
    shared = int(key("expert_shared_feed_forward_length") or 0)
    if shared % expert:
        raise UserError(f"the GGUF's ernie4_5-moe.expert_shared_feed_forward_length {shared} is not a whole number of "
                        f"experts {expert} wide: ERNIE 4.5 MoE's shared experts are as wide as the routed ones")
    return {
        "model_type": "ernie4_5_moe", "vocab_size": vocab, "hidden_size": width,
        "intermediate_size": key("feed_forward_length"), "moe_intermediate_size": expert, "num_hidden_layers": n,
        "num_attention_heads": heads, "num_key_value_heads": key("attention.head_count_kv") or heads,
        "head_dim": head_dim, "hidden_act": "silu", "max_position_embeddings": key("context_length", 131072),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-5), "use_bias": False,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "moe_num_experts": key("expert_count"), "moe_k": key("expert_used_count"),
        "moe_layer_start_index": int(key("leading_dense_block_count", 0)), "moe_layer_end_index": n - 1,
        "moe_layer_interval": 1, "moe_num_shared_experts": shared // expert,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(key("rope.freq_base", 10000.0))},
    }


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of the file's tensors (gguf_deepseek2.map_file_tensors: the experts as
    mlp.experts.gate_up_proj (E, 2F, C) / down_proj (E, C, F), which moe.experts_to_redline takes). A name outside
    the map is a UserError."""
    from redline.interop.gguf_deepseek2 import map_file_tensors

    names = map_file_tensors(file_names, read_file, _BLOCK, _TOP, ARCH)
    return set(names), lambda name: names[name]()
