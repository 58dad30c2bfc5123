"""LongCat-Flash (LongcatFlashForCausalLM, model_type "longcat_flash": Meituan's LongCat-Flash-Chat), as transformers'
models/longcat_flash computes it. Each of its num_layers layers is two of redline's blocks (model.moe_shortcut):

- block 2j is the layer's first attention and dense MLP (`self_attn.0`, `mlps.0`, `input_layernorm.0`,
  `post_attention_layernorm.0`) and runs its mixture of experts (`mlp.`) on the MLP's input; block 2j + 1 the second
  pair (`.1`), whose output the experts' joins (the shortcut connection of LongcatFlashDecoderLayer);
- attention: DeepSeek-V3's latent attention (deepseek.py's names under `self_attn.S.`, RoPE on interleaved pairs
  always) with queries always through q_lora_rank, and its own scales: q times sqrt(hidden_size / q_lora_rank) and the
  normed latent times sqrt(hidden_size / kv_lora_rank) (LongcatFlashMLA's mla_scale_q_lora, mla_scale_kv_lora). Both
  are linear in a norm's weight, so the import folds them into q_a_layernorm's and kv_a_layernorm's weights (q_b
  reads the normed latent, kv_b the normed latent for keys and values alike) and the export divides them out;
- the mixture (LongcatFlashMoE): a softmax over n_routed_experts + zero_expert_num experts from
  `mlp.router.classifier` (in fp32), the top moe_topk chosen by the scores plus `e_score_correction_bias`
  (model.moe_expert_bias on softmax scores), weighted by their scores as they are (no rescaling) times
  routed_scaling_factor; the zero_expert_num last experts return their input (model.moe_identity_experts). The
  experts are stacked, gate_up_proj (E + Z, 2F, C) with rows for the identity experts too (unused: the import drops
  them, the export writes zeros) and down_proj (E, C, F); the Hub's files hold one tensor per expert (transformers'
  qwen2_moe conversion), read as well. No shared expert.

The Hub's multi-token-prediction layers (`model.mtp.*`) are left out, as transformers leaves them out. Refused by
name: attention or router biases, head_dim other than qk_rope_head_dim (transformers' RoPE table is head_dim wide),
a qk_head_dim other than qk_nope_head_dim + qk_rope_head_dim, partial RoPE, num_key_value_heads other than the heads,
no q_lora_rank, and what deepseek.py refuses. Exported as LongCat-Flash wherever a model has a shortcut MoE or
identity experts (no other architecture has either).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop import deepseek
from redline.interop.families import Family, TensorSource, give_head, pad_rows, raise_first, take_head
from redline.model import ModelConfig

_DEFAULTS = dict(vocab_size=131072, hidden_size=6144, num_layers=28, num_attention_heads=64, hidden_act="silu",
                 max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
                 ffn_hidden_size=12288, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                 qk_rope_head_dim=64, head_dim=64, v_head_dim=128, moe_topk=12, n_routed_experts=512,
                 zero_expert_num=256, expert_ffn_hidden_size=2048, routed_scaling_factor=6.0)
"""LongcatFlashConfig's defaults for the fields a config.json may leave out (its RoPE base 1e7)."""
_ALIASES = {"num_local_experts": "n_routed_experts", "num_experts_per_tok": "moe_topk",
            "intermediate_size": "ffn_hidden_size", "moe_intermediate_size": "expert_ffn_hidden_size"}
"""LongcatFlashConfig's attribute_map: other names a config.json may give its fields by."""
_ATTN = deepseek._ATTN
_MTP = "model.mtp."


def _settled(hf: dict) -> dict:
    hf = {**_DEFAULTS, **{_ALIASES.get(k, k): v for k, v in hf.items() if v is not None or k == "q_lora_rank"}}
    if "num_layers" not in hf and "num_hidden_layers" in hf:  # its property: twice num_layers
        hf["num_layers"] = int(hf["num_hidden_layers"]) // 2
    if not hf.get("rope_parameters"):
        hf["rope_parameters"] = {"rope_type": "default", "rope_theta": float(hf.get("rope_theta", 1e7))}
    return hf


