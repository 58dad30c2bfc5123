"""DeepSeek-V3 (DeepSeek-V3/R1, Moonlight) and DeepSeek-V2 (DeepSeek-V2-Lite): multi-head latent attention
with a mixture of experts, as transformers' models/deepseek_v3 and models/deepseek_v2 compute them; and GLM-4.7-Flash
(model_type "glm4_moe_lite"), which transformers' models/glm4_moe_lite builds from DeepseekV3Attention and
Glm4MoeTopkRouter (DeepSeek-V3's routing): read as DeepSeek-V3 (lite_as_deepseek_v3), written back as DeepSeek-V3.
minicpm3.py reads MiniCPM3's latent attention with these functions too.

- attention (`self_attn.`): q from `q_a_proj` -> `q_a_layernorm` -> `q_b_proj` (or one `q_proj` where
  q_lora_rank is null), keys and values from `kv_a_proj_with_mqa` (the latent, then one key part of qk_rope_head_dim
  every head shares) -> `kv_a_layernorm` -> `kv_b_proj`; `o_proj`. redline's LatentAttention (model.kv_lora_rank)
  holds the same matrices under its own names (q_a, q_a_norm, q_b or q, kv_a, kv_a_norm, kv_b, proj);
- RoPE on the qk_rope_head_dim part alone, in interleaved pairs ((0, 1), (2, 3), ...: DeepSeek-V2 always,
  DeepSeek-V3 where `rope_interleave`, its default): the rotated rows of q_b_proj (q_proj) and of kv_a_proj_with_mqa
  are permuted into redline's (first half, second half) order on import, q·k unchanged; exports write DeepSeek-V3
  with rope_interleave=false and the rows as they are, DeepSeek-V2 with the rows interleaved again;
- the score scale 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim), times mscale² under a RoPE scaling with
  `mscale_all_dim` (YaRN's: 0.1 · mscale_all_dim · ln(factor) + 1): redline's model.attn_scale;
- MLPs: dense SwiGLU on the first `first_k_dense_replace` layers (`intermediate_size`: model.moe_dense_layers,
  moe_dense_hidden), experts on the others (`moe_intermediate_size` each) with an ungated shared expert
  `moe_intermediate_size · n_shared_experts` wide (model.moe_shared_hidden, moe_shared_gate=false) and the chosen
  experts' weights times `routed_scaling_factor` (model.moe_scale). DeepSeek-V3's router: sigmoid scores, the choice
  biased by `e_score_correction_bias` (model.moe_expert_bias) within the `topk_group` best of `n_group` groups
  (model.moe_groups, moe_topk_groups), the chosen scores rescaled to sum to 1 (+1e-20) where `norm_topk_prob`.
  DeepSeek-V2's: softmax, `topk_method` greedy (group_limited_greedy where it keeps every group), never rescaled
  (transformers' router does not read norm_topk_prob).

DeepSeek-V3's fp8 checkpoints (`quantization_config` fp8, e4m3 weights with a `weight_scale_inv` a 128 x 128 block)
are dequantized on import, each weight times its blocks' scales in fp32 (dequantize_fp8), as transformers does where
it cannot run fp8 (the CPU). Refused by name: another quantization, attention_bias, mlp_bias, num_key_value_heads
other than the heads, v_head_dim wider than a q/k head, moe_layer_freq other than 1, no shared expert, DeepSeek-V2's
group_limited_greedy over fewer groups than all (its groups scored by their best expert, redline's by their two
best). The Hub's multi-token-prediction layers past the last (`num_nextn_predict_layers`) are left out, as
transformers leaves them out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, give_head, interleave_rope_rows, pad_rows, raise_first,
                                      take_head)
from redline.interop.llama import _rope, check_silu, rope_scaling
from redline.interop.moe import deepseek_experts_to_hf, deepseek_experts_to_redline
from redline.model import ModelConfig, yarn_mscale

_ARCHITECTURES = {"deepseek_v3": "DeepseekV3ForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM"}
_ATTN = {"q_a": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b": "q_b_proj", "q": "q_proj",
         "kv_a": "kv_a_proj_with_mqa", "kv_a_norm": "kv_a_layernorm", "kv_b": "kv_b_proj", "proj": "o_proj"}
"""redline's LatentAttention modules -> DeepSeek's (after self_attn.)."""


def _attn_modules(cfg: ModelConfig) -> list[str]:
    """The LatentAttention modules a model has: q_a, q_a_norm and q_b where model.q_lora_rank is set, else q."""
    skip = ("q",) if cfg.q_lora_rank else ("q_a", "q_a_norm", "q_b")
    return [m for m in _ATTN if m not in skip]


def _rope_spec(hf: dict) -> dict:
    """The RoPE scaling dict as transformers reads it: rope_parameters (transformers >= 5) or rope_scaling."""
    params = dict(hf.get("rope_parameters") or {})
    return params if params.get("rope_type", "default") != "default" else dict(hf.get("rope_scaling") or {})


def score_scale(hf: dict) -> float:
    """DeepSeek's softmax_scale: 1 / sqrt(qk head width), times mscale(factor, mscale_all_dim)² under a RoPE scaling
    that gives mscale_all_dim (as transformers' yarn_apply_mscale)."""
    scale = (hf["qk_nope_head_dim"] + hf["qk_rope_head_dim"]) ** -0.5
    spec = _rope_spec(hf)
    kind = spec.get("rope_type", spec.get("type", "default"))
    if kind != "default" and spec.get("mscale_all_dim"):
        scale *= yarn_mscale(float(spec["factor"]), float(spec["mscale_all_dim"])) ** 2
    return scale


def lite_as_deepseek_v3(hf: dict, defaults: dict | None = None) -> dict:
    """A glm4_moe_lite config (GLM-4.7-Flash) as the deepseek_v3 config it computes as: transformers' Glm4MoeLite
    model is DeepSeek-V3's attention (rope_interleave) with GLM-4-MoE's router, which routes as DeepSeek-V3's does;
    its dense layers given as mlp_layer_types, its defaults Glm4MoeLiteConfig's (or `defaults`: the DSA families'
    in deepseek_kin.py, which read their mlp_layer_types so too). A UserError for what differs."""
    n = hf["num_hidden_layers"]
    kinds = list(hf.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1))
    dense = kinds.count("dense")
    if len(kinds) != n or kinds != ["dense"] * dense + ["sparse"] * (n - dense):
        raise UserError(f"mlp_layer_types={kinds}: redline runs dense MLPs on the first layers and experts on all "
                        f"the others (num_hidden_layers={n})")
    params = dict(hf.get("rope_parameters") or {})
    fraction = float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    if fraction != 1.0:
        raise UserError(f"partial_rotary_factor={fraction} on {hf.get('model_type') or 'glm4_moe_lite'}: redline rotates the whole "
                        f"qk_rope_head_dim of each head")
    if defaults is None:  # Glm4MoeLiteConfig's
        defaults = dict(rms_norm_eps=1e-5, n_shared_experts=1, n_routed_experts=64, routed_scaling_factor=1.8,
                        num_experts_per_tok=4, n_group=1, topk_group=1, norm_topk_prob=True, rope_interleave=True,
                        max_position_embeddings=202752, q_lora_rank=768, moe_intermediate_size=1536,
                        kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256)
    # transformers reads no first_k_dense_replace here: mlp_layer_types alone (by default the first layer dense)
    return {**defaults, **{k: v for k, v in hf.items() if v is not None or k == "q_lora_rank"},
            "first_k_dense_replace": dense}


