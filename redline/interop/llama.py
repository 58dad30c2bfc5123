"""The Llama layout: Llama (SmolLM2, TinyLlama, Llama 3), Mistral (and Ministral 3), Qwen2/2.5, Qwen3 and SmolLM3.

All five name their tensors alike (`model.layers.N.self_attn.q_proj.weight`, `mlp.gate_proj`, ...) and run the same
block: pre-RMSNorm, RoPE on (first half, second half) pairs as redline does, SwiGLU, grouped-query attention. They
differ in:
- Llama: optional biases on q/k/v/o (`attention_bias`) and the MLP (`mlp_bias`), Llama 3 RoPE scaling;
- Mistral: a sliding window (query i attends keys j with i - j < window), no biases;
- Ministral 3: Mistral with YaRN and a query scale past the original context, imported up to it (below it
  the scale is 1: ministral3_model_config);
- Qwen2: biases on q/k/v only (redline's `qkv_bias`), optionally a sliding window on every layer;
- Qwen3: QK-norm (an RMSNorm over each head's q and k, learned weights) and a head width of its own (`head_dim`);
- SmolLM3: Llama's block with RoPE left out of one layer in four (`no_rope_layers`: redline's `nope_interval`).

redline holds q/k/v as one fused projection (rows [q; k; v]) and the SwiGLU gate and up as one (rows [gate; up]):
importing concatenates them, exporting splits them by their sizes.

OLMo 2 (olmo2.py) and Gemma 3 (gemma3.py) name their tensors alike too, with norms on the sublayers' outputs (and,
Gemma's, on their inputs as well): `to_redline` and `to_hf` serve them, the norms' names taken from NORM_NAMES by the
block's norm placement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.model import ModelConfig, rope_attention_factor, yarn_mscale

_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _rope(hf: dict) -> dict:
    """ModelConfig's RoPE fields from `rope_parameters` (transformers >= 5) or `rope_theta` + `rope_scaling`."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    spec = params if params.get("rope_type", "default") != "default" else scaling
    kind = spec.get("rope_type", spec.get("type", "default"))
    if kind not in _ROPE_TYPES:
        raise UserError(f"RoPE scaling {kind!r} is not supported; redline has {', '.join(_ROPE_TYPES)}")
    out = {"rope_theta": float(theta)}
    needed = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
              "yarn": ("factor",)}.get(kind, ())
    missing = [k for k in needed if spec.get(k) is None]
    if missing:
        raise UserError(f"RoPE scaling {kind!r} needs {', '.join(missing)} in rope_parameters / rope_scaling")
    if kind == "linear":
        out.update(rope_scaling="linear", rope_factor=float(spec["factor"]))
    elif kind == "llama3":
        # transformers takes max_position_embeddings where the original context is not given
        original = spec.get("original_max_position_embeddings") or hf.get("max_position_embeddings")
        if original is None:
            raise UserError("RoPE scaling 'llama3' needs original_max_position_embeddings (or "
                            "max_position_embeddings)")
        out.update(rope_scaling="llama3", rope_factor=float(spec["factor"]),
                   rope_low_freq_factor=float(spec["low_freq_factor"]),
                   rope_high_freq_factor=float(spec["high_freq_factor"]), rope_original_context=int(original))
    elif kind == "yarn":
        original = (hf.get("original_max_position_embeddings") or spec.get("original_max_position_embeddings")
                    or hf.get("max_position_embeddings"))  # transformers' order (Phi-3 keeps it at the top level)
        out.update(yarn_parameters(spec, original))
    return out


def yarn_parameters(spec: dict, original) -> dict:
    """ModelConfig's YaRN fields from a rope_scaling dict, as transformers reads it: beta_fast / beta_slow 32 / 1 when
    absent, and the attention factor resolved once here (given; else from mscale / mscale_all_dim as DeepSeek's
    configs give them; else 0.1 ln(factor) + 1, which rope_attention_factor derives from 0)."""
    if original is None:
        raise UserError("RoPE scaling 'yarn' needs original_max_position_embeddings (or max_position_embeddings)")
    factor = float(spec["factor"])
    attention = spec.get("attention_factor")
    mscale, mscale_all_dim = spec.get("mscale"), spec.get("mscale_all_dim")
    if attention is None and mscale and mscale_all_dim:
        attention = yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(mscale_all_dim))
    return {"rope_scaling": "yarn", "rope_factor": factor, "rope_original_context": int(original),
            "rope_beta_fast": float(spec.get("beta_fast") or 32.0),
            "rope_beta_slow": float(spec.get("beta_slow") or 1.0),
            "rope_attention_factor": float(attention or 0.0), "rope_truncate": bool(spec.get("truncate", True))}


def _window(hf: dict, name: str) -> int:
    """The sliding window every layer uses (0: none); a UserError for a mix of full and windowed layers."""
    window = hf.get("sliding_window") or 0
    if name == "mistral":
        return int(window)
    if name not in ("qwen2", "qwen3") or not hf.get("use_sliding_window") or not window:
        return 0
    kinds = set(hf.get("layer_types") or [])
    if not kinds:  # transformers < 5: layers from max_window_layers on use the window
        first = hf.get("max_window_layers", hf["num_hidden_layers"])
        kinds = {"sliding_attention" if i >= first else "full_attention" for i in range(hf["num_hidden_layers"])}
    if kinds == {"sliding_attention"}:
        return int(window)
    if kinds == {"full_attention"}:
        return 0
    raise UserError("a mix of full and sliding-window attention layers (layer_types / max_window_layers) is not "
                    "supported; redline applies one sliding window to every layer")


