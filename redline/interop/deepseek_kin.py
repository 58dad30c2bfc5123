"""Families built from DeepSeek-V3's latent attention (deepseek.py's tensor names, RoPE rows and score scale), each
read as the DeepSeek model it computes as, with what it adds mapped onto a ModelConfig field:

- Youtu (YoutuForCausalLM, model_type "youtu": Youtu-LLM-2B): DeepseekV3Attention on Llama's dense SwiGLU blocks
  (transformers' models/youtu/modular_youtu.py), tied embeddings by default: a dense DeepSeek-V3 exactly, so
  written back as DeepSeek-V3;
- Mistral 4 (Mistral4ForCausalLM, "mistral4": Mistral-Small-4): DeepSeek-V3's attention and experts with DeepSeek-V2's
  router made group-limited (transformers' Mistral4TopkRouter): softmax scores, the best `topk_group` of `n_group`
  groups by their two best scores (redline's moe_groups, which scores groups so for softmax as for sigmoid), the
  chosen scores rescaled to sum to 1 where `norm_topk_prob` (its + 1e-20 is below an fp32 sum's last bit), times
  `routed_scaling_factor`; no routing bias. Its queries are scaled by Llama 4's 1 + beta · ln(1 + floor(p /
  original)) (rope_parameters' llama_4_scaling_beta, Ministral 3's), which is exactly 1 below the original
  context: the import's context stops there, as llama.py's Ministral 3 import does. transformers' Mistral 4
  rotates qk_rope_head_dim alone under YaRN only (its other tables ignore partial_rotary_factor). Exported as
  Mistral 4 from latent attention with softmax experts rescaled or grouped (DeepSeek-V2 has neither), the beta
  written as 0, unscaled RoPE as YaRN by 1, the experts stacked; AutoModelForCausalLM maps no mistral4, so the
  folder loads with Mistral4ForCausalLM. Mistral-Small-4's Hub folder (Mistral3ForConditionalGeneration, a mistral4
  text_config) is read through multimodal.py's mistral3 family;
- DeepSeek-V3.2 (DeepseekV32ForCausalLM, "deepseek_v32") and GLM-5 (GlmMoeDsaForCausalLM, "glm_moe_dsa"):
  DeepSeek-V3 (RoPE always on interleaved pairs, dense layers as mlp_layer_types) with DeepSeek Sparse Attention,
  a lightning indexer per layer (`self_attn.indexer.*`; GLM-5's "shared" layers reuse an earlier layer's choice)
  that keeps the `index_topk` best keys of each query. Over at most index_topk keys it keeps every one and the
  attention is DeepSeek-V3's dense latent attention exactly (transformers' models/deepseek_v32 masks nothing
  then), so the import runs that: the context stops at index_topk, and the indexer's weights are left out, said
  in one line. Written back as DeepSeek-V3, the dense attention redline computes at every length; never as
  DeepSeek-V3.2 or GLM-5, whose indexer redline does not keep;
- A.X-K1 (AXK1ForCausalLM, "axk1"): DeepSeek-V3 with an RMSNorm on each mixture's output (post_mlp_layernorm,
  transformers' AXK1MoE): model.moe_post_norm; the Hub's files route without e_score_correction_bias (zeros) and
  store the norm on dense layers too (unused). Exported as A.X-K1 wherever a model has moe_post_norm.

Refused by name: what deepseek.py refuses, and per family what is named below. LongCat-Flash and A.X-K2 have
modules of their own (longcat_flash.py, axk2.py).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop import deepseek
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig

_YOUTU_DEFAULTS = dict(vocab_size=128256, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128,
                       qk_nope_head_dim=128, max_position_embeddings=131072, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, rope_interleave=True)
"""YoutuConfig's defaults for the fields a config.json may leave out (a null q_lora_rank, given, is one q_proj)."""


def youtu_model_config(hf: dict) -> ModelConfig:
    for key in ("n_routed_experts", "num_local_experts"):
        if hf.get(key):
            raise UserError(f"{key}={hf[key]} on youtu: Youtu's MLPs are dense")
    return deepseek.model_config_for("deepseek_v3")({**_YOUTU_DEFAULTS, **hf})


YOUTU_FAMILY = Family(name="youtu", architecture="YoutuForCausalLM", model_config=youtu_model_config,
                      hf_config=deepseek.hf_config_for("deepseek_v3"), to_redline=deepseek.to_redline,
                      to_hf=deepseek.to_hf_for("deepseek_v3"), ignorable=deepseek._ignorable,
                      fold=deepseek.fold_for("deepseek_v3"))
"""Youtu: read as the dense DeepSeek-V3 it computes as, written back as DeepSeek-V3 (export_family never picks it)."""


# ---------------------------------------------------------------------------------------------------------------
# Mistral 4

