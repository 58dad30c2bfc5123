"""GGUF files of DeepSeek-V2/V3's latent attention and experts as llama.cpp's deepseek2 architecture holds them (its
convert_hf_to_gguf.py DeepseekV2Model, which DeepSeek-V3, Kimi-K2, Moonlight and GLM-4.7-Flash convert through too;
its loader's LLM_ARCH_DEEPSEEK2 case and src/models/deepseek2.cpp). gguf_file.py calls in here for that
architecture; the tensors pass through transformers' DeepSeek-V3 names (deepseek.to_hf_for), so the map below is
the converter's own from those names (the gguf package's MODEL_TENSORS[DEEPSEEK2]).

What the file holds, and how llama.cpp reads it:
- q as attn_q, or attn_q_a -> attn_q_a_norm -> attn_q_b (attention.q_lora_rank); kv_a_proj_with_mqa as attn_kv_a_mqa
  (the latent's kv_lora_rank rows, then the shared key part's qk_rope_head_dim), attn_kv_a_norm, o_proj as
  attn_output;
- kv_b_proj split per head, as the current converter writes it for llama.cpp's absorbed ("MLA") attention: attn_k_b
  (H, kv_lora_rank, qk_nope_head_dim), each head's key rows transposed, and attn_v_b (H, v_head_dim, kv_lora_rank);
  the keys then say one KV head of key_length = kv_lora_rank + qk_rope_head_dim and value_length = kv_lora_rank, and
  key_length_mla / value_length_mla give the heads' own widths. Older converters wrote kv_b_proj whole as attn_kv_b
  with head_count_kv the heads and key_length / value_length the heads' widths: read too;
- RoPE on interleaved pairs, as DeepSeek's checkpoints hold the rotated rows (llama.cpp rotates deepseek2 as its NORM
  RoPE): redline's (first half, second half) rows of q and of the shared key part are interleaved on export, back on
  import (deepseek.q_rope_rows / kv_rope_rows); rope.dimension_count qk_rope_head_dim;
- the scores scaled by 1 / sqrt(key_length_mla), as DeepSeek's without RoPE scaling;
- the first leading_dense_block_count layers a SwiGLU feed_forward_length wide; the others the router ffn_gate_inp,
  the routing bias exp_probs_b.bias (DeepSeek-V3's e_score_correction_bias), the stacked experts ffn_{gate,up}_exps
  (E, F, C) and ffn_down_exps (E, C, F), the shared experts ffn_*_shexp (expert_shared_count of them, added
  ungated); expert_gating_func softmax (DeepSeek-V2) or sigmoid (V3), expert_weights_norm (the chosen weights
  rescaled to sum to 1), expert_weights_scale (routed_scaling_factor), expert_group_count / expert_group_used_count
  (groups scored by their two best experts, as DeepSeek-V3's).
Refused by name: RoPE scaling (llama.cpp's deepseek2 pairs YaRN with rope.scaling.yarn_log_multiplier and its own
attention factor, which redline does not write or read here), a softmax router whose weights are rescaled, biased or
grouped (DeepSeek-V2's transformers router does none of these).
"""

from __future__ import annotations

import torch

from redline.errors import UserError
from redline.interop.gguf_named import (TOP_NAMES, expert_tensor, file_experts, in_file_names, map_file_tensors,
                                        refuse_rope_scaling, source, swiglu_names, write_expert_counts)
from redline.model import ModelConfig

ARCH = "deepseek2"
SOFTMAX, SIGMOID = 1, 2  # llama.cpp's expert_gating_func values (LLAMA_EXPERT_GATING_FUNC_TYPE_*)
# transformers' DeepSeek name after model.layers.N. -> the GGUF's after blk.N.
_BLOCK = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_a_proj.weight": "attn_q_a.weight",
          "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight", "self_attn.q_b_proj.weight": "attn_q_b.weight",
          "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
          "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight", "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
          "self_attn.o_proj.weight": "attn_output.weight"}
# the dense MLP's, the router's and the shared experts' names, DeepSeek's and GLM-4-MoE's alike (gguf_glm4moe.py)
MLP_NAMES = {**swiglu_names("mlp."), "mlp.gate.weight": "ffn_gate_inp.weight",
             "mlp.gate.e_score_correction_bias": "exp_probs_b.bias", **swiglu_names("mlp.shared_experts.", "_shexp")}
_BLOCK.update(MLP_NAMES)


# -- writing -----------------------------------------------------------------------------------------------------