def layer_windows(hf: dict, n_layer: int, default: list[str]) -> dict:
    """ModelConfig's window fields from `layer_types` (`default` where the config gives none): sliding_window with
    sliding_window_pattern where the full layers fall on every N-th (redline's (i + 1) % N == 0), else with the
    windowed layers named (window_layers); a UserError for a kind other than sliding_attention / full_attention."""
    window = int(hf.get("sliding_window") or 0)
    kinds = hf.get("layer_types") or default
    if len(kinds) != n_layer or not set(kinds) <= {"sliding_attention", "full_attention"}:
        raise UserError(f"layer_types {kinds}: expected {n_layer} entries of sliding_attention / full_attention")
    windowed = [k == "sliding_attention" for k in kinds]
    if not any(windowed) or not window:
        return {"sliding_window": 0}
    if all(windowed):
        return {"sliding_window": window}
    pattern = windowed.index(False) + 1
    if windowed == [(i + 1) % pattern != 0 for i in range(n_layer)]:
        return {"sliding_window": window, "sliding_window_pattern": pattern}
    return {"sliding_window": window, "window_layers": tuple(i for i, w in enumerate(windowed) if w)}


def _nope_interval(hf: dict) -> int:
    """SmolLM3's NoPE layers as ModelConfig.nope_interval: `no_rope_layers` (1 where a layer rotates, 0 where not)
    must leave out exactly every N-th layer; transformers builds it so from `no_rope_layer_interval` when absent."""
    n = hf["num_hidden_layers"]
    flags = hf.get("no_rope_layers")
    if flags is None:
        interval = int(hf.get("no_rope_layer_interval") or 4)
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    if len(flags) != n:
        raise UserError(f"no_rope_layers has {len(flags)} entries for {n} layers")
    nope = [i for i, flag in enumerate(flags) if not flag]
    if not nope:
        return 0
    interval = nope[0] + 1
    if [int((i + 1) % interval != 0) for i in range(n)] != [int(bool(f)) for f in flags]:
        raise UserError(f"no_rope_layers leaves out RoPE on layers {nope}, not on one layer in every {interval}; "
                        f"redline takes layers without RoPE at a fixed interval (model.nope_interval)")
    if hf.get("use_sliding_window") and hf.get("sliding_window"):
        raise UserError("use_sliding_window=true on a SmolLM3 model (a window on its layers without RoPE) is not "
                        "supported")
    return interval


def check_silu(hf: dict) -> None:
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UserError(f"hidden_act={act!r}: redline's SwiGLU uses SiLU; this model's MLP is not supported")


def shape_fields(hf: dict, context_len: int = 2048) -> dict:
    """The ModelConfig fields every Llama-layout config (OLMo 2's and Gemma 3's too) gives alike: vocabulary,
    context (`context_len` where the config names none), depth, widths and heads."""
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or width // heads
    return dict(vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", context_len),
                n_layer=hf["num_hidden_layers"], n_embd=width, n_head=heads,
                n_kv_head=hf.get("num_key_value_heads") or heads,
                head_size=head_dim if head_dim * heads != width else None, mlp_hidden=hf["intermediate_size"])


def model_config_for(name: str):
    def model_config(hf: dict) -> ModelConfig:
        check_silu(hf)
        attention_bias = bool(hf.get("attention_bias", False))
        mlp_bias = bool(hf.get("mlp_bias", False))
        if attention_bias != mlp_bias:  # redline's `bias` covers o_proj and the MLP together
            raise UserError(f"attention_bias={attention_bias} with mlp_bias={mlp_bias}: redline has biases on "
                            f"q/k/v alone or on every Linear layer, not this mix")
        return ModelConfig(
            **shape_fields(hf), qk_norm=name == "qwen3", fused_qkv=True, sliding_window=_window(hf, name),
            pos_emb="rope", mlp="swiglu", fused_mlp=True, norm="rmsnorm",
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bias=attention_bias, qkv_bias=True if name == "qwen2" else None, **_rope(hf),
            nope_interval=_nope_interval(hf) if name == "smollm3" else 0,
        )

    return model_config


