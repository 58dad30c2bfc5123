"""A pre-norm block's decode step as four product kernels and the attention kernel (decode_linear "triton").

A decode step's Linear layers read their whole weights for a few rows, so they are bound by memory and launch
latency, not by flops. Here each product runs in redline's kernels (kernels/linear.py) with what surrounds it fused
in: the norm before it (at batch 1: in the matrix-vector kernel; for a batch it runs first, in its own kernel, as
every program of the batched product would compute the rows' statistics again), and the bias, activation and
residual add after it. A pre-norm block is then five kernels: qkv (norm1 fused), the attention kernel
(kernels/decode_attention.py, from the qkv output), proj (+ residual), fc (norm2 and the activation fused) and the
MLP's proj (+ residual).

This is the one place outside redline/model.py that computes a block: it reads the block's own modules (norms,
Linear layers, their weights and epsilons), but the arithmetic is the kernels'. `unsupported(cfg)` names what it
cannot compute; the engine then runs the model's own block. Every field of ModelConfig is listed in
`FIELDS_ACCOUNTED` with how this path treats it, and a test checks that list against the config, so a new
architecture option fails that test until someone decides here whether the fused path handles it.
"""

from __future__ import annotations

import torch

from redline.inference.cache import kernel_prologue_unsupported
from redline.model import head_output

ACTIVATION = {"gelu": "gelu_tanh", "relu2": "relu2", "swiglu": "swiglu"}
MAX_ROWS = 64  # redline's product kernels take the step's products up to this batch; above it they are cuBLAS's