_MISTRAL4_DEFAULTS = dict(vocab_size=131072, moe_intermediate_size=2048, n_shared_experts=1, n_routed_experts=128,
                          routed_scaling_factor=1.0, kv_lora_rank=256, q_lora_rank=1024, qk_rope_head_dim=64,
                          v_head_dim=128, qk_nope_head_dim=64, n_group=1, topk_group=1, num_experts_per_tok=4,
                          first_k_dense_replace=0, norm_topk_prob=True, max_position_embeddings=1048576,
                          rms_norm_eps=1e-6, tie_word_embeddings=False, rope_interleave=True)
"""Mistral4Config's defaults for the fields a config.json may leave out."""


def mistral4_model_config(hf: dict) -> ModelConfig:
    hf = {**_MISTRAL4_DEFAULTS, **{k: v for k, v in hf.items() if v is not None or k == "q_lora_rank"}}
    params = dict(hf.get("rope_parameters") or {})
    if hf.get("rope_parameters") is None:  # Mistral4Config's default: YaRN with the query scale
        params = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0, "original_max_position_embeddings": 8192,
                  "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                  "llama_4_scaling_beta": 0.1}
        hf["rope_parameters"] = params
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "yarn":  # its other RoPE tables ignore partial_rotary_factor: a whole head's, qk_rope_head_dim wide
        raise UserError(f"rope_parameters.rope_type={kind!r} on mistral4: transformers' Mistral 4 rotates "
                        f"qk_rope_head_dim alone with YaRN only (Mistral4Config's default)")
    # DeepSeek-V3's reading, then the router's softmax in place of its sigmoid and bias (module docstring)
    cfg = deepseek.model_config_for("deepseek_v3")(hf)
    if cfg.moe_experts:
        cfg = dataclasses.replace(cfg, moe_gating="softmax", moe_expert_bias=False,
                                  moe_norm_eps=ModelConfig.moe_norm_eps)
    if params.get("llama_4_scaling_beta"):
        original = params.get("original_max_position_embeddings")
        if not original:
            raise UserError("rope_parameters.llama_4_scaling_beta without original_max_position_embeddings: the "
                            "queries' scale needs the context it starts past")
        cfg = dataclasses.replace(cfg, context_len=min(cfg.context_len, int(original)))
    return cfg


def wants_mistral4(cfg: ModelConfig) -> bool:
    """Latent attention with softmax-scored experts that are rescaled or chosen within groups: Mistral 4's router
    alone (DeepSeek-V2's takes the top k of the softmax as they are)."""
    return bool(cfg.kv_lora_rank and cfg.moe_experts and cfg.moe_gating == "softmax"
                and (cfg.moe_norm_topk or cfg.moe_groups > 1))


def check_mistral4_exportable(cfg: ModelConfig) -> None:
    raise_first([
        (cfg.moe_expert_bias, "model.moe_expert_bias with softmax scores and latent attention: Mistral 4's router "
                              "has no routing bias"),
        (cfg.moe_norm_min, f"model.moe_norm_min={cfg.moe_norm_min}: Mistral 4 does not floor the chosen scores' sum"),
        (cfg.rope_scaling not in ("none", "yarn"), f"model.rope_scaling={cfg.rope_scaling} with Mistral 4's router: "
                                                  f"transformers' Mistral 4 takes YaRN alone"),
    ])
    # the rest as DeepSeek-V3's checks read it: its blocks, attention and shared expert are Mistral 4's
    deepseek.check_exportable(dataclasses.replace(cfg, moe_gating="sigmoid", moe_norm_eps=1e-20), "deepseek_v3")


def mistral4_hf_config(cfg: ModelConfig) -> dict:
    check_mistral4_exportable(cfg)
    out = deepseek.hf_config_for("deepseek_v3")(cfg)
    # llama_4_scaling_beta 0: the queries unscaled at every position (transformers reads the key unguarded)
    params = {**out["rope_parameters"], "llama_4_scaling_beta": 0.0}
    if cfg.rope_scaling == "none":  # YaRN by 1: the plain table (pos / 1 both ways, attention factor 1), the one
        params.update(rope_type="yarn", factor=1.0, original_max_position_embeddings=cfg.context_len)  # it rotates
    out.update(model_type="mistral4", rope_parameters=params, pretraining_tp=1)
    return out


def mistral4_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """DeepSeek-V3's names, the experts stacked as Mistral4Experts holds them (transformers converts no per-expert
    tensors for mistral4): gate_up_proj (E, 2F, C), each expert's [gate; up] rows as redline's fc, and down_proj
    (E, C, F) as redline's proj; no routing bias (Mistral4TopkRouter holds its weight alone)."""
    out = {k: v for k, v in deepseek.to_hf_for("deepseek_v3")(state, cfg).items()
           if ".mlp.experts." not in k and not k.endswith("mlp.gate.e_score_correction_bias")}
    for i in range(cfg.n_layer):
        if cfg.layer_has_experts(i):
            p, r = f"model.layers.{i}.mlp.experts.", f"blocks.{i}.mlp."
            out[p + "gate_up_proj"], out[p + "down_proj"] = state[r + "fc"], state[r + "proj"]
    return out


