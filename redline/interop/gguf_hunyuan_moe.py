"""GGUF files of Hunyuan MoE (Hunyuan-A13B: HunYuanMoEV1ForCausalLM) as llama.cpp's hunyuan-moe architecture holds
them (its convert_hf_to_gguf.py HunYuanMoEModel; its loader and graph src/models/hunyuan-moe.cpp). gguf_file.py calls
in here for that architecture; the tensors pass through transformers' names (hunyuan.MOE_FAMILY.to_hf), so the map
below is the converter's own from those names (the gguf package's MODEL_TENSORS[HUNYUAN_MOE]).

What the file holds, and how llama.cpp's graph reads it:
- the dense model's attention (as hunyuan-dense files hold it): q/k rows as transformers holds them (llama.cpp rotates
  hunyuan-moe as NeoX does), the per-head QK-norm after RoPE as attn_q_norm / attn_k_norm, whole heads rotated by
  rope.freq_base (Hunyuan's alpha-stretched base, as the converter writes it), scores by head_dim ** -0.5;
- every layer a mixture: the router ffn_gate_inp, softmax scores with the top expert_used_count rescaled to sum to 1
  (llama.cpp's norm_w, fixed in its graph; no weight scale), the experts ffn_{gate,up}_exps (E, F, C) /
  ffn_down_exps (E, C, F), plus the ungated shared MLP ffn_*_shexp added beside them. llama.cpp sizes the experts
  by feed_forward_length (it reads expert_feed_forward_length and does not use it) and the shared MLP by
  expert_shared_feed_forward_length: both are transformers' intermediate_size, as redline's Hunyuan MoE has them.
Refused by name: RoPE scaling (redline writes hunyuan-moe unscaled), a file whose shared MLP or experts are another
width than feed_forward_length.
"""

from __future__ import annotations

from redline.errors import UserError
from redline.interop.gguf_named import (LLAMA_BLOCK_NAMES, TOP_NAMES, expert_tensor, file_experts, in_file_names,
                                        map_file_tensors, source, swiglu_names, text_config,
                                        write_attention_metadata, write_expert_counts)
from redline.model import ModelConfig

ARCH = "hunyuan-moe"
_BLOCK = {**LLAMA_BLOCK_NAMES, "self_attn.query_layernorm.weight": "attn_q_norm.weight",
          "self_attn.key_layernorm.weight": "attn_k_norm.weight", "mlp.gate.wg.weight": "ffn_gate_inp.weight",
          **swiglu_names("mlp.shared_mlp.", "_shexp")}


def check(cfg: ModelConfig) -> None:
    """A UserError for a Hunyuan MoE model redline does not write as hunyuan-moe (hunyuan.check_moe_exportable,
    through export_family, has refused what Hunyuan MoE itself lacks)."""
    if cfg.rope_scaling != "none":
        raise UserError(f"model.rope_scaling={cfg.rope_scaling} on a Hunyuan MoE model: redline writes hunyuan-moe "
                        f"GGUF files without RoPE scaling; export with --format hf")


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for HunYuanMoEModel past the common ones."""
    write_attention_metadata(writer, cfg)
    write_expert_counts(writer, cfg)
    writer.add_expert_shared_feed_forward_length(cfg.moe_shared_hidden)
    writer.add_expert_shared_count(1)


def feed_forward_length(cfg: ModelConfig) -> int:
    """The experts' width, which llama.cpp sizes them by."""
    return cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout (gguf_named.file_experts for the experts)."""
    from redline.interop.hunyuan import MOE_FAMILY

    return {**in_file_names(MOE_FAMILY.to_hf(state, cfg), _BLOCK, skip=expert_tensor), **file_experts(state, cfg)}


def hf_config(key, vocab: int, tensor_names: set[str]) -> dict:
    """A hunyuan_v1_moe config.json for a hunyuan-moe GGUF, from the keys llama.cpp's loader reads."""
    if key("rope.scaling.type") not in (None, "none") or float(key("rope.scaling.factor") or 1.0) != 1.0:
        raise UserError(f"the GGUF's hunyuan-moe RoPE scaling {key('rope.scaling.type')!r} is not read by redline; "
                        f"import the model's Hugging Face folder")
    ffn = int(key("feed_forward_length"))
    shared = int(key("expert_shared_feed_forward_length") or ffn)
    if shared != ffn:
        raise UserError(f"the GGUF's hunyuan-moe.expert_shared_feed_forward_length {shared} is not "
                        f"feed_forward_length {ffn}: redline's Hunyuan MoE has a shared MLP as wide as its experts")
    return {
        **text_config(key, vocab, tensor_names, "hunyuan_v1_moe", 32768), "intermediate_size": ffn,
        "attention_bias": False, "use_qk_norm": True, "num_experts": key("expert_count"),
        "moe_topk": key("expert_used_count"),
    }


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of the file's tensors (gguf_named.map_file_tensors: the experts as
    mlp.experts.gate_up_proj (E, 2F, C) / down_proj (E, C, F), which moe.experts_to_redline takes). A name outside
    the map is a UserError."""
    return source(map_file_tensors(file_names, read_file, _BLOCK, TOP_NAMES, ARCH))