def check(cfg: ModelConfig) -> None:
    """A UserError for a latent-attention model llama.cpp's deepseek2 would run as another (deepseek.export_name
    has refused what no DeepSeek has)."""
    from redline.interop.deepseek import export_name

    name = export_name(cfg)
    if cfg.rope_scaling != "none" or (cfg.attn_scale and abs(cfg.attn_scale * cfg.head_dim ** 0.5 - 1) > 1e-9):
        raise UserError(f"model.rope_scaling={cfg.rope_scaling} (model.attn_scale={cfg.attn_scale}) with latent "
                        f"attention: redline writes deepseek2 GGUF files without RoPE scaling (llama.cpp's YaRN there "
                        f"takes rope.scaling.yarn_log_multiplier and an attention factor of its own, not written "
                        f"here); export with --format hf")
    if name == "deepseek_v2" and cfg.moe_experts and (cfg.moe_norm_topk or cfg.moe_expert_bias or cfg.moe_groups > 1):
        raise UserError("model.moe_norm_topk, moe_expert_bias or moe_groups with softmax scores: no DeepSeek-V2 "
                        "computes them; export with --format hf")


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for DeepseekV2Model past the common ones (context, widths, blocks,
    heads): the absorbed attention's one KV head (current converters)."""
    R = cfg.rope_dims
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_rope_dimension_count(R)
    if cfg.q_lora_rank:
        writer.add_q_lora_rank(cfg.q_lora_rank)
    writer.add_kv_lora_rank(cfg.kv_lora_rank)
    writer.add_key_length(cfg.kv_lora_rank + R)
    writer.add_value_length(cfg.kv_lora_rank)
    writer.add_key_length_mla(cfg.head_dim)
    writer.add_value_length_mla(cfg.v_head_dim or cfg.head_dim)
    if not cfg.moe_experts:
        writer.add_leading_dense_block_count(cfg.n_layer)
        return
    write_expert_metadata(writer, gguf, cfg)
    writer.add_expert_group_count(cfg.moe_groups)
    writer.add_expert_group_used_count(cfg.moe_topk_groups if cfg.moe_groups > 1 else cfg.moe_groups)


def write_expert_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The experts' keys deepseek2 and glm4moe share: dense first layers, widths and counts, shared experts (whole
    multiples of an expert's width), the weights' scale and rescaling, sigmoid or softmax scores."""
    writer.add_leading_dense_block_count(cfg.moe_dense_layers)
    write_expert_counts(writer, cfg)
    writer.add_expert_shared_count(cfg.moe_shared_hidden // cfg.hidden_dim)
    writer.add_expert_weights_scale(cfg.moe_scale)
    writer.add_expert_weights_norm(cfg.moe_norm_topk)
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if cfg.moe_gating == "sigmoid"
                                  else gguf.ExpertGatingFuncType.SOFTMAX)


def expert_config(key) -> dict:
    """config.json's expert entries under DeepSeek-V3's names (GLM-4-MoE's and dots.llm1's too) from the keys
    write_expert_metadata writes."""
    return {"n_routed_experts": key("expert_count"), "num_experts_per_tok": key("expert_used_count"),
            "moe_intermediate_size": key("expert_feed_forward_length"),
            "n_shared_experts": int(key("expert_shared_count") or 1),
            "routed_scaling_factor": float(key("expert_weights_scale") or 1.0),
            "norm_topk_prob": bool(key("expert_weights_norm", False))}


def feed_forward_length(cfg: ModelConfig) -> int:
    """feed_forward_length: the dense layers' width."""
    return (cfg.moe_dense_hidden or cfg.hidden_dim) if cfg.moe_experts else cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout: the rotated rows interleaved, kv_b split into
    attn_k_b / attn_v_b, the experts stacked from redline's (E, 2F, C) / (E, C, F)."""
    from redline.interop.deepseek import _rope_rows, to_hf_for

    tensors = to_hf_for("deepseek_v3")(_rope_rows(dict(state), cfg, inverse=False), cfg)
    D, R, kv_b = cfg.head_dim, cfg.rope_dims, "self_attn.kv_b_proj.weight"
    out = in_file_names(tensors, _BLOCK, skip=lambda rest: expert_tensor(rest) or rest == kv_b)
    for i in range(cfg.n_layer):  # kv_b (H·(nope + v), L) -> per head, as the converter splits it
        kv = tensors[f"model.layers.{i}.{kv_b}"].reshape(cfg.n_head, -1, cfg.kv_lora_rank)
        out[f"blk.{i}.attn_k_b.weight"] = kv[:, :D - R].transpose(1, 2).contiguous()
        out[f"blk.{i}.attn_v_b.weight"] = kv[:, D - R:].contiguous()
    return {**out, **file_experts(state, cfg)}


