"""What the modules of gguf_file.NAMED_ARCHES share (gguf_deepseek2.py, gguf_glm4moe.py, gguf_glm4.py, gguf_llama4.py,
gguf_ernie.py, gguf_hunyuan_moe.py, gguf_apertus.py, gguf_dots1.py, gguf_jais2.py): llama.cpp's tensor names for the
parts their transformers models name alike, the attention keys and config.json entries every one of them writes and
reads the same way, and the two loops between transformers' names and the file's (in_file_names one way,
map_file_tensors the other) with the stacked experts in llama.cpp's layout.
"""

from __future__ import annotations

import re

import torch

from redline.errors import UserError
from redline.model import ModelConfig

# transformers' names outside the blocks -> llama.cpp's
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
# transformers' name after model.layers.N. -> the GGUF's after blk.N.: q/k/v/o, their biases, the per-head QK-norm
ATTENTION_NAMES = {f"self_attn.{p}_proj.weight": f"attn_{g}.weight"
                   for p, g in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output"))}
QKV_BIAS_NAMES = {f"self_attn.{p}_proj.bias": f"attn_{p}.bias" for p in "qkv"}
QK_NORM_NAMES = {"self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"}
# Llama's block: the two pre-norms and the attention
LLAMA_BLOCK_NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
                     **ATTENTION_NAMES}


def swiglu_names(prefix: str, suffix: str = "") -> dict:
    """A SwiGLU MLP's three projections under `prefix` (e.g. "mlp.", "mlp.shared_experts.") -> ffn_{gate,up,down}
    with `suffix` (e.g. "_shexp")."""
    return {f"{prefix}{p}_proj.weight": f"ffn_{p}{suffix}.weight" for p in ("gate", "up", "down")}


def write_attention_metadata(writer, cfg: ModelConfig, rope_dims: int | None = None) -> None:
    """The attention keys llama.cpp's converters write past the common ones for an RMSNorm model: KV heads, the
    norms' epsilon, the RoPE base and rotated width (whole heads unless given), the heads' key and value widths."""
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_rope_dimension_count(rope_dims or cfg.head_dim)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)


def write_expert_counts(writer, cfg: ModelConfig) -> None:
    """How many experts, how many chosen, and how wide each is."""
    writer.add_expert_count(cfg.moe_experts)
    writer.add_expert_used_count(cfg.moe_top_k)
    writer.add_expert_feed_forward_length(cfg.hidden_dim)


def refuse(reasons, then: str = "; export with --format hf") -> None:
    """A UserError for the first (bad, what) of `reasons` that is bad: what + then."""
    for bad, what in reasons:
        if bad:
            raise UserError(f"{what}{then}")


def in_file_names(tensors: dict, block: dict, top: dict = TOP_NAMES, skip=lambda rest: False) -> dict:
    """transformers' {name: tensor} -> {GGUF name: tensor}: model.layers.N.<rest> -> blk.N.<block[rest]>, the others
    by `top`; block tensors where skip(rest) left out (those the caller writes in a layout of its own)."""
    out = {}
    for name, t in tensors.items():
        if m := re.match(r"model\.layers\.(\d+)\.(.+)$", name):
            if not skip(m[2]):
                out[f"blk.{m[1]}.{block[m[2]]}"] = t
        else:
            out[top[name]] = t
    return out


def expert_tensor(rest: str) -> bool:
    """A block tensor of transformers' routed experts or routing bias (after model.layers.N.), which file_experts
    writes from redline's state instead."""
    return rest.startswith("mlp.experts.") or rest.endswith("e_score_correction_bias")


def file_experts(state, cfg: ModelConfig) -> dict:
    """Each expert layer's experts from redline's (E, 2F, C) / (E, C, F) as ffn_gate_exps / ffn_up_exps (E, F, C) and
    ffn_down_exps (E, C, F), with the routing bias as exp_probs_b.bias where the model has one."""
    out = {}
    for i in range(cfg.n_layer):
        r = f"blocks.{i}.mlp."
        if not cfg.layer_has_experts(i):
            continue
        out[f"blk.{i}.ffn_gate_exps.weight"], out[f"blk.{i}.ffn_up_exps.weight"] = state[r + "fc"].chunk(2, dim=1)
        out[f"blk.{i}.ffn_down_exps.weight"] = state[r + "proj"]
        if cfg.moe_expert_bias:
            out[f"blk.{i}.exp_probs_b.bias"] = state[r + "expert_bias"]
    return out