def export_name(cfg: ModelConfig) -> str:
    """Which of the four a RoPE + RMSNorm + SwiGLU redline model exports as (see the module docstring), or OLMo 2 for
    one with its norms on the sublayers' outputs (families.export_family checks it first)."""
    if cfg.moe_experts:
        from redline.interop import moe

        return moe.export_name(cfg)
    if cfg.norm_position == "output":
        return "olmo2"
    if cfg.norm_position == "sandwich":
        return "gemma3_text"
    if cfg.nope_interval:
        others = [name for name, on in (("qk_norm", cfg.qk_norm), ("sliding_window", cfg.sliding_window),
                                        ("qkv_bias", cfg.has_qkv_bias and not cfg.bias)) if on]
        if others:
            raise UserError(f"model.nope_interval with model.{others[0]}: SmolLM3, the one architecture with layers "
                            f"without RoPE redline exports to, has Llama's attention (no QK-norm, no window, biases on "
                            f"every Linear layer or none)")
        return "smollm3"
    if cfg.qk_norm and cfg.qk_norm_scope != "head":
        raise UserError("model.qk_norm_scope=all with pre-norm blocks: OLMo 2, the one architecture redline exports "
                        "to with QK-norm over whole projections, has its norms on the sublayers' outputs "
                        "(norm_position=output)")
    if cfg.qk_norm:
        if cfg.bias:
            raise UserError("model.bias=true with model.qk_norm: Qwen3 has no MLP biases")
        return "qwen3"  # with a sliding window on every layer where the model has one
    if cfg.sliding_window:
        if cfg.bias:
            raise UserError("model.sliding_window with model.bias=true: Mistral and Qwen2, the sliding-window "
                            "architectures redline exports to, have no output-projection or MLP biases")
        return "qwen2" if cfg.has_qkv_bias else "mistral"
    if cfg.has_qkv_bias and not cfg.bias:
        return "qwen2"
    return "llama"


def rope_scaling(cfg: ModelConfig, arch: str) -> dict | None:
    """config.json's rope_scaling for the model's linear, Llama 3 or YaRN scaling (None without one), as the Llama
    layout and the architectures built like it (GPT-NeoX, Phi, Gemma, StarCoder2, ...) read it; LongRoPE is Phi-3's
    alone (phi3.py), an error for `arch`."""
    if cfg.rope_scaling == "linear":
        return {"rope_type": "linear", "factor": cfg.rope_factor}
    if cfg.rope_scaling == "llama3":
        return {"rope_type": "llama3", "factor": cfg.rope_factor, "low_freq_factor": cfg.rope_low_freq_factor,
                "high_freq_factor": cfg.rope_high_freq_factor,
                "original_max_position_embeddings": cfg.rope_original_context}
    if cfg.rope_scaling == "yarn":
        return {"rope_type": "yarn", "factor": cfg.rope_factor,
                "original_max_position_embeddings": cfg.rope_original_context, "beta_fast": cfg.rope_beta_fast,
                "beta_slow": cfg.rope_beta_slow, "attention_factor": rope_attention_factor(cfg),
                "truncate": cfg.rope_truncate}
    if cfg.rope_scaling != "none":
        raise UserError(f"model.rope_scaling={cfg.rope_scaling}: the {arch} architecture has no such RoPE scaling; "
                        f"of the architectures redline exports to, Phi-3 has it")
    return None