# -- reading -----------------------------------------------------------------------------------------------------


def hf_config(key, vocab: int, tensor_names: set[str]) -> dict:
    """A deepseek_v3 (sigmoid router, or no experts) or deepseek_v2 (softmax router) config.json for a deepseek2
    GGUF, from the keys llama.cpp's loader reads; a UserError for what redline would run otherwise."""
    refuse_rope_scaling(key, ARCH, " (llama.cpp's YaRN there takes its own attention factor)")
    n, heads = int(key("block_count")), int(key("attention.head_count"))
    if key("attention.key_length_mla"):  # the current converter's absorbed layout
        head, v = int(key("attention.key_length_mla")), int(key("attention.value_length_mla"))
    else:
        head, v = int(key("attention.key_length")), int(key("attention.value_length"))
    rope = int(key("rope.dimension_count"))
    experts = int(key("expert_count") or 0)
    dense = int(key("leading_dense_block_count", 0))
    gating = int(key("expert_gating_func", SOFTMAX))
    name = "deepseek_v3" if gating == SIGMOID or not experts or dense >= n else "deepseek_v2"
    groups = int(key("expert_group_count") or 1)
    kept = int(key("expert_group_used_count") or groups)
    if name == "deepseek_v2" and (key("expert_weights_norm", False) or f"blk.{dense}.exp_probs_b.bias" in tensor_names
                                  or kept < groups):
        raise UserError("the GGUF's deepseek2 softmax router rescales, biases or groups its choice "
                        "(expert_weights_norm, exp_probs_b, expert_group_used_count): DeepSeek-V2's transformers "
                        "router does none of these, and redline reads it as that")
    if gating not in (SOFTMAX, SIGMOID):
        raise UserError(f"the GGUF's deepseek2 expert_gating_func {gating}: redline reads softmax (1) or sigmoid (2)")
    config = {
        "model_type": name, "vocab_size": vocab, "hidden_size": key("embedding_length"),
        "intermediate_size": key("feed_forward_length"), "num_hidden_layers": n, "num_attention_heads": heads,
        "num_key_value_heads": heads, "kv_lora_rank": key("attention.kv_lora_rank"),
        "q_lora_rank": key("attention.q_lora_rank") or None, "qk_rope_head_dim": rope,
        "qk_nope_head_dim": head - rope, "v_head_dim": v, "hidden_act": "silu",
        "max_position_embeddings": key("context_length", 4096),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-6),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(key("rope.freq_base", 10000.0))},
        "attention_bias": False, "first_k_dense_replace": dense if experts else n,
    }
    if experts:
        config.update(expert_config(key))
    if name == "deepseek_v3":
        config.update(rope_interleave=True, n_group=groups, topk_group=kept)
    else:
        config.update(topk_method="greedy", n_group=None, topk_group=None)
    return config


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of a deepseek2 file's tensors: attn_k_b / attn_v_b (or an older file's attn_kv_b)
    back into kv_b_proj, the stacked experts as mlp.experts.gate_up_proj (E, 2F, C) / down_proj (E, C, F), a zero
    routing bias where a sigmoid router's file holds none. A name outside the map is a UserError."""
    H, L = config["num_attention_heads"], config["kv_lora_rank"]
    own: dict = {}  # kv_b_proj, made from the file's two halves

    def kv_b(i: str) -> torch.Tensor:  # (H, L, nope) and (H, v, L) -> (H·(nope + v), L)
        k = read_file(f"blk.{i}.attn_k_b.weight").reshape(H, L, -1).transpose(1, 2)
        return torch.cat([k, read_file(f"blk.{i}.attn_v_b.weight").reshape(H, -1, L)], dim=1).reshape(-1, L)

    def special(i: str, rest: str, p: str) -> bool:
        if rest in ("attn_k_b.weight", "attn_v_b.weight"):
            own[p + "self_attn.kv_b_proj.weight"] = lambda i=i: kv_b(i)
            return True
        return False

    names = {**map_file_tensors(file_names, read_file, _BLOCK, TOP_NAMES, ARCH, special), **own}
    if config["model_type"] == "deepseek_v3" and config.get("n_routed_experts"):
        for i in range(config["first_k_dense_replace"], config["num_hidden_layers"]):
            names.setdefault(f"model.layers.{i}.mlp.gate.e_score_correction_bias",
                             lambda: torch.zeros(config["n_routed_experts"]))
    return source(names)

