"""GGUF files (llama.cpp's format) through the `gguf` package: read into redline's layout, and written from it.

A GGUF names its tensors `token_embd`, `blk.N.attn_q`, `blk.N.ffn_gate`, ... and its config `{arch}.block_count`,
`{arch}.attention.head_count_kv`, ... for an architecture `general.architecture`: llama (also Mistral and most
Llama-shaped models), qwen2, qwen3, smollm3, granite, olmo (the original OLMo: no norm tensors), olmo2, gemma,
gemma2, gemma3 (Gemma 3's text model), gpt2, gptneox, stablelm, phi2, phi3, starcoder2, exaone4 (EXAONE 4.0; exaone,
EXAONE 3.x, is read only: a redline model writes as llama), arcee (AFM),
hunyuan-dense (Hunyuan dense), lfm2 and lfm2moe (LFM2: its convolution layers have no kv heads), command-r and cohere2
(Cohere's) and the mixtures of experts (llama with expert_count: Mixtral; qwen2moe, qwen3moe, olmoe, granitemoe;
gpt-oss, GPT-OSS: sinks, biased experts, its clamped SwiGLU; minimax-m2, MiniMax-M2: partial RoPE, whole-projection
QK-norm, sigmoid routing with its bias as exp_probs_b), bloom (BLOOM: ALiBi, the embeddings' LayerNorm),
gemma4 (Gemma 4's text model), deepseek2 (DeepSeek-V2/V3's latent attention), glm4moe (GLM-4-MoE), llama4 (Llama 4's
text model), glm4 (GLM-4), ernie4_5-moe (ERNIE 4.5 MoE), hunyuan-moe (Hunyuan MoE), apertus (Apertus: xIELU's
scalars as keys), dots1 (dots.llm1) and jais2 (Jais 2), whose tensors and keys gguf_gemma4.py, gguf_deepseek2.py,
gguf_glm4moe.py, gguf_llama4.py, gguf_glm4.py, gguf_ernie.py, gguf_hunyuan_moe.py, gguf_apertus.py, gguf_dots1.py and
gguf_jais2.py map, starcoder (GPTBigCode: multi-query, learned
positions) and mpt (MPT: ALiBi, no biases) are read and written here; so are the recurrent hybrids granitehybrid
(Granite 4.0's Mamba-2 layers) and qwen35 (Qwen3.5's gated delta nets), mamba (Mamba-1 and Falcon-Mamba), mamba2
(Mamba-2), nemotron_h (Nemotron-H's one-sublayer blocks) and falcon-h1 (Falcon-H1: attention and Mamba-2 side by
side), whose tensors and keys gguf_recurrent.py maps.
Reading renames the tensors to Hugging Face names and builds a Hugging Face config, so the families' own maps
(llama.py, gemma3.py, gpt2.py, moe.py) do the rest; writing goes the other way. A mixture's experts are stacked in
the file, ffn_gate_exps / ffn_up_exps (E, F, C) and ffn_down_exps (E, C, F) beside the router ffn_gate_inp (E, C),
as llama.cpp's loaders create them. Four layout differences from Hugging Face's:
- llama.cpp's converter permutes the rows of q and k of the llama architecture, smollm3, granite, granitemoe and olmo
  (each head's rotary pairs interleaved, for its RoPE kernel): undone on import, done on export; qwen2/qwen3/olmo2
  files (and qwen2moe, qwen3moe, olmoe) are not permuted (llama.cpp rotates them as NeoX does, (first half, second
  half) pairs, as redline does), nor are exaone4 and hunyuan-dense files (llama.cpp's converter writes both through
  its plain TextModel, and llama.cpp's llama_rope_type gives both NeoX rotation); command-r and cohere2 files hold
  transformers' own rows (consecutive pairs, which llama.cpp rotates so: cohere.py permutes them, not this file);
- GPT-2's projections are stored as (out, in) Linear weights, Hugging Face's as (in, out) Conv1D ones;
- gemma3 (and gemma, gemma2) stores every RMSNorm weight (QK-norm and the final norm too) as 1 + weight, the scale
  Gemma's norms multiply by: transformers' GGUF loader subtracts 1 from each `*norm.weight` of a gemma3 file (its
  Gemma2TensorProcessor, citing llama.cpp's convert_hf_to_gguf.py), and so does this reader; q/k are not permuted
  (that loader undoes no permutation for gemma3, and redline's logits equal its own on the same file).
- gpt-oss splits transformers' gate_up_proj, whose gate and up columns interleave, into ffn_gate_exps and
  ffn_up_exps (llama.cpp's converter takes [..., ::2] and [..., 1::2]), and stores the experts as rows, the transpose
  of transformers' (E, C, 2F) / (E, F, C).
Quantized tensors are dequantized by the gguf package (a type it cannot dequantize is an error naming it); export
writes f32, f16, bf16, q8_0 or the 4- and 5-bit q4_0, q4_1, q5_0, q5_1 matrices (the head's in q8_0 then), norms
and biases always f32 as llama.cpp does; for GPT-OSS also mxfp4, the experts in llama.cpp's MXFP4 and the rest in bf16,
as its converter writes the released checkpoints. Llama 3 RoPE scaling travels
as llama.cpp's rope_freqs tensor (each frequency's divisor), read back into the four parameters of the scaling.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from redline.durable import fsync_dir, fsync_file
from redline.errors import UserError
from redline.interop.families import Family, TensorSource, family_for, interleave_rope_rows
from redline.interop.gguf_recurrent import RECURRENT_ARCHES
from redline.interop.hf import ImportedModel, convert_source
from redline.model import ModelConfig, rope_attention_factor

ARCHES = ("llama", "qwen2", "qwen3", "olmo2", "gemma", "gemma2", "gemma3", "gpt2", "gptneox", "stablelm", "phi2",
          "phi3", "smollm3", "granite", "starcoder2", "exaone4", "hunyuan-dense", "qwen2moe", "qwen3moe", "olmoe",
          "granitemoe", "lfm2", "lfm2moe", "command-r", "cohere2", "olmo", "gpt-oss", "exaone", "arcee", "bloom",
          "starcoder", "mpt", "minimax-m2", "gemma4", "deepseek2", "glm4moe", "llama4", "glm4", "ernie4_5-moe",
          "hunyuan-moe", "apertus", "dots1", "jais2", *RECURRENT_ARCHES)
# the architectures a module of their own maps (gguf_gemma4.py, gguf_deepseek2.py, gguf_glm4moe.py, gguf_llama4.py,
# gguf_glm4.py, gguf_ernie.py, gguf_hunyuan_moe.py, gguf_apertus.py, gguf_dots1.py, gguf_jais2.py: _named_module;
# what they share in gguf_named.py), their tensors passed along under the file's names
NAMED_ARCHES = ("gemma4", "deepseek2", "glm4moe", "llama4", "glm4", "ernie4_5-moe", "hunyuan-moe", "apertus", "dots1",
                "jais2")
# those of them whose config takes the rope_freqs tensor (gemma4's proportional RoPE, llama4's and apertus's Llama 3
# scaling), and those with tensors held in keys (apertus's xIELU scalars, one entry a layer)
ROPE_FREQS_ARCHES = ("gemma4", "llama4", "apertus")
KEYED_TENSOR_ARCHES = ("apertus",)
# Cohere's Command models (cohere.py): llama.cpp's command-r and cohere2 rotate consecutive pairs (its NORM RoPE), the
# order of Hugging Face's own rows, so their q/k are stored as transformers holds them (cohere.py permutes them into
# redline's order); one LayerNorm without a bias a block, parallel sublayers, the logits times logit_scale, the head
# tied to token_embd (llama.cpp loads no output tensor for them); cohere2's windowed layers rotate, the others do not
COHERE = ("command-r", "cohere2")
# mixtures of experts (moe.py): llama.cpp's names for them, and whether its graph rescales each token's top-k router
# probabilities to sum to 1 (the norm_w of each architecture's build_moe_ffn call: llama's, Mixtral's, yes; qwen2moe
# and olmoe no; qwen3moe and granitemoe yes)
MOE_ARCHES = {"llama": "mixtral", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "olmoe": "olmoe",
              "granitemoe": "granitemoe"}
MOE_RESCALES = {"llama": True, "qwen2moe": False, "qwen3moe": True, "olmoe": False, "granitemoe": True}
# the architectures whose q/k rows llama.cpp's converter permutes (its LlamaModel and the classes built on it)
PERMUTED = ("llama", "smollm3", "granite", "granitemoe", "olmo", "arcee")
# the block types export writes (llama.cpp's Q8_0, Q5_1, Q5_0, Q4_1, Q4_0: 32 weights a block with a scale, and an
# offset for the _1 types), which the gguf package can quantize
GGUF_QUANTS = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
# GPT-OSS's experts in llama.cpp's MXFP4 (32 FP4 E2M1 values and an E8M0 scale a block), everything else in bf16 (1-D
# tensors f32): what llama.cpp's converter writes from the released MXFP4 checkpoints (its "auto" outtype is their
# bf16), file type MOSTLY_MXFP4_MOE; the gguf package's MXFP4 class quantizes in Python (require_mxfp4)
MXFP4 = "mxfp4"
GGUF_DTYPES = (*GGUF_QUANTS, MXFP4)  # the GGUF-only values of `export --dtype`
# the architectures whose RMSNorm weights llama.cpp's converter stores as the scale they multiply by, 1 + weight
GEMMAS = ("gemma", "gemma2", "gemma3")
# llama.cpp's smollm3 leaves RoPE out of every fourth layer, a step fixed in its code (no GGUF key gives it)
SMOLLM3_NOPE_INTERVAL = 4
_LLAMA_NAMES = {  # GGUF name (after blk.N.) -> Hugging Face name (after model.layers.N.)
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    # a mixture of experts: the router, the experts stacked (E, F, C) / (E, C, F) (stack_experts), a shared expert
    # and its gate ((C,) in the file, (1, C) in Hugging Face's)
    "ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.gate_proj", "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
# OLMo 2's norms are on the sublayers' outputs (llama.cpp's post_attention_norm / post_ffw_norm), with no input norms
_OLMO2_NAMES = {**{k: v for k, v in _LLAMA_NAMES.items() if k not in ("attn_norm", "ffn_norm")},
                "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
# Gemma 3's sandwich norms: llama.cpp's attn_norm / post_attention_norm around attention, ffn_norm / post_ffw_norm
# around the MLP (the gguf package's MODEL_TENSORS[GEMMA3] and its name map for Gemma3ForCausalLM)
_GEMMA3_NAMES = {**{k: v for k, v in _LLAMA_NAMES.items() if k != "ffn_norm"}, "ffn_norm": "pre_feedforward_layernorm",
                 "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_LLAMA_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_GPT2_NAMES = {"attn_norm": "ln_1", "ffn_norm": "ln_2", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj",
               "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
_GPT2_TOP = {"token_embd": "transformer.wte", "position_embd": "transformer.wpe", "output_norm": "transformer.ln_f",
             "output": "lm_head"}
_CONV1D = ("attn_qkv", "attn_output", "ffn_up", "ffn_down")  # GPT-2 weights stored transposed
# GPT-NeoX (the gguf package's MODEL_TENSORS[GPTNEOX]); llama.cpp's converter regroups query_key_value's rows from
# the (heads, 3, head width) of Hugging Face's files to all queries, all keys, all values (_neox_qkv)
_NEOX_NAMES = {"attn_norm": "input_layernorm", "attn_qkv": "attention.query_key_value",
               "attn_output": "attention.dense", "ffn_norm": "post_attention_layernorm", "ffn_up": "mlp.dense_h_to_4h",
               "ffn_down": "mlp.dense_4h_to_h"}
_NEOX_TOP = {"token_embd": "gpt_neox.embed_in", "output_norm": "gpt_neox.final_layer_norm", "output": "embed_out"}
# BLOOM (MODEL_TENSORS[BLOOM], the converter's BloomModel): LayerNorms and Linear layers with biases, the embeddings'
# LayerNorm as token_embd_norm; query_key_value regrouped from (heads, 3, head width) rows to (3, heads, head width),
# as GPT-NeoX's (_neox_qkv). ALiBi needs no tensor or key: llama.cpp's bloom fixes its maximum bias at 8, BLOOM's
_BLOOM_NAMES = {"attn_norm": "input_layernorm", "attn_qkv": "self_attention.query_key_value",
                "attn_output": "self_attention.dense", "ffn_norm": "post_attention_layernorm",
                "ffn_up": "mlp.dense_h_to_4h", "ffn_down": "mlp.dense_4h_to_h"}
_BLOOM_TOP = {"token_embd": "transformer.word_embeddings", "token_embd_norm": "transformer.word_embeddings_layernorm",
              "output_norm": "transformer.ln_f", "output": "lm_head"}
# StarCoder (MODEL_TENSORS[STARCODER], the converter's StarCoderModel for GPTBigCodeForCausalLM): GPT-2's names and
# learned positions, but nn.Linear (out, in) weights stored as they are; c_attn's multi-query rows [q (C); k (D);
# v (D)] are the q, k and v views llama.cpp's starcoder graph takes of attn_qkv, so they move unchanged
_STARCODER_NAMES = {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_norm": "ln_2",
                    "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
# MPT (MODEL_TENSORS[MPT], the converter's MPTModel): Wqkv's [q; k; v] rows as attn_qkv unchanged (llama.cpp's mpt
# graph views them so), LayerNorms and Linear layers without biases, the head tied (no output tensor: llama.cpp's
# loader falls back to token_embd)
_MPT_NAMES = {"attn_norm": "norm_1", "attn_qkv": "attn.Wqkv", "attn_output": "attn.out_proj", "ffn_norm": "norm_2",
              "ffn_up": "ffn.up_proj", "ffn_down": "ffn.down_proj"}
_MPT_TOP = {"token_embd": "transformer.wte", "output_norm": "transformer.norm_f", "output": "lm_head"}
# llama.cpp's ALiBi maximum bias (attention.max_alibi_bias): MPT's alibi_bias_max, 8 in every MPT transformers builds
MPT_ALIBI_BIAS_MAX = 8.0
# the architectures whose attn_qkv rows the converter regroups from Hugging Face's per-head (q, k, v) (_neox_qkv)
HEAD_GROUPED_QKV = ("gptneox", "bloom")
# Phi (the gguf package's MODEL_TENSORS[PHI2]): q, k and v apart, one norm a block, a bias on the head
_PHI2_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.dense", "ffn_up": "mlp.fc1",
               "ffn_down": "mlp.fc2"}
_PHI2_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.final_layernorm", "output": "lm_head"}
# Phi-3 (MODEL_TENSORS[PHI3]): q/k/v in one attn_qkv and the MLP's gate and up in one ffn_up, as Hugging Face's
# qkv_proj and gate_up_proj; LongRoPE's two sets of factors as (rotating pairs,) F32 tensors of their own
_PHI3_NAMES = {"attn_norm": "input_layernorm", "attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj",
               "ffn_norm": "post_attention_layernorm", "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"}
# LFM2 (MODEL_TENSORS[LFM2]; llama.cpp's llama_model_lfm2): operator_norm as attn_norm, the convolution layers'
# shortconv.in_proj / conv / out_proj, the final norm as token_embd_norm (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2),
# the convolution's kernel (C, L) in the file, (C, 1, L) in Hugging Face's
_LFM2_NAMES = {"attn_norm": "operator_norm", "ffn_norm": "ffn_norm", "ffn_gate": "feed_forward.w1",
               "ffn_up": "feed_forward.w3", "ffn_down": "feed_forward.w2", "attn_q": "self_attn.q_proj",
               "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.out_proj",
               "attn_q_norm": "self_attn.q_layernorm", "attn_k_norm": "self_attn.k_layernorm",
               "shortconv.conv": "conv.conv", "shortconv.in_proj": "conv.in_proj",
               "shortconv.out_proj": "conv.out_proj"}
_LFM2_TOP = {"token_embd": "model.embed_tokens", "token_embd_norm": "model.embedding_norm", "output": "lm_head"}
# LFM2-MoE (llama.cpp's llama_model_lfm2moe): LFM2's names, and past the leading dense layers the router, the stacked
# experts and the routing bias exp_probs_b (a bias of its own, Hugging Face's buffer feed_forward.expert_bias)
_LFM2MOE_NAMES = {**_LFM2_NAMES, "ffn_gate_inp": "feed_forward.gate", "ffn_gate_exps": "feed_forward.experts.gate_proj",
                  "ffn_up_exps": "feed_forward.experts.up_proj", "ffn_down_exps": "feed_forward.experts.down_proj",
                  "exp_probs_b": "feed_forward.expert_bias"}
# GPT-OSS (MODEL_TENSORS[GPT_OSS], llama.cpp's openai-moe): Llama's attention names, every projection with a bias, the
# MLP's norm as post_attention_norm (ATTN_POST_NORM), the sinks as attn_sinks.weight (n_head,), the router and its bias
# as ffn_gate_inp, the experts stacked with their biases: ffn_gate_exps / ffn_up_exps (E, F, C) + (E, F), ffn_down_exps
# (E, C, F) + (E, C). The mlp.experts.*_proj.weight / .bias names are the converter's own split of transformers'
# tensors (_gpt_oss_file_experts, _gpt_oss_source); ffn_gate_up_exps is its --fuse-gate-up-exps form, [gate; up]
_GPT_OSS_NAMES = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                  "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                  "attn_output": "self_attn.o_proj", "attn_sinks": "self_attn.sinks", "ffn_gate_inp": "mlp.router",
                  "ffn_gate_exps": "mlp.experts.gate_proj", "ffn_up_exps": "mlp.experts.up_proj",
                  "ffn_down_exps": "mlp.experts.down_proj", "ffn_gate_up_exps": "mlp.experts.gate_up_proj"}
# llama.cpp's gpt-oss clamps its SwiGLU at this limit, a constant of its graph (build_moe_ffn's
# LLM_FFN_SWIGLU_OAI_MOE: alpha 1.702, limit 7.0) that no GGUF key changes; GPT-OSS's own swiglu_limit
GPT_OSS_SWIGLU_LIMIT = 7.0
# MiniMax-M2 (MODEL_TENSORS[MINIMAXM2], llama.cpp's llama_model_minimax_m2): Llama's names with the QK-norm over whole
# projections (attn_q_norm (H·D,), attn_k_norm (KV·D,)), the experts stacked, the routing bias as exp_probs_b.bias
# (transformers' mlp.e_score_correction_bias, as its GGUF loader's MiniMaxM2TensorProcessor maps it)
_MINIMAX_M2_NAMES = {**_LLAMA_NAMES, "exp_probs_b": "mlp.e_score_correction_bias"}
# Hugging Face names without a .weight / .bias of their own -> the GGUF suffix their tensor takes
_BARE = {"feed_forward.expert_bias": "bias", "self_attn.sinks": "weight", "mlp.e_score_correction_bias": "bias"}
# StarCoder2 (MODEL_TENSORS[STARCODER2]): Llama's attention names, LayerNorms with biases, c_fc / c_proj as ffn_up
# and ffn_down
_STARCODER2_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                     "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                     "ffn_norm": "post_attention_layernorm", "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
# Hunyuan dense (MODEL_TENSORS[HUNYUAN_DENSE]): Llama's names, its per-head QK-norm (query_layernorm, key_layernorm in
# Hugging Face's files) as attn_q_norm / attn_k_norm; llama.cpp applies them after RoPE, as transformers does.
# EXAONE 4.0 (MODEL_TENSORS[EXAONE4]) names its tensors as OLMo 2 does (_OLMO2_NAMES): output norms, QK-norm per head
_HUNYUAN_NAMES = {**_LLAMA_NAMES, "attn_q_norm": "self_attn.query_layernorm",
                  "attn_k_norm": "self_attn.key_layernorm"}
# the Hugging Face model_type of a GGUF architecture where the two names differ
_MODEL_TYPES = {"hunyuan-dense": "hunyuan_v1_dense", "command-r": "cohere"}
# llama.cpp's exaone4 (its load_arch_hparams for LLM_ARCH_EXAONE4) windows only a 64-layer model, EXAONE-4.0-32B's
# layout: a 4096-token window (or attention.sliding_window) on three layers in four, the fourth full and unrotated;
# every other depth runs with every layer full and rotating, whatever the file's window keys say
EXAONE4_WINDOWED_LAYERS, EXAONE4_WINDOW, EXAONE4_PATTERN = 64, 4096, 4
ROPE_FACTORS = {"long": "rope_factors_long.weight", "short": "rope_factors_short.weight"}
# redline's key for the GELU of a gptneox file: llama.cpp computes the tanh approximation, and its converter writes
# no key for Hugging Face's hidden_act; without this key a file reads as a Pythia-style "gelu" (erf), the function
# of the model the file was converted from
NEOX_GELU_KEY = "redline.feed_forward.gelu_approximate"  # string: "tanh" or "none"
_BLOCK = re.compile(r"^blk\.(\d+)\.([\w.]+)\.(weight|bias)$")  # dotted inner names: LFM2's shortconv.conv
_TOP = re.compile(r"^(\w+)\.(weight|bias)$")


def require_gguf():
    try:
        import gguf
    except ImportError:
        raise UserError("GGUF files need the gguf package: pip install 'redline[interop]'") from None
    return gguf


def _neox_qkv(w: torch.Tensor, heads: int, to_file: bool) -> torch.Tensor:
    """query_key_value's rows (weight (3·H·D, C) or bias) between Hugging Face's (H, 3, D) grouping and the GGUF's
    (3, H, D)."""
    shape = (heads, 3, -1) if to_file else (3, heads, -1)
    return w.reshape(*shape, *w.shape[1:]).transpose(0, 1).reshape(w.shape).contiguous()


def _maps(arch: str) -> tuple[dict, dict, str]:
    """(block names, top-level names, Hugging Face block prefix) of a GGUF architecture."""
    if arch == "gpt2":
        return _GPT2_NAMES, _GPT2_TOP, "transformer.h."
    if arch == "starcoder":
        return _STARCODER_NAMES, _GPT2_TOP, "transformer.h."
    if arch == "mpt":
        return _MPT_NAMES, _MPT_TOP, "transformer.blocks."
    if arch == "gptneox":
        return _NEOX_NAMES, _NEOX_TOP, "gpt_neox.layers."
    if arch == "bloom":
        return _BLOOM_NAMES, _BLOOM_TOP, "transformer.h."
    if arch == "phi2":
        return _PHI2_NAMES, _PHI2_TOP, "model.layers."
    if arch == "phi3":
        return _PHI3_NAMES, _LLAMA_TOP, "model.layers."
    if arch == "starcoder2":
        return _STARCODER2_NAMES, _LLAMA_TOP, "model.layers."
    if arch in ("lfm2", "lfm2moe"):
        return _LFM2MOE_NAMES if arch == "lfm2moe" else _LFM2_NAMES, _LFM2_TOP, "model.layers."
    if arch == "gpt-oss":
        return _GPT_OSS_NAMES, _LLAMA_TOP, "model.layers."
    names = {"olmo2": _OLMO2_NAMES, "exaone4": _OLMO2_NAMES, "hunyuan-dense": _HUNYUAN_NAMES, "gemma2": _GEMMA3_NAMES,
             "gemma3": _GEMMA3_NAMES, "minimax-m2": _MINIMAX_M2_NAMES}.get(arch, _LLAMA_NAMES)
    return names, _LLAMA_TOP, "model.layers."


def _hf_name(gguf_name: str, arch: str) -> str | None:
    names, top, prefix = _maps(arch)
    if m := _BLOCK.match(gguf_name):
        inner = names.get(m[2])
        if inner in _BARE:
            return f"{prefix}{m[1]}.{inner}" if _BARE[inner] == m[3] else None
        return f"{prefix}{m[1]}.{inner}.{m[3]}" if inner else None
    if m := _TOP.match(gguf_name):
        outer = top.get(m[1])
        return f"{outer}.{m[2]}" if outer else None
    return None


def _gguf_name(hf_name: str, arch: str) -> str:
    names, top, prefix = _maps(arch)
    if hf_name.startswith(prefix):
        layer, rest = hf_name[len(prefix):].split(".", 1)
        inner, kind = (rest, _BARE[rest]) if rest in _BARE else rest.rsplit(".", 1)
        return f"blk.{layer}.{ {v: k for k, v in names.items()}[inner]}.{kind}"
    outer, kind = hf_name.rsplit(".", 1)
    return f"{ {v: k for k, v in top.items()}[outer]}.{kind}"


# ----------------------------------------------------------------------------------------------------
# reading


def _fields(reader) -> dict:
    out = {}
    for name, field in reader.fields.items():
        try:
            out[name] = field.contents()
        except Exception:  # a value type this reader version does not decode: not one redline reads
            continue
    return out


def arch_keys(fields: dict, arch: str) -> tuple[Callable, int]:
    """(key(name, default): the GGUF's `arch.name` field, the vocabulary size from arch.vocab_size or the
    tokenizer's tokens); a UserError where neither gives one."""

    def key(name, default=None):
        return fields.get(f"{arch}.{name}", default)

    vocab = key("vocab_size") or len(fields.get("tokenizer.ggml.tokens") or [])
    if not vocab:
        raise UserError(f"the GGUF gives no vocabulary size ({arch}.vocab_size or tokenizer tokens)")
    return key, vocab


def _hf_config(fields: dict, arch: str, tensor_names: set[str], rope_freqs: torch.Tensor | None = None,
               rope_factors: dict | None = None) -> dict:
    """A Hugging Face config.json for the GGUF's metadata (rope_freqs: its rope_freqs tensor, where it has one;
    rope_factors: a phi3 file's LongRoPE factors, {"long": ..., "short": ...})."""

    key, vocab = arch_keys(fields, arch)
    tied = "output.weight" not in tensor_names
    if arch == "gpt2":
        return {"model_type": "gpt2", "vocab_size": vocab, "n_embd": key("embedding_length"),
                "n_layer": key("block_count"), "n_head": key("attention.head_count"),
                "n_positions": key("context_length", 1024), "n_inner": key("feed_forward_length"),
                "layer_norm_epsilon": key("attention.layer_norm_epsilon", 1e-5), "tie_word_embeddings": tied}
    width, heads = key("embedding_length"), key("attention.head_count")
    if arch in ("starcoder", "mpt"):
        return _starcoder_mpt_config(key, arch, vocab, tied, tensor_names)
    if arch == "bloom":  # BloomModel's keys; the context as written (the converter's is seq_length, else the width)
        return {"model_type": "bloom", "vocab_size": vocab, "hidden_size": width, "n_head": heads,
                "n_layer": key("block_count"), "seq_length": key("context_length", 2048),
                "layer_norm_epsilon": key("attention.layer_norm_epsilon", 1e-5), "tie_word_embeddings": tied}
    if arch == "phi3":
        return _phi3_config(key, vocab, tied, rope_factors or {})
    if arch in ("lfm2", "lfm2moe"):
        return _lfm2_config(key, vocab, tied, moe=arch == "lfm2moe")
    if arch == "gpt-oss":
        return _gpt_oss_config(fields, key, vocab, tied, tensor_names)
    if arch == "minimax-m2":
        return _minimax_m2_config(key, vocab, tied)
    if arch == "starcoder2":  # the keys llama.cpp's converter writes; biases and the window as the tensors and keys say
        if key("rope.scaling.type") not in (None, "none"):
            raise UserError(f"the GGUF's RoPE scaling {key('rope.scaling.type')!r} on a starcoder2 model is not read "
                            f"by redline; import the model's Hugging Face folder")
        return {"model_type": "starcoder2", "vocab_size": vocab, "hidden_size": width,
                "intermediate_size": key("feed_forward_length"), "num_hidden_layers": key("block_count"),
                "num_attention_heads": heads, "num_key_value_heads": key("attention.head_count_kv") or heads,
                "max_position_embeddings": key("context_length", 4096),
                "norm_epsilon": key("attention.layer_norm_epsilon", 1e-5), "rope_theta": key("rope.freq_base", 1e4),
                "tie_word_embeddings": tied, "use_bias": "blk.0.attn_q.bias" in tensor_names,
                "hidden_act": "gelu_pytorch_tanh", "sliding_window": key("attention.sliding_window") or None}
    if arch in ("gptneox", "phi2", "stablelm"):  # LayerNorm, RoPE on rope.dimension_count of each head's dimensions
        if key("rope.scaling.type") not in (None, "none"):
            raise UserError(f"the GGUF's RoPE scaling {key('rope.scaling.type')!r} on a {arch} model is not read by "
                            f"redline; import the model's Hugging Face folder")
        config = {"vocab_size": vocab, "hidden_size": width, "intermediate_size": key("feed_forward_length"),
                  "num_hidden_layers": key("block_count"), "num_attention_heads": heads,
                  "max_position_embeddings": key("context_length", 4096 if arch == "stablelm" else 2048),
                  "layer_norm_eps": key("attention.layer_norm_epsilon", 1e-5), "tie_word_embeddings": tied,
                  "rope_parameters": {"rope_type": "default", "rope_theta": key("rope.freq_base", 10000.0),
                                      "partial_rotary_factor": key("rope.dimension_count", width // heads)
                                      / (width // heads)}}
        if arch == "gptneox":
            return {**config, "model_type": "gpt_neox",
                    "use_parallel_residual": bool(key("use_parallel_residual", True)),
                    "hidden_act": "gelu_new" if fields.get(NEOX_GELU_KEY, "none") == "tanh" else "gelu"}
        config["num_key_value_heads"] = key("attention.head_count_kv") or heads
        if arch == "phi2":  # llama.cpp's phi2 computes the tanh GELU
            return {**config, "model_type": "phi", "hidden_act": "gelu_new"}
        # as transformers' GGUF loader reads them: q/k/v biases and the parallel block from the tensors
        return {**config, "model_type": "stablelm", "use_qkv_bias": "blk.0.attn_q.bias" in tensor_names,
                "use_parallel_residual": "blk.0.ffn_norm.weight" not in tensor_names}
    head_dim = key("attention.key_length") or key("rope.dimension_count") or width // heads
    if key("rope.dimension_count", head_dim) != head_dim:
        raise UserError(f"the GGUF rotates {key('rope.dimension_count')} of {head_dim} head dimensions (partial "
                        f"RoPE), which redline does not read from a {arch} file")
    window = key("attention.sliding_window") or 0
    if arch == "smollm3" and window:
        raise UserError("the GGUF's smollm3 architecture has a sliding window, which redline does not read")
    if arch == "olmo2" and window:  # llama.cpp reads it as OLMo 3's pattern (three windowed layers to one full)
        raise UserError("the GGUF's olmo2 architecture has a sliding window (OLMo 3's layout), which redline does "
                        "not read from GGUF")
    if arch == "hunyuan-dense" and window:  # llama.cpp's hunyuan-dense attends to the whole context
        raise UserError("the GGUF's hunyuan-dense architecture has a sliding window, which Hunyuan dense models do "
                        "not have; import the model's Hugging Face folder")
    experts = key("expert_count") or 0
    if arch in MOE_ARCHES and arch != "llama" and not experts:
        raise UserError(f"the GGUF's {arch} architecture gives no {arch}.expert_count; the file is incomplete")
    model_type = MOE_ARCHES[arch] if experts else "mistral" if arch == "llama" and window else \
        _MODEL_TYPES.get(arch, arch)
    config = {"model_type": model_type, "vocab_size": vocab,
              "hidden_size": width, "intermediate_size": key("feed_forward_length"),
              "num_hidden_layers": key("block_count"), "num_attention_heads": heads,
              "num_key_value_heads": key("attention.head_count_kv") or heads, "head_dim": head_dim,
              "max_position_embeddings": key("context_length", 2048),
              "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-6), "rope_theta": key("rope.freq_base", 1e4),
              "tie_word_embeddings": tied, "sliding_window": window or None}
    if arch in COHERE:
        _cohere_config(key, config)
    if arch == "smollm3":
        config["no_rope_layer_interval"] = SMOLLM3_NOPE_INTERVAL
    if arch == "olmo":  # weightless LayerNorms (no norm tensors), eps fixed at 1e-5; a clamp the family refuses
        config["clip_qkv"] = key("attention.clamp_kqv")
    if experts:  # the keys llama.cpp's converters write for Mixtral, Qwen2/3-MoE, OLMoE and GraniteMoE
        width = key("expert_feed_forward_length") or key("feed_forward_length")
        config.update(num_local_experts=experts, num_experts=experts, num_experts_per_tok=key("expert_used_count"),
                      intermediate_size=width, moe_intermediate_size=width, norm_topk_prob=MOE_RESCALES[arch],
                      shared_expert_intermediate_size=key("expert_shared_feed_forward_length"),
                      qkv_bias="blk.0.attn_q.bias" in tensor_names)
    if arch in ("granite", "granitemoe"):  # llama.cpp leaves out a scalar of 0 (and the converter one the config
        # does not give)
        config.update(embedding_multiplier=key("embedding_scale") or 1.0,
                      residual_multiplier=key("residual_scale") or 1.0, logits_scaling=key("logit_scale") or 1.0,
                      attention_multiplier=key("attention.scale") or head_dim ** -0.5)
    if arch in PERMUTED:
        config["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
        config["mlp_bias"] = "blk.0.ffn_up.bias" in tensor_names
    scaling = key("rope.scaling.type")
    if rope_freqs is not None:
        config["rope_scaling"] = _llama3_scaling(fields, rope_freqs, config)
    elif scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": key("rope.scaling.factor")}
    elif scaling == "yarn":
        config["rope_scaling"] = _yarn_scaling(fields, key)
    elif scaling not in (None, "none"):
        raise UserError(f"the GGUF's RoPE scaling {scaling!r} is not supported (redline reads none, linear, yarn "
                        f"and Llama 3's rope_freqs)")
    if arch == "gemma2":
        return _gemma2_config(fields, key, config)
    if arch == "exaone4":
        return _exaone4_config(key, config)
    if arch == "hunyuan-dense":  # no biases and QK-norm on every layer: the only tensors llama.cpp's loader creates
        return {**config, "attention_bias": False, "use_qk_norm": True}
    return _gemma3_config(fields, key, config) if arch == "gemma3" else config


def _starcoder_mpt_config(key, arch: str, vocab: int, tied: bool, tensor_names: set[str]) -> dict:
    """A gpt_bigcode or mpt config.json for a starcoder or mpt GGUF, from the keys llama.cpp's converter writes
    (StarCoderModel, MPTModel). llama.cpp's starcoder and mpt graphs compute the tanh GELU (ggml_gelu); a starcoder
    file reads as GPTBigCode's gelu_pytorch_tanh, an mpt file as MPT's exact GELU, the function of the model it was
    converted from (llama.cpp's approximation differs from it by < 1e-3)."""
    width, heads, layers = key("embedding_length"), key("attention.head_count"), key("block_count")
    kv = key("attention.head_count_kv") or (1 if arch == "starcoder" else heads)
    if arch == "starcoder":
        if kv != 1:  # the converter writes 1 whatever the model: c_attn's rows are [q; k; v] only for multi-query
            raise UserError(f"the GGUF's starcoder file gives {kv} kv heads; redline reads multi-query starcoder "
                            f"files (head_count_kv 1), as llama.cpp's converter writes them")
        return {"model_type": "gpt_bigcode", "vocab_size": vocab, "n_embd": width, "n_layer": layers, "n_head": heads,
                "n_positions": key("context_length", 8192), "n_inner": key("feed_forward_length"),
                "multi_query": True, "activation_function": "gelu_pytorch_tanh",
                "layer_norm_epsilon": key("attention.layer_norm_epsilon", 1e-5), "tie_word_embeddings": tied}
    biased = sorted(n for n in tensor_names if n.endswith(".bias"))
    problems = [(key("attention.clamp_kqv") is not None, f"attention.clamp_kqv={key('attention.clamp_kqv')} (MPT's "
                                                         f"clip_qkv, which redline does not compute)"),
                (key("attention.max_alibi_bias", MPT_ALIBI_BIAS_MAX) != MPT_ALIBI_BIAS_MAX,
                 f"attention.max_alibi_bias={key('attention.max_alibi_bias')} (redline's ALiBi slopes are those of "
                 f"{MPT_ALIBI_BIAS_MAX:g}; 0 is an MPT without ALiBi)"),
                (kv != heads, f"{kv} kv heads (transformers' MPT is multi-head)"),
                (bool(biased), f"biases ({biased[0] if biased else ''}: transformers' MPT has none)")]
    for bad, what in problems:
        if bad:
            raise UserError(f"the GGUF's mpt file has {what}; import the model's Hugging Face folder")
    ffn = key("feed_forward_length") or 4 * width
    return {"model_type": "mpt", "vocab_size": vocab, "d_model": width, "n_heads": heads, "n_layers": layers,
            "max_seq_len": key("context_length", 2048), "expansion_ratio": ffn / width,
            "layer_norm_epsilon": key("attention.layer_norm_epsilon", 1e-5), "no_bias": True,
            "norm_type": "low_precision_layernorm", "tie_word_embeddings": tied,
            "attn_config": {"alibi": True, "alibi_bias_max": 8, "softmax_scale": None, "clip_qkv": None}}


def _exaone4_config(key, common: dict) -> dict:
    """An exaone4 config.json for an exaone4 GGUF: the common keys and the layers' kinds. llama.cpp's converter
    writes attention.sliding_window and attention.sliding_window_pattern as one bool per layer (true: windowed, from
    layer_types) where the model has a window; a 64-layer file without them gets llama.cpp's own EXAONE-4.0-32B
    layout (EXAONE4_*). At other depths the keys are read as written, the Hugging Face model's layout, though
    llama.cpp runs such a file unwindowed (redline's export refuses to write one). Windowed layers rotate and full
    ones do not (NoPE) where the model has a window; without one every layer is full and rotating, as llama.cpp's
    graph (use_rope: is_swa(il) or no window at all) runs them."""
    layers = common["num_hidden_layers"]
    window, pattern = key("attention.sliding_window"), key("attention.sliding_window_pattern")
    if layers == EXAONE4_WINDOWED_LAYERS:
        window = window or EXAONE4_WINDOW
        pattern = EXAONE4_PATTERN if pattern is None else pattern
    if not window:
        kinds = ["full_attention"] * layers
    elif isinstance(pattern, (list, tuple)):
        if len(pattern) != layers:
            raise UserError(f"the GGUF's exaone4.attention.sliding_window_pattern has {len(pattern)} entries for "
                            f"{layers} layers; the file is damaged")
        kinds = ["sliding_attention" if windowed else "full_attention" for windowed in pattern]
    elif pattern:  # a period N, as llama.cpp's set_swa_pattern takes it: layer i full where (i + 1) % N == 0
        kinds = ["full_attention" if (i + 1) % int(pattern) == 0 else "sliding_attention" for i in range(layers)]
    else:
        raise UserError("the GGUF's exaone4 file gives attention.sliding_window but no "
                        "attention.sliding_window_pattern: which layers use the window is not given; import the "
                        "model's Hugging Face folder")
    return {**common, "sliding_window": window or None, "layer_types": kinds}


def _cohere_config(key, config: dict) -> None:
    """A command-r or cohere2 file's own keys into `config`: the LayerNorm's epsilon, the logit scale (0 or absent:
    none), and cohere2's layers (llama.cpp's llama_model_cohere2: attention.sliding_window_pattern a period, 4 where
    absent, or one bool a layer, true where windowed)."""
    config.update(layer_norm_eps=key("attention.layer_norm_epsilon", 1e-5), logit_scale=key("logit_scale") or 1.0,
                  use_qk_norm=False)
    if config["model_type"] != "cohere2":
        return
    n, pattern = config["num_hidden_layers"], key("attention.sliding_window_pattern", 4)
    windowed = list(pattern) if isinstance(pattern, (list, tuple)) else [(i + 1) % int(pattern) != 0 for i in range(n)]
    if len(windowed) != n or not config["sliding_window"]:
        raise UserError(f"the GGUF's cohere2 file gives {len(windowed)} sliding_window_pattern entries for {n} layers "
                        f"or no attention.sliding_window; redline reads one a layer and a window")
    config["layer_types"] = ["sliding_attention" if w else "full_attention" for w in windowed]


def _gpt_oss_config(fields: dict, key, vocab: int, tied: bool, tensor_names: set[str]) -> dict:
    """A gpt_oss config.json for a gpt-oss GGUF, read as llama.cpp's loader reads one (llama_model's
    LLM_ARCH_OPENAI_MOE): heads key_length wide, the experts expert_feed_forward_length wide, the window on the even
    layers and full attention on the odd ones (its set_swa_pattern(2), whatever the file), the SwiGLU clamped at
    GPT_OSS_SWIGLU_LIMIT, the router's top k softmaxed among themselves. YaRN from the file's keys, with GPT-OSS's
    own unrounded band (truncate false, which no llama.cpp key records) unless redline's key says otherwise."""
    width, heads, layers = key("embedding_length"), key("attention.head_count"), key("block_count")
    window, experts = key("attention.sliding_window"), key("expert_count")
    if not window or not experts or not key("expert_used_count"):
        raise UserError("the GGUF's gpt-oss file gives no attention.sliding_window, expert_count or "
                        "expert_used_count, each of which llama.cpp's gpt-oss reads; the file is incomplete")
    head_dim = key("attention.key_length") or width // heads
    if key("rope.dimension_count", head_dim) != head_dim or key("attention.value_length", head_dim) != head_dim:
        raise UserError(f"the GGUF's gpt-oss file gives key_length {head_dim}, value_length "
                        f"{key('attention.value_length')} and rope.dimension_count {key('rope.dimension_count')}: "
                        f"GPT-OSS, as llama.cpp's gpt-oss, rotates whole heads of one width")
    base = float(key("rope.freq_base", 150000.0))
    scaling = key("rope.scaling.type")
    if scaling == "yarn":
        rope = {"truncate": False, **_yarn_scaling(fields, key), "rope_theta": base}
    elif scaling in (None, "none"):
        rope = {"rope_type": "default", "rope_theta": base}
    else:
        raise UserError(f"the GGUF's RoPE scaling {scaling!r} on a gpt-oss model: GPT-OSS has YaRN or none")
    return {"model_type": "gpt_oss", "vocab_size": vocab, "hidden_size": width,
            "intermediate_size": key("expert_feed_forward_length") or key("feed_forward_length"),
            "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": key("attention.head_count_kv") or heads, "head_dim": head_dim,
            "max_position_embeddings": key("context_length", 131072),
            "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-5), "rope_parameters": rope,
            "tie_word_embeddings": tied, "attention_bias": "blk.0.attn_q.bias" in tensor_names,
            "sliding_window": window,
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
            "num_local_experts": experts, "num_experts_per_tok": key("expert_used_count"),
            "swiglu_limit": GPT_OSS_SWIGLU_LIMIT, "hidden_act": "silu"}


def _lfm2_config(key, vocab: int, tied: bool, moe: bool = False) -> dict:
    """An lfm2 config.json for an lfm2 GGUF: llama.cpp takes a layer with no kv heads (attention.head_count_kv, one
    entry a layer) for a convolution layer (its llama_model_lfm2::load_arch_hparams), and feed_forward_length is the
    MLP's width as it is (transformers' GGUF loader reads the file so too)."""
    heads = key("attention.head_count")
    kv = key("attention.head_count_kv") or heads
    n = key("block_count")
    kv = list(kv) if isinstance(kv, (list, tuple)) else [kv] * n
    if len(kv) != n or key("attention.sliding_window"):
        raise UserError(f"the GGUF's lfm2 file gives {len(kv)} attention.head_count_kv entries for {n} layers or a "
                        f"sliding window; redline reads one entry a layer and no window")
    if key("rope.scaling.type") not in (None, "none"):
        raise UserError(f"the GGUF's RoPE scaling {key('rope.scaling.type')!r} on an lfm2 model is not read by "
                        f"redline; import the model's Hugging Face folder")
    config = {"model_type": "lfm2", "vocab_size": vocab, "hidden_size": key("embedding_length"),
              "intermediate_size": key("feed_forward_length"), "block_auto_adjust_ff_dim": False,
              "num_hidden_layers": n, "num_attention_heads": heads, "num_key_value_heads": max(kv),
              "layer_types": ["full_attention" if h else "conv" for h in kv],
              "max_position_embeddings": key("context_length", 128000),
              "norm_eps": key("attention.layer_norm_rms_epsilon", 1e-5), "rope_theta": key("rope.freq_base", 1e6),
              "conv_L_cache": key("shortconv.l_cache", 3), "tie_word_embeddings": tied}
    if not moe:
        return config
    # llama_model_lfm2moe: sigmoid gating (expert_gating_func 2), the chosen scores rescaled (its build_moe_ffn's
    # norm_w), the routing bias exp_probs_b on every expert layer, no weight scale read
    if key("expert_gating_func") != 2:
        raise UserError(f"the GGUF's lfm2moe expert_gating_func is {key('expert_gating_func')}, not 2 (sigmoid); "
                        f"redline reads LFM2-MoE's sigmoid routing")
    return {**config, "model_type": "lfm2_moe", "moe_intermediate_size": key("expert_feed_forward_length"),
            "num_dense_layers": key("leading_dense_block_count", 0), "num_experts": key("expert_count"),
            "num_experts_per_tok": key("expert_used_count"), "use_expert_bias": True, "norm_topk_prob": True,
            "routed_scaling_factor": 1.0}


def _minimax_m2_config(key, vocab: int, tied: bool) -> dict:
    """A minimax_m2 config.json for a minimax-m2 GGUF, as llama.cpp's llama_model_minimax_m2 reads the file: heads
    attention.key_length wide, RoPE (NeoX pairs) on rope.dimension_count of them, the experts
    expert_feed_forward_length wide (else feed_forward_length, which its converter writes alike), sigmoid gating with
    the chosen scores rescaled (its build_moe_ffn's norm_w) and the routing bias exp_probs_b on every layer."""
    heads = key("attention.head_count")
    head_dim = key("attention.key_length") or key("embedding_length") // heads
    if key("expert_gating_func", 2) != 2:
        raise UserError(f"the GGUF's minimax-m2 expert_gating_func is {key('expert_gating_func')}, not 2 (sigmoid); "
                        f"redline reads MiniMax-M2's sigmoid routing")
    if key("rope.scaling.type") not in (None, "none") or key("attention.sliding_window"):
        raise UserError("the GGUF's minimax-m2 file has RoPE scaling or a sliding window, which redline does not read "
                        "from it; import the model's Hugging Face folder")
    return {"model_type": "minimax_m2", "vocab_size": vocab, "hidden_size": key("embedding_length"),
            "intermediate_size": key("expert_feed_forward_length") or key("feed_forward_length"),
            "num_hidden_layers": key("block_count"), "num_attention_heads": heads,
            "num_key_value_heads": key("attention.head_count_kv") or heads, "head_dim": head_dim,
            "max_position_embeddings": key("context_length", 196608),
            "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-6), "tie_word_embeddings": tied,
            "rope_parameters": {"rope_type": "default", "rope_theta": key("rope.freq_base", 1e4),
                                "partial_rotary_factor": key("rope.dimension_count", head_dim) / head_dim},
            "num_local_experts": key("expert_count"), "num_experts_per_tok": key("expert_used_count")}


def _phi3_config(key, vocab: int, tied: bool, rope_factors: dict) -> dict:
    """A phi3 config.json for a phi3 GGUF, from the keys llama.cpp's converter writes for Phi-3 (its Phi3MiniModel):
    the context as max_position_embeddings, RoPE on rope.dimension_count of each head (heads n_embd / n_head wide),
    the window; with LongRoPE, the factor tensors, the original context and the tables' attention factor."""
    width, heads = key("embedding_length"), key("attention.head_count")
    head_dim = width // heads
    context = key("context_length", 4096)
    config = {"model_type": "phi3", "vocab_size": vocab, "hidden_size": width,
              "intermediate_size": key("feed_forward_length"), "num_hidden_layers": key("block_count"),
              "num_attention_heads": heads, "num_key_value_heads": key("attention.head_count_kv") or heads,
              "max_position_embeddings": context, "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-5),
              "rope_theta": key("rope.freq_base", 10000.0), "tie_word_embeddings": tied,
              "partial_rotary_factor": key("rope.dimension_count", head_dim) / head_dim,
              "sliding_window": key("attention.sliding_window") or None}
    if rope_factors:
        original = key("rope.scaling.original_context_length")
        if "short" not in rope_factors or not original:
            raise UserError("the GGUF's phi3 LongRoPE gives no rope_factors_short tensor or "
                            "rope.scaling.original_context_length; import the model's Hugging Face folder")
        short = rope_factors["short"].tolist()
        config["original_max_position_embeddings"] = int(original)
        config["rope_scaling"] = {"rope_type": "longrope", "short_factor": short,
                                  "long_factor": rope_factors.get("long", rope_factors["short"]).tolist(),
                                  "factor": context / original}
        if key("rope.scaling.attn_factor") is not None:
            config["rope_scaling"]["attention_factor"] = float(key("rope.scaling.attn_factor"))
    return config


def _gemma2_config(fields: dict, key, common: dict) -> dict:
    """A gemma2 config.json for a gemma2 GGUF, as llama.cpp's converter writes one: the common keys, the two caps
    (attn_logit_softcapping, final_logit_softcapping) and the window; llama.cpp alternates windowed and full layers
    (the first windowed) and scales the scores by head_dim ** -0.5 where the heads are n_embd / n_head wide (gemma-2-2b
    and 9b; query_pre_attn_scalar equals their head width), which redline's own key overrides where it wrote the
    file. What the file leaves open (27b's scale, RoPE scaling) is a UserError."""
    if (common.get("rope_scaling") or {"rope_type": "default"})["rope_type"] != "default":
        raise UserError("the GGUF's gemma2 file scales its RoPE, which Gemma 2 does not; import the model's Hugging "
                        "Face folder")
    heads, head_dim, width = common["num_attention_heads"], common["head_dim"], common["hidden_size"]
    query_scalar = fields.get(QUERY_SCALAR_KEY)
    if query_scalar is None:
        if head_dim * heads != width:  # llama.cpp's rule for 27b (n_embd / n_head) and no key in the file
            raise UserError(f"the GGUF's gemma2 heads are {head_dim} wide, not n_embd / n_head, and it gives no "
                            f"query_pre_attn_scalar ({QUERY_SCALAR_KEY}); import the model's Hugging Face folder")
        query_scalar = head_dim
    window = common.get("sliding_window")
    kinds = ["sliding_attention" if window and i % 2 == 0 else "full_attention"
             for i in range(common["num_hidden_layers"])]
    return {**{k: v for k, v in common.items() if k != "rope_scaling"}, "model_type": "gemma2",
            "hidden_activation": "gelu_pytorch_tanh", "layer_types": kinds, "query_pre_attn_scalar": int(query_scalar),
            "attn_logit_softcapping": key("attn_logit_softcapping"),
            "final_logit_softcapping": key("final_logit_softcapping")}


# redline's own GGUF keys for what a gemma3 file from llama.cpp's converter leaves implicit. The keys that converter
# writes for Gemma3Model are the ones transformers' GGUF_CONFIG_MAPPING["gemma3"] reads (its note cites
# convert_hf_to_gguf.py): context, widths, block count, heads, key_length = head_dim, rms epsilon, rope.freq_base
# and attention.sliding_window; plus rope.scaling.* (linear) where the config scales. Nothing there gives the window
# pattern, the windowed layers' RoPE base or query_pre_attn_scalar. Written on export, preferred on import, so a
# Gemma 3 of any layout redline expresses comes back exactly.
QUERY_SCALAR_KEY = "redline.attention.query_pre_attn_scalar"  # uint32: scores scaled by it ** -0.5
WINDOW_PATTERN_KEY = "redline.attention.sliding_window_pattern"  # uint32: layer i full where (i + 1) % it == 0
# (0: no layer full)
LOCAL_ROPE_KEY = "redline.rope.freq_base_local"  # float32: the windowed layers' own unscaled RoPE base
# the values a reader without those keys takes: Gemma3TextConfig's defaults (sliding_window_pattern 6,
# rope_local_base_freq 10000, query_pre_attn_scalar 256), which transformers' GGUF loader keeps since no key maps onto
# them; the published 270m/1b/4b/12b models have exactly these, with head_dim 256 = query_pre_attn_scalar (llama.cpp
# scales the scores of those models by head_dim ** -0.5, so the two readers agree on them)
GEMMA3_PATTERN, GEMMA3_LOCAL_THETA, GEMMA3_QUERY_SCALAR = 6, 10_000.0, 256


def _gemma3_config(fields: dict, key, common: dict) -> dict:
    """A gemma3_text config.json for a gemma3 GGUF: the common keys (block count, widths, heads, key_length as
    head_dim, rms epsilon, rope.freq_base for the full layers, attention.sliding_window), redline's keys for the
    rest where it wrote them, else the gguf package's generic keys where a writer gave them (rope.freq_base_swa;
    attention.sliding_window_pattern, which its writer takes as an int period or one bool per layer, read as llama.cpp
    reads it: true for a windowed layer), else the defaults above. What redline cannot express, or could only guess,
    is a UserError."""
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if key(name) is not None:  # Gemma 3 has neither; a writer that adds one means a model redline cannot check
            raise UserError(f"the GGUF's gemma3.{name} = {key(name)}: Gemma 3 soft-caps no logits and redline "
                            f"does not read a cap from a gemma3 GGUF; import the model's Hugging Face folder")
    scaling = common.get("rope_scaling") or {"rope_type": "default"}
    if scaling["rope_type"] not in ("default", "linear"):  # llama.cpp's converter writes Gemma 3's linear alone
        raise UserError(f"the GGUF's gemma3 RoPE scaling {scaling['rope_type']!r}: redline reads linear scaling "
                        f"or none for Gemma 3 (the scaling its published models use)")
    layers, head_dim = common["num_hidden_layers"], common["head_dim"]
    query_scalar = fields.get(QUERY_SCALAR_KEY)
    if query_scalar is None:
        if head_dim != GEMMA3_QUERY_SCALAR:  # gemma-3-27b's is 168 with head_dim 128: no key in the file says so
            raise UserError(f"the GGUF's gemma3 heads are {head_dim} wide and it gives no query_pre_attn_scalar "
                            f"({QUERY_SCALAR_KEY}); redline takes Gemma 3's {GEMMA3_QUERY_SCALAR} only where it "
                            f"equals the head width, as in gemma-3-270m/1b/4b/12b: import the model's Hugging Face "
                            f"folder")
        query_scalar = GEMMA3_QUERY_SCALAR
    pattern = fields.get(WINDOW_PATTERN_KEY, key("attention.sliding_window_pattern", GEMMA3_PATTERN))
    if isinstance(pattern, (list, tuple)):
        kinds = ["sliding_attention" if windowed else "full_attention" for windowed in pattern]
    else:
        kinds = ["full_attention" if pattern and (i + 1) % int(pattern) == 0 else "sliding_attention"
                 for i in range(layers)]
    local_theta = fields.get(LOCAL_ROPE_KEY, key("rope.freq_base_swa", GEMMA3_LOCAL_THETA))
    full = {**scaling, "rope_theta": float(key("rope.freq_base", 1_000_000.0))}
    return {**{k: v for k, v in common.items() if k != "rope_scaling" and k != "rope_theta"},
            "model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh", "layer_types": kinds,
            "query_pre_attn_scalar": int(query_scalar),
            "rope_parameters": {"full_attention": full,
                                "sliding_attention": {"rope_type": "default", "rope_theta": float(local_theta)}}}


def _yarn_scaling(fields: dict, key) -> dict:
    """config.json's rope_scaling for a YaRN GGUF: redline's exact parameters where it wrote them, else llama.cpp's
    keys (the keys its converter writes from a Hugging Face config's: factor, original context, beta_fast /
    beta_slow, attention factor), each absent one at transformers' default."""
    stored = fields.get(YARN_ROPE_KEY)
    if stored is not None and len(stored) == 6:
        factor, original, fast, slow, attention, truncate = (float(v) for v in stored)
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": int(original),
                "beta_fast": fast, "beta_slow": slow, "attention_factor": attention, "truncate": bool(truncate)}
    factor, original = key("rope.scaling.factor"), key("rope.scaling.original_context_length")
    if not factor or not original:
        raise UserError("the GGUF's YaRN RoPE scaling gives no rope.scaling.factor or "
                        "rope.scaling.original_context_length; import the model's Hugging Face folder")
    if key("rope.scaling.yarn_log_multiplier"):  # DeepSeek's mscale_all_dim: an attention factor redline's
        # reading of these keys would leave out
        raise UserError("the GGUF's YaRN scaling has a yarn_log_multiplier (DeepSeek-style mscale), which redline "
                        "does not read from GGUF; import the model's Hugging Face folder")
    out = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": int(original)}
    for name, gguf_name in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow"),
                            ("attention_factor", "yarn_attn_factor")):
        if key(f"rope.scaling.{gguf_name}") is not None:
            out[name] = float(key(f"rope.scaling.{gguf_name}"))
    return out


# redline's own GGUF key: Llama 3 RoPE scaling's [factor, low_freq_factor, high_freq_factor, original context], written
# beside llama.cpp's rope_freqs tensor (which holds only its effect) so that redline reads the parameters back exactly
LLAMA3_ROPE_KEY = "redline.rope.llama3"
# and YaRN's [factor, original context, beta_fast, beta_slow, attention factor, truncate] (llama.cpp has no truncate)
YARN_ROPE_KEY = "redline.rope.yarn"
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's (head_dim / 2,) divisors of the RoPE frequencies (Llama 3.1 style)


def write_llama3_rope(writer, cfg: ModelConfig) -> None:
    """LLAMA3_ROPE_KEY for a model with Llama 3 scaling (write_gguf adds the rope_freqs tensor llama.cpp reads)."""
    if cfg.rope_scaling == "llama3":
        writer.add_array(LLAMA3_ROPE_KEY, [cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor,
                                           float(cfg.rope_original_context)])


def llama3_rope_freqs(cfg: ModelConfig) -> torch.Tensor:
    """llama.cpp's rope_freqs for a model with Llama 3 scaling: each frequency's divisor, (head_dim // 2,) fp32."""
    from dataclasses import replace

    from redline.model import rope_frequencies

    return rope_frequencies(replace(cfg, rope_scaling="none")) / rope_frequencies(cfg)


def _llama3_scaling(fields: dict, divisors: torch.Tensor, config: dict) -> dict:
    """config.json's rope_scaling for a GGUF's rope_freqs: redline's exact parameters where it wrote them, else
    Llama 3's recovered from the divisors. The divisors are 1 for short wavelengths, `factor` for long ones and
    1 / ((1 - s) / factor + s) between, with s linear in 1 / wavelength, so factor and that line (two unknowns) fix
    them; the original context is the file's (llama.cpp's rope.scaling.original_context_length) or Llama 3's 8192,
    and low/high_freq_factor follow from the line. The result must give the divisors back, or this is an error."""
    stored = fields.get(LLAMA3_ROPE_KEY)
    arch = fields.get("general.architecture")
    if stored is not None and len(stored) == 4:
        factor, low, high, original = (float(v) for v in stored)
    else:
        d = divisors.double()
        factor = float(d.max())
        D = 2 * d.numel()
        inv_freq = 1.0 / (float(config["rope_theta"]) ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        band = (d > 1 + 1e-4) & (d < factor - 1e-4)
        if factor <= 1 + 1e-6 or int(band.sum()) < 2:
            raise UserError("the GGUF's rope_freqs tensor is not Llama 3 RoPE scaling redline can recover (fewer "
                            "than two frequencies in its blended band); import the model's Hugging Face folder")
        smooth = (1 / d[band] - 1 / factor) / (1 - 1 / factor)  # s = slope * inv_freq + intercept
        x = inv_freq[band]
        slope = float(((x - x.mean()) * (smooth - smooth.mean())).sum() / ((x - x.mean()) ** 2).sum())
        intercept = float(smooth.mean() - slope * x.mean())
        original = float(fields.get(f"{arch}.rope.scaling.original_context_length") or 8192)
        width = original / (2 * math.pi * slope)  # high_freq_factor - low_freq_factor
        low = -intercept * width
        high, low = round(low + width, 6), round(low, 6)
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
               "original_max_position_embeddings": int(round(original))}
    cfg = ModelConfig(n_embd=config["num_attention_heads"] * config["head_dim"], n_head=config["num_attention_heads"],
                      head_size=config["head_dim"], rope_theta=float(config["rope_theta"]), rope_scaling="llama3",
                      rope_factor=factor, rope_low_freq_factor=low, rope_high_freq_factor=high,
                      rope_original_context=int(round(original)))
    got = llama3_rope_freqs(cfg)
    if got.shape != divisors.shape or not torch.allclose(got, divisors.float(), rtol=1e-4, atol=1e-5):
        raise UserError("the GGUF's rope_freqs tensor is not Llama 3 RoPE scaling (its divisors do not follow that "
                        "rule); redline cannot express it: import the model's Hugging Face folder")
    return scaling


def _dequantized(path: Path, t) -> torch.Tensor:
    """One GGUF tensor as fp32 in the file's layout (torch's shape = the GGUF shape reversed); a type the gguf package
    cannot dequantize is a one-line UserError."""
    gguf = require_gguf()
    try:
        values = gguf.dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        raise UserError(f"{path}: tensor {t.name} is {t.tensor_type.name}, a type the gguf package cannot "
                        f"dequantize; use a file quantized otherwise (Q8_0, Q4_K_M, F16, ...)") from None
    shape = tuple(int(n) for n in reversed(t.shape.tolist()))
    return torch.from_numpy(np.array(values, dtype=np.float32)).reshape(shape)


def _tensor_reader(path: Path, reader, arch: str, config: dict):
    """(HF name -> GGUF tensor, function reading one as an fp32 torch tensor in Hugging Face's layout)."""
    by_hf, unknown = {}, []
    for t in reader.tensors:
        if t.name == ROPE_FREQS or t.name in ROPE_FACTORS.values():  # read into the config, not weights
            continue
        hf = _hf_name(t.name, arch)
        (unknown.append(t.name) if hf is None else by_hf.__setitem__(hf, t))
    if unknown:
        raise UserError(f"{path}: tensors {', '.join(unknown[:3])} have no place in a {arch} model redline builds")

    def read(hf_name: str) -> torch.Tensor:
        t = by_hf[hf_name]
        w = _dequantized(path, t)
        kind = t.name.split(".")[-2]
        if arch in PERMUTED and kind in ("attn_q", "attn_k"):
            heads = config["num_attention_heads"] if kind == "attn_q" else config["num_key_value_heads"]
            w = interleave_rope_rows(w, heads, inverse=True)
        if arch in GEMMAS and kind.endswith("norm"):  # stored as the scale 1 + weight
            w = w - 1
        if kind == "ffn_gate_inp_shexp":  # (C,) in the file, a Linear's (1, C) in Hugging Face's
            w = w.reshape(1, -1)
        if t.name.endswith("shortconv.conv.weight"):  # LFM2's kernel: (C, L) in the file, (C, 1, L) in Hugging Face's
            w = w[:, None]
        if arch == "gpt2" and kind in _CONV1D and w.dim() == 2:
            w = w.t().contiguous()
        if arch in HEAD_GROUPED_QKV and kind == "attn_qkv":
            w = _neox_qkv(w, config["num_attention_heads"] if arch == "gptneox" else config["n_head"], to_file=False)
        return w

    return by_hf, read


def _gpt_oss_source(names: set[str], read, n_layer: int):
    """(names, read) of a gpt-oss file's tensors under transformers' GPT-OSS names, as gpt_oss.to_redline takes
    them: each layer's experts, split in the file (ffn_gate_exps / ffn_up_exps (E, F, C), or the fused
    ffn_gate_up_exps [gate; up] (E, 2F, C)) and stored as rows, back in transformers' layout: gate_up_proj (E, C, 2F)
    with gate and up interleaved (gate at even columns), gate_up_proj_bias (E, 2F) alike, down_proj (E, F, C),
    down_proj_bias (E, C). A layer missing a part keeps its file names, which the conversion then names."""

    def interleaved(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:  # (E, F, ...) twice -> (E, 2F, ...)
        return torch.stack([gate, up], dim=2).flatten(1, 2)

    def fused(x: str, kind: str) -> tuple[torch.Tensor, torch.Tensor]:  # (gate, up) of a layer's weight or bias
        if f"{x}gate_up_proj.{kind}" in names:
            return read(f"{x}gate_up_proj.{kind}").chunk(2, dim=1)
        return read(f"{x}gate_proj.{kind}"), read(f"{x}up_proj.{kind}")

    out, derived = set(names), {}
    for i in range(n_layer):
        x = f"model.layers.{i}.mlp.experts."
        split = [f"{x}{p}.{k}" for p in ("gate_proj", "up_proj") for k in ("weight", "bias")]
        parts = [f"{x}gate_up_proj.weight", f"{x}gate_up_proj.bias"] if f"{x}gate_up_proj.weight" in names else split
        parts += [f"{x}down_proj.weight", f"{x}down_proj.bias"]
        if not set(parts) <= names:
            continue
        out -= set(parts)
        derived[f"{x}gate_up_proj"] = lambda x=x: interleaved(*fused(x, "weight")).transpose(1, 2)
        derived[f"{x}gate_up_proj_bias"] = lambda x=x: interleaved(*fused(x, "bias"))
        derived[f"{x}down_proj"] = lambda x=x: read(f"{x}down_proj.weight").transpose(1, 2)
        derived[f"{x}down_proj_bias"] = lambda x=x: read(f"{x}down_proj.bias")
    return out | set(derived), lambda name: derived[name]() if name in derived else read(name)


def _recurrent_source(path: Path, reader, arch: str, config: dict):
    """(Hugging Face names, read) of a granitehybrid or qwen35 file (gguf_recurrent.hf_tensors)."""
    from redline.interop.gguf_recurrent import hf_tensors

    by_name = {t.name: t for t in reader.tensors}

    def read_file(name: str) -> torch.Tensor:  # the file's layout
        return _dequantized(path, by_name[name])

    try:
        return hf_tensors(set(by_name), read_file, arch, config)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


def _named_module(arch: str):
    """The module that maps one of NAMED_ARCHES: check, feed_forward_length, write_metadata, file_tensors, hf_config,
    hf_tensors."""
    from redline.interop import (gguf_apertus, gguf_deepseek2, gguf_dots1, gguf_ernie, gguf_gemma4, gguf_glm4,
                                 gguf_glm4moe, gguf_hunyuan_moe, gguf_jais2, gguf_llama4)

    return {"gemma4": gguf_gemma4, "deepseek2": gguf_deepseek2, "glm4moe": gguf_glm4moe, "llama4": gguf_llama4,
            "glm4": gguf_glm4, "ernie4_5-moe": gguf_ernie, "hunyuan-moe": gguf_hunyuan_moe,
            "apertus": gguf_apertus, "dots1": gguf_dots1, "jais2": gguf_jais2}[arch]


def _named_source(path: Path, reader, arch: str, config: dict, fields: dict):
    """(transformers names, read) of a file of one of NAMED_ARCHES (its module's hf_tensors; with the file's fields
    for KEYED_TENSOR_ARCHES)."""
    by_name = {t.name: t for t in reader.tensors}
    keyed = (fields,) if arch in KEYED_TENSOR_ARCHES else ()
    try:
        return _named_module(arch).hf_tensors(set(by_name), lambda name: _dequantized(path, by_name[name]), config,
                                              *keyed)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


def read_gguf(path: str | Path, tokenizer: str | None = None) -> ImportedModel:
    """A GGUF file in redline's layout, tensors dequantized to fp32, tokenizer and chat template from its
    metadata (or `tokenizer`, a tokenizer.json path or folder)."""
    gguf = require_gguf()
    from redline.interop.gguf_vocab import tokenizer_from_gguf
    from redline.tokenizer import BPETokenizer, load_tokenizer

    path = Path(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # the reader's own errors for a bad magic number or a truncated file
        raise UserError(f"cannot read {path} as GGUF ({type(e).__name__}: {e}); the file is damaged or not GGUF") \
            from None
    fields = _fields(reader)
    arch = fields.get("general.architecture")
    if arch not in ARCHES:
        raise UserError(f"{path}: GGUF architecture {arch!r} is not supported; redline reads {', '.join(ARCHES)}")
    rope_freqs = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
    if rope_freqs is not None:
        rope_freqs = torch.from_numpy(np.array(gguf.dequantize(rope_freqs.data, rope_freqs.tensor_type),
                                               dtype=np.float32)).reshape(-1)
    rope_factors = {kind: torch.from_numpy(np.array(gguf.dequantize(t.data, t.tensor_type), dtype=np.float32))
                    .reshape(-1) for kind, name in ROPE_FACTORS.items() for t in reader.tensors if t.name == name}
    if arch in RECURRENT_ARCHES:
        from redline.interop import gguf_recurrent

        config = gguf_recurrent.hf_config(fields, arch, {t.name for t in reader.tensors})
    elif arch in ROPE_FREQS_ARCHES:
        config = _named_module(arch).hf_config(fields, *arch_keys(fields, arch), {t.name for t in reader.tensors},
                                               rope_freqs)
    elif arch in NAMED_ARCHES:
        config = _named_module(arch).hf_config(*arch_keys(fields, arch), {t.name for t in reader.tensors})
    else:
        config = _hf_config(fields, arch, {t.name for t in reader.tensors}, rope_freqs, rope_factors)
    if tokenizer:
        tok = load_tokenizer(tokenizer)
    else:
        hf_tokenizer, tok_config = tokenizer_from_gguf(fields)
        tok = BPETokenizer(hf_tokenizer, spec="", hf_config=tok_config)
    stops = [fields.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    stops = list(dict.fromkeys(i for i in stops if i is not None))
    if stops:
        tok.stop_ids = stops
    family = family_for(config, str(path))
    if arch in RECURRENT_ARCHES:
        names, read = _recurrent_source(path, reader, arch, config)
    elif arch in NAMED_ARCHES:
        names, read = _named_source(path, reader, arch, config, fields)
    else:
        by_hf, read = _tensor_reader(path, reader, arch, config)
        names = set(by_hf)
    if arch == "gpt-oss":
        names, read = _gpt_oss_source(names, read, config["num_hidden_layers"])
    cfg, state = convert_source(TensorSource(names, read, str(path)), config, family)
    kinds = {t.tensor_type.name for t in reader.tensors if len(t.shape) > 1}
    source_dtype = torch.bfloat16 if kinds == {"BF16"} else torch.float32 if kinds == {"F32"} else None
    return ImportedModel(cfg=cfg, state=state, tokenizer=tok, family=family.name, source=str(path),
                         source_dtype=source_dtype, generation_config={"eos_token_id": tok.stop_ids})


# ----------------------------------------------------------------------------------------------------
# writing


def _gemma3_windowed(cfg: ModelConfig) -> bool:
    """Whether any layer of a Gemma 3 model attends through the sliding window."""
    return any(cfg.layer_window(i) for i in range(cfg.n_layer))


def _check_gemma3(cfg: ModelConfig) -> None:
    """A UserError for a Gemma 3 model a gemma3 GGUF cannot hold."""
    from redline.interop.gemma3 import _rope_spec, query_pre_attn_scalar

    _rope_spec(cfg)  # linear RoPE scaling or none, as for a Hugging Face folder
    query_pre_attn_scalar(cfg)
    if cfg.logit_softcap:
        raise UserError(f"model.logit_softcap={cfg.logit_softcap}: Gemma 3 caps no logits and a gemma3 GGUF has no "
                        f"cap key that transformers' GGUF loader maps; export with --format hf")
    if _gemma3_windowed(cfg) and not cfg.rope_local_theta and cfg.rope_scaling != "none":
        raise UserError("model.rope_scaling with windowed layers and no model.rope_local_theta: those layers would "
                        "rotate with the scaled RoPE, and a gemma3 GGUF gives them an unscaled base of their own; "
                        "set model.rope_local_theta or export with --format hf")


def _gemma3_unread(cfg: ModelConfig) -> list[str]:
    """What a Gemma 3 model has where a gemma3 file gives other readers nothing to read (only redline's own keys),
    each with what transformers' GGUF loader assumes instead (Gemma3TextConfig's defaults, GEMMA3_*)."""
    from redline.interop.gemma3 import query_pre_attn_scalar

    out = []
    if not _gemma3_windowed(cfg):  # no window key: the loader keeps Gemma3TextConfig's default window
        out.append("no sliding window (assumed: 4096 tokens on five layers in six)")
    if _gemma3_windowed(cfg) and cfg.sliding_window_pattern != GEMMA3_PATTERN:
        out.append(f"sliding_window_pattern {cfg.sliding_window_pattern} (assumed: {GEMMA3_PATTERN})")
    if _gemma3_windowed(cfg) and (cfg.rope_local_theta or cfg.rope_theta) != GEMMA3_LOCAL_THETA:
        out.append(f"the windowed layers' RoPE base {cfg.rope_local_theta or cfg.rope_theta:g} (assumed: "
                   f"{GEMMA3_LOCAL_THETA:g})")
    scalar = query_pre_attn_scalar(cfg)
    if scalar != GEMMA3_QUERY_SCALAR or cfg.head_dim != GEMMA3_QUERY_SCALAR:
        out.append(f"query_pre_attn_scalar {scalar} with heads {cfg.head_dim} wide (assumed: "
                   f"{GEMMA3_QUERY_SCALAR}, the head width of the published models)")
    return out


def _check_exaone4(cfg: ModelConfig) -> None:
    """A UserError for an EXAONE 4.0 model llama.cpp's exaone4 does not run as itself: its loader takes o_proj as
    (n_embd, n_embd), and its window is EXAONE-4.0-32B's alone (EXAONE4_*: 64 layers, three windowed to one full; it
    takes the period from a scalar sliding_window_pattern, 4 where there is none, not from the per-layer array its
    converter writes)."""
    if cfg.head_dim * cfg.n_head != cfg.n_embd:
        raise UserError("model.head_size apart from n_embd / n_head: llama.cpp's exaone4 takes heads n_embd / n_head "
                        "wide; export with --format hf")
    if cfg.rope_scaling not in ("none", "linear", "yarn", "llama3"):
        raise UserError(f"model.rope_scaling={cfg.rope_scaling} on an EXAONE 4.0 model: llama.cpp's exaone4 reads "
                        f"none, linear, YaRN or Llama 3 scaling; export with --format hf")
    windowed = cfg.n_layer == EXAONE4_WINDOWED_LAYERS
    if cfg.sliding_window and (not windowed or cfg.sliding_window_pattern != EXAONE4_PATTERN):
        raise UserError(f"model.sliding_window with {cfg.n_layer} layers and model.sliding_window_pattern="
                        f"{cfg.sliding_window_pattern}: llama.cpp's exaone4 windows only "
                        f"{EXAONE4_WINDOWED_LAYERS}-layer models, three layers in {EXAONE4_PATTERN} (EXAONE-4.0-32B's "
                        f"layout); export with --format hf")
    if windowed and not cfg.sliding_window:
        raise UserError(f"no model.sliding_window on a {EXAONE4_WINDOWED_LAYERS}-layer EXAONE 4.0 model: llama.cpp's "
                        f"exaone4 gives every model that deep EXAONE-4.0-32B's window; export with --format hf")


def _check_starcoder_mpt(family: Family, cfg: ModelConfig) -> str:
    """starcoder or mpt for a GPTBigCode or MPT model (after the family's check_exportable), or a UserError for what
    llama.cpp's architecture would run as another model: both scale the scores by head_dim ** -0.5 (no key changes
    it), starcoder files are multi-query (the converter writes head_count_kv 1 and c_attn's rows as they are, which
    are [q; k; v] only then) and its graph computes the tanh GELU."""
    if family.name == "gpt_bigcode":
        if cfg.kv_heads != 1 or cfg.n_head == 1:
            raise UserError("multi-head attention on a GPTBigCode model (multi_query=false): llama.cpp's converter "
                            "writes every starcoder file as multi-query (head_count_kv 1, c_attn's rows unchanged); "
                            "export with --format hf")
        if cfg.gelu_approximate != "tanh":
            raise UserError("model.gelu_approximate=none on a GPTBigCode model: llama.cpp's starcoder computes the "
                            "tanh GELU and a starcoder GGUF has no key for another; export with --format hf")
    if cfg.attn_scale:
        raise UserError(f"model.attn_scale={cfg.attn_scale} on a {family.architecture} model: llama.cpp's "
                        f"{'starcoder' if family.name == 'gpt_bigcode' else 'mpt'} scales the scores by "
                        f"head_dim ** -0.5 and no GGUF key changes it; export with --format hf")
    return "starcoder" if family.name == "gpt_bigcode" else "mpt"


def _moe_arch(family: Family, cfg: ModelConfig) -> str:
    """The llama.cpp architecture of a mixture of experts, or a UserError for what it would run otherwise."""
    arch = {v: k for k, v in MOE_ARCHES.items()}[family.name]
    if cfg.moe_norm_topk != MOE_RESCALES[arch]:
        raise UserError(f"model.moe_norm_topk={cfg.moe_norm_topk} on a {family.architecture}: llama.cpp's {arch} "
                        f"{'rescales' if MOE_RESCALES[arch] else 'does not rescale'} each token's top-k router "
                        f"probabilities; export with --format hf")
    if arch == "qwen2moe" and (not cfg.moe_shared_hidden or cfg.tie_embeddings):
        raise UserError("a Qwen2-MoE model without a shared expert or with a tied head: llama.cpp's qwen2moe loads "
                        "both a shared expert and an output matrix; export with --format hf")
    if arch in ("llama", "olmoe", "granitemoe") and cfg.head_dim * cfg.n_head != cfg.n_embd:
        raise UserError(f"model.head_size apart from n_embd / n_head: llama.cpp's {arch} takes heads n_embd / n_head "
                        f"wide; export with --format hf")
    if cfg.sliding_window:
        raise UserError(f"model.sliding_window on a mixture of experts: llama.cpp's {arch} has no window; export "
                        f"with --format hf")
    if cfg.rope_scaling == "llama3" and arch != "llama":
        raise UserError(f"model.rope_scaling=llama3 with a {arch} architecture: llama.cpp applies Llama 3 RoPE "
                        f"scaling (its rope_freqs tensor) to llama files only; export with --format hf")
    return arch


def _check_gpt_oss(cfg: ModelConfig) -> None:
    """A UserError for a GPT-OSS model llama.cpp's gpt-oss would run as another (gpt_oss.check_exportable has
    refused what no GPT-OSS has): its loader windows the even layers and attends fully on the odd ones
    (set_swa_pattern(2)), clamps the SwiGLU at GPT_OSS_SWIGLU_LIMIT and loads an output matrix of its own, none of
    which a GGUF key changes."""
    windows = [cfg.layer_window(i) for i in range(cfg.n_layer)]
    if not cfg.sliding_window or windows != [cfg.sliding_window if i % 2 == 0 else 0 for i in range(cfg.n_layer)]:
        raise UserError(f"a GPT-OSS model with windows {windows} on its layers: llama.cpp's gpt-oss windows the even "
                        f"layers and attends fully on the odd ones, a layout no GGUF key changes; export with "
                        f"--format hf")
    if cfg.swiglu_limit != GPT_OSS_SWIGLU_LIMIT:
        raise UserError(f"model.swiglu_limit={cfg.swiglu_limit:g}: llama.cpp's gpt-oss clamps its SwiGLU at "
                        f"{GPT_OSS_SWIGLU_LIMIT:g}, a constant no GGUF key changes; export with --format hf")
    if cfg.tie_embeddings:
        raise UserError("model.tie_embeddings on a GPT-OSS model: llama.cpp's gpt-oss loads an output matrix of its "
                        "own; export with --format hf")


def _gpt_oss_file_experts(tensors: dict, state, cfg: ModelConfig) -> dict:
    """transformers-named GPT-OSS tensors (gpt_oss.to_hf) -> the names _GPT_OSS_NAMES gives llama.cpp's, as its
    converter writes them: each layer's experts from redline's state, fc's [gate; up] halves (gate_up_proj with its
    interleaving undone) as gate_proj / up_proj (E, F, C) with their (E, F) biases, proj as down_proj (E, C, F) with
    its (E, C) bias (zeros where the model has none); zero q/k/v/o biases where the model has none, since llama.cpp's
    loader requires every one."""
    widths = {"q": cfg.n_head * cfg.head_dim, "k": cfg.kv_heads * cfg.head_dim, "v": cfg.kv_heads * cfg.head_dim,
              "o": cfg.n_embd}
    out = {}
    for name, t in tensors.items():
        if m := re.match(r"model\.layers\.(\d+)\.mlp\.experts\.", name):  # transformers' layout, replaced
            if name.endswith(".gate_up_proj"):  # the layer's first expert tensor: its experts in the file's layout
                out.update(_file_experts(state, m[0], f"blocks.{m[1]}.mlp."))
            continue
        out[name] = t
        if m := re.match(r"(model\.layers\.\d+\.self_attn\.)([qkvo])_proj\.weight$", name):
            out.setdefault(f"{m[1]}{m[2]}_proj.bias", t.new_zeros(widths[m[2]]))
    return out


def _file_experts(state, x: str, r: str) -> dict:
    """One layer's experts (redline prefix r) under names x + gate_proj / up_proj / down_proj .weight / .bias."""
    fc, proj = state[r + "fc"], state[r + "proj"]  # (E, 2F, C), (E, C, F)
    fc_bias = state.get(r + "fc_bias", fc.new_zeros(fc.shape[:2]))
    out = dict(zip([x + "gate_proj.weight", x + "up_proj.weight"], fc.chunk(2, dim=1)))
    out.update(zip([x + "gate_proj.bias", x + "up_proj.bias"], fc_bias.chunk(2, dim=1)))
    out[x + "down_proj.weight"] = proj
    out[x + "down_proj.bias"] = state.get(r + "proj_bias", proj.new_zeros(proj.shape[:2]))
    return out


def stack_experts(tensors: dict, state, cfg: ModelConfig, arch: str) -> dict:
    """Hugging Face-named tensors of a mixture of experts (one tensor per expert, or GraniteMoE's stacked pairs) ->
    the names _LLAMA_NAMES gives llama.cpp's: the router as mlp.gate, each layer's experts stacked as
    mlp.experts.gate_proj / up_proj (E, F, C) and down_proj (E, C, F), from redline's state; shared experts as
    they are. arch lfm2moe: the same under feed_forward (LFM2-MoE's names), with its routing bias, on the expert
    layers only; arch minimax-m2: the routing bias as mlp.e_score_correction_bias (zeros where the model has none:
    llama.cpp's minimax-m2 loads one on every layer)."""
    moe = re.compile(r"\.(block_sparse_moe\.|(mlp|feed_forward)\.experts\.|(mlp|feed_forward)\.gate\.weight$|"
                     r"feed_forward\.expert_bias$)")
    out = {k: v for k, v in tensors.items() if not moe.search(k)}
    lfm2 = arch == "lfm2moe"  # LFM2-MoE's feed_forward names
    for i in range(cfg.n_layer):
        p, r = f"model.layers.{i}.{'feed_forward' if lfm2 else 'mlp'}.", f"blocks.{i}.mlp."
        if r + "router.weight" not in state:  # a leading dense layer (model.moe_dense_layers)
            continue
        if lfm2 or arch == "minimax-m2":  # a routing bias on every expert layer: zeros where the model has none
            bias = state.get(r + "expert_bias")
            bias = bias if bias is not None else state[r + "router.weight"].new_zeros(cfg.moe_experts)
            out[p + ("expert_bias" if lfm2 else "e_score_correction_bias")] = bias
        out[p + "gate.weight"] = state[r + "router.weight"]
        out[p + "experts.gate_proj.weight"], out[p + "experts.up_proj.weight"] = state[r + "fc"].chunk(2, dim=1)
        out[p + "experts.down_proj.weight"] = state[r + "proj"]
    return out


# families redline writes no GGUF for: (their name, why)
NOT_WRITTEN = {"opt": ("OPT", "llama.cpp has no OPT architecture"),
               "diffllama": ("DiffLlama", "llama.cpp has no differential attention"),
               "doge": ("Doge", "llama.cpp has no dynamic mask attention"),
               "dory": ("Dory", "no writer here for nGPT layers (L2-normed streams interpolated toward, queries "
                                "scaled per channel) or a section of layers run several times"),
               "xlstm": ("xLSTM", "llama.cpp has no xLSTM architecture (mLSTM matrix memories)"),
               "rwkv": ("RWKV-4", "llama.cpp has RWKV-6 and RWKV-7 architectures (rwkv6, rwkv7), not RWKV-4's time "
                                  "and channel mixing"),
               "recurrent_gemma": ("RecurrentGemma", "no writer here for llama.cpp's recurrent-gemma layout "
                                                     "(RG-LRU layers beside local attention)"),
               "bitnet": ("BitNet", "no writer here for llama.cpp's bitnet layout (sub-norms, ternary weights as "
                                    "TQ1_0/TQ2_0 with their scales)"),
               "gpt_neo": ("GPT-Neo", "no GGUF architecture here with its local layers and unscaled scores"),
               # gguf's MODEL_TENSORS[GPTJ] names tensors, but llama.cpp's converter registers no GPTJForCausalLM
               # (nor CodeGen) and its gptj is an architecture name with no hyperparameters, tensors or graph loaded
               # (llama_model_rope_type even gives it no RoPE): a file would have no reader to be checked against
               "gptj": ("GPT-J", "llama.cpp's converter writes no GPT-J and its gptj architecture loads and runs "
                                 "nothing (no tensors, no graph, no RoPE)"),
               "vaultgemma": ("VaultGemma", "llama.cpp's gemma2 has norms on the sublayers' outputs, which VaultGemma "
                                            "has not"),
               "granite_swa": ("Granite SWA", "llama.cpp has no architecture with its sinks, per-layer windows and "
                                              "per-layer RoPE bases"),
               "granitemoe_swa": ("GraniteMoeSWA", "llama.cpp has no architecture with Granite SWA's sinks, "
                                                   "per-layer windows and per-layer RoPE bases"),
               "lfm3": ("LFM3", "no writer here for its gated heads, output norms and per-kind RoPE"),
                "falcon": ("Falcon", "no writer here for llama.cpp's falcon layout (KV-grouped query_key_value, "
                                     "two norms a block)"),
                "jamba": ("Jamba", "no writer here for llama.cpp's jamba layout (Mamba-1 beside attention, experts on "
                                   "some layers)"),
                "glm": ("GLM", "no writer here for llama.cpp's chatglm layout (interleaved partial RoPE)"),
                "gemma3n_text": ("Gemma 3n", "no writer here for llama.cpp's gemma3n layout (AltUp streams, LAuReL, "
                                             "per-layer inputs, shared KV layers, activation sparsity)"),
                "ministral": ("Ministral", "GGUF's llama architecture has no windowed layers"),
                "exaone_moe": ("EXAONE-MoE", "no writer here for llama.cpp's exaone-moe layout (sigmoid routing with a "
                                             "bias, shared experts, dense first layers)"),
                "flex_olmo": ("FlexOlmo", "no writer here for experts in OLMo 2's output-norm block (llama.cpp's "
                                          "olmoe has pre-norm blocks)"),
                "cohere2_moe": ("Cohere2 MoE", "no writer here for experts in Cohere2's parallel block"),
                "cohere_compass_text": ("Cohere Compass", "llama.cpp's command-r and cohere2 rotate by one base, "
                                                          "not by a base per layer type"),
                "afmoe": ("AFMoE", "no writer here for llama.cpp's afmoe layout (gated heads, sandwich norms, NoPE "
                                   "full layers, sigmoid routing with a bias)"),
                "mellum": ("Mellum", "no writer here for experts with windowed layers, a RoPE base of their own "
                                     "and dense layers among them (GGUF's qwen3moe has none of them)"),
                "flint": ("Flint", "no writer here for Qwen3-MoE's attention with sinks, NoPE full layers and "
                                   "sigmoid-scored experts beside a shared one"),
                "kolibri1": ("Kolibri-1", "no writer here for experts chosen by logits plus a bias in GLM-4's "
                                          "sandwich blocks"),
                "laguna": ("Laguna", "no writer here for its softplus head gates and per-type partial RoPE"),
                "jetmoe": ("JetMoE", "llama.cpp has no JetMoE architecture (routed attention heads)"),
                "zamba": ("Zamba", "llama.cpp has no Zamba architecture (Mamba-1 heads, a shared attention block)"),
                "bailing_hybrid": ("Ling 3", "no writer here for Kimi Delta Attention's layers (decays per key "
                                             "channel) beside gated latent attention"),
                "minimax": ("MiniMax", "llama.cpp has no lightning attention (linear attention with a fixed decay a "
                                       "head) nor residuals from the normed inputs"),
                "kimi_linear": ("Kimi Linear", "no writer here for Kimi Delta Attention's layers (decays per key "
                                               "channel, low-rank gates) beside NoPE latent attention"),
                "phimoe": ("PhiMoE", "llama.cpp's phimoe weights the top 2 experts by a softmax rescaled over the "
                                     "two, not SparseMixer's thresholded softmaxes"),
                "dbrx": ("DBRX", "no writer here for llama.cpp's dbrx layout (clamped fused q/k/v, experts)"),
                "minicpm3": ("MiniCPM3", "no writer here for llama.cpp's minicpm3 layout (latent attention, µP "
                                         "scalars, LongRoPE)"),
                "axk1": ("A.X-K1", "llama.cpp's deepseek2 has no norm on the experts' output"),
                "axk2": ("A.X-K2", "llama.cpp's deepseek2 has no gated norms or query gate"),
                "longcat_flash": ("LongCat-Flash", "llama.cpp has no shortcut-connected MoE or zero-computation "
                                                   "experts"),
                "mimo_v2_flash": ("MiMo-V2-Flash", "no writer here for its windowed layers' own KV heads and sinks"),
                "mistral4": ("Mistral 4", "llama.cpp's deepseek2 routes no softmax scores within groups"),
                "dots3_note_text": ("dots.3 Note", "llama.cpp's deepseek2 has no norm on the RoPE key part, gated "
                                                   "heads or windowed layers"),
                "hyperclovax": ("HyperCLOVA X", "no writer here for its norms on the sublayers' outputs with Granite's "
                                                "scalars"),
                "persimmon": ("Persimmon", "no writer here for llama.cpp's persimmon layout (LayerNorm QK-norm, "
                                           "partial RoPE)"),
                "solar_open": ("Solar Open", "no writer here for its layout (DeepSeek-V3's routing: sigmoid scores, "
                                             "a routing bias, groups, shared experts)"),
                "sarvam_moe": ("Sarvam MoE", "no writer here for GLM-4-MoE's experts under attention that "
                                             "rotates whole heads"),
                "openai-gpt": ("GPT-1", "llama.cpp has no architecture with post-norm blocks"),
                "biogpt": ("BioGPT", "llama.cpp has no BioGPT architecture"),
                "lara_mini": ("Lara Mini", "llama.cpp has no architecture with gated delta nets beside windowed "
                                           "and NoPE attention"),
                "zamba2": ("Zamba2", "llama.cpp has no architecture with transformer blocks shared between layers, "
                                     "each call with its own adapters"),
                "qwen4_exp_text": ("Qwen4-Exp", "llama.cpp has no architecture with hyper-connected residual streams "
                                                "or a QSA indexer"),
                "modernbert-decoder": ("ModernBERT-Decoder", "llama.cpp has no ModernBERT-Decoder architecture: "
                                                             "its modern-bert is the bidirectional encoder"),
                "deepseek_v4": ("DeepSeek-V4", "llama.cpp has no deepseek4 architecture (the gguf package's "
                                               "MODEL_ARCH_NAMES list deepseek and deepseek2 alone)"),
                "zaya": ("ZAYA", "llama.cpp has no ZAYA architecture (convolutional attention, an MLP router carried "
                                 "from layer to layer)")}
# families written as an architecture whose files redline writes without RoPE scaling: (architecture, "a Name")
UNSCALED_ROPE = {"lfm2": ("lfm2", "an LFM2"), "stablelm": ("stablelm", "a StableLM"),
                 "gpt_neox": ("gptneox", "a GPT-NeoX")}


def _arch(family: Family, cfg: ModelConfig) -> str:
    if cfg.head_vocab:  # llama.cpp sizes the output tensor by the vocabulary, as it does token_embd
        raise UserError(f"model.head_vocab={cfg.head_vocab}: llama.cpp's output tensor has a row for every token of "
                        f"the vocabulary ({cfg.vocab_size}), not a head narrower than it; export with --format hf")
    if family.name in NOT_WRITTEN:
        name, why = NOT_WRITTEN[family.name]
        raise UserError(f"{name} models are not written as GGUF by redline ({why}); export with --format hf")
    from redline.interop.gguf_recurrent import recurrent_arch

    if arch := recurrent_arch(family, cfg):
        return arch
    if family.name in ("cohere", "cohere2"):
        if not cfg.tie_embeddings or cfg.rope_scaling != "none":
            raise UserError(f"an untied head or model.rope_scaling on a {family.architecture}: llama.cpp's "
                            f"{'command-r' if family.name == 'cohere' else 'cohere2'} ties the head to token_embd and "
                            f"reads no RoPE scaling here; export with --format hf")
        return "command-r" if family.name == "cohere" else "cohere2"
    if family.name == "lfm2_moe":
        if not cfg.moe_norm_topk or cfg.moe_scale != 1.0 or cfg.rope_scaling != "none":
            raise UserError("model.moe_norm_topk=false, model.moe_scale or model.rope_scaling on an LFM2-MoE model: "
                            "llama.cpp's lfm2moe rescales the chosen scores and reads no weight scale or RoPE "
                            "scaling; export with --format hf")
        return "lfm2moe"
    if family.name in UNSCALED_ROPE:
        arch, name = UNSCALED_ROPE[family.name]
        if cfg.rope_scaling != "none":
            raise UserError(f"model.rope_scaling={cfg.rope_scaling} on {name} model: redline writes {arch} GGUF files "
                            f"without RoPE scaling; export with --format hf")
        return arch
    if family.name in MOE_ARCHES.values():
        return _moe_arch(family, cfg)
    if family.name == "minimax_m2":  # minimax_m2.check_exportable (export_family) has refused what MiniMax-M2 lacks
        if cfg.rope_scaling != "none":
            raise UserError(f"model.rope_scaling={cfg.rope_scaling} on a MiniMax-M2 model: redline writes minimax-m2 "
                            f"GGUF files without RoPE scaling; export with --format hf")
        return "minimax-m2"
    if family.name == "gpt_oss":
        _check_gpt_oss(cfg)
        return "gpt-oss"
    if family.name == "gemma3_text":
        _check_gemma3(cfg)
        return "gemma3"
    named = {"deepseek_v3": "deepseek2", "deepseek_v2": "deepseek2", "glm4_moe_lite": "deepseek2",
             "gemma4_text": "gemma4", "gemma4": "gemma4", "glm4_moe": "glm4moe", "llama4_text": "llama4",
             "llama4": "llama4", "glm4": "glm4", "ernie4_5_moe": "ernie4_5-moe",
             "hunyuan_v1_moe": "hunyuan-moe", "apertus": "apertus", "dots1": "dots1", "jais2": "jais2"}.get(family.name)
    if named:  # llama.cpp's deepseek2, gemma4, glm4moe, llama4, glm4, ernie4_5-moe, hunyuan-moe, apertus, dots1, jais2
        _named_module(named).check(cfg)
        return named
    if family.name == "phi3":
        if cfg.head_dim * cfg.n_head != cfg.n_embd:
            raise UserError("model.head_size apart from n_embd / n_head: llama.cpp's phi3 takes heads n_embd / n_head "
                            "wide; export with --format hf")
        return "phi3"
    if family.name == "starcoder2":
        if cfg.sliding_window or not cfg.bias or cfg.rope_scaling != "none" or cfg.gelu_approximate != "tanh":
            raise UserError("model.sliding_window, model.rope_scaling, model.gelu_approximate=none or no Linear biases "
                            "on a StarCoder2 model: llama.cpp's starcoder2 has none of these (no window, no RoPE "
                            "scaling, the tanh GELU, biases on every layer); export with --format hf")
        return "starcoder2"
    if family.name in ("gpt_bigcode", "mpt"):
        return _check_starcoder_mpt(family, cfg)
    if family.name == "bloom":  # bloom.check_exportable (export_family) has refused what BLOOM lacks
        return "bloom"
    if family.name == "gemma":  # llama.cpp's gemma: Llama's tensor names unpermuted, norms as 1 + weight
        return "gemma"
    if family.name == "exaone4":
        _check_exaone4(cfg)
        return "exaone4"
    if family.name == "hunyuan_v1_dense":
        # the converter's TextModel keys: none, linear or YaRN scaling; llama.cpp's hunyuan-dense loads no rope_freqs
        if cfg.rope_scaling not in ("none", "linear", "yarn"):
            raise UserError(f"model.rope_scaling={cfg.rope_scaling} on a Hunyuan dense model: llama.cpp's "
                            f"hunyuan-dense reads none, linear or YaRN scaling; export with --format hf")
        return "hunyuan-dense"
    if family.name == "phi":
        if cfg.rope_scaling != "none" or cfg.gelu_approximate != "tanh":
            raise UserError("model.rope_scaling or model.gelu_approximate=none on a Phi model: llama.cpp's phi2 has "
                            "neither (no RoPE scaling, the tanh GELU); export with --format hf")
        return "phi2"
    if family.name == "gemma2":
        from redline.interop.gemma3 import query_pre_attn_scalar

        query_pre_attn_scalar(cfg)
        if any(cfg.layer_window(i) != (cfg.sliding_window if i % 2 == 0 else 0) for i in range(cfg.n_layer)):
            raise UserError("a Gemma 2 model whose layers do not alternate windowed and full, the first windowed: "
                            "llama.cpp's gemma2 takes that order; export with --format hf")
        return "gemma2"
    if family.name == "smollm3" and cfg.nope_interval != SMOLLM3_NOPE_INTERVAL:
        raise UserError(f"model.nope_interval={cfg.nope_interval}: llama.cpp's smollm3 leaves RoPE out of every "
                        f"{SMOLLM3_NOPE_INTERVAL}th layer, a step no GGUF key changes; export with --format hf")
    if family.name == "gpt2" and cfg.gelu_approximate != "tanh":
        raise UserError("model.gelu_approximate=none: llama.cpp's gpt2 computes the tanh GELU, and a gpt2 GGUF has no "
                        "key for another; export with --format hf")
    if cfg.sliding_window:
        raise UserError("model.sliding_window: GGUF's llama architecture has no sliding window; export this model "
                        "with --format hf")
    arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "olmo2": "olmo2",
            "smollm3": "smollm3", "granite": "granite", "gpt2": "gpt2", "olmo": "olmo",
            "arcee": "arcee"}.get(family.name)
    if arch is None:
        raise UserError(f"{family.architecture} models are not written as GGUF by redline; export with --format hf")
    if arch in ("granite", "olmo") and cfg.head_dim * cfg.n_head != cfg.n_embd:
        raise UserError(f"model.head_size apart from n_embd / n_head: llama.cpp's {arch} takes heads n_embd / n_head "
                        f"wide; export with --format hf")
    if arch == "olmo2" and cfg.head_dim * cfg.n_head != cfg.n_embd:
        raise UserError("model.head_size apart from n_embd / n_head: llama.cpp's olmo2 takes heads n_embd / n_head "
                        "wide; export with --format hf")
    if arch == "arcee" and (cfg.bias or cfg.has_qkv_bias):  # AFM has none; llama.cpp's arcee loads none
        raise UserError("model.bias or model.qkv_bias on an Arcee model: llama.cpp's arcee loads no biases; export "
                        "with --format hf")
    if arch == "olmo2" and cfg.has_qkv_bias:
        raise UserError("model.qkv_bias: llama.cpp's olmo2 has no attention biases; export with --format hf")
    if cfg.rope_scaling == "llama3" and arch != "llama":
        raise UserError(f"model.rope_scaling=llama3 with a {arch} architecture: llama.cpp applies Llama 3 RoPE "
                        f"scaling (its rope_freqs tensor) to llama files only; export with --format hf")
    return arch


def _metadata(writer, gguf, arch: str, cfg: ModelConfig, dtype: torch.dtype | str) -> None:
    writer.add_name(f"redline {arch}")
    long_context = arch == "phi3" and cfg.rope_scaling == "longrope" and cfg.rope_long_pair_factors
    if arch in RECURRENT_ARCHES:
        from redline.interop.gguf_recurrent import context_length

        writer.add_context_length(context_length(cfg, arch))
    else:
        writer.add_context_length(round(cfg.rope_factor * cfg.rope_original_context) if long_context
                                  else cfg.context_len)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer)
    if arch in RECURRENT_ARCHES:
        from redline.interop.gguf_recurrent import widths

        ffn, heads = widths(cfg, arch)
    elif arch in NAMED_ARCHES:
        ffn, heads = _named_module(arch).feed_forward_length(cfg), cfg.n_head
    else:  # lfm2moe: feed_forward_length is its leading dense layers' width (llama_model_lfm2moe)
        ffn = cfg.moe_dense_hidden or cfg.hidden_dim if arch == "lfm2moe" else cfg.hidden_dim
        heads = cfg.n_head
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_vocab_size(cfg.vocab_size)
    file_type = {torch.float32: gguf.LlamaFileType.ALL_F32, torch.float16: gguf.LlamaFileType.MOSTLY_F16,
                 torch.bfloat16: gguf.LlamaFileType.MOSTLY_BF16,
                 **{q: getattr(gguf.LlamaFileType, f"MOSTLY_{q.upper()}") for q in GGUF_QUANTS}}.get(dtype)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE if dtype == MXFP4 else file_type)
    if arch in RECURRENT_ARCHES:
        from redline.interop.gguf_recurrent import write_metadata

        write_metadata(writer, gguf, arch, cfg)
        return
    if arch in NAMED_ARCHES:
        _named_module(arch).write_metadata(writer, gguf, cfg)
        return
    if arch == "gpt2":
        writer.add_layer_norm_eps(cfg.norm_eps)
        return
    if arch == "starcoder":  # StarCoderModel.set_gguf_parameters' keys: multi-query, LayerNorm's epsilon (its
        # feed_forward_length is 4 * n_embd, every StarCoder's n_inner; redline writes the model's own, which
        # llama.cpp's loader sizes ffn_up / ffn_down by)
        writer.add_head_count_kv(1)
        writer.add_layer_norm_eps(cfg.norm_eps)
        return
    if arch == "mpt":  # MPTModel.set_gguf_parameters' keys for an MPT with ALiBi (no kv_n_heads, no clip_qkv); it
        # writes the epsilon as 1e-5, MPT's LayerNorm default, redline the model's own
        writer.add_layer_norm_eps(cfg.norm_eps)
        writer.add_max_alibi_bias(MPT_ALIBI_BIAS_MAX)
        return
    if arch == "bloom":  # BloomModel.set_gguf_parameters' keys after the common ones
        writer.add_head_count_kv(cfg.n_head)
        writer.add_layer_norm_eps(cfg.norm_eps)
        return
    if arch in COHERE:  # the keys llama.cpp's llama_model_command_r / cohere2 read
        writer.add_head_count_kv(cfg.kv_heads)
        writer.add_layer_norm_eps(cfg.norm_eps)
        writer.add_rope_freq_base(cfg.rope_theta)
        writer.add_logit_scale(1 / cfg.logit_divisor if cfg.logit_divisor else 1.0)
        if arch == "cohere2":
            writer.add_sliding_window(cfg.sliding_window)
            writer.add_uint32(f"{arch}.attention.sliding_window_pattern", cfg.sliding_window_pattern)
        return
    if arch in ("lfm2", "lfm2moe"):  # the keys llama.cpp's converter writes: no kv heads on a convolution layer
        writer.add_head_count_kv([0 if i in cfg.conv_layers else cfg.kv_heads for i in range(cfg.n_layer)])
        writer.add_layer_norm_rms_eps(cfg.norm_eps)
        writer.add_rope_freq_base(cfg.rope_theta)
        writer.add_shortconv_l_cache(cfg.conv_kernel)
        if arch == "lfm2moe":  # llama_model_lfm2moe's keys
            writer.add_expert_count(cfg.moe_experts)
            writer.add_expert_used_count(cfg.moe_top_k)
            writer.add_leading_dense_block_count(cfg.moe_dense_layers)
            writer.add_expert_feed_forward_length(cfg.hidden_dim)
            writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        return
    if arch == "olmo":  # the keys llama_model_olmo reads: LayerNorm's eps (its norms have no weights), no clamp
        writer.add_head_count_kv(cfg.kv_heads)
        writer.add_layer_norm_eps(cfg.norm_eps)
        writer.add_rope_freq_base(cfg.rope_theta)
        writer.add_rope_dimension_count(cfg.head_dim)
        return
    if arch == "starcoder2":  # the keys llama.cpp's converter writes for StarCoder2 (LayerNorm, GQA, whole heads)
        writer.add_head_count_kv(cfg.kv_heads)
        writer.add_layer_norm_eps(cfg.norm_eps)
        writer.add_rope_freq_base(cfg.rope_theta)
        return
    if arch in ("phi2", "stablelm", "gptneox"):  # LayerNorm and partial RoPE: the keys llama.cpp's converter writes
        # for these models (Phi2Model, StableLMModel, GPTNeoXModel), the base, and gptneox's GELU (NEOX_GELU_KEY)
        if arch != "gptneox":
            writer.add_head_count_kv(cfg.kv_heads)
        writer.add_layer_norm_eps(cfg.norm_eps)
        writer.add_rope_dimension_count(cfg.rope_dims or cfg.head_dim)
        writer.add_rope_freq_base(cfg.rope_theta)
        if arch != "phi2":
            writer.add_parallel_residual(cfg.parallel_residual)
        if arch == "gptneox":
            writer.add_string(NEOX_GELU_KEY, cfg.gelu_approximate)
        return
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    if arch == "gpt-oss":  # the keys llama.cpp's converter writes for GptOssModel (its TextModel's, and two more)
        writer.add_expert_count(cfg.moe_experts)
        writer.add_expert_used_count(cfg.moe_top_k)
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_expert_feed_forward_length(cfg.hidden_dim)
        if cfg.rope_scaling == "yarn":
            _yarn_metadata(writer, gguf, cfg)
        return
    if arch == "phi3":  # the keys llama.cpp's converter writes for Phi-3; the factors go in as tensors (write_gguf)
        writer.add_rope_dimension_count(cfg.rope_dims or cfg.head_dim)
        if cfg.sliding_window:
            writer.add_sliding_window(cfg.sliding_window)
        if cfg.rope_scaling == "longrope":
            writer.add_rope_scaling_attn_factors(rope_attention_factor(cfg))
            writer.add_rope_scaling_orig_ctx_len(cfg.rope_original_context)
        return
    writer.add_rope_dimension_count(cfg.rope_dims or cfg.head_dim)  # minimax-m2's partial RoPE (no other here)
    if cfg.head_dim * cfg.n_head != cfg.n_embd or arch in ("qwen3", "qwen3moe", "exaone4", "hunyuan-dense", "minimax-m2",
                                                           *GEMMAS):
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    if arch == "gemma3":
        _gemma3_metadata(writer, cfg)
    if arch == "exaone4" and cfg.sliding_window:  # as llama.cpp's converter writes layer_types (Exaone4Model)
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_sliding_window_pattern([bool(cfg.layer_window(i)) for i in range(cfg.n_layer)])
    if arch == "gemma2":  # the keys llama.cpp's converter writes, and redline's scale (llama.cpp's rule above)
        from redline.interop.gemma3 import query_pre_attn_scalar

        writer.add_uint32(QUERY_SCALAR_KEY, query_pre_attn_scalar(cfg))
        writer.add_sliding_window(cfg.sliding_window)
        if cfg.attn_softcap:
            writer.add_attn_logit_softcapping(cfg.attn_softcap)
        if cfg.logit_softcap:
            writer.add_final_logit_softcapping(cfg.logit_softcap)
    if cfg.moe_experts:  # the keys llama.cpp's converters write for a mixture of experts
        writer.add_expert_count(cfg.moe_experts)
        writer.add_expert_used_count(cfg.moe_top_k)
        if arch in ("qwen2moe", "qwen3moe", "minimax-m2"):  # their experts' width apart from feed_forward_length
            writer.add_expert_feed_forward_length(cfg.hidden_dim)
        if arch == "minimax-m2":  # as MiniMaxM2Model.set_gguf_parameters writes a sigmoid scoring_func
            writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        if cfg.moe_shared_hidden:
            writer.add_expert_shared_feed_forward_length(cfg.moe_shared_hidden)
    if arch in ("granite", "granitemoe"):  # every scalar, 1 where the model has none (llama.cpp reads 0 as none)
        writer.add_embedding_scale(cfg.embed_multiplier or 1.0)
        writer.add_residual_scale(cfg.residual_multiplier or 1.0)
        writer.add_logit_scale(cfg.logit_divisor or 1.0)
        writer.add_attention_scale(cfg.attn_scale or cfg.head_dim ** -0.5)
    if cfg.rope_scaling == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(cfg.rope_factor)
    elif cfg.rope_scaling == "llama3":  # llama.cpp reads the rope_freqs tensor (write_gguf); redline these too
        write_llama3_rope(writer, cfg)
    elif cfg.rope_scaling == "yarn":
        _yarn_metadata(writer, gguf, cfg)


def _yarn_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for a Hugging Face YaRN config, and redline's exact parameters
    (YARN_ROPE_KEY: llama.cpp has no key for the attention factor's derivation or for truncate)."""
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(cfg.rope_factor)
    writer.add_rope_scaling_orig_ctx_len(cfg.rope_original_context)
    writer.add_rope_scaling_yarn_beta_fast(cfg.rope_beta_fast)
    writer.add_rope_scaling_yarn_beta_slow(cfg.rope_beta_slow)
    if cfg.rope_attention_factor:
        writer.add_rope_scaling_yarn_attn_factor(cfg.rope_attention_factor)
    writer.add_array(YARN_ROPE_KEY, [cfg.rope_factor, float(cfg.rope_original_context), cfg.rope_beta_fast,
                                     cfg.rope_beta_slow, rope_attention_factor(cfg), float(cfg.rope_truncate)])


def _gemma3_metadata(writer, cfg: ModelConfig) -> None:
    """The window as llama.cpp's converter writes it for Gemma3Model (attention.sliding_window; absent where no layer
    is windowed), and redline's keys for the rest."""
    from redline.interop.gemma3 import query_pre_attn_scalar

    writer.add_uint32(QUERY_SCALAR_KEY, query_pre_attn_scalar(cfg))
    if _gemma3_windowed(cfg):
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_uint32(WINDOW_PATTERN_KEY, cfg.sliding_window_pattern)
        writer.add_float32(LOCAL_ROPE_KEY, cfg.rope_local_theta or cfg.rope_theta)


def _vocab_metadata(writer, tokenizer, vocab_size: int) -> None:
    from redline.interop.gguf_vocab import HF_JSON_KEY, gguf_vocab

    vocab = gguf_vocab(tokenizer, vocab_size)
    writer.add_tokenizer_model(vocab.pop("tokenizer.ggml.model"))
    writer.add_token_list(vocab.pop("tokenizer.ggml.tokens"))
    writer.add_token_types(vocab.pop("tokenizer.ggml.token_type"))
    adders = {"tokenizer.ggml.merges": writer.add_token_merges, "tokenizer.ggml.scores": writer.add_token_scores,
              "tokenizer.ggml.pre": writer.add_tokenizer_pre, "tokenizer.ggml.bos_token_id": writer.add_bos_token_id,
              "tokenizer.ggml.eos_token_id": writer.add_eos_token_id,
              "tokenizer.ggml.eot_token_id": writer.add_eot_token_id,
              "tokenizer.ggml.eom_token_id": writer.add_eom_token_id,
              "tokenizer.ggml.unknown_token_id": writer.add_unk_token_id,
              "tokenizer.ggml.padding_token_id": writer.add_pad_token_id,
              "tokenizer.ggml.add_bos_token": writer.add_add_bos_token,
              "tokenizer.ggml.add_space_prefix": writer.add_add_space_prefix,
              "tokenizer.chat_template": writer.add_chat_template,
              HF_JSON_KEY: lambda text: writer.add_string(HF_JSON_KEY, text)}
    for key, value in vocab.items():
        adders[key](value)


def _tensor_type(gguf, name: str, w: torch.Tensor, dtype: torch.dtype | str, head: bool = False):
    """The GGML type a tensor is stored as for the file's dtype, by the rules llama.cpp's converter and quantizer
    follow: 1-D tensors (norms), biases (GPT-OSS's experts' are (E, F)), a mixture's router (ffn_gate_inp) and learned
    positions in F32; for a block type (GGUF_QUANTS) every other matrix in blocks of 32 along its rows, or F16 where
    its rows are not whole blocks. head: the matrix the logits come from (output.weight, or token_embd.weight in a
    file without one), which llama-quantize keeps at a higher precision than a 4- or 5-bit type (its Q6_K, which the
    gguf package cannot write): Q8_0 here. MXFP4: the experts' matrices in MXFP4 blocks (BF16 where their rows are not
    whole blocks), every other matrix in BF16."""
    from redline.interop.gguf_recurrent import F32_KINDS

    parts = name.split(".")
    if (w.dim() < 2 or name.startswith("position_embd") or name.endswith(".bias")
            or parts[-2] == "ffn_gate_inp" or dtype == torch.float32
            or (parts[0] == "blk" and parts[2] in F32_KINDS)):
        return gguf.GGMLQuantizationType.F32
    if dtype == MXFP4:
        mxfp4 = gguf.GGMLQuantizationType.MXFP4
        experts = name.split(".")[-2] in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps")
        whole = w.shape[-1] % gguf.GGML_QUANT_SIZES[mxfp4][0] == 0
        return mxfp4 if experts and whole else gguf.GGMLQuantizationType.BF16
    if dtype in GGUF_QUANTS:
        qtype = gguf.GGMLQuantizationType[("q8_0" if head else dtype).upper()]
        return qtype if w.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0 else gguf.GGMLQuantizationType.F16
    return {torch.float16: gguf.GGMLQuantizationType.F16, torch.bfloat16: gguf.GGMLQuantizationType.BF16}[dtype]


def require_mxfp4(gguf) -> None:
    """A UserError where this gguf package cannot write llama.cpp's MXFP4 blocks (its quants.MXFP4 class quantizes
    in Python; older packages have no MXFP4 type)."""
    try:
        gguf.quants.quantize(np.zeros((1, 32), dtype=np.float32), gguf.GGMLQuantizationType.MXFP4)
    except (AttributeError, NotImplementedError, gguf.quants.QuantError) as e:
        raise UserError(f"this gguf package ({type(e).__name__}: {e}) cannot write MXFP4 blocks; upgrade it (pip "
                        f"install -U gguf) or give --dtype bf16, fp16, fp32 or q8_0") from None


def _quantize(gguf, values: np.ndarray, qtype) -> np.ndarray:
    """gguf.quants.quantize over the rows of `values` a slice at a time: its MXFP4 compares every weight with all 16
    codes at once (16 floats a weight), too much memory for a whole layer of experts."""
    rows = values.reshape(-1, values.shape[-1])
    step = max(1, (1 << 20) // rows.shape[1])
    parts = [gguf.quants.quantize(rows[i:i + step], qtype) for i in range(0, rows.shape[0], step)]
    return np.concatenate(parts).reshape(*values.shape[:-1], -1)


def write_gguf(out: str | Path, state, cfg: ModelConfig, tokenizer, family: Family, dtype: torch.dtype | str) -> Path:
    """One GGUF file of redline weights `state` (fp32 state dict): matrices in dtype (a torch dtype, one of
    GGUF_QUANTS: llama.cpp's blocks of 32 weights and a scale, or MXFP4 for a GPT-OSS model's experts), 1-D tensors
    and biases in fp32 (_tensor_type)."""
    gguf = require_gguf()
    arch = _arch(family, cfg)
    if dtype == MXFP4 and arch != "gpt-oss":
        raise UserError(f"--dtype mxfp4 writes a GPT-OSS model's experts in llama.cpp's MXFP4, as its converter "
                        f"writes the released checkpoints; this model is written as llama.cpp's {arch}: give fp32, "
                        f"fp16, bf16 or one of {', '.join(GGUF_QUANTS)}")
    if dtype == MXFP4:
        require_mxfp4(gguf)
    out = Path(out)
    if out.exists():
        raise UserError(f"{out} already exists; give a new path for --out (or remove that one)")
    if arch == "gemma3" and (unread := _gemma3_unread(cfg)):
        print(f"redline export: this model's {'; '.join(unread)}: a gemma3 GGUF has no key llama.cpp or "
              f"transformers' GGUF loader reads for these (redline's own keys carry them), so only redline's import "
              f"runs {out} as this model; the published Gemma 3 layouts need no such note", file=sys.stderr)
    if arch in RECURRENT_ARCHES:
        from redline.interop.gguf_recurrent import export_note

        if note := export_note(cfg, arch):
            print(f"redline export: this model's {note}; only redline's import runs {out} as this model",
                  file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{secrets.token_hex(4)}"
    try:
        writer = gguf.GGUFWriter(str(tmp), arch)
        _metadata(writer, gguf, arch, cfg, dtype)
        _vocab_metadata(writer, tokenizer, cfg.vocab_size)
        tensors = family.to_hf(state, cfg)
        if arch in RECURRENT_ARCHES:  # already in the file's names and layout
            from redline.interop.gguf_recurrent import file_tensors

            tensors = file_tensors(tensors, cfg, arch)
        elif arch in NAMED_ARCHES:  # gemma4 from the family's names, the others from redline's state
            tensors = _named_module(arch).file_tensors(tensors if arch == "gemma4" else state, cfg)
            if arch in KEYED_TENSOR_ARCHES:
                _named_module(arch).write_keyed_tensors(writer, state, cfg)
        elif arch == "gpt-oss":
            tensors = _gpt_oss_file_experts(tensors, state, cfg)
        elif cfg.moe_experts:
            tensors = stack_experts(tensors, state, cfg, arch)
        named = arch in (*RECURRENT_ARCHES, *NAMED_ARCHES)  # already in the file's names and layout
        names = {n: n if named else _gguf_name(n, arch) for n in tensors}
        untied = "output.weight" in names.values()
        for hf_name, t in tensors.items():
            name = names[hf_name]
            kind = name.split(".")[-2]
            w = t.float()
            if kind == "ffn_gate_inp_shexp":  # llama.cpp's {n_embd}
                w = w.reshape(-1)
            if name.endswith("shortconv.conv.weight"):  # llama.cpp's {L, n_embd}
                w = w[:, 0]
            if arch == "gpt2" and kind in _CONV1D and w.dim() == 2:
                w = w.t()
            if arch in PERMUTED and kind in ("attn_q", "attn_k"):
                w = interleave_rope_rows(w, cfg.n_head if kind == "attn_q" else cfg.kv_heads, inverse=False)
            if arch in GEMMAS and kind.endswith("norm"):
                w = w + 1
            if arch in HEAD_GROUPED_QKV and kind == "attn_qkv":
                w = _neox_qkv(w, cfg.n_head, to_file=True)
            values = np.ascontiguousarray(w.numpy(), dtype=np.float32)
            head = name == "output.weight" or (name == "token_embd.weight" and not untied)
            qtype = _tensor_type(gguf, name, w, dtype, head)
            if qtype == gguf.GGMLQuantizationType.F32:
                writer.add_tensor(name, values)
            else:
                writer.add_tensor(name, _quantize(gguf, values, qtype), raw_dtype=qtype)
        if cfg.rope_scaling == "llama3":
            writer.add_tensor(ROPE_FREQS, llama3_rope_freqs(cfg).numpy().astype(np.float32))
        if arch == "phi3" and cfg.rope_scaling == "longrope":
            for kind, factors in (("long", cfg.rope_long_pair_factors or cfg.rope_pair_factors),
                                  ("short", cfg.rope_pair_factors)):
                writer.add_tensor(ROPE_FACTORS[kind], np.array(factors, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        fsync_file(tmp)
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"could not write {out} ({e}); nothing was left there") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out