# Every ModelConfig field, and how the fused path treats it (the test in tests/test_inference.py keeps this list
# and the config in step).
FIELDS_ACCOUNTED = {
    # checked by unsupported()
    "norm_position": "pre only: the norm is fused into the next product (post, output and sandwich are refused)",
    "norm_unit_offset": "refused: the product kernels scale a norm by its weight, not 1 + weight",
    "fused_qkv": "one qkv product only",
    "fused_mlp": "SwiGLU's gate and up as one matrix only",
    "mlp": "gelu (tanh), relu2, swiglu (geglu, swiglu_clamped, relu, xielu and rwkv refused: no fused activation)",
    "swiglu_limit": "refused with mlp=swiglu_clamped",
    "xielu_beta": "refused with mlp=xielu", "xielu_eps": "refused with mlp=xielu",
    "value_embeddings": "refused: the block hands the attention kernel the raw qkv output, before tables are mixed in",
    "value_embed_layers": "refused as value_embeddings", "value_embed_gate": "refused with value_embed_layers",
    "smear_gate": "outside the blocks: the step's embeddings (decode_inputs)",
    "layer_lambdas": "outside the blocks: the stream between them (GPT.stream_in)",
    "backout": "outside the blocks: the stream before the head (GPT.stream_out)",
    "parallel_residual": "refused: the MLP's norm reads the block input, not the attention's residual sum",
    "parallel_shared_norm": "refused with parallel_residual",
    "head_bias": "the head's bias is added in its product's epilogue",
    "gelu_approximate": "tanh only: the product kernels' GELU is the tanh approximation",
    "rope_dims": "refused: the attention kernel rotates whole heads of the raw qkv output",
    "conv_layers": "refused: the block hands the attention kernel its qkv projection, which a convolution has not",
    "conv_kernel": "refused with conv_layers",
    "mlp_free_layers": "refused: the block is five kernels, attention then the MLP",
    "mixer_free_layers": "refused: the block is five kernels, attention then the MLP",
    "bitlinear": "refused: the product kernels multiply by the stored weights, unrounded inputs",
    "sub_norms": "refused: no norm before the output projections",
    "ngpt": "refused with norm_position=sandwich, which model.ngpt needs (unsupported() names the norms)",
    "loop_section": "outside the blocks: a later pass runs its block again, the stream between them GPT.stream_in's",
    "loop_passes": "with loop_section",
    "diff_attention": "refused: the attention kernel computes one map over the values",
    "attn_key_bias": "refused: the attention kernel adds no key biases",
    "rel_bias_dim": "refused: the attention kernel adds no relative-position bias",
    "rel_bias_extent": "with rel_bias_dim",
    "kv_conv": "refused: the attention kernel attends over stored keys and values, not convolutions of them",
    "residual_scales": "refused: the sublayers' outputs join an unscaled stream",
    "normed_residual": "refused: the sublayers' outputs join the stream itself, not its normed and scaled copy",
    "delta_dt_min": "refused with delta_layers",
    "delta_parallel": "refused with delta_layers", "delta_gate_norm": "refused with delta_layers",
    "shared_attn_layers": "refused with delta_layers (its callers are Mamba-2 layers)",
    "shared_attn_blocks": "refused with delta_layers", "shared_attn_adapter_rank": "refused with delta_layers",
    "shared_attn_qkv_adapters": "refused with delta_layers",
    "delta_layers": "refused: the block hands the attention kernel its qkv projection, which a delta net has not",
    "delta_heads": "refused with delta_layers", "delta_key_heads": "refused with delta_layers",
    "delta_key_dim": "refused with delta_layers", "delta_value_dim": "refused with delta_layers",
    "delta_conv_kernel": "refused with delta_layers", "delta_rule": "refused with delta_layers",
    "delta_conv_bias": "refused with delta_layers", "delta_proj_bias": "refused with delta_layers",
    "delta_beta_scale": "refused with delta_layers", "delta_norm_eps": "refused with delta_layers",
    "delta_gate_rank": "refused with delta_layers", "delta_decay": "refused with delta_layers",
    "delta_decay_floor": "refused with delta_layers",
    "delta_norm_position": "refused with delta_layers",
    "delta_dt_rank": "refused with delta_layers", "delta_gate_softcap": "refused with delta_layers",
    "delta_bcdt_norm_eps": "refused with delta_layers",
    "delta_bcdt_norm_weight": "refused with delta_layers",
    "moe_experts": "refused: the block's MLP is one fused product pair, not routed experts",
    "moe_top_k": "refused with moe_experts", "moe_norm_topk": "refused with moe_experts",
    "moe_norm_min": "refused with moe_experts", "moe_groups": "refused with moe_experts",
    "moe_topk_groups": "refused with moe_experts",
    "moe_shared_hidden": "refused with moe_experts", "moe_shared_gate": "refused with moe_experts",
    "moe_aux_loss": "training only",
    "moe_bias_update": "training only (the routing bias it moves is moe_expert_bias's)",
    "moe_gating": "refused with moe_experts", "moe_expert_bias": "refused with moe_experts",
    "moe_scale": "refused with moe_experts", "moe_bias": "refused with moe_experts", "moe_dense_layers": "refused with moe_experts",
    "moe_norm_eps": "refused with moe_experts", "moe_groups": "refused with moe_experts",
    "moe_topk_groups": "refused with moe_experts",
    "moe_dense_hidden": "refused with moe_experts", "moe_layers": "refused with moe_experts",
    "moe_post_norm": "refused with moe_experts",
    "moe_out_bias": "refused with moe_experts",
    "moe_identity_experts": "refused with moe_experts", "moe_sink_experts": "refused with moe_experts",
    "norm_gate_rank": "refused (unsupported): the product kernels fold plain norms into the next product",
    "q_latent_gate": "refused with kv_lora_rank (latent attention: fused_qkv off)",
    "q_position_scale": "refused with kv_lora_rank (latent attention: fused_qkv off)",
    "kv_source_layers": "refused with kv_lora_rank (latent attention: fused_qkv off)",
    "moe_shortcut": "refused with moe_experts",
    "cca_kernels": "refused: ZAYA's q, k and v are convolved from earlier tokens' projections, not one raw qkv product",
    "residual_affine": "refused: the sublayers' outputs join an unscaled stream",
    "moe_router_hidden": "refused with moe_experts",
    "moe_weight_input": "refused with moe_experts", "moe_bias_on_logits": "refused with moe_experts",
    "moe_swiglu_limit": "refused with moe_experts",
    "moe_swiglu_act_limits": "refused with moe_experts",
    "swiglu_act_limits": "refused (unsupported): the fused SwiGLU clamps nothing",
    "moe_jitter_eps": "refused with moe_experts", "moe_input_jitter": "training only (and refused with moe_experts)",
    "qkv_clip": "refused by kernel_prologue_unsupported (the clamp sits between the projection and the kernel)",
    "rope_qk_norm": "refused (kernel_prologue_unsupported): the attention kernel normalizes by a weight before RoPE",
    "nope_temperature": "refused (kernel_prologue_unsupported): the attention kernel scales no queries by position",
    "nope_temperature_floor": "refused with nope_temperature",
    "attn_chunk": "refused: the plan keeps chunked attention off the attention kernel, and so off this path",
    "kv_lora_rank": "refused (kernel_prologue_unsupported): latent attention has no raw qkv projection",
    "q_lora_rank": "refused with kv_lora_rank", "v_head_dim": "refused with kv_lora_rank",
    "latent_key_norm": "refused with kv_lora_rank", "latent_norm_eps": "refused with kv_lora_rank",
    # computed as the modules compute them
    "norm": "LayerNorm or RMSNorm, with the module's weight, bias and eps (l2, model.ngpt's, refused with its sandwich norms)",
    "norm_eps": "read from the norm modules", "rescale_every": "read from the norm modules (their epsilon)",
    "norm_bias": "read from the norm modules",
    "norm_affine": "read from the norm modules (no weight: the product kernels' HAS_NORM_W off; the attention "
                   "kernel's QK-norm scales by ones)",
    "embed_norm": "inputs (the model's embed() applies it)",
    "bias": "each Linear's bias is added in its product's epilogue",
    "qkv_bias": "the qkv Linear's bias, as any bias",
    "qk_norm": "in the attention kernel",
    "qk_norm_scope": "head only: the attention kernel normalizes the raw qkv output per head",
    "qk_norm_after_rope": "refused: the attention kernel normalizes q and k before it rotates them",
    "qk_layernorm": "refused (kernel_prologue_unsupported): the attention kernel's QK-norm is an RMSNorm",
    "qk_layernorm_per_head": "refused with qk_layernorm, which it needs",
    "sliding_window": "in the attention kernel",
    "sliding_window_pattern": "each layer's window to the attention kernel",
    "window_layers": "each layer's window to the attention kernel",
    "attn_scale": "the scores' scale to the attention kernel",
    "attn_softcap": "the plan keeps it off the attention kernel, and so off this path",
    "attn_sinks": "the plan keeps it off the attention kernel, and so off this path",
    "attn_sinks_windowed": "needs attn_sinks, which the plan keeps off the attention kernel",
    "attn_gate": "refused: the heads' outputs go into the output projection's kernel ungated",
    "attn_gate_fn": "refused with attn_gate",
    "attn_experts": "refused with attn_gate (routed)",
    "rope_local_theta": "refused: the attention kernel rotates the raw qkv output with one table",
    "rope_local_dims": "refused: the attention kernel rotates the raw qkv output with one table",
    "nope_interval": "refused: the attention kernel rotates the raw qkv output of every layer",
    "rope_layer_theta": "refused: the attention kernel rotates the raw qkv output of every layer with one table",
    "n_head": "shapes", "n_kv_head": "shapes", "head_size": "shapes", "n_embd": "shapes", "mlp_hidden": "shapes",
    "vocab_size": "shapes", "pad_vocab_to": "shapes", "n_layer": "shapes", "context_len": "shapes",
    "head_vocab": "shapes: fused_head's product runs over lm_head's own rows, decode_output keeps head_width of them",
    "tie_embeddings": "the head's weight, whatever it is tied to",
    "logit_softcap": "applied to the head's output",
    "logit_divisor": "applied to the head's output",
    "embed_multiplier": "inputs",
    "residual_multiplier": "refused: the product kernels add the sublayers' outputs to the stream unscaled",
    # Gemma 4's (plan.layerwise_attention names them; sandwich norms and separate q/k/v are refused besides)
    "global_head_size": "refused: one head width for every layer's qkv product",
    "global_kv_head": "refused: one KV head count for every layer's qkv product",
    "window_n_head": "refused: one query head count for every layer's qkv product",
    "global_values_from_keys": "refused: the qkv product gives values of their own",
    "v_norm": "refused: the attention kernel stores the values as the product gives them",
    "kv_shared_layers": "refused: every layer's kernel writes the key and value it computes",
    "kv_shared_mlp_hidden": "refused with kv_shared_layers",
    "per_layer_embd": "refused: the block is five kernels, attention then the MLP, nothing after",
    "per_layer_vocab": "refused with per_layer_embd",
    "layer_scalars": "refused: the block's output leaves the last product unscaled",
    "moe_beside_dense": "refused with moe_experts",
    # Gemma 3n's (plan.layerwise_attention names them)
    "altup_streams": "refused: the block runs on one residual stream, not AltUp's several",
    "altup_correct_scale": "refused with altup_streams", "altup_coef_clip": "training only",
    "laurel_rank": "refused: the block has no branch beside attention",
    "mlp_sparsity": "refused: the MLP's product kernel applies no top-k cutoff to its gate",
    # DeepSeek-V4's (unsupported() names them)
    "mhc_streams": "refused: the block runs on one residual stream, not mHC's several",
    "mhc_sinkhorn_iters": "refused with mhc_streams", "mhc_eps": "refused with mhc_streams",
    "shared_kv_attention": "refused: no raw qkv projection, a grouped output projection",
    "o_groups": "with shared_kv_attention", "o_lora_rank": "with shared_kv_attention",
    "kv_compress_rates": "with shared_kv_attention", "kv_compress_overlap": "with shared_kv_attention",
    "rope_unscaled_theta": "with shared_kv_attention (DeepSeek-V4's)",
    "moe_hash_layers": "refused with moe_experts",
    "mhc_post_scale": "refused with mhc_streams",
    "mhc_head_mean": "refused with mhc_streams (the head after the blocks, outside this path)",
    # Qwen4-Exp's
    "hc_streams": "refused: the block runs on one residual stream, not hyper-connections' several",
    "hc_rank": "refused with hc_streams",
    "qsa_heads": "the indexer's weights are never read (it keeps every key within context_len)",
    "qsa_head_dim": "with qsa_heads", "qsa_budget": "with qsa_heads (caps context_len)", "qsa_block": "with qsa_heads",
    "ngram_layers": "refused with hc_streams (the n-gram embeddings add to the hyper-connected streams)",
    "ngram_dim": "with ngram_layers", "ngram_size": "with ngram_layers", "ngram_heads": "with ngram_layers",
    "ngram_vocab_base": "with ngram_layers", "ngram_vocab_multiple": "with ngram_layers",
    "ngram_seed": "with ngram_layers", "ngram_conv_kernel": "with ngram_layers", "ngram_eos": "with ngram_layers",
    # not part of the block's decode step
    "pos_emb": "the step's inputs (embedding, RoPE tables) come from the model; alibi refused (the plan keeps it "
               "off the attention kernel, whose scores take no bias)", "rope_theta": "inputs",
    "embed_scale": "inputs",
    "rope_scaling": "inputs", "rope_factor": "inputs", "rope_low_freq_factor": "inputs",
    "rope_high_freq_factor": "inputs", "rope_original_context": "inputs", "rope_beta_fast": "inputs",
    "rope_beta_slow": "inputs", "rope_attention_factor": "inputs", "rope_truncate": "inputs",
    "rope_pair_factors": "inputs", "rope_long_pair_factors": "inputs", "rope_proportion": "inputs",
    "rope_pair_log_scales": "inputs",
    "dropout": "off in inference", "attn_backend": "prefill only", "ce_chunk_tokens": "training only",
    "zero_init_proj": "initialisation only",
    "doc_attention": "training only (packed documents kept apart)",
    "prefix_lm": "prefill only (the prompt's mask); a decode step attends causally",
    "reference_window": "the decode step's mask (the matmul attention's; the triton decode kernel is refused)",
    "head_transform": "refused: fused_head multiplies the final norm's output by the head alone",
    "first_norm_free": "refused: every block's first norm is fused into its qkv product",
}


