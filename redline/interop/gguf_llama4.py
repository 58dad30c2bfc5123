"""GGUF files of Llama 4's text model as llama.cpp's llama4 architecture holds them (its convert_hf_to_gguf.py
Llama4Model, built on LlamaModel with undo_permute off; its loader llama_model_llama4 and src/models/llama4.cpp).
gguf_file.py calls in here for that architecture; the tensors pass through transformers' names (llama4.to_hf), so
the map below is the converter's own from those names (the gguf package's MODEL_TENSORS[LLAMA4]).

What the file holds, and how llama.cpp's graph reads it:
- Llama's names, q/k rows as transformers holds them (interleaved pairs, which llama.cpp's llama4 rotates as
  consecutive pairs: its NORM RoPE), Llama 3 scaling as the rope_freqs tensor; scores by head_dim ** -0.5;
- the MoE layers every interleave_moe_layer_step-th ((i + 1) % step == 0): the router ffn_gate_inp, the experts
  ffn_{gate,up}_exps (E, F, C) / ffn_down_exps (E, C, F) (the converter splits transformers' gate_up_proj (E, C, 2F)
  after a transpose, and transposes down_proj (E, F, C)), and the shared expert ffn_*_shexp as wide as the experts
  (expert_feed_forward_length); sigmoid scores that weight each expert's input (llama.cpp's weight_before_ffn for
  llama4), not rescaled; the other layers a SwiGLU feed_forward_length wide (transformers' intermediate_size_mlp);
- what llama.cpp fixes in its code rather than in keys (llama_model_llama4::load_arch_hparams, absent
  attention.sliding_window): chunks of 8192 on three layers of every four (the fourth attends to everything), RoPE
  left out of every fourth layer (n_no_rope_layer_step 4), those layers' query temperature with attn_scale 0.1 and
  floor_scale 8192, and the weightless QK-norm after RoPE on every model but the 128-expert one (Maverick's size).
So a redline model is written only where it is that model: everything else is refused by name (check). llama.cpp's
all-full-attention form (attention.sliding_window 0) leaves RoPE out of its last layer and is read by no one here.
"""

from __future__ import annotations

import torch

from redline.errors import UserError
from redline.interop.gguf_named import (LLAMA_BLOCK_NAMES, TOP_NAMES, in_file_names, map_file_tensors, refuse,
                                        rope_parameters, source, swiglu_names, text_config,
                                        write_attention_metadata, write_expert_counts)
from redline.model import ModelConfig

ARCH = "llama4"
# llama.cpp's constants for llama4's chunked form (llama_model_llama4::load_arch_hparams)
CHUNK = 8192
NOPE_STEP = 4  # hparams.n_no_rope_layer_step's default, which llama4 keeps; the chunk pattern's period too
TEMPERATURE, TEMPERATURE_FLOOR = 0.1, 8192
NO_KQ_NORM_EXPERTS = 128  # llama.cpp turns the QK-norm off by the expert count (LLM_TYPE_17B_128E)
# transformers' name after model.layers.N. -> the GGUF's after blk.N.
_BLOCK = {**LLAMA_BLOCK_NAMES, **swiglu_names("feed_forward."), "feed_forward.router.weight": "ffn_gate_inp.weight",
          **swiglu_names("feed_forward.shared_expert.", "_shexp")}
_EXPERTS = "feed_forward.experts."
ROPE_FREQS = "rope_freqs.weight"  # Llama 3 scaling's divisors, read by gguf_file.read_gguf


def moe_step(cfg: ModelConfig) -> int:
    """interleave_moe_layer_step for the model's MoE layers: the first one's index + 1 (0: none)."""
    first = next((i for i in range(cfg.n_layer) if cfg.layer_has_experts(i)), None)
    return 0 if first is None else first + 1


