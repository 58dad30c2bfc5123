"""Dory (NVIDIA's Nemotron-Labs Dory, DoryForCausalLM, model_type "dory"): nGPT layers (model.ngpt) on Llama's names
with a recurrent section of layers run n_recurrent_loops times (model.loop_section, loop_passes).

What Dory's layer computes (transformers' models/dory/modeling_dory.py), and where redline holds it:
- every norm a weightless L2 norm, eps 1e-6 (model.norm=l2): on each sublayer's input and output (sandwich), per
  head on q and k before RoPE (QK-norm), on the gated heads' output before o_proj (attn_sub_norm) and on the MLP's
  hidden activation before down_proj (ffn_sub_norm), and the final one;
- each sublayer's normed output interpolated toward, h ← h + |λ| ⊙ (out - h), λ = lambda_1 (lambda_2) times
  ngpt_alpha_init / initializer_range (Block.attn_rate, mlp_rate, stored so scaled);
- the queries scaled per channel after RoPE by (sqk · sqrt(D) / initializer_range)² (Attention.q_scale, stored as
  the scale before squaring);
- an element-wise sigmoid gate on the heads, sigmoid(gate_proj(x) · (s_gate · C^¼ / initializer_range)²)
  (model.attn_gate=element): the per-row factor is folded into gate_proj's rows;
- SwiGLU's gate and up outputs times suv_gate · sqrt(C) and suv_up · sqrt(C): folded into their rows;
- the head's logits times logit_scale / initializer_range, per token: folded into lm_head's rows (so an import's
  head is untied);
- the loop: input layers once, the recurrent layers n_recurrent_loops times, each pass from l2(h) + l2(h₀), h₀ the
  input section's output, then the output layers. redline unrolls the passes (n_layer counts them all) over the same
  blocks, each pass with its own KV cache, as transformers' per_loop cache keeps them.

Refused by name: recurrent_kv_cache_mode=last_loop (the earlier passes read the last pass's cached keys, so
generation with a cache computes other tokens than a forward without one; redline caches each pass apart),
hidden_act other than SiLU, biases, dropout. Released checkpoints' names (backbone., layers 2i and 2i + 1 for a
layer's attention and MLP, mixer, g_proj, attn_alpha, mlp_alpha; transformers' LayerPairCollapse) are read as well
as transformers' own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop import gemma3
from redline.interop.families import Family, TensorSource, pad_rows, raise_first
from redline.interop.llama import _ignorable, _mlp_parts, _qkv, shape_fields
from redline.model import ModelConfig

_FULL, _SLIDING = "full_attention", "sliding_attention"
_EPS = 1e-6  # DoryL2Norm's, not a config entry
# what an export writes for the scale factors' bases (DoryConfig's defaults)
_INIT_RANGE, _ALPHA_INIT = 0.0177, 0.05


def _layout(hf: dict) -> dict:
    """The config with one layer_types entry a decoder layer: released config.json files (and DoryConfig.to_dict)
    list each layer as an attention block then an "mlp" block, with every layer count doubled."""
    kinds = hf.get("layer_types")
    if not kinds or "mlp" not in kinds:
        return hf
    out = dict(hf, layer_types=kinds[::2], num_hidden_layers=hf["num_hidden_layers"] // 2)
    for key in ("n_input_layers", "n_recurrent_layers", "n_output_layers"):
        if out.get(key) is not None:
            out[key] = out[key] // 2
    return out


def _sections(hf: dict) -> tuple[int, int, int, int]:
    """(input layers, recurrent layers, output layers, loops) of a _layout config, with DoryConfig's defaults."""
    n = hf["num_hidden_layers"]
    first, last = int(hf.get("n_input_layers", 8)), int(hf.get("n_output_layers", 8))
    looped = hf.get("n_recurrent_layers")
    looped = n - first - last if looped is None else int(looped)
    loops = int(hf.get("n_recurrent_loops", 2))
    if first < 0 or last < 0 or looped < 0 or first + looped + last != n or loops < 1:
        raise UserError(f"n_input_layers={first}, n_recurrent_layers={looped}, n_output_layers={last} and "
                        f"n_recurrent_loops={loops} do not split the {n} layers into sections run at least once")
    return first, looped, last, loops


def _kinds(hf: dict) -> list[str]:
    """Each decoder layer's attention kind (DoryConfig's default: every fourth full, the others windowed)."""
    n = hf["num_hidden_layers"]
    kinds = list(hf.get("layer_types") or [_FULL if (i + 1) % 4 == 0 else _SLIDING for i in range(n)])
    if len(kinds) != n or not set(kinds) <= {_FULL, _SLIDING}:
        raise UserError(f"layer_types must name {_SLIDING!r} or {_FULL!r} for each of the {n} layers, got {kinds}")
    return kinds