def unsupported(cfg) -> str | None:
    """Why the fused block cannot compute this architecture, or None."""
    from redline.inference.plan import layerwise_attention

    if gemma4 := layerwise_attention(cfg):
        return f"decode_linear triton runs none of Gemma 4's layer options ({gemma4})"
    if getattr(cfg, "shared_kv_attention", False):
        return ("decode_linear triton has no DeepSeek-V4 attention (model.shared_kv_attention: no raw qkv projection, "
                "a grouped output projection)")
    if getattr(cfg, "mhc_streams", 0):
        return ("decode_linear triton adds the sublayers' outputs to one residual stream, not to hyper-connection "
                "streams (model.mhc_streams)")
    if getattr(cfg, "diff_attention", False):
        return "decode_linear triton hands the attention kernel plain heads (model.diff_attention)"
    if getattr(cfg, "attn_key_bias", False) or getattr(cfg, "residual_scales", False):
        return ("decode_linear triton adds no key biases and scales no residual stream (model.attn_key_bias, "
                "model.residual_scales)")
    if getattr(cfg, "cca_kernels", ()) or getattr(cfg, "residual_affine", False):
        return ("decode_linear triton has no convolutional attention and scales no residual stream "
                "(model.cca_kernels, model.residual_affine)")
    if getattr(cfg, "kv_conv", 0):
        return "decode_linear triton hands the attention kernel keys and values without convolutions (model.kv_conv)"
    if getattr(cfg, "rel_bias_dim", 0):
        return ("decode_linear triton hands the attention kernel scores it adds no relative-position bias to "
                "(model.rel_bias_dim)")
    if getattr(cfg, "normed_residual", ()):
        return ("decode_linear triton adds the sublayers' outputs to the stream, not to its normed input "
                "(model.normed_residual)")
    if getattr(cfg, "bitlinear", "off") != "off" or getattr(cfg, "sub_norms", False):
        return ("decode_linear triton multiplies by the stored weights with no norm before the output projections "
                "(model.bitlinear, model.sub_norms)")
    if cfg.norm_position != "pre":
        return "decode_linear triton needs pre-norm blocks (the norm is fused into the next product)"
    if getattr(cfg, "head_transform", False) or getattr(cfg, "first_norm_free", False):
        return ("decode_linear triton fuses a norm into every block's first product and the final norm into the head "
                "(model.first_norm_free, model.head_transform)")
    if getattr(cfg, "norm_gate_rank", 0):
        return "decode_linear triton fuses plain norms into the next product, not gated ones (model.norm_gate_rank)"
    if not cfg.fused_qkv:
        return "decode_linear triton needs a fused qkv projection (model.fused_qkv)"
    if cfg.mlp == "swiglu" and not cfg.fused_mlp:
        return "decode_linear triton needs SwiGLU's gate and up in one matrix (model.fused_mlp)"
    if getattr(cfg, "conv_layers", ()):
        return "decode_linear triton runs attention blocks, not short convolutions (model.conv_layers)"
    if getattr(cfg, "moe_experts", 0):
        return "decode_linear triton runs one dense MLP a block, not a mixture of experts (model.moe_experts)"
    if getattr(cfg, "delta_layers", ()):
        return "decode_linear triton runs attention blocks, not recurrent layers (model.delta_layers)"
    if getattr(cfg, "hc_streams", 0):
        return "decode_linear triton runs one residual stream, not hyper-connections' several (model.hc_streams)"
    if getattr(cfg, "mlp_free_layers", ()) or getattr(cfg, "mixer_free_layers", ()):
        return ("decode_linear triton runs blocks of attention and an MLP, not one of them alone "
                "(model.mlp_free_layers, mixer_free_layers)")
    if getattr(cfg, "swiglu_act_limits", ()):
        return "decode_linear triton's SwiGLU clamps nothing (model.swiglu_act_limits)"
    if cfg.mlp not in ACTIVATION:
        return f"decode_linear triton has no fused {cfg.mlp} activation"
    if getattr(cfg, "norm_unit_offset", False):
        return "decode_linear triton scales a norm by its weight, not 1 + weight (model.norm_unit_offset)"
    if getattr(cfg, "attn_gate", "none") != "none":
        return "decode_linear triton hands the heads' outputs to the output projection ungated (model.attn_gate)"
    if getattr(cfg, "residual_multiplier", 0):
        return ("decode_linear triton adds the sublayers' outputs to the residual stream unscaled "
                "(model.residual_multiplier)")
    if getattr(cfg, "parallel_residual", False):
        return "decode_linear triton fuses the MLP's norm onto the attention's residual sum (model.parallel_residual)"
    if cfg.mlp in ("gelu", "geglu") and getattr(cfg, "gelu_approximate", "tanh") != "tanh":
        return "decode_linear triton's GELU is the tanh approximation (model.gelu_approximate=none)"
    if getattr(cfg, "pos_emb", "rope") == "alibi":
        return "decode_linear triton hands the attention kernel scores it adds no ALiBi bias to (model.pos_emb=alibi)"
    if why := kernel_prologue_unsupported(cfg):  # the block hands the attention kernel the raw projection
        return f"decode_linear triton hands the attention kernel the raw qkv projection, which cannot give it {why}"
    return None


