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

import re

import torch

from redline.errors import UserError
from redline.model import ModelConfig

ARCH = "llama4"
# llama.cpp's constants for llama4's chunked form (llama_model_llama4::load_arch_hparams)
CHUNK = 8192
NOPE_STEP = 4  # hparams.n_no_rope_layer_step's default, which llama4 keeps; the chunk pattern's period too
TEMPERATURE, TEMPERATURE_FLOOR = 0.1, 8192
NO_KQ_NORM_EXPERTS = 128  # llama.cpp turns the QK-norm off by the expert count (LLM_TYPE_17B_128E)
# transformers' name after model.layers.N. -> the GGUF's after blk.N.
_BLOCK = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
          "feed_forward.gate_proj.weight": "ffn_gate.weight", "feed_forward.up_proj.weight": "ffn_up.weight",
          "feed_forward.down_proj.weight": "ffn_down.weight", "feed_forward.router.weight": "ffn_gate_inp.weight",
          "feed_forward.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
          "feed_forward.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
          "feed_forward.shared_expert.down_proj.weight": "ffn_down_shexp.weight"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}
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
    for bad, what in why:
        if bad:
            raise UserError(f"{what}: a llama4 GGUF would mean another model; export with --format hf")


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for Llama4Model past the common ones (LlamaModel's, then its own), and
    redline's exact Llama 3 scaling beside the rope_freqs tensor write_gguf adds."""
    from redline.interop.gguf_file import LLAMA3_ROPE_KEY

    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_expert_count(cfg.moe_experts)
    writer.add_expert_used_count(cfg.moe_top_k)
    writer.add_interleave_moe_layer_step(moe_step(cfg))
    writer.add_expert_feed_forward_length(cfg.hidden_dim)
    if cfg.rope_scaling == "llama3":
        writer.add_array(LLAMA3_ROPE_KEY, [cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor,
                                           float(cfg.rope_original_context)])


def feed_forward_length(cfg: ModelConfig) -> int:
    """The dense layers' width (transformers' intermediate_size_mlp); the experts' is expert_feed_forward_length."""
    return cfg.moe_dense_hidden or cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout."""
    from redline.interop.llama4 import to_hf

    out = {}
    for name, t in to_hf(state, cfg).items():
        if m := re.match(r"model\.layers\.(\d+)\.(.+)$", name):
            p = f"blk.{m[1]}."
            if m[2] == "feed_forward.experts.gate_up_proj":  # (E, C, 2F) -> (E, 2F, C): gate rows, then up
                out[p + "ffn_gate_exps.weight"], out[p + "ffn_up_exps.weight"] = t.transpose(1, 2).chunk(2, dim=1)
            elif m[2] == "feed_forward.experts.down_proj":  # (E, F, C) -> (E, C, F)
                out[p + "ffn_down_exps.weight"] = t.transpose(1, 2)
            else:
                out[p + _BLOCK[m[2]]] = t
        else:
            out[_TOP[name]] = t
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(fields: dict, key, vocab: int, tensor_names: set[str], divisors: torch.Tensor | None) -> dict:
    """A llama4_text config.json for a llama4 GGUF, from the keys llama.cpp's loader reads and the constants its
    chunked form fixes; a UserError for a file llama.cpp would run otherwise than redline."""
    from redline.interop.gguf_file import _llama3_scaling

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
    heads, width = int(key("attention.head_count")), int(key("embedding_length"))
    head_dim = int(key("attention.key_length") or width // heads)
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        raise UserError(f"the GGUF's llama4.rope.dimension_count is {key('rope.dimension_count')}, not the head's "
                        f"{head_dim}: llama.cpp's llama4 rotates whole heads")
    n, step, experts = int(key("block_count")), int(key("interleave_moe_layer_step", 0)), int(key("expert_count", 0))
    theta = float(key("rope.freq_base", 10000.0))
    config = {
        "model_type": "llama4_text", "vocab_size": vocab, "hidden_size": width,
        "intermediate_size": key("expert_feed_forward_length"), "intermediate_size_mlp": key("feed_forward_length"),
        "num_hidden_layers": n, "num_attention_heads": heads, "num_key_value_heads": key("attention.head_count_kv")
        or heads, "head_dim": head_dim, "hidden_act": "silu", "max_position_embeddings": key("context_length", 8192),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-5),
        "tie_word_embeddings": "output.weight" not in tensor_names, "attention_bias": False,
        "num_local_experts": experts, "num_experts_per_tok": key("expert_used_count", 1),
        "interleave_moe_layer_step": step,
        "moe_layers": [i for i in range(n) if step and (i + 1) % step == 0],
        "no_rope_layers": [int((i + 1) % NOPE_STEP != 0) for i in range(n)], "attention_chunk_size": CHUNK,
        "use_qk_norm": experts != NO_KQ_NORM_EXPERTS, "attn_temperature_tuning": True, "attn_scale": TEMPERATURE,
        "floor_scale": TEMPERATURE_FLOOR,
    }
    rope = {"rope_type": "default", "rope_theta": theta}
    if divisors is not None:
        rope = {**_llama3_scaling(fields, divisors, {**config, "rope_theta": theta}), "rope_theta": theta}
    config["rope_parameters"] = rope
    return config


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of a llama4 file's tensors: the experts as feed_forward.experts.gate_up_proj
    (E, C, 2F) / down_proj (E, F, C); rope_freqs (read into the config) left out. A name outside the map is a
    UserError."""
    block, top = {v: k for k, v in _BLOCK.items()}, {v: k for k, v in _TOP.items()}
    names, unknown = {}, []
    for name in file_names - {ROPE_FREQS}:
        if m := re.match(r"blk\.(\d+)\.(.+)$", name):
            i, rest, p = m[1], m[2], f"model.layers.{m[1]}."
            if rest in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
                names[p + "feed_forward.experts.gate_up_proj"] = lambda i=i: torch.cat(
                    [read_file(f"blk.{i}.ffn_gate_exps.weight"), read_file(f"blk.{i}.ffn_up_exps.weight")],
                    dim=1).transpose(1, 2).contiguous()
            elif rest == "ffn_down_exps.weight":
                names[p + "feed_forward.experts.down_proj"] = lambda name=name: read_file(name).transpose(1, 2) \
                    .contiguous()
            elif rest in block:
                names[p + block[rest]] = lambda name=name: read_file(name)
            else:
                unknown.append(name)
        elif name in top:
            names[top[name]] = lambda name=name: read_file(name)
        else:
            unknown.append(name)
    if unknown:
        raise UserError(f"tensors {', '.join(sorted(unknown)[:3])} have no place in a {ARCH} model redline builds")
    return set(names), lambda name: names[name]()