def model_config_for(name: str):
    def model_config(hf: dict) -> ModelConfig:
        if name == "glm4_moe_lite":
            return model_config_for("deepseek_v3")(lite_as_deepseek_v3(hf))
        check_silu(hf)
        quant = hf.get("quantization_config")
        if quant and (quant.get("quant_method") != "fp8" or list(quant.get("weight_block_size") or []) != [128, 128]
                      or quant.get("fmt", "e4m3") != "e4m3"):
            raise UserError(f"quantization_config (quant_method={quant.get('quant_method')!r}, weight_block_size="
                            f"{quant.get('weight_block_size')}, fmt={quant.get('fmt')!r}): redline dequantizes "
                            f"DeepSeek's fp8 e4m3 weights in 128 x 128 blocks (weight_scale_inv) alone; import a bf16 "
                            f"checkpoint of the model")
        for key in ("attention_bias", "mlp_bias"):
            if hf.get(key):
                raise UserError(f"{key}=true: redline's latent attention and DeepSeek MLPs have no biases")
        heads = hf["num_attention_heads"]
        if (hf.get("num_key_value_heads") or heads) != heads:
            raise UserError(f"num_key_value_heads={hf['num_key_value_heads']} with num_attention_heads={heads}: "
                            f"latent attention expands its keys and values to every head (set them equal)")
        if int(hf.get("moe_layer_freq") or 1) != 1:
            raise UserError(f"moe_layer_freq={hf['moe_layer_freq']}: transformers' {name} puts experts on every layer "
                            f"from first_k_dense_replace on; redline does too")
        nope, rope, v = hf["qk_nope_head_dim"], hf["qk_rope_head_dim"], hf.get("v_head_dim") or hf["qk_nope_head_dim"]
        if v > nope + rope:
            raise UserError(f"v_head_dim={v} wider than qk_nope_head_dim + qk_rope_head_dim={nope + rope}: redline's "
                            f"latent attention pads values up to the q/k head width, not keys up to the values'")
        fields = dict(
            vocab_size=hf["vocab_size"], context_len=hf.get("max_position_embeddings", 4096),
            n_layer=hf["num_hidden_layers"], n_embd=hf["hidden_size"], n_head=heads, n_kv_head=heads,
            head_size=nope + rope, rope_dims=rope, kv_lora_rank=int(hf["kv_lora_rank"]),
            q_lora_rank=int(hf.get("q_lora_rank") or 0), v_head_dim=v if v != nope + rope else 0,
            attn_scale=score_scale(hf), fused_qkv=False, pos_emb="rope", mlp="swiglu", fused_mlp=True,
            norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=False, **_rope(hf))
        return ModelConfig(**fields, **_expert_fields(hf, name))

    return model_config


