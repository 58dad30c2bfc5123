"""Model families: how a Hugging Face config and state dict map onto redline's ModelConfig and weights, and back.

A family is the pair (config translation, weight-name map) for one Hugging Face `model_type`. The Llama layout
(llama.py) serves Llama, Mistral, Qwen2 and Qwen3, which name their tensors alike and differ in biases, QK-norm,
sliding windows and head width; olmo2.py serves OLMo 1, 2 and 3 and gemma3.py Gemma 3's text model (the Llama names,
their norms on the sublayers' outputs) and stablelm.py StableLM (the Llama names, LayerNorm); gpt2.py serves GPT-2,
gpt_neox.py GPT-NeoX (Pythia), phi.py Phi, cohere.py Cohere's Command models and opt.py OPT; gpt_bigcode.py
GPTBigCode (SantaCoder, StarCoderBase: GPT-2's block with multi-query attention) and gpt_neo.py GPT-Neo (global and
local layers, unscaled scores); gptj.py GPT-J and CodeGen (parallel sublayers under one LayerNorm, RoPE on part of
each head in interleaved pairs, CodeGen's qkv_proj in its 4 model-parallel blocks); moe.py the mixtures
of experts on the Llama layout (Mixtral, Qwen2/3-MoE, OLMoE, FlexOlmo); gpt_oss.py GPT-OSS (sinks, biased and clamped
experts); lfm2.py LFM2 (attention and short convolutions) and LFM3 (with windowed layers, gated heads and output
norms); granite.py Granite, Granite 4.0 (dense, and its hybrids with Mamba-2 layers and experts), GraniteMoE,
GraniteMoeShared, Granite SWA (sinks, windowed layers in any order, a RoPE base per layer) and GraniteMoeSWA
(its attention on experts); qwen3_5.py Qwen3.5
and Qwen3.5-MoE (gated delta nets, gated attention; dense MLPs or experts with a shared one) and qwen3_next.py
Qwen3-Next (the same, its delta nets' projections grouped by key head, dense layers first); qwen4_exp.py Qwen4-Exp
(Qwen3.5-MoE's layers on hyper-connected streams, a QSA indexer read dense within its budget); lara_mini.py Lara Mini
(Qwen3.5's delta nets beside ungated windowed and NoPE attention, experts with an ungated shared one); zamba2.py
Zamba2 (Mamba-2 layers, some calling shared transformer blocks with adapters of their own); olmo_hybrid.py OLMo
Hybrid (gated delta nets in pre-norm blocks beside OLMo 3's); granite.py also Bamba (Granite 4.0's Mamba-2 layers
with partial RoPE); bloom.py BLOOM and mpt.py MPT (ALiBi positions); falcon.py Falcon (RoPE, multi-query or KV-grouped
query_key_value, parallel sublayers under one or two LayerNorms; Falcon-RW's ALiBi refused); falcon_h1.py
Falcon-H1 (attention and a
Mamba-2 mixer side by side in every layer, its µP multipliers folded into the weights); nemotron_h.py Nemotron-H
(Mamba-2, attention without positions and ReLU² MLPs, one sublayer a layer) and Mamba2 (Mamba-2 mixers alone);
mamba.py Mamba and Falcon-Mamba (Mamba-1 mixers alone, Falcon-Mamba's with RMS norms on B, C and dt); jamba.py
Jamba (Mamba-1 mixers with weighted dt, B and C norms and attention without positions, each followed by a SwiGLU or
a mixture of experts on some layers); gemma4.py Gemma 4's text model and gemma3n.py Gemma 3n's (Gemma 4's attention
and per-layer inputs inside AltUp streams, with LAuReL and sparse MLP gates); llama4.py Llama 4's text model (interleaved RoPE, layers without it, chunked
attention, input-weighted experts with a shared one on some layers); exaone.py
EXAONE 3.x; ernie.py ERNIE 4.5 and Helium; glm.py GLM and GLM-4 (RoPE on part of each head in interleaved pairs,
GLM-4 with plain sandwich norms) and GLM-4-MoE (DeepSeek-V3's grouped sigmoid routing with shared experts);
minimax_m2.py MiniMax-M2 (Mixtral's names, QK-norm over whole projections, partial RoPE, sigmoid routing with a
bias); phimoe.py PhiMoE (Mixtral's names, LayerNorms and attention with biases, SparseMixer routing, LongRoPE); dbrx.py
DBRX (clamped fused q/k/v, LayerNorms without biases, experts fused into one tensor per projection).
EXAONE 3.x; ernie.py ERNIE 4.5 (dense and MoE) and Helium; hunyuan.py Hunyuan (dense and MoE); cohere.py also Cohere2
MoE and Cohere Compass's text model (a RoPE base per layer type);
llama.py also Ministral (windowed and full layers), CWM (Ministral's layout, its own defaults) and Jais 2
(LayerNorm, ReLU²); glm.py also Solar Open (GLM-4-MoE's experts on every layer under Llama's attention); dots1.py also
HY-V3 (dots.llm1's layout, other names); persimmon.py Persimmon (GPT-NeoX's query_key_value, LayerNorm QK-norm,
ReLU²); xglm.py XGLM (sinusoidal positions as a learned table, exported as BioGPT); granite.py also HyperCLOVA X (Granite's with norms on the sublayers'
outputs); apertus.py Apertus (the xIELU MLP) and Apertus 1.5's text model; multimodal.py the text
model of Gemma 3's, Mistral 3's and Qwen3-VL's multimodal folders (read as gemma3_text, mistral / ministral3 and
qwen3) and of the LLaVA-like ones (LLaVA, LLaVA-NeXT, LLaVA-OneVision, VipLLaVA, Video-LLaVA, LLaVA-NeXT-Video,
InternVL, SmolVLM, Idefics3, Aya Vision, Command A Vision, LFM2-VL, Qwen2-VL, Qwen2.5-VL, Qwen3-VL-MoE,
GLM-4.1V, GLM-4.5V, HunYuan-VL, EXAONE 4.5, Granite 4.0 Vision, Llama 3.2 Vision (its self-attention
layers), Apertus 1.5, Cohere Compass, Aria and MiniMax-M3: read as their text model's family); deepseek_kin.py the families read as DeepSeek's latent attention with what they add (Youtu, Mistral 4,
DeepSeek-V3.2 and GLM-5 within their sparse attention's index_topk, A.X-K1); longcat_flash.py LongCat-Flash (two
blocks a layer, the shortcut MoE, identity experts); deepseek_v4.py DeepSeek-V4 (mHC streams, one key head as
value, grouped output projection, keys compressed window by window within its indexer's top k, hash-routed experts);
axk2.py A.X-K2 (gated norms, the latent query gate); mimo.py MiMo-V2-Flash (sinks and twice the KV heads on its windowed layers);
afmoe.py AFMoE (gated attention, sandwich norms, NoPE full layers, sigmoid-scored experts);
windowed_moe.py Mellum and Flint (Qwen3-MoE's attention with windowed and dense layers; Flint's sinks); kolibri1.py
Kolibri-1 (EXAONE 4.0's attention in GLM-4's sandwich blocks, experts chosen by logits plus a bias); laguna.py
Laguna (softplus-gated heads, a partial RoPE per layer type, sigmoid experts beside a shared one); jetmoe.py JetMoE
(a mixture of attention heads routed per token beside a mixture of SwiGLU experts); zamba.py Zamba (v1: Mamba-1 mixers
in heads, some layers calling one shared transformer block first); aria.py
Aria's text model (experts stacked transposed beside an ungated shared MLP); gemma4.py also Gemma 4 Unified's
text model (and its multimodal folders'); minimax_m3.py MiniMax-M3's text model (import only); llama_kin.py
InternLM3 and IQuest-Coder (configs of their own that transformers runs as Llama); sarvam.py Sarvam MoE
(GLM-4-MoE's layout rotating whole heads) and Sarvam MLA (DeepSeek-V3's); openai_gpt.py GPT-1 (post-LayerNorm blocks,
learned positions); biogpt.py BioGPT (XGLM's block with learned positions); ctrl.py CTRL (sinusoidal positions as a
learned table, a head bias; import only); minimax.py
MiniMax-Text-01 and MiniMax-M1 (lightning attention beside Mixtral's attention, residuals from the normed inputs);
dots3.py dots.3 Note's text model (DeepSeek-V3.2's blocks with a norm on the latent attention's RoPE key part and
gated heads); mistral_large4.py Mistral Large 4's text model (Mistral 4's blocks without Q-LoRA, NoPE latent layers,
shared latent caches, position-scaled queries and learned RoPE frequencies; import only); hy_v4.py HY-V4 (DeepSeek-V3's
blocks on independent hyper-connections, gated latent heads with sinks, clamped experts; import only); chameleon.py
Chameleon (Llama's block with per-head QK LayerNorms, its image tokens' logits masked; import only); glm5_next.py
GLM-5.3-Next's text model (KDA layers beside NoPE DSA latent layers read dense within the pooled indexer's reach,
Sinkhorn hyper-connections averaged at the head, clamped SwiGLU; import only); zaya.py ZAYA
(compressed convolutional attention, scaled residuals, an MLP router carried from layer to layer).
`family_for(hf_config)` picks the one for an import, `export_family(cfg)` the one a redline model is exported as (or
a UserError naming the redline option no such architecture has).

Weights move as plain {name: tensor} dicts: `TensorSource` reads a source lazily by name (safetensors shards, a
GGUF file already renamed) and remembers what was read, so tensors a family did not use are reported by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from redline.errors import UserError
from redline.model import GPT, ModelConfig


class TensorSource:
    """A name -> tensor reader over some container; `take(name)` marks a tensor used."""

    def __init__(self, names: Iterable[str], read: Callable[[str], torch.Tensor], where: str):
        self.names = set(names)
        self._read = read
        self.where = where
        self.used: set[str] = set()
        self.last: str | None = None  # the name taken last: where a conversion that fails on shapes was reading

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def take(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise UserError(f"{self.where} has no tensor {name}; the file is incomplete or not of the architecture "
                            f"its config names")
        self.used.add(name)
        self.last = name
        return self._read(name)

    def unused(self, ignorable: Callable[[str], bool]) -> list[str]:
        return sorted(n for n in self.names - self.used if not ignorable(n))


@dataclass(frozen=True)
class Family:
    """One Hugging Face model_type: its config and weight translations in both directions."""

    name: str
    """Hugging Face `model_type`, e.g. "llama"."""
    architecture: str
    """The transformers class a folder of this family loads as, e.g. "LlamaForCausalLM"."""
    model_config: Callable[[dict], ModelConfig]
    """HF config.json -> ModelConfig (a UserError for an option redline cannot express)."""
    hf_config: Callable[[ModelConfig], dict]
    """ModelConfig -> HF config.json entries (architecture and dtype are added by the writer)."""
    to_redline: Callable[[TensorSource, ModelConfig], dict]
    """HF-named tensors -> redline's state dict."""
    to_hf: Callable[[Mapping[str, torch.Tensor], ModelConfig], dict]
    """redline's state dict -> HF-named tensors."""
    ignorable: Callable[[str], bool] = lambda name: False
    """Source tensors that carry nothing a model needs (e.g. GPT-2's stored causal-mask buffers)."""
    fold: Callable[[dict, ModelConfig, dict], dict] | None = None
    """(HF config, ModelConfig, redline's state dict) -> the state dict with the config's multipliers that are linear
    maps of weights folded into them (Falcon-H1's µP multipliers), after to_redline; None: none to fold."""
    settle: Callable[[dict, TensorSource], dict] | None = None
    """(HF config, source) -> the config as the weights settle it, before model_config (a multimodal folder's head,
    which transformers leaves untied where it is stored apart from the embedding: multimodal.py); None: as given."""


