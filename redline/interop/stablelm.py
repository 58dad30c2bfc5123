"""StableLM (Stability AI's StableLmForCausalLM: stablelm-2-1_6b and its zephyr chat model, stablelm-3b-4e1t): the
Llama layout's names with LayerNorm, RoPE on part of each head and optional q/k/v biases.

Its LayerNorms have biases where its Linear layers have none (redline's norm_bias), RoPE rotates the first
partial_rotary_factor of each head's dimensions (rope_dims), use_qkv_bias puts biases on q, k and v alone (qkv_bias),
the MLP is SwiGLU, and use_parallel_residual makes each block x + attn(ln(x)) + mlp(ln(x)) with its one
input_layernorm (parallel_residual with parallel_shared_norm). Tensor names are Llama's (llama.py's maps); semantics
read from transformers' models/stablelm/modeling_stablelm.py.
"""

from __future__ import annotations

from redline.errors import UserError
from redline.interop.families import Family, raise_first
from redline.interop.llama import _ignorable, _rope, check_silu, shape_fields, to_hf, to_redline
from redline.model import ModelConfig


def _rotary_fraction(hf: dict) -> float:
    """rope_parameters' partial_rotary_factor (transformers >= 5), else the top-level key of the Hub's files."""
    params = hf.get("rope_parameters") or {}
    return float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)))


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    if hf.get("qk_layernorm"):
        raise UserError("qk_layernorm=true: StableLM's QK-norm is a LayerNorm of each head of its own, redline's an "
                        "RMSNorm shared by the heads")
    fields = shape_fields(hf, context_len=4096)
    head_dim = fields["head_size"] or fields["n_embd"] // fields["n_head"]
    rotated = int(head_dim * _rotary_fraction(hf))  # transformers' rotary_ndims
    if rotated <= 0 or rotated % 2:
        raise UserError(f"partial_rotary_factor={_rotary_fraction(hf)} rotates {rotated} of each head's {head_dim} "
                        f"dimensions; redline needs an even number above 0")
    parallel = bool(hf.get("use_parallel_residual", False))
    return ModelConfig(
        **fields, qk_norm=False, fused_qkv=True, pos_emb="rope", rope_dims=0 if rotated == head_dim else rotated,
        mlp="swiglu", fused_mlp=True, norm="layernorm", norm_bias=True, norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
        parallel_residual=parallel, parallel_shared_norm=parallel,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False,
        qkv_bias=True if hf.get("use_qkv_bias") else None, **_rope(hf),
    )


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a RoPE model with LayerNorm and SwiGLU that StableLM does not have."""
    when = "LayerNorm, RoPE and SwiGLU"
    raise_first([
        (cfg.bias, f"model.bias=true with {when}: StableLM has biases on q, k and v alone (model.qkv_bias)"),
        (cfg.norm_bias is False, f"model.norm_bias=false with {when}: StableLM's LayerNorms have biases"),
        (cfg.qk_norm, f"model.qk_norm with {when}: StableLM's QK-norm is a LayerNorm of each head of its own"),
        (cfg.sliding_window > 0, f"model.sliding_window with {when}: StableLM attends to the whole context"),
        (cfg.parallel_residual != cfg.parallel_shared_norm, f"model.parallel_residual with two norms a block and "
                                                            f"{when}: StableLM's parallel blocks have one"),
        (cfg.gelu_approximate != "tanh", f"model.gelu_approximate with {when}: StableLM's MLP is SwiGLU"),
        (cfg.head_bias, f"model.head_bias with {when}: StableLM's head has no bias"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    from redline.interop.llama import hf_config_for

    base = hf_config_for("llama")(cfg)
    fraction = (cfg.rope_dims or cfg.head_dim) / cfg.head_dim
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings", "rope_theta", "rope_scaling",
            "initializer_range", "use_cache")
    return {
        **{k: base[k] for k in keep}, "model_type": "stablelm", "hidden_act": "silu",
        "layer_norm_eps": cfg.norm_eps, "use_qkv_bias": cfg.has_qkv_bias, "qk_layernorm": False,
        "use_parallel_residual": cfg.parallel_residual, "partial_rotary_factor": fraction,
        "rope_parameters": {**(base["rope_scaling"] or {"rope_type": "default"}), "rope_theta": cfg.rope_theta,
                            "partial_rotary_factor": fraction},
        "hidden_dropout": 0.0, "attention_dropout": 0.0,
    }


FAMILY = Family(name="stablelm", architecture="StableLmForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