def _expert_fields(hf: dict, name: str) -> dict:
    """ModelConfig's MLP fields: one dense width where every layer is dense (first_k_dense_replace >= the layers, or
    no experts), else the mixture's (module docstring)."""
    n_layer, dense = hf["num_hidden_layers"], int(hf.get("first_k_dense_replace") or 0)
    experts = hf.get("n_routed_experts") or hf.get("num_local_experts") or hf.get("num_experts")
    if not experts or dense >= n_layer:
        return dict(mlp_hidden=hf["intermediate_size"])
    shared = int(hf.get("n_shared_experts") or 0)
    if not shared:
        raise UserError(f"n_shared_experts={hf.get('n_shared_experts')}: transformers' {name} always runs a shared "
                        f"expert; a config without one is not supported")
    width = int(hf["moe_intermediate_size"])
    out = dict(moe_experts=int(experts), moe_top_k=int(hf["num_experts_per_tok"]), mlp_hidden=width,
               moe_dense_layers=dense, moe_dense_hidden=int(hf["intermediate_size"]) if dense else None,
               moe_shared_hidden=width * shared, moe_shared_gate=False,
               moe_scale=float(hf.get("routed_scaling_factor") or 1.0))
    if name == "deepseek_v3":
        groups = int(hf.get("n_group") or 1)
        return dict(out, moe_gating="sigmoid", moe_expert_bias=True, moe_groups=groups,
                    moe_topk_groups=int(hf.get("topk_group") or groups) if groups > 1 else 1,
                    moe_norm_topk=bool(hf.get("norm_topk_prob", True)), moe_norm_eps=1e-20)
    method = hf.get("topk_method") or "greedy"
    groups, kept = int(hf.get("n_group") or 1), int(hf.get("topk_group") or 1)
    if method not in ("greedy", "group_limited_greedy") or (method == "group_limited_greedy" and kept < groups):
        raise UserError(f"topk_method={method!r} (n_group={hf.get('n_group')}, topk_group={hf.get('topk_group')}): "
                        f"DeepSeek-V2's group-limited routing scores each group by its best expert, redline's "
                        f"(DeepSeek-V3's) by its two best; redline takes topk_method greedy")
    return dict(out, moe_norm_topk=False)