def text_config(key, vocab: int, tensor_names: set[str], model_type: str, context: int, eps: float = 1e-5,
                layer_norm: bool = False) -> dict:
    """The config.json entries a text model's GGUF gives alike, from the keys llama.cpp's loader reads: widths,
    blocks, heads (head_dim from key_length, else the width over the heads), SiLU, context, the norms' epsilon
    (RMSNorm's, or LayerNorm's where layer_norm), tied embeddings where the file has no output.weight, unscaled RoPE.
    `context` and `eps` are the defaults where the file has no such key."""
    width, heads = key("embedding_length"), key("attention.head_count")
    norm = ("layer_norm_eps", "layer_norm_epsilon") if layer_norm else ("rms_norm_eps", "layer_norm_rms_epsilon")
    return {
        "model_type": model_type, "vocab_size": vocab, "hidden_size": width,
        "intermediate_size": key("feed_forward_length"), "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads, "num_key_value_heads": key("attention.head_count_kv") or heads,
        "head_dim": int(key("attention.key_length") or width // heads), "hidden_act": "silu",
        "max_position_embeddings": key("context_length", context), norm[0]: key(f"attention.{norm[1]}", eps),
        "tie_word_embeddings": "output.weight" not in tensor_names, "rope_parameters": rope_parameters(key),
    }


def rope_parameters(key, fields: dict | None = None, divisors: torch.Tensor | None = None,
                    config: dict | None = None) -> dict:
    """config.json's rope_parameters: the file's base, unscaled, or with Llama 3 scaling recovered from the
    rope_freqs divisors where the file has them (gguf_file._llama3_scaling, from the fields and the config's heads)."""
    theta = float(key("rope.freq_base", 10000.0))
    if divisors is None:
        return {"rope_type": "default", "rope_theta": theta}
    from redline.interop.gguf_file import _llama3_scaling

    return {**_llama3_scaling(fields, divisors, {**config, "rope_theta": theta}), "rope_theta": theta}


def refuse_rope_scaling(key, arch: str, why: str = "") -> None:
    """A UserError for a file whose rope.scaling.type redline does not read (`why` said after)."""
    if key("rope.scaling.type") not in (None, "none"):
        raise UserError(f"the GGUF's {arch} RoPE scaling {key('rope.scaling.type')!r} is not read by redline{why}; "
                        f"import the model's Hugging Face folder")


def map_file_tensors(file_names: set[str], read_file, block: dict, top: dict, arch: str, special=None,
                     layers: int | None = None, experts: str = "mlp.experts.", transposed: bool = False) -> dict:
    """{transformers name: read} for a file's tensors under llama.cpp's names (block: transformers' name after
    model.layers.N. -> the file's after blk.N.; top: the rest), the stacked experts as <experts>gate_up_proj
    (E, 2F, C) / down_proj (E, C, F), or where transposed (E, C, 2F) / (E, F, C) (Llama 4's); special(i, rest, p)
    takes a block tensor of its own first (True: placed); blocks from `layers` on left out (multi-token prediction
    layers). A name outside the maps is a UserError."""
    block, top = {v: k for k, v in block.items()}, {v: k for k, v in top.items()}
    turn = (lambda t: t.transpose(1, 2).contiguous()) if transposed else (lambda t: t)
    names, unknown = {}, []
    for name in file_names:
        if m := re.match(r"blk\.(\d+)\.(.+)$", name):
            i, rest, p = m[1], m[2], f"model.layers.{m[1]}."
            if layers is not None and int(i) >= layers or special is not None and special(i, rest, p):
                continue
            if rest in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
                names[p + experts + "gate_up_proj"] = lambda i=i: turn(torch.cat(
                    [read_file(f"blk.{i}.ffn_gate_exps.weight"), read_file(f"blk.{i}.ffn_up_exps.weight")], dim=1))
            elif rest == "ffn_down_exps.weight":
                names[p + experts + "down_proj"] = lambda name=name: turn(read_file(name))
            elif rest in block:
                names[p + block[rest]] = lambda name=name: read_file(name)
            else:
                unknown.append(name)
        elif name in top:
            names[top[name]] = lambda name=name: read_file(name)
        else:
            unknown.append(name)
    if unknown:
        raise UserError(f"tensors {', '.join(sorted(unknown)[:3])} have no place in a {arch} model redline builds")
    return names


def source(names: dict):
    """(transformers names, read) from {name: read}."""
    return set(names), lambda name: names[name]()
