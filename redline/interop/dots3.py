"""dots.3 Note Preview's text model (Dots3NoteForCausalLM, model_type "dots3_note_text"), as transformers'
models/dots3_note computes it: DeepSeek-V3.2's blocks (deepseek.py's tensor names) with what its latent attention
adds, each mapped onto a ModelConfig field:

- the normalized q and kv latents scaled by sqrt(hidden_size / q_lora_rank) and sqrt(hidden_size / kv_lora_rank)
  before their up-projections: folded into q_a_norm's and kv_a_norm's weights on import (scale · w · x̂ = (scale · w) ·
  x̂), divided out again on export;
- the latents' norms at rms_norm_eps (model.latent_norm_eps; DeepSeek's at 1e-6), and the shared RoPE key part
  RMS-normed before RoPE (`k_rope_only_layernorm`: model.latent_key_norm);
- a sigmoid gate on each head's output from the block's input (`g_proj`, (H, C): model.attn_gate=head);
- RoPE always on interleaved pairs (apply_rotary_pos_emb_interleave): the rotated rows of q_b_proj and
  kv_a_proj_with_mqa, and the key norm's weight, put in redline's halves order on import, interleaved again on export;
- a kind per layer (`layer_types`): windowed layers ("sliding_attention", `sliding_window`) with a RoPE base of their
  own (model.window_layers, rope_local_theta), the others full ("full_attention") or DeepSeek Sparse Attention
  ("indexed_attention": a lightning indexer keeping each query's `index_topk` best keys). Over at most index_topk keys
  the indexer keeps them all and the attention is dense, as deepseek_kin.py's DeepSeek-V3.2 reads it: the import's
  context stops at index_topk and the indexer's weights are left out, said in one line;
- the MLPs DeepSeek-V3's: dense layers first (`mlp_layer_types`), then sigmoid-scored experts with
  `e_score_correction_bias`, groups and an ungated shared expert `shared_experts_intermediate_size ·
  n_shared_experts` wide.

Refused by name: windowed layers whose heads differ from the others' (`per_layer_config`, `swa_*`: the released
checkpoint's 64 heads of a 1024-wide latent beside 128 of a 512-wide one; redline's latent attention has one head
shape for every layer), RoPE scaling, and what deepseek.py refuses. The Hub's multi-token-prediction layers
(`model.layers.N` past the last, `model.mtp.*`) are left out, as transformers leaves them out.

Exported as dots.3 Note wherever a model has latent_key_norm (the one architecture with it): every non-windowed
layer full attention (`use_dsa` false: no indexer, the dense attention redline computes at every length), the
experts stacked as Dots3NoteExperts holds them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop import deepseek
from redline.interop.deepseek_kin import leave_out_indexer
from redline.interop.families import Family, TensorSource, interleave_rope_rows, raise_first
from redline.model import ModelConfig

_DEFAULTS = dict(vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_hidden_layers=46,
                 num_attention_heads=128, max_position_embeddings=524288, rms_norm_eps=1e-5, q_lora_rank=1024,
                 kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                 moe_intermediate_size=1536, shared_experts_intermediate_size=1536, n_shared_experts=1,
                 n_routed_experts=256, num_experts_per_tok=8, routed_scaling_factor=1.0, n_group=1, topk_group=1,
                 norm_topk_prob=True, index_topk=2048, tie_word_embeddings=False)
"""Dots3NoteTextConfig's (and DeepseekV32Config's, beneath it) defaults for the fields a config.json may leave out."""
_SHAPE = ("num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
"""A latent attention layer's shape fields, which per_layer_config may set apart for a layer."""


def _layers(hf: dict) -> tuple[list[str], dict[int, dict]]:
    """(layer_types, per_layer_config by layer) as Dots3NoteTextConfig settles them: its own derivation where the
    config gives no layer_types (the first two layers and every fourth from the second DSA, the others windowed),
    the swa_* aliases as the windowed layers' overrides."""
    n = int(hf["num_hidden_layers"])
    use_dsa = hf.get("use_dsa", None if "per_layer_config" in hf else True)
    kinds = hf.get("layer_types")
    if kinds is None:
        full = "full_attention" if use_dsa is False else "indexed_attention"
        windowed = hf.get("use_sliding_window", True)
        kinds = [full if not windowed or i < 2 or i % 4 == 1 else "sliding_attention" for i in range(n)]
    kinds = list(kinds)
    if use_dsa is not None:
        old, new = ("indexed_attention", "full_attention") if use_dsa is False else ("full_attention",
                                                                                    "indexed_attention")
        kinds = [new if kind == old else kind for kind in kinds]
    per_layer = {int(i): dict(v) for i, v in (hf.get("per_layer_config") or {}).items()}
    if "per_layer_config" not in hf:  # the released config's swa_* aliases (Dots3NoteTextConfig's defaults)
        swa = {key: hf.get(f"swa_{key}", default) for key, default in (
            ("num_attention_heads", 64), ("q_lora_rank", 1024), ("kv_lora_rank", 1024), ("head_dim", 256),
            ("qk_nope_head_dim", 192), ("v_head_dim", 128))}
        swa["qk_rope_head_dim"] = hf.get("swa_qk_rope_head_dim", swa["head_dim"] - swa["qk_nope_head_dim"])
        per_layer = {i: swa for i, kind in enumerate(kinds) if kind == "sliding_attention"}
    return kinds, per_layer