def lora_scales(cfg: ModelConfig) -> tuple[float, float]:
    """(q's, the latent's) scales LongcatFlashMLA applies: sqrt(hidden_size / q_lora_rank), sqrt(hidden_size /
    kv_lora_rank)."""
    return math.sqrt(cfg.n_embd / cfg.q_lora_rank), math.sqrt(cfg.n_embd / cfg.kv_lora_rank)


def model_config(hf: dict) -> ModelConfig:
    hf = _settled(hf)
    params = dict(hf["rope_parameters"])
    fraction = float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    nope, rope = int(hf["qk_nope_head_dim"]), int(hf["qk_rope_head_dim"])
    raise_first([
        (not hf.get("q_lora_rank"), "q_lora_rank=null on longcat_flash: LongcatFlashMLA always projects its queries "
                                    "through q_a_proj and q_b_proj"),
        (hf.get("router_bias"), "router_bias=true on longcat_flash: transformers' LongcatFlashTopkRouter holds the "
                                "bias and never adds it; remove the key (and the bias tensors) to import"),
        (int(hf["head_dim"]) != rope, f"head_dim={hf['head_dim']} with qk_rope_head_dim={rope} on longcat_flash: "
                                      f"transformers builds its RoPE table head_dim wide and rotates "
                                      f"qk_rope_head_dim; redline takes them equal"),
        (hf.get("qk_head_dim") not in (None, nope + rope),
         f"qk_head_dim={hf.get('qk_head_dim')} on longcat_flash: LongcatFlashMLA's scores scale by "
         f"qk_nope_head_dim + qk_rope_head_dim = {nope + rope}; redline takes qk_head_dim equal to it"),
        (fraction != 1.0, f"partial_rotary_factor={fraction} on longcat_flash: redline rotates the whole "
                          f"qk_rope_head_dim of each head"),
        (int(hf["n_routed_experts"]) < 1, f"n_routed_experts={hf['n_routed_experts']} on longcat_flash: redline's "
                                          f"mixture has one MLP expert at least"),
    ])
    # DeepSeek-V3's reading of the attention and the dense MLPs (its checks), every block dense, RoPE interleaved
    plain = {**hf, "model_type": "deepseek_v3", "num_hidden_layers": 2 * int(hf["num_layers"]),
             "intermediate_size": hf["ffn_hidden_size"], "n_routed_experts": 0, "rope_interleave": True}
    cfg = deepseek.model_config_for("deepseek_v3")(plain)
    return dataclasses.replace(
        cfg, mlp_hidden=int(hf["expert_ffn_hidden_size"]), moe_dense_hidden=int(hf["ffn_hidden_size"]),
        moe_experts=int(hf["n_routed_experts"]), moe_identity_experts=int(hf.get("zero_expert_num") or 0),
        moe_top_k=int(hf["moe_topk"]), moe_gating="softmax", moe_expert_bias=True, moe_norm_topk=False,
        moe_scale=float(hf["routed_scaling_factor"]), moe_shortcut=True)


