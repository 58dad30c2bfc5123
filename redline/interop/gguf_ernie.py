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

from redline.errors import UserError
from redline.interop.gguf_named import (LLAMA_BLOCK_NAMES, TOP_NAMES, expert_tensor, file_experts, in_file_names,
                                        map_file_tensors, refuse_rope_scaling, source, swiglu_names, text_config,
                                        write_attention_metadata, write_expert_counts)
from redline.model import ModelConfig

ARCH = "ernie4_5-moe"
_BLOCK = {**LLAMA_BLOCK_NAMES, **swiglu_names("mlp."), "mlp.gate.weight": "ffn_gate_inp.weight",
          "mlp.moe_statics.e_score_correction_bias": "exp_probs_b.bias",
          **swiglu_names("mlp.shared_experts.", "_shexp")}


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
    write_attention_metadata(writer, cfg)
    write_expert_counts(writer, cfg)
    writer.add_interleave_moe_layer_step(1)
    writer.add_leading_dense_block_count(_lead(cfg))
    writer.add_expert_shared_count(cfg.moe_shared_hidden // cfg.hidden_dim)
    if cfg.moe_shared_hidden:
        writer.add_expert_shared_feed_forward_length(cfg.moe_shared_hidden)


def feed_forward_length(cfg: ModelConfig) -> int:
    """The leading dense layers' width; the experts' is expert_feed_forward_length."""
    return cfg.moe_dense_hidden or cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout (gguf_named.file_experts for the experts and
    the routing bias)."""
    from redline.interop.ernie import MOE_FAMILY

    return {**in_file_names(MOE_FAMILY.to_hf(state, cfg), _BLOCK, skip=expert_tensor), **file_experts(state, cfg)}


def hf_config(key, vocab: int, tensor_names: set[str]) -> dict:
    """An ernie4_5_moe config.json for an ernie4_5-moe GGUF, from the keys llama.cpp's loader reads."""
    refuse_rope_scaling(key, ARCH)
    if int(key("interleave_moe_layer_step", 1)) != 1:
        raise UserError(f"the GGUF's ernie4_5-moe.interleave_moe_layer_step is {key('interleave_moe_layer_step')}: "
                        f"llama.cpp's loader puts experts on every layer from leading_dense_block_count on and its "
                        f"graph runs dense MLPs between, so no such file loads there; redline reads a step of 1")
    n, expert = int(key("block_count")), int(key("expert_feed_forward_length"))
    shared = int(key("expert_shared_feed_forward_length") or 0)
    if shared % expert:
        raise UserError(f"the GGUF's ernie4_5-moe.expert_shared_feed_forward_length {shared} is not a whole number of "
                        f"experts {expert} wide: ERNIE 4.5 MoE's shared experts are as wide as the routed ones")
    return {
        **text_config(key, vocab, tensor_names, "ernie4_5_moe", 131072), "moe_intermediate_size": expert,
        "use_bias": False, "moe_num_experts": key("expert_count"), "moe_k": key("expert_used_count"),
        "moe_layer_start_index": int(key("leading_dense_block_count", 0)), "moe_layer_end_index": n - 1,
        "moe_layer_interval": 1, "moe_num_shared_experts": shared // expert,
    }


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of the file's tensors (gguf_named.map_file_tensors: the experts as
    mlp.experts.gate_up_proj (E, 2F, C) / down_proj (E, C, F), which moe.experts_to_redline takes). A name outside
    the map is a UserError."""
    return source(map_file_tensors(file_names, read_file, _BLOCK, TOP_NAMES, ARCH))