def _rope_thetas(hf: dict, kinds: list[str]) -> dict[str, float]:
    """Each layer type's RoPE base: rope_parameters nested by layer type, or the flat ones (rope_theta, 8e7, for the
    DSA and full layers; swa_rope_theta, 5e4, for the windowed ones) as Dots3NoteTextConfig converts them."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling")
    if params and not all(isinstance(v, dict) for v in params.values()):
        params = {kind: params for kind in set(kinds)}
    if not params:
        theta = float(hf.get("rope_theta", 80_000_000.0))
        params = {kind: {"rope_type": "default",
                         "rope_theta": float(hf.get("swa_rope_theta", 50_000.0)) if kind == "sliding_attention"
                         else theta} for kind in set(kinds)}
    out = {}
    for kind in set(kinds):
        spec = params.get(kind)
        if spec is None:
            raise UserError(f"rope_parameters has no entry for layer type {kind!r}")
        rope_type = spec.get("rope_type", spec.get("type", "default"))
        if rope_type != "default":
            raise UserError(f"rope_parameters[{kind!r}].rope_type={rope_type!r} on dots3_note_text: redline reads "
                            f"dots.3 Note's plain RoPE (rope_type default) alone")
        out[kind] = float(spec.get("rope_theta", 10000.0))
    return out


def model_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    n = int(hf["num_hidden_layers"])
    kinds, per_layer = _layers(hf)
    bad = sorted(set(kinds) - {"full_attention", "sliding_attention", "indexed_attention"})
    raise_first([
        (len(kinds) != n, f"layer_types has {len(kinds)} entries for num_hidden_layers={n}"),
        (bool(bad), f"layer_types {bad}: dots.3 Note's layers are full_attention, sliding_attention or "
                    f"indexed_attention"),
    ])
    window = int(hf.get("sliding_window") or hf.get("sliding_window_size", 512))
    model_wide = {**{key: hf[key] for key in _SHAPE}, "num_key_value_heads": hf.get("num_key_value_heads")
                  or hf["num_attention_heads"], "sliding_window": window, "rms_norm_eps": hf["rms_norm_eps"]}
    for i, own in sorted(per_layer.items()):
        # head_dim sets the rotated fraction alone (qk_rope_head_dim / head_dim of it: qk_rope_head_dim)
        differs = [key for key in sorted(set(own) - {"head_dim"}) if own[key] != model_wide.get(key, own[key])]
        unknown = sorted(set(own) - set(model_wide) - {"head_dim"})
        if differs:
            raise UserError(f"per_layer_config[{i}] ({kinds[i]}) sets {differs[0]}={own[differs[0]]} apart from "
                            f"the model's {model_wide[differs[0]]}: redline's latent attention keeps one head shape "
                            f"for every layer (dots.3 Note's released windowed layers have other head counts and "
                            f"latent widths)")
        if unknown:
            raise UserError(f"per_layer_config[{i}] sets {unknown[0]}: redline reads a layer's head shape there alone")
    thetas = _rope_thetas(hf, kinds)
    if not hf.get("mlp_layer_types"):  # Dots3NoteTextConfig's: sparse from first_k_dense_replace (1) where
        first, every = int(hf.get("first_k_dense_replace", 1)), hf.get("moe_layer_freq", 1)  # moe_layer_freq says
        hf["mlp_layer_types"] = ["sparse" if i >= first and (bool(every[i]) if isinstance(every, (list, tuple))
                                                             else i % int(every) == 0) else "dense" for i in range(n)]
    hf.pop("moe_layer_freq", None)  # read into mlp_layer_types (a list of flags on the Hub's config)
    # DeepSeek-V3's reading (dense layers first, its router), the shared expert of shared_experts_intermediate_size
    full_theta = next((thetas[k] for k in kinds if k != "sliding_attention"), thetas.get("sliding_attention"))
    plain = deepseek.lite_as_deepseek_v3({**hf, "rope_interleave": True, "rope_parameters": None,
                                          "rope_theta": full_theta}, defaults={})
    plain.pop("rope_scaling", None)
    cfg = deepseek.model_config_for("deepseek_v3")(plain)
    width, shared = int(hf["shared_experts_intermediate_size"]), int(hf["n_shared_experts"])
    windows = tuple(i for i, kind in enumerate(kinds) if kind == "sliding_attention")
    fields = dict(attn_gate="head", latent_key_norm=True, latent_norm_eps=float(hf["rms_norm_eps"]),
                  attn_scale=0.0)  # qk_head_dim ** -0.5 (Dots3NoteTextAttention's scaling): redline's default
    if cfg.moe_experts:
        fields["moe_shared_hidden"] = width * shared
    if windows:
        local = thetas["sliding_attention"]
        fields.update(sliding_window=window, window_layers=windows,
                      rope_local_theta=local if len(windows) < n else 0.0)
        if len(windows) == n:
            fields["rope_theta"] = local
    if "indexed_attention" in kinds:
        topk = int(hf["index_topk"])
        if topk < 1:
            raise UserError(f"index_topk={topk} on dots3_note_text: the indexer keeps at least one key a query")
        fields["context_len"] = min(cfg.context_len, topk)
    return dataclasses.replace(cfg, **fields)


def _scales(cfg: ModelConfig) -> dict[str, float]:
    """redline's latent norms -> the scale dots.3 Note multiplies their output by (q_lora_scale, kv_lora_scale)."""
    out = {"kv_a_norm": math.sqrt(cfg.n_embd / cfg.kv_lora_rank)}
    if cfg.q_lora_rank:
        out["q_a_norm"] = math.sqrt(cfg.n_embd / cfg.q_lora_rank)
    return out


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = deepseek.to_redline(src, cfg)
    pre = "model."
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.self_attn.", f"blocks.{i}.attn."
        out[r + "gate.weight"] = src.take(p + "g_proj.weight")
        out[r + "k_pe_norm.weight"] = src.take(p + "k_rope_only_layernorm.weight")
        for norm, scale in _scales(cfg).items():  # folded: scale · (w · x̂) = (scale · w) · x̂
            out[f"{r}{norm}.weight"] = out[f"{r}{norm}.weight"].float().mul(scale).to(out[f"{r}{norm}.weight"].dtype)
    src.used.update(n for n in src.names if n.startswith(f"{pre}mtp."))  # multi-token prediction, as transformers
    leave_out_indexer(src, cfg)
    return out