MISTRAL4_FAMILY = Family(name="mistral4", architecture="Mistral4ForCausalLM", model_config=mistral4_model_config,
                         hf_config=mistral4_hf_config, to_redline=deepseek.to_redline, to_hf=mistral4_to_hf,
                         ignorable=deepseek._ignorable, fold=deepseek.fold_for("deepseek_v3"))


# ---------------------------------------------------------------------------------------------------------------
# DeepSeek Sparse Attention: DeepSeek-V3.2, GLM-5

_DSA_DEFAULTS = {
    "deepseek_v32": dict(vocab_size=129280, moe_intermediate_size=2048, n_shared_experts=1, n_routed_experts=256,
                         routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
                         v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4, num_experts_per_tok=8,
                         norm_topk_prob=True, max_position_embeddings=163840, rms_norm_eps=1e-6,
                         first_k_dense_replace=3, index_topk=2048),
    "glm_moe_dsa": dict(vocab_size=154880, moe_intermediate_size=2048, n_shared_experts=1, n_routed_experts=256,
                        routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=2048, qk_rope_head_dim=64,
                        v_head_dim=256, qk_nope_head_dim=192, n_group=1, topk_group=1, num_experts_per_tok=8,
                        norm_topk_prob=True, max_position_embeddings=202752, rms_norm_eps=1e-5,
                        first_k_dense_replace=3, index_topk=2048),
}
"""DeepseekV32Config's and GlmMoeDsaConfig's defaults for the fields a config.json may leave out."""
_INDEXER = ".self_attn.indexer."
"""The lightning indexer's tensors (wq_b, wk, k_norm, weights_proj) of a layer, after model.layers.N."""


def dsa_model_config_for(name: str):
    def model_config(hf: dict) -> ModelConfig:
        hf = {**_DSA_DEFAULTS[name], **{k: v for k, v in hf.items() if v is not None}}
        n = hf["num_hidden_layers"]
        if not hf.get("mlp_layer_types"):  # DeepseekV32Config's: the first first_k_dense_replace layers dense
            dense = min(int(hf["first_k_dense_replace"]), n)
            hf["mlp_layer_types"] = ["dense"] * dense + ["sparse"] * (n - dense)
        # DeepSeek-V3's reading of the dense-then-sparse layers; the attention always rotates interleaved pairs
        plain = deepseek.lite_as_deepseek_v3({**hf, "rope_interleave": True}, defaults={})
        cfg = deepseek.model_config_for("deepseek_v3")(plain)
        topk = int(hf["index_topk"])
        if topk < 1:
            raise UserError(f"index_topk={topk} on {name}: the indexer keeps at least one key a query")
        return dataclasses.replace(cfg, context_len=min(cfg.context_len, topk))

    return model_config


def leave_out_indexer(src: TensorSource, cfg: ModelConfig) -> None:
    """A DSA indexer's tensors marked read, not loaded, and said so on stderr: over at most index_topk keys (the
    context the import caps at) the indexer keeps them all, so the dense latent attention equals it."""
    indexer = sorted(n for n in src.names if _INDEXER in n)
    src.used.update(indexer)
    if indexer:
        print(f"{src.where}: the sparse attention's indexer ({len(indexer)} tensors) is left out: over at most "
              f"index_topk = {cfg.context_len} keys it keeps them all, so redline runs the dense latent attention "
              f"that equals it, its context stopped there", file=sys.stderr)


def dsa_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = deepseek.to_redline(src, cfg)
    leave_out_indexer(src, cfg)
    return out


def _dsa_family(name: str, architecture: str) -> Family:
    """DeepSeek-V3.2 or GLM-5: read as DeepSeek-V3 within index_topk, written back as DeepSeek-V3."""
    return Family(name=name, architecture=architecture, model_config=dsa_model_config_for(name),
                  hf_config=deepseek.hf_config_for("deepseek_v3"), to_redline=dsa_to_redline,
                  to_hf=deepseek.to_hf_for("deepseek_v3"), ignorable=deepseek._ignorable,
                  fold=deepseek.fold_for("deepseek_v3"))


DSA_FAMILIES = (_dsa_family("deepseek_v32", "DeepseekV32ForCausalLM"),
                _dsa_family("glm_moe_dsa", "GlmMoeDsaForCausalLM"))


# ---------------------------------------------------------------------------------------------------------------
# A.X-K1

_AXK1_DEFAULTS = dict(vocab_size=163840, moe_intermediate_size=2048, n_shared_experts=1, n_routed_experts=192,
                      routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
                      v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4, num_experts_per_tok=8,
                      norm_topk_prob=True, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_interleave=True)