def _decoder_layer(layer: int, first: int, looped: int, loops: int) -> int:
    """The Dory decoder layer that redline's layer `layer` runs, the recurrent section's passes unrolled (first input
    layers, then looped layers loops times, then the output layers)."""
    end = first + looped * loops
    if layer >= end:
        return layer - looped * (loops - 1)
    return first + (layer - first) % looped if layer >= first + looped else layer


def stored_blocks(cfg: ModelConfig) -> list[int]:
    """redline's blocks that hold weights, in Dory's layer order."""
    return [i for i in range(cfg.n_layer) if cfg.loop_source(i) == i]


def model_config(hf: dict) -> ModelConfig:
    hf = _layout(hf)
    refused = [
        ("recurrent_kv_cache_mode", hf.get("recurrent_kv_cache_mode", "per_loop") != "per_loop",
         "the earlier passes read the last pass's cached keys, so cached generation computes other tokens than the "
         "forward; redline caches each pass apart (per_loop)"),
        ("hidden_act", hf.get("hidden_act", "silu") not in ("silu", "swish"), "Dory's SwiGLU is redline's with SiLU"),
        ("attention_bias", bool(hf.get("attention_bias")), "redline's nGPT layers have no biases"),
        ("mlp_bias", bool(hf.get("mlp_bias")), "redline's nGPT layers have no biases"),
        ("attention_dropout", bool(hf.get("attention_dropout")), "redline imports Dory without its dropout; set 0"),
    ]
    raise_first([(bad, f"{name}={hf.get(name)}: {why}") for name, bad, why in refused])
    first, looped, last, loops = _sections(hf)
    kinds = _kinds(hf)
    window = int(hf.get("sliding_window") or 0)
    shape = shape_fields(hf, context_len=8192)
    n_layer = first + looped * loops + last
    kind = [kinds[_decoder_layer(i, first, looped, loops)] for i in range(n_layer)]
    windowed = tuple(i for i in range(n_layer) if kind[i] == _SLIDING) if window else ()
    return ModelConfig(
        **{**shape, "n_layer": n_layer}, loop_section=(first, looped) if looped else (),
        loop_passes=loops if looped else 1, ngpt=True, norm="l2", norm_eps=_EPS, norm_position="sandwich",
        qk_norm=True, attn_gate="element", fused_qkv=True, pos_emb="rope", mlp="swiglu", fused_mlp=True, bias=False,
        tie_embeddings=False, sliding_window=window if windowed else 0, window_layers=windowed,
        **gemma3._rope_fields(_rope_defaults(hf), bool(windowed)))


def _rope_defaults(hf: dict) -> dict:
    """The config with DoryConfig's RoPE where it gives none: base 10000 on the windowed layers, 10⁷ on the full."""
    if hf.get("rope_parameters") or hf.get("rope_theta") is not None:
        return hf
    return {**hf, "rope_parameters": {_SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                                      _FULL: {"rope_type": "default", "rope_theta": 10_000_000.0}}}


_PAIRED = re.compile(r"layers\.(\d+)\.(mixer|attn_alpha|mlp_alpha)(?=\.|$)")


def canonical(name: str) -> str:
    """A stored tensor's name as transformers' DoryForCausalLM names it (model.layers.i.self_attn.gate_proj, ...),
    undoing what transformers' conversion mapping for dory renames: a saved folder's backbone., embeddings and g_proj,
    and a released checkpoint's layer pairs (layers 2i and 2i + 1 a decoder layer's attention and MLP, their mixer,
    attn_alpha and mlp_alpha: LayerPairCollapse)."""
    name = re.sub(r"^backbone\.", "model.", name).replace(".embeddings.", ".embed_tokens.")
    name = name.replace(".self_attn.g_proj.", ".self_attn.gate_proj.")
    if (m := _PAIRED.search(name)) is not None:
        index, part = int(m[1]), m[2]
        part = {"attn_alpha": "lambda_1", "mlp_alpha": "lambda_2"}.get(part, ("self_attn", "mlp")[index % 2])
        name = f"{name[:m.start()]}layers.{index // 2}.{part}{name[m.end():]}"
        name = name.replace(".self_attn.g_proj.", ".self_attn.gate_proj.")
    return name


def _taker(src: TensorSource):
    """take(canonical name) over the source, whichever of the layouts canonical() reads it stores."""
    stored = {canonical(n): n for n in src.names}
    prefix = "" if "embed_tokens.weight" in stored else "model."

    def take(name: str) -> torch.Tensor:
        if name != "lm_head.weight" and not name.startswith("lm_head."):
            name = prefix + name
        return src.take(stored.get(name, name))

    return take, lambda name: name in stored