def _ours(i: int) -> tuple[str, str]:
    """Block i's HF layer prefix and its sublayer index: ("model.layers.j.", "0" or "1")."""
    return f"model.layers.{i // 2}.", str(i % 2)


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    q_scale, kv_scale = lora_scales(cfg)
    E = cfg.moe_experts
    out = {"norm_f.weight": src.take("model.norm.weight"),
           "wte.weight": pad_rows(src.take("model.embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        (p, s), r = _ours(i), f"blocks.{i}."
        out[r + "norm1.weight"] = src.take(f"{p}input_layernorm.{s}.weight")
        out[r + "norm2.weight"] = src.take(f"{p}post_attention_layernorm.{s}.weight")
        for ours in deepseek._attn_modules(cfg):
            out[f"{r}attn.{ours}.weight"] = src.take(f"{p}self_attn.{s}.{_ATTN[ours]}.weight")
        # LongcatFlashMLA's scales, folded into the norms whose outputs they scale (module docstring)
        out[r + "attn.q_a_norm.weight"] = out[r + "attn.q_a_norm.weight"] * q_scale
        out[r + "attn.kv_a_norm.weight"] = out[r + "attn.kv_a_norm.weight"] * kv_scale
        m = f"{p}mlps.{s}."
        out[r + "mlp.fc.weight"] = torch.cat([src.take(m + "gate_proj.weight"), src.take(m + "up_proj.weight")])
        out[r + "mlp.proj.weight"] = src.take(m + "down_proj.weight")
        if not cfg.layer_has_experts(i):
            continue
        x = f"{p}mlp."
        out[r + "moe.router.weight"] = src.take(x + "router.classifier.weight")
        out[r + "moe.expert_bias"] = src.take(x + "router.e_score_correction_bias").float()
        if x + "experts.gate_up_proj" in src:  # stacked, the identity experts' unused rows after the E MLPs'
            out[r + "moe.fc"] = src.take(x + "experts.gate_up_proj")[:E]
            out[r + "moe.proj"] = src.take(x + "experts.down_proj")
        else:  # the Hub's and save_pretrained's: one tensor per expert, the identity experts' gate and up too
            e = [f"{x}experts.{j}." for j in range(E)]
            out[r + "moe.fc"] = torch.stack([torch.cat([src.take(n + "gate_proj.weight"),
                                                        src.take(n + "up_proj.weight")]) for n in e])
            out[r + "moe.proj"] = torch.stack([src.take(n + "down_proj.weight") for n in e])
            src.used.update(f"{x}experts.{j}.{w}_proj.weight" for j in range(E, E + cfg.moe_identity_experts)
                            for w in ("gate", "up"))  # never read by LongcatFlashExperts
    src.used.update(n for n in src.names if n.startswith(_MTP))  # transformers ignores them on load too
    return out


def fold(hf: dict, cfg: ModelConfig, state: dict) -> dict:
    """The rotated rows of q_b and kv_a from LongCat's interleaved pairs into redline's halves."""
    return deepseek._rope_rows(state, cfg, inverse=True)


def check_exportable(cfg: ModelConfig) -> None:
    raise_first([
        (not (cfg.moe_shortcut and cfg.kv_lora_rank and cfg.q_lora_rank),
         "model.moe_shortcut and model.moe_identity_experts: of the architectures redline exports to, LongCat-Flash "
         "alone has them, and it has the shortcut MoE (model.moe_shortcut) with latent attention through a query "
         "rank (model.kv_lora_rank, q_lora_rank)"),
        (cfg.q_latent_gate or cfg.norm_gate_rank, "model.q_latent_gate and model.norm_gate_rank are A.X-K2's: "
                                                  "LongCat-Flash has neither"),
        (cfg.moe_gating != "softmax" or not cfg.moe_expert_bias or cfg.moe_norm_topk or cfg.moe_shared_hidden
         or cfg.moe_post_norm or cfg.moe_out_bias or cfg.moe_groups > 1 or cfg.moe_bias or cfg.moe_weight_input
         or cfg.moe_bias_on_logits,
         "LongCat-Flash's router: softmax scores (model.moe_gating=softmax) chosen with a bias "
         "(moe_expert_bias=true), not rescaled (moe_norm_topk=false), no groups, router or expert biases, input "
         "weighting, shared expert, post norm or output bias"),
        (cfg.rope_scaling not in ("none", "yarn"), f"model.rope_scaling={cfg.rope_scaling}: redline writes "
                                                   f"LongCat-Flash's RoPE plain or YaRN"),
        (not cfg.moe_dense_hidden, "model.moe_shortcut without model.moe_dense_hidden: LongCat-Flash's dense MLPs "
                                   "(ffn_hidden_size) are their own width"),
    ])
    # the blocks, attention and dense MLPs as DeepSeek-V3's checks read them
    deepseek.check_exportable(_dense(cfg), "deepseek_v3")


def _dense(cfg: ModelConfig) -> ModelConfig:
    """cfg's blocks without the experts: every one a dense MLP moe_dense_hidden wide (DeepSeek-V3's reading)."""
    return dataclasses.replace(cfg, moe_experts=0, moe_identity_experts=0, moe_shortcut=False, moe_expert_bias=False,
                               moe_scale=1.0, mlp_hidden=cfg.moe_dense_hidden, moe_dense_hidden=None)


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    v3 = deepseek.hf_config_for("deepseek_v3")(_dense(cfg))
    keep = ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "kv_lora_rank", "q_lora_rank",
            "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "hidden_act", "max_position_embeddings",
            "rms_norm_eps", "tie_word_embeddings", "rope_parameters", "attention_bias", "attention_dropout",
            "initializer_range", "use_cache")
    return {**{k: v3[k] for k in keep}, "model_type": "longcat_flash", "num_layers": cfg.n_layer // 2,
            "head_dim": cfg.rope_dims, "qk_head_dim": cfg.head_dim, "ffn_hidden_size": cfg.moe_dense_hidden,
            "expert_ffn_hidden_size": cfg.hidden_dim, "n_routed_experts": cfg.moe_experts,
            "zero_expert_num": cfg.moe_identity_experts, "moe_topk": cfg.moe_top_k,
            "routed_scaling_factor": cfg.moe_scale}


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    state = deepseek._rope_rows(dict(state), cfg, inverse=False)  # LongCat's RoPE is always on interleaved pairs
    q_scale, kv_scale = lora_scales(cfg)
    out = {"model.norm.weight": state["norm_f.weight"],
           "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size], **give_head(state, cfg)}
    for i in range(cfg.n_layer):
        (p, s), r = _ours(i), f"blocks.{i}."
        out[f"{p}input_layernorm.{s}.weight"] = state[r + "norm1.weight"]
        out[f"{p}post_attention_layernorm.{s}.weight"] = state[r + "norm2.weight"]
        for ours in deepseek._attn_modules(cfg):
            out[f"{p}self_attn.{s}.{_ATTN[ours]}.weight"] = state[f"{r}attn.{ours}.weight"]
        out[f"{p}self_attn.{s}.q_a_layernorm.weight"] = state[r + "attn.q_a_norm.weight"] / q_scale
        out[f"{p}self_attn.{s}.kv_a_layernorm.weight"] = state[r + "attn.kv_a_norm.weight"] / kv_scale
        m = f"{p}mlps.{s}."
        out[m + "gate_proj.weight"], out[m + "up_proj.weight"] = state[r + "mlp.fc.weight"].chunk(2)
        out[m + "down_proj.weight"] = state[r + "mlp.proj.weight"]
        if not cfg.layer_has_experts(i):
            continue
        x, fc = f"{p}mlp.", state[r + "moe.fc"]
        out[x + "router.classifier.weight"] = state[r + "moe.router.weight"]
        out[x + "router.e_score_correction_bias"] = state[r + "moe.expert_bias"].float()
        # (E + Z, 2F, C): the identity experts' rows, which LongcatFlashExperts holds and never reads, as zeros
        out[x + "experts.gate_up_proj"] = torch.cat([fc, fc.new_zeros(cfg.moe_identity_experts, *fc.shape[1:])])
        out[x + "experts.down_proj"] = state[r + "moe.proj"]
    return out


def adapter_parts(layer: str, i: int, rest: str, out_features: int, cfg: ModelConfig) -> list[tuple[str, object]]:
    """PEFT's modules for redline layer `layer` (block i, rest its name after blocks.i.), each with its B rows
    (peft_adapter's _parts): the latent attention's under self_attn.S. (q_b's and kv_a's rotated rows interleaved
    again, as to_hf writes them; LongcatFlashMLA's scales act on q_b's output and kv_b's input alike with and without
    the adapter, so its B and A are as trained); a UserError for the MLPs' and the experts' layers, whose adapters
    PEFT would move onto the stacked experts (its weight conversion for transformers' MoE models, as for
    DeepSeek's)."""
    p, s = _ours(i)
    if rest.startswith("attn."):
        module = rest[len("attn."):]
        if module not in _ATTN or module.endswith("_norm"):
            raise UserError(f"the adapter on {layer} has no counterpart in LongcatFlashForCausalLM; export with "
                            f"--merge")
        rows = torch.arange(out_features)
        if module == "q_b":
            rows = deepseek.q_rope_rows(rows[:, None], cfg, inverse=False)[:, 0]
        elif module == "kv_a":
            rows = deepseek.kv_rope_rows(rows, cfg, inverse=False)
        return [(f"{p}self_attn.{s}.{_ATTN[module]}", rows)]
    raise UserError(f"the adapter on {layer} would be a gate_proj, up_proj or down_proj adapter (or the router's), "
                    f"which PEFT moves onto LongcatFlashForCausalLM's experts as it loads them; train with "
                    f"lora.targets attn.* or export with --merge")


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


FAMILY = Family(name="longcat_flash", architecture="LongcatFlashForCausalLM", model_config=model_config,
                hf_config=hf_config, to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable, fold=fold)