def q_rope_rows(w: torch.Tensor, cfg: ModelConfig, inverse: bool) -> torch.Tensor:
    """q_b's (q's) rows (H·D, ...), each head's last rope_dims from redline's (first half, second half) pair order to
    the interleaved one, or back (inverse); the other rows as they are."""
    H, D, R = cfg.n_head, cfg.head_dim, cfg.rope_dims
    heads = w.reshape(H, D, -1)
    rot = interleave_rope_rows(heads[:, D - R:].reshape(H * R, -1), H, inverse).reshape(H, R, -1)
    return torch.cat([heads[:, :D - R], rot], dim=1).reshape(w.shape)


def kv_rope_rows(w: torch.Tensor, cfg: ModelConfig, inverse: bool) -> torch.Tensor:
    """kv_a's rows (L + R, ...), the shared key part's R last ones reordered as q_rope_rows reorders a head's."""
    R = cfg.rope_dims
    return torch.cat([w[:-R], interleave_rope_rows(w[-R:], 1, inverse)])


def _rope_rows(state: dict, cfg: ModelConfig, inverse: bool) -> dict:
    """Each layer's rotated rows of q_b (q) and kv_a, from the interleaved pair order to redline's halves (inverse)
    or back."""
    out = dict(state)
    for i in range(cfg.n_layer):
        r = f"blocks.{i}.attn."
        q = r + ("q_b.weight" if cfg.q_lora_rank else "q.weight")
        out[q] = q_rope_rows(out[q], cfg, inverse)
        out[r + "kv_a.weight"] = kv_rope_rows(out[r + "kv_a.weight"], cfg, inverse)
    return out


def adapter_parts(layer: str, rest: str, base: str, out_features: int, cfg: ModelConfig, name: str):
    """PEFT's modules for redline layer `layer` (rest: its name after blocks.N.) of family `name` (DeepSeek's, Mistral
    4's, A.X-K1's or MiniCPM3's), each with its B rows (peft_adapter's _parts): the latent attention's under self_attn. (DeepSeek-V2's
    rotated rows interleaved again, as to_hf writes them); a UserError for DeepSeek's MLPs' layers, whose adapters
    PEFT would move onto the experts (its weight conversion for transformers' DeepSeek models, as for Qwen3-Next's);
    None for MiniCPM3's dense MLPs (Llama's names)."""
    arch = {**_ARCHITECTURES, "mistral4": "Mistral4ForCausalLM", "axk1": "AXK1ForCausalLM"}.get(
        name, "MiniCPM3ForCausalLM")
    if rest.startswith("attn."):
        module = rest[len("attn."):]
        if module not in _ATTN or module.endswith("_norm"):
            raise UserError(f"the adapter on {layer} has no counterpart in {arch}; export with --merge")
        rows = torch.arange(out_features)
        if name == "deepseek_v2" and module in ("q", "q_b"):
            rows = q_rope_rows(rows[:, None], cfg, inverse=False)[:, 0]
        elif name == "deepseek_v2" and module == "kv_a":
            rows = kv_rope_rows(rows, cfg, inverse=False)
        return [(f"{base}self_attn.{_ATTN[module]}", rows)]
    if rest.startswith("mlp.") and name != "minicpm3":  # MiniCPM3's dense MLPs: Llama's names (peft_adapter's)
        raise UserError(f"the adapter on {layer} would be a gate_proj, up_proj or down_proj adapter (or the "
                        f"router's), which PEFT moves onto {arch}'s experts as it loads them; train "
                        f"with lora.targets attn.* or export with --merge")
    return None


def interleaved(hf: dict, name: str) -> bool:
    """Whether the checkpoint's rotated rows are in interleaved pairs: DeepSeek-V2's always, V3's where
    rope_interleave (its default)."""
    return name == "deepseek_v2" or bool(hf.get("rope_interleave", True))