def _factors(hf: dict, cfg: ModelConfig) -> dict[str, float]:
    """The constant each stored nGPT scale is multiplied by in transformers' forward (DoryAttention, DoryMLP,
    DoryDecoderLayer, DoryLMHead), from initializer_range and ngpt_alpha_init."""
    init = float(hf.get("initializer_range", _INIT_RANGE))
    return {"sqk": cfg.head_dim ** 0.5 / init, "s_gate": cfg.n_embd ** 0.25 / init, "suv": cfg.n_embd ** 0.5,
            "lambda": float(hf.get("ngpt_alpha_init", _ALPHA_INIT)) / init, "logit": 1.0 / init}


def _scaled_rows(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """A (out, in) weight with row j times scale[j], computed in fp32 and stored in w's dtype."""
    return (w.float() * scale.float()[:, None]).to(w.dtype)


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    """Dory's tensors -> redline's, each stored scale folded into its weight's rows or kept as redline's parameter,
    still without the config's constant factors (fold multiplies them in)."""
    take, has = _taker(src)
    out = {"wte.weight": pad_rows(take("embed_tokens.weight"), cfg)}
    head = take("lm_head.weight") if has("lm_head.weight") else take("embed_tokens.weight")  # tied: the embedding
    out["lm_head.weight"] = pad_rows(_scaled_rows(head, take("lm_head.logit_scale")), cfg, head=True)
    suv = cfg.n_embd ** 0.5
    for j, i in enumerate(stored_blocks(cfg)):
        p, r = f"layers.{j}.", f"blocks.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        out[r + "attn.qkv.weight"] = torch.cat([take(f"{attn}{x}_proj.weight") for x in "qkv"])
        out[r + "attn.proj.weight"] = take(attn + "o_proj.weight")
        out[r + "attn.gate.weight"] = _scaled_rows(take(attn + "gate_proj.weight"), take(attn + "s_gate").float() ** 2)
        out[r + "attn.q_scale"] = take(attn + "sqk")
        gate = _scaled_rows(take(mlp + "gate_proj.weight"), take(mlp + "suv_gate").float() * suv)
        up = _scaled_rows(take(mlp + "up_proj.weight"), take(mlp + "suv_up").float() * suv)
        out[r + "mlp.fc.weight"] = torch.cat([gate, up])
        out[r + "mlp.proj.weight"] = take(mlp + "down_proj.weight")
        out[r + "attn_rate"] = take(p + "lambda_1")
        out[r + "mlp_rate"] = take(p + "lambda_2")
    return out


def fold(hf: dict, cfg: ModelConfig, state: dict) -> dict:
    """to_redline's state with the config's constant factors multiplied in: s_gate's (squared) into the gate rows,
    logit_scale's into the head, sqk's into q_scale, ngpt_alpha_init / initializer_range into the rates."""
    f = _factors(_layout(hf), cfg)

    def times(t: torch.Tensor, factor: float) -> torch.Tensor:
        return (t.float() * factor).to(t.dtype)

    out = dict(state, **{"lm_head.weight": times(state["lm_head.weight"], f["logit"])})
    for i in stored_blocks(cfg):
        r = f"blocks.{i}."
        out[r + "attn.gate.weight"] = times(state[r + "attn.gate.weight"], f["s_gate"] ** 2)
        out[r + "attn.q_scale"] = times(state[r + "attn.q_scale"], f["sqk"])
        out[r + "attn_rate"] = times(state[r + "attn_rate"], f["lambda"])
        out[r + "mlp_rate"] = times(state[r + "mlp_rate"], f["lambda"])
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """redline's weights as Dory's, with every stored scale such that the factor it multiplies by is 1 where redline
    folded it into a weight (s_gate, suv_gate, suv_up, logit_scale), and sqk, lambda_1, lambda_2 from redline's
    q_scale and rates, at the exported initializer_range and ngpt_alpha_init."""
    f = _factors({}, cfg)
    V = cfg.vocab_size
    out = {"model.embed_tokens.weight": state["wte.weight"][:V]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"][:V]
    out["lm_head.logit_scale"] = torch.full((V,), 1.0 / f["logit"], dtype=state["wte.weight"].dtype)
    H, hidden = cfg.n_head * cfg.head_dim, cfg.hidden_dim
    for j, i in enumerate(stored_blocks(cfg)):
        p, r = f"model.layers.{j}.", f"blocks.{i}."
        dtype = state[r + "attn.proj.weight"].dtype
        q, k, v = _qkv(state, r, cfg, "weight")
        out.update({p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                    p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": state[r + "attn.proj.weight"],
                    p + "self_attn.gate_proj.weight": state[r + "attn.gate.weight"],
                    p + "self_attn.sqk": state[r + "attn.q_scale"] / f["sqk"],
                    p + "self_attn.s_gate": torch.full((H,), 1.0 / f["s_gate"], dtype=dtype)})
        gate, up = _mlp_parts(state, r, cfg, "weight")
        out.update({p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                    p + "mlp.down_proj.weight": state[r + "mlp.proj.weight"],
                    p + "mlp.suv_gate": torch.full((hidden,), 1.0 / f["suv"], dtype=dtype),
                    p + "mlp.suv_up": torch.full((hidden,), 1.0 / f["suv"], dtype=dtype),
                    p + "lambda_1": state[r + "attn_rate"] / f["lambda"],
                    p + "lambda_2": state[r + "mlp_rate"] / f["lambda"]})
    return {k: v.contiguous() for k, v in out.items()}


_ADAPTED = {"attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj", "attn.v": "self_attn.v_proj",
            "attn.proj": "self_attn.o_proj", "attn.gate": "self_attn.gate_proj", "mlp.fc": "mlp.gate_proj",
            "mlp.up": "mlp.up_proj", "mlp.proj": "mlp.down_proj"}


def adapter_parts(layer: str, i: int, rest: str, out_features: int, cfg: ModelConfig) -> list[tuple[str, slice]]:
    """The modules of the exported DoryForCausalLM that redline's LoRA layer `layer` (block i's `rest`) becomes, each
    with its rows of the layer's output. The export writes every folded scale as 1 (to_hf), so an adapter moves as it
    is: block i is Dory's layer stored_blocks(cfg).index(i)."""
    base = f"model.layers.{stored_blocks(cfg).index(i)}."
    if rest == "attn.qkv":
        q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        return [(base + "self_attn.q_proj", slice(0, q)), (base + "self_attn.k_proj", slice(q, q + kv)),
                (base + "self_attn.v_proj", slice(q + kv, q + 2 * kv))]
    if rest == "mlp.fc" and cfg.fused_mlp:
        half = out_features // 2
        return [(base + "mlp.gate_proj", slice(0, half)), (base + "mlp.up_proj", slice(half, out_features))]
    if rest not in _ADAPTED:
        raise UserError(f"the adapter on {layer} has no counterpart in DoryForCausalLM; export with --merge")
    return [(base + _ADAPTED[rest], slice(0, out_features))]


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option Dory, the one architecture with nGPT layers and looped sections redline exports
    to, does not have."""
    what = "model.ngpt / loop_section: Dory, the one architecture with them redline exports to,"
    raise_first([
        (not cfg.ngpt, f"{what} has nGPT layers (model.ngpt)"),
        (cfg.norm_eps != _EPS, f"{what} normalizes with eps {_EPS} (model.norm_eps={cfg.norm_eps})"),
        (cfg.attn_gate != "element", f"{what} gates every element of its heads (model.attn_gate=element)"),
        (cfg.mlp != "swiglu", f"{what} has a SwiGLU MLP (model.mlp=swiglu)"),
        (cfg.pos_emb != "rope" or cfg.rope_dims or cfg.nope_interval or cfg.rope_layer_theta or cfg.rope_local_dims,
         f"{what} rotates every layer's whole heads"),
        (cfg.rope_scaling not in ("none", "linear"), f"{what} is written with linear RoPE scaling or none"),
        (cfg.has_qkv_bias or cfg.head_bias, f"{what} has no biases"),
        (cfg.attn_scale or cfg.attn_softcap or cfg.logit_softcap or cfg.logit_divisor or cfg.embed_scale
         or cfg.embed_multiplier or cfg.embed_norm or cfg.attn_sinks or cfg.value_embeddings or cfg.v_norm
         or cfg.layer_scalars or cfg.nope_temperature or cfg.attn_chunk or cfg.pos_emb == "alibi",
         f"{what} has no other scales, caps, sinks or norms"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    first, count = cfg.loop_section or (cfg.n_layer, 0)
    end = first + count * cfg.loop_passes
    unique = stored_blocks(cfg)
    kinds = [_SLIDING if cfg.layer_window(i) else _FULL for i in unique]
    full = gemma3._rope_spec(cfg)
    # windowed layers without a base of their own rotate as the full ones, scaling included
    local = {"rope_type": "default", "rope_theta": cfg.rope_local_theta} if cfg.rope_local_theta else dict(full)
    rope = {_FULL: full, _SLIDING: local}
    return {
        "model_type": "dory", "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": len(unique), "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.context_len, "initializer_range": _INIT_RANGE, "ngpt_alpha_init": _ALPHA_INIT,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "sliding_window": cfg.sliding_window or cfg.context_len, "layer_types": kinds,
        "rope_parameters": {kind: rope[kind] for kind in set(kinds)}, "n_input_layers": first,
        "n_recurrent_layers": count, "n_output_layers": cfg.n_layer - end, "n_recurrent_loops": cfg.loop_passes,
        "recurrent_kv_cache_mode": "per_loop", "use_cache": True,
    }


FAMILY = Family(name="dory", architecture="DoryForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable, fold=fold)