def hf_config_for(name: str):
    def hf_config(cfg: ModelConfig) -> dict:
        out = {
            "model_type": name, "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
            "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
            "hidden_act": "silu", "max_position_embeddings": cfg.context_len, "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta, "rope_scaling": rope_scaling(cfg, name),
            "tie_word_embeddings": cfg.tie_embeddings,
            "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        }
        if name == "llama":
            out.update(attention_bias=cfg.bias, mlp_bias=cfg.bias, pretraining_tp=1)
        elif name == "smollm3":  # the token ids' defaults are SmolLM3's 128k vocabulary's: the writer sets them
            out.update(attention_bias=cfg.bias, mlp_bias=cfg.bias, no_rope_layer_interval=cfg.nope_interval,
                       no_rope_layers=[int(cfg.layer_rope(i)) for i in range(cfg.n_layer)], use_sliding_window=False,
                       sliding_window=None, layer_types=["full_attention"] * cfg.n_layer, pad_token_id=None,
                       bos_token_id=None, eos_token_id=None)
        elif name in ("qwen2", "qwen3"):  # the window on every layer: layer_types (transformers >= 5), and
            # max_window_layers 0 for older readers (layers from it on use the window)
            window = cfg.sliding_window
            out.update(use_sliding_window=bool(window), sliding_window=window or None,
                       max_window_layers=0 if window else cfg.n_layer,
                       layer_types=["sliding_attention" if window else "full_attention"] * cfg.n_layer)
            if name == "qwen3":  # attention_bias: q/k/v/o; redline's qkv-only biases get a zero o_proj bias
                out["attention_bias"] = cfg.has_qkv_bias
        elif name == "mistral":
            out["sliding_window"] = cfg.sliding_window or None
        return out

    return hf_config


def llama_shaped_hf_config(cfg: ModelConfig, model_type: str) -> dict:
    """Llama's config.json entries for a family of Llama's names and block (Granite, Arcee, Nemotron, Helium, ...),
    as `model_type`, without the pretraining_tp Llama's own config keeps."""
    out = hf_config_for("llama")(cfg)
    out.pop("pretraining_tp", None)
    return {**out, "model_type": model_type}


def to_llama_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """to_hf in Llama's names whatever export_name would pick (families whose layers Llama's names cover)."""
    return to_hf(state, cfg, "llama")


# redline's block norms -> Hugging Face's names (after model.layers.N.), by ModelConfig.norm_position. OLMo 2's
# post_attention_layernorm is the attention output's norm, where Llama's of that name is the MLP input's.
NORM_NAMES = {
    "pre": {"norm1": "input_layernorm", "norm2": "post_attention_layernorm"},
    "output": {"attn_out_norm": "post_attention_layernorm", "mlp_out_norm": "post_feedforward_layernorm"},
    "sandwich": {"norm1": "input_layernorm", "attn_out_norm": "post_attention_layernorm",
                 "norm2": "pre_feedforward_layernorm", "mlp_out_norm": "post_feedforward_layernorm"},
}


def block_norm_names(cfg: ModelConfig) -> dict[str, str]:
    """NORM_NAMES of the model's blocks; one norm a block for parallel sublayers (StableLM's input_layernorm alone)."""
    names = NORM_NAMES[cfg.norm_position]
    return {k: v for k, v in names.items() if k != "norm2"} if cfg.parallel_shared_norm else names


def norm_kinds(cfg: ModelConfig) -> tuple[str, ...]:
    """The tensors of each norm: a LayerNorm's weight and bias (StableLM's), none for norms without weights (OLMo's),
    else the weight."""
    if not cfg.norm_affine:
        return ()
    has_bias = cfg.norm == "layernorm" and (cfg.bias if cfg.norm_bias is None else cfg.norm_bias)
    return ("weight", "bias") if has_bias else ("weight",)


def _prefix(src: TensorSource) -> str:
    """"model." for a ForCausalLM state dict, "" for one saved from the bare model."""
    return "" if "embed_tokens.weight" in src and "model.embed_tokens.weight" not in src else "model."


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    pre = _prefix(src)
    kinds = norm_kinds(cfg)
    out = {f"norm_f.{kind}": src.take(f"{pre}norm.{kind}") for kind in kinds}
    out["wte.weight"] = pad_rows(src.take(f"{pre}embed_tokens.weight"), cfg)
    out.update(take_head(src, cfg))
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        for ours, theirs in block_norm_names(cfg).items():
            for kind in kinds:
                out[f"{r}{ours}.{kind}"] = src.take(f"{p}{theirs}.{kind}")
        out[r + "attn.qkv.weight"] = torch.cat([src.take(f"{attn}{x}_proj.weight") for x in "qkv"])
        if cfg.has_qkv_bias:
            out[r + "attn.qkv.bias"] = torch.cat([src.take(f"{attn}{x}_proj.bias") for x in "qkv"])
        out[r + "attn.proj.weight"] = src.take(attn + "o_proj.weight")
        if cfg.qk_norm:
            out[r + "attn.q_norm.weight"] = src.take(attn + "q_norm.weight")
            out[r + "attn.k_norm.weight"] = src.take(attn + "k_norm.weight")
        if cfg.bias:
            out[r + "attn.proj.bias"] = src.take(attn + "o_proj.bias")
        if cfg.attn_sinks:  # (H,) logits (Granite SWA's)
            out[r + "attn.sinks"] = src.take(attn + "sinks")
        if cfg.layer_has_experts(i):  # a mixture of experts (moe.py); its dense first layers below
            from redline.interop.moe import experts_to_redline

            out.update(experts_to_redline(src, p, r, cfg))
            continue
        for kind in ("weight", "bias") if cfg.bias else ("weight",):
            if cfg.gated_mlp:
                out[f"{r}mlp.fc.{kind}"] = torch.cat([src.take(f"{mlp}gate_proj.{kind}"),
                                                      src.take(f"{mlp}up_proj.{kind}")])
            else:  # a plain MLP (Arcee's ReLU²): up, then down
                out[f"{r}mlp.fc.{kind}"] = src.take(f"{mlp}up_proj.{kind}")
            out[f"{r}mlp.proj.{kind}"] = src.take(f"{mlp}down_proj.{kind}")
    return out


def _split_qkv(t: torch.Tensor, cfg: ModelConfig) -> list[torch.Tensor]:
    q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    return list(t.split([q, kv, kv]))


def _mlp_parts(state: Mapping[str, torch.Tensor], r: str, cfg: ModelConfig, kind: str):
    """(gate, up) weights or biases of block r, from the fused fc or the separate Linear layers."""
    if cfg.fused_mlp:
        return state[f"{r}mlp.fc.{kind}"].chunk(2)
    return state[f"{r}mlp.fc.{kind}"], state[f"{r}mlp.up.{kind}"]


def _qkv(state: Mapping[str, torch.Tensor], r: str, cfg: ModelConfig, kind: str) -> list[torch.Tensor]:
    if cfg.fused_qkv:
        return _split_qkv(state[f"{r}attn.qkv.{kind}"], cfg)
    return [state[f"{r}attn.{x}.{kind}"] for x in "qkv"]


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig, name: str | None = None) -> dict:
    """redline's state dict -> the Llama layout's names, for architecture `name` (None: export_name's)."""
    V = cfg.vocab_size
    name = name or export_name(cfg)
    kinds = norm_kinds(cfg)
    out = {f"model.norm.{kind}": state[f"norm_f.{kind}"] for kind in kinds}
    out["model.embed_tokens.weight"] = state["wte.weight"][:V]
    out.update(give_head(state, cfg))
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        for ours, theirs in block_norm_names(cfg).items():
            for kind in kinds:
                out[f"{p}{theirs}.{kind}"] = state[f"{r}{ours}.{kind}"]
        for x, t in zip("qkv", _qkv(state, r, cfg, "weight")):
            out[f"{attn}{x}_proj.weight"] = t
        if cfg.has_qkv_bias:
            for x, t in zip("qkv", _qkv(state, r, cfg, "bias")):
                out[f"{attn}{x}_proj.bias"] = t
        out[attn + "o_proj.weight"] = state[r + "attn.proj.weight"]
        if cfg.bias:
            out[attn + "o_proj.bias"] = state[r + "attn.proj.bias"]
        elif name in ("qwen3", "olmo2") and cfg.has_qkv_bias:  # their attention_bias puts a bias on o_proj too
            out[attn + "o_proj.bias"] = torch.zeros_like(state[r + "attn.proj.weight"][:, 0])
        if cfg.qk_norm:
            out[attn + "q_norm.weight"] = state[r + "attn.q_norm.weight"]
            out[attn + "k_norm.weight"] = state[r + "attn.k_norm.weight"]
        if cfg.attn_sinks:
            out[attn + "sinks"] = state[r + "attn.sinks"]
        if cfg.layer_has_experts(i):  # a mixture of experts (moe.py); its dense first layers below
            from redline.interop.moe import experts_to_hf

            out.update(experts_to_hf(state, p, r, cfg, name))
            continue
        for kind in ("weight", "bias") if cfg.bias else ("weight",):
            if cfg.gated_mlp:
                out[f"{mlp}gate_proj.{kind}"], out[f"{mlp}up_proj.{kind}"] = _mlp_parts(state, r, cfg, kind)
            else:
                out[f"{mlp}up_proj.{kind}"] = state[f"{r}mlp.fc.{kind}"]
            out[f"{mlp}down_proj.{kind}"] = state[f"{r}mlp.proj.{kind}"]
    return {k: v.contiguous() for k, v in out.items()}


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM", "smollm3": "SmolLM3ForCausalLM"}


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")  # a buffer older transformers saved; recomputed from the config