"""AXK1Config's defaults for the fields a config.json may leave out."""
_POST_MLP_NORM = "post_mlp_layernorm.weight"
"""A.X-K1's norm on a mixture's output, after model.layers.N.: where the Hub's files and save_pretrained put it
(transformers' module holds it as mlp.post_mlp_layernorm, which older files may name)."""


def axk1_model_config(hf: dict) -> ModelConfig:
    """DeepSeek-V3's reading (its dense layers as mlp_layer_types, from first_k_dense_replace and moe_layer_freq
    where absent, as AXK1Config derives them), the mixtures' outputs normed (model.moe_post_norm)."""
    hf = {**_AXK1_DEFAULTS, **{k: v for k, v in hf.items() if v is not None or k == "q_lora_rank"}}
    n = hf["num_hidden_layers"]
    if not hf.get("mlp_layer_types"):
        first, every = int(hf.get("first_k_dense_replace", 1)), int(hf.get("moe_layer_freq", 1))
        hf["mlp_layer_types"] = ["sparse" if i >= first and i % every == 0 else "dense" for i in range(n)]
    plain = deepseek.lite_as_deepseek_v3({k: v for k, v in hf.items() if k != "moe_layer_freq"}, defaults={})
    cfg = deepseek.model_config_for("deepseek_v3")(plain)
    return dataclasses.replace(cfg, moe_post_norm=True) if cfg.moe_experts else cfg


class _ZeroRoutingBias:
    """A source whose mixtures' missing e_score_correction_bias reads as zeros: A.X-K1's Hub files route without
    one, which transformers' DeepSeek-V3 router then holds as zeros (AXK1PreTrainedModel's missing keys)."""

    def __init__(self, src: TensorSource, cfg: ModelConfig):
        self.src, self.where = src, src.where
        self.zeros = {f"model.layers.{i}.mlp.gate.e_score_correction_bias" for i in range(cfg.n_layer)
                      if cfg.layer_has_experts(i)} - src.names
        self.names, self.used = src.names | self.zeros, src.used
        self.experts = cfg.moe_experts

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def take(self, name: str) -> torch.Tensor:
        return torch.zeros(self.experts) if name in self.zeros else self.src.take(name)


def axk1_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = deepseek.to_redline(_ZeroRoutingBias(src, cfg), cfg)  # type: ignore[arg-type]: take / names / used
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        names = [n for n in (p + _POST_MLP_NORM, p + "mlp." + _POST_MLP_NORM) if n in src]
        if cfg.layer_has_experts(i):
            if not names:
                raise UserError(f"{src.where} has no tensor {p + _POST_MLP_NORM}; the file is incomplete or not of "
                                f"the architecture its config names")
            out[f"blocks.{i}.mlp.post_norm.weight"] = src.take(names[0])
        else:  # the Hub's dense layers store one too, which transformers' A.X-K1 does not use
            src.used.update(names)
    return out


def check_axk1_exportable(cfg: ModelConfig) -> None:
    raise_first([
        (not (cfg.kv_lora_rank and cfg.moe_experts), "model.moe_post_norm: of the architectures redline exports "
                                                     "to, A.X-K1 alone norms a mixture's output, and it has latent "
                                                     "attention (model.kv_lora_rank) and experts"),
        (cfg.norm != "rmsnorm", f"model.norm={cfg.norm} with model.moe_post_norm: A.X-K1's norms are RMSNorms"),
    ])
    deepseek.check_exportable(cfg, "deepseek_v3")


def axk1_hf_config(cfg: ModelConfig) -> dict:
    check_axk1_exportable(cfg)
    out = deepseek.hf_config_for("deepseek_v3")(cfg)
    dense = out.pop("first_k_dense_replace")  # AXK1Config takes mlp_layer_types alone
    return {**out, "model_type": "axk1",
            "mlp_layer_types": ["dense"] * dense + ["sparse"] * (cfg.n_layer - dense)}


def axk1_to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    out = deepseek.to_hf_for("deepseek_v3")(state, cfg)
    for i in range(cfg.n_layer):
        if cfg.layer_has_experts(i):
            out[f"model.layers.{i}.{_POST_MLP_NORM}"] = state[f"blocks.{i}.mlp.post_norm.weight"]
    return out


AXK1_FAMILY = Family(name="axk1", architecture="AXK1ForCausalLM", model_config=axk1_model_config,
                     hf_config=axk1_hf_config, to_redline=axk1_to_redline, to_hf=axk1_to_hf,
                     ignorable=deepseek._ignorable, fold=deepseek.fold_for("deepseek_v3"))


REFUSED: dict[str, str] = {}
"""model_types of DeepSeek-derived architectures redline cannot express exactly: family_for's one-line refusal."""