def fold_for(name: str):
    def fold(hf: dict, cfg: ModelConfig, state: dict) -> dict:
        return _rope_rows(state, cfg, inverse=True) if interleaved(hf, name) else state

    return fold


FP8_BLOCK = 128
"""DeepSeek-V3's fp8 weights: one weight_scale_inv a block of 128 x 128 (the last blocks of a matrix whose sides are
no multiple of 128 cut short)."""


def dequantize_fp8(weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """An fp8 e4m3 weight (..., rows, cols) times its blocks' scales (..., ceil(rows / 128), ceil(cols / 128)) ->
    fp32, the product in fp32 as transformers' Fp8Dequantize and DeepSeek's weight_dequant compute it (transformers
    then rounds to the model's dtype, as the import's --dtype does)."""
    rows, cols = weight.shape[-2:]
    scale = scale_inv.float().repeat_interleave(FP8_BLOCK, dim=-2)[..., :rows, :]
    return weight.float() * scale.repeat_interleave(FP8_BLOCK, dim=-1)[..., :cols]


class _Dequantizing:
    """A TensorSource's take, dequantizing a weight that has a `<name>_scale_inv` beside it (the fp8 checkpoints'
    Linear layers); every other tensor as it is."""

    def __init__(self, src: TensorSource):
        self.src = src

    def __contains__(self, name: str) -> bool:
        return name in self.src

    def take(self, name: str) -> torch.Tensor:
        t = self.src.take(name)
        scale = f"{name}_scale_inv"
        return dequantize_fp8(t, self.src.take(scale)) if scale in self.src else t


def _prefix(src: TensorSource) -> str:
    return "" if "embed_tokens.weight" in src and "model.embed_tokens.weight" not in src else "model."


def to_redline(source: TensorSource, cfg: ModelConfig) -> dict:
    pre = _prefix(source)
    src = _Dequantizing(source)
    out = {"norm_f.weight": src.take(f"{pre}norm.weight"),
           "wte.weight": pad_rows(src.take(f"{pre}embed_tokens.weight"), cfg), **take_head(src, cfg)}
    for i in range(cfg.n_layer):
        p, r = f"{pre}layers.{i}.", f"blocks.{i}."
        out[r + "norm1.weight"] = src.take(p + "input_layernorm.weight")
        out[r + "norm2.weight"] = src.take(p + "post_attention_layernorm.weight")
        for ours in _attn_modules(cfg):
            out[f"{r}attn.{ours}.weight"] = src.take(f"{p}self_attn.{_ATTN[ours]}.weight")
        out.update(_mlp_to_redline(src, p, r, cfg, cfg.layer_has_experts(i)))
    # DeepSeek-V3's multi-token-prediction layers after the last (num_nextn_predict_layers): no part of the causal
    # LM; transformers ignores them on load too (marked used unread)
    source.used.update(n for n in source.names if n.startswith(f"{pre}layers.{cfg.n_layer}."))
    return out


def _mlp_to_redline(src: _Dequantizing, p: str, r: str, cfg: ModelConfig, experts: bool) -> dict:
    """A layer's dense MLP or mixture (p: its HF "model.layers.N.", r: redline's "blocks.N.")."""
    if not experts:
        return {f"{r}mlp.fc.weight": torch.cat([src.take(p + "mlp.gate_proj.weight"),
                                                src.take(p + "mlp.up_proj.weight")]),
                f"{r}mlp.proj.weight": src.take(p + "mlp.down_proj.weight")}
    return deepseek_experts_to_redline(src, p, r, cfg)


def to_hf_for(name: str):
    def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
        if name == "deepseek_v2":  # its RoPE is always on interleaved pairs
            state = _rope_rows(dict(state), cfg, inverse=False)
        out = {"model.norm.weight": state["norm_f.weight"],
               "model.embed_tokens.weight": state["wte.weight"][:cfg.vocab_size],
               **give_head(state, cfg)}
        for i in range(cfg.n_layer):
            p, r = f"model.layers.{i}.", f"blocks.{i}."
            out[p + "input_layernorm.weight"] = state[r + "norm1.weight"]
            out[p + "post_attention_layernorm.weight"] = state[r + "norm2.weight"]
            for ours in _attn_modules(cfg):
                out[f"{p}self_attn.{_ATTN[ours]}.weight"] = state[f"{r}attn.{ours}.weight"]
            m, rm = p + "mlp.", r + "mlp."
            if not cfg.layer_has_experts(i):
                out[m + "gate_proj.weight"], out[m + "up_proj.weight"] = state[rm + "fc.weight"].chunk(2)
                out[m + "down_proj.weight"] = state[rm + "proj.weight"]
                continue
            # transformers' V3 router always has the bias (zeros where redline has none); V2's has none
            out.update(deepseek_experts_to_hf(state, p, r, cfg, bias=name == "deepseek_v3"))
        return out

    return to_hf


def export_name(cfg: ModelConfig) -> str:
    """A.X-K1 for mixtures with normed outputs, Mistral 4 for a mixture with softmax scores rescaled or chosen within groups (deepseek_kin.py), DeepSeek-V2 for
    one with softmax scores taken as they are, DeepSeek-V3 otherwise (sigmoid scores, or dense)."""
    from redline.interop import deepseek_kin

    if cfg.moe_post_norm:  # a norm on the mixtures' outputs: A.X-K1's alone
        deepseek_kin.check_axk1_exportable(cfg)
        return "axk1"
    if deepseek_kin.wants_mistral4(cfg):
        deepseek_kin.check_mistral4_exportable(cfg)
        return "mistral4"
    name = "deepseek_v2" if cfg.moe_experts and cfg.moe_gating == "softmax" else "deepseek_v3"
    check_exportable(cfg, name)
    return name


def _mscale_all_dim(cfg: ModelConfig) -> float:
    """The mscale_all_dim that gives model.attn_scale (0: the plain 1 / sqrt(head width)); a UserError where no
    YaRN mscale does."""
    plain = cfg.head_dim ** -0.5
    if not cfg.attn_scale or math.isclose(cfg.attn_scale, plain, rel_tol=1e-12):
        return 0.0
    if cfg.rope_scaling != "yarn" or cfg.rope_factor <= 1 or cfg.attn_scale < plain:
        raise UserError(f"model.attn_scale={cfg.attn_scale} with latent attention: DeepSeek's score scale is "
                        f"1 / sqrt(head width) = {plain}, times YaRN's mscale² where rope_scaling=yarn")
    m = math.sqrt(cfg.attn_scale / plain)
    return (m - 1.0) / (0.1 * math.log(cfg.rope_factor))


def check_exportable(cfg: ModelConfig, name: str) -> None:
    arch = {"deepseek_v3": "DeepSeek-V3", "deepseek_v2": "DeepSeek-V2"}[name]
    experts = bool(cfg.moe_experts)
    raise_first([
        (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.norm_unit_offset or not cfg.norm_affine
         or cfg.parallel_residual, f"norms other than pre-norm RMSNorms with latent attention: {arch}'s blocks have "
                                   f"them"),
        (cfg.mlp != "swiglu", f"model.mlp={cfg.mlp} with latent attention: {arch}'s MLPs are SwiGLU"),
        (cfg.latent_key_norm or cfg.latent_norm_eps or cfg.attn_gate != "none",
         f"model.latent_key_norm, latent_norm_eps or attn_gate with latent attention: {arch} has no norm on the RoPE "
         f"key part, normalizes its latents at 1e-6 and gates no heads"),
        (cfg.sliding_window or cfg.attn_softcap or cfg.attn_sinks or cfg.logit_softcap or cfg.logit_divisor
         or cfg.embed_scale or cfg.embed_multiplier or cfg.residual_multiplier or cfg.head_bias or cfg.moe_bias
         or cfg.moe_layers or cfg.rope_local_theta or cfg.embed_norm,
         f"windows, soft caps, sinks, embedding/residual/logit scalars or biases with latent attention: {arch} has "
         f"none of them"),
        (cfg.rope_scaling not in ("none", "linear", "yarn", "llama3"),
         f"model.rope_scaling={cfg.rope_scaling} with latent attention: {arch} takes linear, llama3 or yarn"),
        (experts and not cfg.moe_shared_hidden or cfg.moe_shared_gate and cfg.moe_shared_hidden
         or cfg.moe_shared_hidden % cfg.hidden_dim,
         f"model.moe_shared_hidden={cfg.moe_shared_hidden} (moe_shared_gate={cfg.moe_shared_gate}): {arch} runs an "
         f"ungated shared expert a whole number of expert widths ({cfg.hidden_dim}) wide"),
        (name == "deepseek_v3" and experts and (cfg.moe_gating != "sigmoid" or (
            cfg.moe_norm_topk and cfg.moe_norm_eps != 1e-20)),
         f"sigmoid scores rescaled with model.moe_norm_eps={cfg.moe_norm_eps}: DeepSeek-V3 adds 1e-20 to their sum "
         f"(set model.moe_norm_eps=1e-20)"),
        (name == "deepseek_v2" and (cfg.moe_norm_topk or cfg.moe_expert_bias or cfg.moe_groups > 1),
         "model.moe_norm_topk, moe_expert_bias or moe_groups with softmax scores: DeepSeek-V2's router takes the top "
         "k of the softmax as they are (DeepSeek-V3's, with sigmoid scores, has the others)"),
    ])
    _mscale_all_dim(cfg)


def hf_config_for(name: str):
    def hf_config(cfg: ModelConfig) -> dict:
        D, R = cfg.head_dim, cfg.rope_dims
        experts = cfg.moe_experts
        params = {"rope_type": "default", "rope_theta": cfg.rope_theta}
        scaling = rope_scaling(cfg, name)
        if scaling:
            params.update(scaling)
            if cfg.rope_scaling == "yarn":
                mscale_all_dim = _mscale_all_dim(cfg)
                if mscale_all_dim:
                    params["mscale_all_dim"] = mscale_all_dim
        dense = experts == 0
        out = {
            "model_type": name, "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
            "intermediate_size": cfg.hidden_dim if dense else (cfg.moe_dense_hidden or cfg.hidden_dim),
            "moe_intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_head,
            "n_shared_experts": 1 if dense else cfg.moe_shared_hidden // cfg.hidden_dim,
            "n_routed_experts": experts or 1, "num_experts_per_tok": cfg.moe_top_k if experts else 1,
            "routed_scaling_factor": cfg.moe_scale, "kv_lora_rank": cfg.kv_lora_rank,
            "q_lora_rank": cfg.q_lora_rank or None, "qk_rope_head_dim": R, "qk_nope_head_dim": D - R,
            "v_head_dim": cfg.v_head_dim or D, "first_k_dense_replace": cfg.n_layer if dense else cfg.moe_dense_layers,
            "norm_topk_prob": cfg.moe_norm_topk, "hidden_act": "silu", "max_position_embeddings": cfg.context_len,
            "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "rope_parameters": params,
            "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        }
        if name == "deepseek_v3":
            out.update(n_group=cfg.moe_groups, topk_group=cfg.moe_topk_groups, rope_interleave=False)
        else:
            out.update(n_group=None, topk_group=None, topk_method="greedy", mlp_bias=False)
        return out

    return hf_config


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


FAMILIES = tuple(
    Family(name=n, architecture=arch, model_config=model_config_for(n), hf_config=hf_config_for(n),
           to_redline=to_redline, to_hf=to_hf_for(n), ignorable=_ignorable, fold=fold_for(n))
    for n, arch in _ARCHITECTURES.items()
)
LITE_FAMILY = Family(name="glm4_moe_lite", architecture="Glm4MoeLiteForCausalLM",
                     model_config=model_config_for("glm4_moe_lite"), hf_config=hf_config_for("deepseek_v3"),
                     to_redline=to_redline, to_hf=to_hf_for("deepseek_v3"), ignorable=_ignorable,
                     fold=fold_for("glm4_moe_lite"))
"""GLM-4.7-Flash: read as the DeepSeek-V3 it computes as (lite_as_deepseek_v3), and written back as DeepSeek-V3 (its
tensors and config say the same model there; export_family never picks this family)."""