FAMILIES = tuple(
    Family(name=n, architecture=arch, model_config=model_config_for(n), hf_config=hf_config_for(n),
           to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
    for n, arch in _ARCHITECTURES.items()
)


def ministral3_model_config(hf: dict) -> ModelConfig:
    """Ministral 3: Mistral's block and names, its queries scaled by 1 + beta · ln(1 + floor(position / original))
    after RoPE (Llama 4's attention temperature: beta rope_parameters' llama_4_scaling_beta, original its
    original_max_position_embeddings; transformers' models/ministral3/modular_ministral3.py). redline has no such
    scale, and below the original context the scale is exactly 1: the import's context stops there (16,384 of
    262,144 at Ministral3Config's defaults), the model equal to transformers at every position it takes."""
    cfg = model_config_for("mistral")(hf)
    params = hf.get("rope_parameters") or {}
    if not params.get("llama_4_scaling_beta"):  # no temperature: Mistral over the whole context
        return cfg
    original = params.get("original_max_position_embeddings")
    if not original:
        raise UserError("rope_parameters.llama_4_scaling_beta without original_max_position_embeddings: the "
                        "queries' scale needs the context it starts past")
    return replace(cfg, context_len=min(cfg.context_len, int(original)))


def ministral3_hf_config(cfg: ModelConfig) -> dict:
    """Mistral's config as Ministral 3's: the RoPE as rope_parameters (Ministral3Config takes no rope_scaling and
    defaults to YaRN) with llama_4_scaling_beta 0, the queries unscaled."""
    out = hf_config_for("mistral")(cfg)
    scaling = out.pop("rope_scaling") or {"rope_type": "default"}
    original = scaling.get("original_max_position_embeddings", cfg.context_len)
    out.update(model_type="ministral3", rope_parameters={**scaling, "rope_theta": out.pop("rope_theta"),
                                                         "llama_4_scaling_beta": 0.0,
                                                         "original_max_position_embeddings": original})
    return out


MINISTRAL3_FAMILY = Family(name="ministral3", architecture="Ministral3ForCausalLM",
                           model_config=ministral3_model_config, hf_config=ministral3_hf_config,
                           to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# Arcee (ArceeForCausalLM, model_type "arcee": AFM-4.5B and its instruct models): Llama's block and names with a plain
# ReLU² MLP, down_proj(relu(up_proj(x))²), no gate (hidden_act "relu2", Nemotron's MLP), its width intermediate_size.
# Semantics read from transformers' models/arcee/modular_arcee.py.


def arcee_model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "relu2")
    if act != "relu2":
        raise UserError(f"hidden_act={act!r}: Arcee's MLP is ReLU² (relu2); redline's Arcee has no other")
    return replace(model_config_for("llama")({**hf, "hidden_act": "silu"}), mlp="relu2", fused_mlp=True)


def check_arcee_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option that Arcee, the architecture a Llama-shaped model with a ReLU² MLP exports as,
    does not have."""
    what = "model.mlp=relu2: Arcee, the one architecture with it and Llama's block redline exports to,"
    raise_first([
        (cfg.qk_norm, f"{what} has no QK-norm (model.qk_norm)"),
        (cfg.sliding_window or cfg.nope_interval or cfg.rope_dims,
         f"{what} attends to the whole context and rotates whole heads of every layer"),
        (cfg.has_qkv_bias != cfg.bias, f"{what} has biases on every Linear layer or none (model.qkv_bias)"),
        (cfg.parallel_residual or cfg.head_bias or cfg.attn_softcap or cfg.logit_softcap,
         f"{what} has sequential sublayers, no head bias and no caps"),
    ])


def arcee_hf_config(cfg: ModelConfig) -> dict:
    return {**llama_shaped_hf_config(cfg, "arcee"), "hidden_act": "relu2", "rope_scaling": rope_scaling(cfg, "arcee")}


ARCEE_FAMILY = Family(name="arcee", architecture="ArceeForCausalLM", model_config=arcee_model_config,
                      hf_config=arcee_hf_config, to_redline=to_redline, to_hf=to_llama_hf, ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# Seed-OSS (ByteDance's SeedOssForCausalLM, model_type "seed_oss": Seed-OSS-36B): Llama's block and names with biases
# on q/k/v (attention_bias, default true) apart from o_proj's (attention_out_bias) and the MLP's (mlp_bias): Qwen2's
# layout where o_proj and the MLP have none, redline's `bias` where all three do. Its attention and residual dropout
# are training-only. Semantics read from transformers' models/seed_oss/modular_seed_oss.py.


def seed_oss_model_config(hf: dict) -> ModelConfig:
    qkv, out, mlp = (bool(hf.get(k, d)) for k, d in (("attention_bias", True), ("attention_out_bias", False),
                                                      ("mlp_bias", False)))
    if out != mlp:  # redline's `bias` covers o_proj and the MLP together
        raise UserError(f"attention_out_bias={out} with mlp_bias={mlp}: redline has biases on q/k/v alone or on every "
                        f"Linear layer, not this mix")
    cfg = model_config_for("llama")({**hf, "attention_bias": out, "mlp_bias": mlp})
    return replace(cfg, qkv_bias=qkv if qkv != out else None)


def seed_oss_hf_config(cfg: ModelConfig) -> dict:
    return {**llama_shaped_hf_config(cfg, "seed_oss"), "attention_bias": cfg.has_qkv_bias,
            "attention_out_bias": cfg.bias, "mlp_bias": cfg.bias, "attention_dropout": 0.0, "residual_dropout": 0.0}


SEED_OSS_FAMILY = Family(name="seed_oss", architecture="SeedOssForCausalLM", model_config=seed_oss_model_config,
                         hf_config=seed_oss_hf_config, to_redline=to_redline, to_hf=to_llama_hf,
                         ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# Nemotron (NVIDIA's NemotronForCausalLM, model_type "nemotron": Nemotron-Mini-4B-Instruct, Minitron-4B/8B-Base):
# Llama's names with LayerNorms that scale by 1 + weight and have biases (LayerNorm1P: norm_unit_offset with
# norm=layernorm), a plain ReLU² MLP (up_proj, down_proj), and RoPE on the first partial_rotary_factor of each head
# (0.5 by default: rope_dims). Semantics read from transformers' models/nemotron/modeling_nemotron.py.


def nemotron_model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "relu2")
    if act != "relu2":
        raise UserError(f"hidden_act={act!r}: Nemotron's MLP is ReLU² (relu2); redline's Nemotron has no other")
    params = hf.get("rope_parameters") or {}
    fraction = float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.5)))
    cfg = model_config_for("llama")({**hf, "hidden_act": "silu", "rms_norm_eps": hf.get("norm_eps", 1e-5)})
    rotated = int(cfg.head_dim * fraction)
    return replace(cfg, mlp="relu2", norm="layernorm", norm_unit_offset=True, norm_bias=True,
                   rope_dims=rotated if rotated != cfg.head_dim else 0)


def wants_nemotron(cfg: ModelConfig) -> bool:
    return cfg.norm == "layernorm" and cfg.norm_unit_offset


def check_nemotron_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option that Nemotron, the one architecture with LayerNorms by 1 + weight redline exports
    to, does not have."""
    what = "model.norm_unit_offset with LayerNorm: Nemotron, the one architecture with it redline exports to,"
    raise_first([
        (cfg.norm_position != "pre" or cfg.parallel_residual or not cfg.norm_affine or cfg.embed_norm,
         f"{what} has pre-norm blocks with learned LayerNorms, sublayers in turn"),
        (cfg.norm_bias is False, f"{what} has LayerNorm biases (model.norm_bias)"),
        (cfg.mlp != "relu2" or cfg.moe_experts or cfg.conv_layers or cfg.delta_layers,
         f"{what} has a dense ReLU² MLP (model.mlp={cfg.mlp}) and attention on every layer"),
        (cfg.qk_norm or cfg.sliding_window or cfg.nope_interval or cfg.rope_local_theta or cfg.rope_layer_theta
         or cfg.pos_emb != "rope" or cfg.rope_scaling not in ("none", "linear", "llama3", "yarn"),
         f"{what} has no QK-norm or window, and one RoPE on every layer"),
        (cfg.has_qkv_bias != cfg.bias, f"{what} has biases on every Linear layer or none (model.qkv_bias)"),
        (cfg.attn_sinks or cfg.attn_gate != "none" or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap
         or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.head_bias
         or cfg.value_embeddings, f"{what} has no sinks, gates, scales, caps or scalars"),
    ])


def nemotron_hf_config(cfg: ModelConfig) -> dict:
    out = llama_shaped_hf_config(cfg, "nemotron")
    rope = {"rope_type": "default", "rope_theta": out.pop("rope_theta"), **(out.pop("rope_scaling") or {}),
            "partial_rotary_factor": (cfg.rope_dims or cfg.head_dim) / cfg.head_dim}
    out.pop("rms_norm_eps")
    return {**out, "hidden_act": "relu2", "norm_eps": cfg.norm_eps, "rope_parameters": rope}


NEMOTRON_FAMILY = Family(name="nemotron", architecture="NemotronForCausalLM", model_config=nemotron_model_config,
                         hf_config=nemotron_hf_config, to_redline=to_redline, to_hf=to_llama_hf,
                         ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# Ministral (MinistralForCausalLM, model_type "ministral": Ministral-8B-Instruct-2410): Mistral's block and names with
# a kind per layer (`layer_types`: sliding_attention with Mistral's window, or full_attention), as redline's
# sliding_window with sliding_window_pattern where every N-th layer is full, else with the windowed layers named
# (window_layers). Without layer_types every layer has the window where the config gives one. Semantics read from
# transformers' models/ministral/modular_ministral.py.


def ministral_model_config(hf: dict) -> ModelConfig:
    n = hf["num_hidden_layers"]
    cfg = model_config_for("mistral")({**hf, "sliding_window": None})
    default = ["sliding_attention" if hf.get("sliding_window") else "full_attention"] * n
    return replace(cfg, **layer_windows(hf, n, default))


def wants_ministral(cfg: ModelConfig) -> bool:
    """Windowed and full layers mixed in Mistral's pre-RMSNorm block without sinks: Ministral's alone among the
    architectures redline exports to (Gemma's norms scale by 1 + weight, Cohere2's block is parallel, EXAONE 4.0's
    and OLMo 3's norms are on the sublayers' outputs, Granite SWA and GPT-OSS have sinks)."""
    return bool(cfg.sliding_window and (cfg.sliding_window_pattern or cfg.window_layers) and not cfg.attn_sinks
                and cfg.norm_position == "pre" and cfg.norm == "rmsnorm" and not cfg.norm_unit_offset
                and not cfg.parallel_residual)


def check_ministral_exportable(cfg: ModelConfig) -> None:
    what = "windowed and full layers in Llama's block: Ministral, the one architecture with them redline exports to,"
    raise_first([
        (cfg.qk_norm, f"{what} has no QK-norm (model.qk_norm)"),
        (cfg.bias or cfg.has_qkv_bias, f"{what} has no Linear biases (model.bias, model.qkv_bias)"),
        (cfg.mlp != "swiglu", f"{what} has a SwiGLU MLP (model.mlp={cfg.mlp})"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_local_theta or cfg.rope_layer_theta,
         f"{what} rotates every layer's whole heads with one RoPE"),
        (cfg.moe_experts or cfg.conv_layers or cfg.delta_layers or cfg.mlp_free_layers or cfg.mixer_free_layers
         or not cfg.norm_affine or cfg.embed_norm, f"{what} has attention and a dense MLP on every layer, learned "
                                                   f"norms"),
        (cfg.attn_gate != "none" or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap or cfg.embed_scale
         or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.head_bias
         or cfg.value_embeddings, f"{what} has no gates, scales, caps or scalars"),
    ])


def ministral_hf_config(cfg: ModelConfig) -> dict:
    out = hf_config_for("mistral")(cfg)
    rope = {"rope_type": "default", "rope_theta": out.pop("rope_theta"), **(out.pop("rope_scaling") or {})}
    return {**out, "model_type": "ministral", "rope_parameters": rope, "sliding_window": cfg.sliding_window,
            "layer_types": ["sliding_attention" if cfg.layer_window(i) else "full_attention"
                            for i in range(cfg.n_layer)]}


MINISTRAL_FAMILY = Family(name="ministral", architecture="MinistralForCausalLM", model_config=ministral_model_config,
                          hf_config=ministral_hf_config, to_redline=to_redline, to_hf=to_llama_hf,
                          ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# CWM (Meta's CwmForCausalLM, model_type "cwm": facebook/cwm, Code World Model 32B): Llama's block and names without
# biases (q/k/v/o_proj never have one; an mlp_bias alone is refused), Llama 3 RoPE scaling, and a kind per layer
# (`layer_types`: sliding_attention with the config's window, or full_attention; without it every fourth layer from
# the first is full), as Ministral's, which is the architecture a CWM model exports as. Semantics read from
# transformers' models/cwm/modular_cwm.py (CwmAttention is Qwen2's without the q/k/v biases).

# CwmConfig's defaults where a config.json leaves them out (its __post_init__ fills them in)
CWM_ROPE = {"rope_type": "llama3", "rope_theta": 1_000_000.0, "factor": 16.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
CWM_WINDOW, CWM_FULL_EVERY = 8192, 4


def cwm_model_config(hf: dict) -> ModelConfig:
    if hf.get("mlp_bias"):
        raise UserError("mlp_bias=true on a CWM model: its attention has no biases, and redline has biases on every "
                        "Linear layer or on q/k/v alone, not on the MLP alone")
    n = hf["num_hidden_layers"]
    rope = hf.get("rope_parameters") or (None if hf.get("rope_scaling") or hf.get("rope_theta") else CWM_ROPE)
    window = hf.get("sliding_window", CWM_WINDOW)
    hf = {**hf, "rope_parameters": rope, "sliding_window": window, "attention_bias": False, "mlp_bias": False}
    cfg = model_config_for("llama")({**hf, "sliding_window": None})
    default = ["full_attention" if i % CWM_FULL_EVERY == 0 else "sliding_attention" for i in range(n)]
    return replace(cfg, **layer_windows(hf, n, default))


def cwm_hf_config(cfg: ModelConfig) -> dict:
    """Ministral's config as CWM's (which takes the same keys): for writing a CWM folder; export_family sends a model
    of this layout to Ministral, the architecture that has it."""
    return {**ministral_hf_config(cfg), "model_type": "cwm"}


CWM_FAMILY = Family(name="cwm", architecture="CwmForCausalLM", model_config=cwm_model_config,
                    hf_config=cwm_hf_config, to_redline=to_redline, to_hf=to_llama_hf, ignorable=_ignorable)


# ----------------------------------------------------------------------------------------------------
# Jais 2 (Inception's Jais2ForCausalLM, model_type "jais2": Jais-2-8B-Chat): Llama's block and names with LayerNorms
# that have biases (input_layernorm, post_attention_layernorm, the final norm: nn.LayerNorm at layer_norm_eps) and
# Nemotron's plain MLP, down_proj(relu(up_proj(x))²) (hidden_act "relu2"), biases on q/k/v/o_proj (attention_bias) and
# on the MLP (mlp_bias), both true by default. Semantics read from transformers' models/jais2/modular_jais2.py.


def jais2_model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "relu2")
    if act != "relu2":
        raise UserError(f"hidden_act={act!r}: Jais 2's MLP is ReLU² (relu2); redline's Jais 2 has no other")
    hf = {**hf, "hidden_act": "silu", "attention_bias": hf.get("attention_bias", True),
          "mlp_bias": hf.get("mlp_bias", True), "rms_norm_eps": hf.get("layer_norm_eps", 1e-5)}
    return replace(model_config_for("llama")(hf), mlp="relu2", norm="layernorm", norm_bias=True)


def wants_jais2(cfg: ModelConfig) -> bool:
    """Llama's pre-norm block with LayerNorm and a ReLU² MLP rotating whole heads: Jais 2's (Nemotron's LayerNorms
    scale by 1 + weight, Arcee's are RMSNorms, Persimmon rotates part of each head)."""
    return bool(cfg.pos_emb == "rope" and cfg.norm == "layernorm" and cfg.mlp == "relu2" and not cfg.norm_unit_offset
                and cfg.norm_position == "pre" and not cfg.parallel_residual and not cfg.rope_dims)


def check_jais2_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option that Jais 2, the architecture a RoPE + LayerNorm + ReLU² model exports as, does
    not have."""
    what = "model.mlp=relu2 with LayerNorm and RoPE: Jais 2, the one architecture with them redline exports to,"
    raise_first([
        (not cfg.norm_affine or cfg.embed_norm, f"{what} has learned LayerNorms, none on the embeddings"),
        (cfg.qk_norm, f"{what} has no QK-norm (model.qk_norm)"),
        (cfg.sliding_window or cfg.nope_interval or cfg.rope_dims or cfg.rope_local_theta or cfg.rope_layer_theta,
         f"{what} attends to the whole context and rotates whole heads of every layer"),
        (cfg.has_qkv_bias != cfg.bias, f"{what} has biases on every Linear layer or none (model.qkv_bias)"),
        (cfg.moe_experts or cfg.conv_layers or cfg.delta_layers or cfg.mlp_free_layers or cfg.mixer_free_layers,
         f"{what} has attention and a dense MLP on every layer"),
        (cfg.attn_sinks or cfg.attn_gate != "none" or cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap
         or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.logit_divisor or cfg.head_bias
         or cfg.value_embeddings, f"{what} has no sinks, gates, scales, caps or scalars"),
    ])


def jais2_hf_config(cfg: ModelConfig) -> dict:
    out = llama_shaped_hf_config(cfg, "jais2")
    out.pop("rms_norm_eps")
    return {**out, "hidden_act": "relu2", "layer_norm_eps": cfg.norm_eps, "rope_scaling": rope_scaling(cfg, "jais2")}


def jais2_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """Llama's names, a LayerNorm without a bias (model.norm_bias=false) with a zero one: Jais 2's always have one."""
    out = to_hf(state, cfg, "llama")
    for name in [n for n in out if n.endswith("norm.weight")]:
        out.setdefault(name[:-len("weight")] + "bias", torch.zeros_like(out[name]))
    return out


JAIS2_FAMILY = Family(name="jais2", architecture="Jais2ForCausalLM", model_config=jais2_model_config,
                      hf_config=jais2_hf_config, to_redline=to_redline, to_hf=jais2_to_hf, ignorable=_ignorable)
