"""EXAONE 4.0 (LG AI Research's Exaone4ForCausalLM: EXAONE-4.0-1.2B, EXAONE-4.0-32B): OLMo 2's block with QK-norm
per head.

Each block is h = x + norm(attn(x)), out = h + norm(mlp(h)), the norms on the sublayers' outputs (redline's
norm_position "output", OLMo 2's tensor names), with an RMSNorm over each head's q and k (qk_norm_scope "head", as
Qwen3's). The hybrid models interleave sliding-window layers, which rotate, with full layers, which do not (NoPE):
`layer_types` with one full layer in every N is redline's sliding_window_pattern N with nope_interval N. A model
whose config gives no window attends to the whole context on every layer, all of them rotating. Semantics read from
transformers' models/exaone4/modeling_exaone4.py.
"""

from __future__ import annotations

from redline.errors import UserError
from redline.interop.families import Family, raise_first
from redline.interop.llama import _ignorable, _rope, check_silu, hf_config_for, shape_fields, to_hf, to_redline
from redline.model import ModelConfig


def _layers(hf: dict) -> tuple[int, int]:
    """(sliding_window, its pattern N: layer i full and without RoPE where (i + 1) % N == 0; 0: every layer windowed)
    from sliding_window and layer_types (or sliding_window_pattern, as transformers builds layer_types from it)."""
    n = hf["num_hidden_layers"]
    window = int(hf.get("sliding_window") or 0)
    kinds = hf.get("layer_types")
    if kinds is None:
        pattern = hf.get("sliding_window_pattern")
        if not window:
            kinds = ["full_attention"] * n
        elif isinstance(pattern, str) and pattern:  # "LLLG": L local, G global, repeated from layer 0
            kinds = ["full_attention" if pattern[i % len(pattern)] == "G" else "sliding_attention" for i in range(n)]
        elif pattern:
            kinds = ["full_attention" if (i + 1) % int(pattern) == 0 else "sliding_attention" for i in range(n)]
        else:
            raise UserError("sliding_window is set without layer_types or sliding_window_pattern: which layers use "
                            "the window is not given")
    if len(kinds) != n:
        raise UserError(f"layer_types has {len(kinds)} entries for {n} layers")
    full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
    if not window:
        if len(full) != n:
            raise UserError("layer_types names sliding-window layers, but sliding_window is not set")
        return 0, 0
    if not full:
        return window, 0
    if len(full) == n:
        raise UserError("sliding_window is set with every layer full: EXAONE 4.0 then rotates no layer, which "
                        "redline does not express (its NoPE layers come one in every N)")
    interval = full[0] + 1
    if full != [i for i in range(n) if (i + 1) % interval == 0]:
        raise UserError(f"layer_types puts full-attention layers at {full}, not one in every {interval}; redline "
                        f"takes them at a fixed interval (model.sliding_window_pattern)")
    return window, interval


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    window, pattern = _layers(hf)
    return ModelConfig(
        **shape_fields(hf), qk_norm=True, qk_norm_scope="head", fused_qkv=True, pos_emb="rope", mlp="swiglu",
        fused_mlp=True, norm="rmsnorm", norm_position="output", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False, sliding_window=window,
        sliding_window_pattern=pattern, nope_interval=pattern, **_rope(hf))


def wants_exaone4(cfg: ModelConfig) -> bool:
    """Output norms with QK-norm per head: EXAONE 4.0's (OLMo 2 normalizes whole projections)."""
    return cfg.norm_position == "output" and cfg.qk_norm and cfg.qk_norm_scope == "head"


def check_exportable(cfg: ModelConfig) -> None:
    what = "norm_position=output with per-head QK-norm: EXAONE 4.0, the one architecture with it redline exports to,"
    raise_first([
        (cfg.norm != "rmsnorm" or cfg.mlp != "swiglu", f"{what} has RMSNorm and SwiGLU (model.norm={cfg.norm}, "
                                                       f"model.mlp={cfg.mlp})"),
        (cfg.pos_emb != "rope" or cfg.rope_dims, f"{what} rotates whole heads with RoPE"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no biases (model.bias, model.qkv_bias)"),
        (cfg.nope_interval != (cfg.sliding_window_pattern if cfg.sliding_window else 0),
         f"{what} leaves RoPE out of exactly its full-attention layers (model.nope_interval="
         f"{cfg.nope_interval}, model.sliding_window_pattern={cfg.sliding_window_pattern})"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    out = hf_config_for("llama")(cfg)
    for key in ("pretraining_tp", "attention_bias", "mlp_bias"):
        out.pop(key, None)
    window = cfg.sliding_window
    kinds = ["sliding_attention" if window and cfg.layer_window(i) else "full_attention" for i in range(cfg.n_layer)]
    return {**out, "model_type": "exaone4", "sliding_window": window or None,
            "sliding_window_pattern": cfg.sliding_window_pattern if window else None, "layer_types": kinds,
            "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}  # the writer sets the token ids


FAMILY = Family(name="exaone4", architecture="Exaone4ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