def counters_needed(cfg) -> int:
    """Counters the batched product kernel's split-K needs for this model's block layers, at any batch up to
    MAX_ROWS: one per output tile, of 16 x 16 at the smallest (kernels/linear.py, gemv_split)."""
    widest = max((cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim, cfg.n_embd, cfg.hidden_dim)
    return -(-MAX_ROWS // 16) * -(-widest // 16)


def norm_args(norm) -> tuple:
    """The gemv op's (norm, weight, bias, eps) for a LayerNorm or RMSNorm module, rounded as the module rounds."""
    if isinstance(norm, torch.nn.RMSNorm):
        eps = norm.eps if norm.eps is not None else torch.finfo(norm.weight.dtype).eps
        return "rmsnorm", norm.weight, None, eps
    return "layernorm", norm.weight, norm.bias, norm.eps


def fused_block(block, x: torch.Tensor, attention, counts: torch.Tensor) -> torch.Tensor:
    """block's decode step: x (B, 1, C) -> (B, 1, C), B up to MAX_ROWS. attention(attn, qkv) -> (B, H*D): the
    attention kernel from the qkv product's output (cache.DecodeLayer.attend_projected); counts: int32 zeros, at
    least counters_needed(cfg), for split-K."""
    attn, mlp = block.attn, block.mlp
    B = x.shape[0]

    def product(h, layer, residual=None, act="none", norm=None):
        if B > 1:
            return torch.ops.redline.gemv_split(h if norm is None else norm(h), layer.weight, counts, layer.bias,
                                                residual, act)
        return torch.ops.redline.gemv(h, layer.weight, layer.bias, residual, act,
                                      *(norm_args(norm) if norm is not None else ()))

    h = x.view(B, -1)
    qkv = product(h, attn.qkv, norm=block.norm1)
    h = product(attention(attn, qkv), attn.proj, h)
    u = product(h, mlp.fc, act=ACTIVATION[mlp.kind], norm=block.norm2)
    return product(u, mlp.proj, h).view(B, 1, -1)


def fused_head(model, x: torch.Tensor) -> torch.Tensor:
    """The final norm and the head: x (B, 1, C) -> logits (B, padded_head), B up to MAX_ROWS (at batch 1 with the
    norm in the product; see fused_block), divided and soft-capped as GPT.logits does."""
    B = x.shape[0]
    if B == 1:
        logits = torch.ops.redline.gemv(x.view(1, -1), model.lm_head.weight, model.lm_head.bias, None, "none",
                                        *norm_args(model.norm_f))
    else:
        logits = torch.ops.redline.gemv(model.norm_f(x).view(B, -1), model.lm_head.weight, model.lm_head.bias)
    return head_output(logits, model.cfg)