def _key_norm_rows(state: dict, cfg: ModelConfig, inverse: bool) -> dict:
    """The key norm's weights (R,) reordered as the shared key part's rows are (deepseek.kv_rope_rows)."""
    out = dict(state)
    for i in range(cfg.n_layer):
        name = f"blocks.{i}.attn.k_pe_norm.weight"
        out[name] = interleave_rope_rows(out[name], 1, inverse)
    return out


def fold(hf: dict, cfg: ModelConfig, state: dict) -> dict:
    """The rotated rows from dots.3 Note's interleaved pairs into redline's halves (module docstring)."""
    return _key_norm_rows(deepseek._rope_rows(state, cfg, inverse=True), cfg, inverse=True)


def wants_dots3(cfg: ModelConfig) -> bool:
    """A norm on latent attention's shared RoPE key part: dots.3 Note's alone."""
    return cfg.latent_key_norm


def check_exportable(cfg: ModelConfig) -> None:
    what = "dots.3 Note (Dots3NoteForCausalLM), the one architecture with a norm on the RoPE key part,"
    raise_first([
        (not cfg.kv_lora_rank or not cfg.q_lora_rank or cfg.pos_emb != "rope",
         f"{what} runs latent attention with a q latent (model.q_lora_rank) under RoPE"),
        (cfg.attn_gate != "head", f"{what} gates each head's output by a sigmoid (model.attn_gate=head)"),
        ((cfg.latent_norm_eps or 1e-6) != cfg.norm_eps,
         f"{what} normalizes its latents at the blocks' epsilon (model.latent_norm_eps = norm_eps = {cfg.norm_eps})"),
        (not cfg.moe_experts, f"{what} runs experts beside a shared expert (model.moe_experts)"),
        (cfg.sliding_window and cfg.sliding_window_pattern and not cfg.window_layers or cfg.attn_chunk,
         f"{what} gives its windowed layers as layer_types (model.window_layers)"),
        (cfg.rope_scaling != "none", f"model.rope_scaling={cfg.rope_scaling}: {what} rotates by plain RoPE"),
    ])
    # the rest as DeepSeek-V3's checks read it: its blocks, router and shared expert are dots.3 Note's
    deepseek.check_exportable(dataclasses.replace(cfg, sliding_window=0, window_layers=(), rope_local_theta=0.0,
                                                  attn_gate="none", latent_key_norm=False, latent_norm_eps=0.0),
                              "deepseek_v3")


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    out = deepseek.hf_config_for("deepseek_v3")(cfg)
    dense = out.pop("first_k_dense_replace")
    for key in ("rope_interleave", "rope_parameters"):
        out.pop(key)
    kinds = ["sliding_attention" if cfg.layer_window(i) else "full_attention" for i in range(cfg.n_layer)]
    thetas = {"full_attention": cfg.rope_theta, "sliding_attention": cfg.rope_local_theta or cfg.rope_theta}
    shape = {"num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_head, "q_lora_rank": cfg.q_lora_rank,
             "kv_lora_rank": cfg.kv_lora_rank, "head_dim": cfg.head_dim, "qk_nope_head_dim": cfg.head_dim - cfg.rope_dims,
             "qk_rope_head_dim": cfg.rope_dims, "v_head_dim": cfg.v_head_dim or cfg.head_dim}
    out.update(model_type="dots3_note_text", head_dim=cfg.head_dim, use_dsa=False, layer_types=kinds,
               mlp_layer_types=["dense"] * dense + ["sparse"] * (cfg.n_layer - dense),
               moe_intermediate_size=cfg.hidden_dim, shared_experts_intermediate_size=cfg.hidden_dim,
               n_shared_experts=cfg.moe_shared_hidden // cfg.hidden_dim, sliding_window=cfg.sliding_window or None,
               rope_parameters={kind: {"rope_type": "default", "rope_theta": thetas[kind]} for kind in set(kinds)},
               **{f"swa_{key}": value for key, value in shape.items()})
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """DeepSeek-V3's names (the rotated rows interleaved again), the experts stacked as Dots3NoteExperts holds them
    (gate_up_proj (E, 2F, C), down_proj (E, C, F)), g_proj, k_rope_only_layernorm, the latent scales divided out of
    the norms."""
    state = _key_norm_rows(deepseek._rope_rows(dict(state), cfg, inverse=False), cfg, inverse=False)
    out = {k: v for k, v in deepseek.to_hf_for("deepseek_v3")(state, cfg).items() if ".mlp.experts." not in k}
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.", f"blocks.{i}."
        if cfg.layer_has_experts(i):
            out[p + "mlp.experts.gate_up_proj"], out[p + "mlp.experts.down_proj"] = state[r + "mlp.fc"], \
                state[r + "mlp.proj"]
        out[p + "self_attn.g_proj.weight"] = state[r + "attn.gate.weight"]
        out[p + "self_attn.k_rope_only_layernorm.weight"] = state[r + "attn.k_pe_norm.weight"]
        for norm, scale in _scales(cfg).items():
            w = state[f"{r}attn.{norm}.weight"]
            out[p + "self_attn." + deepseek._ATTN[norm] + ".weight"] = w.float().div(scale).to(w.dtype)
    return out