def interleave_rope_rows(w: torch.Tensor, heads: int, inverse: bool) -> torch.Tensor:
    """q or k rows (heads * D, ...) from redline's RoPE order, each head's (first half, second half) rotary pairs,
    to the interleaved order ((0, 1), (2, 3), ...: GPT-J's, llama.cpp's llama files', ERNIE 4.5's); inverse: back.
    Permuting q and k alike leaves every q·k product as it was, so a model of either order runs in the other."""
    D = w.shape[0] // heads
    if inverse:
        return w.reshape(heads, D // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
    return w.reshape(heads, 2, D // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def pad_rows(t: torch.Tensor, cfg: ModelConfig, head: bool = False) -> torch.Tensor:
    """An embedding or head matrix (vocab, C) padded with zero rows up to cfg.padded_vocab (redline's padded
    vocabulary); head: the head's (head_width, C) up to cfg.padded_head (the same unless model.head_vocab)."""
    rows, vocab = (cfg.padded_head, cfg.head_width) if head else (cfg.padded_vocab, cfg.vocab_size)
    if t.shape[0] < vocab:  # zero rows would stand for tokens the model never had (transformers refuses)
        raise UserError(f"a vocabulary matrix has {t.shape[0]} rows but the config's "
                        f"{'head_vocab' if head and cfg.head_vocab else 'vocab_size'} is {vocab}; the config and "
                        f"the weights disagree")
    if t.shape[0] == rows:
        return t
    if t.shape[0] > rows:
        raise UserError(f"a vocabulary matrix has {t.shape[0]} rows but the config's vocab_size pads to {rows}; "
                        f"the config and the weights disagree")
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


def take_head(src: TensorSource, cfg: ModelConfig) -> dict:
    """{"lm_head.weight": the source's head, padded} for an untied model; {} for a tied one, whose head some files
    store anyway (the embedding again: marked read, so not reported as unused)."""
    if not cfg.tie_embeddings:
        return {"lm_head.weight": pad_rows(src.take("lm_head.weight"), cfg, head=True)}
    if "lm_head.weight" in src:
        src.take("lm_head.weight")
    return {}


def give_head(state: Mapping[str, torch.Tensor], cfg: ModelConfig, name: str = "lm_head.weight") -> dict:
    """The export's take_head: {name: the head without its padding rows} for an untied model, {} for a tied one (its
    head is the embedding)."""
    return {} if cfg.tie_embeddings else {name: state["lm_head.weight"][:cfg.head_width]}


def bias_or_zeros(state: Mapping[str, torch.Tensor], name: str, like: torch.Tensor) -> torch.Tensor:
    """state[name], or zeros of like's rows where the model has no such bias (an architecture that always has one
    computes the same function with zeros)."""
    return state[name] if name in state else like.new_zeros(like.shape[0])


def qkv_apart(state: Mapping[str, torch.Tensor], r: str, cfg: ModelConfig, theirs: str) -> dict:
    """{theirs + q_proj / k_proj / v_proj + .weight / .bias} of block prefix r, from redline's fused qkv or its
    separate q/k/v layers, a bias the model lacks as zeros: for the architectures that keep them apart with biases
    (Phi, OPT; GPT-NeoX stacks them again in its own order)."""
    if cfg.fused_qkv:
        q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        weight = state[f"{r}attn.qkv.weight"]
        weights = dict(zip("qkv", weight.split([q, kv, kv])))
        biases = dict(zip("qkv", bias_or_zeros(state, f"{r}attn.qkv.bias", weight).split([q, kv, kv])))
    else:
        weights = {x: state[f"{r}attn.{x}.weight"] for x in "qkv"}
        biases = {x: bias_or_zeros(state, f"{r}attn.{x}.bias", weights[x]) for x in "qkv"}
    return {f"{theirs}{x}_proj.{kind}": (weights if kind == "weight" else biases)[x]
            for x in "qkv" for kind in ("weight", "bias")}


def give_weights_and_biases(state: Mapping[str, torch.Tensor], names: Mapping[str, str], ours: str,
                            theirs: str) -> dict:
    """The export's take_weights_and_biases: {theirs + their name.weight / .bias: the model's}, a bias the model
    lacks as zeros."""
    out = {}
    for mine, other in names.items():
        weight = state[f"{ours}{mine}.weight"]
        out[f"{theirs}{other}.weight"] = weight
        out[f"{theirs}{other}.bias"] = bias_or_zeros(state, f"{ours}{mine}.bias", weight)
    return out


def take_weights_and_biases(src: TensorSource, names: Mapping[str, str], ours: str, theirs: str) -> dict:
    """{ours + name.weight / .bias: src's theirs + their name.weight / .bias} for each (name, their name) of `names`:
    a block's Linear and LayerNorm layers that move unchanged."""
    return {f"{ours}{mine}.{kind}": src.take(f"{theirs}{other}.{kind}")
            for mine, other in names.items() for kind in ("weight", "bias")}


def raise_first(problems: list[tuple[bool, str]]) -> None:
    """A UserError with the message of the first (bad, message) pair whose bad is true (an export's checks)."""
    for bad, message in problems:
        if bad:
            raise UserError(message)


def multi_head_problems(cfg: ModelConfig, when: str, arch: str) -> list[tuple[bool, str]]:
    """What GPT-2 and GPT-NeoX (their attention alike) do not have, for raise_first: `when` names the redline options
    that chose the architecture `arch`."""
    return [
        (cfg.kv_heads != cfg.n_head, f"model.n_kv_head with {when}: {arch} is multi-head (no GQA)"),
        (cfg.sliding_window > 0, f"model.sliding_window with {when}: {arch} attends to the whole context"),
        (cfg.head_dim * cfg.n_head != cfg.n_embd, f"model.head_size with {when}: {arch}'s heads are n_embd / n_head "
                                                  f"wide"),
        (cfg.has_qkv_bias != cfg.bias, f"model.qkv_bias apart from model.bias: {arch} has biases on every layer"),
    ]


def plain_block_problems(cfg: ModelConfig, when: str, arch: str) -> list[tuple[bool, str]]:
    """What the classic LayerNorm + GELU architectures (GPT-BigCode, GPT-Neo, GPT-J, CodeGen) have none of, for
    raise_first: `when` names the redline options that chose the architecture `arch`."""
    named = [(name, getattr(cfg, name)) for name in (
        "norm_unit_offset", "embed_norm", "embed_scale", "embed_multiplier", "residual_multiplier", "logit_divisor",
        "logit_softcap", "attn_softcap", "attn_sinks", "qk_norm", "value_embeddings", "moe_experts", "conv_layers",
        "delta_layers", "nope_interval", "rope_layer_theta", "rope_local_theta")]
    return [(bool(value), f"model.{name} with {when}: {arch} has no such option") for name, value in named] + [
        (cfg.norm_position != "pre", f"model.norm_position={cfg.norm_position} with {when}: {arch}'s norms are "
                                     f"pre-norms"),
        (cfg.norm != "layernorm", f"model.norm={cfg.norm} with {when}: {arch} uses LayerNorm"),
        (not cfg.norm_affine, f"model.norm_affine=false with {when}: {arch}'s LayerNorms have weights"),
        (cfg.mlp != "gelu", f"model.mlp={cfg.mlp} with {when}: {arch}'s MLP is GELU"),
        (cfg.attn_gate != "none", f"model.attn_gate={cfg.attn_gate} with {when}: {arch} has no gate on its heads"),
        (cfg.head_dim * cfg.n_head != cfg.n_embd, f"model.head_size with {when}: {arch}'s heads are n_embd / n_head "
                                                  f"wide"),
    ]


def check_state(state: Mapping[str, torch.Tensor], cfg: ModelConfig, source: str) -> None:
    """Every tensor redline's model has, with its shape: a UserError naming the first missing or mismatched one."""
    with torch.device("meta"):
        expected = GPT(cfg).state_dict()
    if cfg.tie_embeddings:
        expected.pop("lm_head.weight", None)
    missing = [k for k in expected if k not in state]
    if missing:
        raise UserError(f"{source}: no tensor for {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; "
                        f"the weights do not match the config")
    for name, t in expected.items():
        if tuple(state[name].shape) != tuple(t.shape):
            raise UserError(f"{source}: tensor for {name} has shape {tuple(state[name].shape)}, the config gives "
                            f"{tuple(t.shape)}; the weights do not match the config")
    extra = [k for k in state if k not in expected]
    if extra:
        raise UserError(f"{source}: tensors {', '.join(extra[:3])} have no place in the model")


def _families() -> dict[str, Family]:
    from redline.interop import (bloom, cohere, deepseek, dots1, ernie, exaone, exaone4, falcon, falcon_h1, gemma,
                                 gemma2, gemma3, gemma3n, gemma4, glm, gpt2, gpt_bigcode, gpt_neo, gpt_neox, gpt_oss,
                                 gptj,
                                 granite, hunyuan, jamba, lara_mini, lfm2, llama, llama4, mamba, moe, mpt, nanochat,
                                 nemotron_h,
                                 olmo2, olmo_hybrid, opt, phi, phi3, qwen3_5, qwen3_next, stablelm, starcoder2,
                                 zamba2)
    from redline.interop import apertus, axk2, deepseek_kin, longcat_flash, mimo, minicpm3, multimodal, persimmon, xglm
    from redline.interop import bitnet, diffllama, doge, recurrent_gemma
    from redline.interop import dbrx, minimax_m2, phimoe
    from redline.interop import afmoe, kolibri1, laguna, windowed_moe
    from redline.interop import qwen4_exp
    from redline.interop import bailing_hybrid, jetmoe, kimi_linear, zamba
    from redline.interop import aria, dots3, minimax_m3
    from redline.interop import biogpt, chameleon, ctrl, llama_kin, openai_gpt, sarvam
    from redline.interop import hy_v4, minimax
    from redline.interop import dory
    from redline.interop import modernbert_decoder, paligemma
    from redline.interop import rwkv, xlstm
    from redline.interop import deepseek_v4
    from redline.interop import glm5_next
    from redline.interop import step3p5
    from redline.interop import zaya

    return {f.name: f for f in (*llama.FAMILIES, *moe.FAMILIES, *deepseek.FAMILIES, olmo2.FAMILY, olmo2.OLMO3_FAMILY,
                                exaone4.FAMILY, exaone4.MOE_FAMILY,
                                gemma3.FAMILY, gpt2.FAMILY, gpt_neox.FAMILY, phi.FAMILY, phi3.FAMILY, stablelm.FAMILY,
                                opt.FAMILY, ernie.FAMILY, granite.FAMILY, granite.HYBRID_FAMILY, granite.MOE_FAMILY,
                                granite.SHARED_FAMILY, granite.BAMBA_FAMILY, gemma.FAMILY, gemma2.FAMILY,
                                hunyuan.FAMILY, starcoder2.FAMILY, lfm2.FAMILY, lfm2.MOE_FAMILY, *cohere.FAMILIES,
                                nanochat.FAMILY, olmo2.OLMO_FAMILY,
                                llama.MINISTRAL3_FAMILY, gemma2.VAULT_FAMILY, gpt_oss.FAMILY, granite.SWA_FAMILY,
                                granite.MOE_SWA_FAMILY, lfm2.LFM3_FAMILY, exaone.FAMILY, llama.ARCEE_FAMILY,
                                ernie.HELIUM_FAMILY,
                                llama.SEED_OSS_FAMILY, qwen3_5.TEXT_FAMILY, qwen3_5.FAMILY,
                                qwen3_5.MOE_TEXT_FAMILY, qwen3_5.MOE_FAMILY, qwen3_next.FAMILY,
                                llama.NEMOTRON_FAMILY, olmo_hybrid.FAMILY, falcon_h1.FAMILY, nemotron_h.FAMILY,
                                nemotron_h.MAMBA2_FAMILY, mamba.FAMILY, mamba.FALCON_FAMILY, gpt_bigcode.FAMILY,
                                gpt_neo.FAMILY, gptj.FAMILY, gptj.CODEGEN_FAMILY, bloom.FAMILY, mpt.FAMILY,
                                falcon.FAMILY, jamba.FAMILY, glm.GLM_FAMILY, glm.GLM4_FAMILY, glm.GLM4_MOE_FAMILY,
                                gemma4.FAMILY, gemma4.MULTIMODAL_FAMILY, gemma4.UNIFIED_TEXT_FAMILY,
                                gemma4.UNIFIED_FAMILY, gemma3n.FAMILY,
                                gemma3n.MULTIMODAL_FAMILY,
                                apertus.FAMILY, apertus.TEXT_1P5_FAMILY, ernie.MOE_FAMILY, hunyuan.MOE_FAMILY,
                                llama.MINISTRAL_FAMILY,
                                cohere.MOE_FAMILY, cohere.COMPASS_FAMILY, llama4.TEXT_FAMILY, llama4.FAMILY,
                                dots1.FAMILY, deepseek.LITE_FAMILY, minicpm3.FAMILY, *multimodal.families(),
                                deepseek_kin.YOUTU_FAMILY, deepseek_kin.MISTRAL4_FAMILY,
                                *deepseek_kin.DSA_FAMILIES, deepseek_kin.AXK1_FAMILY, axk2.FAMILY, longcat_flash.FAMILY,
                                mimo.FAMILY,
                                llama.CWM_FAMILY, glm.SOLAR_OPEN_FAMILY, dots1.HY_V3_FAMILY, llama.JAIS2_FAMILY,
                                granite.HYPERCLOVAX_FAMILY, persimmon.FAMILY, xglm.FAMILY, lara_mini.FAMILY,
                                zamba2.FAMILY, bitnet.FAMILY, diffllama.FAMILY, recurrent_gemma.FAMILY, doge.FAMILY,
                                minimax_m2.FAMILY, phimoe.FAMILY, dbrx.FAMILY,
                                afmoe.FAMILY, windowed_moe.MELLUM_FAMILY, windowed_moe.FLINT_FAMILY, kolibri1.FAMILY,
                                laguna.FAMILY, qwen4_exp.TEXT_FAMILY, qwen4_exp.FAMILY, jetmoe.FAMILY, zamba.FAMILY,
                                kimi_linear.FAMILY, bailing_hybrid.FAMILY, paligemma.FAMILY,
                                modernbert_decoder.FAMILY,
                                aria.FAMILY, minimax_m3.FAMILY,
                                *llama_kin.FAMILIES, sarvam.MOE_FAMILY, sarvam.MLA_FAMILY, openai_gpt.FAMILY,
                                biogpt.FAMILY, ctrl.FAMILY, minimax.FAMILY, dots3.FAMILY, hy_v4.FAMILY,
                                dory.FAMILY, rwkv.FAMILY, xlstm.FAMILY, deepseek_v4.FAMILY,
                                chameleon.FAMILY, glm5_next.FAMILY, step3p5.TEXT_FAMILY, zaya.FAMILY)}


def supported_names() -> list[str]:
    return sorted(_families())


# architectures transformers has that redline cannot express, by model_type: why (their import is refused by name)
NOT_READ = {
    "gemma4_assistant": "Gemma 4's assistant is a multi-token-prediction drafter: it runs on the main model's "
                        "hidden states and its last layers' keys and values (no input ids of its own), not on tokens "
                        "alone; redline reads the main model (gemma4, gemma4_text)",
    "gemma4_unified_assistant": "Gemma 4 Unified's assistant is a multi-token-prediction drafter: it runs on the main "
                                "model's hidden states and its last layers' keys and values, not on tokens alone",
    "gpt_neox_japanese": "GPT-NeoX-Japanese's tokenizer (GPTNeoXJapaneseTokenizer: vocab.txt and emoji.json, each "
                         "step taking the lowest-id vocabulary match among the next few characters, with its own "
                         "symbol classes and byte fallback; transformers has no tokenizer.json form of it) is none the "
                         "tokenizers library reads, so redline could not encode a prompt for it",
    "inkling_text": "Inkling's blocks pass their attention's and their MLP's outputs through short causal "
                    "convolutions (attn_sconv, mlp_sconv) before the residual adds, which redline's blocks have not "
                    "(its attention's relative-position bias and key and value convolutions and its shared-expert "
                    "router are model.rel_bias_dim, kv_conv and moe_sink_experts)",
    "inkling_mm_model": "the text model of an Inkling folder is inkling_text, whose blocks' short convolutions of "
                        "the attention's and the MLP's outputs (attn_sconv, mlp_sconv) redline cannot express (its "
                        "relative-position bias and key and value convolutions it can)",
    "inkling2_text": "Inkling 2's attention has no RoPE: its scores take a relative-position bias mixed per token from "
                     "learned distance profiles, its q and k are L2-clipped and its keys and values pass dynamic "
                     "short convolutions, and its layers read attention residuals over earlier blocks' outputs "
                     "(Inkling2BlockAttentionResidual); redline's blocks have none of these",
    "inkling2": "the text model of an Inkling 2 folder is inkling2_text, whose relative-position bias, L2-clipped "
                "q and k, dynamic short convolutions and block attention residuals redline cannot express",
    "inkling2_loop_text": "Inkling 2 Loop is Inkling 2 (a relative-position bias mixed per token, L2-clipped q and k, "
                          "dynamic short convolutions, block attention residuals) whose middle layers run "
                          "loop_num_passes times, each pass gated against the previous one's messages; redline "
                          "has none of these layers and runs each layer once",
    "inkling2_loop": "the text model of an Inkling 2 Loop folder is inkling2_loop_text, which redline cannot express: "
                     "Inkling 2's layers (relative-position bias, short convolutions, block attention residuals) "
                     "with its middle layers looped loop_num_passes times",
    # multimodal folders whose text model redline cannot express (multimodal.py reads the others)
    "unlimited_ocr_text": "transformers has no causal LM of Unlimited-OCR's text model alone: redline reads it from "
                          "an unlimited_ocr folder (reference sliding windows, model.reference_window)",
    "idefics": "Idefics interleaves gated cross-attention blocks (every cross_layer_interval layers) whose MLP, "
               "scaled by tanh(alpha_dense), runs on text tokens too, and its forward needs image states; redline's "
               "blocks have no cross-attention block",
    "muse_glimmer": "Muse Glimmer's text model (muse_glimmer_text) is no family redline reads: a sigmoid gate on "
                    "the attention output, q scaled by qk_scale_factor after a weightless QK-norm, sublayer "
                    "outputs normalized at post_norm_eps, a RoPE base per layer (layer_rope_theta, 0 for none) and "
                    "the logits times output_multiplier before their softcap",
    "muse_spark": "Muse Spark's text model (muse_spark_text) is no family redline reads: Muse Glimmer's layers "
                  "(a gated attention output, q scaled after a weightless QK-norm, per-layer RoPE bases, a logit "
                  "multiplier) with experts behind residual gates (residual_gate_temperature)",
}


def family_for(hf_config: dict, source: str) -> Family:
    """The family of a Hugging Face config.json (its model_type)."""
    model_type = hf_config.get("model_type")
    from redline.interop.deepseek_kin import REFUSED

    refused = {**NOT_READ, **REFUSED}  # architectures redline knows and cannot express: why, in one line
    if model_type in refused:
        raise UserError(f"{source}: model_type {model_type!r} is not supported: {refused[model_type]}")
    families = _families()
    if model_type not in families:
        arch = ", ".join(hf_config.get("architectures") or []) or "no architectures field"
        raise UserError(f"{source}: model_type {model_type!r} ({arch}) is not supported; redline imports "
                        f"{', '.join(supported_names())}")
    return families[model_type]


def classic_export_name(cfg: ModelConfig) -> str | None:
    """The classic architecture a model exports as, checked (a UserError naming what it lacks), or None: GPT-J for
    one LayerNorm for parallel sublayers with RoPE, a GELU MLP and biases on the Linear layers but not on q/k/v
    (CodeGen's models among them); GPT-Neo for learned positions with windowed layers, or unscaled multi-head scores
    without q/k/v biases; GPTBigCode for learned positions with multi-query attention or unscaled scores. Their
    options are the architecture's own: no other that redline exports to has them together."""
    if cfg.attn_sinks or cfg.moe_experts or cfg.conv_layers:  # the architectures that have these decide
        return None
    from redline.interop import gpt_neo, gptj

    if gptj.wants_gptj(cfg):
        gptj.check_exportable(cfg)
        return "gptj"
    if gpt_neo.wants_gpt_neo(cfg):
        gpt_neo.check_exportable(cfg)
        return "gpt_neo"
    if cfg.pos_emb == "learned" and cfg.mlp == "gelu" and (cfg.kv_heads != cfg.n_head or cfg.attn_scale == 1.0):
        from redline.interop import gpt_bigcode

        gpt_bigcode.check_exportable(cfg)
        return "gpt_bigcode"
    return None


def export_family(cfg: ModelConfig) -> Family:
    """The architecture a redline model exports as: BLOOM with ALiBi positions and a LayerNorm on its embeddings,
    MPT with ALiBi and no such norm (each refusing, by name, any other option of the model); GPT-2 with learned
    positions (OPT with them and ReLU, GPT-Neo with them, a GELU MLP and windowed layers or unscaled scores,
    GPTBigCode with one KV head or biased q/k/v and unscaled scores), GPT-J with one LayerNorm for parallel
    sublayers, RoPE, GELU and no q/k/v biases, OLMo 2 with
    norms on the sublayers' outputs (EXAONE 4.0 with them and QK-norm per head), Gemma 3 with norms on their inputs and
    outputs (Gemma 2 without QK-norm), Gemma with its norms and embedding scale on pre-norm blocks (VaultGemma with
    Gemma 2's window, score scale or caps besides), PhiMoE with SparseMixer routing, DBRX with clamped q/k/v or
    softmax-routed experts in LayerNorm blocks, MiniMax-M2 with sigmoid-scored experts and QK-norm over whole
    projections, GLM-4-MoE with sigmoid-scored experts and partial RoPE (the one export of grouped routing), GLM-4 with plain RMSNorms on the sublayers' inputs and outputs and partial RoPE, GLM
    with Llama's block, partial RoPE and q/k/v biases, Phi-3 with LongRoPE or Llama's block with partial RoPE, StableLM
    with RoPE, LayerNorm and SwiGLU, Phi with one norm for parallel sublayers, Falcon with two LayerNorms for parallel
    sublayers, GQA or multi-query attention and GELU, StarCoder2 with RoPE, LayerNorm and
    GQA or a window, GPT-NeoX with RoPE and LayerNorm, partial RoPE,
    parallel sublayers or exact GELU, SmolLM3 with layers without RoPE, Granite with its embedding, residual, score and
    logit scalars (Granite 4.0 where it has no positions), Qwen3 with QK-norm, Mistral with a sliding window, Qwen2 with
    biases on q/k/v alone, Hunyuan with QK-norm after RoPE, Cohere (Cohere2 with its window) with parallel sublayers
    under one norm and SwiGLU (Cohere Compass with a RoPE base per layer type),
    Ministral with windowed and full layers in Mistral's block, Apertus with the xIELU MLP,
    BitNet with sub-norms, ternary projections (model.bitlinear) or a gated ReLU² MLP, DiffLlama with differential
    attention, RecurrentGemma with Griffin's RG-LRU layers, RWKV with RWKV-4's time and channel mixing (or norms
    whose epsilon grows every few blocks, model.rescale_every), xLSTM with mLSTM layers, Doge with key biases and
    residual scales, MiniMax with lightning attention or residuals from the normed inputs (model.normed_residual),
    Kimi Linear with Kimi Delta Attention through low-rank gates (model.delta_gate_rank), Ling 3 (Bailing hybrid) with
    KDA's bounded decay or full-rank gates, or latent attention with its heads gated,
    Llama otherwise; a mixture of experts as Mixtral, Qwen2-MoE,
    Qwen3-MoE, OLMoE, FlexOlmo or GraniteMoE (moe.export_name), Kolibri-1 with a routing bias on the logits, Laguna with softplus
    head gates or the windowed layers' own partial RoPE, AFMoE with sigmoid scores under element-wise attention
    gates or sandwich norms, Flint with sigmoid scores and attention sinks, Mellum with softmax scores, QK-norm and
    windowed or dense layers, Solar Open with sigmoid scores and an ungated shared
    expert on every layer of Llama's attention (no QK-norm, whole heads), dots.llm1 with sigmoid scores
    (DeepSeek-V3's routing: a bias, groups, a scale, an ungated shared expert), or GPT-OSS with attention sinks, expert biases or clamped
    SwiGLU experts, as ERNIE 4.5 MoE with softmax scores and a bias that chooses (on every N-th layer too), as Hunyuan
    MoE with QK-norm after RoPE, as Cohere2 MoE in a parallel block under one norm; one with Mamba-1 layers (model.delta_rule=mamba1) as Mamba, or as Falcon-Mamba with its B, C and
    dt norms (model.delta_bcdt_norm_eps), every layer a Mamba-1 mixer alone, and as Jamba where some layer has
    attention or an MLP, the norms have weights (model.delta_bcdt_norm_weight) or there are experts (on the layers
    model.moe_layers names, which no other architecture takes but Llama 4); one with chunked attention, the layers
    without RoPE's query temperature, weightless QK-norm after RoPE or input-weighted experts as Llama 4's text
    model; one with Mamba-2 beside attention in
    its layers (model.delta_parallel) as Falcon-H1; one of
    blocks of one sublayer (model.mlp_free_layers, mixer_free_layers) as Mamba2 where every layer is a Mamba-2 mixer
    alone, as Nemotron-H otherwise (its E layers: experts, ungated or grouped, on MLP-only layers; a UserError where
    a layer has both sublayers); one with Mamba-2 layers as Granite 4.0 (as Bamba with RoPE on part of each head); one
    with gated delta nets beside output-norm blocks as OLMo Hybrid; one with gated delta nets beside attention without
    an output gate as Lara Mini; one with blocks that several layers share (model.shared_attn_layers) as Zamba2 (as
    Zamba where its mixers are Mamba-1's); one with hyper-connected streams (model.hc_streams) or a QSA indexer as
    Qwen4-Exp; one with routed attention heads as JetMoE; one with gated delta nets or element-wise attention gates
    as Qwen3.5 (Qwen3.5-MoE with experts on every layer, Qwen3-Next with dense first layers or top-k weights not
    rescaled); one with LayerNorms by 1 + weight as Nemotron; one with Gemma 4's options (model.v_norm,
    layer_scalars, per_layer_embd, kv_shared_layers, the full layers' global_head_size, global_kv_head and
    global_values_from_keys) as Gemma 4's text model, unless it has Gemma 3n's (altup_streams, laurel_rank,
    mlp_sparsity): then as Gemma 3n's; plain RMSNorms on the sublayers' inputs and outputs rotating whole heads as
    HyperCLOVA X; a dense model with
    attention sinks as Granite SWA; Llama's block with a ReLU² MLP as Arcee (as Jais 2 with LayerNorm); one
    with a gate on its heads, proportional RoPE, or short convolutions with output norms or windowed layers as LFM3;
    one with short-convolution layers as LFM2; one with norms without weights as OLMo (LayerNorm) or nanochat
    (RMSNorm, one on its embeddings); one with a LayerNorm QK-norm, or partial RoPE with LayerNorm and ReLU², as
    Persimmon; one with routed attention heads (model.attn_gate=routed) as JetMoE; one with post-norm blocks as GPT-1;
    learned positions beside scaled embeddings as BioGPT; GLM-4-MoE's experts on whole heads with q/k/v biases beside
    QK-norm, or dense layers without QK-norm, as Sarvam MoE; one with gated norms or the latent query gate as A.X-K2;
    one with the shortcut MoE as LongCat-Flash (identity experts without it refused); one with nGPT layers or a looped
    section as Dory; one with a prediction head or a norm-free first layer (model.head_transform, first_norm_free) as
    ModernBERT-Decoder; a prefix-LM (model.prefix_lm, PaliGemma's), a reference window (model.reference_window,
    Unlimited-OCR's) and Inkling's layers (model.rel_bias_dim, kv_conv, moe_sink_experts) refused. A UserError names
    the redline option that no such architecture has."""
    families = _families()
    from redline.interop import mistral_large4

    # GLM-5.3-Next's averaged streams (glm5_next.py), first: it has Mistral Large 4's NoPE latent layers too
    if cfg.mhc_head_mean:
        raise UserError("model.mhc_head_mean (GLM-5.3-Next's hyper-connection streams averaged at the head): GLM-5.3-"
                        "Next is import only, redline keeping no DSA indexer and transformers having no text-only "
                        "GLM-5.3-Next model, and no other architecture has it (HF, GGUF or PEFT adapters alike)")
    if mistral_large4.wants_mistral_large4(cfg):  # first: no architecture redline exports to has these options
        raise UserError("model.q_position_scale, kv_source_layers, rope_pair_log_scales and latent layers without "
                        "RoPE are Mistral Large 4's, which redline imports alone: transformers has no text-only "
                        "Mistral Large 4 model to load")
    if cfg.kv_lora_rank and (cfg.attn_gate == "element" or cfg.attn_sinks):  # first, as Mistral Large 4's
        raise UserError("model.attn_gate=element and attn_sinks on latent attention are HY-V4's, which redline "
                        "imports alone: no architecture redline exports to gates a latent head's values or has its "
                        "sinks")
    inkling = [name for name in ("rel_bias_dim", "kv_conv", "moe_sink_experts") if getattr(cfg, name)]
    if inkling:  # Inkling's layers, whose family redline does not read yet (NOT_READ: inkling_text)
        raise UserError(f"model.{inkling[0]}: Inkling's (its relative-position bias, key and value convolutions and "
                        f"shared-expert sinks), which no architecture redline exports to has; run the model with "
                        f"redline generate, chat or serve instead")
    if cfg.window_n_head or cfg.swiglu_act_limits or cfg.moe_swiglu_act_limits:  # Step 3.5's alone
        raise UserError("model.window_n_head, swiglu_act_limits and moe_swiglu_act_limits are Step 3.5's, which "
                        "redline imports alone: transformers has no text-only Step model to load "
                        "(Step3p7ForConditionalGeneration needs its vision tower's weights), and redline has no GGUF "
                        "writer for llama.cpp's step35")
    if cfg.prefix_lm:  # PaliGemma's alone, whose folder needs a vision tower redline does not hold
        raise UserError("model.prefix_lm: no architecture redline exports to attends a prompt both ways (PaliGemma's "
                        "folder needs its vision tower); run the model with redline generate, chat or serve instead")
    if cfg.reference_window:  # Unlimited-OCR's alone, whose folder needs a vision tower redline does not hold
        raise UserError("model.reference_window: no architecture redline exports to keeps the prompt visible beside "
                        "a sliding window (Unlimited-OCR's folder needs its vision tower); run the model with redline "
                        "generate, chat or serve instead")
    if cfg.ngpt or cfg.loop_section:  # nGPT's layers and looped sections: Dory's alone
        from redline.interop import dory

        dory.check_exportable(cfg)
        return families["dory"]
    if cfg.head_transform or cfg.first_norm_free:  # ModernBERT-Decoder's alone
        from redline.interop import modernbert_decoder

        modernbert_decoder.check_exportable(cfg)
        return families["modernbert-decoder"]
    if cfg.shared_attn_layers:  # blocks whose weights several layers share: Zamba's (Mamba-1) and Zamba2's alone
        from redline.interop import zamba, zamba2

        if zamba.wants_zamba(cfg):
            zamba.check_exportable(cfg)
            return families["zamba"]

        zamba2.check_exportable(cfg)
        return families["zamba2"]
    from redline.interop import deepseek_v4, zaya

    if cfg.cca_kernels or cfg.residual_affine or cfg.moe_router_hidden:  # ZAYA's layers: ZAYA's alone
        zaya.check_exportable(cfg)
        return families["zaya"]
    if deepseek_v4.wants_deepseek_v4(cfg):  # mHC, its attention, hash routing, its clamp or scores: DeepSeek-V4's
        deepseek_v4.check_exportable(cfg)
        return families["deepseek_v4"]
    if cfg.head_vocab:  # a head narrower than the embedding: Apertus 1.5's alone (its output_vocab_size)
        from redline.interop import apertus

        if cfg.mlp != "xielu":
            raise UserError(f"model.head_vocab={cfg.head_vocab}: of the architectures redline exports to, Apertus "
                            f"1.5 alone has a head narrower than its embedding, and it has the xIELU MLP "
                            f"(model.mlp=xielu)")
        apertus.check_exportable(cfg)
        return families["apertus1p5_text"]
    from redline.interop import qwen4_exp

    if qwen4_exp.wants_qwen4_exp(cfg):  # hyper-connections and the QSA indexer: Qwen4-Exp's alone
        qwen4_exp.check_exportable(cfg)
        return families["qwen4_exp_text"]
    if cfg.attn_gate == "routed":  # routed attention heads: JetMoE's alone
        from redline.interop import jetmoe

        jetmoe.check_exportable(cfg)
        return families["jetmoe"]
    if cfg.moe_out_bias:  # checked here: no other exporter knows the field (jetmoe.py took routed heads above)
        raise UserError("model.moe_out_bias: of the architectures redline exports to, JetMoE alone has a bias on its "
                        "experts' sum, and it routes its attention heads (model.attn_gate=routed)")
    from redline.interop import axk2

    if axk2.wants_axk2(cfg):  # gated norms, the latent query gate: A.X-K2's alone
        axk2.check_exportable(cfg)
        return families["axk2"]
    if cfg.moe_shortcut or cfg.moe_identity_experts:  # LongCat-Flash's alone
        from redline.interop import longcat_flash

        longcat_flash.check_exportable(cfg)
        return families["longcat_flash"]
    native = [name for name in ("value_embed_layers", "smear_gate", "layer_lambdas", "backout") if getattr(cfg, name)]
    if native:  # a native nanochat checkpoint's (redline/interop/nanochat_checkpoint.py)
        raise UserError(f"model.{native[0]}: transformers' NanoChat (and every other architecture redline exports "
                        f"to) has no value-embedding gates, smear, per-layer scalars or backout; run the model with "
                        f"redline generate, chat or serve instead")
    from redline.interop import bitnet

    if bitnet.wants_bitnet(cfg):  # sub-norms, ternary projections, the gated ReLU² MLP: BitNet's alone
        bitnet.check_exportable(cfg)
        return families["bitnet"]
    from redline.interop import rwkv

    if rwkv.wants_rwkv(cfg):  # RWKV-4's time and channel mixing: RWKV's alone
        rwkv.check_exportable(cfg)
        return families["rwkv"]
    from redline.interop import xlstm

    if xlstm.wants_xlstm(cfg):  # mLSTM layers: xLSTM's alone
        xlstm.check_exportable(cfg)
        return families["xlstm"]
    from redline.interop import recurrent_gemma

    if recurrent_gemma.wants_recurrent_gemma(cfg):  # Griffin's RG-LRU layers: RecurrentGemma's alone
        recurrent_gemma.check_exportable(cfg)
        return families["recurrent_gemma"]
    from redline.interop import doge

    if doge.wants_doge(cfg):  # key biases from the values and residual scales: Doge's alone
        doge.check_exportable(cfg)
        return families["doge"]
    from redline.interop import minimax

    if minimax.wants_minimax(cfg):  # lightning attention and residuals from the normed inputs: MiniMax's alone
        minimax.check_exportable(cfg)
        return families["minimax"]
    from redline.interop import bailing_hybrid, dots3, kimi_linear

    if dots3.wants_dots3(cfg):  # first: a norm on latent attention's RoPE key part is dots.3 Note's alone
        dots3.check_exportable(cfg)
        return families["dots3_note_text"]
    if bailing_hybrid.wants_bailing_hybrid(cfg):  # bounded or full-rank KDA gates, gated latent heads: Ling 3's
        bailing_hybrid.check_exportable(cfg)
        return families["bailing_hybrid"]
    if kimi_linear.wants_kimi_linear(cfg):  # Kimi Delta Attention (decays per key channel): Kimi Linear's alone
        kimi_linear.check_exportable(cfg)
        return families["kimi_linear"]
    if cfg.diff_attention:  # differential attention: DiffLlama's alone
        from redline.interop import diffllama

        diffllama.check_exportable(cfg)
        return families["diffllama"]
    if cfg.attn_sinks_windowed:  # sinks on the windowed layers alone: MiMo-V2-Flash's (mimo.py)
        from redline.interop import mimo

        mimo.check_exportable(cfg)
        return families["mimo_v2_flash"]
    if cfg.moe_post_norm and not cfg.kv_lora_rank:  # checked here: no other exporter knows the field
        raise UserError("model.moe_post_norm: of the architectures redline exports to, A.X-K1 alone norms a "
                        "mixture's output, and it has latent attention (model.kv_lora_rank)")
    from redline.interop import ernie, lfm2, persimmon, qwen3_5

    if persimmon.wants_persimmon(cfg):  # first: a LayerNorm QK-norm would lose its bias in any other architecture
        persimmon.check_exportable(cfg)
        return families["persimmon"]
    from redline.interop import glm, llama4

    from redline.interop import kolibri1, laguna

    # first: a routing bias on the logits is Kolibri-1's alone (every other export would choose by the scores), a
    # softplus head gate or the windowed layers' own partial RoPE Laguna's (every other would gate by a sigmoid or
    # rotate one width)
    if kolibri1.wants_kolibri1(cfg):
        kolibri1.check_exportable(cfg)
        return families["kolibri1"]
    if laguna.wants_laguna(cfg):
        laguna.check_exportable(cfg)
        return families["laguna"]
    # first: chunked attention, the NoPE layers' temperature, input-weighted experts are Llama 4's alone
    if llama4.wants_llama4(cfg):
        llama4.check_exportable(cfg)
        return families["llama4_text"]
    from redline.interop import minicpm3

    if minicpm3.wants_minicpm3(cfg):  # latent attention with µP scalars or LongRoPE: MiniCPM3's alone
        return families["minicpm3"]
    if cfg.kv_lora_rank:  # latent attention: DeepSeek's alone (V3 with sigmoid scores or dense, V2 with softmax)
        from redline.interop import deepseek

        return families[deepseek.export_name(cfg)]
    from redline.interop import dbrx, minimax_m2, phimoe

    if phimoe.wants_phimoe(cfg):  # SparseMixer routing: PhiMoE's alone
        phimoe.check_exportable(cfg)
        return families["phimoe"]
    if dbrx.wants_dbrx(cfg):  # clamped q/k/v, or softmax-routed experts with LayerNorm: DBRX's alone
        dbrx.check_exportable(cfg)
        return families["dbrx"]
    if minimax_m2.wants_minimax_m2(cfg):  # sigmoid-scored experts with QK-norm over whole projections: MiniMax-M2's
        minimax_m2.check_exportable(cfg)
        return families["minimax_m2"]
    from redline.interop import afmoe

    if afmoe.wants_afmoe(cfg):  # sigmoid-scored experts under element-wise gates or sandwich norms: AFMoE's alone
        afmoe.check_exportable(cfg)
        return families["afmoe"]
    from redline.interop import windowed_moe

    if windowed_moe.wants_flint(cfg):  # sigmoid-scored experts with attention sinks: Flint's alone
        windowed_moe.check_flint_exportable(cfg)
        return families["flint"]
    if glm.wants_glm4_moe(cfg):  # sigmoid-scored experts beside attention with partial RoPE: GLM-4-MoE's alone
        glm.check_glm4_moe_exportable(cfg)
        return families["glm4_moe"]
    # blocks of one sublayer without Mamba-1 layers: Nemotron-H's (whose E layers choose within groups, with ungated
    # experts, on the layers model.moe_layers names) or Mamba2's, checked by nemotron_h.export_name
    one_sublayer = bool(cfg.mlp_free_layers or cfg.mixer_free_layers) and not (
        cfg.delta_layers and cfg.delta_rule == "mamba1")
    from redline.interop import dots1, exaone4

    if exaone4.wants_exaone_moe(cfg):  # those experts with EXAONE 4.0's NoPE full layers among windowed ones
        exaone4.check_moe_exportable(cfg)
        return families["exaone_moe"]
    if glm.wants_solar_open(cfg):  # sigmoid-scored experts on every layer, whole heads, no QK-norm: Solar Open's
        glm.check_solar_open_exportable(cfg)
        return families["solar_open"]
    from redline.interop import sarvam

    if sarvam.wants_sarvam_moe(cfg):  # whole heads with q/k/v biases and QK-norm, or dense layers without it
        sarvam.check_moe_exportable(cfg)
        return families["sarvam_moe"]
    if dots1.wants_dots1(cfg):  # sigmoid-scored experts beside attention: dots.llm1's (DeepSeek-V3's routing)
        dots1.check_exportable(cfg)
        return families["dots1"]
    if cfg.moe_groups > 1 and not one_sublayer:
        raise UserError(f"model.moe_groups={cfg.moe_groups}: of the architectures redline exports to, only "
                        f"DeepSeek-V3 (latent attention, model.kv_lora_rank), GLM-4-MoE (RoPE on part of each head: "
                        f"rope_dims), dots.llm1 (whole heads, per-head QK-norm) and Nemotron-H (blocks of one "
                        f"sublayer: model.mixer_free_layers) choose experts within groups, all by sigmoid scores "
                        f"(model.moe_gating=sigmoid); set model.moe_groups=1")
    if cfg.moe_norm_min and not ernie.wants_ernie_moe(cfg):
        raise UserError(f"model.moe_norm_min={cfg.moe_norm_min}: of the architectures redline exports to, only ERNIE 4.5 "
                        f"MoE floors the sum of the chosen softmax scores, and it chooses with an expert bias "
                        f"(model.moe_expert_bias); set model.moe_norm_min=0")
    if cfg.moe_experts and not cfg.gated_mlp and not one_sublayer:
        raise UserError(f"model.mlp={cfg.mlp} with model.moe_experts: the mixtures redline exports to have gated "
                        f"experts (model.mlp=swiglu, swiglu_clamped or geglu), but for Nemotron-H's ReLU² experts on "
                        f"blocks of one sublayer (model.mixer_free_layers)")

    from redline.interop import gemma3n, gemma4

    if gemma3n.wants_gemma3n(cfg):  # AltUp streams, LAuReL, activation sparsity: Gemma 3n's alone
        gemma3n.check_exportable(cfg)
        return families["gemma3n_text"]
    if gemma4.wants_gemma4(cfg):  # values normed, layer scalars, per-layer inputs, shared KV, full layers' geometry
        gemma4.check_exportable(cfg)
        return families["gemma4_text"]
    if cfg.mlp == "xielu":  # the xIELU MLP: Apertus's alone
        from redline.interop import apertus

        apertus.check_exportable(cfg)
        return families["apertus"]
    from redline.interop import jamba

    if jamba.wants_jamba(cfg):  # Mamba-1 layers beside attention or MLPs, weighted dt/B/C norms, experts: Jamba's
        jamba.check_exportable(cfg)
        return families["jamba"]
    if cfg.delta_layers and cfg.delta_rule == "mamba1":  # Mamba-1 layers alone: Mamba's or Falcon-Mamba's
        from redline.interop import mamba

        return families[mamba.export_name(cfg)]
    from redline.interop import cohere

    if cohere.wants_cohere2_moe(cfg):  # experts in Cohere's parallel block, in any layer and window layout
        cohere.check_moe_exportable(cfg)
        return families["cohere2_moe"]
    if cohere.wants_compass(cfg):  # Cohere's dense parallel block with a RoPE base per layer type: Cohere Compass's
        cohere.check_compass_exportable(cfg)
        return families["cohere_compass_text"]
    if windowed_moe.wants_mellum(cfg):  # softmax experts, Qwen3's attention, windowed or dense layers: Mellum's
        windowed_moe.check_mellum_exportable(cfg)
        return families["mellum"]
    if cfg.moe_layers and ernie.wants_ernie_moe(cfg):  # experts among dense layers: ERNIE 4.5 MoE's interval
        ernie.check_moe_exportable(cfg)
        return families["ernie4_5_moe"]
    if cfg.moe_layers and not one_sublayer:
        raise UserError(f"model.moe_layers={cfg.moe_layers}: of the architectures redline exports to, only Jamba has "
                        f"experts on some layers in any pattern, and it has Mamba-1 layers (model.delta_rule=mamba1), "
                        f"Nemotron-H too, on blocks of one sublayer (model.mixer_free_layers), and ERNIE 4.5 MoE on "
                        f"every N-th, with softmax scores and model.moe_expert_bias; use "
                        f"model.moe_dense_layers for dense first layers")
    if cfg.pos_emb == "alibi":  # ALiBi: BLOOM's (a LayerNorm on the embeddings, biases) or MPT's (neither)
        from redline.interop import bloom, mpt

        if cfg.embed_norm:
            bloom.check_exportable(cfg)
            return families["bloom"]
        mpt.check_exportable(cfg)
        return families["mpt"]
    if cfg.delta_parallel:  # Mamba-2 beside attention in every layer: Falcon-H1's alone
        from redline.interop import falcon_h1

        falcon_h1.check_exportable(cfg)
        return families["falcon_h1"]
    if cfg.mlp_free_layers or cfg.mixer_free_layers:  # blocks of one sublayer: Mamba2's or Nemotron-H's alone
        from redline.interop import nemotron_h

        return families[nemotron_h.export_name(cfg)]
    if cfg.delta_layers and cfg.delta_rule == "mamba2":  # Mamba-2 layers: Granite 4.0's hybrids, or Bamba's
        from redline.interop import granite

        if granite.wants_bamba(cfg):
            granite.check_bamba_exportable(cfg)
            return families["bamba"]
        granite.check_hybrid_exportable(cfg)
        return families["granitemoehybrid"]
    from redline.interop import olmo_hybrid

    if olmo_hybrid.wants_olmo_hybrid(cfg):  # gated delta nets beside OLMo's output-norm blocks
        olmo_hybrid.check_exportable(cfg)
        return families["olmo_hybrid"]
    from redline.interop import lara_mini

    if lara_mini.wants_lara_mini(cfg):  # gated delta nets beside attention without an output gate: Lara Mini's
        lara_mini.check_exportable(cfg)
        return families["lara_mini"]
    if qwen3_5.wants_qwen3_5(cfg):  # first: no other architecture has gated delta nets or element-wise gates
        return families[qwen3_5.export_name(cfg)]
    from redline.interop import llama

    if llama.wants_nemotron(cfg):  # LayerNorms by 1 + weight: Nemotron's alone
        llama.check_nemotron_exportable(cfg)
        return families["nemotron"]
    if lfm2.wants_lfm3(cfg):  # first: no other architecture has a head gate or proportional RoPE
        lfm2.check_lfm3_exportable(cfg)
        return families["lfm3"]
    if glm.wants_glm4(cfg):  # sandwich norms with plain RMSNorm weights: GLM-4's (the Gemmas' scale by 1 + weight)
        glm.check_glm4_exportable(cfg)
        return families["glm4"]
    from redline.interop import granite

    if granite.wants_hyperclovax(cfg):  # those norms rotating whole heads without QK-norm: HyperCLOVA X's
        granite.check_hyperclovax_exportable(cfg)
        return families["hyperclovax"]
    if cfg.norm_position == "post":  # post-norm blocks: GPT-1's alone
        from redline.interop import openai_gpt

        openai_gpt.check_exportable(cfg)
        return families["openai-gpt"]
    if cfg.embed_norm or not cfg.norm_affine:  # weightless norms: nanochat (one on the embeddings) or OLMo
        if not cfg.embed_norm and cfg.norm == "layernorm":
            from redline.interop.olmo2 import check_olmo_exportable

            check_olmo_exportable(cfg)
            return families["olmo"]
        from redline.interop import nanochat

        nanochat.check_exportable(cfg)
        return families["nanochat"]
    if cfg.pos_emb == "learned" and cfg.embed_scale:  # scaled embeddings beside a position table: BioGPT's
        from redline.interop import biogpt

        biogpt.check_exportable(cfg)
        return families["biogpt"]
    classic = classic_export_name(cfg)
    if classic:  # the classic LayerNorm + GELU architectures: the options that choose them are theirs alone
        return families[classic]
    if cfg.attn_sinks and not (cfg.moe_bias or cfg.mlp == "swiglu_clamped"):  # sinks: Granite SWA's, not GPT-OSS's
        from redline.interop import granite

        if cfg.moe_experts:  # plain SwiGLU experts without biases: GraniteMoeSWA
            granite.check_moe_exportable(cfg, swa=True)
            return families["granitemoe_swa"]
        granite.check_exportable(cfg, swa=True)
        return families["granite_swa"]
    if cfg.rope_layer_theta:
        raise UserError("model.rope_layer_theta: of the architectures redline exports to, only Granite SWA has a RoPE "
                        "base per layer, and it is a dense model with attention sinks (model.attn_sinks, no "
                        "model.moe_experts)")
    from redline.interop import llama

    if llama.wants_ministral(cfg):  # windowed and full layers in Mistral's block
        llama.check_ministral_exportable(cfg)
        return families["ministral"]
    if cfg.window_layers and not cfg.attn_sinks:
        raise UserError("model.window_layers: of the architectures redline exports to, only Granite SWA and GPT-OSS "
                        "take windowed layers in any order, and both have attention sinks (model.attn_sinks)")
    if cfg.attn_sinks or cfg.moe_bias or cfg.mlp == "swiglu_clamped":  # GPT-OSS's sinks, expert biases, clamp
        from redline.interop import gpt_oss

        gpt_oss.check_exportable(cfg)
        return families["gpt_oss"]
    if cfg.conv_layers:  # short convolutions: LFM2
        lfm2.check_exportable(cfg)
        return families["lfm2_moe" if cfg.moe_experts else "lfm2"]
    if ernie.wants_ernie_moe(cfg):  # softmax scores with an expert bias that chooses: ERNIE 4.5 MoE's
        ernie.check_moe_exportable(cfg)
        return families["ernie4_5_moe"]
    from redline.interop import hunyuan

    if hunyuan.wants_hunyuan_moe(cfg):  # experts with QK-norm after RoPE: Hunyuan MoE's
        hunyuan.check_moe_exportable(cfg)
        return families["hunyuan_v1_moe"]
    if cfg.moe_experts:  # Mixtral, Qwen2/3-MoE, OLMoE
        from redline.interop import moe

        return families[moe.export_name(cfg)]
    if cfg.qk_norm_after_rope:
        from redline.interop import hunyuan

        hunyuan.check_exportable(cfg)
        return families["hunyuan_v1_dense"]
    if cfg.rope_dims and cfg.norm_position != "pre":
        raise UserError(f"model.rope_dims={cfg.rope_dims} with norm_position={cfg.norm_position}: of the "
                        f"architectures redline exports to, only GPT-NeoX, Phi and Phi-3 rotate part of each head, and "
                        f"their norms are pre-norms")
    if cfg.head_bias and not cfg.parallel_shared_norm:
        raise UserError("model.head_bias without model.parallel_shared_norm: of the architectures redline exports to, "
                        "only Phi has a bias on its head, and its blocks have one norm for both sublayers")
    if cfg.gelu_approximate != "tanh" and cfg.mlp == "geglu":
        raise UserError("model.gelu_approximate=none with model.mlp=geglu: Gemma 3, the one architecture with GeGLU "
                        "redline exports to, uses the tanh approximation")
    from redline.interop import gemma2

    vault = gemma2.wants_vaultgemma(cfg)  # Gemma 2's caps and window on Gemma's pre-norm block
    if cfg.logit_softcap and cfg.norm_position != "sandwich" and not vault:
        raise UserError(f"model.logit_softcap={cfg.logit_softcap}: of the architectures redline exports to, only "
                        f"Gemma 2 and 3 (norm_position=sandwich) cap their logits, and VaultGemma with Gemma's "
                        f"pre-norm block (model.norm_unit_offset, embed_scale)")
    if cfg.attn_softcap and cfg.norm_position != "sandwich" and not vault:
        raise UserError(f"model.attn_softcap={cfg.attn_softcap}: of the architectures redline exports to, only "
                        f"Gemma 2 (norm_position=sandwich) caps its attention scores, and VaultGemma with Gemma's "
                        f"pre-norm block (model.norm_unit_offset, embed_scale)")
    if cfg.value_embeddings:
        raise UserError(f"model.value_embeddings={cfg.value_embeddings}: none of the architectures redline exports to "
                        f"(GPT-2, OPT, GPT-NeoX, Phi, StableLM, Llama, Mistral, Qwen2, Qwen3, SmolLM3, Granite, "
                        f"OLMo 2, Gemma 3) mixes token-indexed tables into its attention values; run the model with "
                        f"redline generate, chat or serve instead")
    from redline.interop import exaone4

    if exaone4.wants_exaone4(cfg):
        exaone4.check_exportable(cfg)
        return families["exaone4"]
    from redline.interop import cohere

    if cohere.wants_cohere(cfg):
        return families[cohere.export_name(cfg)]
    if cfg.nope_interval and (cfg.norm_position != "pre" or cfg.norm != "rmsnorm" or cfg.mlp != "swiglu"
                              or cfg.parallel_residual or cfg.rope_dims):
        raise UserError(f"model.nope_interval={cfg.nope_interval}: of the architectures redline exports to, only "
                        f"SmolLM3 has layers without RoPE, and its blocks are Llama's (pre-RMSNorm, SwiGLU, "
                        f"sequential sublayers, RoPE on whole heads)")
    from redline.interop import granite

    if granite.wants_granite(cfg):
        granite.check_exportable(cfg)
        return families["granitemoehybrid" if cfg.pos_emb == "none" else "granite"]
    if cfg.pos_emb == "none":
        raise UserError("model.pos_emb=none: of the architectures redline exports to, only Granite 4.0 has no "
                        "positions, and it has its embedding, residual, score or logit scalars (model."
                        "residual_multiplier, ...); the others have learned positions (GPT-2, OPT) or RoPE")
    if cfg.norm_position == "sandwich":  # Gemma 2 without QK-norm, Gemma 3 with it
        from redline.interop import gemma3

        if not cfg.qk_norm:
            gemma2.check_exportable(cfg)
            return families["gemma2"]
        gemma3.check_exportable(cfg)
        return families["gemma3_text"]
    from redline.interop import gemma

    if vault:
        gemma2.check_vault_exportable(cfg)
        return families["vaultgemma"]
    if gemma.wants_gemma(cfg):
        gemma.check_exportable(cfg)
        return families["gemma"]
    if cfg.norm_position == "output" and cfg.sliding_window:  # OLMo 3: OLMo 2's block with its windowed layers
        from redline.interop.olmo2 import check_exportable

        check_exportable(cfg)
        return families["olmo3"]
    options = [f"model.{name}" for name in ("norm_unit_offset", "embed_scale", "attn_scale", "sliding_window_pattern",
                                            "rope_local_theta") if getattr(cfg, name)]
    options += ["model.mlp=geglu"] if cfg.mlp == "geglu" else []
    if options:
        raise UserError(f"{', '.join(options)} without Gemma's norms: of the architectures redline exports to, only "
                        f"the Gemmas have {'it' if len(options) == 1 else 'them'}, and their norms scale by 1 + weight "
                        f"(model.norm_unit_offset)")
    if cfg.norm_position == "output":
        from redline.interop.olmo2 import check_exportable

        check_exportable(cfg)
        return families["olmo2"]
    from redline.interop import phi3

    if glm.wants_glm(cfg):  # Phi-3's block with biases on q/k/v: GLM's
        glm.check_glm_exportable(cfg)
        return families["glm"]
    if phi3.wants_phi3(cfg):
        phi3.check_exportable(cfg)
        return families["phi3"]
    if llama.wants_jais2(cfg):  # RoPE, LayerNorm and a ReLU² MLP: Jais 2's
        llama.check_jais2_exportable(cfg)
        return families["jais2"]
    if cfg.pos_emb == "rope" and cfg.norm == "layernorm" and cfg.mlp == "swiglu":
        from redline.interop.stablelm import check_exportable

        check_exportable(cfg)
        return families["stablelm"]
    if cfg.parallel_shared_norm:
        from redline.interop.phi import check_exportable

        check_exportable(cfg)
        return families["phi"]
    from redline.interop import falcon, starcoder2

    if falcon.wants_falcon(cfg):  # parallel sublayers under two norms with GQA: Falcon's new decoder architecture
        falcon.check_exportable(cfg)
        return families["falcon"]
    if starcoder2.wants_starcoder2(cfg):
        starcoder2.check_exportable(cfg)
        return families["starcoder2"]
    if cfg.pos_emb == "rope" and (cfg.norm == "layernorm" or cfg.rope_dims or cfg.parallel_residual
                                  or cfg.gelu_approximate != "tanh"):
        from redline.interop.gpt_neox import check_exportable

        check_exportable(cfg)
        return families["gpt_neox"]
    if cfg.pos_emb == "learned" and cfg.mlp == "relu":
        from redline.interop.opt import check_exportable

        check_exportable(cfg)
        return families["opt"]
    if cfg.pos_emb == "learned":
        from redline.interop.gpt2 import check_exportable

        check_exportable(cfg)
        return families["gpt2"]
    from redline.interop.llama import check_arcee_exportable, export_name

    if cfg.mlp == "relu2":  # Llama's block with a ReLU² MLP: Arcee
        check_arcee_exportable(cfg)
        return families["arcee"]
    if cfg.mlp != "swiglu":
        raise UserError(f"model.mlp={cfg.mlp} with RoPE: the RoPE architectures redline exports to (Llama, Mistral, "
                        f"Qwen2, Qwen3) use SwiGLU MLPs, Arcee ReLU²")

    return families[export_name(cfg)]
