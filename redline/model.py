"""A decoder-only transformer in which every architectural choice is a config field.

Features (each a field of `ModelConfig`):
- attention: multi-head, grouped-query or multi-query through `n_kv_head`; a head width of its own
  (`head_size`, as Qwen3's); QK-norm (RMSNorm per head, over all heads as OLMo 2's, or Persimmon's LayerNorm); one
  fused QKV projection or separate q/k/v, with or without biases (`qkv_bias`, as Qwen2's); a score scale of its own
  (`attn_scale`, Gemma 3's and Granite's), a soft cap on the scores (`attn_softcap`, Gemma 2's) and a learned
  per-head sink logit in the softmax's denominator (`attn_sinks`, GPT-OSS's; on the windowed layers alone,
  `attn_sinks_windowed`, MiMo-V2-Flash's); a sigmoid gate on each head's output
  or each of its elements (`attn_gate`, LFM3's and Qwen3.5's; a softplus, `attn_gate_fn`, Laguna's); heads routed
  as experts, each token's chosen ones weighted by a router (`attn_gate=routed`, `attn_experts`, JetMoE's mixture of
  attention heads); optional
  sliding-window attention, on every layer or
  interleaved with full-attention layers (`sliding_window_pattern`, Gemma 3's 5:1, or any layers, `window_layers`);
  attention within fixed chunks on the layers that rotate (`attn_chunk`, Llama 4's), whose q and k may be
  normalized without weights after RoPE (`rope_qk_norm`), the other layers' queries scaled up by position
  (`nope_temperature`, Llama 4's attention temperature);
  documents packed into one row attend only within themselves (`doc_ids`); a prefix-LM's prompt attends to itself
  both ways (`prefix_lm`, PaliGemma's: `prefix_len` per row), or stays visible beside the sliding window
  (`reference_window`, Unlimited-OCR's); multi-head latent attention (keys and
  values expanded from a low-rank latent, RoPE on part of each head: `kv_lora_rank`, DeepSeek-V2/V3's MLA; without
  positions, Kimi Linear's; its heads gated, Ling 3's; its shared RoPE key part RMS-normed, dots.3 Note's:
  `latent_key_norm`);
  PyTorch SDPA with a selectable backend
  (auto, cudnn, flash, efficient, math);
- inference: each attention layer takes an optional KV cache object that owns how it attends (the inference
  engine's, redline/inference/cache.py), so the engine runs the model's own blocks;
- positions: RoPE (with `rope_theta`, and Llama 3's, YaRN's, LongRoPE's, linear or proportional (part of each
  head's pairs turning) frequency scaling; the sliding-window layers
  with a base of their own, `rope_local_theta`, as Gemma 3's, on a part of each head of their own,
  `rope_local_dims`, as Laguna's; one layer in N without it, `nope_interval`, as
  SmolLM3's; a base of its own for each layer, 0 for none, `rope_layer_theta`, as Granite SWA's), learned absolute,
  ALiBi (a per-head bias by distance on the scores, BLOOM's and MPT's: `alibi_slopes`), or none; a bias by
  distance mixed for each query token from learned profiles (`rel_bias_dim`, Inkling's relative-position bias);
  keys and values through short causal convolutions (`kv_conv`, Inkling's);
  explicit per-token positions (packed documents restart at 0);
- BitNet b1.58's projections: ternary weights and 8-bit inputs, rounded on the fly or stored ternary (`bitlinear`),
  and an RMSNorm before each output projection (`sub_norms`);
- MLP: GELU, SwiGLU (or GPT-OSS's clamped SwiGLU), GeGLU, ReLU² (gated or not) or xIELU (learned scalars,
  Apertus's), hidden size rounded up to a multiple of 64 (the gated ones at 2/3 of the width
  of the others so the parameter count stays comparable);
- norm: RMSNorm (optionally scaling by 1 + weight, Gemma's) or LayerNorm, on each sublayer's input (pre), each
  residual sum (post), each sublayer's output (OLMo 2's) or both input and output (sandwich, Gemma 3's);
- tied or untied embeddings (optionally scaled by sqrt(n_embd), Gemma's, or by a factor, Granite's), bias on/off,
  dropout, vocabulary padded up to a multiple of 128 (the padded logits are never sampled, and take no part in the
  loss), a prediction head before the output head (`head_transform`: dense, GELU, norm, ModernBERT-Decoder's) and
  layer 0's attention without a norm of its own (`first_norm_free`), logits divided by a factor (Granite's) and
  soft-capped, sublayer outputs scaled before the residual add
  (`residual_multiplier`, Granite's), zero-initialised output projections;
- token mixers besides attention: gated short convolutions (`conv_layers`, LFM2's) and recurrent linear attention
  (`delta_layers`: Qwen3.5's gated delta nets, Kimi Delta Attention's decays per key channel (`delta_decay`: Kimi
  Linear's, Ling 3's) or Granite 4.0's Mamba-2 layers, a state a head, or Mamba-1's selective scan, a state a channel,
  computed chunk by chunk: redline/recurrent.py, its channels in heads with their own dt, B and C where
  `delta_key_heads` > 1, Zamba's; or Griffin's RG-LRU, RecurrentGemma's; or MiniMax's lightning attention, a fixed
  decay a head; or RWKV-4's time mixing, its WKV a channel, with its channel mixing as the MLP (`mlp=rwkv`) and
  transformers' inference-time rescaling as norm epsilons (`rescale_every`); or xLSTM's mLSTM, a matrix memory a head
  under exponential gates);
- Gemma 4's layers: full-attention layers with heads of their own width and count (`global_head_size`,
  `global_kv_head`; windowed layers' own query head count, `window_n_head`, Step 3.5's) and values taken from the
  keys' projection (`global_values_from_keys`), values RMS-normed
  (`v_norm`), the last layers attending over an earlier layer's keys and values (`kv_shared_layers`, their MLPs
  `kv_shared_mlp_hidden` wide), per-layer inputs (`per_layer_embd`), a stored output scale a layer
  (`layer_scalars`), experts beside a dense MLP (`moe_beside_dense`); a norm on the experts' output
  (`moe_post_norm`, A.X-K1's); a bias on the experts' weighted sum (`moe_out_bias`, JetMoE's);
- Inkling's shared experts in the router: taken by every token, their scores normalized with the chosen experts'
  (`moe_sink_experts`);
- LongCat-Flash's mixture: zero-computation experts that return their input (`moe_identity_experts`), and blocks in
  pairs whose first runs the experts beside its MLP and whose second adds their output after its own
  (`moe_shortcut`, the experts' output carried between them as a second stream);
- A.X-K2's gates: norms gated by a low-rank MLP of their output (`norm_gate_rank`), latent attention's heads gated
  from the query latent (`q_latent_gate`);
- Mistral Large 4's latent attention: layers without RoPE (no shared key part), latent caches shared between layers
  (`kv_source_layers`), queries scaled per head by position (`q_position_scale`), learned RoPE frequencies
  (`rope_pair_log_scales`);
- ZAYA's layers: compressed convolutional attention (`cca_kernels`: q and k convolved over time with residual paths,
  half of the values the previous token's, L2 QK-norm with per-key-head scales), residuals and embeddings shifted and
  scaled per channel (`residual_affine`), an MLP router with a skip expert whose state runs from layer to layer in
  the stream (`moe_router_hidden`);
- Gemma 3n's stream: several AltUp streams predicted from one another and corrected around each block
  (`altup_streams`), a low-rank LAuReL branch beside attention (`laurel_rank`), a Gaussian top-k on the first layers'
  MLP gates (`mlp_sparsity`);
- DeepSeek-V4's stream: manifold-constrained hyper-connections (`mhc_streams`), several streams summed into each
  sublayer's input, its output spread back over them while a doubly stochastic matrix mixes them (their plain mean
  before the final norm: `mhc_head_mean`, GLM-5.3-Next's); its attention
  (`shared_kv_attention`: one key head that is the value too, the output turned back by the query's position, a
  grouped output projection, `o_groups`; beside the window, keys pooled from whole windows of tokens,
  `kv_compress_rates`, overlapping on `kv_compress_overlap`), experts chosen by the token's id (`moe_hash_layers`), sqrt(softplus)
  scores (`moe_gating`) and SwiGLU of clamped halves (`mlp=swiglu_clipped`);
- hyper-connections (`hc_streams`, Qwen4-Exp's): several residual streams, each sublayer reading a low-rank gated mix of
  them and writing its output into each with a weight of its own; an attention layer may carry a QSA token indexer
  (`qsa_heads`), which selects every key within its budget and so attends densely up to the context it caps, and a
  delta-net layer per-layer n-gram embeddings (`ngram_layers`, Qwen4-Exp's PLE): each token's last few ids hashed
  into tables whose vectors gate a value into each stream, with a dilated causal convolution of them;
- differential attention (`diff_attention`, DiffLlama's): two maps' outputs subtracted with a learned λ, paired heads
  RMS-normed; a learned bias on each key's scores from its values (`attn_key_bias`, Doge's dynamic mask) and learned
  scales on the residual stream (`residual_scales`, Doge's);
- nGPT's blocks (`ngpt`, Dory's): the stream kept on the unit sphere by weightless L2 norms (`norm=l2`), each
  sublayer's normed output interpolated toward at learned per-channel rates, queries scaled per channel after RoPE;
  a section of layers run several times over the same blocks (`loop_section`, `loop_passes`, Dory's recurrent
  section: each pass cached apart by the engine);
- value embeddings (`value_embeddings`): token-indexed tables added into the attention values of the first and
  last layers (modded-nanogpt's lever), or on any layers, a table each, mixed in through a gate (nanochat's:
  `value_embed_layers`, `value_embed_gate`);
- nanochat's stream scalars: each token's predecessor smeared into its embedding (`smear_gate`), per-layer
  residual and embedding scalars before each block (`layer_lambdas`), the middle block's output subtracted before
  the final norm (`backout`);
- the loss: the head's logits for the whole batch at once, or in chunks of tokens that are never all in memory
  (`ce_chunk_tokens`, redline/chunked_cross_entropy.py);
- parameter counts (with and without embeddings) and FLOPs per token, by the 6N + 12·L·d·T formula and
  counted exactly from the matmul shapes.

Shapes in comments: B batch, T sequence, C = n_embd, H = n_head, KV = n_kv_head, D = head_dim.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from redline.chunked_cross_entropy import chunked_cross_entropy
from redline.errors import UserError
from redline.recurrent import _linear_scan, gated_delta_rule, mlstm, selective_scan, ssd, wkv


@dataclass
class ModelConfig:
    vocab_size: int = 32768
    """Tokenizer vocabulary size (the embedding is padded up to a multiple of `pad_vocab_to`)."""
    context_len: int = 2048
    """Longest sequence the model accepts (RoPE tables and learned positions are sized by it)."""
    n_layer: int = 12
    """Number of transformer blocks."""
    n_embd: int = 768
    """Model width (residual stream size)."""
    n_head: int = 12
    """Number of query heads; must divide n_embd."""
    n_kv_head: int | None = None
    """Number of key/value heads: n_head for multi-head, 1 for multi-query, in between for GQA (must divide n_head). None means n_head."""
    head_size: int | None = None
    """Width of one attention head. None: n_embd // n_head (n_head must divide n_embd). Qwen3, for one, sets it
    apart from the width (n_embd 1024, 16 heads of 128)."""
    qk_norm: bool = False
    """Apply RMSNorm to q and k before attention (QK-norm), over the span qk_norm_scope gives."""
    qk_norm_scope: Literal["head", "all"] = "head"
    """QK-norm per head (one norm of head_dim weights for every head: Qwen3's) or over the whole q projection
    (H·D weights) and the whole k projection (KV·D) before they are split into heads (OLMo 2's)."""
    qk_norm_after_rope: bool = False
    """Per-head QK-norm on the rotated q and k instead of before RoPE (Hunyuan's query_layernorm / key_layernorm)."""
    qk_layernorm: bool = False
    """Per-head QK-norm before RoPE as a LayerNorm with a weight and a bias (at norm_eps) instead of an RMSNorm
    (Persimmon's q_layernorm / k_layernorm); needs qk_norm with qk_norm_scope=head."""
    qk_layernorm_per_head: bool = False
    """With qk_layernorm: each head's LayerNorm has a weight and a bias of its own, (H, D) for q and (KV, D) for k,
    instead of one (D,) pair shared by the heads (Chameleon's q_norm / k_norm)."""
    rope_qk_norm: bool = False
    """RMS-normalize each head's q and k without a weight, in fp32, after RoPE, on the layers that rotate alone
    (Llama 4's use_qk_norm, its Llama4TextL2Norm at norm_eps); independent of qk_norm."""
    fused_qkv: bool = True
    """One fused projection for q, k and v instead of three separate ones."""
    sliding_window: int = 0
    """Attend only to the last this-many tokens (0 = full causal attention)."""
    sliding_window_pattern: int = 0
    """With sliding_window: layer i attends to the whole context where (i + 1) is a multiple of this, to the window
    elsewhere (Gemma 3: 6, five windowed layers to one full; transformers' layer_types); 0 = every layer windowed."""
    window_layers: tuple[int, ...] = ()
    """With sliding_window: the layers that attend to the window, in increasing order, the others to the whole
    context: transformers' layer_types in any order (Granite SWA's, full layers first in each group of four);
    () = as sliding_window_pattern gives."""
    attn_chunk: int = 0
    """The layers that rotate (RoPE) attend only within chunks of this many tokens: query i sees key j <= i where
    i // attn_chunk == j // attn_chunk (Llama 4's attention_chunk_size on its "chunked_attention" layers); the
    layers without RoPE attend to the whole context; 0 = off."""
    nope_temperature: float = 0.0
    """The queries of the layers without RoPE times 1 + this · ln(1 + floor((p + 1) / nope_temperature_floor)) at
    position p, in fp32 (Llama 4's attn_temperature_tuning with its attn_scale; Nakanishi 2025, "Scalable-Softmax Is
    Superior for Attention"): sharper attention far into a long context; 0 = off."""
    nope_temperature_floor: int = 8192
    """nope_temperature: the positions each step of the scale spans (Llama 4's floor_scale)."""
    attn_scale: float = 0.0
    """The attention scores' scale (Gemma 3: query_pre_attn_scalar ** -0.5); 0 = 1 / sqrt(head_dim)."""
    attn_softcap: float = 0.0
    """Cap the attention scores smoothly at ±this (softcap · tanh(scores / softcap), after the scale and before the
    mask: Gemma 2's attn_logit_softcapping); 0 = off. No SDPA kernel takes the cap: such attention runs as flex
    attention with the cap as its score modifier where doc_attention picks flex (training on CUDA), else as plain
    PyTorch products (O(T²) memory a layer)."""
    attn_sinks: bool = False
    """A learned logit per query head (`attn.sinks`, (n_head,), zeros at init) that joins every query's softmax as
    one more key with no value: probabilities exp(s_j) / (exp(sink) + Σ_k exp(s_k)), so a head can attend to nothing
    (GPT-OSS's sinks). Computed as the plain attention's output times sigmoid(lse − sink), lse the logsumexp of the
    query's scaled, masked scores. As attn_softcap, no SDPA kernel takes it: flex attention (which returns the lse)
    where doc_attention picks flex, else plain PyTorch products."""
    attn_sinks_windowed: bool = False
    """With attn_sinks: the sinks on the windowed layers alone (MiMo-V2-Flash's), the full layers' softmax as it is."""
    attn_gate: Literal["none", "head", "element", "routed"] = "none"
    """Gate each query head's attention output before the output projection by sigmoid(g · x) of the attention's
    input x: "head", one learned row a head (attn.gate, (n_head, n_embd), LFM3's g_proj); "element", one a head
    dimension (attn.gate, (n_head·head_dim, n_embd), Qwen3-Next's and Qwen3.5's, which hold it in q_proj); "routed",
    a router's weights on experts of heads (attn_experts); "none"."""
    attn_gate_fn: Literal["sigmoid", "softplus"] = "sigmoid"
    """attn_gate: the gate's function of g · x, sigmoid (LFM3's, Qwen3.5's, AFMoE's) or softplus, computed in fp32
    (Laguna's), which can scale a head's output up as well as down."""
    attn_experts: int = 0
    """attn_gate=routed, JetMoE's mixture of attention heads (MoA): the n_head query heads are this many experts of
    n_kv_head heads each, query head h·attn_experts + e expert e's head over KV head h (so grouped-query attention
    pairs them); a router (attn.gate, (attn_experts, n_embd)) takes the moe_top_k experts of highest logit for each
    token and weights their heads' outputs by the softmax over those logits, the other experts' by 0, before the
    output projection. Every expert's heads are computed and the unchosen ones zeroed: JetMoE's sparse result
    exactly, at attn_experts / moe_top_k times its attention work; 0 = no routing."""
    kv_lora_rank: int = 0
    """Multi-head latent attention (DeepSeek-V2's MLA, DeepSeek-V3's, Kimi K2's) where > 0: keys and values come from
    a latent this wide (kv_a, C -> kv_lora_rank + rope_dims, its first part RMS-normalized and expanded by kv_b into
    each head's unrotated key part and value) and one rotated key part of rope_dims shared by every head; a head's
    q and k are head_size wide (DeepSeek's qk_nope_head_dim + qk_rope_head_dim), RoPE on rope_dims of them, its value
    v_head_dim wide. Needs n_kv_head = n_head (the expanded keys are per head); with pos_emb=none the shared key
    part of rope_dims is left unrotated (Kimi Linear's NoPE latent attention); on a layer without RoPE
    (nope_interval, rope_layer_theta 0) there is no shared key part: kv_a gives the latent alone and kv_b each head's
    whole key (head_size) and its value (Mistral Large 4's NoPE layers); 0 = ordinary attention."""
    q_lora_rank: int = 0
    """Latent attention: q through a low-rank bottleneck this wide (q_a, C -> q_lora_rank, RMS-normalized, then q_b
    to H·head_size: DeepSeek-V3's); 0 = one q projection (DeepSeek-V2-Lite's)."""
    q_latent_gate: bool = False
    """Latent attention with q_lora_rank (A.X-K2's q_gate_proj): q_b reads the query latent after and before its norm,
    [q_a_norm(l); l] (2·q_lora_rank), and gives each head's query and a gate as wide as its value ([q; g] rows,
    H·(head_size + Dv)); each head's output times sigmoid(g) (fp32) before proj."""
    v_head_dim: int = 0
    """Latent attention: the width of a head's value (DeepSeek's v_head_dim, up to head_size); 0 = head_size."""
    q_position_scale: bool = False
    """Latent attention: each head's queries times s_h · ln(p + 1) + b_h at position p, after RoPE, s and b learned
    (H,) a layer (attn.q_pos_scale, attn.q_pos_bias: 0 and 1 at init, no change): Mistral Large 4's softmax scaling
    (transformers' MistralLarge4TextSoftmaxScaling). Needs pos_emb=rope (its ln(p + 1) table rides with RoPE's)."""
    kv_source_layers: tuple[int, ...] = ()
    """Latent attention: for each layer the layer whose cache it attends over, Mistral Large 4's kv_source_layers:
    its own index (it computes its own latent), or an earlier layer that is its own source and rotates as it does,
    whose normalized latent and rotated key part it reads through its own kv_b (it has no kv_a; the inference
    engine's cache holds them once). () = every layer its own."""
    latent_key_norm: bool = False
    """Latent attention: an RMSNorm (rope_dims weights, at latent_norm_eps) on the shared key part before RoPE
    (dots.3 Note's k_rope_only_layernorm); False = that part as kv_a gives it (DeepSeek's)."""
    latent_norm_eps: float = 0.0
    """Latent attention: the epsilon of q_a_norm, kv_a_norm and latent_key_norm's norm; 0 = 1e-6, DeepSeek's
    (LATENT_NORM_EPS; dots.3 Note's is its rms_norm_eps)."""
    pos_emb: Literal["rope", "learned", "alibi", "none"] = "rope"
    """Position information: rotary (RoPE), a learned absolute table, ALiBi, or none. alibi (Press et al. 2022,
    "Train Short, Test Long"; BLOOM's and MPT's): no position table; head h adds -m_h·(i - j) to the score of query
    position i for key position j, m_h from alibi_slopes. It runs as SDPA with a float additive mask of
    (B or 1, H, T, T) (no flash kernel: the memory-efficient or math one), the inference engine's matmul decode
    path adding the bias by slot distance; the Triton decode kernel and fused decode block refuse it."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    rope_local_theta: float = 0.0
    """The RoPE base of the sliding-window layers, without rope_scaling (Gemma 3's rope_local_base_freq, 10000, where
    its full layers take rope_theta with the scaling); 0 = the same RoPE as the full layers."""
    rope_local_dims: int = 0
    """With rope_local_theta: RoPE on the first this-many of each head's dimensions on the sliding-window layers,
    where rope_dims gives the full layers' (Laguna's partial_rotary_factor per layer type: half of each full layer's
    head, all of a windowed one's); 0 = rope_dims."""
    rope_scaling: Literal["none", "linear", "llama3", "yarn", "longrope", "proportional"] = "none"
    """RoPE frequency scaling for contexts beyond the trained one: linear divides every frequency by rope_factor;
    llama3 divides the low frequencies only and blends the middle band (Llama 3.1's rule); yarn does the same with
    its band set by rotation counts and scales the cos/sin tables by rope_attention_factor (YaRN); longrope divides
    each pair's frequency by its own factor (rope_pair_factors) and scales the tables (Phi-3's LongRoPE);
    proportional turns only the first rope_proportion of the pairs, divided by rope_factor, and leaves the others
    still (frequency 0; transformers' "proportional" RoPE, LFM3's full layers')."""
    rope_factor: float = 1.0
    """linear, llama3 and yarn scaling: the factor frequencies are divided by; longrope: the extended context over
    rope_original_context (Phi-3's max_position_embeddings / original_max_position_embeddings), which sets the
    tables' default factor."""
    rope_low_freq_factor: float = 1.0
    """llama3 scaling: wavelengths above rope_original_context / this are scaled in full."""
    rope_high_freq_factor: float = 4.0
    """llama3 scaling: wavelengths below rope_original_context / this are left as they are."""
    rope_original_context: int = 8192
    """llama3, yarn and longrope scaling: the context length the model was first trained at (with longrope: a
    context_len past it takes rope_long_pair_factors for every position, as transformers does for a sequence that
    long and llama.cpp for such a context)."""
    rope_beta_fast: float = 32.0
    """yarn scaling: frequencies that turn more than this many times over rope_original_context are kept."""
    rope_beta_slow: float = 1.0
    """yarn scaling: frequencies that turn fewer times than this are divided by rope_factor in full."""
    rope_attention_factor: float = 0.0
    """yarn and longrope scaling: the factor on the cos/sin tables (0: YaRN's 0.1 ln(rope_factor) + 1, LongRoPE's
    sqrt(1 + ln(rope_factor) / ln(rope_original_context)))."""
    rope_pair_factors: tuple[float, ...] = ()
    """longrope scaling: each rotating dimension pair's frequency divided by its factor (Phi-3's short_factor; one per
    pair, (rope_dims or head_dim) / 2 of them), for a context_len up to rope_original_context."""
    rope_long_pair_factors: tuple[float, ...] = ()
    """longrope scaling: the factors for a context_len past rope_original_context (Phi-3's long_factor), up to
    rope_factor times it."""
    rope_proportion: float = 1.0
    """proportional scaling: the share of each head's dimension pairs (first half, second half, spanning the whole
    head) that turn, at their unscaled frequencies base^(-2i / head_dim) over rope_factor; the rest keep frequency 0.
    Unlike rope_dims, which rotates the first rope_dims dimensions as pairs among themselves."""
    rope_truncate: bool = True
    """yarn scaling: round the band's ends out to whole dimensions (YaRN's reference code does)."""
    rope_pair_log_scales: tuple[float, ...] = ()
    """RoPE's frequency of pair i times exp(this[i]), after rope_scaling, one a rotated pair (rope_dims / 2, else
    head_size / 2): Mistral Large 4's LeRoPE (its learned rotary_emb.alpha, a constant here, not trained); () = none."""
    rope_dims: int = 0
    """RoPE on the first rope_dims of each head's width, the rest left as they are (GPT-NeoX's and Pythia's
    rotary_pct, Phi's partial_rotary_factor); 0: the whole head. Latent attention: its shared key part's width."""
    nope_interval: int = 0
    """Layer i takes no RoPE where (i + 1) is a multiple of this (its attention position-free, "NoPE": SmolLM3's
    no_rope_layers, one layer in 4); 0 = RoPE on every layer."""
    rope_unscaled_theta: float = 0.0
    """With rope_layer_theta and rope_scaling: the layers of this base turn by it without the scaling, the others
    with it (DeepSeek-V4's sliding layers' plain RoPE beside its compressed layers' YaRN); 0 = every table scaled."""
    rope_layer_theta: tuple[float, ...] = ()
    """Each layer's RoPE base, 0 for a layer without RoPE (Granite SWA's layer_rope_theta): one table a distinct
    base, each with rope_scaling, as transformers builds them; () = rope_theta for every layer (with
    rope_local_theta and nope_interval)."""
    mlp: Literal["gelu", "swiglu", "swiglu_clamped", "swiglu_clipped", "geglu", "relu2", "relu2_glu", "relu",
                 "xielu", "rwkv"] = "swiglu"
    """MLP kind: GELU (GPT-2), SwiGLU, clamped SwiGLU (GPT-OSS's: gate clamped above at swiglu_limit, up to
    ±swiglu_limit, (up + 1) · gate · sigmoid(1.702 · gate)), SwiGLU of the same clamped halves (DeepSeek-V4's
    swiglu_limit: silu(gate) · up), GeGLU (gated like SwiGLU, with tanh-GELU: Gemma's),
    ReLU squared, ReLU squared gated like SwiGLU (relu(gate)² · up: BitNet's), ReLU (OPT's), or xIELU (Apertus's:
    ungated, two learned scalars a layer, xielu() below), or RWKV-4's channel mixing (rwkv: ReLU squared of the
    token blended with its predecessor, gated by a sigmoid receptance; RWKVChannelMix below, on model.delta_layers
    of delta_rule=rwkv alone)."""
    xielu_beta: float = 0.5
    """mlp=xielu: the fixed slope beta of both branches (Apertus's 0.5)."""
    xielu_eps: float = -1e-6
    """mlp=xielu: the negative branch's clamp, expm1(min(x, eps)) (Apertus's -1e-6, as its checkpoints store it)."""
    swiglu_limit: float = 7.0
    """mlp=swiglu_clamped or swiglu_clipped: the clamp on the gate (above) and the up projection (both sides);
    GPT-OSS's 7, DeepSeek-V4's 10."""
    moe_swiglu_limit: float = 0.0
    """mlp=swiglu with moe_experts: the routed experts' gate clamped above and up projection on both sides at this
    before silu(gate) · up (HY-V4's swiglu_limit, as transformers' Glm5NextTextExperts clamps them), the dense and
    shared MLPs left as they are; 0 = off."""
    swiglu_act_limits: tuple[float, ...] = ()
    """mlp=swiglu: each layer's dense MLP and shared expert computing min(silu(gate), L) · clamp(up, -L, L) at its
    entry L, clamped after the activation (Step 3.5's swiglu_limits_shared, as transformers' Step3p7MLP computes
    it); 0 = that layer unclamped; () = none."""
    moe_swiglu_act_limits: tuple[float, ...] = ()
    """mlp=swiglu with moe_experts: each layer's routed experts clamped as swiglu_act_limits clamps its dense MLP
    (Step 3.5's swiglu_limits, as Step3p7Experts._apply_gate computes it); 0 = that layer unclamped; () = none."""
    gelu_approximate: Literal["tanh", "none"] = "tanh"
    """The GELU of the gelu and geglu MLPs: the tanh approximation (GPT-2's gelu_new, Gemma's) or the exact erf form
    (GPT-NeoX's and Pythia's "gelu")."""
    fused_mlp: bool = True
    """SwiGLU and GeGLU: the gate and up projections as one matmul (one Linear of twice the width) instead of two."""
    mlp_hidden: int | None = None
    """MLP hidden size. None: 4·n_embd for gelu/relu2 and 8/3·n_embd for swiglu/geglu, rounded up to a multiple of
    64."""
    conv_layers: tuple[int, ...] = ()
    """Layers whose token mixer is a gated short convolution instead of attention (LFM2's "conv" layers: in_proj to
    3·C split as (b, c, h), a causal depthwise convolution of b·h over conv_kernel tokens, c times that, out_proj);
    () = attention on every layer."""
    conv_kernel: int = 3
    """conv_layers: the convolution's width in tokens (LFM2's conv_L_cache)."""
    delta_layers: tuple[int, ...] = ()
    """Layers whose token mixer is a recurrent linear attention instead of attention, no KV cache but a (key, value)
    state a head, of the kind delta_rule names; () = none."""
    delta_rule: Literal["gated_delta", "mamba2", "mamba1", "rglru", "lightning", "rwkv", "mlstm"] = "gated_delta"
    """delta_layers' mixer: "gated_delta", a gated delta net (Yang et al. 2024, "Gated Delta Networks"; Qwen3.5's and
    Qwen3-Next's "linear_attention" layers, GatedDeltaNet below), whose state decays and is corrected toward each
    token's value; "mamba2", Mamba-2's selective state space layer (Dao and Gu 2024; Granite 4.0's hybrid "mamba"
    layers, Mamba2 below), whose state decays and adds each token's input: keys B and queries C of
    delta_key_dim = d_state shared by groups (delta_key_heads = n_groups), values of delta_value_dim = head_dim;
    "mamba1", Mamba-1's selective scan (Gu and Dao 2023; state-spaces' mamba-*-hf models, Falcon-Mamba; Mamba1
    below): Mamba-2 with heads of one channel (delta_heads = the inner width I, delta_value_dim = 1, one group of B
    and C: delta_key_heads = 1) and a decay of its own for each of a channel's delta_key_dim = N state entries, dt
    through a low-rank projection (delta_dt_rank); "rglru", Griffin's recurrent block (De et al. 2024; RecurrentGemma's
    "recurrent" layers, RGLRU below): a GELU branch times a causal convolution's output through a real-gated linear
    recurrence, a state a channel, its gates block-diagonal in delta_heads blocks of delta_value_dim channels
    (delta_key_dim = 1); "lightning", MiniMax's lightning attention (Qin et al. 2024, "Lightning Attention-2";
    MiniMax-Text-01's "linear_attention" layers, Lightning below): linear attention with SiLU'd q, k and v and a
    fixed decay a head (ALiBi-like slopes shrinking with the layer's depth), its output normed and sigmoid-gated
    (delta_key_heads = delta_heads, delta_key_dim = delta_value_dim; no convolution); "rwkv", RWKV-4's time mixing
    (Peng et al. 2023, "RWKV: Reinventing RNNs for the Transformer Era"; transformers' RwkvSelfAttention, RWKVTimeMix
    below): key, value and receptance from each token blended with its predecessor (token shift), the WKV recurrence
    a channel over delta_value_dim channels (delta_heads = delta_key_heads = delta_key_dim = 1), no convolution;
    "mlstm", xLSTM's mLSTM layer (Beck et al. 2024, "xLSTM"; transformers' xLSTMLayer, MLSTM below): a matrix memory
    a head updated by exponential input and sigmoid forget gates, a gate each a head (delta_key_heads = delta_heads),
    its output normed per head and gated by a sigmoid output gate, no convolution."""
    delta_gate_softcap: float = 0.0
    """delta_layers, mlstm: the input and forget gates' preactivations soft-capped at ±this (cap·tanh(x / cap),
    xLSTM's gate_soft_cap, 15); 0 = none."""
    delta_heads: int = 0
    """delta_layers: value heads (linear_num_value_heads; Mamba-2's n_heads); each reads key head
    h · delta_key_heads // delta_heads."""
    delta_key_heads: int = 0
    """delta_layers: query/key heads (linear_num_key_heads; Mamba-2's n_groups), dividing delta_heads. With
    delta_rule=mamba1, the heads of the inner channels (Zamba's n_mamba_heads): each group of delta_heads /
    delta_key_heads channels has its own x_proj and dt_proj, so its own dt, B and C (1: Mamba's one of each)."""
    delta_key_dim: int = 128
    """delta_layers: the width of a query/key head (linear_key_head_dim; Mamba-2's d_state)."""
    delta_value_dim: int = 128
    """delta_layers: the width of a value head (linear_value_head_dim; Mamba-2's head_dim)."""
    delta_conv_kernel: int = 4
    """delta_layers: the causal depthwise convolution over q, k and v (Mamba-2's x, B and C), in tokens
    (linear_conv_kernel_dim, d_conv)."""
    delta_conv_bias: bool = False
    """delta_layers, mamba2 and mamba1: the convolution has a bias (Mamba's conv_bias)."""
    delta_proj_bias: bool = False
    """delta_layers, mamba2 and mamba1: its input and output projections have biases (Mamba's proj_bias / bias)."""
    delta_beta_scale: float = 1.0
    """delta_layers, gated_delta: the correction β = sigmoid(b(x)) times this; 2 lets β reach (0, 2), the state's
    transition then taking negative eigenvalues (OLMo Hybrid's linear_allow_neg_eigval)."""
    delta_decay: Literal["head", "channel", "bounded"] = "head"
    """delta_layers, gated_delta: the state's decay. "head": one a value head, g = −exp(A_log)·softplus(a(x) +
    dt_bias) (Qwen3.5's gated delta net); "channel": Kimi Delta Attention's (KDA: Kimi Linear's), one a key channel
    of each head, g = −exp(A_log)·softplus(a(x) + dt_bias) (B, T, H, Dk) with dt_bias (H·Dk,) and A_log one a head;
    "bounded": KDA's bounded in (delta_decay_floor, 0), g = floor·sigmoid(exp(A_log)·(a(x) + dt_bias)) (Ling 3's
    kda_safe_gate). With either KDA decay the output gate is sigmoid(z(x)) in place of SiLU(z(x))."""
    delta_gate_rank: int = 0
    """delta_layers with a KDA decay (delta_decay channel or bounded): the decay's and the output gate's projections
    through this rank, a(a_down(x)) and z(z_down(x)) (C -> R -> H·Dk, H·Dv: Kimi Linear's f_a/f_b and g_a/g_b);
    0 = full-rank a and z (Ling 3's f_proj, g_proj)."""
    delta_decay_floor: float = 0.0
    """delta_layers, delta_decay=bounded: the least log decay a token (< 0; Ling 3's kda_lower_bound, -5)."""
    delta_norm_eps: float = 0.0
    """delta_layers: the epsilon of the gated output norm (OLMo Hybrid's 1e-5 beside its blocks' 1e-6); 0 = norm_eps."""
    delta_norm_position: Literal["", "pre", "output", "sandwich"] = ""
    """delta_layers: where their blocks' norms sit, when not where norm_position puts the others' (OLMo Hybrid's
    delta-net blocks are pre-norm, its attention blocks OLMo 3's, norms on the sublayers' outputs); "" = the same."""
    delta_dt_min: float = 0.0
    """delta_layers, mamba2: the least time step, dt = max(softplus(dt + dt_bias), this) (Mamba-2's time_step_limit
    (min, inf); Nemotron-H's time_step_min as transformers runs its prompts); 0 = none."""
    mlp_free_layers: tuple[int, ...] = ()
    """Layers that are a token mixer alone, with no MLP after it: x + mixer(norm(x)) (every block of a Mamba-2
    model; Nemotron-H's Mamba-2 and attention layers); () = none."""
    mixer_free_layers: tuple[int, ...] = ()
    """Layers that are an MLP alone, with no token mixer before it: x + mlp(norm(x)) (Nemotron-H's MLP layers); they
    hold nothing in the inference cache; () = none."""
    delta_parallel: bool = False
    """delta_layers, mamba2: each runs attention and its Mamba-2 mixer side by side on the same normed input, their
    outputs summed into the residual stream, then its MLP: x + attn(norm1(x)) + mamba(norm1(x)) (Falcon-H1's layers,
    every one of them). The mixer is the block's `mamba`, attention its `attn`; the layer holds both a KV cache and
    the mixer's (convolution inputs and states). False: the mixer stands in attention's place."""
    delta_dt_rank: int = 0
    """delta_layers, mamba1: the rank of dt's projection, x_proj's first delta_dt_rank outputs through dt_proj
    (Mamba's time_step_rank); 0 = ceil(n_embd / 16), Mamba's "auto"."""
    delta_bcdt_norm_eps: float = 0.0
    """delta_layers, mamba1: RMS norms without weights on dt, B and C after x_proj, at this epsilon (Falcon-Mamba's,
    its mixer_rms_eps); 0 = none (Mamba's)."""
    delta_bcdt_norm_weight: bool = False
    """delta_layers, mamba1, with delta_bcdt_norm_eps: the dt, B and C norms have learned weights (Jamba's
    dt_layernorm (R), b_layernorm and c_layernorm (N)); False: none (Falcon-Mamba's)."""
    normed_residual: tuple[float, ...] = ()
    """Each sublayer's normed input replaces the stream its output joins, each term scaled: x ← α·u + β·f(u),
    u = norm(x), for the token mixer and then the MLP (MiniMax's decoder layer: its residual is the normed input,
    layernorm_*_alpha / beta). () = off (x + f(norm(x))); else six scales: (α, β) of attention layers, of
    delta_layers, of the MLPs. Pre-norm blocks run in turn."""
    delta_gate_norm: Literal["after_gate", "before_gate", "none"] = "after_gate"
    """delta_layers, mamba2: the mixer's output y gated by z: RMSNorm(y·SiLU(z)) in delta_key_heads groups (Granite
    4.0's, Bamba's: norm_before_gate=False), RMSNorm(y)·SiLU(z) (Falcon-H1's mamba_norm_before_gate=True), or
    y·SiLU(z) with no norm and no weight (Falcon-H1's mamba_rms_norm=False)."""
    shared_attn_layers: tuple[int, ...] = ()
    """Zamba2's hybrid layers (Zamba's, with Mamba-1 mixers), in increasing order: Mamba layers alone (delta_layers
    with delta_rule=mamba2 or mamba1, mlp_free_layers) that first call a transformer block whose weights several layers share (GPT.shared_blocks):
    t = shared_in(block(cat(x, x0))), x0 the token embeddings, then x + mixer(norm1(x + t)) (no residual inside the
    block, whose attention reads 2·n_embd channels in heads of head_size and writes n_embd). Each call has its own
    KV cache, adapters and shared_in; () = none."""
    shared_attn_blocks: int = 1
    """shared_attn_layers: the number of distinct shared blocks; the j-th of those layers calls block
    j % shared_attn_blocks (Zamba2's num_mem_blocks)."""
    shared_attn_adapter_rank: int = 0
    """shared_attn_layers: each call's own low-rank adapter (B(A(u)) added, LoRA's form trained as part of the
    base model) on the block's gate and up projection, and with shared_attn_qkv_adapters on q, k and v, of this
    rank (Zamba2's adapter_rank); 0 = none."""
    shared_attn_qkv_adapters: bool = False
    """shared_attn_layers, shared_attn_adapter_rank: adapters on q, k and v too (Zamba2's
    use_shared_attention_adapter)."""
    moe_experts: int = 0
    """Mixture of experts: each block's MLP is this many expert MLPs of the gated kind `mlp` names (mlp_hidden wide
    each), a router sending every token to moe_top_k of them and summing their outputs weighted by its softmax
    probabilities (Mixtral, Qwen2/3-MoE, OLMoE); 0 = one dense MLP."""
    moe_top_k: int = 2
    """Mixture of experts: the experts each token passes through."""
    moe_norm_topk: bool = True
    """Mixture of experts: rescale the moe_top_k chosen probabilities to sum to 1 (Mixtral's; Qwen's and OLMoE's
    norm_topk_prob); False weights each expert by its probability among all of them."""
    moe_shared_hidden: int = 0
    """Mixture of experts: a shared expert MLP this wide that every token passes through, its output scaled by
    sigmoid(w·x) of a learned w (Qwen2-MoE's shared_expert and shared_expert_gate) or added as it is
    (moe_shared_gate=false: GraniteMoeShared's and Granite 4.0's shared_mlp); 0 = none."""
    moe_shared_gate: bool = True
    """moe_shared_hidden: the shared expert's output is scaled by its sigmoid gate (False: added ungated)."""
    moe_aux_loss: float = 0.0
    """Mixture of experts, training: add this times the load-balancing loss (Switch Transformer's E·Σ_e f_e·P_e,
    f_e the share of routed slots expert e takes, P_e its mean router probability; averaged over the layers) to the
    language-model loss, so the router keeps spreading tokens (Mixtral's router_aux_loss_coef); 0 = off."""
    moe_gating: Literal["softmax", "sigmoid", "sqrtsoftplus", "sparsemixer"] = "softmax"
    """Mixture of experts: the router's scores, a softmax over the experts or each expert's sigmoid (LFM2-MoE's,
    DeepSeek-V3's; with moe_norm_topk the chosen ones rescaled to sum to 1, plus moe_norm_eps) or sqrt(softplus) of
    its logit (DeepSeek-V4's sqrtsoftplus, fp32, rescaled as sigmoid's), or SparseMixer's top 2
    (PhiMoE's, sparsemixer below: each weight a softmax over the experts whose logits lie within moe_jitter_eps of the
    chosen one's; moe_top_k 2, no rescaling)."""
    moe_jitter_eps: float = 0.0
    """Mixture of experts with moe_gating=sparsemixer: the relative distance 2·eps below a chosen expert's logit past
    which an expert leaves that choice's softmax (PhiMoE's router_jitter_noise)."""
    moe_input_jitter: float = 0.0
    """Mixture of experts, training: the mixture's input (router's and experts') times uniform noise in
    [1 - eps, 1 + eps] (DBRX's moe_jitter_eps); with moe_gating=sparsemixer twice (PhiMoE's input_jitter_noise,
    which its block and its router both apply); 0 = none."""
    moe_expert_bias: bool = False
    """Mixture of experts: a per-expert bias added to the scores to choose the top k (not to weight them): LFM2-MoE's
    and DeepSeek-V3's expert_bias, a buffer (no gradient reaches it): imported with the model, and moved toward an
    even load in training with moe_bias_update."""
    moe_bias_on_logits: bool = False
    """Mixture of experts with moe_expert_bias and sigmoid scores: the bias is added to the router's logits, not to
    their sigmoid, to choose (Kolibri-1's router: top k of logits + bias, weighted by the chosen logits' sigmoid).
    The sigmoid is monotonic but not linear, so the two choose differently wherever the bias is not zero."""
    moe_bias_update: float = 0.0
    """Mixture of experts with moe_expert_bias: after each optimizer step every expert's bias moves by this toward an
    even load, up where the expert took fewer than the mean of the step's token choices, down where it took more
    (the sign of the difference: DeepSeek-V3's auxiliary-loss-free balancing, its 0.001; the converter
    redline/converters/expert_balance.py); 0 = the bias stays as it is."""
    moe_bias: bool = False
    """Mixture of experts: a bias on the router's logits and on each expert's projections (GPT-OSS's router and
    experts; mlp.router.bias, mlp.fc_bias (E, 2F) and mlp.proj_bias (E, C), zeros at init)."""
    moe_norm_min: float = 0.0
    """Mixture of experts with softmax scores and moe_norm_topk: the chosen weights' sum floored at this before they
    are divided by it (ERNIE 4.5's moe_norm_min); 0 = none."""
    moe_scale: float = 1.0
    """Mixture of experts: the chosen experts' weights times this (routed_scaling_factor)."""
    moe_weight_input: bool = False
    """Mixture of experts: each chosen expert's weight multiplies the token it takes instead of the expert's output
    (Llama 4's router scores scale the experts' input: through a gated MLP that is not the same as scaling its
    output)."""
    moe_dense_layers: int = 0
    """Mixture of experts: the first this-many layers have a dense MLP instead (LFM2-MoE's num_dense_layers),
    moe_dense_hidden wide."""
    moe_dense_hidden: int | None = None
    """The width of the dense MLPs of moe_dense_layers, or of the layers off moe_layers (None: mlp_hidden)."""
    moe_groups: int = 1
    """Mixture of experts: the experts in this many equal groups, and each token choosing its top k only among the
    moe_topk_groups groups whose two best (biased) scores sum highest (DeepSeek-V3's n_group, group-limited routing);
    1 = no groups."""
    moe_topk_groups: int = 1
    """Mixture of experts with moe_groups > 1: the groups each token's experts are chosen from (topk_group)."""
    moe_norm_eps: float = 1e-6
    """Mixture of experts with sigmoid scores and moe_norm_topk: the term added to the chosen scores' sum before they
    are divided by it (LFM2-MoE's 1e-6; GLM-4-MoE's and DeepSeek-V3's 1e-20)."""
    moe_layers: tuple[int, ...] = ()
    """Mixture of experts: the layers whose MLP is the mixture, the others a dense MLP moe_dense_hidden wide (Jamba's
    every expert_layer_period-th layer from expert_layer_offset, Nemotron-H's E layers); () = every layer from
    moe_dense_layers on."""
    moe_out_bias: bool = False
    """Mixture of experts: a learned bias (mlp.out_bias, (n_embd,), zeros at init) added to the experts' weighted sum
    (JetMoE's JetMoeMoE.bias); False = none."""
    moe_post_norm: bool = False
    """Mixture of experts: a norm (model.norm's kind, with weights) on the mixture's output, shared expert included,
    before it joins the residual stream (mlp.post_norm: A.X-K1's post_mlp_layernorm); the dense layers have none."""
    norm_gate_rank: int = 0
    """Gated norms (A.X-K2's AXK2GatedRMSNorm): every block's norm1, and norm2 of the blocks with experts, scale their
    output y by sigmoid(gate_up(silu(gate_down(y)))) (C -> this rank -> C, the sigmoid in fp32); 0 = plain norms."""
    moe_identity_experts: int = 0
    """Mixture of experts: this many zero-computation experts past the moe_experts MLPs (LongCat-Flash's
    zero_expert_num), which the router scores and chooses as it does the others (its logits, scores and
    moe_expert_bias E + Z wide) and each of which returns its input: a chosen one adds weight · x; 0 = none."""
    moe_sink_experts: int = 0
    """Mixture of experts: the last this-many of the moe_experts are shared experts that every token takes beside
    its top k of the others (chosen by score, plus moe_expert_bias, among the others alone), the k + S sigmoid
    scores normalized together (moe_norm_topk) and scaled as the routed ones are: the shared experts act as sinks in
    the weights' normalization (Inkling's shared_expert_sink, as transformers' InklingTopkRouter and InklingMoE
    compute it); 0 = none."""
    moe_shortcut: bool = False
    """LongCat-Flash's shortcut-connected MoE: the blocks pair up (block 2j and 2j + 1 are one LongCat layer), every
    block has a dense MLP (moe_dense_hidden wide), and block 2j's experts (moe) read its MLP's input, norm2's output,
    their output joining the stream after block 2j + 1's MLP. Between the blocks the stream carries it: (B, T, 2, C),
    the stream and the experts' output waiting to join it (GPT.stream_in, stream_out)."""
    norm: Literal["rmsnorm", "layernorm", "l2"] = "rmsnorm"
    """Normalization layer kind; l2: x over its L2 norm, no weight (nGPT's projection onto the unit sphere, for
    model.ngpt alone), its QK-norm too."""
    norm_position: Literal["pre", "post", "output", "sandwich"] = "pre"
    """Normalize the input of each sublayer (pre), the output of each residual sum (post), each sublayer's output
    before it is added to the residual stream, with no norm on its input (output: OLMo 2's "reordered norm",
    x + norm(attn(x))), or both its input and its output (sandwich: Gemma 2/3's, x + norm(attn(norm(x))))."""
    parallel_residual: bool = False
    """Attention and MLP read the same block input, each through its own norm, and both add to it:
    x + attn(norm1(x)) + mlp(norm2(x)) (GPT-NeoX's use_parallel_residual, GPT-J's); pre-norm blocks only."""
    parallel_shared_norm: bool = False
    """With parallel_residual: one norm feeds both sublayers, x + attn(norm1(x)) + mlp(norm1(x)) (Phi's); the block
    has no norm2."""
    norm_eps: float = 1e-5
    """Epsilon of the normalization layers."""
    rescale_every: int = 0
    """The norms of block i at norm_eps·4^(i // this), the final norm at norm_eps·4^(n_layer // this): what
    transformers' RWKV computes in eval mode with its rescale_every, where the stream is halved after every this-many
    blocks and their output projections divided to match (a LayerNorm of x / 2^n is one of x at eps·4^n, exactly in
    floating point, the powers of two rounding alike); 0 = every norm at norm_eps."""
    norm_bias: bool | None = None
    """LayerNorm with a bias (None: as model.bias); StableLM's LayerNorms have biases where its Linear layers have
    none."""
    norm_unit_offset: bool = False
    """Norms scale by (1 + weight), their weights initialised to zero, instead of by the weight: RMSNorm computed in
    fp32 (Gemma's form; QK-norm included), LayerNorm in the input's dtype (Nemotron's LayerNorm1P)."""
    norm_affine: bool = True
    """Norms with a learned scale (and a LayerNorm's bias); false: none, every norm a fixed normalization (nanochat's
    RMSNorm, the original OLMo's LayerNorm); QK-norm included."""
    embed_norm: bool = False
    """Normalize the token embeddings before the first block (nanochat's), with a norm of model.norm's kind."""
    embed_scale: bool = False
    """Multiply the token embeddings by sqrt(n_embd), that factor rounded to the embedding's dtype (Gemma's)."""
    embed_multiplier: float = 0.0
    """Multiply the token embeddings by this (Granite's embedding_multiplier); 0 = 1."""
    residual_multiplier: float = 0.0
    """Scale each sublayer's output by this before it joins the residual stream (Granite's residual_multiplier);
    0 = 1."""
    logit_divisor: float = 0.0
    """Divide the output logits by this, before any soft-cap (Granite's logits_scaling); 0 = 1."""
    head_bias: bool = False
    """A bias on the output head (Phi's lm_head)."""
    head_transform: bool = False
    """A prediction head between the final norm and the output head: a dense layer (C -> C, biased where model.bias),
    the MLP's GELU (model.gelu_approximate) and a norm (model.norm): ModernBERT-Decoder's lm_head (dense, act, norm)
    before its decoder."""
    first_norm_free: bool = False
    """Layer 0's attention reads the stream without a norm of its own (ModernBERT's attn_norm is an identity there:
    its embeddings are normed already, model.embed_norm). Pre-norm blocks."""
    tie_embeddings: bool = False
    """Share the token embedding matrix with the output head."""
    head_vocab: int = 0
    """Rows of the output head: the model predicts token ids 0..head_vocab-1 alone, its logits head_vocab wide, while
    its embedding keeps vocab_size rows for inputs (Apertus 1.5's output_vocab_size, a head pruned to the text ids
    below the image and audio codes); 0 = vocab_size. Training targets must be below it; needs an untied head."""
    bias: bool = False
    """Biases in the Linear layers (and LayerNorm)."""
    qkv_bias: bool | None = None
    """Biases in the q/k/v projections alone (Qwen2's layout). None: as `bias`."""
    qkv_clip: float = 0.0
    """Clamp every q, k and v projection output to ±this before QK-norm and RoPE (DBRX's clip_qkv); 0 = none."""
    logit_softcap: float = 0.0
    """Cap the output logits smoothly at ±this (softcap · tanh(logits / softcap), as Gemma 2 and modded-nanogpt do);
    0 = off."""
    zero_init_proj: bool = False
    """Initialise every residual output projection (attention and MLP) to zero, so each block starts as the
    identity (modded-nanogpt's choice); False: GPT-2's N(0, 0.02/sqrt(2·n_layer))."""
    value_embeddings: int = 0
    """Value embeddings (modded-nanogpt): this many extra token-indexed tables of width n_kv_head·head_dim; table i
    is mixed into the attention values of layer i and of layer n_layer − k + i (the first k and last k layers, k =
    this, U-net style) as v ← λ₀·v + λ₁·ve with two learned scalars per layer (initialised 0.5 each). 0 = off.
    The KV-cache inference engine does not take them (generation falls back to `GPT.generate`)."""
    global_head_size: int = 0
    """Head width of the full-attention layers (those outside the sliding window) in a model with windowed ones; 0 =
    head_dim (Gemma 4's global_head_dim). rope_theta's table is built for this width, so it takes rope_local_theta
    for the windowed layers' own."""
    global_kv_head: int = 0
    """KV heads of the full-attention layers; 0 = n_kv_head (Gemma 4's num_global_key_value_heads)."""
    window_n_head: int = 0
    """Query heads of the sliding-window layers, each head_dim wide beside the same KV heads; 0 = n_head (Step 3.5's
    num_sliding_attention_heads)."""
    global_values_from_keys: bool = False
    """The full-attention layers have no value projection: their values are the key projection's output, before the
    keys' norm and RoPE (Gemma 4's attention_k_eq_v). Needs fused_qkv=false."""
    v_norm: bool = False
    """RMSNorm without a weight on each head's values (Gemma 4's v_norm), before they are cached."""
    kv_shared_layers: int = 0
    """The last this many layers compute no keys or values: each attends, with its own queries and window, over those
    of the last earlier layer of the same window (Gemma 4's num_kv_shared_layers). The inference engine's cache holds
    them once, the shared layers reading their source layer's slots. Needs fused_qkv=false."""
    kv_shared_mlp_hidden: int = 0
    """The MLP width of the kv_shared_layers; 0 = the others' (Gemma 4's use_double_wide_mlp: twice theirs)."""
    per_layer_embd: int = 0
    """Per-layer inputs of this width P (Gemma 4's and Gemma 3n's hidden_size_per_layer_input; 0 = off): a token's
    (n_layer, P) row of a table times sqrt(P), plus the RMS-normed (n_layer, P) projection of its embedding times
    n_embd^-0.5, both times 2^-0.5; after its MLP each block adds norm(proj(gelu(gate(x)) · its P-wide input))."""
    per_layer_vocab: int = 0
    """Rows of the per-layer input table (0: vocab_size; Gemma 4's vocab_size_per_layer_input)."""
    moe_beside_dense: bool = False
    """Each layer's experts run beside a dense MLP (moe_dense_hidden wide) rather than in its place (Gemma 4's MoE
    block, norm_position=sandwich): the MLP reads norm2(x), the experts a norm of x of their own, the router RMS(x)
    times a learned (C,) scale and C^-0.5; the top-k weights are renormalized, then times a learned scale of each
    chosen expert; each output is normed and their sum goes through the MLP's output norm."""
    layer_scalars: bool = False
    """Each block's output, the whole residual stream, times a stored scalar of its own (Gemma 4's layer_scalar
    buffer; 1 at init, not trained)."""
    altup_streams: int = 0
    """AltUp (Baykal et al. 2023, "Alternating Updates for Efficient Transformers"; Gemma 3n's altup_num_inputs):
    the residual stream is this many (B, T, C) streams, the embeddings' and N - 1 learned projections of them
    rescaled to their RMS; each block predicts every stream as a token-routed mix of all of them, runs its sublayers
    on the first prediction alone and corrects every prediction by a routed share of what the sublayers changed; the
    last streams are projected back, rescaled and averaged before the final norm. Needs sandwich norms; 0 = off."""
    altup_correct_scale: bool = True
    """altup_streams: the first corrected stream times a learned (C,) scale before the per-layer input's gate reads
    it (Gemma 3n's altup_correct_scale)."""
    altup_coef_clip: float = 0.0
    """altup_streams: in training, the prediction and correction coefficients' weights clamped to ± this, as Gemma
    3n's altup_coef_clip (the prediction weights in place, the correction ones in the forward); 0 = no clamp."""
    laurel_rank: int = 0
    """LAuReL (Menghani et al. 2024, "Learned Augmented Residual Layer"; Gemma 3n's laurel_rank): in each AltUp block
    the normed input u adds u + norm(right(left(u))) (a rank-r branch) to the attention's residual sum, which is then
    divided by sqrt(2). Needs altup_streams; 0 = off."""
    mhc_streams: int = 0
    """Manifold-constrained hyper-connections (mHC: Xie et al. 2026; DeepSeek-V4's hc_mult): the residual stream is
    this many (B, T, C) streams, each starting as the embeddings. Before each sublayer one projection of all the
    streams, RMS-normed together without a weight, gives per token a `pre` (N,) that sums them into the sublayer's
    input, a `post` (N,) that spreads its output back over them, and an (N, N) matrix, made doubly stochastic by
    mhc_sinkhorn_iters Sinkhorn-Knopp steps, that mixes the streams the output joins; a last projection (mhc_head)
    sums them before the final norm. Needs pre-norm blocks of attention and an MLP; 0 = off."""
    mhc_sinkhorn_iters: int = 20
    """mhc_streams: the Sinkhorn-Knopp steps (columns, then rows and columns again) that normalise the mixing matrix
    (DeepSeek-V4's hc_sinkhorn_iters); 0 = no mixing matrix, the streams the output joins left as they are, `post`
    plus mhc_eps (HY-V4's independent hyper-connections, iHC: its projection gives pre and post alone)."""
    mhc_post_scale: float = 2.0
    """mhc_streams: `post` is this times a sigmoid (DeepSeek-V4's 2; HY-V4's hc_magnitude)."""
    mhc_eps: float = 1e-6
    """mhc_streams: the floor added to `pre`, to the mixing matrix's entries and to every Sinkhorn step's sums
    (DeepSeek-V4's hc_eps); the streams' norm takes norm_eps."""
    mhc_head_mean: bool = False
    """mhc_streams: the streams' plain mean before the final norm, in place of mhc_head's learned weights
    (GLM-5.3-Next's Glm5NextTextHyperHead, which holds no parameters); False = mhc_head's (DeepSeek-V4's, HY-V4's)."""
    shared_kv_attention: bool = False
    """DeepSeek-V4's attention (SharedKVAttention below): q through q_a (C -> q_lora_rank), an RMSNorm with weights
    and q_b (-> H·D), each head then RMS-normed without a weight; one key head (kv, C -> D, RMS-normed with weights)
    that is the value too, rotated as the queries are (RoPE on rope_dims); each head's output rotated back by its
    query's position (what the value's rotation leaves is the key's relative one), then the grouped output
    projection (o_groups). Needs n_kv_head=1 and q_lora_rank; norms at norm_eps."""
    o_groups: int = 0
    """shared_kv_attention: the heads' outputs in this many groups of H·D/G, each projected to o_lora_rank by its own
    block of o_a ((G·o_lora_rank, H·D/G)), the G·o_lora_rank together through proj to C (DeepSeek-V4's o_groups)."""
    o_lora_rank: int = 0
    """shared_kv_attention: the width each group of heads is projected to (DeepSeek-V4's o_lora_rank)."""
    kv_compress_rates: tuple[int, ...] = ()
    """shared_kv_attention: each layer's compression rate m, 0 for none (DeepSeek-V4's compressed layers; () = none):
    beside its window, a layer with m > 0 attends to one compressed key (also its value) for each whole window of m
    tokens before the query (window w where (w + 1)·m <= position + 1): the window's tokens' comp_kv projections
    (C -> D) weighted by a softmax over them of their comp_gate projections plus a learned bias by place in the window
    (comp_bias, (m, D), fp32), summed, RMS-normed (comp_norm) and rotated at position w·m (DeepSeek-V4's
    heavily compressed attention's compressor). The engine's cache keeps each token's projections beside its key, so
    prefill, chunked prefill and decode pool them as the full forward does."""
    kv_compress_overlap: tuple[int, ...] = ()
    """kv_compress_rates: the layers whose windows overlap (DeepSeek-V4's compressed sparse attention): comp_kv and
    comp_gate give two series (2·D), and key w pools window w's second series with window w - 1's first, 2·m tokens
    (comp_bias (m, 2·D)). DeepSeek-V4 picks those keys by a lightning indexer; redline attends to all of them, which
    is what the indexer keeps while a query sees no more than its top k (the import caps context_len there)."""
    moe_hash_layers: tuple[int, ...] = ()
    """Mixture of experts: the layers whose experts are chosen by the token's id, not by the router's scores: a stored
    table (mlp.tid2eid, (vocab_size, moe_top_k) int64, a buffer) gives each token's moe_top_k experts, the router's
    scores of those still weighting them (DeepSeek-V4's hash_moe layers); no expert bias or groups take part in their
    choice. () = none."""
    hc_streams: int = 0
    """Hyper-connections (Zhu et al. 2024, "Hyper-Connections"; Qwen4-Exp's hc_count): the residual stream is this
    many (B, T, C) streams, the embeddings copied into each. Before each sublayer, the streams are RMS-normed one by
    one (1 + weight with norm_unit_offset) and averaged under gates sigmoid(up(silu(down(normed) / N))) (a rank
    hc_rank mixer), which replaces the sublayer's input norm; its output joins stream n times 2·sigmoid(inject_n ·
    normed / N). A last mixer without injection collapses the streams, in place of the final norm. 0 = off."""
    hc_rank: int = 0
    """hc_streams: the rank of the hyper-connection mixers' down and up projections (Qwen4-Exp's hc_lowrank)."""
    qsa_heads: int = 0
    """A QSA token indexer on every attention layer (Qwen4-Exp's indexer_n_heads): its query heads. The indexer keeps,
    for each query, the qsa_budget / qsa_block best blocks of qsa_block keys and the unfinished last block: every key
    while a query sees fewer than qsa_budget + qsa_block, so redline attends densely and caps context_len there. Its
    weights are kept (buffers, not trained: the selection passes no gradient) to be written back. 0 = none."""
    qsa_head_dim: int = 0
    """qsa_heads: the width of the indexer's query heads and its one key head (indexer_head_dim)."""
    qsa_budget: int = 0
    """qsa_heads: the keys the indexer keeps from whole blocks (indexer_budget), a multiple of qsa_block."""
    qsa_block: int = 0
    """qsa_heads: the keys averaged into one indexed block (indexer_compress_ratio)."""
    ngram_layers: tuple[int, ...] = ()
    """Per-layer n-gram embeddings (Qwen4-Exp's PLE, ple_layer_ids less one) on these layers, gated delta-net layers
    of hyper-connected streams: before the layer's mixers, each stream n gains g_n·v + silu(conv(norm(g·v)))_n, v =
    value(e) (C,) and g_n = sigmoid(signed √(norm_n(key(e)) · norm_n(stream n) / √C)), e the layer's hashed n-gram
    embedding of the token's last ngram_size tokens (ngram_heads tables for each n of 2..ngram_size, each table's
    ids the XOR of tokens times multipliers derived from ngram_seed, modulo a prime) and conv a causal depthwise
    convolution of ngram_conv_kernel taps ngram_size tokens apart. () = none."""
    ngram_dim: int = 0
    """ngram_layers: the width of e, the layer's tables' vectors concatenated (ple_embed_dim), a multiple of
    (ngram_size - 1)·ngram_heads."""
    ngram_size: int = 3
    """ngram_layers: the longest n-gram hashed (ngram_size); the convolution's taps stand this many tokens apart."""
    ngram_heads: int = 8
    """ngram_layers: the tables for each n-gram length (heads_per_ngram)."""
    ngram_vocab_base: int = 20_000_000
    """ngram_layers: each table's rows are a prime after this (the layer's k-th table overall: the k-th prime of
    ngram_vocab_size_base), the layer's tables stacked in one table padded to a multiple of ngram_vocab_multiple."""
    ngram_vocab_multiple: int = 128
    """ngram_layers: the stacked table's rows are padded to a multiple of this (make_ngram_vocab_size_divisible_by)."""
    ngram_seed: int = 1234
    """ngram_layers: the seed of the layers' hash multipliers (Qwen4-Exp's seed)."""
    ngram_conv_kernel: int = 4
    """ngram_layers: the taps of the dilated convolution (ple_conv_kernel_size)."""
    ngram_eos: int = -1
    """ngram_layers: the end-of-text id (eos_token_id): no n-gram reaches back past it, and the tokens before a
    sequence's first read as it."""
    mlp_sparsity: tuple[float, ...] = ()
    """Per layer, a gated MLP's activation sparsity s (Gemma 3n's activation_sparsity_pattern): where s > 0 the gate
    keeps only what exceeds its mean plus Φ⁻¹(s) standard deviations over the hidden units, less that cutoff
    (relu(g - cutoff): a Gaussian top-k); () = none."""
    value_embed_layers: tuple[int, ...] = ()
    """Value embeddings on these layers instead, a table of its own each (nanochat's placement: every other layer,
    the last among them); table i serves the i-th layer named. () = as model.value_embeddings gives."""
    value_embed_gate: int = 0
    """Mix each layer's value embedding in through a gate instead of value_embeddings' two scalars (nanochat's):
    v ← v + 3·sigmoid(ve_gate(x[..., :this])) · ve, one gate a kv head (ve_gate: (KV, this), no bias; x the block's
    normed input), so a table's share ranges over (0, 3). 0 = the scalars."""
    smear_gate: int = 0
    """Smear each token's predecessor into it (nanochat's): for t ≥ 1, x[t] ← x[t] + smear_lambda ·
    sigmoid(smear_gate(x[t, :this])) · x[t − 1], on the (normed) token embeddings, before the first block;
    smear_gate (1, this), smear_lambda (1,), zero at init. 0 = off."""
    layer_lambdas: bool = False
    """Before each block i, x ← resid_lambdas[i] · x + x0_lambdas[i] · x0, x0 the stream entering the first block
    (nanochat's per-layer residual and embedding scalars; ones and zeros at init, the plain residual stream)."""
    backout: bool = False
    """Subtract backout_lambda times the stream after block n_layer // 2 from the last block's output, before the
    final norm (nanochat's backout; backout_lambda (1,), zero at init)."""
    dropout: float = 0.0
    """Dropout on attention weights and residual branches (training only)."""
    attn_backend: Literal["auto", "cudnn", "flash", "efficient", "math"] = "auto"
    """SDPA backend: auto lets PyTorch choose; the others force one (math is the slow reference)."""
    doc_attention: Literal["auto", "sdpa", "flex"] = "auto"
    """How packed documents (`doc_ids`) are kept apart: sdpa with a dense (B, 1, T, T) mask (any device; the fast
    SDPA kernels do not take a mask), or flex attention with a block mask that skips the blocks no document
    spans (CUDA; compiled with the model). auto: flex on CUDA inside torch.compile (training), sdpa elsewhere.
    The same choice runs soft-capped attention (attn_softcap) and attention with sinks (attn_sinks) as flex,
    documents or not."""
    prefix_lm: bool = False
    """A prefix-LM (PaliGemma's): each sequence's first tokens, its prompt, attend to one another both ways, the
    tokens after them causally (to the whole prefix and to the suffix before them). GPT.forward takes the prefix's
    length per row (`prefix_len`, none: causal throughout); the inference engine's prefill makes each prompt the
    prefix, and decoding after it is causal (exact: later tokens never feed back into the prefix). A sliding window
    or chunk cuts only the causal part, as transformers' blockwise overlay ORs the prefix over it."""
    reference_window: bool = False
    """With sliding_window: each sequence's first tokens, its reference (the prompt: Unlimited-OCR's
    reference_sliding_attention), stay visible to every later token of the windowed layers beyond the window; the
    reference attends to itself causally, the tokens after it to the reference and to the window of tokens before
    them. GPT.forward takes the reference's length per row (`prefix_len`; none: the whole sequence is the reference,
    causal throughout, as transformers' forward without a cache attends); the inference engine's prefill makes each
    prompt the reference and its decode steps attend to it and to the window."""
    pad_vocab_to: int = 128
    """Pad the embedding/head rows up to a multiple of this (padded rows are never sampled or counted in the loss)."""
    diff_attention: bool = False
    """Differential attention (Ye et al. 2024, "Differential Transformer"; transformers' DiffLlama): query head h's
    attention map, over the first half of the KV heads' values and over the second half (each half tiled back to KV
    heads) side by side, 2·head_dim wide; heads h and h + H/2 paired as out_h − λ·out_{h + H/2}, RMS-normed over those
    2·head_dim without a weight (norm_eps) and times 1 − λ_init, H·D wide again for the output projection.
    λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init from four learned (head_dim,) vectors a layer (attn.lambda_q1, ...),
    λ_init = 0.8 − 0.6·exp(−0.3·layer). Needs an even n_head and n_kv_head."""
    attn_key_bias: bool = False
    """Doge's dynamic mask attention (transformers' DogeAttention): every key's scores, for each query head of its
    KV head, plus exp(A_kv · softplus(dt_proj(v))_kv), v the key's token's values over all KV heads (KV·D) and dt_proj
    (KV·D -> KV, with a bias where qkv_bias) and A (KV,) learned (attn.dt_proj, attn.A). Doge keeps only the top
    keep_window_size keys of a longer context: redline's context_len stays within it (the import sets it so)."""
    rel_bias_dim: int = 0
    """Inkling's relative-position bias (transformers' InklingRelativeLogits), 0 = off: every query token's scores
    plus a bias by its distance to the key, mixed for the token from a learned bank of distance profiles: r =
    rel_proj(x) (C -> H·rel_bias_dim, attn.rel_proj) a head, bias(i, j) = (r_h · rel_profiles)[i − j] for
    0 <= i − j < the layer's extent and 0 beyond it (attn.rel_profiles, (rel_bias_dim, extent)). A dense float mask
    in SDPA (O(T²) a layer); the engine computes it from each new token and the slot distances."""
    kv_conv: int = 0
    """Keys and values each plus a causal depthwise convolution of themselves over the last this-many tokens, per
    channel of the k and v projections (attn.k_conv, attn.v_conv (KV·D, kv_conv), oldest token first), in fp32,
    before the keys' QK-norm (Inkling's k_sconv and v_sconv); 0 = off. The engine's cache holds the raw projections
    in the slots and convolves (and norms) the keys and values it attends over at each step: no state apart, at the
    price of a depthwise convolution over the cached slots a layer and step."""
    rel_bias_extent: int = 0
    """rel_bias_dim: the distances the bias covers on the full-attention layers (Inkling's rel_extent); a windowed
    layer's extent is its sliding window, as Inkling's hybrid_sliding layers take it."""
    residual_scales: bool = False
    """Each block scales its residual stream before a sublayer's output joins it: x ← s₁ ⊙ x + attn(norm1(x)), then
    s₂ ⊙ x + mlp(norm2(x)), s₁ and s₂ (C,) learned, ones at init (Doge's input_residual and post_attention_residual;
    pre-norm blocks)."""
    cca_kernels: tuple[int, ...] = ()
    """ZAYA's compressed convolutional attention (CCA, arXiv 2510.04476; transformers' ZayaCCAProjection), the
    (depthwise, grouped) widths of two causal convolutions over time: q and k (separate projections, no biases) are
    concatenated ((H + KV)·D channels), convolved channel by channel and then within each head's D channels, and
    each adds a residual path (a query head's (q + its kv head's k) / 2, a key head the mean of its group's); the
    values' first KV·D/2 channels are the token's own projection (attn.v), the last KV·D/2 the previous token's
    (attn.v_delayed, zeros before the first); q and k are L2-normed to sqrt(D) and each key head scaled by a learned
    factor (attn.key_scale (KV,)). The inference cache keeps each token's raw q, k and delayed value in its slot
    (KVCache.ngram_inputs); () = plain projections."""
    residual_affine: bool = False
    """ZAYA's residual scaling (transformers' ZayaResidualScaling): each sublayer's output h and the stream x it joins
    shifted and scaled per channel, x <- (x + b_x)·s_x + (h + b_h)·s_h (four (C,) vectors each, attn_affine and
    mlp_affine), and the embeddings likewise, (e + b)·s (GPT.embed_bias, embed_gain); pre-norm blocks."""
    moe_router_hidden: int = 0
    """ZAYA's MLP router (transformers' ZayaRouter), this wide (R): r = down(x) (a biased C -> R projection, plus the
    previous layer's r times a learned (R,) scale on every layer but the first), then RMSNorm, two biased R -> R
    layers under exact GELU and a projection onto the experts and one skip expert (E + 1); the top one of softmax
    plus a stored balancing bias (mlp.balance_bias (E + 1,), the skip's -1 at init) is chosen and weighted by its
    probability, the skip adding nothing. r travels to the next layer inside the stream, (B, T, C + R)
    (GPT.stream_in, stream_out); moe_top_k 1; 0 = the linear router."""
    bitlinear: Literal["off", "online", "offline"] = "off"
    """BitNet b1.58's linear layers (Ma et al. 2024, "The Era of 1-bit LLMs") for every block's attention and MLP
    projections, as transformers' integrations/bitnet.py computes them: each token's input to a projection rounded
    to 8 bits by its absolute maximum (round(x · 127 / max|x|), clamped to [-128, 127], scaled back), and the weight
    "online": rounded on the fly to {-1, 0, 1} times its mean absolute value, one scale a projection (AutoBitLinear
    online; training updates the full-precision weights through a straight-through estimator, the BitNet papers'),
    or "offline": stored already ternary times its scale (a packed checkpoint's, unpacked at import) and used as it
    is, not trained; "off": plain Linear layers. Needs separate q/k/v and gate/up projections (fused_qkv=false,
    fused_mlp=false), each with a scale of its own."""
    sub_norms: bool = False
    """An RMSNorm on the input of each block's output projections: the heads' outputs (H·D) before attn.proj and the
    MLP's hidden activation before mlp.proj, held as each proj's `norm` (BitNet's attn_sub_norm and ffn_sub_norm)."""
    ngpt: bool = False
    """nGPT's blocks (Loshchilov et al. 2024; NVIDIA's Dory): the stream kept on the unit sphere. Each sublayer reads
    the L2-normed stream u, and its L2-normed output h replaces the stream by interpolation, u + |r| ⊙ (h - u), r (C,)
    a learned rate for each sublayer (Block.attn_rate, mlp_rate) instead of a residual add; the queries are scaled
    per channel after RoPE by q_scale² ((H·D,) learned, Attention.q_scale); the heads' (gated) outputs and the MLP's
    hidden activation are L2-normed before their output projections. Needs model.norm=l2, norm_position=sandwich
    and per-head QK-norm before RoPE (weightless L2 norms everywhere)."""
    loop_section: tuple[int, ...] = ()
    """(first, count): layers first .. first + count - 1 run loop_passes times in a row, each later pass the same
    blocks again (their weights stored once; the engine caches each pass's keys and values apart), so n_layer counts
    every pass. Each pass starts from l2(x) + l2(x₀), x₀ the stream that entered the section (Dory's recurrent
    section, its n_recurrent_loops; with model.ngpt). Empty: every layer runs once."""
    loop_passes: int = 1
    """With loop_section: how many times the section runs."""
    ce_chunk_tokens: int = 0
    """Compute the head and the loss this many tokens at a time, so the (tokens, vocab) logits never exist at once
    and are not kept for backward (redline/chunked_cross_entropy.py); 0 = off: the whole batch's logits at once."""

    @property
    def value_tables(self) -> int:
        """How many value-embedding tables the model holds (value_embed_layers' or value_embeddings')."""
        return len(self.value_embed_layers) or self.value_embeddings

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    def layer_has_experts(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is the mixture of experts: one of model.moe_layers where they are given,
        else any from moe_dense_layers on (with model.moe_experts); with model.moe_shortcut, whether the layer's
        block runs the experts beside its MLP (the even ones)."""
        if not self.moe_experts:
            return False
        if self.moe_shortcut:
            return layer % 2 == 0
        return layer in self.moe_layers if self.moe_layers else layer >= self.moe_dense_layers

    def layer_head_dim(self, layer: int) -> int:
        """Layer `layer`'s head width: global_head_size on a full-attention layer where it is given, else head_dim."""
        return self.global_head_size if self.global_head_size and not self.layer_window(layer) else self.head_dim

    def layer_n_head(self, layer: int) -> int:
        """Layer `layer`'s query heads: window_n_head on a windowed layer where it is given, else n_head."""
        return self.window_n_head if self.window_n_head and self.layer_window(layer) else self.n_head

    def layer_kv_heads(self, layer: int) -> int:
        """Layer `layer`'s KV heads: global_kv_head on a full-attention layer where it is given, else kv_heads."""
        return self.global_kv_head if self.global_kv_head and not self.layer_window(layer) else self.kv_heads

    def layer_cache_geometry(self, layer: int) -> tuple[int, int]:
        """The (heads, width) layer `layer` keeps in the inference engine's cache for each token: latent attention's
        one head of its normalized latent and shared rotated key part (kv_lora_rank + rope_dims; LatentAttention.
        latent_heads); a compressed layer's key head and its compressor's kv and gate projections (1 + 2 or 1 + 4
        heads of head_dim: SharedKVAttention.project_qkv); else its KV heads and head width."""
        if self.kv_lora_rank:  # a latent layer without RoPE has no shared key part
            return 1, self.kv_lora_rank + (self.rope_dims if self.pos_emb != "rope" or self.layer_rope(layer) else 0)
        if self.kv_compress_rates and self.kv_compress_rates[layer]:
            return 1 + 2 * (1 + (layer in self.kv_compress_overlap)), self.head_dim
        return self.layer_kv_heads(layer), self.layer_head_dim(layer)

    def kv_source(self, layer: int) -> int | None:
        """The layer whose keys and values layer `layer` attends over (one of the last kv_shared_layers: the last
        earlier layer of its window that computes its own; kv_source_layers' entry where it names another layer),
        or None (it computes its own)."""
        if self.kv_source_layers:
            source = self.kv_source_layers[layer]
            return None if source == layer else source
        first = self.n_layer - self.kv_shared_layers
        if layer < first:
            return None
        window = self.layer_window(layer)
        sources = [i for i in range(first) if self.layer_window(i) == window]
        return sources[-1] if sources else None

    @property
    def dt_rank(self) -> int:
        """Mamba-1's dt rank: delta_dt_rank, or Mamba's "auto" ceil(n_embd / 16)."""
        return self.delta_dt_rank or -(-self.n_embd // 16)

    @property
    def head_dim(self) -> int:
        return self.head_size if self.head_size is not None else self.n_embd // self.n_head

    @property
    def has_qkv_bias(self) -> bool:
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def gated_mlp(self) -> bool:
        return self.mlp in ("swiglu", "swiglu_clamped", "swiglu_clipped", "geglu", "relu2_glu")

    def layer_norm_position(self, layer: int) -> str:
        """Where layer `layer`'s block puts its norms: delta_norm_position on a delta layer where it is given, else
        norm_position."""
        if self.delta_norm_position and layer in self.delta_layers:
            return self.delta_norm_position
        return self.norm_position

    def layer_rel_extent(self, layer: int) -> int:
        """rel_bias_dim: the distances layer `layer`'s relative-position bias covers, its window or rel_bias_extent."""
        return self.layer_window(layer) or self.rel_bias_extent

    def layer_window(self, layer: int) -> int:
        """The sliding window of layer `layer` (0: it attends to the whole context): see sliding_window_pattern
        and window_layers."""
        if self.window_layers:
            return self.sliding_window if layer in self.window_layers else 0
        if self.sliding_window_pattern and (layer + 1) % self.sliding_window_pattern == 0:
            return 0
        return self.sliding_window

    def layer_rope(self, layer: int) -> bool:
        """Whether layer `layer` rotates its q and k (RoPE models): see nope_interval and rope_layer_theta."""
        if self.rope_layer_theta:
            return self.rope_layer_theta[layer] != 0
        return not (self.nope_interval and (layer + 1) % self.nope_interval == 0)

    @property
    def rope_bases(self) -> list[tuple[float, bool]]:
        """The RoPE tables a model holds, as (base, scaled by rope_scaling): rope_theta's first, then the windowed
        layers' (rope_local_theta, unscaled), or with rope_layer_theta each distinct base in increasing order."""
        if self.rope_layer_theta:
            return [(theta, theta != self.rope_unscaled_theta)
                    for theta in sorted({t for t in self.rope_layer_theta if t})]
        return [(self.rope_theta, True)] + ([(self.rope_local_theta, False)] if self.rope_local_theta else [])

    def layer_rope_table(self, layer: int) -> int:
        """The index into rope_bases of the table layer `layer` rotates by (see layer_rope for whether it does)."""
        if self.rope_layer_theta:
            theta = self.rope_layer_theta[layer]
            return [base for base, _ in self.rope_bases].index(theta) if theta else 0
        return int(bool(self.rope_local_theta) and self.layer_window(layer) > 0)

    @property
    def attention_layers(self) -> list[int]:
        """The layers whose token mixer is attention (not a convolution, a recurrent layer or none): those with a KV
        cache."""
        other = set(self.conv_layers) | set(self.mixer_free_layers)
        other |= set(self.delta_layers) - set(self.parallel_delta_layers)  # a parallel delta layer attends as well
        return [i for i in range(self.n_layer) if i not in other]

    @property
    def parallel_delta_layers(self) -> tuple[int, ...]:
        """The delta layers that attend as well, their mixer beside attention in the block's `mamba`: every one with
        delta_parallel (Falcon-H1's), shared_attn_layers' calls of a shared block (Zamba2's)."""
        return tuple(self.delta_layers) if self.delta_parallel else tuple(self.shared_attn_layers)

    def layer_mask(self, layer: int) -> int:
        """The key of layer `layer`'s attention mask: its sliding window (> 0), 0 for the whole context, or
        -attn_chunk for attention within chunks (a layer that rotates, with attn_chunk); `mask_allows` reads it."""
        if self.attn_chunk and self.layer_rope(layer):
            return -self.attn_chunk
        return self.layer_window(layer)

    @property
    def windows(self) -> list[int]:
        """The layers' distinct mask keys (layer_mask: a window, 0 for full attention, a negative chunk size), each
        once: attention masks are built once per key."""
        return sorted({self.layer_mask(i) for i in range(self.n_layer)})

    @property
    def padded_vocab(self) -> int:
        m = max(1, self.pad_vocab_to)
        return (self.vocab_size + m - 1) // m * m

    @property
    def head_width(self) -> int:
        """The logits' width: the token ids the head can predict (head_vocab, or the whole vocabulary)."""
        return self.head_vocab or self.vocab_size

    @property
    def padded_head(self) -> int:
        """The head's rows: head_width padded up to pad_vocab_to (padded_vocab without head_vocab)."""
        m = max(1, self.pad_vocab_to)
        return (self.head_width + m - 1) // m * m

    @property
    def hidden_dim(self) -> int:
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        hidden = 8 * self.n_embd / 3 if self.gated_mlp else 4 * self.n_embd
        return int(math.ceil(hidden / 64) * 64)

    def validate(self) -> None:
        """Raise UserError naming the first inconsistent field."""
        positive = ("vocab_size", "context_len", "n_layer", "n_embd", "n_head")
        for name in positive:
            if getattr(self, name) <= 0:
                raise UserError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.head_size is not None and self.head_size <= 0:
            raise UserError(f"model.head_size must be positive or None (n_embd / n_head), got {self.head_size}")
        if self.head_size is None and self.n_embd % self.n_head:
            raise UserError(
                f"model.n_head={self.n_head} does not divide model.n_embd={self.n_embd}; "
                f"pick a head count such as {_divisors_near(self.n_embd, self.n_head)}"
            )
        if self.kv_heads <= 0 or self.n_head % self.kv_heads:
            raise UserError(
                f"model.n_kv_head={self.n_kv_head} does not divide model.n_head={self.n_head}; "
                f"pick one of {[d for d in range(1, self.n_head + 1) if self.n_head % d == 0]}"
            )
        if not 0 <= self.head_vocab <= self.vocab_size or self.head_vocab and self.tie_embeddings:
            raise UserError(f"model.head_vocab={self.head_vocab} must lie in [0, vocab_size={self.vocab_size}] and "
                            f"needs an untied head (model.tie_embeddings=false: a tied head has every token's row)")
        if self.pos_emb == "rope" and self.head_dim % 2:
            raise UserError(f"RoPE needs an even head width, got {self.head_dim} (model.head_size or n_embd/n_head)")
        if self.rope_dims and not (self.pos_emb == "rope" or self.kv_lora_rank and self.pos_emb == "none") or (
                self.rope_dims % 2 or not 0 <= self.rope_dims <= self.head_dim):
            raise UserError(f"model.rope_dims={self.rope_dims} needs RoPE (model.pos_emb=rope) and an even number of "
                            f"dimensions up to the head width {self.head_dim} (0: the whole head)")
        if min(self.kv_lora_rank, self.q_lora_rank, self.v_head_dim) < 0 or (
                (self.q_lora_rank and not (self.kv_lora_rank or self.shared_kv_attention))
                or (self.v_head_dim and not self.kv_lora_rank)):
            raise UserError("model.q_lora_rank and v_head_dim are latent attention's (>= 0, with model.kv_lora_rank "
                            "> 0; q_lora_rank DeepSeek-V4's shared_kv_attention's too)")
        if self.latent_norm_eps < 0 or ((self.latent_key_norm or self.latent_norm_eps) and not self.kv_lora_rank):
            raise UserError("model.latent_key_norm and latent_norm_eps are latent attention's (latent_norm_eps >= 0, "
                            "with model.kv_lora_rank > 0)")
        # rope_dims may be 0 where no layer rotates (nope_interval 1: GLM-5.3-Next's latent layers, no shared key part)
        if self.kv_lora_rank and not (self.pos_emb in ("rope", "none")
                                      and (self.rope_dims or not any(map(self.layer_rope, range(self.n_layer))))
                                      and self.kv_heads == self.n_head
                                      and self.v_head_dim <= self.head_dim):
            raise UserError(f"model.kv_lora_rank={self.kv_lora_rank} (latent attention) needs a shared key part of "
                            f"each head (rope_dims > 0; rotated with model.pos_emb=rope, as it is with pos_emb=none), "
                            f"model.n_kv_head = n_head and model.v_head_dim <= "
                            f"the head width {self.head_dim}")
        if self.kv_lora_rank and (self.qk_norm or self.attn_gate == "routed" or self.attn_gate_fn != "sigmoid"
                                  or self.value_embeddings or self.has_qkv_bias or self.bias or self.nope_temperature
                                  or self.attn_sinks_windowed
                                  or (self.latent_key_norm and not all(map(self.layer_rope, range(self.n_layer))))):
            raise UserError("model.kv_lora_rank (latent attention) takes no QK-norm, routed or softplus attn_gate (a "
                            "sigmoid one a head, Ling 3's, or a value, HY-V4's), value_embeddings, biases (model.bias, "
                            "qkv_bias), nope_temperature, attn_sinks_windowed (its sinks are on every layer), or "
                            "latent_key_norm with layers without RoPE")
        self._validate_latent_extras()
        if self.nope_interval < 0 or (self.nope_interval and self.pos_emb != "rope"):
            raise UserError(f"model.nope_interval={self.nope_interval} needs RoPE (model.pos_emb=rope) and must be "
                            f">= 0 (0 = RoPE on every layer)")
        if self.norm_bias and self.norm != "layernorm":
            raise UserError("model.norm_bias needs model.norm=layernorm (an RMSNorm has no bias)")
        if not self.norm_affine and (self.norm_unit_offset or self.norm_bias):
            raise UserError("model.norm_affine=false (norms without weights) with model.norm_unit_offset or "
                            "model.norm_bias, which give them weights: drop one")
        if self.parallel_shared_norm and not self.parallel_residual:
            raise UserError("model.parallel_shared_norm needs model.parallel_residual (one norm for the two sublayers "
                            "that read the same input)")
        if self.parallel_residual and self.norm_position != "pre":
            raise UserError(f"model.parallel_residual needs pre-norm blocks (model.norm_position=pre), got "
                            f"{self.norm_position}")
        if self.rope_scaling != "none" and self.rope_factor < 1.0:
            raise UserError(f"model.rope_factor must be >= 1 with rope_scaling={self.rope_scaling}, "
                            f"got {self.rope_factor}")
        if self.rope_scaling == "llama3" and not 0 < self.rope_low_freq_factor <= self.rope_high_freq_factor:
            raise UserError("rope_scaling=llama3 needs 0 < model.rope_low_freq_factor <= model.rope_high_freq_factor, "
                            f"got {self.rope_low_freq_factor} and {self.rope_high_freq_factor}")
        if self.rope_scaling == "yarn" and not (self.rope_beta_fast > self.rope_beta_slow > 0
                                                  and self.rope_attention_factor >= 0):
            raise UserError("rope_scaling=yarn needs model.rope_beta_fast > model.rope_beta_slow > 0 and "
                            f"model.rope_attention_factor >= 0, got {self.rope_beta_fast}, {self.rope_beta_slow} and "
                            f"{self.rope_attention_factor}")
        if self.qk_norm_after_rope and not (self.qk_norm and self.qk_norm_scope == "head"):
            raise UserError("model.qk_norm_after_rope needs per-head QK-norm (model.qk_norm=true, qk_norm_scope=head)")
        if self.qk_layernorm and not (self.qk_norm and self.qk_norm_scope == "head" and not self.qk_norm_after_rope
                                      and not self.norm_unit_offset and self.norm_affine):
            raise UserError("model.qk_layernorm needs per-head QK-norm before RoPE with learned weights (model.qk_norm="
                            "true, qk_norm_scope=head; no qk_norm_after_rope, norm_unit_offset or norm_affine=false)")
        if self.qk_layernorm_per_head and not self.qk_layernorm:
            raise UserError("model.qk_layernorm_per_head needs model.qk_layernorm=true (a LayerNorm QK-norm)")
        if self.rope_scaling == "longrope":
            pairs = (self.rope_dims or self.head_dim) // 2
            if len(self.rope_pair_factors) != pairs or min(self.rope_pair_factors) <= 0 or \
                    len(self.rope_long_pair_factors) not in (0, pairs) or self.rope_attention_factor < 0:
                raise UserError(f"rope_scaling=longrope needs {pairs} model.rope_pair_factors above 0 (one per "
                                f"rotating dimension pair; model.rope_long_pair_factors none or as many), got "
                                f"{len(self.rope_pair_factors)} and {len(self.rope_long_pair_factors)}")
            if self.context_len > self.rope_original_context and not self.rope_long_pair_factors:
                raise UserError(f"model.context_len={self.context_len} with rope_scaling=longrope past "
                                f"rope_original_context={self.rope_original_context} needs model.rope_long_pair_factors "
                                f"(LongRoPE's factors for long contexts); keep context_len <= "
                                f"{self.rope_original_context}")
        elif self.rope_pair_factors or self.rope_long_pair_factors:
            raise UserError("model.rope_pair_factors are LongRoPE's: set model.rope_scaling=longrope with them")
        if self.rope_pair_log_scales and (self.pos_emb != "rope" or self.rope_local_theta or self.rope_local_dims
                                          or len(self.rope_pair_log_scales) != (self.rope_dims or self.head_dim) // 2):
            raise UserError(f"model.rope_pair_log_scales scales each rotated pair's frequency: it needs RoPE "
                            f"(model.pos_emb=rope) with one table (no rope_local_theta or rope_local_dims) and "
                            f"{(self.rope_dims or self.head_dim) // 2} entries, got {len(self.rope_pair_log_scales)}")
        if not 0 < self.rope_proportion <= 1 or (self.rope_proportion != 1 and self.rope_scaling != "proportional"):
            raise UserError(f"model.rope_proportion={self.rope_proportion} must be in (0, 1], and below 1 only with "
                            f"model.rope_scaling=proportional")
        if min(self.embed_multiplier, self.residual_multiplier, self.logit_divisor) < 0:
            raise UserError(f"model.embed_multiplier, residual_multiplier and logit_divisor must be >= 0 (0 = 1), got "
                            f"{self.embed_multiplier}, {self.residual_multiplier} and {self.logit_divisor}")
        if self.embed_multiplier and self.embed_scale:
            raise UserError("model.embed_multiplier with model.embed_scale: give the embeddings' factor one way")
        if self.logit_divisor and self.ce_chunk_tokens:
            raise UserError("model.logit_divisor with model.ce_chunk_tokens is not implemented (the chunked loss "
                            "takes the head's raw logits); turn one of them off")
        if self.logit_softcap < 0:
            raise UserError(f"model.logit_softcap must be >= 0 (0 = off), got {self.logit_softcap}")
        if self.logit_softcap and self.ce_chunk_tokens:
            raise UserError("model.logit_softcap with model.ce_chunk_tokens is not implemented (the chunked loss "
                            "takes the head's raw logits); turn one of them off")
        if self.sliding_window < 0:
            raise UserError(f"model.sliding_window must be >= 0 (0 = off), got {self.sliding_window}")
        if self.sliding_window_pattern < 0 or (self.sliding_window_pattern and not self.sliding_window):
            raise UserError(f"model.sliding_window_pattern={self.sliding_window_pattern} needs a model.sliding_window "
                            f"and must be >= 0 (0 = every layer windowed)")
        if self.window_layers and (not self.sliding_window or self.sliding_window_pattern
                                   or sorted(set(self.window_layers)) != list(self.window_layers)
                                   or not 0 <= self.window_layers[0] <= self.window_layers[-1] < self.n_layer):
            raise UserError(f"model.window_layers={self.window_layers} must name distinct layers in increasing order, "
                            f"each in [0, n_layer={self.n_layer}), with a model.sliding_window and no "
                            f"model.sliding_window_pattern (give the windowed layers one way)")
        if self.rope_layer_theta and (self.pos_emb != "rope" or len(self.rope_layer_theta) != self.n_layer
                                      or min(self.rope_layer_theta) < 0 or self.rope_local_theta
                                      or self.nope_interval):
            raise UserError(f"model.rope_layer_theta needs RoPE (model.pos_emb=rope) and one base >= 0 per layer "
                            f"({self.n_layer}, 0 = no RoPE), got {len(self.rope_layer_theta)}, with neither "
                            f"model.rope_local_theta nor model.nope_interval (give the layers' RoPE one way)")
        if self.attn_softcap < 0:
            raise UserError(f"model.attn_softcap must be >= 0 (0 = off), got {self.attn_softcap}")
        if self.attn_sinks_windowed and not (self.attn_sinks and self.sliding_window):
            raise UserError("model.attn_sinks_windowed puts the sinks on the windowed layers alone: it needs "
                            "model.attn_sinks and a model.sliding_window")
        if self.attn_chunk < 0 or (self.attn_chunk and (self.pos_emb != "rope" or self.sliding_window
                                                        or self.conv_layers or self.delta_layers
                                                        or self.kv_lora_rank)):
            raise UserError(f"model.attn_chunk={self.attn_chunk} must be >= 0 (0 = off) and takes RoPE "
                            f"(model.pos_emb=rope) with attention on every layer, no model.sliding_window and no "
                            f"latent attention (model.kv_lora_rank)")
        if self.nope_temperature < 0 or self.nope_temperature_floor < 1 or (
                self.nope_temperature and self.pos_emb != "rope"):
            raise UserError(f"model.nope_temperature={self.nope_temperature} must be >= 0 (0 = off) with RoPE "
                            f"(model.pos_emb=rope) and nope_temperature_floor >= 1, got {self.nope_temperature_floor}")
        if self.rope_qk_norm and self.pos_emb != "rope":
            raise UserError("model.rope_qk_norm normalizes q and k on the layers that rotate: it takes RoPE "
                            "(model.pos_emb=rope)")
        if self.pos_emb == "alibi" and (self.attn_softcap or self.attn_sinks or self.doc_attention == "flex"):
            raise UserError("model.pos_emb=alibi adds its bias through SDPA's float mask: it does not take "
                            "model.attn_softcap, model.attn_sinks or model.doc_attention=flex (use doc_attention "
                            "auto or sdpa)")
        if self.attn_scale < 0 or self.rope_local_theta < 0:
            raise UserError(f"model.attn_scale and model.rope_local_theta must be >= 0 (0 = the default), got "
                            f"{self.attn_scale} and {self.rope_local_theta}")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if not 0 <= self.value_embeddings <= (self.n_layer + 1) // 2:
            raise UserError(f"model.value_embeddings must be in [0, ceil(n_layer / 2) = {(self.n_layer + 1) // 2}] "
                            f"(each table serves one early and one late layer), got {self.value_embeddings}")
        ve_layers = self.value_embed_layers
        if ve_layers and (self.value_embeddings or sorted(set(ve_layers)) != list(ve_layers)
                          or not 0 <= ve_layers[0] <= ve_layers[-1] < self.n_layer):
            raise UserError(f"model.value_embed_layers={self.value_embed_layers} must name distinct layers in "
                            f"increasing order, each in [0, n_layer={self.n_layer}), without model.value_embeddings")
        if min(self.value_embed_gate, self.smear_gate) < 0 or max(self.value_embed_gate, self.smear_gate) > self.n_embd:
            raise UserError(f"model.value_embed_gate and model.smear_gate read that many leading channels: each in "
                            f"[0, n_embd={self.n_embd}], got {self.value_embed_gate} and {self.smear_gate}")
        if self.smear_gate and self.pos_emb == "learned":
            raise UserError("model.smear_gate with model.pos_emb=learned: the smear reads token vectors alone; use "
                            "pos_emb=rope or none")
        if self.value_embed_gate and not self.value_tables:
            raise UserError("model.value_embed_gate gates value embeddings: set model.value_embed_layers (or "
                            "model.value_embeddings) with it")
        if (self.head_transform and self.mlp not in ("gelu", "geglu")) or (
                self.first_norm_free and (self.norm_position != "pre" or self.parallel_residual)):
            raise UserError("model.head_transform takes a GELU MLP (model.mlp gelu or geglu: its activation), "
                            "model.first_norm_free sequential pre-norm blocks")
        if self.prefix_lm and (self.conv_layers or self.delta_layers or self.pos_emb == "alibi" or self.qsa_heads):
            raise UserError("model.prefix_lm attends the prefix both ways: its layers must be attention without ALiBi "
                            "or a QSA indexer (no model.conv_layers, model.delta_layers, which read tokens in order)")
        if self.reference_window and (not self.sliding_window or self.prefix_lm or self.attn_chunk
                                      or self.pos_emb == "alibi" or self.qsa_heads or self.kv_compress_rates):
            raise UserError("model.reference_window keeps the prompt visible beside a sliding window: it needs "
                            "model.sliding_window, without prefix_lm, attn_chunk, ALiBi, qsa_heads or "
                            "kv_compress_rates")
        if self.doc_attention == "flex" and self.dropout:
            raise UserError("model.doc_attention=flex has no attention dropout; use doc_attention=sdpa (or auto) "
                            "with model.dropout")
        if self.mlp_hidden is not None and self.mlp_hidden <= 0:
            raise UserError(f"model.mlp_hidden must be positive or None, got {self.mlp_hidden}")
        if self.conv_layers and (sorted(set(self.conv_layers)) != list(self.conv_layers)
                                 or not 0 <= self.conv_layers[0] <= self.conv_layers[-1] < self.n_layer
                                 or self.conv_kernel < 1 or self.value_tables):
            raise UserError(f"model.conv_layers={self.conv_layers} must name distinct layers in increasing order, each "
                            f"in [0, n_layer={self.n_layer}), with model.conv_kernel >= 1 and no value embeddings")
        if self.delta_layers and (sorted(set(self.delta_layers)) != list(self.delta_layers)
                                  or not 0 <= self.delta_layers[0] <= self.delta_layers[-1] < self.n_layer
                                  or set(self.delta_layers) & set(self.conv_layers) or self.delta_heads < 1
                                  or self.delta_key_heads < 1 or self.delta_heads % self.delta_key_heads
                                  or min(self.delta_key_dim, self.delta_value_dim, self.delta_conv_kernel) < 1
                                  or self.value_tables):
            raise UserError(f"model.delta_layers={self.delta_layers} must name distinct layers in increasing order, "
                            f"each in [0, n_layer={self.n_layer}) and none of model.conv_layers, with "
                            f"model.delta_heads >= 1 a multiple of model.delta_key_heads >= 1, positive widths and "
                            f"kernel, and no value embeddings")
        if self.delta_rule not in ("gated_delta", "mamba2", "mamba1", "rglru", "lightning", "rwkv", "mlstm"):
            raise UserError(f"model.delta_rule={self.delta_rule!r}: one of gated_delta, mamba2, mamba1, rglru, "
                            f"lightning, rwkv, mlstm")
        if self.delta_rule == "rwkv" and self.delta_layers and (
                (self.delta_heads, self.delta_key_heads, self.delta_key_dim) != (1, 1, 1) or self.delta_parallel
                or self.delta_conv_bias or self.delta_proj_bias):
            raise UserError(f"model.delta_rule=rwkv keeps a state a channel of delta_value_dim channels and has no "
                            f"convolution or biases: set model.delta_heads, delta_key_heads and delta_key_dim to 1, "
                            f"no delta_parallel, delta_conv_bias or delta_proj_bias")
        if self.mlp == "rwkv" and (self.delta_rule != "rwkv" or self.delta_layers != tuple(range(self.n_layer))
                                   or self.moe_experts or self.norm_position != "pre" or self.parallel_residual
                                   or self.normed_residual or self.mlp_free_layers or self.mixer_free_layers
                                   or self.hc_streams or self.mhc_streams or self.altup_streams or self.moe_shortcut):
            raise UserError("model.mlp=rwkv (RWKV-4's channel mixing) keeps its token shift in the cache of an RWKV "
                            "time-mixing layer: it takes model.delta_rule=rwkv on every layer (delta_layers), pre-norm "
                            "blocks of both sublayers in turn and no experts or further streams")
        if self.delta_rule == "mlstm" and self.delta_layers and (
                self.delta_key_heads != self.delta_heads or self.delta_parallel or self.delta_conv_bias
                or self.delta_proj_bias):
            raise UserError(f"model.delta_rule=mlstm has a gate pair and a memory a head and no convolution or "
                            f"biases: set model.delta_key_heads = delta_heads ({self.delta_heads}), no "
                            f"delta_parallel, delta_conv_bias or delta_proj_bias")
        if self.delta_gate_softcap < 0 or (self.delta_gate_softcap and self.delta_rule != "mlstm"):
            raise UserError(f"model.delta_gate_softcap={self.delta_gate_softcap}: the mLSTM gates' soft cap, >= 0, "
                            f"with model.delta_rule=mlstm")
        if self.rescale_every < 0:
            raise UserError(f"model.rescale_every={self.rescale_every} must be >= 0 (0: every norm at norm_eps)")
        if self.delta_rule == "lightning" and self.delta_layers and (
                self.delta_key_heads != self.delta_heads or self.delta_key_dim != self.delta_value_dim
                or self.delta_parallel or self.delta_conv_bias or self.delta_proj_bias):
            raise UserError(f"model.delta_rule=lightning has one q, k and v a head, all of one width, and no "
                            f"convolution or biases: set model.delta_key_heads = delta_heads ({self.delta_heads}), "
                            f"delta_key_dim = delta_value_dim ({self.delta_value_dim}), no delta_parallel")
        if self.normed_residual and (len(self.normed_residual) != 6 or self.norm_position != "pre"
                                     or self.delta_norm_position not in ("", "pre") or self.parallel_residual
                                     or self.residual_scales or self.residual_multiplier or self.mlp_free_layers
                                     or self.mixer_free_layers or self.delta_parallel or self.hc_streams
                                     or self.mhc_streams or self.altup_streams):
            raise UserError(f"model.normed_residual={self.normed_residual} takes six scales (α, β of attention, of "
                            f"delta layers, of MLPs) and pre-norm blocks of both sublayers run in turn on one stream "
                            f"(no parallel_residual, residual_scales, residual_multiplier, mlp_free or mixer_free "
                            f"layers, delta_parallel or hyper-connections)")
        if self.delta_rule == "rglru" and self.delta_layers and (self.delta_key_dim != 1 or self.delta_parallel
                                                                 or self.delta_heads <= 0 or self.delta_value_dim <= 0):
            raise UserError(f"model.delta_rule=rglru keeps a state a channel in delta_heads blocks of delta_value_dim "
                            f"channels: set model.delta_key_dim=1 (got {self.delta_key_dim}), delta_heads and "
                            f"delta_value_dim > 0, no delta_parallel")
        if self.delta_rule == "gated_delta" and (self.delta_conv_bias or self.delta_proj_bias):
            raise UserError("model.delta_conv_bias and model.delta_proj_bias are Mamba's: they take "
                            "model.delta_rule=mamba2 or mamba1")
        if self.delta_decay not in ("head", "channel", "bounded"):
            raise UserError(f"model.delta_decay={self.delta_decay!r}: one of head, channel, bounded")
        kda = self.delta_decay != "head"
        if kda and (self.delta_rule != "gated_delta" or not self.delta_layers):
            raise UserError(f"model.delta_decay={self.delta_decay} is Kimi Delta Attention's: it takes "
                            f"model.delta_layers with delta_rule=gated_delta")
        if self.delta_gate_rank < 0 or (self.delta_gate_rank and not kda):
            raise UserError(f"model.delta_gate_rank={self.delta_gate_rank} is Kimi Delta Attention's gate rank: >= 0, "
                            f"with model.delta_decay channel or bounded")
        if (self.delta_decay == "bounded") != (self.delta_decay_floor < 0) or self.delta_decay_floor > 0:
            raise UserError(f"model.delta_decay_floor={self.delta_decay_floor} bounds a KDA decay: < 0, with "
                            f"model.delta_decay=bounded (and only there)")
        if self.delta_rule != "gated_delta" and self.delta_beta_scale != 1.0:
            raise UserError(f"model.delta_beta_scale scales a gated delta net's correction; Mamba "
                            f"(model.delta_rule={self.delta_rule}) has none")
        if self.delta_rule == "mamba1" and self.delta_layers and (
                self.delta_value_dim != 1 or self.delta_key_heads < 1 or self.delta_heads % self.delta_key_heads
                or (self.delta_key_heads > 1 and self.delta_bcdt_norm_eps)):
            raise UserError(f"model.delta_rule=mamba1 has states of one channel in delta_key_heads groups, each with "
                            f"its own x_proj and dt_proj (Zamba's n_mamba_heads; no dt, B and C norms with more than "
                            f"one): set model.delta_value_dim=1 (not {self.delta_value_dim}) and delta_key_heads >= 1 "
                            f"dividing delta_heads={self.delta_heads} (not {self.delta_key_heads}); delta_heads is the "
                            f"inner width, delta_key_dim the state size")
        if self.delta_rule == "mamba1" and self.delta_norm_eps:
            raise UserError(f"model.delta_norm_eps={self.delta_norm_eps}: Mamba-1 (model.delta_rule=mamba1) has no "
                            f"output norm; its B, C and dt norms' epsilon is model.delta_bcdt_norm_eps")
        if self.delta_dt_rank < 0 or (self.delta_dt_rank and self.delta_rule != "mamba1"):
            raise UserError(f"model.delta_dt_rank={self.delta_dt_rank} is Mamba-1's dt rank: >= 0 (0: "
                            f"ceil(n_embd / 16)), with model.delta_rule=mamba1")
        if self.delta_bcdt_norm_eps < 0 or (self.delta_bcdt_norm_eps and self.delta_rule != "mamba1"):
            raise UserError(f"model.delta_bcdt_norm_eps={self.delta_bcdt_norm_eps} is Falcon-Mamba's B, C and dt "
                            f"norms' epsilon: > 0 to have them, with model.delta_rule=mamba1")
        if self.delta_bcdt_norm_weight and not self.delta_bcdt_norm_eps:
            raise UserError("model.delta_bcdt_norm_weight puts weights on Mamba-1's dt, B and C norms: it takes the "
                            "norms, model.delta_bcdt_norm_eps > 0 (with model.delta_rule=mamba1)")
        if self.delta_dt_min < 0 or (self.delta_dt_min and self.delta_rule != "mamba2"):
            raise UserError(f"model.delta_dt_min={self.delta_dt_min} is Mamba-2's least time step: >= 0, with "
                            f"model.delta_rule=mamba2")
        if self.delta_parallel and (not self.delta_layers or self.delta_rule != "mamba2"
                                    or self.norm_position != "pre" or self.delta_norm_position not in ("", "pre")
                                    or self.parallel_residual or self.mlp_free_layers or self.mixer_free_layers):
            raise UserError("model.delta_parallel runs Mamba-2 beside attention (Falcon-H1's layers): it takes "
                            "model.delta_layers with delta_rule=mamba2 in pre-norm blocks of both sublayers (no "
                            "parallel_residual, mlp_free_layers or mixer_free_layers)")
        if self.delta_gate_norm not in ("after_gate", "before_gate", "none"):
            raise UserError(f"model.delta_gate_norm={self.delta_gate_norm!r}: one of after_gate, before_gate, none")
        shared = self.shared_attn_layers
        if shared and (self.delta_rule not in ("mamba2", "mamba1") or not set(shared) <= set(self.delta_layers) & set(
                self.mlp_free_layers) or list(shared) != sorted(set(shared)) or self.delta_parallel
                       or not self.gated_mlp or not self.fused_qkv or self.kv_lora_rank or self.qk_norm
                       or self.attn_gate != "none" or self.sliding_window or self.attn_sinks or self.attn_softcap
                       or self.norm != "rmsnorm" or self.norm_position != "pre" or self.bias or self.has_qkv_bias
                       or self.per_layer_embd or self.layer_scalars):
            raise UserError(f"model.shared_attn_layers={shared} (Zamba's hybrid layers) must be Mamba layers alone "
                            f"(model.delta_layers with delta_rule=mamba2 or mamba1, mlp_free_layers), in increasing order, "
                            f"calling a pre-RMSNorm block of fused-qkv attention without biases, QK-norm, gates, "
                            f"sinks, caps or a window and a gated MLP (and no per-layer inputs or scalars)")
        if self.shared_attn_blocks < 1 or (shared and self.shared_attn_blocks > len(shared)) or (
                self.shared_attn_adapter_rank < 0) or (
                self.shared_attn_qkv_adapters and not self.shared_attn_adapter_rank):
            raise UserError(f"model.shared_attn_blocks={self.shared_attn_blocks} must be >= 1 and at most the "
                            f"layers that call them (model.shared_attn_layers), and "
                            f"model.shared_attn_adapter_rank={self.shared_attn_adapter_rank} >= 0 (> 0 with "
                            f"model.shared_attn_qkv_adapters)")
        if self.delta_gate_norm != "after_gate" and self.delta_rule != "mamba2":
            raise UserError(f"model.delta_gate_norm={self.delta_gate_norm} places Mamba-2's output norm: it takes "
                            f"model.delta_rule=mamba2")
        for name in ("mlp_free_layers", "mixer_free_layers"):
            layers = getattr(self, name)
            if layers and (sorted(set(layers)) != list(layers) or not 0 <= layers[0] <= layers[-1] < self.n_layer):
                raise UserError(f"model.{name}={layers} must name distinct layers in increasing order, each in "
                                f"[0, n_layer={self.n_layer})")
        if set(self.mixer_free_layers) & (set(self.mlp_free_layers) | set(self.conv_layers) | set(self.delta_layers)):
            raise UserError(f"model.mixer_free_layers={self.mixer_free_layers} names a layer that has a token mixer "
                            f"(model.mlp_free_layers, conv_layers or delta_layers) or would have nothing at all")
        if (self.mlp_free_layers or self.mixer_free_layers) and (
                self.norm_position != "pre" or self.delta_norm_position not in ("", "pre") or self.parallel_residual
                or self.value_tables):
            raise UserError("model.mlp_free_layers and mixer_free_layers take pre-norm blocks run in turn "
                            "(model.norm_position=pre, no parallel_residual) and no value embeddings")
        if self.delta_norm_position and (self.norm_position == "post" or self.parallel_residual):
            raise UserError(f"model.delta_norm_position={self.delta_norm_position} takes blocks whose norms are on "
                            f"the sublayers (model.norm_position pre, output or sandwich) run in turn")
        if self.moe_experts < 0 or (self.moe_experts and not 1 <= self.moe_top_k <= self.moe_experts):
            raise UserError(f"model.moe_experts={self.moe_experts} needs 1 <= model.moe_top_k <= moe_experts, got "
                            f"moe_top_k={self.moe_top_k}")
        if self.moe_experts and self.moe_bias and not self.gated_mlp:
            raise UserError(f"model.moe_bias takes gated experts (model.mlp=swiglu, swiglu_clamped or geglu), got "
                            f"mlp={self.mlp}")
        if self.moe_groups < 1 or (self.moe_groups > 1 and not (
                self.moe_experts and self.moe_experts % self.moe_groups == 0
                and 1 <= self.moe_topk_groups <= self.moe_groups
                and self.moe_top_k <= self.moe_topk_groups * self.moe_experts // self.moe_groups
                and self.moe_experts // self.moe_groups >= 2)):
            raise UserError(f"model.moe_groups={self.moe_groups} must divide model.moe_experts={self.moe_experts} into "
                            f"groups of 2 or more, with 1 <= moe_topk_groups={self.moe_topk_groups} <= moe_groups "
                            f"holding moe_top_k={self.moe_top_k} experts")
        if (self.moe_gating != "softmax" or self.moe_expert_bias or self.moe_scale != 1.0 or self.moe_dense_layers
                or self.moe_dense_hidden or self.moe_weight_input) and not self.moe_experts:
            raise UserError("model.moe_gating, moe_expert_bias, moe_scale, moe_dense_layers, moe_dense_hidden and "
                            "moe_weight_input need experts (model.moe_experts)")
        if not 0 <= self.moe_norm_eps < 1e-3:
            raise UserError(f"model.moe_norm_eps={self.moe_norm_eps} must be in [0, 1e-3): a guard against a zero sum")
        if self.moe_norm_min < 0 or (self.moe_norm_min and not (self.moe_experts and self.moe_gating == "softmax"
                                                                and self.moe_norm_topk)):
            raise UserError(f"model.moe_norm_min={self.moe_norm_min} must be >= 0 and needs experts with softmax "
                            f"scores rescaled to sum to 1 (model.moe_experts, moe_gating=softmax, moe_norm_topk)")
        if self.attn_gate_fn != "sigmoid" and self.attn_gate in ("none", "routed"):
            raise UserError(f"model.attn_gate_fn={self.attn_gate_fn} needs a gate on the heads (model.attn_gate=head "
                            f"or element)")
        if (self.attn_gate == "routed") != (self.attn_experts != 0) or (self.attn_experts and (
                self.attn_experts < 2 or self.n_head != self.attn_experts * self.kv_heads
                or not 1 <= self.moe_top_k <= self.attn_experts)):
            raise UserError(f"model.attn_gate=routed and model.attn_experts go together: at least 2 experts, "
                            f"n_head = attn_experts · n_kv_head and 1 <= moe_top_k <= attn_experts (got attn_gate="
                            f"{self.attn_gate}, attn_experts={self.attn_experts}, n_head={self.n_head}, n_kv_head="
                            f"{self.kv_heads}, moe_top_k={self.moe_top_k})")
        if self.moe_out_bias and not self.moe_experts:
            raise UserError("model.moe_out_bias is a bias on a mixture's output: it needs model.moe_experts")
        if self.rope_local_dims and (not self.rope_local_theta or self.rope_local_dims % 2
                                     or not 0 < self.rope_local_dims <= self.head_dim):
            raise UserError(f"model.rope_local_dims={self.rope_local_dims} needs the windowed layers' own RoPE table "
                            f"(model.rope_local_theta) and an even number of dimensions up to the head width "
                            f"{self.head_dim}")
        if self.moe_bias_on_logits and not (self.moe_expert_bias and self.moe_gating == "sigmoid"):
            raise UserError("model.moe_bias_on_logits needs a routing bias on sigmoid scores (model.moe_expert_bias, "
                            "moe_gating=sigmoid)")
        if self.moe_bias_update < 0 or (self.moe_bias_update and not self.moe_expert_bias):
            raise UserError(f"model.moe_bias_update={self.moe_bias_update} must be >= 0 and needs the experts' routing "
                            f"bias (model.moe_expert_bias=true)")
        if self.moe_layers and (not self.moe_experts or self.moe_dense_layers
                                or sorted(set(self.moe_layers)) != list(self.moe_layers)
                                or not 0 <= self.moe_layers[0] <= self.moe_layers[-1] < self.n_layer):
            raise UserError(f"model.moe_layers={self.moe_layers} must name distinct layers in increasing order, each "
                            f"in [0, n_layer={self.n_layer}), with experts (model.moe_experts) and without "
                            f"model.moe_dense_layers (moe_layers says which layers are dense)")
        if set(self.moe_layers) & set(self.mlp_free_layers):
            raise UserError(f"model.moe_layers={self.moe_layers} names a layer without an MLP (model.mlp_free_layers="
                            f"{self.mlp_free_layers})")
        if not 0 <= self.moe_dense_layers <= self.n_layer:
            raise UserError(f"model.moe_dense_layers={self.moe_dense_layers} must be in [0, n_layer={self.n_layer}]")
        if self.moe_experts and self.bias and not self.moe_bias and (
                self.moe_shared_hidden or self.moe_dense_layers or self.moe_layers or self.moe_beside_dense):
            raise UserError("model.bias=true with model.moe_experts and dense or shared MLPs needs model.moe_bias "
                            "(experts with biases, GPT-OSS's; model.qkv_bias puts biases on q/k/v alone; with every "
                            "MLP a mixture of experts without them, bias=true is the attention's alone, PhiMoE's)")
        if self.moe_gating == "sparsemixer" and (
                self.moe_top_k != 2 or self.moe_norm_topk or self.moe_expert_bias or self.moe_groups > 1
                or self.moe_scale != 1.0 or self.moe_weight_input or self.moe_aux_loss or self.moe_beside_dense):
            raise UserError("model.moe_gating=sparsemixer takes moe_top_k=2 and moe_norm_topk=false, with no expert "
                            "bias, groups, weight scale, input weighting, load-balancing loss or moe_beside_dense")
        if self.moe_jitter_eps < 0 or (self.moe_jitter_eps and self.moe_gating != "sparsemixer"):
            raise UserError(f"model.moe_jitter_eps={self.moe_jitter_eps} must be >= 0 and needs "
                            f"model.moe_gating=sparsemixer")
        if not 0 <= self.moe_input_jitter < 1 or (self.moe_input_jitter and not self.moe_experts):
            raise UserError(f"model.moe_input_jitter={self.moe_input_jitter} must be in [0, 1) and needs experts "
                            f"(model.moe_experts)")
        if self.qkv_clip < 0 or (self.qkv_clip and self.kv_lora_rank):
            raise UserError(f"model.qkv_clip={self.qkv_clip} must be >= 0 and takes q/k/v projections (no "
                            f"model.kv_lora_rank)")
        if self.moe_bias and (not self.moe_experts or self.moe_shared_hidden or self.moe_dense_layers):
            raise UserError("model.moe_bias needs experts (model.moe_experts) and is not implemented with "
                            "model.moe_shared_hidden or moe_dense_layers")
        if self.mlp == "xielu" and (self.moe_experts or not self.xielu_beta < 0.8 or self.xielu_eps > 0):
            raise UserError(f"model.mlp=xielu takes a dense MLP (no model.moe_experts), model.xielu_beta < 0.8 and "
                            f"model.xielu_eps <= 0, got beta={self.xielu_beta}, eps={self.xielu_eps}")
        if self.swiglu_limit <= 0:
            raise UserError(f"model.swiglu_limit must be > 0, got {self.swiglu_limit}")
        for name in ("swiglu_act_limits", "moe_swiglu_act_limits"):
            limits = getattr(self, name)
            if limits and (len(limits) != self.n_layer or min(limits) < 0 or self.mlp != "swiglu"
                           or self.shared_attn_layers  # Zamba2's shared blocks compute their MLP unclamped
                           or name == "moe_swiglu_act_limits" and (not self.moe_experts or self.moe_swiglu_limit)):
                raise UserError(f"model.{name}={limits}: one clamp >= 0 a layer ({self.n_layer}) on a SwiGLU MLP "
                                f"(model.mlp=swiglu{', moe_experts, no moe_swiglu_limit' if 'moe' in name else ''}; "
                                f"no shared_attn_layers)")
        if self.moe_swiglu_limit < 0 or (self.moe_swiglu_limit and not (self.moe_experts and self.mlp == "swiglu")):
            raise UserError(f"model.moe_swiglu_limit={self.moe_swiglu_limit} clamps the routed experts' SwiGLU: it "
                            f"needs model.moe_experts with mlp=swiglu and must be >= 0 (0 = off)")
        if min(self.moe_shared_hidden, self.moe_aux_loss) < 0 or (
                (self.moe_shared_hidden or self.moe_aux_loss) and not self.moe_experts):
            raise UserError("model.moe_shared_hidden and model.moe_aux_loss are >= 0 and need experts "
                            "(model.moe_experts)")
        self._validate_layerwise_attention()
        self._validate_shortcut_moe()
        if self.norm_gate_rank < 0 or (self.norm_gate_rank and (
                self.norm != "rmsnorm" or self.norm_position != "pre" or self.norm_unit_offset or not self.norm_affine
                or self.parallel_residual)):
            raise UserError(f"model.norm_gate_rank={self.norm_gate_rank} (A.X-K2's gated norms) is >= 0 and takes "
                            f"pre-norm blocks of plain RMSNorms with weights, not parallel_residual")
        if self.q_latent_gate and not (self.kv_lora_rank and self.q_lora_rank and self.attn_gate == "none"):
            raise UserError("model.q_latent_gate gates latent attention's heads from its query latent: it needs "
                            "model.kv_lora_rank and model.q_lora_rank, and no other gate (model.attn_gate=none)")
        self._validate_altup()
        self._validate_mhc()
        self._validate_shared_kv()
        self._validate_hyper_connections()
        self._validate_bitnet()
        self._validate_ngpt()
        self._validate_zaya()
        if (self.attn_key_bias or self.residual_scales) and (self.kv_lora_rank or self.conv_layers or self.delta_layers
                                                              or self.mixer_free_layers or self.mlp_free_layers
                                                              or self.norm_position != "pre" or self.parallel_residual
                                                              or self.attn_softcap or self.attn_sinks
                                                              or self.pos_emb == "alibi" or self.diff_attention
                                                              or self.kv_shared_layers):
            raise UserError("model.attn_key_bias and model.residual_scales are Doge's: pre-norm blocks of sequential "
                            "sublayers with plain attention on every layer (no kv_lora_rank, conv_layers, "
                            "delta_layers, attn_softcap, attn_sinks, alibi, diff_attention or kv_shared_layers)")
        if self.kv_conv and (self.kv_conv < 2 or self.pos_emb == "rope" or self.kv_lora_rank
                             or self.shared_kv_attention or self.diff_attention or self.attn_key_bias
                             or self.kv_shared_layers or self.shared_attn_layers or self.value_embeddings
                             or self.value_embed_layers or self.v_norm or self.global_values_from_keys
                             or self.fused_qkv or (self.qk_norm and (self.qk_norm_scope != "head"
                                                                     or self.qk_layernorm))):
            raise UserError(f"model.kv_conv={self.kv_conv} convolves the raw k and v projections before QK-norm: it "
                            f"needs a kernel of at least 2, separate q/k/v (fused_qkv=false), no RoPE (pos_emb "
                            f"none, learned or alibi), per-head RMS QK-norm if any, and plain attention (no "
                            f"kv_lora_rank, shared_kv_attention, diff_attention, attn_key_bias, kv_shared_layers, "
                            f"shared_attn_layers, value embeddings, v_norm or global_values_from_keys)")
        if self.rel_bias_dim and (self.rel_bias_extent <= 0 or self.kv_lora_rank or self.shared_kv_attention
                                  or self.diff_attention or self.attn_key_bias or self.attn_softcap
                                  or self.attn_sinks or self.pos_emb == "alibi" or self.doc_attention == "flex"
                                  or self.prefix_lm or self.attn_chunk or self.kv_shared_layers
                                  or self.shared_attn_layers or self.attn_gate == "routed"):
            raise UserError(f"model.rel_bias_dim adds a dense relative-position bias to plain attention's scores: it "
                            f"needs model.rel_bias_extent > 0 (got {self.rel_bias_extent}) and no kv_lora_rank, "
                            f"shared_kv_attention, diff_attention, attn_key_bias, attn_softcap, attn_sinks, alibi, "
                            f"doc_attention=flex, prefix_lm, attn_chunk, kv_shared_layers, shared_attn_layers or "
                            f"routed heads")
        if self.diff_attention and (self.n_head % 2 or self.kv_heads % 2 or self.kv_lora_rank or self.conv_layers
                                    or self.delta_layers or self.attn_sinks or self.attn_gate != "none"
                                    or self.kv_shared_layers or self.global_head_size or self.value_embeddings
                                    or self.dropout):
            raise UserError(f"model.diff_attention pairs heads and halves the values: it needs an even model.n_head "
                            f"and n_kv_head (got {self.n_head} and {self.kv_heads}), plain attention on every layer "
                            f"(no kv_lora_rank, conv_layers, delta_layers, attn_sinks, attn_gate, kv_shared_layers, "
                            f"global_head_size, value_embeddings) and no dropout")
        if self.ce_chunk_tokens < 0:
            raise UserError(f"model.ce_chunk_tokens must be >= 0 (0 = off, else tokens per chunk such as 8192), "
                            f"got {self.ce_chunk_tokens}")

    def _validate_zaya(self) -> None:
        if self.cca_kernels and (len(self.cca_kernels) != 2 or min(self.cca_kernels) < 1):
            raise UserError(f"model.cca_kernels takes two kernel widths >= 1 (depthwise, grouped), got "
                            f"{list(self.cca_kernels)}")
        if self.cca_kernels and ((self.kv_heads * self.head_dim) % 2 or self.fused_qkv or self.has_qkv_bias
                                 or self.qk_norm or self.qk_layernorm or self.kv_lora_rank or self.conv_layers
                                 or self.delta_layers or self.mixer_free_layers or self.diff_attention
                                 or self.attn_key_bias or self.shared_kv_attention or self.value_embeddings
                                 or self.kv_shared_layers or self.global_head_size or self.attn_gate != "none"
                                 or self.v_norm or self.qkv_clip or self.ngpt or self.qsa_heads
                                 or self.shared_attn_layers or self.rel_bias_dim or self.kv_conv
                                 or self.pos_emb == "alibi"):
            raise UserError("model.cca_kernels (ZAYA's attention) takes separate unbiased q/k/v projections with an "
                            "even n_kv_head·head_size, on every layer, with no other QK-norm, gate, latent, shared or "
                            "recurrent attention option and no ALiBi")
        streams = (self.hc_streams or self.mhc_streams or self.altup_streams or self.moe_shortcut
                   or self.loop_section or self.layer_lambdas)
        if (self.residual_affine or self.moe_router_hidden) and (
                self.norm_position != "pre" or self.parallel_residual or streams or self.residual_scales
                or self.normed_residual or self.mixer_free_layers or self.mlp_free_layers or self.per_layer_embd
                or self.shared_attn_layers or self.delta_parallel or self.backout):
            raise UserError("model.residual_affine and model.moe_router_hidden are ZAYA's: pre-norm blocks of "
                            "attention then MLP on one stream (no parallel_residual, streams, residual_scales, "
                            "normed_residual, per-layer inputs, backout or sublayer-free layers)")
        if self.moe_router_hidden and (not self.moe_experts or self.moe_top_k != 1 or not self.gated_mlp
                                       or self.moe_dense_layers or self.moe_layers or self.moe_shared_hidden
                                       or self.moe_gating != "softmax" or self.moe_expert_bias or self.moe_groups > 1
                                       or self.moe_norm_topk or self.moe_scale != 1.0 or self.moe_bias
                                       or self.moe_identity_experts or self.moe_hash_layers or self.moe_weight_input
                                       or self.moe_beside_dense or self.moe_post_norm or self.moe_out_bias
                                       or self.moe_aux_loss or self.moe_input_jitter or self.moe_sink_experts
                                       or self.moe_swiglu_limit or self.moe_swiglu_act_limits
                                       or self.swiglu_act_limits):
                raise UserError("model.moe_router_hidden (ZAYA's MLP router) takes unclamped gated experts on every "
                            "layer (model.moe_experts) chosen one a token (moe_top_k 1) by its softmax and balancing "
                            "bias, with no other routing, shared, sink, dense, bias, clamp or auxiliary-loss option")

    def _validate_latent_extras(self) -> None:
        """Mistral Large 4's latent attention options: the queries' position scale and the layers' shared caches."""
        if self.q_position_scale and not (self.kv_lora_rank and self.pos_emb == "rope"):
            raise UserError("model.q_position_scale scales latent attention's queries by ln(p + 1): it needs "
                            "model.kv_lora_rank and model.pos_emb=rope")
        sources = self.kv_source_layers
        if not sources:
            return
        if (not self.kv_lora_rank or self.kv_shared_layers or self.hc_streams or self.moe_shortcut
                or len(sources) != self.n_layer):
            raise UserError(f"model.kv_source_layers shares latent attention's caches: it needs model.kv_lora_rank, "
                            f"no kv_shared_layers, hc_streams or moe_shortcut (blocks that hand no cache on) and one "
                            f"entry a layer ({self.n_layer}), got {len(sources)}")
        for i, j in enumerate(sources):
            if not (0 <= j <= i and sources[j] == j and self.layer_rope(j) == self.layer_rope(i)):
                raise UserError(f"model.kv_source_layers[{i}]={j}: a layer reads its own cache or that of an earlier "
                                f"layer that is its own source and rotates (RoPE or not) as it does")

    def _validate_ngpt(self) -> None:
        """nGPT's blocks and the looped section (Dory's)."""
        if self.norm == "l2" and not self.ngpt:
            raise UserError("model.norm=l2 (weightless norms onto the unit sphere) is nGPT's: it needs model.ngpt")
        if self.ngpt and (self.norm != "l2" or self.norm_position != "sandwich" or not self.qk_norm
                          or self.qk_norm_scope != "head" or self.qk_norm_after_rope or self.qk_layernorm
                          or self.parallel_residual or self.attn_gate not in ("none", "element")
                          or self.kv_lora_rank or self.conv_layers or self.delta_layers or self.moe_experts
                          or self.mixer_free_layers or self.mlp_free_layers or self.diff_attention
                          or self.attn_key_bias or self.residual_scales or self.normed_residual or self.bias
                          or self.altup_streams or self.mhc_streams or self.hc_streams or self.layer_lambdas
                          or self.backout or self.residual_multiplier or self.bitlinear != "off" or self.sub_norms
                          or self.shared_attn_layers or self.per_layer_embd or self.kv_shared_layers
                          or not self.gated_mlp):
            raise UserError("model.ngpt keeps the stream on the unit sphere: it needs model.norm=l2, "
                            "norm_position=sandwich, per-head qk_norm before RoPE, plain or element-gated attention "
                            "and a gated dense MLP without biases on every layer, and none of the other stream options")
        if not self.loop_section and self.loop_passes == 1:
            return
        if not self.ngpt or len(self.loop_section) != 2 or self.loop_passes < 1:
            raise UserError(f"model.loop_section is (first, count) with model.loop_passes >= 1, on nGPT blocks "
                            f"(model.ngpt); got {self.loop_section} and {self.loop_passes}")
        first, count = self.loop_section
        if first < 0 or count < 1 or first + count * self.loop_passes > self.n_layer:
            raise UserError(f"model.loop_section={self.loop_section} run {self.loop_passes} times does not fit in "
                            f"model.n_layer={self.n_layer} (which counts every pass)")
        for i in range(first + count, first + count * self.loop_passes):
            if self.layer_window(i) != self.layer_window(self.loop_source(i)):
                raise UserError(f"model layer {i} repeats layer {self.loop_source(i)} (model.loop_section) with "
                                f"another window: a looped layer's passes attend alike")

    def loop_source(self, layer: int) -> int:
        """The layer whose block layer `layer` runs: itself, or on a later pass of model.loop_section the first
        pass's layer it repeats."""
        if not self.loop_section:
            return layer
        first, count = self.loop_section
        if first + count <= layer < first + count * self.loop_passes:
            return first + (layer - first) % count
        return layer

    def _validate_altup(self) -> None:
        """Gemma 3n's fields: AltUp streams, LAuReL, activation sparsity."""
        if self.altup_streams < 0 or self.laurel_rank < 0 or self.altup_coef_clip < 0:
            raise UserError("model.altup_streams, laurel_rank and altup_coef_clip must be >= 0 (0 = off)")
        if self.laurel_rank and not self.altup_streams:
            raise UserError("model.laurel_rank: the LAuReL branch is part of Gemma 3n's AltUp block; it needs "
                            "model.altup_streams")
        if self.altup_streams and (
                self.norm_position != "sandwich" or self.parallel_residual or self.layer_lambdas or self.backout
                or self.value_tables or self.smear_gate or self.layer_scalars or self.moe_experts
                or self.attention_layers != list(range(self.n_layer)) or self.mlp_free_layers):
            raise UserError("model.altup_streams (Gemma 3n's AltUp) takes sandwich-norm blocks of attention and a "
                            "dense MLP on every layer, without parallel_residual, layer_lambdas, backout, value "
                            "embeddings, smear_gate, layer_scalars or experts")
        if self.mlp_sparsity and (len(self.mlp_sparsity) != self.n_layer or not self.gated_mlp
                                  or any(not 0 <= s < 1 for s in self.mlp_sparsity) or self.moe_experts):
            raise UserError(f"model.mlp_sparsity needs one value in [0, 1) for each of the {self.n_layer} layers and "
                            f"a dense gated MLP (swiglu or geglu)")

    def _validate_shortcut_moe(self) -> None:
        """LongCat-Flash's fields: identity experts and the shortcut-connected MoE."""
        if self.moe_identity_experts < 0:
            raise UserError(f"model.moe_identity_experts must be >= 0 (0 = none), got {self.moe_identity_experts}")
        if self.moe_identity_experts and (
                not self.moe_experts or self.moe_gating == "sparsemixer" or self.moe_groups > 1 or self.moe_bias
                or self.moe_weight_input or self.moe_beside_dense or self.moe_aux_loss or self.moe_bias_update):
            raise UserError("model.moe_identity_experts (LongCat-Flash's zero-computation experts) need MLP experts "
                            "(model.moe_experts) routed by softmax or sigmoid scores, without moe_groups, moe_bias, "
                            "moe_weight_input, moe_beside_dense, moe_aux_loss or moe_bias_update")
        if self.moe_sink_experts and (self.moe_sink_experts < 0 or self.moe_experts < self.moe_sink_experts
                                      + self.moe_top_k or self.moe_gating != "sigmoid" or not self.moe_norm_topk
                                      or self.moe_groups > 1 or self.moe_hash_layers or self.moe_identity_experts
                                      or self.moe_weight_input or self.moe_beside_dense):
            raise UserError(f"model.moe_sink_experts={self.moe_sink_experts} (Inkling's shared experts in the "
                            f"router) needs at least moe_top_k more model.moe_experts, sigmoid moe_gating with "
                            f"moe_norm_topk, and no moe_groups, moe_hash_layers, moe_identity_experts, "
                            f"moe_weight_input or moe_beside_dense")
        if not self.moe_shortcut:
            return
        clash = [name for name in ("moe_layers", "moe_dense_layers", "moe_beside_dense", "parallel_residual",
                                   "altup_streams", "mhc_streams", "hc_streams", "layer_lambdas", "backout",
                                   "shared_attn_layers", "mixer_free_layers", "mlp_free_layers", "conv_layers",
                                   "delta_layers", "per_layer_embd", "layer_scalars", "residual_scales")
                 if getattr(self, name)]
        if not self.moe_experts or self.n_layer % 2 or self.norm_position != "pre" or clash:
            raise UserError(f"model.moe_shortcut (LongCat-Flash's shortcut MoE) takes experts (model.moe_experts) and "
                            f"an even n_layer of pre-norm blocks of attention and an MLP, without "
                            f"model.{clash[0] if clash else 'norm_position ' + repr(self.norm_position)}")

    def _validate_mhc(self) -> None:
        """Manifold-constrained hyper-connections (DeepSeek-V4's): the streams around pre-norm blocks of two
        sublayers."""
        if self.mhc_streams < 0 or self.mhc_sinkhorn_iters < 0 or self.mhc_eps < 0 or self.mhc_post_scale <= 0:
            raise UserError(f"model.mhc_streams must be >= 0 (0 = off), mhc_sinkhorn_iters >= 0 (0 = no mixing "
                            f"matrix), mhc_eps >= 0 and mhc_post_scale > 0, got {self.mhc_streams}, "
                            f"{self.mhc_sinkhorn_iters}, {self.mhc_eps}, {self.mhc_post_scale}")
        clash = [name for name in ("parallel_residual", "altup_streams", "layer_lambdas", "backout", "layer_scalars",
                                   "per_layer_embd", "residual_scales", "mlp_free_layers", "mixer_free_layers",
                                   "shared_attn_layers", "moe_beside_dense", "delta_parallel", "delta_norm_position",
                                   "hc_streams")
                 if getattr(self, name)]
        if self.mhc_head_mean and not self.mhc_streams:
            raise UserError("model.mhc_head_mean averages the hyper-connection streams: it needs model.mhc_streams")
        if self.mhc_streams and (clash or self.norm_position != "pre"):
            raise UserError(f"model.mhc_streams (DeepSeek-V4's hyper-connections) takes pre-norm blocks of a mixer "
                            f"and an MLP on one plain stream each, without model.{clash[0] if clash else 'norm_position'}"
                            f"{'' if clash else ' ' + repr(self.norm_position)}")
    def _validate_shared_kv(self) -> None:
        """DeepSeek-V4's attention (shared_kv_attention) and hash-routed experts (moe_hash_layers)."""
        if self.moe_hash_layers and (not self.moe_experts or self.moe_dense_layers or self.moe_layers
                                     or self.moe_gating == "sparsemixer" or self.moe_identity_experts
                                     or list(self.moe_hash_layers) != sorted(set(self.moe_hash_layers))
                                     or not 0 <= self.moe_hash_layers[0] <= self.moe_hash_layers[-1] < self.n_layer):
            raise UserError(f"model.moe_hash_layers={self.moe_hash_layers} must name distinct layers in increasing "
                            f"order in [0, n_layer={self.n_layer}), with experts on every layer (model.moe_experts, "
                            f"no moe_dense_layers or moe_layers) and neither SparseMixer nor identity experts")
        if self.moe_hash_layers and (self.per_layer_embd or self.ngram_layers or self.shared_attn_layers
                                     or self.moe_beside_dense or self.moe_shortcut):
            raise UserError("model.moe_hash_layers hands its layers the token ids where per_layer_embd, ngram_layers "
                            "and shared_attn_layers hand theirs other inputs, and routes a block's MLP (not "
                            "moe_beside_dense's or moe_shortcut's experts): drop one")
        if self.o_groups < 0 or self.o_lora_rank < 0 or (self.o_groups or self.o_lora_rank) and not (
                self.shared_kv_attention):
            raise UserError(f"model.o_groups={self.o_groups} and o_lora_rank={self.o_lora_rank} are >= 0 and "
                            f"DeepSeek-V4's grouped output projection (model.shared_kv_attention)")
        if self.rope_unscaled_theta and (self.rope_unscaled_theta not in self.rope_layer_theta
                                         or self.rope_scaling == "none"):
            raise UserError(f"model.rope_unscaled_theta={self.rope_unscaled_theta} names the base of some layers of "
                            f"model.rope_layer_theta that turn without model.rope_scaling: it needs both")
        if (self.kv_compress_rates or self.kv_compress_overlap) and not (
                self.shared_kv_attention and len(self.kv_compress_rates) == self.n_layer
                and min(self.kv_compress_rates) >= 0
                and all(self.kv_compress_rates[i] for i in self.kv_compress_overlap if 0 <= i < self.n_layer)
                and list(self.kv_compress_overlap) == sorted(set(self.kv_compress_overlap))
                and all(0 <= i < self.n_layer for i in self.kv_compress_overlap)):
            raise UserError(f"model.kv_compress_rates={self.kv_compress_rates} (a rate >= 0 for each of the "
                            f"{self.n_layer} layers) and kv_compress_overlap={self.kv_compress_overlap} (distinct "
                            f"compressed layers in increasing order) are DeepSeek-V4's compressed layers, of "
                            f"model.shared_kv_attention")
        if not self.shared_kv_attention:
            return
        if (self.kv_heads != 1 or not self.q_lora_rank or self.o_groups < 1 or self.o_lora_rank < 1
                or self.n_head % self.o_groups or self.pos_emb != "rope" or self.kv_lora_rank):
            raise UserError(f"model.shared_kv_attention (DeepSeek-V4's) needs one key head (n_kv_head=1), "
                            f"q_lora_rank > 0, o_groups >= 1 dividing n_head={self.n_head}, o_lora_rank >= 1 and "
                            f"RoPE, not latent attention (got n_kv_head={self.kv_heads}, q_lora_rank="
                            f"{self.q_lora_rank}, o_groups={self.o_groups}, o_lora_rank={self.o_lora_rank})")
        clash = [name for name in ("qk_norm", "has_qkv_bias", "bias", "qkv_clip", "attn_softcap",
                                   "value_embeddings", "value_embed_layers", "diff_attention", "attn_key_bias",
                                   "conv_layers", "delta_layers", "kv_shared_layers", "global_head_size", "v_norm",
                                   "nope_interval", "rope_local_theta", "attn_chunk",
                                   "shared_attn_layers", "qsa_heads", "rope_qk_norm", "nope_temperature")
                 if getattr(self, name, False)]
        if clash or self.attn_gate != "none":
            raise UserError(f"model.shared_kv_attention (DeepSeek-V4's attention) takes no "
                            f"model.{clash[0] if clash else 'attn_gate'}")

    def _validate_ngrams(self) -> None:
        """Qwen4-Exp's Per-Layer Embeddings (model.ngram_layers)."""
        heads = (self.ngram_size - 1) * self.ngram_heads
        if (self.ngram_size < 2 or self.ngram_heads < 1 or self.ngram_dim < 1 or self.ngram_dim % heads
                or self.ngram_vocab_base < 2 or self.ngram_vocab_multiple < 1 or self.ngram_conv_kernel < 1):
            raise UserError(f"model.ngram_size={self.ngram_size}, ngram_heads={self.ngram_heads}, ngram_dim="
                            f"{self.ngram_dim}: n-grams of 2 or more tokens, 1 or more tables each, ngram_dim a "
                            f"multiple of the {heads} tables, ngram_vocab_base >= 2, ngram_vocab_multiple and "
                            f"ngram_conv_kernel >= 1")
        if not 0 <= self.ngram_eos < self.vocab_size:
            raise UserError(f"model.ngram_eos={self.ngram_eos}: per-layer n-gram embeddings need the end-of-text id "
                            f"in [0, vocab_size={self.vocab_size})")
        if (list(self.ngram_layers) != sorted(set(self.ngram_layers)) or not self.hc_streams
                or any(i not in self.delta_layers or i in self.parallel_delta_layers for i in self.ngram_layers)):
            raise UserError(f"model.ngram_layers={self.ngram_layers}: distinct layers in order, each a gated "
                            f"delta-net layer (model.delta_layers) of hyper-connected streams (model.hc_streams)")

    def _validate_hyper_connections(self) -> None:
        """Qwen4-Exp's fields: hyper-connections and the QSA indexer."""
        if min(self.hc_streams, self.hc_rank, self.qsa_heads, self.qsa_head_dim, self.qsa_budget, self.qsa_block) < 0:
            raise UserError("model.hc_streams, hc_rank, qsa_heads, qsa_head_dim, qsa_budget and qsa_block must be >= 0")
        if bool(self.hc_streams) != bool(self.hc_rank) or self.hc_streams == 1:
            raise UserError(f"model.hc_streams={self.hc_streams} and hc_rank={self.hc_rank}: hyper-connections take "
                            f"2 or more streams and a mixer rank of 1 or more, both or neither")
        if self.hc_streams and (
                self.norm != "rmsnorm" or self.norm_position != "pre" or self.parallel_residual or self.layer_lambdas
                or self.backout or self.altup_streams or self.per_layer_embd or self.layer_scalars
                or self.moe_beside_dense or self.residual_scales or self.residual_multiplier or self.mixer_free_layers
                or self.mlp_free_layers or self.shared_attn_layers or self.delta_parallel or self.embed_norm
                or self.mhc_streams or self.delta_norm_position not in ("", "pre")):
            raise UserError("model.hc_streams (Qwen4-Exp's hyper-connections) takes pre-RMSNorm blocks of two "
                            "sublayers in turn, without parallel_residual, layer_lambdas, backout, altup_streams, "
                            "per_layer_embd, layer_scalars, moe_beside_dense, residual scales or multipliers, "
                            "embed_norm, mixer- or MLP-free layers, shared blocks, delta_parallel or mhc_streams")
        if self.ngram_layers:
            self._validate_ngrams()
        qsa = (self.qsa_heads, self.qsa_head_dim, self.qsa_budget, self.qsa_block)
        if any(qsa) and not all(qsa):
            raise UserError("model.qsa_heads, qsa_head_dim, qsa_budget and qsa_block describe one QSA indexer: set "
                            "all of them or none")
        if self.qsa_heads and (self.qsa_budget % self.qsa_block
                               or self.context_len > self.qsa_budget + self.qsa_block - 1):
            raise UserError(f"model.qsa_budget={self.qsa_budget} with qsa_block={self.qsa_block}: a multiple of the "
                            f"block, and context_len={self.context_len} at most qsa_budget + qsa_block - 1 = "
                            f"{self.qsa_budget + self.qsa_block - 1}, within which the indexer keeps every key")
        if self.qsa_heads and (self.kv_lora_rank or self.diff_attention or self.attn_key_bias
                               or self.shared_attn_layers):
            raise UserError("model.qsa_heads: the QSA indexer sits on plain attention (no kv_lora_rank, "
                            "diff_attention, attn_key_bias or shared_attn_layers)")

    def _validate_bitnet(self) -> None:
        if not (self.bitlinear != "off" or self.sub_norms):
            return
        what = f"model.bitlinear={self.bitlinear}" if self.bitlinear != "off" else "model.sub_norms"
        if self.bitlinear != "off" and (self.fused_qkv or (self.gated_mlp and self.fused_mlp)):
            raise UserError(f"{what} scales each projection's weights by their own mean: set model.fused_qkv=false and "
                            f"model.fused_mlp=false")
        if (self.moe_experts or self.conv_layers or self.delta_layers or self.mixer_free_layers or self.mlp_free_layers
                or self.kv_lora_rank or self.attn_gate != "none" or self.kv_shared_layers or self.mlp == "xielu"):
            raise UserError(f"{what} is BitNet's: a dense MLP and plain attention on every layer (no moe_experts, "
                            f"conv_layers, delta_layers, kv_lora_rank, attn_gate, kv_shared_layers or mlp=xielu)")

    def _validate_layerwise_attention(self) -> None:
        """Gemma 4's fields: the full-attention layers' own geometry, shared keys and values, per-layer inputs."""
        if min(self.global_head_size, self.global_kv_head, self.kv_shared_layers, self.kv_shared_mlp_hidden,
               self.per_layer_embd, self.per_layer_vocab) < 0:
            raise UserError("model.global_head_size, global_kv_head, kv_shared_layers, kv_shared_mlp_hidden, "
                            "per_layer_embd and per_layer_vocab must be >= 0 (0 = off)")
        if self.global_head_size and (not self.sliding_window or self.global_head_size % 2 or (
                self.pos_emb == "rope" and (not self.rope_local_theta or self.rope_dims or self.rope_layer_theta))):
            raise UserError(f"model.global_head_size={self.global_head_size} needs windowed layers (model.sliding_"
                            f"window), an even width and with RoPE model.rope_local_theta (their own table), no "
                            f"rope_dims or rope_layer_theta")
        if self.global_kv_head and (not self.sliding_window or self.n_head % self.global_kv_head):
            raise UserError(f"model.global_kv_head={self.global_kv_head} needs windowed layers (model.sliding_window) "
                            f"and must divide model.n_head={self.n_head}")
        if self.window_n_head and (not self.sliding_window or self.window_n_head < 0 or self.kv_lora_rank
                                   or self.shared_kv_attention or self.shared_attn_layers
                                   or self.attn_gate == "routed" or self.window_n_head % self.kv_heads):
            raise UserError(f"model.window_n_head={self.window_n_head} needs windowed layers (model.sliding_window), "
                            f"plain attention (no kv_lora_rank, shared_kv_attention, shared_attn_layers, "
                            f"attn_gate=routed) and must be a multiple of model.n_kv_head={self.kv_heads}")
        if (self.global_values_from_keys or self.kv_shared_layers) and self.fused_qkv:
            raise UserError("model.global_values_from_keys and model.kv_shared_layers take separate q, k and v "
                            "projections (model.fused_qkv=false)")
        if (self.global_head_size or self.global_kv_head or self.kv_shared_layers or self.per_layer_embd) and (
                self.value_tables or self.attention_layers != list(range(self.n_layer))):
            raise UserError("model.global_head_size, global_kv_head, kv_shared_layers and per_layer_embd take "
                            "attention on every layer and no value embeddings")
        if self.kv_shared_layers > self.n_layer or any(
                self.kv_source(i) is None for i in range(self.n_layer - self.kv_shared_layers, self.n_layer)):
            raise UserError(f"model.kv_shared_layers={self.kv_shared_layers}: each shared layer needs an earlier "
                            f"layer of its window (sliding or full) before the last {self.kv_shared_layers} layers")
        if self.kv_shared_mlp_hidden and not self.kv_shared_layers:
            raise UserError("model.kv_shared_mlp_hidden sets the kv_shared_layers' MLP width: it needs "
                            "model.kv_shared_layers")
        if self.per_layer_vocab and not self.per_layer_embd:
            raise UserError("model.per_layer_vocab sizes the per-layer input table: it needs model.per_layer_embd")
        if self.kv_shared_layers and self.qk_norm and (self.qk_norm_scope != "head" or self.qk_norm_after_rope):
            raise UserError("model.kv_shared_layers takes per-head QK-norm before RoPE (model.qk_norm_scope=head, "
                            "no qk_norm_after_rope)")
        if (self.per_layer_embd or self.kv_shared_mlp_hidden) and (
                (self.moe_experts and not self.moe_beside_dense) or self.mlp_free_layers):
            raise UserError("model.per_layer_embd and kv_shared_mlp_hidden take dense MLPs on every layer (no "
                            "model.moe_experts in their place, no mlp_free_layers)")
        if self.moe_post_norm and (not self.moe_experts or self.moe_beside_dense):
            raise UserError("model.moe_post_norm needs experts (model.moe_experts) in place of the MLP (no "
                            "moe_beside_dense, whose outputs have norms of their own)")
        if self.moe_beside_dense and (
                not self.moe_experts or not self.moe_dense_hidden or self.norm_position != "sandwich"
                or self.moe_layers or self.moe_dense_layers or self.moe_shared_hidden or self.moe_groups > 1
                or self.moe_gating != "softmax" or self.moe_expert_bias or self.moe_bias or self.parallel_residual):
            raise UserError("model.moe_beside_dense (Gemma 4's MoE block) takes model.moe_experts beside a dense MLP "
                            "moe_dense_hidden wide on every layer of sandwich-norm blocks, softmax routing and no "
                            "shared expert, groups, routing bias, expert biases or moe_layers / moe_dense_layers")


def _divisors_near(n: int, target: int) -> list[int]:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return sorted(divisors, key=lambda d: abs(d - target))[:3]


# ----------------------------------------------------------------------------------------------------
# building blocks


class UnitOffsetRMSNorm(nn.Module):
    """RMSNorm scaling by (1 + weight), all in fp32 and rounded back to the input's dtype once (Gemma's form; the
    rule of transformers' Gemma3RMSNorm). Its weight starts at zero: the identity scale."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(x)


class UnitOffsetLayerNorm(nn.LayerNorm):
    """LayerNorm scaling by (1 + weight), its weight starting at zero (Nemotron's LayerNorm1P, the rule of
    transformers' models/nemotron/modeling_nemotron.py, computed in the input's dtype)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight + 1.0, self.bias, self.eps)


class HeadLayerNorm(nn.Module):
    """A LayerNorm over each head's D channels whose weight and bias are the head's own, (H, D) each
    (model.qk_layernorm_per_head: Chameleon's ChameleonLayerNorm, statistics over D, then the head's affine);
    x: (B, H, T, D)."""

    def __init__(self, heads: int, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, dim))
        self.weight.is_gain = True  # the optimizer's gains, not its matrices (training/optim.py)
        self.bias = nn.Parameter(torch.zeros(heads, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.layer_norm(x, (x.shape[-1],), eps=self.eps)
        return normed * self.weight[:, None] + self.bias[:, None]  # (H, 1, D) against (B, H, T, D)


class GatedRMSNorm(nn.RMSNorm):
    """An RMSNorm whose output y (..., C) is scaled by a low-rank gate of itself, y · sigmoid(gate_up(silu(gate_down(
    y)))), the sigmoid in fp32 (model.norm_gate_rank; as transformers' AXK2GatedRMSNorm computes it)."""

    def __init__(self, dim: int, eps: float, rank: int):
        super().__init__(dim, eps=eps)
        self.gate_down = nn.Linear(dim, rank, bias=False)
        self.gate_up = nn.Linear(rank, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return (y * torch.sigmoid(self.gate_up(F.silu(self.gate_down(y))).float())).to(y.dtype)


class L2Norm(nn.Module):
    """x (..., D) over its L2 norm, x · rsqrt(Σx² + eps), in fp32 and cast back; no weight (model.norm=l2: nGPT's
    projection onto the unit sphere, as transformers' DoryL2Norm computes it)."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + self.eps)).type_as(x)


def make_rmsnorm(cfg: ModelConfig, dim: int) -> nn.Module:
    if cfg.norm == "l2":
        return L2Norm(cfg.norm_eps)
    if cfg.norm_unit_offset:
        return UnitOffsetRMSNorm(dim, cfg.norm_eps)
    return nn.RMSNorm(dim, eps=cfg.norm_eps, elementwise_affine=cfg.norm_affine)


def rescaled_norms(cfg: ModelConfig, layer: int) -> ModelConfig:
    """The config the norms of block `layer` (n_layer: the final norm) are made with: norm_eps times 4^(layer //
    model.rescale_every), what transformers' RWKV computes in eval mode on a stream halved every rescale_every
    blocks; cfg itself without rescale_every."""
    if not cfg.rescale_every or layer < cfg.rescale_every:
        return cfg
    return replace(cfg, norm_eps=cfg.norm_eps * 4 ** (layer // cfg.rescale_every))


def make_norm(cfg: ModelConfig, dim: int) -> nn.Module:
    if cfg.norm in ("rmsnorm", "l2"):
        return make_rmsnorm(cfg, dim)
    if cfg.norm_unit_offset:
        return UnitOffsetLayerNorm(dim, eps=cfg.norm_eps, bias=cfg.bias if cfg.norm_bias is None else cfg.norm_bias)
    return nn.LayerNorm(dim, eps=cfg.norm_eps, elementwise_affine=cfg.norm_affine,
                        bias=cfg.bias if cfg.norm_bias is None else cfg.norm_bias)


def rope_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """The (head_dim // 2,) fp32 angular frequencies of RoPE, with the config's scaling applied (scaled_frequencies),
    each times exp(its rope_pair_log_scales entry) where given (Mistral Large 4's LeRoPE, as transformers'
    MistralLarge4TextRotaryEmbedding multiplies its inv_freq by alpha.exp() in fp32)."""
    inv_freq = scaled_frequencies(cfg)
    if cfg.rope_pair_log_scales:
        return inv_freq * torch.tensor(cfg.rope_pair_log_scales, dtype=torch.float32).exp()
    return inv_freq


def scaled_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """The (head_dim // 2,) fp32 angular frequencies of RoPE, with the config's rope_scaling applied.

    llama3: wavelengths longer than rope_original_context / rope_low_freq_factor are divided by rope_factor, those
    shorter than rope_original_context / rope_high_freq_factor are kept, and the band between blends the two
    linearly in rope_original_context / wavelength (the rule of Meta's Llama 3.1 reference code).

    yarn (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models"; the rule of its
    reference code and of transformers): dimension pair i turns rope_original_context / wavelength_i times over the
    original context; pairs below the one that turns rope_beta_fast times blend into those above the one that turns
    rope_beta_slow times (divided by rope_factor in full) along a linear ramp in i."""
    D = cfg.rope_dims or cfg.head_dim  # the dimensions that rotate
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    if cfg.rope_scaling == "linear":
        return inv_freq / cfg.rope_factor
    if cfg.rope_scaling == "llama3":
        wavelength = 2 * math.pi / inv_freq
        # equal factors (Llama 4 Scout's 1 and 1): no band to blend, every wavelength long or short (the `or`
        # keeps the unused blend finite)
        smooth = (cfg.rope_original_context / wavelength - cfg.rope_low_freq_factor) / (
            (cfg.rope_high_freq_factor - cfg.rope_low_freq_factor) or 1.0)
        blended = (1 - smooth) * inv_freq / cfg.rope_factor + smooth * inv_freq
        long = wavelength > cfg.rope_original_context / cfg.rope_low_freq_factor
        short = wavelength < cfg.rope_original_context / cfg.rope_high_freq_factor
        return torch.where(long, inv_freq / cfg.rope_factor, torch.where(short, inv_freq, blended))
    if cfg.rope_scaling == "yarn":
        def pair_turning(turns: float) -> float:  # the (fractional) dimension whose frequency turns `turns` times
            return D * math.log(cfg.rope_original_context / (turns * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))

        low, high = pair_turning(cfg.rope_beta_fast), pair_turning(cfg.rope_beta_slow)
        if cfg.rope_truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, D - 1)
        ramp = ((torch.arange(D // 2, dtype=torch.float32) - low) / ((high - low) or 0.001)).clamp(0, 1)
        return inv_freq / cfg.rope_factor * ramp + inv_freq * (1 - ramp)
    if cfg.rope_scaling == "proportional":  # the first int(proportion · D / 2) pairs turn, the others stay still
        turning = int(cfg.rope_proportion * D // 2)
        return torch.cat([inv_freq[:turning], torch.zeros(D // 2 - turning)]) / cfg.rope_factor
    if cfg.rope_scaling == "longrope":  # Ding et al. 2024, "LongRoPE"; the rule of transformers' Phi-3
        long = cfg.context_len > cfg.rope_original_context  # every position then takes the long factors
        return inv_freq / torch.tensor(cfg.rope_long_pair_factors if long else cfg.rope_pair_factors,
                                       dtype=torch.float32)
    return inv_freq


def mask_allows(i: torch.Tensor, j: torch.Tensor, key: int) -> torch.Tensor | bool:
    """Where query position i may attend key position j (j <= i assumed; broadcastable tensors) under a layer's mask
    key (ModelConfig.layer_mask): within the sliding window (key > 0), within the same chunk of -key tokens (key < 0:
    Llama 4's chunked attention, as transformers' create_chunked_causal_mask cuts it), anywhere (0: True)."""
    if key > 0:
        return i - j < key
    if key < 0:
        return torch.div(i, -key, rounding_mode="floor") == torch.div(j, -key, rounding_mode="floor")
    return True


def prefix_pairs(prefix_len: torch.Tensor, Tq: int, Tk: int, start: int = 0) -> torch.Tensor:
    """(B, Tq, Tk) bool: True where query i (at slot start + i) and key j are both within their row's prefix of
    prefix_len (B,) tokens (model.prefix_lm, PaliGemma's prompt, which attends to itself both ways)."""
    i = torch.arange(start, start + Tq, device=prefix_len.device)
    j = torch.arange(Tk, device=prefix_len.device)
    n = prefix_len[:, None, None]
    return (i[None, :, None] < n) & (j[None, None, :] < n)


def reference_pairs(prefix_len: torch.Tensor, Tq: int, Tk: int, start: int = 0) -> torch.Tensor:
    """(B, Tq, Tk) bool: True where key j lies within its row's reference of prefix_len (B,) tokens and at or
    before query i (at slot start + i) (model.reference_window: the prompt, visible to every later token beyond
    the window, as transformers' Unlimited-OCR ORs its prefill overlay over the sliding window)."""
    i = torch.arange(start, start + Tq, device=prefix_len.device)
    j = torch.arange(Tk, device=prefix_len.device)
    return (j[None, None, :] < prefix_len[:, None, None]) & (j[None, None, :] <= i[None, :, None])


def nope_temperature_table(cfg: ModelConfig, length: int | None = None) -> torch.Tensor:
    """The layers without RoPE's query scale by position (cfg.nope_temperature), (length, 1) fp32: 1 + t ·
    ln(1 + floor((p + 1) / floor)), as transformers' Llama4TextAttention computes its attn_scales."""
    positions = torch.arange(length or cfg.context_len, dtype=torch.float32)
    scale = torch.log1p(torch.floor((positions + 1.0) / cfg.nope_temperature_floor)) * cfg.nope_temperature + 1.0
    return scale[:, None]


def alibi_slopes(n_head: int, device=None) -> torch.Tensor:
    """ALiBi's per-head slopes m_h, (n_head,) fp32: with P = n_head rounded up to a power of two, the P slopes
    2^(-8·i/P), i = 1..P; for P = n_head all of them, else the even-indexed ones (i = 2, 4, ..., the geometric series
    of the power of two below n_head) followed by the first odd-indexed ones (i = 1, 3, ...: the interleaved extra
    slopes). This is MPT's build_mpt_alibi_tensor at its alibi_bias_max 8, which gives the same slopes as BLOOM's
    _get_alibi_slopes (Press et al.'s reference code) for every head count (transformers' models/mpt and
    models/bloom/modeling_bloom.py; checked against both in tests/test_model.py)."""
    P = 2 ** math.ceil(math.log2(n_head))
    slopes = torch.exp2(-torch.arange(1, P + 1, dtype=torch.float32, device=device) * (8.0 / P))
    if P != n_head:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:n_head]
    return slopes


def alibi_bias(n_head: int, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """ALiBi's additive scores -m_h·(i - j), fp32: q_pos (..., Tq) and k_pos (..., Tk) positions (a batch dim or
    none) -> (..., H, Tq, Tk). Softmax is shift-invariant per query, so a bias by key position alone (BLOOM's m_h·j,
    MPT's m_h·(j - last)) attends the same."""
    dist = (q_pos[..., None, :, None] - k_pos[..., None, None, :]).float()  # (..., 1, Tq, Tk)
    return -alibi_slopes(n_head, q_pos.device)[:, None, None] * dist


def alibi_mask(n_head: int, q_pos: torch.Tensor, k_pos: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """The float mask SDPA adds to the scores for ALiBi: alibi_bias where `allowed` (bool, broadcastable to
    (..., Tq, Tk); None: causal, the queries being the last Tq of the Tk keys), -inf elsewhere -> (..., H, Tq, Tk)
    fp32. Memory: H·Tq·Tk·4 bytes a distinct row of positions or mask (64 MiB for 16 heads at 1024 tokens, four
    times that at 2048): fine for modest lengths, O(T²) as any dense mask."""
    if allowed is None:
        Tq, Tk = q_pos.shape[-1], k_pos.shape[-1]
        allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=q_pos.device).tril(Tk - Tq)
    if allowed.dim() >= 3:  # (B, 1, Tq, Tk): its head dim is there already
        allowed = allowed.squeeze(-3)
    return alibi_bias(n_head, q_pos, k_pos).masked_fill(~allowed.unsqueeze(-3), float("-inf"))


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention scale for a context `factor` times the original: 0.1 · mscale · ln(factor) + 1 (1 for a
    factor up to 1)."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def rope_attention_factor(cfg: ModelConfig) -> float:
    """The factor on RoPE's cos/sin tables: YaRN's (given, else yarn_mscale(rope_factor)), LongRoPE's (given, else
    sqrt(1 + ln(rope_factor) / ln(rope_original_context)) past a factor of 1), else 1."""
    if cfg.rope_scaling == "longrope":
        if cfg.rope_attention_factor or cfg.rope_factor <= 1:
            return cfg.rope_attention_factor or 1.0
        return math.sqrt(1 + math.log(cfg.rope_factor) / math.log(cfg.rope_original_context))
    if cfg.rope_scaling != "yarn":
        return 1.0
    return cfg.rope_attention_factor or yarn_mscale(cfg.rope_factor)


def rope_tables(cfg: ModelConfig, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (length, head_dim // 2), in fp32 (length: the context by default)."""
    positions = torch.arange(length or cfg.context_len, dtype=torch.float32)
    angles = torch.outer(positions, rope_frequencies(cfg))
    scale = rope_attention_factor(cfg)
    return angles.cos() * scale, angles.sin() * scale


def layer_rope(rope: tuple, table: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's (cos, sin) from GPT.embed's tables, (cos, sin) for each of cfg.rope_bases in turn; table: the
    layer's index into them (cfg.layer_rope_table)."""
    return rope[2 * table], rope[2 * table + 1]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (first half, second half) of the first R dims of the last. x: (B, heads, T, D); cos/sin: (T, R/2)
    or (B, 1, T, R/2); R < D (model.rope_dims): the last D - R dims pass unrotated (GPT-NeoX's partial rotary)."""
    rotated = 2 * cos.shape[-1]
    if rotated < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rotated], cos, sin), x[..., rotated:]), dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.to(x.dtype)


_SDPA_BACKENDS = {
    "cudnn": "CUDNN_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}


def sdpa_context(backend: str):
    """A context manager that forces one SDPA backend, or does nothing for `auto`."""
    if backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, _SDPA_BACKENDS[backend]))


def explicit_attention(q, k, v, mask: torch.Tensor | None, scale: float | None, cap: float = 0.0,
                       sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention as plain products, for what SDPA cannot take: soft-capped scores (cap > 0: Gemma 2's eager attention
    in transformers' models/gemma2/modeling_gemma2.py) and sink logits (sinks (H,): GPT-OSS's, each query's
    denominator plus exp(sink), as transformers' models/gpt_oss/modeling_gpt_oss.py appends a sink column to the
    scores). q (B, H, Tq, D), k/v (B, KV, Tk, D), mask None (causal, the queries being the last Tq of the Tk
    positions) or bool, broadcastable to (B, H, Tq, Tk), True where allowed -> (B, Tq, H*D). Scores and softmax in
    fp32 at least; no attention dropout."""
    B, H, Tq, D = q.shape
    if k.shape[1] != H:
        k, v = (t.repeat_interleave(H // k.shape[1], dim=1) for t in (k, v))
    scores = torch.matmul(q, k.transpose(-1, -2)).to(torch.promote_types(q.dtype, torch.float32))
    scores = scores * (scale or D ** -0.5)
    if cap:
        scores = cap * torch.tanh(scores / cap)
    if mask is None:
        Tk = k.shape[2]
        mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        probs = F.softmax(scores, dim=-1)
    else:  # the denominator's log: logaddexp(lse of the scores, sink), (B, H, Tq, 1)
        lse = scores.logsumexp(dim=-1, keepdim=True)
        probs = torch.exp(scores - torch.logaddexp(lse, sinks.to(scores.dtype).view(1, H, 1, 1)))
    return torch.matmul(probs.to(v.dtype), v).transpose(1, 2).reshape(B, Tq, H * D)


FLEX_KERNEL_OPTIONS = {"FORCE_USE_FLEX_ATTENTION": True}


def _flex_attention_lse(q, k, v, block_mask, scale, enable_gqa, score_mod, kernel_options=None):
    """flex_attention's output (B, H, Tq, D) and logsumexp of the scores (B, H, Tq), natural log: `return_aux`
    where torch has it (return_lse is deprecated there), `return_lse` before it."""
    from torch.nn.attention import flex_attention as flex

    kw = dict(block_mask=block_mask, scale=scale, enable_gqa=enable_gqa, score_mod=score_mod,
              kernel_options=kernel_options)
    if hasattr(flex, "AuxRequest"):
        y, aux = flex.flex_attention(q, k, v, return_aux=flex.AuxRequest(lse=True), **kw)
        return y, aux.lse
    return flex.flex_attention(q, k, v, return_lse=True, **kw)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, value_embedding: bool = False, layer: int = 0):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        # a full-attention layer's own width and KV heads where the model gives them (Gemma 4's global_head_dim)
        # a windowed layer's own query head count (Step 3.5's num_sliding_attention_heads)
        self.n_head, self.n_kv = cfg.layer_n_head(layer), cfg.layer_kv_heads(layer)
        self.head_dim = cfg.layer_head_dim(layer)
        # kv_shared_layers: the layer whose keys and values this one attends over (None: its own)
        self.kv_source = cfg.kv_source(layer)
        # global_values_from_keys: v is k's projection (Gemma 4's attention_k_eq_v), no v weight
        self.values_from_keys = cfg.global_values_from_keys and not cfg.layer_window(layer)
        self.window = cfg.layer_mask(layer)  # this layer's mask key: sliding window, 0 (the whole context), -chunk
        self.rope_table = cfg.layer_rope_table(layer)  # which of GPT.embed's RoPE tables this layer rotates by
        self.use_rope = cfg.layer_rope(layer)  # False: a NoPE layer (nope_interval, rope_layer_theta 0)
        self.scale = cfg.attn_scale or None  # None: SDPA's 1 / sqrt(head_dim)
        # value embeddings: v ← λ₀·v + λ₁·ve (modded-nanogpt's `lambdas`), (2,) learned, 0.5 each at init; or with
        # value_embed_gate, v ← v + 3·sigmoid(ve_gate(x[..., :g])) · ve, ve_gate (KV, g) (nanochat's)
        gated_ve = value_embedding and cfg.value_embed_gate > 0
        self.ve_mix = nn.Parameter(torch.full((2,), 0.5)) if value_embedding and not gated_ve else None
        self.ve_gate = nn.Linear(cfg.value_embed_gate, self.n_kv, bias=False) if gated_ve else None
        # attn_sinks: one logit a query head, (H,), zeros at init (reset_parameters)
        sinks = cfg.attn_sinks and (not cfg.attn_sinks_windowed or cfg.layer_window(layer) > 0)
        self.sinks = nn.Parameter(torch.zeros(self.n_head)) if sinks else None
        # attn_gate: (H, C) each head's output, or (H*D, C) each of its elements, times sigmoid of its row · x
        # attn_gate=routed: the router over the attn_experts experts of heads, (E, C)
        gates = {"head": self.n_head, "element": self.n_head * self.head_dim,
                 "routed": cfg.attn_experts}.get(cfg.attn_gate)
        self.gate = nn.Linear(cfg.n_embd, gates, bias=False) if gates else None
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv * self.head_dim
        # kv_conv: each k and v channel's causal depthwise kernel (KV*D, K), oldest token first; zeros (the identity)
        # at init, as nothing in Inkling's own init draws them
        self.k_conv = nn.Parameter(torch.zeros(kv_dim, cfg.kv_conv)) if cfg.kv_conv else None
        self.v_conv = nn.Parameter(torch.zeros(kv_dim, cfg.kv_conv)) if cfg.kv_conv else None
        bias = cfg.has_qkv_bias
        own_kv = self.kv_source is None
        if cfg.fused_qkv:
            self.qkv = nn.Linear(cfg.n_embd, q_dim + 2 * kv_dim, bias=bias)
        else:
            self.q = nn.Linear(cfg.n_embd, q_dim, bias=bias)
            self.k = nn.Linear(cfg.n_embd, kv_dim, bias=bias) if own_kv else None
            self.v = nn.Linear(cfg.n_embd, kv_dim, bias=bias) if own_kv and not self.values_from_keys else None
        # v_norm: RMS over each head's values, no weight (Gemma 4's)
        self.v_norm = (nn.RMSNorm(self.head_dim, eps=cfg.norm_eps, elementwise_affine=False)
                       if cfg.v_norm and own_kv else None)
        self.proj = nn.Linear(q_dim, cfg.n_embd, bias=cfg.bias)
        self.proj.is_residual_out = True
        # model.ngpt: the queries' per-channel scale after RoPE, squared (H*D,) (Dory's sqk times its scale), and
        # the L2 norm on the heads' gated output before proj (Dory's attn_sub_norm)
        self.q_scale = nn.Parameter(torch.full((q_dim,), self.head_dim ** 0.5)) if cfg.ngpt else None
        self.out_norm = L2Norm(cfg.norm_eps) if cfg.ngpt else None
        # qsa_heads (Qwen4-Exp's QSA indexer): its weights, kept but never read, since within context_len it keeps
        # every key (ModelConfig.qsa_heads): the query and key projection ((Hi + 1)·Di, C), its q and k norms (Di,)
        if cfg.qsa_heads:
            self.register_buffer("qsa_qk", torch.zeros((cfg.qsa_heads + 1) * cfg.qsa_head_dim, cfg.n_embd))
            self.register_buffer("qsa_q_norm", torch.zeros(cfg.qsa_head_dim))
            self.register_buffer("qsa_k_norm", torch.zeros(cfg.qsa_head_dim))
        if cfg.qk_layernorm_per_head:  # (H, D) and (KV, D) weights and biases, one pair a head (Chameleon's)
            self.q_norm = HeadLayerNorm(self.n_head, self.head_dim, cfg.norm_eps)
            self.k_norm = HeadLayerNorm(self.n_kv, self.head_dim, cfg.norm_eps) if own_kv else None
        elif cfg.qk_layernorm:  # (D,) weight and bias shared by the heads (Persimmon's)
            self.q_norm = nn.LayerNorm(self.head_dim, eps=cfg.norm_eps)
            self.k_norm = nn.LayerNorm(self.head_dim, eps=cfg.norm_eps) if own_kv else None
        elif cfg.qk_norm:
            whole = cfg.qk_norm_scope == "all"  # (H*D,) and (KV*D,) weights, else (D,) shared by the heads
            self.q_norm = make_rmsnorm(cfg, q_dim if whole else self.head_dim)
            self.k_norm = make_rmsnorm(cfg, kv_dim if whole else self.head_dim) if own_kv else None

    def project(self, x: torch.Tensor):
        """x: (B, T, C) -> q (B, T, H*D), k and v (B, T, KV*D): the projections alone, before QK-norm and RoPE; k and
        v None on a layer that reads another's (kv_source), v k's projection where values_from_keys."""
        clip = self.cfg.qkv_clip  # DBRX's clip_qkv: every projection output clamped, as DbrxAttention does
        if self.cfg.fused_qkv:
            qkv = self.qkv(x)
            return (qkv.clamp(-clip, clip) if clip else qkv).split(
                [self.n_head * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.head_dim], dim=-1
            )
        if self.k is None:
            return self.q(x).clamp(-clip, clip) if clip else self.q(x), None, None
        q, k = self.q(x), self.k(x)
        v = k if self.v is None else self.v(x)
        return tuple(t.clamp(-clip, clip) for t in (q, k, v)) if clip else (q, k, v)

    def project_qkv(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                    ve: torch.Tensor | None = None):
        """x: (B, T, C) -> q (B, H, T, D), k and v (B, KV, T, D), with QK-norm and RoPE applied (k and v None on a
        layer that reads another's, kv_source); ve: None, or this layer's value embedding (B, T, KV*D), mixed into
        v."""
        B, T, _ = x.shape
        q, k, v = self.project(x)
        if k is None:  # a kv-shared layer: its queries alone
            q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
            if self.cfg.qk_norm:  # validate keeps these to per-head QK-norm before RoPE
                q = self.q_norm(q)
            if rope is not None and self.use_rope:
                q = apply_rope(q, *layer_rope(rope, self.rope_table))
            return q, None, None
        if ve is not None and self.ve_gate is not None:  # (B, T, KV) gates, each over its kv head's D channels
            gate = 3 * torch.sigmoid(self.ve_gate(x[..., :self.cfg.value_embed_gate]))
            v = v + (gate.unsqueeze(-1) * ve.to(v.dtype).view(B, T, self.n_kv, self.head_dim)).view(B, T, -1)
        elif ve is not None:
            v = self.ve_mix[0] * v + self.ve_mix[1] * ve.to(v.dtype)
        if self.cfg.qk_norm and self.cfg.qk_norm_scope == "all":  # before the split into heads
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        if self.v_norm is not None:
            v = self.v_norm(v)
        per_head = self.cfg.qk_norm and self.cfg.qk_norm_scope == "head"
        if per_head and not self.cfg.qk_norm_after_rope:  # kv_conv: the keys' norm after their convolution
            q, k = self.q_norm(q), k if self.k_conv is not None else self.k_norm(k)
        if rope is not None and self.use_rope:
            cos, sin = layer_rope(rope, self.rope_table)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            if self.cfg.rope_qk_norm:  # weightless, fp32 (Llama 4's Llama4TextL2Norm, an RMS norm despite its name)
                q, k = (F.rms_norm(t.float(), (self.head_dim,), eps=self.cfg.norm_eps).to(t.dtype) for t in (q, k))
        if per_head and self.cfg.qk_norm_after_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None and not self.use_rope and self.cfg.nope_temperature:  # rope[-1]: (T, 1) or (B, 1, T, 1)
            q = (q.float() * rope[-1]).to(q.dtype)
        if self.q_scale is not None:  # (H, 1, D) over (B, H, T, D), as transformers' DoryAttention scales them
            q = q * self.q_scale.square().to(q.dtype).view(self.n_head, 1, self.head_dim)
        return q, k, v

    def convolved_kv(self, k: torch.Tensor, v: torch.Tensor,
                     doc_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """model.kv_conv: the raw projections k, v (B, KV, S, D) of positions 0..S-1 (project_qkv's with kv_conv) ->
        each plus its causal depthwise convolution, in fp32 as transformers' InklingShortConvolution computes it, the
        keys then QK-normed; doc_ids (B, S): a token reads none of another document's."""
        B, KV, S, D = k.shape

        def conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            u = x.transpose(1, 2).reshape(B, S, KV * D).float()  # channel kv·D + d, as the projection lays it out
            y = u + causal_conv(u, weight.float(), doc_ids=doc_ids)
            return y.to(x.dtype).view(B, S, KV, D).transpose(1, 2)

        k, v = conv(k, self.k_conv), conv(v, self.v_conv)
        return (self.k_norm(k) if self.cfg.qk_norm else k), v

    def attend(self, q, k, v, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        """q: (B, H, Tq, D), k/v: (B, KV, Tk, D) -> (B, Tq, H*D). attn_mask: None, a bool tensor, or a flex
        attention BlockMask (packed documents on CUDA: GPT.attention_mask)."""
        gqa = self.n_kv != self.n_head
        cap = self.cfg.attn_softcap
        if isinstance(attn_mask, torch.Tensor) and attn_mask.is_floating_point():  # ALiBi's additive mask (fp32)
            attn_mask = attn_mask.to(q.dtype)  # SDPA takes a float mask of the queries' dtype
        if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
            from torch.nn.attention.flex_attention import flex_attention

            def capped(score, b, h, q_idx, kv_idx):
                return cap * torch.tanh(score / cap)

            # the main kernel at every length: under torch.compile a query shorter than 128 would go to the
            # flex-decoding kernel, which has no valid configuration for a mask per batch row (documents, prefixes)
            kw = dict(block_mask=attn_mask, scale=self.scale, enable_gqa=gqa, score_mod=capped if cap else None,
                      kernel_options=FLEX_KERNEL_OPTIONS)
            if self.sinks is None:
                y = flex_attention(q, k, v, **kw)
            else:  # the sink joins the denominator: output × exp(lse) / (exp(lse) + exp(sink))
                y, lse = _flex_attention_lse(q, k, v, **kw)  # (B, H, Tq, D), (B, H, Tq)
                y = y * torch.sigmoid(lse - self.sinks.float()[:, None]).unsqueeze(-1).to(y.dtype)
            B, _, Tq, _ = q.shape
            return y.transpose(1, 2).reshape(B, Tq, self.n_head * self.head_dim)
        if cap or self.sinks is not None:
            return explicit_attention(q, k, v, attn_mask, self.scale, cap, self.sinks)
        if gqa and self.cfg.attn_backend != "auto":
            # not every forced backend takes enable_gqa: expand the kv heads instead
            k = k.repeat_interleave(self.n_head // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv, dim=1)
            gqa = False
        dropout = self.cfg.dropout if self.training else 0.0
        with sdpa_context(self.cfg.attn_backend):
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout, scale=self.scale, enable_gqa=gqa
            )
        B, _, Tq, _ = q.shape
        return y.transpose(1, 2).reshape(B, Tq, self.n_head * self.head_dim)

    def forward(self, x, rope, attn_mask: torch.Tensor | None = None, cache=None, ve=None,
                shared: dict | None = None, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, C) -> (B, T, C). attn_mask: None for plain causal attention, else (B or 1, 1, T, T) bool, True
        where query i may attend key j (this layer's: GPT.attention_mask for its window). cache: None, or a KV cache
        layer of the inference engine (redline/inference/cache.py), which stores this call's keys and values and
        attends over all it holds: `cache.attend(self, x, rope, ve) -> (B, T, H*D)`, calling back into project /
        project_qkv / attend.
        ve: this layer's value embedding (B, T, KV*D) or None. shared: without a cache, the forward's {layer: (k, v)}
        (model.kv_shared_layers): a layer puts its keys and values there and a kv-shared one reads its source's.
        doc_ids: (B, T) or None, the packed documents the keys' and values' convolutions keep apart (model.kv_conv)."""
        if cache is not None:
            return self.output(x, cache.attend(self, x, rope, ve))
        q, k, v = self.project_qkv(x, rope, ve)
        if self.k_conv is not None:
            k, v = self.convolved_kv(k, v, doc_ids)
        if k is None:
            k, v = shared[self.kv_source]
        elif shared is not None:
            shared[self.layer] = (k, v)
        y = self.attend(q, k, v, attn_mask, is_causal=attn_mask is None)
        return self.output(x, y)

    def output(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The heads' outputs y (B, T, H*D) -> (B, T, C): gated by x (gated), L2-normed (model.ngpt), projected."""
        y = self.gated(x, y)
        return self.proj(y if self.out_norm is None else self.out_norm(y))

    def gated(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y (B, T, H*D), the heads' outputs, times sigmoid(gate(x)) (softplus: attn_gate_fn): (B, T, H) a head
        where attn_gate=head, (B, T, H*D) an element where attn_gate=element."""
        if self.gate is None:
            return y
        if self.cfg.attn_gate == "routed":
            return self.routed(x, y)
        g = self.gate(x)
        # softplus (Laguna's) in fp32, cast back, as transformers' LagunaAttention computes it
        g = torch.sigmoid(g) if self.cfg.attn_gate_fn == "sigmoid" else F.softplus(g.float()).to(y.dtype)
        if self.cfg.attn_gate == "element":  # (B, T, H*D) each
            return y * g
        B, T, _ = y.shape
        return (y.view(B, T, self.n_head, self.head_dim) * g.unsqueeze(-1)).view(B, T, -1)


    def routed(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """attn_gate=routed: y (B, T, H*D), heads ordered (KV head, expert), times each token's expert weights: the
        softmax over its top-k router logits (fp32) at the chosen experts, 0 at the others, as transformers'
        JetMoeTopKGating weights JetMoeMoA's experts."""
        B, T, _ = y.shape
        E = self.cfg.attn_experts
        top = self.gate(x).float().topk(self.cfg.moe_top_k, dim=-1)  # (B, T, k) each
        weights = torch.zeros(B, T, E, device=y.device).scatter(-1, top.indices, F.softmax(top.values, dim=-1))
        heads = y.view(B, T, self.n_kv, E, self.head_dim) * weights.to(y.dtype)[:, :, None, :, None]
        return heads.view(B, T, -1)


class DiffAttention(Attention):
    """Differential attention (model.diff_attention), as transformers' DiffLlamaAttention computes it: each query head's
    map once over the values of KV heads [0, KV/2) and once over [KV/2, KV) (each half tiled to KV heads, so query
    head h reads kv head h // (H/KV) of each tiled half), then heads h and h + H/2 paired: out_h − λ·out_{h + H/2},
    each 2·D wide (its two outputs side by side), RMS-normed without a weight and times 1 − λ_init. The engine's
    caches hold k and v as for plain attention and call value_halves and combine (redline/inference/cache.py)."""

    differential = True

    def __init__(self, cfg: ModelConfig, value_embedding: bool = False, layer: int = 0):
        super().__init__(cfg, value_embedding, layer)
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer)
        D = self.head_dim
        self.lambda_q1, self.lambda_k1 = nn.Parameter(torch.zeros(D)), nn.Parameter(torch.zeros(D))
        self.lambda_q2, self.lambda_k2 = nn.Parameter(torch.zeros(D)), nn.Parameter(torch.zeros(D))

    @torch.no_grad()
    def reset_lambdas(self) -> None:
        for p in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(p, mean=0.0, std=0.1)

    def value_halves(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """v (B, KV, S, D) -> its first and second halves of kv heads, each tiled back to (B, KV, S, D)."""
        first, second = v.chunk(2, dim=1)
        return first.repeat(1, 2, 1, 1), second.repeat(1, 2, 1, 1)

    def combine(self, y1: torch.Tensor, y2: torch.Tensor) -> torch.Tensor:
        """The heads' outputs over each value half, (B, T, H*D) each -> the paired, normed output (B, T, H*D)."""
        B, T, _ = y1.shape
        H, D = self.n_head, self.head_dim
        y = torch.cat([y1.view(B, T, H, D), y2.view(B, T, H, D)], dim=-1)  # (B, T, H, 2D)
        first, second = y.chunk(2, dim=2)  # heads [0, H/2) and [H/2, H): (B, T, H/2, 2D) each
        dtype = y.dtype
        lam = (torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1, dtype=torch.float32)).to(dtype)
               - torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1, dtype=torch.float32)).to(dtype)
               + self.lambda_init)
        out = F.rms_norm(first - lam * second, (2 * D,), eps=self.cfg.norm_eps) * (1 - self.lambda_init)
        return out.reshape(B, T, H * D)

    def attend(self, q, k, v, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        v1, v2 = self.value_halves(v)
        return self.combine(super().attend(q, k, v1, attn_mask, is_causal), super().attend(q, k, v2, attn_mask,
                                                                                          is_causal))


class KeyBiasAttention(Attention):
    """Attention whose every key adds a learned bias of its own to its scores (model.attn_key_bias, Doge's dynamic
    mask, as transformers' DogeAttention computes it): exp(A · softplus(dt_proj(v))) a KV head and key, v the key's
    values over all KV heads. The engine's caches hold k and v as for plain attention and read key_bias from the
    cached values (redline/inference/cache.py)."""

    def __init__(self, cfg: ModelConfig, value_embedding: bool = False, layer: int = 0):
        super().__init__(cfg, value_embedding, layer)
        self.dt_proj = nn.Linear(self.n_kv * self.head_dim, self.n_kv, bias=cfg.has_qkv_bias)
        self.A = nn.Parameter(torch.zeros(self.n_kv))

    def key_bias(self, v: torch.Tensor) -> torch.Tensor:
        """v (B, KV, S, D), the keys' values -> their biases (B, KV, S)."""
        B, KV, S, D = v.shape
        dt = self.dt_proj(v.transpose(1, 2).reshape(B, S, KV * D))  # (B, S, KV)
        return torch.exp(self.A * F.softplus(dt)).transpose(1, 2)

    def attend(self, q, k, v, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        """As Attention.attend, the keys' biases in a float mask (B, H, Tq, S): a bias where attn_mask (or causality)
        allows the key, -inf elsewhere."""
        Tq, S = q.shape[2], k.shape[2]
        if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
            raise UserError("model.attn_key_bias puts the keys' biases in a dense mask, which flex attention's block "
                            "mask is not: set model.doc_attention=sdpa")
        if attn_mask is None:  # causal, the queries the last Tq of the S positions
            i = torch.arange(Tq, device=q.device)[:, None] + (S - Tq)
            attn_mask = i >= torch.arange(S, device=q.device)[None, :]
        bias = self.key_bias(v).repeat_interleave(self.n_head // self.n_kv, dim=1)[:, :, None, :]  # (B, H, 1, S)
        mask = torch.where(attn_mask, bias.to(q.dtype), torch.tensor(float("-inf"), dtype=q.dtype, device=q.device))
        return super().attend(q, k, v, mask, is_causal=False)


class RelBiasAttention(Attention):
    """Attention whose scores take a relative-position bias mixed per query token (model.rel_bias_dim, Inkling's, as
    transformers' InklingRelativeLogits and InklingAttention compute it): r = rel_proj(x) (H·rel_bias_dim) from the
    attention's input, each head's r_h · rel_profiles a bias for every distance 0..extent - 1, added to the score of
    the key that many positions back (0 beyond the extent; causality and windows stay in the mask). Distances are
    index differences, which packed documents' restarting positions leave as they are. The engine's caches hold k
    and v as for plain attention and call position_bias with the new tokens' slots (redline/inference/cache.py)."""

    def __init__(self, cfg: ModelConfig, value_embedding: bool = False, layer: int = 0):
        super().__init__(cfg, value_embedding, layer)
        self.rel_extent = cfg.layer_rel_extent(layer)
        self.rel_proj = nn.Linear(cfg.n_embd, self.n_head * cfg.rel_bias_dim, bias=False)
        # (d_rel, extent): a bank of bias-by-distance profiles, N(0, std) at init (GPT.reset_parameters)
        self.rel_profiles = nn.Parameter(torch.zeros(cfg.rel_bias_dim, self.rel_extent))

    def position_bias(self, x: torch.Tensor, first: int | torch.Tensor, keys: int) -> torch.Tensor:
        """x (B, T, C), the queries' inputs, the query i at position first + i (first an int, or (B,) one a row) ->
        their biases over the keys at positions 0..keys - 1, (B, H, T, keys) in x's dtype."""
        B, T, _ = x.shape
        r = self.rel_proj(x).view(B, T, self.n_head, -1)  # (B, T, H, d_rel)
        by_distance = (r @ self.rel_profiles.to(r.dtype)).transpose(1, 2)  # (B, H, T, extent)
        q_pos = torch.arange(T, device=x.device) + (first[:, None] if torch.is_tensor(first) else first)
        dist = q_pos[..., :, None] - torch.arange(keys, device=x.device)  # (T, keys) or (B, T, keys)
        dist = dist.expand(B, T, keys)[:, None]  # (B, 1, T, keys)
        index = dist.clamp(0, self.rel_extent - 1).expand(B, self.n_head, T, keys)
        bias = by_distance.gather(-1, index)
        return bias.masked_fill((dist < 0) | (dist >= self.rel_extent), 0.0)

    def biased_mask(self, x: torch.Tensor, first: int | torch.Tensor, keys: int,
                    allowed: torch.Tensor | None) -> torch.Tensor:
        """position_bias where `allowed` (bool, broadcastable to (B, H, T, keys); None: causal, the queries the last T
        of the keys) and -inf elsewhere: a float mask for SDPA, (B, H, T, keys)."""
        T = x.shape[1]
        if allowed is None:
            i = torch.arange(T, device=x.device)[:, None] + (keys - T)
            allowed = i >= torch.arange(keys, device=x.device)[None, :]
        bias = self.position_bias(x, first, keys)
        return bias.masked_fill(~allowed, float("-inf"))

    def forward(self, x, rope, attn_mask: torch.Tensor | None = None, cache=None, ve=None,
                shared: dict | None = None, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        if cache is not None:
            return self.output(x, cache.attend(self, x, rope, ve))
        q, k, v = self.project_qkv(x, rope, ve)
        if self.k_conv is not None:
            k, v = self.convolved_kv(k, v, doc_ids)
        if shared is not None:
            shared[self.layer] = (k, v)
        T = x.shape[1]
        y = self.attend(q, k, v, self.biased_mask(x, 0, T, attn_mask), is_causal=False)
        return self.output(x, y)


LATENT_NORM_EPS = 1e-6
"""The epsilon of latent attention's q_a_norm and kv_a_norm: DeepSeek's reference code and transformers' DeepseekV2/V3
Attention build them with the RMSNorm's default 1e-6, apart from the blocks' rms_norm_eps."""


class LatentAttention(Attention):
    """Multi-head latent attention (model.kv_lora_rank; DeepSeek-V2's MLA), as transformers' DeepseekV3Attention
    computes it: q from q_a (C -> q_lora_rank), its RMSNorm q_a_norm and q_b (-> H·D), or from one q (C -> H·D) where
    model.q_lora_rank is 0; kv_a (C -> L + R) gives the latent (L = kv_lora_rank), RMS-normalized (kv_a_norm) and
    expanded by kv_b (L -> H·(Dn + Dv)) into each head's unrotated key part and value, and one key part of R =
    rope_dims that every head shares; RoPE turns q's and k's R dims alone; proj (H·Dv -> C). D = head_size = Dn + R.
    The weights keep DeepSeek's row order (a head's [nope; rope] rows in q_b, [nope; value] in kv_b, the shared
    key part last in kv_a), so they import and export as they are; the heads handed on are laid out [rope; nope]
    (apply_rope turns a head's first dims): q·k sums over the dims, in any order.

    Without a cache (training, a full forward) the heads it hands on are those of multi-head attention (B, H, T, D),
    the value padded with zeros from Dv to D (as transformers pads the value for flash attention): the padded columns
    of each head's output are zeros, sliced off before proj. With the inference engine's cache it runs in MLA's
    absorbed form (latent_heads): the cache keeps one head of L + R a token (the normalized latent and the shared
    rotated key part) where the expanded heads would take 2·H·D, and every query head attends over it."""

    def __init__(self, cfg: ModelConfig, value_embedding: bool = False, layer: int = 0):
        nn.Module.__init__(self)
        self.cfg = cfg
        self.n_head, self.n_kv, self.head_dim = cfg.n_head, cfg.n_head, cfg.head_dim
        self.rope_dims, self.rank, self.v_dim = cfg.rope_dims, cfg.kv_lora_rank, cfg.v_head_dim or cfg.head_dim
        self.window = cfg.layer_window(layer)
        self.rope_table = cfg.layer_rope_table(layer)
        # a layer without RoPE (nope_interval, rope_layer_theta 0) has no shared key part: R = 0, kv_b's keys D wide
        self.use_rope = cfg.pos_emb != "rope" or cfg.layer_rope(layer)
        self.rope_dims = self.rope_dims if self.use_rope else 0
        # model.kv_source_layers: the layer whose latent and rotated key part this one reads (None: its own)
        self.layer, self.kv_source = layer, cfg.kv_source(layer)
        self.scale = cfg.attn_scale or None  # DeepSeek's softmax_scale (YaRN's mscale² in it) where set
        self.ve_mix = None  # what Attention's callers read: no value embeddings here
        # model.attn_sinks: one logit a query head, (H,), zeros at init (HY-V4's sinks, as GPT-OSS's)
        self.sinks = nn.Parameter(torch.zeros(cfg.n_head)) if cfg.attn_sinks else None
        H, D, C = cfg.n_head, cfg.head_dim, cfg.n_embd
        # model.attn_gate=head: sigmoid(gate(x)) scales each head's output (Ling 3's g_proj, (H, C)); =element each
        # of its values (HY-V4's gate_proj, (H·Dv, C))
        gates = {"head": H, "element": H * (cfg.v_head_dim or D)}.get(cfg.attn_gate)
        self.gate = nn.Linear(C, gates, bias=False) if gates else None
        eps = cfg.latent_norm_eps or LATENT_NORM_EPS
        # model.q_latent_gate (A.X-K2's q_gate_proj): q_b reads [norm(l); l] and gives each head [q (D); gate (Dv)]
        self.latent_gate = cfg.q_latent_gate
        if cfg.q_lora_rank:
            self.q_a = nn.Linear(C, cfg.q_lora_rank, bias=False)
            self.q_a_norm = nn.RMSNorm(cfg.q_lora_rank, eps=eps)
            self.q_b = (nn.Linear(2 * cfg.q_lora_rank, H * (D + self.v_dim), bias=False) if self.latent_gate
                        else nn.Linear(cfg.q_lora_rank, H * D, bias=False))
        else:
            self.q = nn.Linear(C, H * D, bias=False)
        own = self.kv_source is None
        self.kv_a = nn.Linear(C, self.rank + self.rope_dims, bias=False) if own else None
        self.kv_a_norm = nn.RMSNorm(self.rank, eps=eps) if own else None
        # model.latent_key_norm: the shared key part (R) RMS-normed before RoPE (dots.3 Note's k_rope_only_layernorm)
        self.k_pe_norm = nn.RMSNorm(self.rope_dims, eps=eps) if cfg.latent_key_norm and own else None
        self.kv_b = nn.Linear(self.rank, H * (D - self.rope_dims + self.v_dim), bias=False)
        # model.q_position_scale: each head's queries times q_pos_scale · ln(p + 1) + q_pos_bias, (H,) each
        self.q_pos_scale = nn.Parameter(torch.zeros(H)) if cfg.q_position_scale else None
        self.q_pos_bias = nn.Parameter(torch.ones(H)) if cfg.q_position_scale else None
        self.proj = nn.Linear(H * self.v_dim, C, bias=False)
        self.proj.is_residual_out = True

    def queries_and_gate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, C) -> the queries (B, T, H·D) and, with model.q_latent_gate, the heads' gates (B, T, H·Dv) (else
        None)."""
        if self.cfg.q_lora_rank == 0:
            return self.q(x), None
        latent = self.q_a(x)
        if not self.latent_gate:
            return self.q_b(self.q_a_norm(latent)), None
        B, T, _ = x.shape
        qg = self.q_b(torch.cat([self.q_a_norm(latent), latent], dim=-1)).view(B, T, self.n_head, -1)
        q, g = qg.split([self.head_dim, self.v_dim], dim=-1)
        return q.reshape(B, T, -1), g.reshape(B, T, -1)

    def rotated_queries(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> each head's query parts, the rotated q_pe (B, H, T, R) and q_nope (B, H, T, Dn), both times
        the heads' position scale where model.q_position_scale (rope[-1], ln(p + 1): (T, 1) or (B, 1, T, 1))."""
        B, T, _ = x.shape
        H, D, R = self.n_head, self.head_dim, self.rope_dims
        q = self.queries_and_gate(x)[0]
        q_nope, q_pe = q.view(B, T, H, D).transpose(1, 2).split([D - R, R], dim=-1)  # (B, H, T, Dn), (.., R)
        if rope is not None and self.use_rope:
            q_pe = apply_rope(q_pe, *layer_rope(rope, self.rope_table))
        if self.q_pos_scale is not None:  # (H, T, 1) or (B, H, T, 1), fp32 (MistralLarge4TextSoftmaxScaling's)
            factor = self.q_pos_scale.float().view(H, 1, 1) * rope[-1] + self.q_pos_bias.float().view(H, 1, 1)
            q_pe, q_nope = ((t.float() * factor).to(t.dtype) for t in (q_pe, q_nope))
        return q_pe, q_nope

    def latent_kv(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> the normalized latent c (B, 1, T, L) and the rotated shared key part k_pe (B, 1, T, R) this
        layer's keys and values come from (what the inference engine caches, and a layer that reads this one's
        (model.kv_source_layers) takes)."""
        B, T, _ = x.shape
        latent, k_pe = self.kv_a(x).split([self.rank, self.rope_dims], dim=-1)  # (B, T, L), (B, T, R)
        k_pe = self.key_part(k_pe).view(B, 1, T, self.rope_dims)  # one key part for every head
        if rope is not None and self.use_rope:
            k_pe = apply_rope(k_pe, *layer_rope(rope, self.rope_table))
        return self.kv_a_norm(latent).view(B, 1, T, self.rank), k_pe

    def project_qkv(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                    ve: torch.Tensor | None = None, latent: tuple[torch.Tensor, torch.Tensor] | None = None):
        """x: (B, T, C) -> q, k, v (B, H, T, D) each, q and k [rope; nope] with RoPE applied, v zero-padded from Dv
        to D; ve unused (validate refuses value embeddings); latent: the source layer's latent_kv (model.
        kv_source_layers), else this layer's own."""
        B, T, _ = x.shape
        H, D, R = self.n_head, self.head_dim, self.rope_dims
        q_pe, q_nope = self.rotated_queries(x, rope)
        c, k_pe = latent if latent is not None else self.latent_kv(x, rope)
        kv = self.kv_b(c.squeeze(1)).view(B, T, H, D - R + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split([D - R, self.v_dim], dim=-1)  # (B, H, T, Dn), (B, H, T, Dv)
        q = torch.cat([q_pe, q_nope], dim=-1)
        k = torch.cat([k_pe.expand(B, H, T, R), k_nope], dim=-1)
        return q, k, F.pad(v, (0, D - self.v_dim))

    def key_part(self, k_pe: torch.Tensor) -> torch.Tensor:
        """The shared key part (B, T, R) as RoPE takes it: RMS-normed where model.latent_key_norm."""
        return k_pe if self.k_pe_norm is None else self.k_pe_norm(k_pe)

    def project(self, x: torch.Tensor):
        raise NotImplementedError("latent attention has no raw q/k/v projection: use project_qkv")

    def _kv_b_weight(self) -> torch.Tensor:
        """kv_b's weight (H·(Dn + Dv), L) as the layer applies it: an adapted layer's (LoRA, NF4: a LoRALinear) is its
        output for the identity, which takes its update in."""
        if not hasattr(self.kv_b, "lora_A"):
            return self.kv_b.weight
        like = (self.kv_a if self.kv_a is not None else self.proj).weight  # a kv-shared layer has no kv_a
        eye = torch.eye(self.rank, dtype=like.dtype, device=like.device)
        return self.kv_b(eye).T

    def latent_heads(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None, ve=None):
        """The absorbed form (DeepSeek-V2's paper, section 2.1.2): x (B, T, C) -> q (B, H, T, R + L), k and v (B, 1, T,
        R + L). Each head's unrotated query part takes its keys' up-projection in (q_nope (Dn) @ W_uk (Dn, L) -> L),
        so that q·k over [rope; latent] is the expanded heads' q·k; the one key head is [k_pe; c], c the normalized
        latent, and the one value head [0; c]: a head's output's latent part goes through its W_uv after attention
        (latent_output). The scores keep the expanded heads' scale (LatentHeads.scale). A layer that reads another's
        cache (model.kv_source_layers) gives its queries alone (k and v None): the cache hands it its source's."""
        H, D, R, L = self.n_head, self.head_dim, self.rope_dims, self.rank
        q_pe, q_nope = self.rotated_queries(x, rope)
        w_uk = self._kv_b_weight().view(H, D - R + self.v_dim, L)[:, :D - R]  # (H, Dn, L)
        q = torch.cat([q_pe, torch.matmul(q_nope, w_uk.to(q_nope.dtype))], dim=-1)  # (B, H, T, R + L)
        if self.kv_source is not None:
            return q, None, None
        c, k_pe = self.latent_kv(x, rope)
        return q, torch.cat([k_pe.to(c.dtype), c], dim=-1), F.pad(c, (R, 0))

    def latent_output(self, y: torch.Tensor) -> torch.Tensor:
        """The absorbed heads' outputs y (B, T, H·(R + L)) -> (B, T, H·Dv): each head's latent part through its W_uv
        (L -> Dv), the value rows of kv_b."""
        B, T, _ = y.shape
        H, R, L = self.n_head, self.rope_dims, self.rank
        w_uv = self._kv_b_weight().view(H, self.head_dim - R + self.v_dim, L)[:, self.head_dim - R:]  # (H, Dv, L)
        y = y.view(B, T, H, R + L)[..., R:].transpose(1, 2)  # (B, H, T, L)
        return torch.matmul(y, w_uv.transpose(1, 2).to(y.dtype)).transpose(1, 2).reshape(B, T, H * self.v_dim)

    def forward(self, x, rope, attn_mask: torch.Tensor | None = None, cache=None, ve=None,
                shared: dict | None = None) -> torch.Tensor:
        """As Attention.forward: x (B, T, C) -> (B, T, C); the heads' outputs (B, T, H·D) cut to their values' Dv
        columns before proj; with a cache, the absorbed heads' (LatentHeads) through latent_output. shared: without a
        cache, the forward's {layer: latent_kv} (model.kv_source_layers): a layer puts its own there and one that
        reads another's takes its source's."""
        if cache is not None:
            return self.proj(self.head_gated(x, self.latent_output(cache.attend(LatentHeads(self), x, rope, ve))))
        if self.kv_source is not None:
            latent = shared[self.kv_source]
        else:
            latent = self.latent_kv(x, rope)
            if shared is not None:
                shared[self.layer] = latent
        q, k, v = self.project_qkv(x, rope, ve, latent)
        y = self.attend(q, k, v, attn_mask, is_causal=attn_mask is None)
        B, T, _ = y.shape
        y = y.view(B, T, self.n_head, self.head_dim)[..., :self.v_dim].reshape(B, T, -1)  # (B, T, H·Dv)
        return self.proj(self.head_gated(x, y))

    def head_gated(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y (B, T, H·Dv), the heads' values, times sigmoid(gate(x)) (B, T, H) a head where model.attn_gate=head, in
        fp32 cast back (as transformers' BailingHybridAttention computes it), each value where attn_gate=element, in
        y's dtype (HYV4Attention's); with model.q_latent_gate times sigmoid(g) (B, T, H·Dv) of q_b's gate rows, in
        fp32 cast back (AXK2Attention's; q_b runs again for them, so that an adapter on q_b reaches them too)."""
        if self.latent_gate:
            return (y * torch.sigmoid(self.queries_and_gate(x)[1].float())).to(y.dtype)
        if self.gate is None:
            return y
        if self.cfg.attn_gate == "element":
            return y * torch.sigmoid(self.gate(x).to(y.dtype))
        B, T, _ = y.shape
        g = torch.sigmoid(self.gate(x).float()).to(y.dtype)
        return (y.view(B, T, self.n_head, self.v_dim) * g.unsqueeze(-1)).view(B, T, -1)


class LatentHeads:
    """A LatentAttention layer as the inference engine's cache layers see it (redline/inference/cache.py): H query
    heads over one key/value head of R + L (latent_heads), scored at the expanded heads' scale (model.attn_scale, else
    1 / sqrt(head_size)), with the layer's sinks (model.attn_sinks)."""

    training = False
    attend = Attention.attend

    def __init__(self, attn: LatentAttention):
        self.cfg, self.window, self.use_rope, self.sinks = attn.cfg, attn.window, True, attn.sinks
        self.n_head, self.n_kv, self.head_dim = attn.n_head, 1, attn.rope_dims + attn.rank
        self.scale = attn.scale or attn.head_dim ** -0.5
        self.project_qkv = attn.latent_heads


class SharedKVAttention(Attention):
    """DeepSeek-V4's attention (model.shared_kv_attention), as transformers' DeepseekV4Attention computes it on its
    sliding-window layers: q = q_b(q_a_norm(q_a(x))) (C -> q_lora_rank -> H·D), each head RMS-normed without a weight
    (fp32); one key head kv_norm(kv(x)) (C -> D) that serves as the value too; RoPE turns q's and the key's first
    rope_dims (DeepSeek-V4 turns a head's last rope_dims as interleaved pairs: the import permutes the rows of q_b, kv
    and kv_norm and the columns of o_a to redline's order, which leaves every product as it was); sinks per head
    (model.attn_sinks). The value carries its key's rotation by the key's position, so each head's output is turned
    back by its query's (RoPE with -sin), leaving the relative one. The heads' outputs (B, T, H·D) then go through the
    grouped output projection: G = o_groups groups of H·D/G, each through its own (o_lora_rank, H·D/G) block of o_a
    (a HeadLinear), the G·o_lora_rank together through proj (C). The KV cache holds the one key head as key and as
    value, as any multi-query layer's."""

    def __init__(self, cfg: ModelConfig, value_embedding: bool = False, layer: int = 0):
        nn.Module.__init__(self)
        self.cfg, self.layer = cfg, layer
        self.n_head, self.n_kv, self.head_dim = cfg.n_head, 1, cfg.head_dim
        self.kv_source, self.values_from_keys = None, False  # what Attention's callers read
        self.window = cfg.layer_mask(layer)
        self.rope_table = cfg.layer_rope_table(layer)
        self.use_rope = True
        self.scale = cfg.attn_scale or None  # None: 1 / sqrt(D), DeepSeek-V4's scaling
        self.ve_mix = self.ve_gate = self.gate = self.v_norm = None
        self.sinks = nn.Parameter(torch.zeros(self.n_head)) if cfg.attn_sinks else None
        H, D, C, G = cfg.n_head, cfg.head_dim, cfg.n_embd, cfg.o_groups
        self.groups = G
        self.q_a = nn.Linear(C, cfg.q_lora_rank, bias=False)
        self.q_a_norm = nn.RMSNorm(cfg.q_lora_rank, eps=cfg.norm_eps)
        self.q_b = nn.Linear(cfg.q_lora_rank, H * D, bias=False)
        self.kv = nn.Linear(C, D, bias=False)
        self.kv_norm = nn.RMSNorm(D, eps=cfg.norm_eps)
        self.o_a = HeadLinear(G, H * D // G, cfg.o_lora_rank, bias=False)  # (G, o_lora_rank, H·D/G)
        self.proj = nn.Linear(G * cfg.o_lora_rank, C, bias=False)
        self.proj.is_residual_out = True
        # model.kv_compress_rates: the compressor of keys pooled window by window, its projections' series (2 where
        # the windows overlap); its keys' RoPE tables at the windows' starts w·m (fp32 buffers, derive_tables)
        self.compress_rate = cfg.kv_compress_rates[layer] if cfg.kv_compress_rates else 0
        self.overlap = layer in cfg.kv_compress_overlap
        if self.compress_rate:
            series = 2 if self.overlap else 1
            self.comp_kv = nn.Linear(C, series * D, bias=False)
            self.comp_gate = nn.Linear(C, series * D, bias=False)
            self.comp_bias = nn.Parameter(torch.zeros(self.compress_rate, series * D))
            self.comp_norm = nn.RMSNorm(D, eps=cfg.norm_eps)
            self.register_buffer("comp_cos", None, persistent=False)
            self.register_buffer("comp_sin", None, persistent=False)
            self.derive_tables()

    def derive_tables(self) -> None:
        """comp_cos, comp_sin (context_len // m, R/2) fp32: RoPE of this layer's base at positions 0, m, 2m, ...,
        where its compressed keys turn (DeepSeek-V4's compressor rotates key w at w·m)."""
        base, scaled = self.cfg.rope_bases[self.rope_table] if self.cfg.rope_bases else (self.cfg.rope_theta, True)
        cfg = replace(self.cfg, rope_theta=base, rope_scaling=self.cfg.rope_scaling if scaled else "none",
                      rope_unscaled_theta=0.0, rope_layer_theta=())
        device = self.comp_bias.device if self.comp_bias.device.type != "meta" else None
        starts = torch.arange(0, self.cfg.context_len, self.compress_rate, dtype=torch.float32)
        angles = torch.outer(starts, rope_frequencies(cfg))
        scale = rope_attention_factor(cfg)
        self.comp_cos, self.comp_sin = (angles.cos() * scale).to(device), (angles.sin() * scale).to(device)

    def project(self, x: torch.Tensor):
        raise NotImplementedError("DeepSeek-V4's attention has no raw q/k/v projection: use project_qkv")

    def project_qkv(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                    ve: torch.Tensor | None = None):
        """x (B, T, C) -> q (B, H, T, D), k and v (B, 1, T, D), the same tensor, RoPE applied; ve unused (validate
        refuses value embeddings)."""
        B, T, _ = x.shape
        H, D = self.n_head, self.head_dim
        q = self.q_b(self.q_a_norm(self.q_a(x))).view(B, T, H, D).transpose(1, 2)
        q = F.rms_norm(q.float(), (D,), eps=self.cfg.norm_eps).to(q.dtype)  # DeepseekV4UnweightedRMSNorm's
        kv = self.kv_norm(self.kv(x)).view(B, T, 1, D).transpose(1, 2)
        if rope is not None:
            cos, sin = layer_rope(rope, self.rope_table)
            q, kv = apply_rope(q, cos, sin), apply_rope(kv, cos, sin)
        if self.compress_rate:  # the compressor's projections ride beside the key: (B, 1 + 2·series, T, D)
            raw = torch.cat([self.comp_kv(x), self.comp_gate(x)], dim=-1).view(B, T, -1, D).transpose(1, 2)
            kv = torch.cat([kv, raw.to(kv.dtype)], dim=1)
        return q, kv, kv

    def compressed_keys(self, raw: torch.Tensor) -> torch.Tensor:
        """raw (B, 2·series, S, D): the compressor's kv then gate projections of positions 0..S-1 -> the compressed
        keys of the S // m whole windows (B, 1, S // m, D), as transformers' DeepseekV4HCACompressor (series 1) and
        DeepseekV4CSACompressor (series 2: key w pools window w's second series and window w - 1's first, the first
        window's missing half weighted 0) compute them: softmax over the window's tokens in fp32 of gate + comp_bias,
        the weighted sum of kv, comp_norm, RoPE at position w·m."""
        m, (B, heads, S, D) = self.compress_rate, raw.shape
        n = S // m
        raw = raw[:, :, :n * m].transpose(1, 2).reshape(B, n, m, heads * D)  # (B, n, m, 2·series·D)
        kv, gate = raw.chunk(2, dim=-1)  # (B, n, m, series·D) each
        gate = gate.float() + self.comp_bias.float()
        if self.overlap:  # [window w - 1's first series; window w's second]: (B, n, 2m, D), before window 0 nothing
            kv = torch.cat([torch.cat([torch.zeros_like(kv[:, :1, :, :D]), kv[:, :-1, :, :D]], dim=1), kv[..., D:]],
                           dim=2)
            gate = torch.cat([torch.cat([torch.full_like(gate[:, :1, :, :D], float("-inf")), gate[:, :-1, :, :D]],
                                        dim=1), gate[..., D:]], dim=2)
        pooled = (kv * torch.softmax(gate, dim=2).to(kv.dtype)).sum(dim=2)  # (B, n, D)
        keys = self.comp_norm(pooled).unsqueeze(1)  # (B, 1, n, D)
        return apply_rope(keys, self.comp_cos[:n], self.comp_sin[:n])

    def attend_compressed(self, q, keys, raw, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """q (B, H, Tq, D) at positions (Tq,) or (B, Tq); keys (B, 1, S, D) the window's keys (also the values) of
        positions 0..S-1 and raw their compressor projections; mask (.., Tq, S) bool -> (B, Tq, H·D): attention over
        the window's keys and the compressed keys of the whole windows each query has seen."""
        compressed = self.compressed_keys(raw)  # (B, 1, n, D)
        n = compressed.shape[2]
        seen = torch.arange(n, device=q.device) < ((positions + 1) // self.compress_rate)[..., None]  # (.., Tq, n)
        seen = seen.view(-1, 1, positions.shape[-1], n) if positions.dim() == 2 else seen
        B, _, Tq, _ = q.shape
        mask = torch.cat([mask.expand(B, 1, Tq, -1), seen.expand(B, 1, Tq, n)], dim=-1)
        keys = torch.cat([keys, compressed.to(keys.dtype)], dim=2)
        return explicit_attention(q, keys, keys, mask, self.scale, 0.0, self.sinks)

    def attend(self, q, k, v, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        """As Attention.attend; a compressed layer's k holds its compressor's projections beside the key
        (project_qkv), the queries the last Tq of the Tk positions (a full forward, a prefill span)."""
        if not self.compress_rate:
            return super().attend(q, k, v, attn_mask, is_causal)
        Tq, Tk = q.shape[2], k.shape[2]
        if attn_mask is None:
            attn_mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
        positions = torch.arange(Tk - Tq, Tk, device=q.device)
        return self.attend_compressed(q, k[:, :1], k[:, 1:], attn_mask, positions)

    def attend_slots(self, q, k_cache: torch.Tensor, mask: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """The engine's decode step of a compressed layer (DecodeLayer.attend): q (B, H, 1, D) at each row's slot
        (B,), k_cache (B, 1 + 2·series, W, D) its cached slots, mask (B, 1, 1, W) -> (B, 1, H·D)."""
        return self.attend_compressed(q, k_cache[:, :1], k_cache[:, 1:], mask, slot[:, None])

    def forward(self, x, rope, attn_mask: torch.Tensor | None = None, cache=None, ve=None,
                shared: dict | None = None) -> torch.Tensor:
        """As Attention.forward: x (B, T, C) -> (B, T, C)."""
        if cache is not None:
            y = cache.attend(self, x, rope, ve)
        else:
            q, k, v = self.project_qkv(x, rope)
            y = self.attend(q, k, v, attn_mask, is_causal=attn_mask is None)
        B, T, _ = y.shape
        y = y.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        if rope is not None:  # the value's rotation undone at the query's position
            cos, sin = layer_rope(rope, self.rope_table)
            y = apply_rope(y, cos, -sin)
        y = y.transpose(1, 2).reshape(B, T, self.groups, -1)  # (B, T, G, H·D/G)
        return self.proj(self.o_a(y).flatten(2))


class CCAAttention(Attention):
    """ZAYA's compressed convolutional attention (model.cca_kernels), as transformers' ZayaCCAProjection and
    ZayaQKNorm compute it. Each token's raw inputs, u = [q, k, v_delayed] ((H + KV)·D + KV·D/2 channels), are what
    the inference cache keeps in its slot (slot_inputs); q, k and v come from this token's and the `span` tokens'
    before it (project_qkv's `before`): the convolutions read the last K = (depthwise - 1) + (grouped - 1) of them,
    the delayed half of the values the last one's. q (H·D) is attn.q, k (KV·D) attn.k, v (KV·D/2) attn.v: the
    values' first half; qk_conv ((H + KV)·D, 1, depthwise) and qk_head_conv ((H + KV)·D, D, grouped) the two
    convolutions' weights, each with a bias."""

    def __init__(self, cfg: ModelConfig, value_embedding: bool = False, layer: int = 0):
        super().__init__(cfg, value_embedding, layer)
        H, KV, D, C = self.n_head, self.n_kv, self.head_dim, cfg.n_embd
        self.qk_width, half = (H + KV) * D, KV * D // 2
        self.v = nn.Linear(C, half, bias=False)  # the token's own values, the first KV·D/2 channels
        self.v_delayed = nn.Linear(C, half, bias=False)  # the values the next token takes, its last KV·D/2
        depthwise, grouped = cfg.cca_kernels
        self.qk_conv = nn.Parameter(torch.empty(self.qk_width, 1, depthwise))
        self.qk_conv_bias = nn.Parameter(torch.zeros(self.qk_width))
        self.qk_head_conv = nn.Parameter(torch.empty(self.qk_width, D, grouped))
        self.qk_head_conv_bias = nn.Parameter(torch.zeros(self.qk_width))
        self.key_scale = nn.Parameter(torch.ones(KV))  # ZayaQKNorm's temp: each key head's factor
        self.conv_span = (depthwise - 1) + (grouped - 1)
        self.span = max(self.conv_span, 1)  # the slots before a token that its q, k and v read

    def reset_cca(self, std: float) -> None:
        nn.init.normal_(self.qk_conv, mean=0.0, std=std)
        nn.init.normal_(self.qk_head_conv, mean=0.0, std=std)
        for bias in (self.qk_conv_bias, self.qk_head_conv_bias):
            nn.init.zeros_(bias)
        nn.init.ones_(self.key_scale)

    def slot_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) -> each token's raw inputs u (B, T, (H + KV)·D + KV·D/2): [q, k, v_delayed]."""
        return torch.cat([self.q(x), self.k(x), self.v_delayed(x)], dim=-1)

    def project_qkv(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                    ve: torch.Tensor | None = None, before: torch.Tensor | None = None,
                    u: torch.Tensor | None = None):
        """x (B, T, C) -> q (B, H, T, D), k and v (B, KV, T, D), QK-normed and rotated. before: the raw inputs of the
        `span` tokens before x's first (B, span, width), zeros where there are none; None: x starts the sequence.
        u: slot_inputs(x) where the caller has them already."""
        B, T, _ = x.shape
        H, KV, D, W = self.n_head, self.n_kv, self.head_dim, self.qk_width
        u = self.slot_inputs(x) if u is None else u
        if before is None:
            before = u.new_zeros(B, self.span, u.shape[-1])
        seq = torch.cat([before.to(u.dtype), u], dim=1)  # (B, span + T, width)
        qk = seq[:, self.span - self.conv_span:, :W].transpose(1, 2)  # (B, (H + KV)·D, K + T)
        qk = F.conv1d(qk, self.qk_conv.to(qk.dtype), self.qk_conv_bias.to(qk.dtype), groups=W)
        qk = F.conv1d(qk, self.qk_head_conv.to(qk.dtype), self.qk_head_conv_bias.to(qk.dtype), groups=H + KV)
        qk = qk.transpose(1, 2)  # (B, T, (H + KV)·D)
        q_in, k_in = u[..., :H * D].view(B, T, H, D), u[..., H * D:W].view(B, T, KV, D)
        # residual paths: a query head's mean with its kv head's key; a key head its group's mean of those
        q_res = (q_in + k_in.repeat_interleave(H // KV, dim=2)) * 0.5
        k_res = q_res.view(B, T, KV, H // KV, D).mean(dim=3)
        q = qk[..., :H * D].view(B, T, H, D) + q_res
        k = qk[..., H * D:].view(B, T, KV, D) + k_res
        delayed = seq[:, self.span - 1:self.span - 1 + T, W:]  # (B, T, KV·D/2): each token's predecessor's
        v = torch.cat([self.v(x), delayed], dim=-1).view(B, T, KV, D)
        eps = torch.finfo(q.dtype).eps
        q = q * (D ** 0.5 / q.norm(dim=-1, keepdim=True).clamp_min(eps))
        k = k * (D ** 0.5 / k.norm(dim=-1, keepdim=True).clamp_min(eps)) * self.key_scale.to(k.dtype)[:, None]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if rope is not None and self.use_rope:
            cos, sin = layer_rope(rope, self.rope_table)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v


def causal_conv(u: torch.Tensor, weight: torch.Tensor, before: torch.Tensor | None = None,
                doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """A causal depthwise convolution of u (B, T, C) by weight (C, K), oldest token first -> (B, T, C): token t sums
    weight[:, j] · u[t - (K - 1) + j], the tokens before the first taken from `before` (B, K - 1, C), else zeros;
    with doc_ids (B, T) a token reads none of another document's (ShortConv's and GatedDeltaNet's)."""
    K, T = weight.shape[1], u.shape[1]
    full = torch.cat([before.to(u.dtype) if before is not None else u.new_zeros(u.shape[0], K - 1, u.shape[2]), u],
                     dim=1)
    y = u * weight[:, K - 1]
    for j in range(K - 1):  # the token `shift` back
        shift = K - 1 - j
        term = full[:, j:j + T]
        if doc_ids is not None:
            same = doc_ids == F.pad(doc_ids, (shift, 0), value=-1)[:, :T]
            term = term * same[..., None]
        y = y + term * weight[:, j]
    return y


class ShortConv(nn.Module):
    """The token mixer of model.conv_layers (LFM2's Lfm2ShortConv): in_proj (C -> 3·C) split as (b, c, h), a causal
    depthwise convolution of b·h over the last `kernel` tokens (weight (C, kernel), oldest token first), c times it,
    proj (C -> C). It stands where a layer's attention would (Block.attn), and reads its cache layer's `convolve`
    in inference (redline/inference/cache.py keeps each token's b·h in its slot)."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        C = cfg.n_embd
        self.kernel, self.window = cfg.conv_kernel, cfg.layer_window(layer)  # window: the mask key callers read
        self.in_proj = nn.Linear(C, 3 * C, bias=cfg.bias)
        self.weight = nn.Parameter(torch.empty(C, cfg.conv_kernel))
        self.bias = nn.Parameter(torch.zeros(C)) if cfg.bias else None
        self.proj = nn.Linear(C, C, bias=cfg.bias)
        self.proj.is_residual_out = True

    def gated_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (..., C) -> (b·h, c), each (..., C)."""
        b, c, h = self.in_proj(x).chunk(3, dim=-1)
        return b * h, c

    def convolve(self, u: torch.Tensor, before: torch.Tensor | None = None,
                 doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """causal_conv of u (B, T, C) by the layer's weight, plus its bias."""
        y = causal_conv(u, self.weight, before, doc_ids)
        return y + self.bias if self.bias is not None else y

    def forward(self, x, rope=None, attn_mask=None, cache=None, ve=None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); attn_mask: the batch's doc_ids (B, T) of packed documents, or None (GPT.forward
        hands a conv layer those instead of an attention mask); rope and ve unused."""
        if cache is not None:
            return cache.convolve(self, x)
        u, c = self.gated_input(x)
        return self.proj(c * self.convolve(u, doc_ids=attn_mask))


class RecurrentMixer(nn.Module):
    """A recurrent token mixer (GatedDeltaNet, Mamba2, Mamba1, RGLRU, Lightning, RWKVTimeMix, MLSTM): each defines
    mix(x, before, state, doc_ids, valid) -> (y, the convolution's inputs, the final state), which the inference
    engine's cache layers call step by step (redline/inference/cache.py)."""

    def forward(self, x, rope=None, attn_mask=None, cache=None, ve=None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); attn_mask: the batch's doc_ids (B, T) of packed documents, or None (as a
        short convolution's); rope and ve unused. cache: an inference engine's cache layer, whose `delta` keeps the
        convolution's inputs and the state."""
        if cache is not None:
            return cache.delta(self, x)
        return self.mix(x, doc_ids=attn_mask)[0]


class GatedDeltaNet(RecurrentMixer):
    """The token mixer of model.delta_layers (Qwen3.5's Qwen3_5GatedDeltaNet): in_proj (C -> 2·Hk·Dk + H·Dv) makes q,
    k and v, through a causal depthwise convolution (weight (channels, kernel), oldest token first) and SiLU; q and k
    are L2-normalized per head (q times Dk^-0.5) and shared by H // Hk value heads; beta = sigmoid(b(x)) and the
    decay g = −exp(A_log)·softplus(a(x) + dt_bias) per value head drive gated_delta_rule; its output (B, T, H, Dv) is
    RMS-normalized per head (weight norm, (Dv,)), times SiLU(z(x)), and projected back (proj, H·Dv -> C).
    With model.delta_decay channel, Kimi Delta Attention (transformers' KimiLinearDeltaAttention): the decay one per
    key channel, g = −exp(A_log)·softplus(a(x) + dt_bias) (B, T, H, Dk) with dt_bias (H·Dk,), and the output gate
    sigmoid(z(x)); bounded, floor·sigmoid(exp(A_log)·(a(x) + dt_bias)) (BailingHybridForgetGate's safe gate). a and
    z through rank model.delta_gate_rank where it is given (a_down, z_down: C -> R)."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        C, H, Hk = cfg.n_embd, cfg.delta_heads, cfg.delta_key_heads
        self.heads, self.key_heads, self.dk, self.dv = H, Hk, cfg.delta_key_dim, cfg.delta_value_dim
        self.kernel, self.window, self.eps = cfg.delta_conv_kernel, 0, cfg.delta_norm_eps or cfg.norm_eps
        self.beta_scale = cfg.delta_beta_scale  # (window: the mask key callers read)
        self.decay, self.floor, R = cfg.delta_decay, cfg.delta_decay_floor, cfg.delta_gate_rank
        kda = self.decay != "head"  # Kimi Delta Attention: decays per key channel, a sigmoid output gate
        channels = 2 * Hk * self.dk + H * self.dv
        self.in_proj = nn.Linear(C, channels, bias=False)
        self.z_down = nn.Linear(C, R, bias=False) if R else None
        self.z = nn.Linear(R or C, H * self.dv, bias=False)
        self.b = nn.Linear(C, H, bias=False)
        self.a_down = nn.Linear(C, R, bias=False) if R else None
        self.a = nn.Linear(R or C, H * self.dk if kda else H, bias=False)
        self.conv = nn.Parameter(torch.empty(channels, self.kernel))
        self.A_log = nn.Parameter(torch.zeros(H))
        self.dt_bias = nn.Parameter(torch.ones(H * self.dk if kda else H))
        self.norm = nn.Parameter(torch.ones(self.dv))
        self.proj = nn.Linear(H * self.dv, C, bias=False)
        self.proj.is_residual_out = True

    def mix(self, x: torch.Tensor, before: torch.Tensor | None = None, state: torch.Tensor | None = None,
            doc_ids: torch.Tensor | None = None, valid: torch.Tensor | None = None):
        """x (B, T, C) -> (y (B, T, C), u (B, T, channels) the convolution's inputs, the final state (B, H, Dk, Dv)
        fp32). before: the inputs of the kernel - 1 tokens before x's first (B, kernel - 1, channels), zeros if
        None; state: the state before x's first token, zeros if None; doc_ids (B, T): packed documents, none
        reading another's; valid (B, T) bool: tokens past a row's end (a right-padded prompt's padding), which
        leave the state as it is."""
        B, T, _ = x.shape
        u = self.in_proj(x)  # (B, T, channels)
        starts = None
        if doc_ids is not None:  # no token reads another document's, through the convolution or the state
            starts = doc_ids != F.pad(doc_ids, (1, 0), value=-1)[:, :T]
        qk = self.key_heads * self.dk
        q, k, v = F.silu(causal_conv(u, self.conv, before, doc_ids)).split([qk, qk, self.heads * self.dv], -1)
        # L2 norms as flash-linear-attention's l2norm computes them: x · rsqrt(Σx² + 1e-6)
        q, k = (t.float().view(B, T, self.key_heads, self.dk) for t in (q, k))
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) * self.dk ** -0.5
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        if self.heads != self.key_heads:  # each q/k head serves heads // key_heads consecutive value heads
            q = q.repeat_interleave(self.heads // self.key_heads, dim=2)
            k = k.repeat_interleave(self.heads // self.key_heads, dim=2)
        beta = torch.sigmoid(self.b(x).float()) * self.beta_scale
        a = self.a(x if self.a_down is None else self.a_down(x)).float() + self.dt_bias.float()
        if self.decay == "head":  # (B, T, H)
            g = -self.A_log.float().exp() * F.softplus(a)
        else:  # (B, T, H, Dk): a decay for each key channel, A_log's one a head
            a, rate = a.view(B, T, self.heads, self.dk), self.A_log.float().exp()[:, None]
            g = -rate * F.softplus(a) if self.decay == "channel" else self.floor * torch.sigmoid(rate * a)
        if valid is not None:  # no decay and no correction: the state passes these tokens by
            beta = beta * valid[..., None]
            g = g * valid.view(B, T, *(1,) * (g.dim() - 2))
        o, state = gated_delta_rule(q, k, v.view(B, T, self.heads, self.dv), g, beta, state=state, starts=starts)
        o = o.float()
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.decay != "head":  # KDA's gated norm: fp32 throughout, a sigmoid gate (KimiLinearRMSNormGated)
            z = self.z(x if self.z_down is None else self.z_down(x)).float().view(B, T, self.heads, self.dv)
            o = self.norm.float() * o * torch.sigmoid(z)
        else:
            o = (self.norm * o.to(x.dtype)).float() * F.silu(self.z(x).float().view(B, T, self.heads, self.dv))
        return self.proj(o.to(x.dtype).reshape(B, T, -1)), u, state


class Mamba2(RecurrentMixer):
    """The token mixer of model.delta_layers with delta_rule=mamba2 (Mamba-2's mixer, as transformers' BambaMixer and
    GraniteMoeHybridMambaLayer run it): in_proj (C -> I + (I + 2·G·N) + H, I = H·P) gives the gate z, the
    convolution's input xBC and dt; a causal depthwise convolution (weight (channels, kernel), oldest token first,
    plus conv_bias) and SiLU give x (H heads of P), B and C (G groups of N, each shared by H // G heads); the scan
    (recurrent.ssd) with dt = softplus(dt + dt_bias) and A = −exp(A_log), plus D·x; then y·SiLU(z) RMS-normalized in
    G groups of I / G (weight norm, (I,)), or as model.delta_gate_norm places the norm (Falcon-H1's
    FalconH1RMSNormGated: before the gate, or none and no weight), and out_proj (I -> C). The engine's cache holds it
    as a gated delta net's: xBC a slot, the (N, P) states (redline/inference/cache.py)."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        C, H, G = cfg.n_embd, cfg.delta_heads, cfg.delta_key_heads
        self.heads, self.key_heads, self.dk, self.dv = H, G, cfg.delta_key_dim, cfg.delta_value_dim
        self.kernel, self.window = cfg.delta_conv_kernel, 0  # window: the mask key callers read
        self.eps, self.dt_min = cfg.delta_norm_eps or cfg.norm_eps, cfg.delta_dt_min
        self.gate_norm = cfg.delta_gate_norm
        self.inner = H * self.dv
        channels = self.inner + 2 * G * self.dk
        self.in_proj = nn.Linear(C, self.inner + channels + H, bias=cfg.delta_proj_bias)
        self.conv = nn.Parameter(torch.empty(channels, self.kernel))
        self.conv_bias = nn.Parameter(torch.zeros(channels)) if cfg.delta_conv_bias else None
        self.A_log = nn.Parameter(torch.zeros(H))
        self.dt_bias = nn.Parameter(torch.ones(H))
        self.D = nn.Parameter(torch.ones(H))
        self.norm = nn.Parameter(torch.ones(self.inner)) if self.gate_norm != "none" else None
        self.proj = nn.Linear(self.inner, C, bias=cfg.delta_proj_bias)
        self.proj.is_residual_out = True

    def mix(self, x: torch.Tensor, before: torch.Tensor | None = None, state: torch.Tensor | None = None,
            doc_ids: torch.Tensor | None = None, valid: torch.Tensor | None = None):
        """As GatedDeltaNet.mix: x (B, T, C) -> (y (B, T, C), u (B, T, channels) the convolution's inputs, the final
        state (B, H, N, P) fp32); before, state, doc_ids and valid alike."""
        B, T, _ = x.shape
        G, N, H, P = self.key_heads, self.dk, self.heads, self.dv
        z, u, dt = self.in_proj(x).split([self.inner, self.inner + 2 * G * N, H], dim=-1)
        starts = None
        if doc_ids is not None:  # no token reads another document's, through the convolution or the state
            starts = doc_ids != F.pad(doc_ids, (1, 0), value=-1)[:, :T]
        xbc = causal_conv(u, self.conv, before, doc_ids)
        xbc = F.silu(xbc + self.conv_bias if self.conv_bias is not None else xbc)
        xs, Bs, Cs = xbc.split([self.inner, G * N, G * N], dim=-1)
        xs = xs.reshape(B, T, H, P)
        Bs, Cs = (t.reshape(B, T, G, N).repeat_interleave(H // G, dim=2) for t in (Bs, Cs))
        dt = F.softplus(dt.float() + self.dt_bias.float())  # (B, T, H)
        if self.dt_min:
            dt = dt.clamp_min(self.dt_min)
        if valid is not None:  # dt = 0: no decay and no input, the state passes these tokens by
            dt = dt * valid[..., None]
        y, state = ssd(xs, dt, -self.A_log.float().exp(), Bs, Cs, state=state, starts=starts)
        y = (y + self.D.float()[:, None] * xs.float()).reshape(B, T, self.inner)  # fp32
        if self.gate_norm == "after_gate":  # Granite's, Bamba's (norm_before_gate=False)
            y = self._group_norm(y * F.silu(z.float()))
        elif self.gate_norm == "before_gate":  # Falcon-H1's mamba_norm_before_gate=True
            y = self._group_norm(y) * F.silu(z.float())
        else:  # Falcon-H1's mamba_rms_norm=False: the gate alone
            y = y * F.silu(z.float())
        return self.proj(y.to(x.dtype)), u, state

    def _group_norm(self, y: torch.Tensor) -> torch.Tensor:
        """(B, T, I) fp32 RMS-normalized in its G groups of I / G, times the weight norm (I,)."""
        B, T, _ = y.shape
        y = y.view(B, T, self.key_heads, -1)
        return self.norm * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).view(B, T, self.inner)


class HeadLinear(nn.Module):
    """One Linear layer a head, bare stacked weights: x (..., heads, in) -> (..., heads, out), weight (heads, out,
    in), bias (heads·out,) or None (Zamba's x_proj_weight and dt_proj_weight / dt_proj_bias, a Mamba-1 head each)."""

    def __init__(self, heads: int, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(heads, out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(heads * out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.einsum("...hi,hoi->...ho", x, self.weight)
        return y if self.bias is None else y + self.bias.view(self.weight.shape[:2])


class Mamba1(RecurrentMixer):
    """The token mixer of model.delta_layers with delta_rule=mamba1 (Mamba-1's, Gu and Dao 2023; as transformers'
    MambaMixer and FalconMambaMixer run it): in_proj (C -> 2·I) gives x and the gate z; a causal depthwise
    convolution of x (weight (I, kernel), oldest token first, plus conv_bias) and SiLU; x_proj (I -> R + 2·N, no
    bias) gives the low-rank dt (R = model.dt_rank) and B and C (N = delta_key_dim), each RMS-normalized without a
    weight where model.delta_bcdt_norm_eps is set (Falcon-Mamba's), with one (dt_norm, B_norm, C_norm) where
    model.delta_bcdt_norm_weight is (Jamba's); dt = softplus(dt_proj(dt)) (R -> I, with a bias);
    the scan (recurrent.selective_scan) with A = −exp(A_log) (I, N), plus D·x; then y·SiLU(z) and out_proj (I -> C).
    With delta_key_heads > 1 (Zamba's n_mamba_heads) the I channels are that many heads, each with its own x_proj
    (HeadLinear, (heads, R + 2N, I / heads)) and dt_proj ((heads, I / heads, R)), each scanned with its own B and C,
    as transformers' ZambaMambaMixer runs them.
    The engine's cache holds it as the other delta layers: x a slot (I channels), each row's state (I, N, 1), the
    (delta_heads, delta_key_dim, delta_value_dim) state of Mamba-2's heads of one channel."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        C, I, N, R = cfg.n_embd, cfg.delta_heads, cfg.delta_key_dim, cfg.dt_rank
        self.inner, self.dk, self.rank = I, N, R
        self.kernel, self.window = cfg.delta_conv_kernel, 0  # window: the mask key callers read
        self.eps = cfg.delta_bcdt_norm_eps  # 0: no norms on dt, B and C
        self.in_proj = nn.Linear(C, 2 * I, bias=cfg.delta_proj_bias)
        self.conv = nn.Parameter(torch.empty(I, self.kernel))
        self.conv_bias = nn.Parameter(torch.zeros(I)) if cfg.delta_conv_bias else None
        self.heads = max(cfg.delta_key_heads, 1)
        if self.heads == 1:
            self.x_proj = nn.Linear(I, R + 2 * N, bias=False)
            self.dt_proj = nn.Linear(R, I, bias=True)
        else:
            self.x_proj = HeadLinear(self.heads, I // self.heads, R + 2 * N, bias=False)
            self.dt_proj = HeadLinear(self.heads, R, I // self.heads, bias=True)
        self.A_log = nn.Parameter(torch.zeros(I, N))
        self.D = nn.Parameter(torch.ones(I))
        self.proj = nn.Linear(I, C, bias=cfg.delta_proj_bias)
        self.proj.is_residual_out = True
        # delta_bcdt_norm_weight (Jamba's dt_layernorm, b_layernorm, c_layernorm): the norms' weights, (R,), (N,), (N,)
        weighted = cfg.delta_bcdt_norm_weight
        self.dt_norm = nn.Parameter(torch.ones(R)) if weighted else None
        self.B_norm = nn.Parameter(torch.ones(N)) if weighted else None
        self.C_norm = nn.Parameter(torch.ones(N)) if weighted else None

    def _norm(self, t: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """An RMSNorm over the last dimension in fp32, back in t's dtype, then times weight where there is one
        (Jamba's JambaRMSNorm scales the rounded result); none: Falcon-Mamba's weightless norm."""
        f = t.float()
        out = (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + self.eps)).to(t.dtype)
        return out if weight is None else weight * out

    def mix(self, x: torch.Tensor, before: torch.Tensor | None = None, state: torch.Tensor | None = None,
            doc_ids: torch.Tensor | None = None, valid: torch.Tensor | None = None):
        """As GatedDeltaNet.mix: x (B, T, C) -> (y (B, T, C), u (B, T, I) the convolution's inputs, the final state
        (B, I, N, 1) fp32); before (B, kernel - 1, I), state (B, I, N, 1), doc_ids and valid alike."""
        T = x.shape[1]
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (B, T, I) each: x first, the gate second
        starts = None
        if doc_ids is not None:  # no token reads another document's, through the convolution or the state
            starts = doc_ids != F.pad(doc_ids, (1, 0), value=-1)[:, :T]
        xs = causal_conv(u, self.conv, before, doc_ids)
        xs = F.silu(xs + self.conv_bias if self.conv_bias is not None else xs)
        heads = self.heads
        # (B, T, R), (B, T, N) each; with heads, (B, T, heads, R) and (B, T, heads, N), one a head
        dt, Bs, Cs = self.x_proj(xs if heads == 1 else xs.unflatten(-1, (heads, -1))).split(
            [self.rank, self.dk, self.dk], dim=-1)
        if self.eps:  # Falcon-Mamba's and Jamba's: dt (still R wide), B and C each normalized before use
            dt, Bs, Cs = self._norm(dt, self.dt_norm), self._norm(Bs, self.B_norm), self._norm(Cs, self.C_norm)
        dt = F.softplus(self.dt_proj(dt).flatten(2).float())  # (B, T, I)
        if valid is not None:  # dt = 0: no decay and no input, the state passes these tokens by
            dt = dt * valid[..., None]
        A = -self.A_log.float().exp()
        if state is not None:
            state = state[..., 0]
        if heads == 1:
            y, state = selective_scan(xs, dt, A, Bs, Cs, state=state, starts=starts)
        else:  # each head's channels scanned with its own B and C
            w = self.inner // heads
            parts = [selective_scan(xs[..., j * w:(j + 1) * w], dt[..., j * w:(j + 1) * w], A[j * w:(j + 1) * w],
                                    Bs[:, :, j], Cs[:, :, j], state=None if state is None else
                                    state[:, j * w:(j + 1) * w], starts=starts) for j in range(heads)]
            y, state = torch.cat([p[0] for p in parts], dim=-1), torch.cat([p[1] for p in parts], dim=1)
        y = (y + self.D.float() * xs.float()) * F.silu(z.float())
        return self.proj(y.to(x.dtype)), u, state[..., None]


class _SqrtBoundDerivative(torch.autograd.Function):
    """sqrt(x), its gradient clipped at 1000 where x nears 0 (transformers' RecurrentGemma SqrtBoundDerivative, from
    Griffin's reference code): 1 / sqrt(max(4x, 1e-6))."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sqrt(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad / torch.sqrt(torch.clip(4.0 * x, min=1e-6))


class RGLRU(RecurrentMixer):
    """The token mixer of model.delta_layers with delta_rule=rglru (Griffin's recurrent block, De et al. 2024; as
    transformers' RecurrentGemmaRecurrentBlock runs it): y = gelu_tanh(linear_y(x)); u = linear_x(x) (C -> I) through
    a causal depthwise convolution (weight (I, kernel), oldest token first, plus conv_bias); the real-gated linear
    recurrence over it, with input and recurrence gates sigmoid(u_h @ W_h + b_h) block-diagonal in H blocks of I/H
    channels (input_gate, (H, I/H, I/H), applied as u @ W), log a = −8 · r · softplus(recurrent_param), state
    h_t = a_t · h_{t−1} + sqrt(1 − a_t²) · i_t · u_t (in fp32; the first token of a sequence or document takes i · u
    alone, its state reset; computed by recursive doubling, recurrent._linear_scan); then linear_out(h · y). The
    engine's cache holds u a slot (I channels) and each row's state (H, 1, I/H)."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        C, H, W = cfg.n_embd, cfg.delta_heads, cfg.delta_value_dim
        I = H * W
        self.heads, self.width, self.inner = H, W, I
        # window: the mask key callers look up (and this mixer never reads): the layer's, which the engine's masks
        # have even where every attention layer is windowed (RecurrentGemma's)
        self.kernel, self.window = cfg.delta_conv_kernel, cfg.layer_mask(layer)
        self.linear_y = nn.Linear(C, I, bias=cfg.delta_proj_bias)
        self.linear_x = nn.Linear(C, I, bias=cfg.delta_proj_bias)
        self.conv = nn.Parameter(torch.empty(I, self.kernel))
        self.conv_bias = nn.Parameter(torch.zeros(I)) if cfg.delta_conv_bias else None
        self.input_gate = nn.Parameter(torch.empty(H, W, W))
        self.input_gate_bias = nn.Parameter(torch.zeros(H, W))
        self.recurrent_gate = nn.Parameter(torch.empty(H, W, W))
        self.recurrent_gate_bias = nn.Parameter(torch.zeros(H, W))
        self.recurrent_param = nn.Parameter(torch.empty(I))
        self.proj = nn.Linear(I, C, bias=cfg.delta_proj_bias)
        self.proj.is_residual_out = True

    @torch.no_grad()
    def reset_recurrence(self, std: float) -> None:
        """Griffin's initial values, as transformers' _init_weights draws them: the gates N(0, std), recurrent_param
        such that softplus(recurrent_param) = −½ ln a², a² uniform in [0.9², 0.999²]."""
        for w in (self.input_gate, self.recurrent_gate):
            nn.init.normal_(w, mean=0.0, std=std)
        a2 = torch.empty_like(self.recurrent_param).uniform_(0.9 ** 2 + 1e-8, 0.999 ** 2 + 1e-8)
        self.recurrent_param.copy_(a2.log().mul(0.5).neg().exp().sub(1.0).log())

    def _gate(self, u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """sigmoid of u (B, T, I) through the block-diagonal (H, W, W) weight and (H, W) bias -> (B, T, I)."""
        B, T, _ = u.shape
        blocks = u.reshape(B, T, self.heads, self.width)
        return torch.sigmoid(torch.einsum("bthi,hij->bthj", blocks, weight) + bias).reshape(B, T, -1)

    def mix(self, x: torch.Tensor, before: torch.Tensor | None = None, state: torch.Tensor | None = None,
            doc_ids: torch.Tensor | None = None, valid: torch.Tensor | None = None):
        """As Mamba1.mix: x (B, T, C) -> (out (B, T, C), u (B, T, I) the convolution's inputs, the final state
        (B, H, 1, W) fp32); before (B, kernel - 1, I) and state (B, H, 1, W) of the tokens before (None: the
        sequence starts at x's first token, whose state is reset); doc_ids and valid alike."""
        B, T, _ = x.shape
        y = F.gelu(self.linear_y(x), approximate="tanh")
        u = self.linear_x(x)
        xs = causal_conv(u, self.conv, before, doc_ids)
        if self.conv_bias is not None:
            xs = xs + self.conv_bias
        i_gate = self._gate(xs, self.input_gate, self.input_gate_bias)
        r_gate = self._gate(xs, self.recurrent_gate, self.recurrent_gate_bias)
        log_a = -8.0 * r_gate * F.softplus(self.recurrent_param)  # (B, T, I)
        a = torch.exp(log_a)
        reset = torch.zeros(B, T, 1, dtype=torch.bool, device=x.device)
        if state is None:
            reset[:, 0] = True
        if doc_ids is not None:  # each document's first token starts its state afresh
            reset = reset | (doc_ids != F.pad(doc_ids, (1, 0), value=-1)[:, :T])[..., None]
        scale = _SqrtBoundDerivative.apply(1 - torch.exp(2 * log_a))
        normed = xs * i_gate * torch.where(reset, torch.ones_like(scale), scale).to(x.dtype)
        a = (a * ~reset).float()
        if valid is not None:  # padding: a = 1 and no input, the state passes these tokens by
            a = torch.where(valid[..., None], a, torch.ones_like(a))
            normed = normed * valid[..., None]
        # h_t = a_t·h_{t−1} + normed_t in fp32 (transformers' _rnn_scan, one token at a time), by recursive doubling
        # from a zero state, the carried-in state added with the decay since the first token
        decay, hs = _linear_scan(a, normed.float(), 1)  # (B, T, I) each
        if state is not None:
            hs = hs + decay * state.reshape(B, 1, -1).float()
        last = hs[:, -1].reshape(B, self.heads, 1, self.width)
        return self.proj(hs.to(x.dtype) * y), u, last


def lightning_slopes(heads: int, layer: int, n_layer: int, device=None) -> torch.Tensor:
    """Lightning attention's decay rate a head (H,) fp32, as transformers' MiniMaxLightningAttention.get_slope_rate
    computes it: ALiBi's slopes (1 / 2^(8/H))^(h+1), times 1 - layer / (n_layer - 1) (plus 1e-5 twice), so that the
    decays shrink with depth and the last layer's state barely decays. Computed where it is used (device; the CPU by
    default, whatever the default device): no buffer to restore after a meta-device init, no host copy in a captured
    CUDA graph."""
    rate = (1 / (2 ** (8 / heads))) ** (torch.arange(heads, device=device or "cpu") + 1)
    return rate * (1 - layer / (n_layer - 1 + 1e-5) + 1e-5)


class Lightning(RecurrentMixer):
    """The token mixer of model.delta_layers with delta_rule=lightning (MiniMax's lightning attention, as
    transformers' MiniMaxLightningAttention computes it): qkv_proj (C -> H·3D, each head's [q; k; v] in turn), SiLU on
    all three; per head a (D, D) state S ← λ·S + kᵀv, output q·S, λ = exp(−slope) fixed (lightning_slopes: not
    learned, not stored); the heads' outputs (B, T, H·D) RMS-normed as one vector (weight norm (H·D,)), times
    sigmoid(output_gate(x)), then out_proj (H·D -> C). This is recurrent.ssd with keys k, queries q, values v,
    dt = 1 and A = −slope, so it shares Mamba-2's exact chunked form and decode step. No convolution: the engine's
    cache keeps no inputs a slot (kernel 1, zero channels), only each row's state (H, D, D)."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        C, H, D = cfg.n_embd, cfg.delta_heads, cfg.delta_key_dim
        # window: the mask key callers look up (and this mixer never reads): the layer's, which the engine's masks
        # have even where every attention layer is windowed
        self.heads, self.dk, self.kernel, self.window = H, D, 1, cfg.layer_mask(layer)
        self.eps = cfg.delta_norm_eps or cfg.norm_eps
        self.layer, self.n_layer = layer, cfg.n_layer
        self.qkv_proj = nn.Linear(C, 3 * H * D, bias=False)
        self.output_gate = nn.Linear(C, H * D, bias=False)
        self.norm = nn.Parameter(torch.ones(H * D))
        self.out_proj = nn.Linear(H * D, C, bias=False)
        self.out_proj.is_residual_out = True

    def mix(self, x: torch.Tensor, before: torch.Tensor | None = None, state: torch.Tensor | None = None,
            doc_ids: torch.Tensor | None = None, valid: torch.Tensor | None = None):
        """As GatedDeltaNet.mix: x (B, T, C) -> (y (B, T, C), no convolution inputs (B, T, 0), the final state
        (B, H, D, D) fp32); `before` unused (no convolution); state, doc_ids and valid alike (a padding token:
        dt = 0, no decay and no input)."""
        B, T, _ = x.shape
        q, k, v = F.silu(self.qkv_proj(x)).view(B, T, self.heads, 3 * self.dk).split(self.dk, -1)
        starts = None
        if doc_ids is not None:  # each document's first token starts its state afresh
            starts = doc_ids != F.pad(doc_ids, (1, 0), value=-1)[:, :T]
        dt = x.new_ones(B, T, self.heads, dtype=torch.float32)
        if valid is not None:
            dt = dt * valid[..., None]
        rate = lightning_slopes(self.heads, self.layer, self.n_layer, x.device)
        o, state = ssd(v, dt, -rate, k, q, state=state, starts=starts)  # (B, T, H, D) fp32
        o = o.reshape(B, T, -1)
        # MiniMaxRMSNorm over all H·D channels at once, in fp32, its weight times the input dtype's values
        o = self.norm * (o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        o = torch.sigmoid(self.output_gate(x)) * o
        return self.out_proj(o.to(x.dtype)), x.new_zeros(B, T, 0), state


MLSTM_EPS = 1e-6  # the mLSTM cell's denominator term (xLSTM's eps; the import refuses others)


class MLSTM(RecurrentMixer):
    """The token mixer of model.delta_layers with delta_rule=mlstm (xLSTM's mLSTM layer, as transformers' xLSTMLayer
    computes it): q and k (C -> H·Dk), v and the output gate's preactivation o (C -> H·Dv), the input and forget
    gates' preactivations igate and fgate (C -> H, with biases), soft-capped at model.delta_gate_softcap; the mLSTM
    cell (recurrent.mlstm) in fp32; each head's output LayerNormed without a bias (the per-head norm at delta_norm_eps,
    its weight `norm` (H·Dv,)), times sigmoid(o), then proj (H·Dv -> C). No convolution: the engine's cache keeps no
    inputs a slot, only each row's state, packed as (H, Dk + 1, Dv + 1): C in [:Dk, :Dv], n in [:Dk, Dv], m in
    [Dk, 0]."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        C, H, Dk, Dv = cfg.n_embd, cfg.delta_heads, cfg.delta_key_dim, cfg.delta_value_dim
        # window: the mask key callers look up (and this mixer never reads)
        self.heads, self.dk, self.dv, self.kernel, self.window = H, Dk, Dv, 1, cfg.layer_mask(layer)
        self.cap, self.eps = cfg.delta_gate_softcap, cfg.delta_norm_eps or cfg.norm_eps
        self.q = nn.Linear(C, H * Dk, bias=False)
        self.k = nn.Linear(C, H * Dk, bias=False)
        self.v = nn.Linear(C, H * Dv, bias=False)
        self.o = nn.Linear(C, H * Dv, bias=False)
        self.igate = nn.Linear(C, H)
        self.fgate = nn.Linear(C, H)
        self.norm = nn.Parameter(torch.ones(H * Dv))
        self.proj = nn.Linear(H * Dv, C, bias=False)
        self.proj.is_residual_out = True

    @torch.no_grad()
    def reset_gates(self) -> None:
        """xLSTM's initial gates, as transformers' _init_weights sets them: zero weights, the input gates' biases −10
        and the forget gates' from 3 to 6 across the heads (memories that start closed and slow to forget)."""
        for gate in (self.igate, self.fgate):
            gate.weight.zero_()
        self.igate.bias.fill_(-10.0)
        self.fgate.bias.copy_(torch.linspace(3.0, 6.0, self.heads))

    def _gate(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        g = layer(x)
        return self.cap * torch.tanh(g / self.cap) if self.cap else g

    def _unpack(self, state: torch.Tensor | None):
        if state is None:
            return None
        Dk, Dv = self.dk, self.dv
        return state[:, :, :Dk, :Dv], state[:, :, :Dk, Dv], state[:, :, Dk, 0]

    def _pack(self, C: torch.Tensor, n: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        B, H, Dk, Dv = C.shape
        out = C.new_zeros(B, H, Dk + 1, Dv + 1)
        out[:, :, :Dk, :Dv], out[:, :, :Dk, Dv], out[:, :, Dk, 0] = C, n, m
        return out

    def mix(self, x: torch.Tensor, before: torch.Tensor | None = None, state: torch.Tensor | None = None,
            doc_ids: torch.Tensor | None = None, valid: torch.Tensor | None = None):
        """As GatedDeltaNet.mix: x (B, T, C) -> (y (B, T, C), no convolution inputs (B, T, 0), the final state packed
        (B, H, Dk + 1, Dv + 1) fp32); `before` unused; state (packed), doc_ids and valid alike (a padding token
        leaves the state as it is)."""
        B, T, _ = x.shape
        H = self.heads
        q, k = self.q(x).view(B, T, H, self.dk), self.k(x).view(B, T, H, self.dk)
        v = self.v(x).view(B, T, H, self.dv)
        starts = None
        if doc_ids is not None:  # each document's first token starts from the initial state
            starts = doc_ids != F.pad(doc_ids, (1, 0), value=-1)[:, :T]
        h, (C, n, m) = mlstm(q, k, v, self._gate(self.igate, x), self._gate(self.fgate, x), self._unpack(state),
                             starts, valid, MLSTM_EPS)
        # xLSTMMultiHeadLayerNorm: each head's (Dv,) centred and scaled in fp32, the weight over all H·Dv
        h = (h - h.mean(-1, keepdim=True)) * torch.rsqrt(h.var(-1, keepdim=True, unbiased=False) + self.eps)
        h = h.to(x.dtype).reshape(B, T, -1) * self.norm
        return self.proj(torch.sigmoid(self.o(x)) * h), x.new_zeros(B, T, 0), self._pack(C, n, m)


def token_shift(x: torch.Tensor, before: torch.Tensor | None = None,
                doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Each token's predecessor (RWKV's time_shift): x (B, T, C) -> (B, T, C), the first token's from `before`
    (B, 1, C), else zeros; with doc_ids (B, T) a document's first token reads zeros too."""
    first = before.to(x.dtype) if before is not None else x.new_zeros(x.shape[0], 1, x.shape[2])
    prev = torch.cat([first, x[:, :-1]], dim=1)
    if doc_ids is not None:
        prev = prev * (doc_ids == F.pad(doc_ids, (1, 0), value=-1)[:, :-1])[..., None].to(x.dtype)
    return prev


def shift_blend(x: torch.Tensor, prev: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """RWKV's token mixing of x and its predecessor prev (B, T, C) by mix (C,), as transformers writes it."""
    return x * mix + prev * (1 - mix)


class RWKVTimeMix(RecurrentMixer):
    """The token mixer of model.delta_layers with delta_rule=rwkv (RWKV-4's time mixing, as transformers'
    RwkvSelfAttention computes it): key, value and receptance (C -> A each, no biases) read the token blended with
    its predecessor by mix_key, mix_value and mix_receptance (C,) each; WKV (recurrent.wkv) of the keys and values
    with the decay rate exp(time_decay) and the current token's bonus time_first (A,) each, in fp32; the output
    sigmoid(receptance) times it, projected back (proj, A -> C). The engine's cache keeps each token's input (its
    predecessor's for the next token: a convolution of kernel 2 whose first C channels are this mixer's, the rest
    the layer's channel mixing's, RWKVChannelMix) and each row's WKV state (3, A) fp32."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        C, A = cfg.n_embd, cfg.delta_value_dim
        # window: the mask key callers look up (and this mixer never reads); kernel 2: the token and its predecessor
        self.kernel, self.window, self.width = 2, cfg.layer_mask(layer), A
        self.time_decay = nn.Parameter(torch.empty(A))
        self.time_first = nn.Parameter(torch.empty(A))
        self.mix_key = nn.Parameter(torch.empty(C))
        self.mix_value = nn.Parameter(torch.empty(C))
        self.mix_receptance = nn.Parameter(torch.empty(C))
        self.key = nn.Linear(C, A, bias=False)
        self.value = nn.Linear(C, A, bias=False)
        self.receptance = nn.Linear(C, A, bias=False)
        self.proj = nn.Linear(A, C, bias=False)
        self.proj.is_residual_out = True

    @torch.no_grad()
    def reset_rwkv(self, layer: int, n_layer: int) -> None:
        """RWKV-4's initial values, as transformers' _init_weights sets them: decays from −5 to 3 across the channels
        (steeper in deeper layers), time_first ones, the mixes channel-ramps that give deeper layers more of the
        predecessor."""
        C, A = self.mix_key.numel(), self.width
        depth, remaining = layer / max(n_layer - 1, 1), 1.0 - layer / n_layer
        ramp = torch.arange(C, dtype=torch.float32) / C
        h = torch.arange(A, dtype=torch.float32) / max(A - 1, 1)
        self.time_decay.copy_(-5 + 8 * h ** (0.7 + 1.3 * depth))
        self.time_first.fill_(1.0)
        self.mix_key.copy_(ramp ** remaining)
        self.mix_value.copy_(ramp ** remaining + 0.3 * depth)
        self.mix_receptance.copy_(ramp ** (0.5 * remaining))

    def mix(self, x: torch.Tensor, before: torch.Tensor | None = None, state: torch.Tensor | None = None,
            doc_ids: torch.Tensor | None = None, valid: torch.Tensor | None = None):
        """As GatedDeltaNet.mix: x (B, T, C) -> (y (B, T, C), x itself, the inputs the cache keeps a token, the
        final state (B, 3, A) fp32); before (B, 1, C or more) the predecessor of x's first token (its first C
        channels), state (B, 3, A) the WKV state before x (None: the sequence starts at x's first token); doc_ids
        and valid alike (a padding token leaves the state as it is)."""
        C = x.shape[-1]
        prev = token_shift(x, None if before is None else before[..., :C], doc_ids)
        k = self.key(shift_blend(x, prev, self.mix_key))
        v = self.value(shift_blend(x, prev, self.mix_value))
        r = torch.sigmoid(self.receptance(shift_blend(x, prev, self.mix_receptance)))
        starts = None
        if doc_ids is not None:  # each document's first token starts its state afresh
            starts = doc_ids != F.pad(doc_ids, (1, 0), value=-1)[:, :-1]
        decay = self.time_decay.to(torch.promote_types(self.time_decay.dtype, torch.float32)).exp()
        out, state = wkv(k, v, decay, self.time_first, state, starts, valid)
        return self.proj(r * out.to(x.dtype)), x, state


class RWKVChannelMix(nn.Module):
    """RWKV-4's channel mixing (model.mlp=rwkv, transformers' RwkvFeedForward): fc (key, C -> F) and receptance (C
    -> C) read the token blended with its predecessor by mix_key and mix_receptance (C,) each;
    sigmoid(receptance) · proj(relu(fc)²) (proj: value, F -> C; no biases). In the engine the predecessor is the
    layer's cache's (cache.shift: channels C..2C of the time mixing's slots)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        C, F_ = cfg.n_embd, cfg.hidden_dim
        self.mix_key = nn.Parameter(torch.empty(C))
        self.mix_receptance = nn.Parameter(torch.empty(C))
        self.fc = nn.Linear(C, F_, bias=False)
        self.receptance = nn.Linear(C, C, bias=False)
        self.proj = nn.Linear(F_, C, bias=False)
        self.proj.is_residual_out = True

    @torch.no_grad()
    def reset_rwkv(self, layer: int, n_layer: int) -> None:
        """transformers' initial mixes: channel-ramps giving deeper layers more of the predecessor."""
        C = self.mix_key.numel()
        ramp = (torch.arange(C, dtype=torch.float32) / C) ** (1.0 - layer / n_layer)
        self.mix_key.copy_(ramp)
        self.mix_receptance.copy_(ramp)

    def forward(self, x: torch.Tensor, cache=None, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); cache: an inference engine's cache layer (its `shift` keeps the predecessors);
        doc_ids (B, T): packed documents, whose first tokens read no predecessor."""
        if cache is not None:
            return cache.shift(self, x)
        return self.mix(x, None, doc_ids)

    def mix(self, x: torch.Tensor, before: torch.Tensor | None = None,
            doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, C), before (B, 1, C) the predecessor of its first token (None: zeros) -> (B, T, C)."""
        prev = token_shift(x, before, doc_ids)
        h = torch.square(torch.relu(self.fc(shift_blend(x, prev, self.mix_key))))
        return torch.sigmoid(self.receptance(shift_blend(x, prev, self.mix_receptance))) * self.proj(h)


SWIGLU_CLAMPED_ALPHA = 1.702  # GPT-OSS's sigmoid gain (its configs' swiglu_alpha)


class SharedBlock(nn.Module):
    """A transformer block whose weights several layers share (model.shared_attn_layers: Zamba2's shared
    transformer, as transformers' Zamba2AttentionDecoderLayer computes it): norm1 over the 2C channels of
    cat(x, x0), attention (qkv: 2C -> (H + 2·KV)·D, heads of D = head_size; proj: H·D -> C), norm2, then a gated MLP
    (mlp_fc: C -> 2F, [gate; up]; mlp_proj: F -> C); no residual inside. Each layer calls it through its own
    SharedBlockCall, which adds its adapters and keeps its own KV cache."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        C, F, D = cfg.n_embd, cfg.hidden_dim, cfg.head_dim
        self.norm1 = make_norm(cfg, 2 * C)
        self.qkv = nn.Linear(2 * C, (cfg.n_head + 2 * cfg.kv_heads) * D, bias=False)
        self.proj = nn.Linear(cfg.n_head * D, C, bias=False)
        self.norm2 = make_norm(cfg, C)
        self.mlp_fc = nn.Linear(C, 2 * F, bias=False)
        self.mlp_proj = nn.Linear(F, C, bias=False)


class SharedBlockCall(Attention):
    """Layer `layer`'s call of a SharedBlock (model.shared_attn_layers): x, x0 (B, T, C) each -> t (B, T, C) =
    shared_in(block(cat(x, x0))), where the block's q, k and v (with shared_attn_qkv_adapters) and its MLP's gate and
    up each add this layer's adapter, B(A(u)) ((r, in) and (out, r) Linear layers: q_a, q_b, ..., fc_a, fc_b).
    An Attention to the engine's cache: project adds the adapters to the shared projection, the rest is
    Attention's. The block is bound by GPT (bind), not registered here: its weights are stored once, under
    GPT.shared_blocks."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        nn.Module.__init__(self)  # Attention's fields without its weights (the shared block holds them)
        self.cfg, self.layer = cfg, layer
        self.n_head, self.n_kv, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.kv_source, self.values_from_keys = None, False
        self.window, self.rope_table, self.use_rope = 0, 0, True
        self.scale = cfg.attn_scale or None
        self.ve_mix = self.ve_gate = self.sinks = self.gate = self.v_norm = self.q_scale = self.out_norm = None
        C, r = cfg.n_embd, cfg.shared_attn_adapter_rank
        widths = (self.n_head * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.head_dim)
        self.widths = widths
        self.adapters = nn.ModuleDict()
        if cfg.shared_attn_qkv_adapters:
            for name, width in zip("qkv", widths):
                self.adapters[f"{name}_a"] = nn.Linear(2 * C, r, bias=False)
                self.adapters[f"{name}_b"] = nn.Linear(r, width, bias=False)
        if r:
            self.adapters["fc_a"] = nn.Linear(C, r, bias=False)
            self.adapters["fc_b"] = nn.Linear(r, 2 * cfg.hidden_dim, bias=False)
        self.shared_in = nn.Linear(C, C, bias=False)  # Zamba2's per-layer `linear` on the block's output
        self.bound: list[SharedBlock] = []  # [the shared block], a plain list: not this module's parameters

    def bind(self, block: SharedBlock) -> None:
        self.bound[:] = [block]

    def _adapted(self, name: str, u: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if f"{name}_a" not in self.adapters:
            return y
        return y + self.adapters[f"{name}_b"](self.adapters[f"{name}_a"](u))

    def project(self, x: torch.Tensor):
        """x: (B, T, 2C), the normed cat(x, x0) -> q (B, T, H*D), k and v (B, T, KV*D), each plus its adapter."""
        q, k, v = self.bound[0].qkv(x).split(self.widths, dim=-1)
        return self._adapted("q", x, q), self._adapted("k", x, k), self._adapted("v", x, v)

    def forward(self, x, rope, attn_mask=None, cache=None, x0=None) -> torch.Tensor:
        """x, x0 (B, T, C) -> t (B, T, C); attn_mask and cache as Attention.forward's."""
        block = self.bound[0]
        u = block.norm1(torch.cat([x, x0], dim=-1))  # (B, T, 2C)
        if cache is not None:
            y = cache.attend(self, u, rope)
        else:
            q, k, v = self.project_qkv(u, rope)
            y = self.attend(q, k, v, attn_mask, is_causal=attn_mask is None)
        h = block.norm2(block.proj(y))
        gate, up = self._adapted("fc", h, block.mlp_fc(h)).chunk(2, dim=-1)
        return self.shared_in(block.mlp_proj(gated_activation(self.cfg.mlp, gate, up, self.cfg.gelu_approximate)))


def gated_activation(kind: str, gate: torch.Tensor, up: torch.Tensor, gelu: str = "tanh",
                     limit: float = 7.0) -> torch.Tensor:
    """A gated MLP's hidden activation from its gate and up halves (..., F) each: SwiGLU, GeGLU, GPT-OSS's clamped
    SwiGLU (semantics read from transformers' models/gpt_oss/modeling_gpt_oss.py, GptOssExperts._apply_gate) or
    SwiGLU of the clamped halves (DeepSeek-V4's)."""
    if kind == "swiglu":
        return F.silu(gate) * up
    if kind == "geglu":
        return F.gelu(gate, approximate=gelu) * up
    if kind == "relu2_glu":
        return F.relu(gate).square() * up
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    if kind == "swiglu_clipped":  # as transformers' DeepseekV4Experts._apply_gate and DeepseekV4MLP compute it
        return F.silu(gate) * up
    return (up + 1) * gate * torch.sigmoid(SWIGLU_CLAMPED_ALPHA * gate)


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """SwiGLU clamped after its activation, min(silu(gate), limit) · clamp(up, -limit, limit), gate and up (..., F)
    each (Step 3.5's swiglu_limits, as transformers' Step3p7MLP and Step3p7Experts._apply_gate compute it)."""
    return F.silu(gate).clamp(max=limit) * up.clamp(-limit, limit)


def plain_activation(kind: str, h: torch.Tensor, gelu: str = "tanh") -> torch.Tensor:
    """An ungated MLP's hidden activation: squared ReLU (Primer's; Nemotron-H's), ReLU or GELU."""
    if kind == "relu2":
        return F.relu(h).square()
    if kind == "relu":
        return F.relu(h)
    return F.gelu(h, approximate=gelu)


XIELU_ALPHA_INIT = 0.8  # xIELU's alpha_p and alpha_n at init (transformers' XIELUActivation defaults)


def xielu(h: torch.Tensor, alpha_p: torch.Tensor, alpha_n: torch.Tensor, beta: float, eps: float) -> torch.Tensor:
    """xIELU (Huang et al. 2024, arXiv 2411.13010), from the raw learned scalars alpha_p, alpha_n (1,) each:
    a_p·x² + beta·x for x > 0, a_n·(expm1(min(x, eps)) - x) + beta·x otherwise, with a_p = softplus(alpha_p) and
    a_n = beta + softplus(alpha_n), as transformers' XIELUActivation computes it (its Python path)."""
    a_p = F.softplus(alpha_p).to(h.dtype)
    a_n = (beta + F.softplus(alpha_n)).to(h.dtype)
    return torch.where(h > 0, a_p * h * h + beta * h, (torch.expm1(h.clamp(max=eps)) - h) * a_n + beta * h)


def gaussian_top_k(gate: torch.Tensor, std_multiplier: float) -> torch.Tensor:
    """A gate's pre-activations (..., F) less their cutoff, mean + std_multiplier · std over F (the population
    std), negatives zeroed: the units past the sparsity's quantile of a Gaussian fitted to each token's gate, as
    transformers' Gemma3nTextMLP._gaussian_topk computes it (the multiplier rounded to the gate's dtype)."""
    multiplier = torch.tensor(std_multiplier, dtype=torch.float32, device=gate.device).to(gate.dtype)
    cutoff = gate.mean(dim=-1, keepdim=True) + gate.std(dim=-1, keepdim=True, unbiased=False) * multiplier
    return F.relu(gate - cutoff)


def normal_quantile(p: float) -> float:
    """Φ⁻¹(p) in fp32, as torch.distributions.Normal(0, 1).icdf computes it (sqrt(2) · erfinv(2p - 1))."""
    return float(torch.erfinv(2 * torch.tensor(p, dtype=torch.float32, device="cpu") - 1) * math.sqrt(2))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, sparsity: float = 0.0, act_limit: float = 0.0):
        super().__init__()
        # model.swiglu_act_limits: this layer's clamp after the activation (Step 3.5's), 0: none
        self.act_limit = act_limit
        # model.mlp_sparsity: the gate's Gaussian top-k cutoff in standard deviations, or None (dense)
        self.std_multiplier = normal_quantile(sparsity) if sparsity > 0 else None
        self.kind, self.gelu, self.limit, self.gated = cfg.mlp, cfg.gelu_approximate, cfg.swiglu_limit, cfg.gated_mlp
        # mlp=xielu: the activation's two learned scalars (1,) each, stored raw as Apertus's checkpoints hold them
        # (the softplus inverses of alpha_p and alpha_n - beta); beta and eps are the config's
        self.alpha_p = nn.Parameter(torch.empty(1)) if cfg.mlp == "xielu" else None
        self.alpha_n = nn.Parameter(torch.empty(1)) if cfg.mlp == "xielu" else None
        self.beta, self.eps = cfg.xielu_beta, cfg.xielu_eps
        hidden = cfg.hidden_dim
        fused = cfg.gated_mlp and cfg.fused_mlp  # swiglu / geglu: gate and up in one matmul
        self.fc = nn.Linear(cfg.n_embd, 2 * hidden if fused else hidden, bias=cfg.bias)
        # separate gate and up: fc is the gate, up its own Linear
        self.up = nn.Linear(cfg.n_embd, hidden, bias=cfg.bias) if cfg.gated_mlp and not fused else None
        self.proj = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)
        self.proj.is_residual_out = True
        # model.ngpt: the hidden activation L2-normed before proj (Dory's ffn_sub_norm)
        self.out_norm = L2Norm(cfg.norm_eps) if cfg.ngpt else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1) if self.up is None else (h, self.up(x))
            if self.std_multiplier is not None:
                gate = gaussian_top_k(gate, self.std_multiplier)
            h = (clamped_swiglu(gate, up, self.act_limit) if self.act_limit
                 else gated_activation(self.kind, gate, up, self.gelu, self.limit))
        elif self.alpha_p is not None:
            h = xielu(h, self.alpha_p, self.alpha_n, self.beta, self.eps)
        else:
            h = plain_activation(self.kind, h, self.gelu)
        return self.proj(h if self.out_norm is None else self.out_norm(h))

    @torch.no_grad()
    def reset_xielu(self) -> None:
        """alpha_p and alpha_n at XIELU_ALPHA_INIT (through softplus's inverse, log(expm1(a)), as transformers'
        XIELUActivation initialises them)."""
        self.alpha_p.fill_(math.log(math.expm1(XIELU_ALPHA_INIT)))
        self.alpha_n.fill_(math.log(math.expm1(XIELU_ALPHA_INIT - self.beta)))


def expert_matmul(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Each expert's rows times its weight: x (N, K) sorted by expert, w (E, M, K), ends (E,) int32, the end row of
    each expert's rows -> (N, M), rows ends[e-1]:ends[e] times w[e]ᵀ.

    One grouped GEMM (torch's grouped_mm), with no host synchronisation, so it compiles and runs inside CUDA graphs,
    where it can: in bfloat16 (under autocast both operands are cast to its dtype, as autocast casts a matmul's), and
    on the CPU outside torch.compile in fp32 and fp16 (grouped_mm takes no fp64). Elsewhere (fp32 or fp16 on CUDA,
    fp32 compiled, fp64): eagerly, one product per expert with the row counts read back to the host; compiled or
    captured, where nothing may read them, every expert's product over all rows, each row keeping its own expert's
    (E times the work, exact)."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        x, w = x.to(dtype), w.to(dtype)
    compiled = torch.compiler.is_compiling() or (device == "cuda" and torch.cuda.is_current_stream_capturing())
    if x.dtype == torch.bfloat16 or (device == "cpu" and not compiled and x.dtype != torch.float64):
        grouped = getattr(F, "grouped_mm", None) or torch._grouped_mm
        return grouped(x, w.transpose(1, 2), offs=ends)
    return experts_masked(x, w, ends) if compiled else experts_looped(x, w, ends)


def experts_looped(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """expert_matmul as one product per expert, the row counts read back to the host."""
    counts = torch.diff(ends, prepend=ends.new_zeros(1)).tolist()
    return torch.cat([rows @ w[e].T for e, rows in enumerate(x.split(counts))])


def experts_masked(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """expert_matmul as every expert's product over all rows, each row keeping its own expert's: no host reads."""
    expert = torch.searchsorted(ends, torch.arange(x.shape[0], device=x.device), right=True)  # (N,) each row's
    out = x.new_zeros(x.shape[0], w.shape[1])
    for e in range(w.shape[0]):
        out = torch.where((expert == e)[:, None], x @ w[e].T, out)
    return out


class _ScaledWeight(torch.autograd.Function):
    """weight · factor whose gradient skips the factor (SparseMixer's training multiplier, as transformers'
    PhimoeMultiplier computes it: the constant 1 or 1/3 of Heun's third-order step scales the value, not the
    gradient)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        return weight * factor

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def _sparsemixer_choice(scores: torch.Tensor, candidates: torch.Tensor, eps: float, training: bool,
                        second: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One of SparseMixer's two choices over router logits `scores` (N, E), among `candidates` (scores with the
    expert chosen already at -inf for the second) -> (weight (N, 1), expert (N, 1)). The experts whose logit lies
    more than 2·eps (relative to max(|logit|, the best)) below the best candidate's leave the softmax that weights
    the choice; eval takes the best candidate, training samples one (Gumbel noise) and scales its weight by 1 or
    1/3 (Heun's third-order step), as transformers' sparsemixer (models/phimoe) computes it, RNG draws in its order."""
    with torch.no_grad():
        top, best = candidates.max(dim=-1, keepdim=True)  # (N, 1) each
        far = ((top - scores) / scores.abs().clamp(min=top)) > 2 * eps
    gates = candidates.masked_fill(far, float("-inf"))
    if training:
        noise = torch.empty_like(gates, memory_format=torch.legacy_contiguous_format).exponential_().log()
        expert = (gates - noise).max(dim=-1)[1].unsqueeze(-1)
    else:
        expert = best
    probs = torch.softmax(gates, dim=-1)
    weight = probs.gather(dim=-1, index=expert)
    if training:
        top_prob, top_expert = probs.max(dim=-1, keepdim=True)
        coin = torch.rand_like(top_prob)
        if second:  # transformers draws a rand_like and then uniform_ over it for the second choice
            coin.uniform_()
        keep = torch.logical_or(expert == top_expert, coin > 0.75)
        weight = _ScaledWeight.apply(weight, torch.add(0.3333, keep, alpha=0.6667).type_as(probs))
    return weight, expert


def sparsemixer(logits: torch.Tensor, eps: float, training: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """PhiMoE's top-2 routing (Liu et al. 2024, "GRIN: GRadient-INformed MoE", SparseMixer-v2) over router logits
    (N, E) -> (weights (N, 2), experts (N, 2)): the first choice over every expert, the second over the others, each
    weighted by its own masked softmax (not rescaled together)."""
    weight, expert = _sparsemixer_choice(logits, logits, eps, training, second=False)
    others = torch.scatter(logits, -1, expert, float("-inf"))
    weight2, expert2 = _sparsemixer_choice(logits, others, eps, training, second=True)
    return torch.cat([weight, weight2], dim=-1), torch.cat([expert, expert2], dim=-1)


class MoE(nn.Module):
    """A mixture of expert MLPs (model.moe_experts): router -> softmax (or sigmoid, moe_gating) scores -> the top k
    experts of each token (chosen with moe_expert_bias where given, among the best moe_topk_groups of moe_groups
    groups where given), their outputs summed, weighted by the
    (renormalised, scaled) scores; and a gated shared expert where moe_shared_hidden gives one; with moe_bias the
    router and each expert's two projections have biases (GPT-OSS's). Experts are stacked: fc (E, 2F, C) holds each
    expert's [gate; up] rows (its up rows alone, fc (E, F, C), for an ungated kind such as relu2), proj (E, C, F) its
    output projection; with moe_weight_input each chosen expert's weight scales the token it takes instead of its
    output (Llama 4's Llama4TextMoe). All experts run as two grouped GEMMs over the
    tokens sorted by expert (Mixtral's and Qwen-MoE's routing, as transformers' MixtralSparseMoeBlock and
    Qwen2MoeSparseMoeBlock compute it)."""

    def __init__(self, cfg: ModelConfig, hashed: bool = False, layer: int = 0):
        super().__init__()
        E, F_, C = cfg.moe_experts, cfg.hidden_dim, cfg.n_embd
        # model.moe_swiglu_act_limits, swiglu_act_limits: this layer's clamps after the activation on the routed
        # experts and the shared one (Step 3.5's), 0: none
        self.expert_act_limit = cfg.moe_swiglu_act_limits[layer] if cfg.moe_swiglu_act_limits else 0.0
        shared_limit = cfg.swiglu_act_limits[layer] if cfg.swiglu_act_limits else 0.0
        # model.moe_hash_layers (DeepSeek-V4's hash_moe): each token id's experts, (vocab_size, k) int64, stored with
        # the weights and never trained; the forward then takes the token ids
        self.register_buffer("tid2eid", torch.zeros(cfg.vocab_size, cfg.moe_top_k, dtype=torch.long)
                             if hashed else None)
        self.kind, self.gelu, self.limit = cfg.mlp, cfg.gelu_approximate, cfg.swiglu_limit
        self.expert_limit = cfg.moe_swiglu_limit  # the routed experts' SwiGLU clamp (HY-V4's), 0: none
        self.top_k, self.norm_topk, self.norm_min = cfg.moe_top_k, cfg.moe_norm_topk, cfg.moe_norm_min
        # sqrtsoftplus scores (DeepSeek-V4's) are positive and unnormalized as sigmoid's are: rescaled the same way
        self.sigmoid, self.scale = cfg.moe_gating in ("sigmoid", "sqrtsoftplus"), cfg.moe_scale
        self.sqrtsoftplus = cfg.moe_gating == "sqrtsoftplus"
        self.weight_input = cfg.moe_weight_input  # the weights scale each expert's input (Llama 4's), not its output
        self.norm_eps = cfg.moe_norm_eps if self.sigmoid else 0.0  # softmax scores: their sum is above 0 already
        # moe_gating=sparsemixer (PhiMoE's): its threshold and its training-time input noise
        self.sparsemixer = cfg.moe_gating == "sparsemixer"
        self.jitter_eps, self.input_jitter = cfg.moe_jitter_eps, cfg.moe_input_jitter
        self.gated, self.groups, self.topk_groups = cfg.gated_mlp, cfg.moe_groups, cfg.moe_topk_groups
        # moe_identity_experts (LongCat-Flash's zero-computation experts): Z more experts the router scores, each
        # returning its input; the router's logits and the bias are E + Z wide, fc and proj hold the E MLPs alone
        self.identity_experts = cfg.moe_identity_experts
        self.sink_experts = cfg.moe_sink_experts  # the last S of the E experts, every token's (Inkling's shared)
        # moe_expert_bias: added to the scores that choose the experts (fp32, a buffer: no gradient reaches it)
        self.register_buffer("expert_bias", torch.zeros(E + self.identity_experts) if cfg.moe_expert_bias else None)
        self.bias_on_logits = cfg.moe_bias_on_logits  # the bias joins the logits, before the sigmoid (Kolibri-1's)
        # moe_bias_update: each expert's token choices in training since the last update, (E,) fp32: a tensor the
        # expert_balance converter owns, reads and clears after each optimizer step (not a buffer: data parallelism
        # would broadcast rank 0's over the others' counts)
        self.expert_load: torch.Tensor | None = None
        self.router = nn.Linear(C, E + self.identity_experts, bias=cfg.moe_bias)
        self.fc = nn.Parameter(torch.empty(E, 2 * F_ if cfg.gated_mlp else F_, C))  # ungated: up rows alone
        self.proj = nn.Parameter(torch.empty(E, C, F_))
        # moe_bias: each expert's fc bias (E, 2F), rows [gate; up] as fc's, and proj bias (E, C)
        self.fc_bias = nn.Parameter(torch.zeros(E, 2 * F_)) if cfg.moe_bias else None
        self.proj_bias = nn.Parameter(torch.zeros(E, C)) if cfg.moe_bias else None
        self.shared = MLP(replace(cfg, mlp_hidden=cfg.moe_shared_hidden, moe_experts=0, moe_shared_hidden=0,
                                  moe_aux_loss=0.0, fused_mlp=True, moe_swiglu_act_limits=()),
                          act_limit=shared_limit) if cfg.moe_shared_hidden else None
        self.shared_gate = nn.Linear(C, 1, bias=False) if cfg.moe_shared_hidden and cfg.moe_shared_gate else None
        # moe_beside_dense (Gemma 4's): the experts' own input norm, the router's (C,) input scale, each expert's
        # scale on its weight (E,)
        self.input_norm = make_norm(cfg, C) if cfg.moe_beside_dense else None
        self.router_scale = nn.Parameter(torch.ones(C)) if cfg.moe_beside_dense else None
        self.expert_scale = nn.Parameter(torch.ones(E)) if cfg.moe_beside_dense else None
        self.router_norm_eps = cfg.norm_eps  # moe_beside_dense: the router's input norm
        self.post_norm = make_norm(cfg, C) if cfg.moe_post_norm else None  # on the whole output (A.X-K1's)
        self.out_bias = nn.Parameter(torch.zeros(C)) if cfg.moe_out_bias else None  # on the sum (JetMoE's)
        self.balance_loss = cfg.moe_aux_loss > 0
        self.balance: torch.Tensor | None = None
        """The last training forward's load-balancing loss (a scalar), where model.moe_aux_loss asks for it."""

    def reset_parameters(self, std: float, proj_std: float) -> None:
        nn.init.normal_(self.fc, mean=0.0, std=std)
        if proj_std:
            nn.init.normal_(self.proj, mean=0.0, std=proj_std)
        else:
            nn.init.zeros_(self.proj)
        for bias in (self.fc_bias, self.proj_bias, self.out_bias):
            if bias is not None:
                nn.init.zeros_(bias)
        for scale in (self.router_scale, self.expert_scale):
            if scale is not None:
                nn.init.ones_(scale)

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., C) -> (..., C); ids: the tokens' ids (..., 1) where the layer routes by them (tid2eid), else
        unused."""
        shape, E, k = x.shape, self.fc.shape[0], self.top_k
        x = x.reshape(-1, shape[-1])  # (N, C)
        if self.input_jitter and self.training:  # DBRX's router scales the input in place; PhiMoE's block and then
            for _ in range(2 if self.sparsemixer else 1):  # its router do
                x = x * torch.empty_like(x).uniform_(1.0 - self.input_jitter, 1.0 + self.input_jitter)
        if self.input_norm is None:
            logits = self.router(x)
        else:  # Gemma 4's: the router reads RMS(x) · scale · C^-0.5, the experts their own norm of x
            C = shape[-1]
            routed = F.rms_norm(x.float(), (C,), eps=self.router_norm_eps).type_as(x)
            logits = self.router(routed * self.router_scale * C ** -0.5)
            x = self.input_norm(x)
        if self.sqrtsoftplus:  # DeepSeek-V4's sqrt(softplus(logit)), in fp32
            probs = F.softplus(logits.float()).sqrt()
        elif self.sigmoid:
            probs = torch.sigmoid(logits.float())
        else:
            probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        if self.tid2eid is not None:  # the token's stored experts (DeepSeek-V4's DeepseekV4HashRouter); scores weight
            experts = self.tid2eid[ids.reshape(-1)]  # (N, k)
            weights = probs.gather(1, experts)
        elif self.sparsemixer:  # the weights from the logits in their own dtype, as PhiMoE's router computes them
            weights, experts = sparsemixer(logits, self.jitter_eps, self.training)
        elif self.sink_experts:  # the top k of the routed experts (by score plus bias), then every sink: (N, k + S)
            routed = E - self.sink_experts
            choice = probs[:, :routed] if self.expert_bias is None else probs[:, :routed] + self.expert_bias[:routed]
            sinks = torch.arange(routed, E, device=x.device).expand(x.shape[0], -1)
            experts = torch.cat([choice.topk(k, dim=-1).indices, sinks], dim=-1)
            weights = probs.gather(1, experts)
            k = k + self.sink_experts  # the slots of each token from here on
        elif self.expert_bias is not None or self.groups > 1:  # the bias chooses; the scores weight
            if self.expert_bias is None:
                choice = probs
            else:  # (N, E) fp32
                choice = (logits.float() if self.bias_on_logits else probs) + self.expert_bias
            if self.groups > 1:  # DeepSeek-V3's group-limited routing: the best groups by their two best scores
                grouped = choice.view(-1, self.groups, E // self.groups)  # (N, G, E/G)
                best = grouped.topk(2, dim=-1).values.sum(dim=-1).topk(self.topk_groups, dim=-1).indices  # (N, g)
                keep = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, best, True)  # (N, G)
                choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(-1, E)
            experts = choice.topk(k, dim=-1).indices  # (N, k)
            weights = probs.gather(1, experts)
        else:
            weights, experts = probs.topk(k, dim=-1)  # (N, k) each
        if self.norm_topk:  # sigmoid scores: plus moe_norm_eps, as LFM2-MoE's and GLM-4-MoE's routers compute it;
            total = weights.sum(dim=-1, keepdim=True)  # softmax: floored at moe_norm_min, as ERNIE 4.5's clamps it
            weights = weights / (total + self.norm_eps if self.sigmoid else total.clamp(min=self.norm_min))
        if self.scale != 1.0:
            weights = weights * self.scale
        if self.expert_scale is not None:  # (N, k): each chosen expert's own scale
            weights = weights * self.expert_scale[experts]
        identity = None
        if self.identity_experts:  # a chosen identity expert adds weight · x (as LongcatFlashExperts' identity_expert);
            mlp = experts < E  # its slot goes to expert 0 weighted 0, which keeps the grouped GEMMs' shapes
            identity = x * (weights * ~mlp).sum(dim=-1, keepdim=True).to(x.dtype)  # (N, C)
            experts, weights = torch.where(mlp, experts, 0), weights * mlp
        flat = experts.flatten()  # (N·k,) the expert of each (token, slot)
        order = flat.argsort(stable=True)
        counts = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        ends = counts.cumsum(0, dtype=torch.int32)
        if self.expert_load is not None and self.training:  # a recomputation (activation checkpointing) adds the
            self.expert_load += counts  # same counts again: every expert's load doubles, the update's signs hold
        token, expert = order // k, flat[order]  # (N·k,) each: the token and the expert of each sorted slot
        weight = weights.flatten()[order, None].to(x.dtype)  # (N·k, 1)
        h = expert_matmul(x[token] * weight if self.weight_input else x[token], self.fc, ends)  # (N·k, 2F)
        if self.fc_bias is not None:
            h = h + self.fc_bias[expert].to(h.dtype)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            if self.expert_limit:
                gate, up = gate.clamp(max=self.expert_limit), up.clamp(-self.expert_limit, self.expert_limit)
            h = (clamped_swiglu(gate, up, self.expert_act_limit) if self.expert_act_limit
                 else gated_activation(self.kind, gate, up, self.gelu, self.limit))
        else:
            h = plain_activation(self.kind, h, self.gelu)
        h = expert_matmul(h, self.proj, ends)  # (N·k, C)
        if self.proj_bias is not None:  # inside the weighting, as GPT-OSS's experts add it
            h = h + self.proj_bias[expert].to(h.dtype)
        if not self.weight_input:
            h = h * weight
        out = torch.zeros_like(x).index_add_(0, token, h.to(x.dtype))  # (autocast: h bf16, x fp32)
        if identity is not None:
            out = out + identity
        if self.out_bias is not None:
            out = out + self.out_bias.to(out.dtype)
        if self.shared is not None:
            shared = self.shared(x)
            out = out + (shared if self.shared_gate is None else torch.sigmoid(self.shared_gate(x)) * shared)
        if self.post_norm is not None:
            out = self.post_norm(out)
        if self.balance_loss and self.training:
            share = counts.float() / flat.numel()  # f_e
            self.balance = E * (share * probs.mean(dim=0)).sum()
        return out.view(shape)


class StateRoutedMoE(MoE):
    """model.moe_router_hidden: ZAYA's mixture (transformers' ZayaSparseMoeBlock): experts as MoE's (fc, proj), chosen
    one a token by an MLP router over a state r (R wide) that each layer hands the next. router: the down projection
    (C -> R, biased); state_scale (R,): the previous layer's r's factor (None on layer 0, which has none);
    router_norm, router_fc1, router_fc2 (R -> R, biased), router_out (R -> E + 1: the experts and the skip);
    balance_bias (E + 1,) fp32, a buffer: added to the probabilities that choose (no gradient reaches it)."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__(cfg, layer=layer)
        R, E = cfg.moe_router_hidden, cfg.moe_experts
        self.router = nn.Linear(cfg.n_embd, R, bias=True)
        self.state_scale = nn.Parameter(torch.ones(R)) if layer else None
        self.router_norm = nn.RMSNorm(R, eps=cfg.norm_eps)
        self.router_fc1, self.router_fc2 = nn.Linear(R, R, bias=True), nn.Linear(R, R, bias=True)
        self.router_out = nn.Linear(R, E + 1, bias=False)
        self.register_buffer("balance_bias", torch.zeros(E + 1))
        self.reset_balance()

    def reset_balance(self) -> None:
        """The balancing bias as transformers initialises it: the skip expert's -1, the others' 0."""
        with torch.no_grad():
            self.balance_bias.zero_()
            self.balance_bias[-1] = -1.0

    def reset_parameters(self, std: float, proj_std: float) -> None:
        super().reset_parameters(std, proj_std)
        if self.state_scale is not None:
            nn.init.ones_(self.state_scale)
        self.reset_balance()

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (..., C), the previous layer's router state (..., R) -> the experts' output (..., C) and this layer's
        state (..., R), as transformers' ZayaRouter computes them."""
        shape, E = x.shape, self.fc.shape[0]
        x = x.reshape(-1, shape[-1])  # (N, C)
        r = self.router(x)  # (N, R)
        if self.state_scale is not None:
            r = r + state.reshape(r.shape).to(r.dtype) * self.state_scale
        h = F.gelu(self.router_fc2(F.gelu(self.router_fc1(self.router_norm(r)))))
        probs = torch.softmax(self.router_out(h), dim=-1)  # (N, E + 1)
        experts = (probs.detach().float() + self.balance_bias).topk(1, dim=-1).indices  # (N, 1)
        weights = probs.gather(1, experts)
        skip = experts == E  # the skip expert: its slot goes to expert 0 weighted 0, keeping the GEMMs' shapes
        experts, weights = experts.masked_fill(skip, 0), weights.masked_fill(skip, 0.0)
        flat = experts.flatten()  # (N,)
        order = flat.argsort(stable=True)
        counts = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        ends = counts.cumsum(0, dtype=torch.int32)
        if self.expert_load is not None and self.training:
            self.expert_load += counts
        h = expert_matmul(x[order], self.fc, ends)  # (N, 2F)
        gate, up = h.chunk(2, dim=-1)
        h = expert_matmul(gated_activation(self.kind, gate, up, self.gelu, self.limit), self.proj, ends)  # (N, C)
        h = h * weights.flatten()[order, None].to(h.dtype)
        out = torch.zeros_like(x).index_add_(0, order, h.to(x.dtype))
        return out.view(shape), r.view(*shape[:-1], -1)


def int8_activations(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) with each row rounded to 8 bits by its absolute maximum and scaled back, in fp32 (transformers'
    ActQuant): round(x · 127 / max|x|) clamped to [-128, 127], times max|x| / 127. The gradient passes straight
    through (the forward's value is the rounded one exactly: q + (x - x) adds zero)."""
    xf = x.float()
    scale = 127 / xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
    q = ((xf * scale).round().clamp(-128, 127) / scale).to(x.dtype)
    return q.detach() + (x - x.detach())


def ternary_weights(w: torch.Tensor) -> torch.Tensor:
    """w (out, in) rounded to {-1, 0, 1} times its mean absolute value, in fp32 (transformers' WeightQuant, BitNet
    b1.58's absmean quantization): round(w / mean|w|) clamped to [-1, 1], times mean|w|; the gradient passes straight
    through."""
    wf = w.float()
    scale = 1.0 / wf.abs().mean().clamp(min=1e-5)
    q = ((wf * scale).round().clamp(-1, 1) / scale).to(w.dtype)
    return q.detach() + (w - w.detach())


class BitLinear(nn.Linear):
    """A block's projection with BitNet's options (model.bitlinear, model.sub_norms): an RMSNorm on its input
    (`norm`, or None), then the input's 8-bit rounding and the weights' ternary one where `mode` is online, the
    input's alone where offline (the weights stored ternary), neither where off. A subclass of nn.Linear, so its
    `weight` and `bias` keep their names, initialisation and FLOP counts."""

    def __init__(self, linear: nn.Linear, cfg: ModelConfig, norm: bool):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None)
        self.is_residual_out = getattr(linear, "is_residual_out", False)
        self.mode = cfg.bitlinear
        self.norm = make_rmsnorm(cfg, linear.in_features) if norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x = self.norm(x)
        if self.mode == "off":
            return F.linear(x, self.weight, self.bias)
        if self.mode == "offline" and self.training:
            raise UserError("model.bitlinear=offline holds a packed checkpoint's ternary weights, which transformers "
                            "does not train either; train a model of model.bitlinear=online (its full-precision "
                            "weights)")
        weight = ternary_weights(self.weight) if self.mode == "online" else self.weight
        return F.linear(int8_activations(x), weight, self.bias)


def bitnet_projections(blocks: nn.ModuleList, cfg: ModelConfig) -> None:
    """Each block's q/k/v, output, gate/up and down projections as BitLinear layers (model.bitlinear), the output
    projections normed on their input where model.sub_norms (BitNet's sub-norms sit just before o_proj and
    down_proj)."""
    for block in blocks:
        for sub, names in ((block.attn, ("q", "k", "v", "proj")), (block.mlp, ("fc", "up", "proj"))):
            for name in names:
                linear = getattr(sub, name, None)
                if linear is None or (cfg.bitlinear == "off" and name != "proj"):
                    continue
                setattr(sub, name, BitLinear(linear, cfg, norm=cfg.sub_norms and name == "proj"))


def unweighted_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x (..., D) in fp32 over its RMS, no weight (DeepSeek-V4's UnweightedRMSNorm)."""
    x = x.float()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


def normed_mixes(x: torch.Tensor, fn: torch.Tensor, eps: float, after: bool) -> torch.Tensor:
    """fn (M, D) applied to x (..., D) over its RMS, in fp32 -> (..., M): x normed first (DeepSeek-V4's hyper-
    connections), or with after the projection divided by the RMS (HY-V4's, whose HYV4UnweightedRMSNorm returns the
    inverse RMS alone): the same numbers, rounded as each computes them."""
    if not after:
        return F.linear(unweighted_rms(x, eps), fn.float())
    x = x.float()
    return F.linear(x, fn.float()) * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


class ManifoldHyperConnection(nn.Module):
    """One sublayer's manifold-constrained hyper-connection (model.mhc_streams; DeepSeek-V4's attn_hc / ffn_hc):
    the N streams (B, T, N, C) -> the sublayer's input (B, T, C) and the weights that put its output back.

    fn ((2 + N)·N, N·C) projects the streams, flattened and RMS-normed, to per-token logits for pre (N), post (N)
    and the mixing matrix (N·N), each times its own scale (3,) plus base ((2 + N)·N,): pre = sigmoid(·) + eps,
    post = mhc_post_scale·sigmoid(·), comb = softmax over its rows + eps, then divided by its column sums and
    mhc_sinkhorn_iters - 1 times by its row sums and column sums (Sinkhorn-Knopp), each sum plus eps. All of it in
    fp32, as transformers' DeepseekV4HyperConnection computes it (its parameters kept in fp32). With
    mhc_sinkhorn_iters 0 there is no mixing matrix (fn (2·N, N·C), base (2·N,), scale (2,)) and post takes + eps too,
    as transformers' HYV4HyperConnection (iHC) computes them."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        N, C = cfg.mhc_streams, cfg.n_embd
        self.iters, self.eps, self.norm_eps = cfg.mhc_sinkhorn_iters, cfg.mhc_eps, cfg.norm_eps
        self.post_scale = cfg.mhc_post_scale
        rows = (2 + N) * N if self.iters else 2 * N
        self.fn = nn.Parameter(torch.empty(rows, N * C))
        self.base = nn.Parameter(torch.zeros(rows))
        self.scale = nn.Parameter(torch.ones(3 if self.iters else 2))

    def forward(self, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """xs (B, T, N, C) -> (the sublayer's input (B, T, C) in xs' dtype, post (B, T, N), comb (B, T, N, N), or
        None without a mixing matrix)."""
        B, T, N, C = xs.shape
        mixes = normed_mixes(xs.reshape(B, T, N * C), self.fn, self.norm_eps, after=not self.iters)
        if not self.iters:  # iHC: pre and post alone
            (pre, post), (pre_base, post_base) = mixes.split([N, N], dim=-1), self.base.float().split([N, N])
            pre_scale, post_scale = self.scale.float().unbind(0)
            pre = torch.sigmoid(pre * pre_scale + pre_base) + self.eps
            post = self.post_scale * torch.sigmoid(post * post_scale + post_base) + self.eps
            return (pre.unsqueeze(-1) * xs).sum(dim=2).to(xs.dtype), post, None
        pre, post, comb = mixes.split([N, N, N * N], dim=-1)  # (B, T, N), (B, T, N), (B, T, N·N)
        pre_base, post_base, comb_base = self.base.float().split([N, N, N * N])
        pre_scale, post_scale, comb_scale = self.scale.float().unbind(0)
        pre = torch.sigmoid(pre * pre_scale + pre_base) + self.eps
        post = self.post_scale * torch.sigmoid(post * post_scale + post_base)
        comb = torch.softmax(comb.view(B, T, N, N) * comb_scale + comb_base.view(N, N), dim=-1) + self.eps
        comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        for _ in range(self.iters - 1):
            comb = comb / (comb.sum(dim=-1, keepdim=True) + self.eps)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        return (pre.unsqueeze(-1) * xs).sum(dim=2).to(xs.dtype), post, comb

    @staticmethod
    def merge(xs: torch.Tensor, h: torch.Tensor, post: torch.Tensor, comb: torch.Tensor | None) -> torch.Tensor:
        """The streams after the sublayer: xs (B, T, N, C), its output h (B, T, C) -> post_i · h + Σ_j comb_ji · xs_j
        (comb read transposed, as DeepseekV4DecoderLayer mixes them), or post_i · h + xs_i without a mixing matrix
        (HYV4DecoderLayer's), in xs' dtype."""
        out = post.to(xs.dtype).unsqueeze(-1) * h.unsqueeze(-2)
        return out + (xs if comb is None else torch.matmul(comb.to(xs.dtype).transpose(-1, -2), xs))


class ManifoldHyperHead(nn.Module):
    """The streams (B, T, N, C) -> (B, T, C) before the final norm (model.mhc_streams; DeepSeek-V4's hc_head):
    weighted by sigmoid(fn · rms(streams) · scale + base) + eps, per token, in fp32 (DeepseekV4HyperHead's)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        N = cfg.mhc_streams
        self.eps, self.norm_eps = cfg.mhc_eps, cfg.norm_eps
        self.after = not cfg.mhc_sinkhorn_iters  # HY-V4's iHC divides the projection by the RMS (normed_mixes)
        self.fn = nn.Parameter(torch.empty(N, N * cfg.n_embd))
        self.base = nn.Parameter(torch.zeros(N))
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        mixes = normed_mixes(xs.flatten(2), self.fn, self.norm_eps, self.after)
        pre = torch.sigmoid(mixes * self.scale.float() + self.base.float()) + self.eps  # (B, T, N)
        return (pre.unsqueeze(-1) * xs).sum(dim=2).to(xs.dtype)
class MeanHyperHead(nn.Module):
    """The streams (B, T, N, C) -> their mean (B, T, C) before the final norm (model.mhc_head_mean: GLM-5.3-Next's
    Glm5NextTextHyperHead, an unweighted mean where DeepSeek-V4's head learns its weights)."""

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        return xs.mean(dim=2)


class HyperConnection(nn.Module):
    """One hyper-connection (model.hc_streams, as transformers' Qwen4ExpTextGatedResidual computes it): the N streams
    (B, T, N, C) -> the sublayer's input (B, T, C), their normed average under learned gates, and, with inject, each
    stream's weight (B, T, N) for the sublayer's output, in (0, 2)."""

    def __init__(self, cfg: ModelConfig, inject: bool = True):
        super().__init__()
        N, C = cfg.hc_streams, cfg.n_embd
        self.unit_offset, self.eps = cfg.norm_unit_offset, cfg.norm_eps
        self.norm = nn.Parameter(torch.zeros(N, C) if cfg.norm_unit_offset else torch.ones(N, C))  # each stream's
        self.down = nn.Linear(N * C, cfg.hc_rank, bias=False)
        self.up = nn.Linear(cfg.hc_rank, N * C, bias=False)
        self.inject = nn.Linear(N * C, N, bias=False) if inject else None

    def forward(self, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, N, C = xs.shape
        scale = (1.0 + self.norm.float()) if self.unit_offset else self.norm.float()
        normed = (F.rms_norm(xs.float(), (C,), eps=self.eps) * scale).type_as(xs)  # (B, T, N, C), in fp32 first
        flat = normed.reshape(B, T, N * C)
        gates = torch.sigmoid(self.up(F.silu(self.down(flat) / N))).view(B, T, N, C)
        mixed = (gates * normed).mean(dim=2)  # (B, T, C)
        if self.inject is None:
            return mixed, None
        return mixed, 2 * torch.sigmoid(self.inject(flat) / N)


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's output function of x (the state already advanced), in Python's exact integers."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def ngram_multipliers(vocab_size: int, size: int, index: int, seed: int) -> list[int]:
    """The odd hash multipliers of the index-th n-gram layer's tokens, newest first (model.ngram_layers), as
    transformers' Qwen4-Exp _build_layer_multipliers derives them: SplitMix64 of seed + 10007·index + (j + 1)·γ
    (γ the golden-ratio increment), modulo half the largest multiplier whose product with a token id fits an int64."""
    half = max(1, ((1 << 63) - 1) // max(vocab_size, 1) // 2)
    base = seed + 10007 * index
    return [2 * (_splitmix64((base + 0x9E3779B97F4A7C15 * (j + 2)) & _MASK64) % half) + 1 for j in range(size)]


_PRIMES: dict[int, list[int]] = {}
"""_primes_after's primes found so far, by start: every n-gram layer's tables extend the same list."""


def _primes_after(start: int, count: int) -> list[int]:
    """The first `count` primes greater than start, by trial division (a few hundred near 2·10⁷ for a model with
    many n-gram layers), those found before reused."""
    found = _PRIMES.setdefault(start, [])
    n = found[-1] if found else start
    while len(found) < count:
        n += 1
        if n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1)):
            found.append(n)
    return found[:count]


def ngram_table_sizes(cfg: ModelConfig, index: int) -> list[int]:
    """The rows of each of the index-th n-gram layer's (ngram_size - 1)·ngram_heads tables: that layer's tables are
    the k-th primes after ngram_vocab_base - 1 for k counted over every layer's tables (Qwen4-Exp's heads)."""
    heads = (cfg.ngram_size - 1) * cfg.ngram_heads
    return _primes_after(cfg.ngram_vocab_base - 1, (index + 1) * heads)[index * heads:]


class NGramEmbedding(nn.Module):
    """One layer's per-layer n-gram embedding (model.ngram_layers; transformers' Qwen4ExpTextNGramEmbedding and
    Qwen4ExpTextPLELayer): each token's last ngram_size ids (GPT.ngram_windows) hashed into the layer's tables, the
    rows concatenated to e (B, T, ngram_dim), which gates a value into each stream; a causal depthwise convolution,
    its taps ngram_size tokens apart, of the normed gated values adds local context. `forward` returns the streams'
    addition (B, T, N, C)."""

    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        N, C, E = cfg.hc_streams, cfg.n_embd, cfg.ngram_dim
        self.size, self.heads, self.eos = cfg.ngram_size, cfg.ngram_heads, cfg.ngram_eos
        self.kernel, self.dilation, self.eps = cfg.ngram_conv_kernel, cfg.ngram_size, cfg.norm_eps
        sizes = ngram_table_sizes(cfg, index)
        rows = -(-sum(sizes) // cfg.ngram_vocab_multiple) * cfg.ngram_vocab_multiple
        self.table = nn.Embedding(rows, E // len(sizes))
        # the hash's constants (multipliers, sizes, offsets), derived from the config alone: not trained and not
        # stored (the export writes them back), set again wherever the module lands (GPT._apply)
        self.constants = (ngram_multipliers(cfg.vocab_size, cfg.ngram_size, index, cfg.ngram_seed), sizes,
                          [sum(sizes[:k]) for k in range(len(sizes))])
        for name in ("multipliers", "sizes", "offsets"):
            self.register_buffer(name, None, persistent=False)
        self.derive_constants()
        self.key = nn.Linear(E, N * C, bias=False)
        self.value = nn.Linear(E, C, bias=False)
        # RMSNorms of each stream by 1 + weight (N, C): on the keys, the streams (queries) and the gated values
        self.key_norm, self.query_norm, self.conv_norm = (nn.Parameter(torch.zeros(N, C)) for _ in range(3))
        self.conv = nn.Parameter(torch.zeros(N * C, cfg.ngram_conv_kernel))  # oldest tap first; zero at init
        self.span = (self.kernel - 1) * self.dilation  # the convolution's reach back, in tokens

    def derive_constants(self) -> None:
        """The hash's constants as int64 buffers on the table's device (none while it is on the meta device)."""
        device = self.table.weight.device
        for name, values in zip(("multipliers", "sizes", "offsets"), self.constants):
            setattr(self, name, None if device.type == "meta" else torch.tensor(values, device=device))

    def ids(self, windows: torch.Tensor) -> torch.Tensor:
        """windows (B, T, ngram_size) long, each token's ids oldest first (itself last) -> its rows in the table
        (B, T, tables). A token s back reads as eos where any of the s tokens before the current one is eos (each
        n-gram stays within its document); the n-gram of length n mixes the n newest, newest first, by XOR of id ×
        multiplier, as transformers' Qwen4ExpTextNGramEmbedding.forward computes it."""
        n = self.size
        eos = torch.full_like(windows[..., :1], self.eos)
        # broken[..., j]: an eos among the window's tokens j .. n - 2 (those between token j and the current one)
        broken = (windows[..., :-1] == self.eos).flip(-1).cummax(-1).values.flip(-1)
        back = torch.where(broken, eos, windows[..., :-1])  # (B, T, n - 1)
        tokens = [windows[..., -1], *back.unbind(-1)[::-1]]  # newest first
        out, mixed = [], tokens[0] * self.multipliers[0]
        for length in range(2, n + 1):
            mixed = torch.bitwise_xor(mixed, tokens[length - 1] * self.multipliers[length - 1])
            part = slice((length - 2) * self.heads, (length - 1) * self.heads)
            out.append(torch.remainder(mixed[..., None], self.sizes[part]) + self.offsets[part])
        return torch.cat(out, dim=-1)

    def forward(self, xs: torch.Tensor, windows: torch.Tensor, cache=None,
                doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """xs (B, T, N, C), the streams; windows: ids' (B, T, ngram_size) -> (B, T, N, C). cache: an inference
        engine's cache layer, whose `ngram_before` keeps the convolution's inputs (redline/inference/cache.py).
        doc_ids (B, T): packed documents, each read as a sequence of its own (the tokens before its first as eos,
        the convolution's inputs before it as zeros)."""
        B, T, N, C = xs.shape
        if doc_ids is not None:  # another document's tokens in a window read as eos
            docs = F.pad(doc_ids, (self.size - 1, 0), value=-1).unfold(1, self.size, 1)  # (B, T, ngram_size)
            windows = torch.where(docs == doc_ids[..., None], windows, self.eos)
        e = self.table(self.ids(windows)).flatten(-2)  # (B, T, ngram_dim)
        key = _stream_norm(self.key(e).view(B, T, N, C), self.key_norm, self.eps)
        query = _stream_norm(xs, self.query_norm, self.eps)
        gate = (key * query).sum(-1, keepdim=True) / math.sqrt(C)  # (B, T, N, 1)
        gate = gate.abs().clamp_min(1e-6).sqrt() * gate.sign()
        gated = torch.sigmoid(gate) * self.value(e).unsqueeze(2)  # (B, T, N, C)
        u = _stream_norm(gated, self.conv_norm, self.eps).reshape(B, T, N * C)
        before = None if cache is None else cache.ngram_before(self, u)  # (B, span, N·C) or None: zeros
        full = torch.cat([before.to(u.dtype) if before is not None else u.new_zeros(B, self.span, N * C), u], 1)
        y = u * self.conv[:, -1]
        for j in range(self.kernel - 1):  # tap j reads the token (kernel - 1 - j)·dilation back
            term = full[:, j * self.dilation:j * self.dilation + T]
            if doc_ids is not None:
                back = (self.kernel - 1 - j) * self.dilation
                term = term * (doc_ids == F.pad(doc_ids, (back, 0), value=-1)[:, :T])[..., None]
            y = y + term * self.conv[:, j]
        return gated + F.silu(y).view(B, T, N, C)


def _stream_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each stream of x (..., N, C) by 1 + weight (N, C), in fp32 (Qwen4ExpTextRMSNorm's, grouped)."""
    return (F.rms_norm(x.float(), (x.shape[-1],), eps=eps) * (1.0 + weight.float())).type_as(x)


# model.ngpt's interpolation rates at init (Dory's ngpt_alpha_init)
NGPT_RATE_INIT = 0.05


class LoopPass(nn.Module):
    """A later pass of model.loop_section's layer: the first pass's block run again. It holds that block outside the
    module tree (a list, not a submodule), so the weights are stored, trained and exported once; everything the
    engine reads of a block (window, conv, attn, ...) it reads from the block it repeats."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.repeats = [block]

    @property
    def block(self) -> nn.Module:
        return self.repeats[0]

    def forward(self, *args, **kwargs):
        return self.block(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            repeats = self.__dict__.get("repeats")
            if not repeats:  # not built yet (a copy being made)
                raise
            return getattr(repeats[0], name)


class ResidualAffine(nn.Module):
    """model.residual_affine: a sublayer's output h joining the stream x, (x + x_bias)·x_scale + (h + h_bias)·h_scale,
    each (C,), as transformers' ZayaResidualScaling; the plain sum at init."""

    def __init__(self, dim: int):
        super().__init__()
        self.h_scale, self.h_bias = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))
        self.x_scale, self.x_bias = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))

    def reset_parameters(self) -> None:
        for scale, bias in ((self.h_scale, self.h_bias), (self.x_scale, self.x_bias)):
            nn.init.ones_(scale)
            nn.init.zeros_(bias)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return (x + self.x_bias) * self.x_scale + (h + self.h_bias) * self.h_scale


class Block(nn.Module):
    """norm1 and norm2: the norms on the attention's and the MLP's input (pre, sandwich) or on the residual sums after
    them (post); attn_out_norm and mlp_out_norm: those on the sublayers' outputs (output, sandwich; else None)."""

    def __init__(self, cfg: ModelConfig, value_embedding: bool = False, layer: int = 0):
        super().__init__()
        position = cfg.layer_norm_position(layer)
        self.position = position
        self.parallel = cfg.parallel_residual
        inputs, outputs = position != "output", position in ("output", "sandwich")
        # a block of one sublayer (model.mixer_free_layers, mlp_free_layers: Mamba-2's, Nemotron-H's) has only its
        # norm (pre-norm blocks alone) and its attn or mlp None
        mixer, mlp = layer not in cfg.mixer_free_layers, layer not in cfg.mlp_free_layers
        normed = rescaled_norms(cfg, layer)  # model.rescale_every: this block's norms' epsilon
        self.norm1 = (make_norm(normed, cfg.n_embd) if inputs else nn.Identity()) if mixer else None
        if cfg.first_norm_free and layer == 0:  # ModernBERT's: the normed embeddings go straight into attention
            self.norm1 = nn.Identity()
        # parallel_shared_norm: the MLP reads norm1's output too (Phi's one norm a block)
        self.norm2 = (None if cfg.parallel_shared_norm or not mlp
                      else make_norm(normed, cfg.n_embd) if inputs else nn.Identity())
        if cfg.norm_gate_rank:  # A.X-K2's gated norms: norm1 everywhere, norm2 before experts
            gated = lambda: GatedRMSNorm(cfg.n_embd, cfg.norm_eps, cfg.norm_gate_rank)  # noqa: E731
            self.norm1 = gated() if mixer else None
            if mlp and cfg.layer_has_experts(layer):
                self.norm2 = gated()
        # the token mixer: attention, a short convolution on model.conv_layers (LFM2's) or a gated delta net on
        # model.delta_layers (Qwen3.5's); conv: not attention, handed the batch's doc_ids instead of a mask
        # delta_parallel (Falcon-H1's): attention in attn and the Mamba-2 mixer beside it in mamba, both on norm1's
        # output; else mamba is None
        parallel = layer in cfg.parallel_delta_layers
        self.conv = layer in cfg.conv_layers or (layer in cfg.delta_layers and not parallel) or not mixer
        # Zamba's (v1) hybrid layers call Mamba-1 mixers
        self.mamba = (Mamba1 if cfg.delta_rule == "mamba1" else Mamba2)(cfg, layer) if parallel else None
        if not mixer:
            self.attn = None
        elif layer in cfg.delta_layers and not parallel:
            mixers = {"mamba2": Mamba2, "mamba1": Mamba1, "rglru": RGLRU, "lightning": Lightning, "rwkv": RWKVTimeMix,
                      "mlstm": MLSTM}
            self.attn = mixers.get(cfg.delta_rule, GatedDeltaNet)(cfg, layer)
        elif layer in cfg.shared_attn_layers:  # Zamba2's: a shared block's call before the mixer in mamba
            self.attn = SharedBlockCall(cfg, layer)
        else:
            attention = (LatentAttention if cfg.kv_lora_rank else SharedKVAttention if cfg.shared_kv_attention
                         else CCAAttention if cfg.cca_kernels else DiffAttention if cfg.diff_attention
                         else KeyBiasAttention if cfg.attn_key_bias
                         else RelBiasAttention if cfg.rel_bias_dim else Attention)
            self.attn = ShortConv(cfg, layer) if self.conv else attention(cfg, value_embedding, layer)
        self.window = self.attn.window if mixer else 0  # the key of the attention mask its mixer reads
        if not mlp:
            self.mlp = None
        elif cfg.mlp == "rwkv":  # RWKV-4's channel mixing: its token shift reads the layer's cache
            self.mlp = RWKVChannelMix(cfg)
        elif cfg.moe_router_hidden:  # ZAYA's: routed by an MLP over a state carried from layer to layer
            self.mlp = StateRoutedMoE(cfg, layer)
        elif cfg.layer_has_experts(layer) and not (cfg.moe_beside_dense or cfg.moe_shortcut):
            self.mlp = MoE(cfg, hashed=layer in cfg.moe_hash_layers, layer=layer)
        elif cfg.kv_shared_mlp_hidden and cfg.kv_source(layer) is not None:  # Gemma 4's double-wide MLP
            self.mlp = MLP(replace(cfg, mlp_hidden=cfg.kv_shared_mlp_hidden),
                           act_limit=cfg.swiglu_act_limits[layer] if cfg.swiglu_act_limits else 0.0)
        else:  # a dense MLP, moe_dense_hidden wide beside a mixture's experts (first moe_dense_layers, off moe_layers)
            self.mlp = MLP(replace(cfg, mlp_hidden=cfg.moe_dense_hidden) if cfg.moe_dense_hidden else cfg,
                           cfg.mlp_sparsity[layer] if cfg.mlp_sparsity else 0.0,
                           cfg.swiglu_act_limits[layer] if cfg.swiglu_act_limits else 0.0)
        # per_layer_embd (Gemma 4's per-layer inputs): after the MLP, x + norm(ple_proj(gelu(ple_gate(x)) · input))
        self.ple_gate = self.ple_proj = self.ple_norm = None
        if cfg.per_layer_embd:
            self.ple_gate = nn.Linear(cfg.n_embd, cfg.per_layer_embd, bias=False)
            self.ple_proj = nn.Linear(cfg.per_layer_embd, cfg.n_embd, bias=False)
            self.ple_norm = make_norm(cfg, cfg.n_embd)
        self.gelu = cfg.gelu_approximate
        # layer_scalars: (1,) the block's output scale, a buffer (stored with the weights, not trained)
        if cfg.layer_scalars:
            self.register_buffer("layer_scalar", torch.ones(1))
        else:
            self.layer_scalar = None
        self.attn_out_norm = make_norm(cfg, cfg.n_embd) if outputs else None
        self.mlp_out_norm = make_norm(cfg, cfg.n_embd) if outputs else None
        # moe_beside_dense (Gemma 4's MoE block): the experts beside the dense MLP, each output normed before the sum
        self.moe = self.dense_out_norm = self.moe_out_norm = None
        if cfg.moe_beside_dense and mlp:
            self.moe = MoE(cfg, layer=layer)
            self.dense_out_norm, self.moe_out_norm = make_norm(cfg, cfg.n_embd), make_norm(cfg, cfg.n_embd)
        # moe_shortcut (LongCat-Flash's): the even blocks' experts beside the MLP, their output carried to the next
        self.shortcut = cfg.moe_shortcut
        if cfg.moe_shortcut and cfg.layer_has_experts(layer):
            self.moe = MoE(cfg, layer=layer)
        self.drop = nn.Dropout(cfg.dropout)
        self.residual_multiplier = cfg.residual_multiplier  # 0: the sublayers' outputs join the stream as they are
        # altup_streams (Gemma 3n's AltUp, N streams): the router (N, C) reading RMSNorm(x) / C, the prediction
        # coefficients (N·N, N) and correction coefficients (N, N) it drives, the first corrected stream's scale (C,)
        self.altup_router = self.altup_router_norm = self.altup_predict = self.altup_correct = None
        self.altup_scale = None
        self.altup_clip = cfg.altup_coef_clip
        if cfg.altup_streams:
            N = cfg.altup_streams
            self.altup_router = nn.Linear(cfg.n_embd, N, bias=False)
            self.altup_router_norm = make_norm(cfg, cfg.n_embd)
            self.altup_predict = nn.Linear(N, N * N, bias=False)
            self.altup_correct = nn.Linear(N, N, bias=False)
            self.altup_scale = nn.Parameter(torch.zeros(cfg.n_embd)) if cfg.altup_correct_scale else None
        # laurel_rank (Gemma 3n's LAuReL): a (C -> r -> C) branch beside attention, normed
        self.laurel_left = self.laurel_right = self.laurel_norm = None
        if cfg.laurel_rank:
            self.laurel_left = nn.Linear(cfg.n_embd, cfg.laurel_rank, bias=False)
            self.laurel_right = nn.Linear(cfg.laurel_rank, cfg.n_embd, bias=False)
            self.laurel_norm = make_norm(cfg, cfg.n_embd)
        # residual_scales (Doge's): (C,) each, the stream's scale before the attention's and the MLP's outputs join it
        self.attn_residual = nn.Parameter(torch.ones(cfg.n_embd)) if cfg.residual_scales else None
        # normed_residual (MiniMax's): (α, β) of this block's mixer and of its MLP, x ← α·norm(x) + β·f(norm(x))
        self.normed_scales = None
        if cfg.normed_residual:
            mixer_scales = cfg.normed_residual[2:4] if layer in cfg.delta_layers else cfg.normed_residual[:2]
            self.normed_scales = (*mixer_scales, *cfg.normed_residual[4:])
        self.mlp_residual = nn.Parameter(torch.ones(cfg.n_embd)) if cfg.residual_scales else None
        # residual_affine (ZAYA's): each sublayer's output and the stream it joins shifted and scaled per channel
        self.attn_affine = ResidualAffine(cfg.n_embd) if cfg.residual_affine else None
        self.mlp_affine = ResidualAffine(cfg.n_embd) if cfg.residual_affine else None
        self.router_width = cfg.moe_router_hidden  # R: the router state carried in the stream's last R channels
        # mhc_streams (DeepSeek-V4's hyper-connections): one for each sublayer, taking the N streams to its input
        self.attn_mhc = ManifoldHyperConnection(cfg) if cfg.mhc_streams else None
        self.mlp_mhc = ManifoldHyperConnection(cfg) if cfg.mhc_streams else None
        # hc_streams (Qwen4-Exp's hyper-connections): each sublayer's mixer, in place of norm1 and norm2
        self.attn_hc = self.mlp_hc = None
        if cfg.hc_streams:
            self.norm1, self.norm2 = nn.Identity(), nn.Identity()
            self.attn_hc, self.mlp_hc = HyperConnection(cfg), HyperConnection(cfg)
        # ngram_layers (Qwen4-Exp's Per-Layer Embeddings): the layer's n-gram embedding, added to the streams first
        self.ngram = NGramEmbedding(cfg, cfg.ngram_layers.index(layer)) if layer in cfg.ngram_layers else None
        # model.ngpt: each sublayer's interpolation rate (C,), used as |rate| (Dory's lambda_1, lambda_2 times their
        # scale; nGPT's alpha_A, alpha_M)
        self.attn_rate = nn.Parameter(torch.full((cfg.n_embd,), NGPT_RATE_INIT)) if cfg.ngpt else None
        self.mlp_rate = nn.Parameter(torch.full((cfg.n_embd,), NGPT_RATE_INIT)) if cfg.ngpt else None
        # model.loop_section: a block of the looped section reads (B, T, 2, C), the stream and the anchor each pass
        # restarts from (GPT.stream_in), and carries the anchor along
        first, count = cfg.loop_section or (0, 0)
        self.anchored = first <= layer < first + count

    def out(self, h: torch.Tensor) -> torch.Tensor:
        """A sublayer's output as it joins the residual stream: dropped out, scaled by residual_multiplier."""
        h = self.drop(h)
        return h * self.residual_multiplier if self.residual_multiplier else h

    def forward(self, x, rope, attn_mask=None, cache=None, ve=None, doc_ids=None, ple=None, shared=None):
        """x: (B, T, C) -> (B, T, C); attn_mask, cache, ve and shared as Attention.forward; doc_ids (B, T) or None: the
        packed documents, which a Mamba-2 mixer beside attention (mamba) keeps apart as attn_mask does attention's;
        ple: this layer's per-layer input (B, T, per_layer_embd) (model.per_layer_embd), the token embeddings x0
        (B, T, C) of a layer that calls a shared block (model.shared_attn_layers), or None.
        With model.altup_streams, x is the N streams (B, T, N, C) in and out (altup_forward); with model.mhc_streams
        too (mhc_forward)."""
        if self.altup_router is not None:
            return self.altup_forward(x, rope, attn_mask, cache, ve, ple, shared)
        if self.attn_mhc is not None:
            return self.mhc_forward(x, rope, attn_mask, cache, ve, shared, ple)
        if self.attn_hc is not None:
            return self.hyper_forward(x, rope, attn_mask, cache, ve, ple, doc_ids)
        if self.shortcut:
            return self.shortcut_forward(x, rope, attn_mask, cache, ve)
        if self.attn_affine is not None or self.router_width:
            return self.zaya_forward(x, rope, attn_mask, cache, ve)
        if self.anchored:  # (B, T, 2, C): the stream and its pass's anchor, carried along unchanged
            x, anchor = x.unbind(dim=2)
            return torch.stack([self._forward(x, rope, attn_mask, cache, ve, doc_ids, shared), anchor], dim=2)
        if isinstance(self.attn, SharedBlockCall):  # Zamba2's: ple is x0, the token embeddings (B, T, C)
            t = self.attn(x, rope, attn_mask, cache, ple)
            return x + self.out(self.mamba(self.norm1(x + t), None, doc_ids, cache))
        x = self._forward(x, rope, attn_mask, cache, ve, doc_ids, shared, ple)
        if self.ple_gate is not None:  # as transformers' Gemma4TextDecoderLayer adds its per-layer input
            x = x + self.per_layer_term(x, ple)
        return x if self.layer_scalar is None else x * self.layer_scalar

    def shortcut_forward(self, xs, rope, attn_mask, cache, ve):
        """One half of LongCat-Flash's decoder layer (transformers' LongcatFlashDecoderLayer; model.moe_shortcut):
        xs (B, T, 2, C), the stream and the shortcut output waiting to join it -> (B, T, 2, C). Attention, then the
        dense MLP, each on its pre-norm; the even block's experts read the MLP's input too and their output waits,
        the odd block adds the waiting output after its MLP's (then nothing waits)."""
        x, waiting = xs.unbind(dim=2)
        x = x + self.out(self.attn(self.norm1(x), rope, attn_mask, cache, ve))
        u = self.norm2(x)
        x = x + self.out(self.mlp(u))
        if self.moe is not None:
            return torch.stack([x, self.out(self.moe(u))], dim=2)
        return torch.stack([x + waiting, torch.zeros_like(x)], dim=2)

    def zaya_forward(self, xs, rope, attn_mask, cache, ve):
        """ZAYA's decoder layer (transformers' ZayaDecoderLayer): pre-norm attention then MLP, each output joining
        the stream through its ResidualAffine (model.residual_affine). With model.moe_router_hidden, xs is
        (B, T, C + R): the stream and the router state the layer before left (zeros into the first), which this
        layer's router reads and replaces."""
        x, state = (xs[..., :-self.router_width], xs[..., -self.router_width:]) if self.router_width else (xs, None)
        h = self.out(self.attn(self.norm1(x), rope, attn_mask, cache, ve))
        x = x + h if self.attn_affine is None else self.attn_affine(x, h)
        if state is None:
            h = self.mlp(self.norm2(x))
        else:
            h, state = self.mlp(self.norm2(x), state)
        h = self.out(h)
        x = x + h if self.mlp_affine is None else self.mlp_affine(x, h)
        return x if state is None else torch.cat([x, state.to(x.dtype)], dim=-1)

    def per_layer_term(self, x: torch.Tensor, ple: torch.Tensor) -> torch.Tensor:
        """What the per-layer input adds to the stream x (B, T, C): norm(proj(gelu(gate(x)) · ple))."""
        return self.ple_norm(self.ple_proj(F.gelu(self.ple_gate(x), approximate=self.gelu) * ple))

    def altup_modalities(self, x: torch.Tensor) -> torch.Tensor:
        """The AltUp router's (B, T, N) weights of a stream (B, T, C): tanh(router(norm(x) / C)), the tanh in fp32."""
        routed = self.altup_router(self.altup_router_norm(x) * x.shape[-1] ** -1.0)
        return torch.tanh(routed.float()).type_as(x)

    def altup_coefs(self, layer: nn.Linear, modalities: torch.Tensor) -> torch.Tensor:
        """A coefficient layer (altup_predict or altup_correct) applied to the router's weights (B, T, N), its weight
        clamped to ± model.altup_coef_clip in training as transformers' Gemma3nTextAltUp clamps it: the prediction
        weights in place (their stored values), the correction ones in the forward. A LoRA-wrapped layer runs as it
        is (its base weight frozen)."""
        if not (self.training and self.altup_clip) or type(layer) is not nn.Linear:
            return layer(modalities)
        if layer is self.altup_predict:
            with torch.no_grad():
                layer.weight.clamp_(-self.altup_clip, self.altup_clip)
            return layer(modalities)
        return F.linear(modalities, layer.weight.clamp(-self.altup_clip, self.altup_clip))

    def altup_forward(self, xs, rope, attn_mask, cache, ve, ple, shared):
        """Gemma 3n's decoder layer (transformers' Gemma3nTextDecoderLayer): xs (B, T, N, C), the N AltUp streams ->
        the corrected streams (B, T, N, C).
        Predict: each stream p becomes xs_p + Σ_q a_pq · xs_q, a (B, T, N, N) routed by stream 0. The sublayers run on
        the first prediction y: attention (and the LAuReL branch beside it, the sum over sqrt(2)) then the MLP, each
        output normed. Correct: every prediction adds (1 + c_p) times the change y' - y, c (B, T, N) routed by y'.
        Last, the per-layer input's term, read from the (scaled) first corrected stream, joins streams 1..N-1."""
        B, T, N, C = xs.shape
        a = self.altup_coefs(self.altup_predict, self.altup_modalities(xs[:, :, 0])).view(B, T, N, N)
        predictions = (torch.matmul(a, xs) + xs).type_as(xs)  # (B, T, N, C)
        y = predictions[:, :, 0]
        u = self.norm1(y)
        kw = {} if shared is None else {"shared": shared}
        h = y + self.out(self.attn_out_norm(self.attn(u, rope, attn_mask, cache, ve, **kw)))
        if self.laurel_left is not None:
            h = (h + (u + self.laurel_norm(self.laurel_right(self.laurel_left(u))))) / math.sqrt(2)
        h = h + self.out(self.mlp_out_norm(self.mlp(self.norm2(h))))
        c = self.altup_coefs(self.altup_correct, self.altup_modalities(h)) + 1.0  # (B, T, N)
        corrected = (predictions + c.unsqueeze(-1) * (h - y).unsqueeze(2)).type_as(h)
        if self.ple_gate is None:
            return corrected
        first = corrected[:, :, 0]
        if self.altup_scale is not None:
            first = (first.type_as(self.altup_scale) * self.altup_scale).type_as(first)
        return torch.cat([corrected[:, :, :1], corrected[:, :, 1:] + self.per_layer_term(first, ple).unsqueeze(2)],
                         dim=2)

    def mhc_forward(self, xs, rope, attn_mask, cache, ve, shared, ids=None):
        """DeepSeek-V4's decoder layer around redline's sublayers (transformers' DeepseekV4DecoderLayer): xs
        (B, T, N, C), the N streams -> the streams after each sublayer read its hyper-connection's sum of them
        (normed) and its output joined their mix (ManifoldHyperConnection.merge). ids: the tokens' ids (B, T, 1)
        where the experts route by them (model.moe_hash_layers), else None."""
        kw = {} if shared is None else {"shared": shared}
        u, post, comb = self.attn_mhc(xs)
        xs = self.attn_mhc.merge(xs, self.out(self.attn(self.norm1(u), rope, attn_mask, cache, ve, **kw)), post, comb)
        u, post, comb = self.mlp_mhc(xs)
        return self.mlp_mhc.merge(xs, self.out(self.mlp_of(self.norm2(u), ids)), post, comb)

    def mlp_of(self, u: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
        """The MLP's output for its input u; a hash-routed mixture (model.moe_hash_layers) is handed the tokens' ids
        (B, T, 1), GPT.per_layer_inputs' for these layers."""
        if isinstance(self.mlp, MoE) and self.mlp.tid2eid is not None:
            return self.mlp(u, ids)
        return self.mlp(u)

    def hyper_forward(self, xs, rope, attn_mask, cache, ve, windows=None, doc_ids=None):
        """Qwen4-Exp's decoder layer (transformers' Qwen4ExpTextDecoderLayer): xs (B, T, N, C), the N streams ->
        (B, T, N, C). A layer of model.ngram_layers first adds its n-gram embedding of windows (B, T, ngram_size),
        GPT.ngram_windows', keeping packed documents (doc_ids (B, T)) apart. Each sublayer reads its mixer's average
        of the streams and its output joins every stream n scaled by the mixer's weight w_n."""
        if self.ngram is not None:
            xs = xs + self.ngram(xs, windows, cache, doc_ids)
        u, w = self.attn_hc(xs)
        xs = xs + w.unsqueeze(-1) * self.out(self.attn(u, rope, attn_mask, cache, ve)).unsqueeze(2)
        u, w = self.mlp_hc(xs)
        return xs + w.unsqueeze(-1) * self.out(self.mlp(u)).unsqueeze(2)

    def _forward(self, x, rope, attn_mask, cache, ve, doc_ids, shared, ids=None):
        kw = {} if shared is None else {"shared": shared}  # an attention layer's alone
        if getattr(self.attn, "k_conv", None) is not None:  # model.kv_conv: its convolutions keep documents apart
            kw["doc_ids"] = doc_ids
        if self.attn_rate is not None:  # nGPT's: each normed output interpolated toward, as DoryDecoderLayer does
            u = self.norm1(x)
            h = self.attn_out_norm(self.out(self.attn(u, rope, attn_mask, cache, ve, **kw)))
            x = u + self.attn_rate.abs().to(u.dtype) * (h - u)
            u = self.norm2(x)
            h = self.mlp_out_norm(self.out(self.mlp(u)))
            return u + self.mlp_rate.abs().to(u.dtype) * (h - u)
        if self.position == "post":
            x = self.norm1(x + self.out(self.attn(x, rope, attn_mask, cache, ve, **kw)))
            return self.norm2(x + self.out(self.mlp(x)))
        if self.parallel:  # both sublayers read x (GPT-NeoX, Phi): x + attn(norm1(x)) + mlp(norm2(x) or norm1(x))
            u = self.norm1(x)
            h = self.out(self.attn(u, rope, attn_mask, cache, ve, **kw))
            return x + h + self.out(self.mlp(u if self.norm2 is None else self.norm2(x)))
        if self.normed_scales is not None:  # MiniMax's: the normed input is the stream each output joins
            a1, b1, a2, b2 = self.normed_scales
            u = self.norm1(x)
            u = a1 * u + b1 * self.out(self.attn(u, rope, attn_mask, cache, ve, **kw))
            u = self.norm2(u)
            return a2 * u + b2 * self.out(self.mlp(u))
        if self.attn is not None:
            u = self.norm1(x)
            h = self.attn(u, rope, attn_mask, cache, ve, **kw)
            if self.mamba is not None:  # Falcon-H1's: the mixer reads the same input and its output joins attention's
                h = h + self.mamba(u, None, doc_ids, cache)
            if self.attn_out_norm is not None:
                h = self.attn_out_norm(h)
            x = (x if self.attn_residual is None else self.attn_residual * x) + self.out(h)
        if self.mlp is None:
            return x
        if isinstance(self.mlp, RWKVChannelMix):  # its token shift: the cache's predecessors, the documents' starts
            h = self.mlp(self.norm2(x), cache, doc_ids)
        else:
            h = self.mlp_of(self.norm2(x), ids)
        if self.moe is not None:  # the experts read the stream itself (their norms inside), as transformers' Gemma 4
            h = self.dense_out_norm(h) + self.moe_out_norm(self.moe(x))
        if self.mlp_out_norm is not None:
            h = self.mlp_out_norm(h)
        return (x if self.mlp_residual is None else self.mlp_residual * x) + self.out(h)


class HeadTransform(nn.Module):
    """model.head_transform: x (..., C) -> norm(gelu(dense(x))) (..., C), before the output head, as transformers'
    ModernBertDecoderPredictionHead computes it."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.norm = make_norm(cfg, cfg.n_embd)
        self.gelu = cfg.gelu_approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.dense(x), approximate=self.gelu))


def check_targets(targets: torch.Tensor, head: int) -> None:
    """A UserError where a target (other than -1, ignored) is a token the head does not have (model.head_vocab):
    cross_entropy would fail on it with an index error, or a device assert on a GPU. Reads targets.max() (a sync),
    so a compiled forward leaves it out: there such a target is the device assert."""
    top = int(targets.max()) if targets.numel() else -1
    if top >= head:
        raise UserError(f"a target token id {top} is past the model's head, which predicts ids [0, {head}) "
                        f"(model.head_vocab): mask such targets (e.g. image or audio codes) with -1")


def logprobs_of(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """logits (..., V), token ids (...) -> their log-probabilities (...) fp32; -inf for an id past the head
    (model.head_vocab: an image or audio code the model takes as input and never predicts)."""
    V = logits.shape[-1]
    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids.clamp(max=V - 1)[..., None])[..., 0]
    return lp.masked_fill(ids >= V, float("-inf"))


def head_output(logits: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """The head's raw product (..., padded_head) -> the model's logits: divided by logit_divisor, then soft-capped
    when logit_softcap is set (then in fp32)."""
    if cfg.logit_divisor:
        logits = logits / cfg.logit_divisor
    cap = cfg.logit_softcap
    return cap * torch.tanh(logits.float() / cap) if cap else logits


# ----------------------------------------------------------------------------------------------------
# the model


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.context_len, cfg.n_embd) if cfg.pos_emb == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.embed_norm = make_norm(cfg, cfg.n_embd) if cfg.embed_norm else None
        blocks = []  # a later pass of model.loop_section runs its first pass's block again (LoopPass)
        for i in range(cfg.n_layer):
            source = cfg.loop_source(i)
            blocks.append(Block(cfg, self.value_table(i) is not None, i) if source == i else LoopPass(blocks[source]))
        self.blocks = nn.ModuleList(blocks)
        # shared_attn_layers (Zamba2's): the shared blocks, stored once; the j-th such layer calls block j % count
        self.shared_blocks = None
        if cfg.shared_attn_layers:
            self.shared_blocks = nn.ModuleList(SharedBlock(cfg) for _ in range(cfg.shared_attn_blocks))
            for j, i in enumerate(cfg.shared_attn_layers):
                self.blocks[i].attn.bind(self.shared_blocks[j % cfg.shared_attn_blocks])
        # value embeddings: (padded_vocab, KV*D) tables, outside the blocks (AdamW takes them, as the embeddings)
        self.value_embeds = nn.ModuleList(nn.Embedding(cfg.padded_vocab, cfg.kv_heads * cfg.head_dim)
                                          for _ in range(cfg.value_tables))
        # nanochat's scalars (reset_parameters sets them): smear (smear_gate (1, g), smear_lambda (1,)), per-layer
        # resid_lambdas and x0_lambdas (L,), backout_lambda (1,); None where the config has them off
        self.smear_gate = nn.Linear(cfg.smear_gate, 1, bias=False) if cfg.smear_gate else None
        self.smear_lambda = nn.Parameter(torch.zeros(1)) if cfg.smear_gate else None
        self.resid_lambdas = nn.Parameter(torch.ones(cfg.n_layer)) if cfg.layer_lambdas else None
        self.x0_lambdas = nn.Parameter(torch.zeros(cfg.n_layer)) if cfg.layer_lambdas else None
        self.backout_lambda = nn.Parameter(torch.zeros(1)) if cfg.backout else None
        # residual_affine (ZAYA's): the embeddings shifted and scaled per channel, (e + embed_bias)·embed_gain, each
        # (C,)
        self.embed_bias = nn.Parameter(torch.zeros(cfg.n_embd)) if cfg.residual_affine else None
        self.embed_gain = nn.Parameter(torch.ones(cfg.n_embd)) if cfg.residual_affine else None
        # per_layer_embd (Gemma 4's per-layer inputs): a (rows, n_layer·P) token table and the (n_layer·P, C)
        # projection of the embeddings, normed per layer by ple_norm (P,); per_layer_inputs combines them
        self.ple_table = self.ple_proj = self.ple_norm = None
        if cfg.per_layer_embd:
            width = cfg.n_layer * cfg.per_layer_embd
            self.ple_table = nn.Embedding(cfg.per_layer_vocab or cfg.vocab_size, width)
            self.ple_proj = nn.Linear(cfg.n_embd, width, bias=False)
            self.ple_norm = make_norm(cfg, cfg.per_layer_embd)
        # mhc_streams (DeepSeek-V4's hyper-connections): the embeddings copied into every stream, the head summing them
        self.mhc_head = (MeanHyperHead() if cfg.mhc_head_mean else ManifoldHyperHead(cfg)) if cfg.mhc_streams else None
        # altup_streams (Gemma 3n's AltUp): N - 1 (C, C) projections of the embeddings into the further streams and
        # N - 1 back out of them (stream_in, stream_out)
        self.altup_in = self.altup_out = None
        if cfg.altup_streams:
            self.altup_in = nn.ModuleList(nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
                                          for _ in range(cfg.altup_streams - 1))
            self.altup_out = nn.ModuleList(nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
                                           for _ in range(cfg.altup_streams - 1))
        # post-norm blocks end in a norm already; the others need a final one
        self.norm_f = make_norm(rescaled_norms(cfg, cfg.n_layer), cfg.n_embd) if cfg.norm_position != "post" \
            else nn.Identity()
        # hc_streams: the last mixer collapses the streams (its per-stream norms in place of norm_f)
        self.hc_out = None
        if cfg.hc_streams:
            self.norm_f, self.hc_out = nn.Identity(), HyperConnection(cfg, inject=False)
        if cfg.bitlinear != "off" or cfg.sub_norms:
            bitnet_projections(self.blocks, cfg)
        self.head_transform = HeadTransform(cfg) if cfg.head_transform else None
        self.lm_head = nn.Linear(cfg.n_embd, cfg.padded_head, bias=cfg.head_bias)  # (padded_head, C)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        if cfg.pos_emb == "rope":
            for name, table in zip(self._rope_names(), self._rope_tables()):
                self.register_buffer(name, table, persistent=False)
        self.reset_parameters()

    def _rope_names(self) -> tuple[str, ...]:
        """rope_cos and rope_sin, then rope_cos_1, rope_sin_1, ... for each further table of cfg.rope_bases; last,
        with cfg.nope_temperature, the layers without RoPE's query scales (nope_temperature_table), or with
        cfg.q_position_scale ln(p + 1) (log_positions), which embed indexes by position as it does the RoPE tables
        (validate takes one of them at most)."""
        names = tuple(f"rope_{kind}{f'_{i}' if i else ''}" for i in range(max(1, len(self.cfg.rope_bases)))
                      for kind in ("cos", "sin"))
        return (names + (("nope_temperature",) if self.cfg.nope_temperature else ())
                + (("log_positions",) if self.cfg.q_position_scale else ()))

    def _rope_tables(self) -> tuple[torch.Tensor, ...]:
        """The fp32 RoPE tables, (cos, sin) for each of cfg.rope_bases (a model whose every layer is NoPE keeps
        one table, unread)."""
        tables = ()
        for theta, scaled in self.cfg.rope_bases or [(self.cfg.rope_theta, True)]:
            # rope_theta's table serves the full-attention layers: global_head_size wide where it is given
            width = self.cfg.global_head_size if scaled and self.cfg.global_head_size else self.cfg.head_dim
            # the windowed layers' table: rope_local_dims of each head where given (Laguna's)
            dims = self.cfg.rope_dims if scaled else (self.cfg.rope_local_dims or self.cfg.rope_dims)
            tables += rope_tables(replace(self.cfg, rope_theta=theta, head_size=width, rope_dims=dims,
                                          rope_scaling=self.cfg.rope_scaling if scaled else "none"))
        if self.cfg.nope_temperature:
            tables += (nope_temperature_table(self.cfg),)
        if self.cfg.q_position_scale:  # ln(p + 1), (context, 1), as MistralLarge4TextSoftmaxScaling takes it in fp32
            tables += (torch.log(torch.arange(self.cfg.context_len, dtype=torch.float32) + 1)[:, None],)
        return tables

    def value_table(self, layer: int) -> int | None:
        """Which value-embedding table layer `layer` mixes in: i for the first k layers and for the last k (the
        U-net pairing of modded-nanogpt, k = cfg.value_embeddings), None for the layers between."""
        if self.cfg.value_embed_layers:
            layers = self.cfg.value_embed_layers
            return layers.index(layer) if layer in layers else None
        k, n = self.cfg.value_embeddings, self.cfg.n_layer
        if layer < k:
            return layer
        if layer >= n - k:
            return layer - (n - k)
        return None

    def _apply(self, fn, recurse: bool = True):
        """Module.to(), .cuda(), .half(), to_empty() and the like, with the RoPE tables recomputed in fp32 wherever
        they land: cast to bf16 their angles are too coarse at large positions, and to_empty() leaves them empty.
        A tied head is tied again: to_empty() (and a conversion that swaps tensors) gives each module's parameter a
        tensor of its own, which would leave the head an untrained copy that loading wte does not fill."""
        super()._apply(fn, recurse)
        if self.cfg.tie_embeddings and self.lm_head.weight is not self.wte.weight:
            self.lm_head.weight = self.wte.weight
        if self.cfg.pos_emb == "rope" and self.rope_cos.device.type != "meta":
            for name, table in zip(self._rope_names(), self._rope_tables()):
                setattr(self, name, table.to(self.rope_cos.device))
        for block in self.blocks:  # the n-gram hash's constants, which to_empty() leaves empty too
            if block.ngram is not None:
                block.ngram.derive_constants()
            if isinstance(block.attn, SharedKVAttention) and block.attn.compress_rate:  # fp32 RoPE tables too
                block.attn.derive_tables()
        return self

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), residual output projections scaled by 1/sqrt(2·n_layer) (or zero with
        zero_init_proj)."""
        std = 0.02
        for module in self.modules():
            if isinstance(module, nn.Linear):
                residual_out = getattr(module, "is_residual_out", False)
                if residual_out and self.cfg.zero_init_proj:
                    nn.init.zeros_(module.weight)
                else:
                    scale = 1 / math.sqrt(2 * self.cfg.n_layer) if residual_out else 1
                    nn.init.normal_(module.weight, mean=0.0, std=std * scale)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, CCAAttention):  # its convolutions' weights are bare parameters
                module.reset_cca(std)
            elif isinstance(module, ResidualAffine):
                module.reset_parameters()
            elif isinstance(module, ShortConv):  # its depthwise weights are a bare parameter
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, GatedDeltaNet):  # bare parameters: Qwen3-Next's initial values
                nn.init.normal_(module.conv, mean=0.0, std=std)
                module.A_log.copy_(torch.empty_like(module.A_log).uniform_(1.0, 16.0).log())
                nn.init.ones_(module.dt_bias)
                nn.init.ones_(module.norm)
            elif isinstance(module, Mamba2):  # bare parameters: Mamba-2's initial values (transformers' Bamba's)
                nn.init.normal_(module.conv, mean=0.0, std=std)
                if module.conv_bias is not None:
                    nn.init.zeros_(module.conv_bias)
                module.A_log.copy_(torch.arange(1, module.heads + 1, dtype=torch.float32).log())
                nn.init.ones_(module.D)
                nn.init.ones_(module.dt_bias)
                if module.norm is not None:
                    nn.init.ones_(module.norm)
            elif isinstance(module, Mamba1):  # bare parameters: Mamba's S4D-real A (1..N a channel), D = 1
                nn.init.normal_(module.conv, mean=0.0, std=std)
                if module.conv_bias is not None:
                    nn.init.zeros_(module.conv_bias)
                module.A_log.copy_(torch.arange(1, module.dk + 1, dtype=torch.float32).log().expand_as(module.A_log))
                nn.init.ones_(module.D)
                for weight in (module.dt_norm, module.B_norm, module.C_norm):  # Jamba's norms start at scale 1
                    if weight is not None:
                        nn.init.ones_(weight)
            elif isinstance(module, Lightning):  # its norm's weight is a bare parameter
                nn.init.ones_(module.norm)
            elif isinstance(module, MLSTM):  # its per-head norm's weight is a bare parameter
                nn.init.ones_(module.norm)
            elif isinstance(module, (RWKVTimeMix, RWKVChannelMix)):  # bare parameters: RWKV-4's initial values
                layer = next(i for i, b in enumerate(self.blocks) if module in (b.attn, b.mlp))
                module.reset_rwkv(layer, self.cfg.n_layer)
            elif isinstance(module, RGLRU):  # bare parameters: Griffin's initial values
                nn.init.normal_(module.conv, mean=0.0, std=std)
                if module.conv_bias is not None:
                    nn.init.zeros_(module.conv_bias)
                module.reset_recurrence(math.sqrt(0.01 / module.width))
                nn.init.zeros_(module.input_gate_bias)
                nn.init.zeros_(module.recurrent_gate_bias)
            elif isinstance(module, HeadLinear):  # a Mamba-1 head's x_proj or dt_proj (Zamba's), as a Linear layer's
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, DiffAttention):  # λ's vectors: N(0, 0.1), transformers' lambda_std_dev
                module.reset_lambdas()
            elif isinstance(module, MLP) and module.alpha_p is not None:  # xIELU's scalars
                module.reset_xielu()
            elif isinstance(module, LatentAttention) and module.q_pos_scale is not None:  # no position scale
                nn.init.zeros_(module.q_pos_scale)
                nn.init.ones_(module.q_pos_bias)
            elif isinstance(module, (ManifoldHyperConnection, ManifoldHyperHead)):  # DeepSeek-V4's initial values
                nn.init.normal_(module.fn, mean=0.0, std=std)
                nn.init.zeros_(module.base)
                nn.init.ones_(module.scale)
            elif isinstance(module, MoE):  # stacked expert weights are bare parameters: as the Linear layers'
                proj_std = 0.0 if self.cfg.zero_init_proj else std / math.sqrt(2 * self.cfg.n_layer)
                module.reset_parameters(std, proj_std)
            elif isinstance(module, HyperConnection):  # its per-stream norms' bare weights: scale 1
                module.norm.fill_(0.0 if module.unit_offset else 1.0)
            elif isinstance(module, NGramEmbedding):  # norms by 1 + weight at scale 1, the convolution off
                for weight in (module.key_norm, module.query_norm, module.conv_norm, module.conv):
                    nn.init.zeros_(weight)
            elif isinstance(module, (UnitOffsetRMSNorm, UnitOffsetLayerNorm)):
                nn.init.zeros_(module.weight)  # scale 1 + 0
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                if module.weight is not None:
                    nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for module in self.modules():  # after the Linear layers' zero biases (modules() visits a mixer first)
            if isinstance(module, MLSTM):
                module.reset_gates()
            if isinstance(module, Mamba1):  # dt_proj's bias: softplus⁻¹ of steps log-uniform in [0.001, 0.1]
                dt = torch.empty_like(module.dt_proj.bias).uniform_(math.log(1e-3), math.log(0.1)).exp()
                module.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # (Mamba's time_step_min/max)
        for block in self.blocks:  # value-embedding mixing weights and sinks are bare parameters, not modules
            for scale in (block.attn_residual, block.mlp_residual):  # residual_scales: the plain stream at init
                if scale is not None:
                    scale.fill_(1.0)
            if isinstance(block.attn, KeyBiasAttention):  # A = 0: every key's bias exp(0) = 1 at init
                block.attn.A.zero_()
            if isinstance(block.attn, RelBiasAttention):  # as transformers' InklingPreTrainedModel draws them
                block.attn.rel_profiles.normal_(0.0, std)
            if block.layer_scalar is not None:
                block.layer_scalar.fill_(1.0)
            if block.attn_rate is not None:  # model.ngpt's rates and query scales (sqrt(D): nGPT's softmax scale)
                block.attn_rate.fill_(NGPT_RATE_INIT)
                block.mlp_rate.fill_(NGPT_RATE_INIT)
                block.attn.q_scale.fill_(block.attn.head_dim ** 0.5)
            if block.altup_scale is not None:  # AltUp's first corrected stream unscaled into the per-layer gate: 0
                block.altup_scale.zero_()
            if not block.conv and block.attn.ve_mix is not None:
                block.attn.ve_mix.fill_(0.5)
            if not block.conv and block.attn.sinks is not None:
                block.attn.sinks.zero_()
        for scalar, value in ((self.smear_lambda, 0.0), (self.resid_lambdas, 1.0), (self.x0_lambdas, 0.0),
                              (self.backout_lambda, 0.0), (self.embed_bias, 0.0),
                              (self.embed_gain, 1.0)):  # the plain residual stream at init
            if scalar is not None:
                scalar.fill_(value)
        if self.cfg.pos_emb == "rope":  # buffers are not parameters: recompute (e.g. after meta-device init)
            for name, table in zip(self._rope_names(), self._rope_tables()):
                getattr(self, name).copy_(table)

    # -- forward ---------------------------------------------------------------------------------------

    def sliding_mask(self, T: int, device, window: int | None = None) -> torch.Tensor | None:
        """Boolean (T, T) mask, True where attention is allowed, or None for plain causal attention. window: the
        layers' mask key (GPT.windows: a window, or a negative chunk size), None for cfg.sliding_window."""
        w = self.cfg.sliding_window if window is None else window
        if w == 0 or abs(w) >= T:  # (a negative key: attention within chunks of -w tokens, ModelConfig.layer_mask)
            return None
        i = torch.arange(T, device=device)
        return (i[:, None] >= i[None, :]) & mask_allows(i[:, None], i[None, :], w)

    def attention_mask(self, T: int, device, doc_ids: torch.Tensor | None = None,
                       window: int | None = None, positions: torch.Tensor | None = None,
                       prefix_len: torch.Tensor | None = None) -> torch.Tensor | None:
        """None for plain causal attention, else a bool mask, True where query i may attend key j: (T, T) for a
        sliding window alone; (B, 1, T, T) with doc_ids (B, T), each token attending only to earlier tokens of its
        own document (packed sequences do not see each other), or with prefix_len (B,) (model.prefix_lm), each row's
        first prefix_len tokens attending to one another both ways. window: the layers' whose mask this is (None:
        cfg.sliding_window). pos_emb=alibi: always a float mask, ALiBi's bias where allowed and -inf elsewhere
        (alibi_mask), (1 or B, H, T, T), by positions (T,) or (B, T) (None: 0..T-1; packed documents' restarting
        positions give the same distances within a document)."""
        window = self.cfg.sliding_window if window is None else window
        if self.cfg.pos_emb == "alibi":
            pos = torch.arange(T, device=device) if positions is None else positions.to(device)
            bias = alibi_mask(self.cfg.n_head, pos, pos, self._allowed(T, device, doc_ids, window))
            return bias if bias.dim() == 4 else bias[None]
        # flex for what SDPA's fast kernels cannot take: a document mask, scores capped by attn_softcap, sinks
        # (compressed layers join their keys to a bool mask: no flex)
        if ((doc_ids is not None or self.cfg.attn_softcap or self.cfg.attn_sinks) and self._flex_attention(device)
                and not self.cfg.kv_compress_rates):
            return self._block_mask(T, device, doc_ids, window, prefix_len)
        return self._allowed(T, device, doc_ids, window, prefix_len)

    def _allowed(self, T: int, device, doc_ids: torch.Tensor | None, window: int,
                 prefix_len: torch.Tensor | None = None) -> torch.Tensor | None:
        """attention_mask's bool mask (T, T) or (B, 1, T, T), or None for plain causal attention."""
        mask = self.sliding_mask(T, device, window)
        if doc_ids is None and prefix_len is None:
            return mask
        i = torch.arange(T, device=device)
        allowed = (i[:, None] >= i[None, :]) if mask is None else mask  # (T, T)
        if doc_ids is not None:
            allowed = (doc_ids[:, :, None] == doc_ids[:, None, :]) & allowed  # (B, T, T)
        if prefix_len is not None and self.cfg.reference_window:  # the reference over the window, causally
            allowed = allowed | reference_pairs(prefix_len, T, T)
        elif prefix_len is not None:  # the prefix over the causal (and windowed) mask, as transformers ORs it
            allowed = allowed | prefix_pairs(prefix_len, T, T)
        return allowed[:, None]

    def _flex_attention(self, device) -> bool:
        """flex when asked for; under auto, on CUDA inside torch.compile (the training step), where flex attention
        is compiled into a kernel. Eager flex attention is a slow reference, so evaluation takes the SDPA mask."""
        choice = self.cfg.doc_attention
        if self.cfg.pos_emb == "alibi" or self.cfg.rel_bias_dim:  # a float mask for SDPA (validate refuses flex)
            return False
        return choice == "flex" or (choice == "auto" and torch.device(device).type == "cuda" and self.cfg.dropout == 0
                                    and torch.compiler.is_compiling())

    def _block_mask(self, T: int, device, doc_ids: torch.Tensor | None, window: int,
                    prefix_len: torch.Tensor | None = None):
        """A flex attention BlockMask: causal (and the sliding window), within each document of doc_ids (B, T) where
        given, each row's first prefix_len (B,) tokens seeing one another where given; blocks no query may see are
        skipped rather than masked (PyTorch's flex attention document masking)."""
        from torch.nn.attention.flex_attention import create_block_mask
        reference = self.cfg.reference_window

        def allowed(b, h, q, kv):
            ok = q >= kv
            if doc_ids is not None:
                ok = ok & (doc_ids[b, q] == doc_ids[b, kv])
            if window:
                ok = ok & mask_allows(q, kv, window)
            if prefix_len is not None and reference:
                ok = ok | ((q >= kv) & (kv < prefix_len[b]))
            elif prefix_len is not None:
                ok = ok | ((q < prefix_len[b]) & (kv < prefix_len[b]))
            return ok

        rows = doc_ids if doc_ids is not None else prefix_len
        B = None if rows is None else rows.shape[0]  # None: one mask for every row
        return create_block_mask(allowed, B, None, T, T, device=device)

    def embed(self, idx: torch.Tensor, positions: torch.Tensor | None = None, before: torch.Tensor | None = None):
        """Token (and learned position) embeddings and the RoPE tables for these positions.

        idx: (B, T) token ids; positions: None for 0..T-1, else (T,) or (B, T) absolute positions; before: with
        smear_gate, the (B, 1) ids of the tokens before idx's first (a prompt's later span, a decode step: the
        engine's cache keeps them), else None.
        -> x (B, T, C), rope (cos, sin) of (T, D/2) or (B, 1, T, D/2) each, for each of cfg.rope_bases in turn
        (layer_rope picks a layer's), or None without RoPE.
        """
        T = idx.shape[1]
        if positions is None:
            positions = torch.arange(T, device=idx.device)
        x = self.token_vectors(idx, positions)
        if self.smear_gate is not None:
            x = self.smear(x, positions, None if before is None else self.token_vectors(before))
        rope = None
        if self.cfg.pos_emb == "rope":
            rope = tuple(getattr(self, name)[positions] for name in self._rope_names())
            if positions.dim() == 2:  # per-row positions: (B, T, D/2) -> (B, 1, T, D/2)
                rope = tuple(t.unsqueeze(1) for t in rope)
        return self.drop(x), rope

    def smear(self, x: torch.Tensor, positions: torch.Tensor, before: torch.Tensor | None) -> torch.Tensor:
        """x (B, T, C) with each token's predecessor smeared in (model.smear_gate, nanochat's gpt.py): x[t] +
        smear_lambda · sigmoid(smear_gate(x[t, :g])) · x[t − 1], none at position 0; before (B, 1, C): the vector
        of the token before x[:, 0] (None: zeros, x[:, 0] being at position 0 or taking none)."""
        gate = self.smear_lambda.to(x.dtype) * torch.sigmoid(self.smear_gate(x[..., :self.cfg.smear_gate]))
        gate = gate * (positions > 0).to(x.dtype).unsqueeze(-1)  # (B or 1, T, 1): position 0 has no predecessor
        previous = torch.cat([x[:, :1] * 0 if before is None else before.to(x.dtype), x[:, :-1]], dim=1)
        return x + gate * previous

    def token_vectors(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) -> the stream's input (B, T, C) before any smear: the token (and learned position)
        embeddings, scaled and normed as the config says. positions: as embed's (needed with pos_emb=learned)."""
        x = self.wte(idx)
        if self.cfg.embed_scale:  # sqrt(C) rounded to the embedding's dtype first, as Gemma's reference does
            x = x * torch.tensor(self.cfg.n_embd ** 0.5, dtype=torch.float32).to(x.dtype)
        if self.cfg.embed_multiplier:
            x = x * self.cfg.embed_multiplier
        if self.wpe is not None:
            x = x + self.wpe(positions)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        if self.embed_gain is not None:  # as transformers' ZayaModel scales its input
            x = (x + self.embed_bias) * self.embed_gain
        return x

    def stream_in(self, layer: int, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """The stream (B, T, C) entering block `layer`: resid_lambdas[layer] · x + x0_lambdas[layer] · x0 with
        model.layer_lambdas (x0 the stream entering the first block), else x. With model.altup_streams the first
        block's input is the N AltUp streams (B, T, N, C) (altup_widen), with model.mhc_streams the N hyper-connection
        streams (the embeddings in each), with model.moe_shortcut (B, T, 2, C): the stream and the shortcut experts'
        output waiting to join it (zeros at first), with model.moe_router_hidden (B, T, C + R): the stream and the
        router state (zeros at first); the others' the stream as it is."""
        if self.altup_in is not None:
            return self.altup_widen(x0) if layer == 0 else x
        if self.mhc_head is not None:  # the N hyper-connection streams (B, T, N, C), each the embeddings at first
            return x.unsqueeze(2).expand(-1, -1, self.cfg.mhc_streams, -1) if layer == 0 else x
        if self.hc_out is not None:  # model.hc_streams: the embeddings copied into each stream (B, T, N, C)
            return x0.unsqueeze(2).repeat(1, 1, self.cfg.hc_streams, 1) if layer == 0 else x
        if self.cfg.moe_shortcut:  # the stream and no shortcut output waiting yet (B, T, 2, C)
            return torch.stack([x, torch.zeros_like(x)], dim=2) if layer == 0 else x
        if self.cfg.moe_router_hidden:  # the stream and the router state, none before the first layer (B, T, C + R)
            return torch.cat([x, x.new_zeros(*x.shape[:-1], self.cfg.moe_router_hidden)], dim=-1) if layer == 0 else x
        if self.cfg.loop_section:
            return self.loop_stream(layer, x)
        if self.resid_lambdas is None:
            return x
        return self.resid_lambdas[layer].to(x.dtype) * x + self.x0_lambdas[layer].to(x.dtype) * x0

    def loop_stream(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """model.loop_section's stream entering block `layer`, as transformers' DoryModel loops: at the section's
        start x (B, T, C) becomes (B, T, 2, C), l2(x) + a and the anchor a = l2(x); each later pass restarts from
        l2(x) + a; after the last pass the stream alone (B, T, C) goes on. Elsewhere x as it is."""
        first, count = self.cfg.loop_section
        end = first + count * self.cfg.loop_passes
        if layer == first:
            anchor = self.norm_f(x)
            return torch.stack([self.norm_f(x) + anchor, anchor], dim=2)
        if layer == end:
            return x[:, :, 0]
        if first < layer < end and (layer - first) % count == 0:
            x, anchor = x.unbind(dim=2)
            return torch.stack([self.norm_f(x) + anchor, anchor], dim=2)
        return x

    @staticmethod
    def rescaled(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """y (B, T, C) rescaled to the RMS target (B, T, 1), its own RMS floored at sqrt(1e-5) (Gemma 3n's)."""
        return y * target / torch.sqrt(torch.mean(y ** 2, dim=-1, keepdim=True).clamp(min=1e-5))

    def altup_widen(self, x: torch.Tensor) -> torch.Tensor:
        """The embeddings x (B, T, C) -> the AltUp streams (B, T, N, C): x, then each of altup_in's projections of
        it rescaled to x's RMS, as transformers' Gemma3nTextModel stacks them."""
        target = torch.mean(x ** 2, dim=-1, keepdim=True) ** 0.5
        return torch.stack([x, *(self.rescaled(proj(x), target) for proj in self.altup_in)], dim=2)

    @property
    def backout_layer(self) -> int:
        """The block whose output model.backout subtracts from the last's (-1: none)."""
        return self.cfg.n_layer // 2 if self.backout_lambda is not None else -1

    def stream_out(self, x: torch.Tensor, mid: torch.Tensor | None) -> torch.Tensor:
        """The last block's output (B, T, C) less backout_lambda times block backout_layer's, `mid` (model.backout);
        x as it is without. AltUp streams (B, T, N, C) (model.altup_streams) -> (B, T, C): stream 0 and altup_out's
        projections of the others, each rescaled to stream 0's RMS, averaged."""
        if self.mhc_head is not None:  # hyper-connection streams (B, T, N, C) (model.mhc_streams): the head's sum
            return self.mhc_head(x)
        if self.hc_out is not None:  # model.hc_streams: (B, T, N, C) -> the last mixer's average (B, T, C)
            return self.hc_out(x)[0]
        if self.cfg.moe_shortcut:  # (B, T, 2, C): the last block's odd, nothing waits after it
            return x[:, :, 0]
        if self.cfg.moe_router_hidden:  # (B, T, C + R): the stream, the last router's state left behind
            return x[..., :self.cfg.n_embd]
        if self.cfg.loop_section and x.dim() == 4:  # the looped section ends the model: its stream, no anchor
            return x[:, :, 0]
        if self.altup_out is not None:
            target = torch.mean(x[:, :, 0] ** 2, dim=-1, keepdim=True) ** 0.5
            outs = [self.rescaled(proj(x[:, :, i + 1]), target) for i, proj in enumerate(self.altup_out)]
            return torch.stack([x[:, :, 0], *outs]).mean(dim=0)
        return x if mid is None else x - self.backout_lambda.to(x.dtype) * mid

    def per_layer_inputs(self, idx: torch.Tensor, x: torch.Tensor,
                         before: torch.Tensor | None = None) -> torch.Tensor | None:
        """Each layer's per-layer input (model.per_layer_embd), as transformers' Gemma4TextModel computes it: idx
        (B, T) and their embeddings x (B, T, C), embed's -> (B, T, n_layer, P), or None without them. With
        model.ngram_layers, every layer's is ngram_windows(idx, before) (B, T, n_layer, ngram_size) (a view); with
        model.moe_hash_layers, the token ids (B, T, n_layer, 1) (a view) that their experts route by."""
        if self.cfg.moe_hash_layers:
            return idx[:, :, None, None].expand(-1, -1, self.cfg.n_layer, 1)
        if self.cfg.ngram_layers:
            return self.ngram_windows(idx, before).unsqueeze(2).expand(-1, -1, self.cfg.n_layer, -1)
        if self.cfg.shared_attn_layers:  # Zamba2's: every layer's is x0, the token embeddings (a view)
            return x.unsqueeze(2).expand(-1, -1, self.cfg.n_layer, -1)
        if self.ple_table is None:
            return None
        B, T = idx.shape
        P = self.cfg.per_layer_embd
        scale = torch.tensor(P ** 0.5, dtype=torch.float32).to(self.ple_table.weight.dtype)  # rounded as wte's
        # tokens past the table read row 0, as transformers' Gemma3nTextModel reads them (Gemma 3n's multimodal ids)
        idx = torch.where(idx < self.ple_table.num_embeddings, idx, 0)
        tokens = (self.ple_table(idx) * scale).view(B, T, -1, P)
        context = self.ple_norm((self.ple_proj(x) * self.cfg.n_embd ** -0.5).view(B, T, -1, P))
        return (context + tokens) * 2 ** -0.5

    def ngram_windows(self, idx: torch.Tensor, before: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) -> each token's last ngram_size ids, oldest first (B, T, ngram_size) (model.ngram_layers);
        before: the ngram_size - 1 ids before idx's first (B, ngram_size - 1) (a later span, a decode step: the
        engine's cache keeps them), None at a sequence's start, where they read as ngram_eos (transformers' empty
        n-gram context)."""
        n = self.cfg.ngram_size
        if before is None:
            before = idx.new_full((idx.shape[0], n - 1), self.cfg.ngram_eos)
        return torch.cat([before, idx], dim=1).unfold(1, n, 1)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states (..., C), after norm_f -> logits (..., padded_head) (through head_transform first,
        where the model has one), divided by logit_divisor and soft-capped when logit_softcap is set (then in
        fp32)."""
        if self.head_transform is not None:
            x = self.head_transform(x)
        return head_output(self.lm_head(x), self.cfg)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        reduction: Literal["mean", "none"] = "mean",
        positions: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
        prefix_len: torch.Tensor | None = None,
    ):
        """idx: (B, T). With targets (B, T): the cross-entropy loss (mean, or per token with reduction='none';
        targets of -1 are ignored; the others below model.head_width). Without: logits (B, T, head_width), padding
        removed (head_width = vocab_size unless model.head_vocab narrows the head).
        positions (T,) or (B, T): each token's position (None: 0..T-1); doc_ids (B, T): packed documents, each
        attending only within itself (give positions that restart at each document with it). prefix_len (B,)
        (model.prefix_lm): each row's first prefix_len tokens attend to one another both ways (PaliGemma's
        prompt); its loss is the targets' as given (PaliGemma's labels leave the prefix's out: targets -1).
        With model.reference_window, prefix_len (B,) is each row's reference, seen beyond the window."""
        B, T = idx.shape
        if T > self.cfg.context_len:
            raise UserError(f"sequence length {T} exceeds the model's context_len {self.cfg.context_len}")
        if prefix_len is not None and (not (self.cfg.prefix_lm or self.cfg.reference_window) or doc_ids is not None):
            raise UserError("prefix_len takes a prefix-LM (model.prefix_lm) or a reference window "
                            "(model.reference_window) and one sequence a row (no doc_ids)")
        if doc_ids is not None and self.cfg.kv_compress_rates:
            raise UserError("packed documents (doc_ids) with compressed layers (model.kv_compress_rates): their "
                            "windows of tokens would pool across documents; train without document masking")
        if doc_ids is not None and self.cfg.cca_kernels:
            raise UserError("packed documents (doc_ids) with ZAYA's convolutional attention (model.cca_kernels): its "
                            "convolutions and delayed values would read across documents; train without document "
                            "masking")
        x, rope = self.embed(idx, positions)
        # model.reference_window without prefix_len: every token is the reference's, causal throughout
        whole = self.cfg.reference_window and prefix_len is None
        masks = {w: self.attention_mask(T, idx.device, doc_ids, 0 if whole and w > 0 else w, positions, prefix_len)
                 for w in self.cfg.windows}  # one per window
        values = [table(idx) for table in self.value_embeds]  # (B, T, KV*D) each
        ple = self.per_layer_inputs(idx, x)  # (B, T, n_layer, P) or None
        # the layers' (k, v) for the kv-shared ones (latent attention's: (latent, rotated key part))
        shared = {} if self.cfg.kv_shared_layers or self.cfg.kv_source_layers else None
        x0, mid = x, None
        for i, block in enumerate(self.blocks):
            table = self.value_table(i)
            mask = doc_ids if block.conv else masks[block.window]  # a convolution keeps documents apart
            x = block(self.stream_in(i, x, x0), rope, mask, ve=None if table is None else values[table],
                      doc_ids=doc_ids, ple=None if ple is None else ple[:, :, i], shared=shared)
            if i == self.backout_layer:
                mid = x
        x = self.norm_f(self.stream_out(x, mid))
        V = self.cfg.head_width
        if targets is not None and self.cfg.head_vocab and not torch.compiler.is_compiling():  # a sync, not traced
            check_targets(targets, V)
        if targets is not None and self.cfg.ce_chunk_tokens:
            if self.head_transform is not None:  # per token, before the chunks of the head
                x = self.head_transform(x)
            loss = chunked_cross_entropy(self.lm_head, x.reshape(B * T, -1), targets.reshape(-1),
                                         self.cfg.ce_chunk_tokens, reduction, ignore_index=-1, vocab=V)
            return loss.view(B, T) if reduction == "none" else self._balanced(loss)
        logits = self.logits(x)
        if targets is None:
            return logits[..., :V]
        logits = logits.float()
        if logits.size(-1) > V:  # padding rows are no tokens: out of the softmax (an imported model's are zeros)
            logits[..., V:] = float("-inf")
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1,
                               reduction=reduction)
        return loss.view(B, T) if reduction == "none" else self._balanced(loss)

    def _balanced(self, loss: torch.Tensor) -> torch.Tensor:
        """The mean loss plus model.moe_aux_loss times the experts' load-balancing loss, averaged over the layers,
        when training a mixture of experts with it (MoE.balance); else the loss as it is."""
        if not (self.training and self.cfg.moe_aux_loss):
            return loss
        balance = torch.stack([m.balance for m in self.modules() if isinstance(m, MoE)]).mean()
        return loss + self.cfg.moe_aux_loss * balance

    # -- accounting ------------------------------------------------------------------------------------

    def num_params(self, embeddings: bool = True) -> int:
        """Unique parameters. embeddings=False leaves out the token, value, position and n-gram tables and an untied
        head."""
        total = sum(p.numel() for p in self.parameters())
        if embeddings:
            return total
        total -= self.wte.weight.numel() + sum(t.weight.numel() for t in self.value_embeds)
        if self.ple_table is not None:
            total -= self.ple_table.weight.numel()
        total -= sum(b.ngram.table.weight.numel() for b in self.blocks if b.ngram is not None)  # n-gram tables
        if self.wpe is not None:
            total -= self.wpe.weight.numel()
        if not self.cfg.tie_embeddings:
            total -= self.lm_head.weight.numel()
        return total

    def flops_per_token(self, seq_len: int | None = None, exact: bool = False) -> float:
        """Training FLOPs (forward + backward) per token at sequence length seq_len.

        exact=False: the usual 6N + 12·L·d·T (N = parameters without the position table, d the attention width
        n_head · head_dim, each layer's own with global_head_size and window_n_head; PaLM appendix B).
        exact=True: 6 × (every matmul weight, the head at its padded size, each counted once per use)
        + 12·H·(D·T_attended summed over the attention layers), T_attended capped by each layer's window; norms,
        elementwise work and the delta nets' state updates are left out, as in the formula.
        """
        cfg = self.cfg
        T = seq_len or cfg.context_len
        # a mixture of experts computes with moe_top_k of its experts a token (and its moe_sink_experts): the others'
        # weights do no work
        idle = sum((1 - (cfg.moe_top_k + cfg.moe_sink_experts) / cfg.moe_experts) * (m.fc.numel() + m.proj.numel())
                   for b in self.blocks for m in (b.mlp, b.moe) if isinstance(m, MoE))
        if not exact:
            n = self.num_params() - (self.wpe.weight.numel() if self.wpe is not None else 0) - idle
            # a looped section's later passes (model.loop_section) compute with their blocks' weights again
            n += sum(p.numel() for b in self.blocks if isinstance(b, LoopPass) for p in b.block.parameters())
            # each attention layer at its own head width and count (model.global_head_size, window_n_head)
            return 6 * n + 12 * sum(cfg.layer_n_head(i) * cfg.layer_head_dim(i) for i in cfg.attention_layers) * T
        matmul = -idle
        for block in self.blocks:
            for module in getattr(block, "block", block).modules():  # a loop's later pass: its block's again
                if isinstance(module, nn.Linear):
                    matmul += module.weight.numel()
                elif isinstance(module, MoE):
                    matmul += module.fc.numel() + module.proj.numel()
                elif isinstance(module, RelBiasAttention):  # the profiles, once for each head's mix of them
                    matmul += module.n_head * module.rel_profiles.numel()
        matmul += self.lm_head.weight.numel()
        hc_out = () if self.hc_out is None else (self.hc_out.down, self.hc_out.up)  # the last streams' mixer
        for proj in (*(self.altup_in or ()), *(self.altup_out or ()), *hc_out):  # AltUp's streams in and out
            matmul += proj.weight.numel()
        attended = sum(cfg.layer_n_head(i) * cfg.layer_head_dim(i) * (min(T, abs(w)) if w else T)  # heads x keys
                       for i, w in zip(cfg.attention_layers, map(cfg.layer_mask, cfg.attention_layers)))
        return 6 * matmul + 12 * attended

    # -- plain generation (the fast KV-cache engine lives in redline/inference) -------------------------

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Full-recompute sampling, one token at a time. idx: (B, T) -> (B, T + max_new_tokens); with
        model.prefix_lm (model.reference_window), idx (what of it stays in the context) is the prefix (the
        reference)."""
        T0 = idx.shape[1]
        for _ in range(max_new_tokens):
            context = idx[:, -self.cfg.context_len :]
            prefix = None
            if self.cfg.prefix_lm or self.cfg.reference_window:  # the prompt's tokens still in the context
                kept = max(0, T0 - (idx.shape[1] - context.shape[1]))
                prefix = torch.full((idx.shape[0],), kept, device=idx.device)
            logits = self(context, prefix_len=prefix)[:, -1, :].float()
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat((idx, nxt), dim=1)
        return idx