def adapter_parts(layer: str, rest: str, base: str, out_features: int, cfg: ModelConfig):
    """PEFT's modules for redline layer `layer` (rest: its name after blocks.N.; base: "model.layers.N.") of a dots.3
    Note export, each with its rows: the latent attention's under self_attn. (q_b's and kv_a's rotated rows
    interleaved again, as to_hf writes them) and the heads' gate as g_proj; the latent scales sit in the norms, so
    every adapted layer reads what transformers' does. A UserError for the MLPs (PEFT moves gate/up/down_proj
    adapters onto the experts) and the norms."""
    if rest == "attn.gate":
        return [(base + "self_attn.g_proj", slice(0, out_features))]
    module = rest[len("attn."):]
    if rest.startswith("attn.") and module in deepseek._ATTN and not module.endswith("_norm") and module != "q":
        rows = torch.arange(out_features)
        if module == "q_b":
            rows = deepseek.q_rope_rows(rows[:, None], cfg, inverse=False)[:, 0]
        elif module == "kv_a":
            rows = deepseek.kv_rope_rows(rows, cfg, inverse=False)
        return [(f"{base}self_attn.{deepseek._ATTN[module]}", rows)]
    raise UserError(f"the adapter on {layer} has no counterpart PEFT loads onto Dots3NoteForCausalLM (the MLPs' "
                    f"would move onto its experts); train with lora.targets attn.* or export with --merge")


def _ignorable(name: str) -> bool:
    return deepseek._ignorable(name)


FAMILY = Family(name="dots3_note_text", architecture="Dots3NoteForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable, fold=fold)