def check(cfg: ModelConfig) -> None:
    """A UserError for a Llama 4 model llama.cpp's llama4 would run as another (llama4.check_exportable, through
    export_family, has refused what Llama 4 itself lacks)."""
    step = moe_step(cfg)
    why = [
        (not cfg.moe_experts or not step, "a model without experts (llama.cpp's llama4 refuses zero experts)"),
        (step and any(cfg.layer_has_experts(i) != ((i + 1) % step == 0) for i in range(cfg.n_layer)),
         "experts on layers other than every interleave_moe_layer_step-th"),
        (cfg.attn_chunk != CHUNK, f"model.attn_chunk={cfg.attn_chunk} (llama.cpp's llama4 attends in chunks of "
                                  f"{CHUNK}, fixed in its code)"),
        (any(cfg.layer_rope(i) != ((i + 1) % NOPE_STEP != 0) for i in range(cfg.n_layer)),
         f"layers without RoPE other than every {NOPE_STEP}th (llama.cpp's llama4 fixes that step)"),
        (cfg.nope_temperature != TEMPERATURE or cfg.nope_temperature_floor != TEMPERATURE_FLOOR,
         f"model.nope_temperature={cfg.nope_temperature} / nope_temperature_floor={cfg.nope_temperature_floor} "
         f"(llama.cpp's llama4 scales those layers' queries by {TEMPERATURE} / {TEMPERATURE_FLOOR}, fixed in its "
         f"code)"),
        (cfg.rope_qk_norm != (cfg.moe_experts != NO_KQ_NORM_EXPERTS),
         f"model.rope_qk_norm={str(cfg.rope_qk_norm).lower()} with {cfg.moe_experts} experts (llama.cpp's llama4 "
         f"normalizes q and k on every model but the {NO_KQ_NORM_EXPERTS}-expert one)"),
    ]
    refuse(why, then=": a llama4 GGUF would mean another model; export with --format hf")


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for Llama4Model past the common ones (LlamaModel's, then its own), and
    redline's exact Llama 3 scaling beside the rope_freqs tensor write_gguf adds."""
    from redline.interop.gguf_file import write_llama3_rope

    write_attention_metadata(writer, cfg)
    write_expert_counts(writer, cfg)
    writer.add_interleave_moe_layer_step(moe_step(cfg))
    write_llama3_rope(writer, cfg)


def feed_forward_length(cfg: ModelConfig) -> int:
    """The dense layers' width (transformers' intermediate_size_mlp); the experts' is expert_feed_forward_length."""
    return cfg.moe_dense_hidden or cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout."""
    from redline.interop.llama4 import to_hf

    tensors = to_hf(state, cfg)
    out = in_file_names(tensors, _BLOCK, skip=lambda rest: rest.startswith(_EXPERTS))
    for i in range(cfg.n_layer):
        p, q = f"model.layers.{i}.{_EXPERTS}", f"blk.{i}."
        if p + "down_proj" in tensors:  # (E, C, 2F) -> (E, 2F, C): gate rows, then up; (E, F, C) -> (E, C, F)
            out[q + "ffn_gate_exps.weight"], out[q + "ffn_up_exps.weight"] = \
                tensors[p + "gate_up_proj"].transpose(1, 2).chunk(2, dim=1)
            out[q + "ffn_down_exps.weight"] = tensors[p + "down_proj"].transpose(1, 2)
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(fields: dict, key, vocab: int, tensor_names: set[str], divisors: torch.Tensor | None) -> dict:
    """A llama4_text config.json for a llama4 GGUF, from the keys llama.cpp's loader reads and the constants its
    chunked form fixes; a UserError for a file llama.cpp would run otherwise than redline."""
    if key("attention.sliding_window") is not None:
        raise UserError(f"the GGUF's llama4.attention.sliding_window is {key('attention.sliding_window')}: llama.cpp "
                        f"reads that as all layers attending to everything with RoPE left out of the last, which no "
                        f"Llama 4 computes; redline reads the chunked form (no such key)")
    if key("attention.sliding_window_pattern", NOPE_STEP) != NOPE_STEP:
        raise UserError(f"the GGUF's llama4.attention.sliding_window_pattern is "
                        f"{key('attention.sliding_window_pattern')}: redline's Llama 4 attends in chunks on exactly "
                        f"the layers that rotate, every {NOPE_STEP}th left out")
    if key("rope.freq_base_swa") not in (None, key("rope.freq_base")) or \
            key("rope.scaling.type") not in (None, "none"):
        raise UserError("the GGUF's llama4 file gives the chunked layers a RoPE base of their own or a RoPE scaling "
                        "type: Llama 4 rotates every layer by one RoPE (Llama 3 scaling through rope_freqs)")
    config = text_config(key, vocab, tensor_names, "llama4_text", 8192)
    head_dim = config["head_dim"]
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        raise UserError(f"the GGUF's llama4.rope.dimension_count is {key('rope.dimension_count')}, not the head's "
                        f"{head_dim}: llama.cpp's llama4 rotates whole heads")
    n, step, experts = int(key("block_count")), int(key("interleave_moe_layer_step", 0)), int(key("expert_count", 0))
    config = {
        **config, "intermediate_size": key("expert_feed_forward_length"),
        "intermediate_size_mlp": key("feed_forward_length"), "attention_bias": False,
        "num_local_experts": experts, "num_experts_per_tok": key("expert_used_count", 1),
        "interleave_moe_layer_step": step,
        "moe_layers": [i for i in range(n) if step and (i + 1) % step == 0],
        "no_rope_layers": [int((i + 1) % NOPE_STEP != 0) for i in range(n)], "attention_chunk_size": CHUNK,
        "use_qk_norm": experts != NO_KQ_NORM_EXPERTS, "attn_temperature_tuning": True, "attn_scale": TEMPERATURE,
        "floor_scale": TEMPERATURE_FLOOR,
    }
    return {**config, "rope_parameters": rope_parameters(key, fields, divisors, config)}


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of a llama4 file's tensors: the experts as feed_forward.experts.gate_up_proj
    (E, C, 2F) / down_proj (E, F, C); rope_freqs (read into the config) left out. A name outside the map is a
    UserError."""
    return source(map_file_tensors(file_names - {ROPE_FREQS}, read_file, _BLOCK, TOP_NAMES, ARCH, experts=_EXPERTS,
                                   transposed=True))
