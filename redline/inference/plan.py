"""How the engine decodes, decided once: `plan_decode` checks every option against the model and the machine and
returns a frozen `DecodePlan`; nothing downstream validates or re-decides.

The choices, and what "auto" picks:
- dtype: bf16 on a GPU that has it, fp32 elsewhere (the engine runs a copy of the model in it, if it is not in
  it already);
- compile / cuda_graphs: on for CUDA, off on a CPU (graphs need a GPU);
- decode attention: "triton" (redline's kernel, kernels/decode_attention.py) where the step is compiled for a GPU
  that can run it and the head dimension is a power of two, else "matmul" (the portable path); where the kernel's
  prologue cannot compute a model's q, k and v from the raw projection (value embeddings, OLMo 2's QK-norm over
  whole projections, Gemma 3's, partial RoPE: cache.kernel_prologue_unsupported), the layer computes them in torch
  and the kernel stores and attends over them;
- decode linear: "triton" (redline's product kernels with norms, biases, activations and residual adds fused in,
  kernels/fused_block.py) where decode attention is triton and the architecture is one the fused block computes,
  else "torch" (cuBLAS, or Inductor's tuned reductions under kernel_tuning);
- KV cache: the model's dtype, or "fp8" (float8_e4m3fn with a scale per token and kv head: half the bytes, at a
  cost in accuracy that `redline eval --kv-cache-dtypes auto fp8` measures).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from redline.errors import UserError

DECODE_ATTENTION = ("auto", "matmul", "triton")
DECODE_LINEAR = ("auto", "torch", "triton")
KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class DecodePlan:
    device: torch.device
    dtype: torch.dtype
    """Weights, activations and (unless kv_cache is fp8) the cache."""
    compile: bool
    cuda_graphs: bool
    attention: str
    """"matmul" or "triton"."""
    linear: str
    """"torch" or "triton"."""
    kv_cache: str
    """"auto" (the model's dtype) or "fp8"."""
    kernel_tuning: bool
    """Inductor's coordinate-descent tuning of the compiled step's kernels."""
    prefill_chunk_tokens: int
    """Prefill at most this many tokens at once (rows of a batch, and spans of a long prompt)."""

    @property
    def cache_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn if self.kv_cache == "fp8" else self.dtype

    def describe(self) -> dict:
        return {"device": str(self.device), "dtype": str(self.dtype).removeprefix("torch."), "compile": self.compile,
                "kernel_tuning": self.kernel_tuning, "cuda_graphs": self.cuda_graphs,
                "decode_attention": self.attention, "decode_linear": self.linear, "kv_cache_dtype": self.kv_cache}


def plan_decode(cfg, device: torch.device, *, dtype: torch.dtype | None = None, compile: bool | None = None,
                cuda_graphs: bool | None = None, decode_attention: str = "auto", decode_linear: str = "auto",
                kv_cache_dtype: str = "auto", kernel_tuning: bool = False,
                prefill_chunk_tokens: int = 32768) -> DecodePlan:
    """The plan for a model of config `cfg` on `device`, or a UserError naming the option that cannot run."""
    on_cuda = device.type == "cuda"
    if cuda_graphs and not on_cuda:
        raise UserError("CUDA graphs need a CUDA device, but the model is on the CPU; "
                        "use cuda_graphs=off (or auto) on a CPU")
    for name, value, choices in (("decode_attention", decode_attention, DECODE_ATTENTION),
                                 ("decode_linear", decode_linear, DECODE_LINEAR),
                                 ("kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES)):
        if value not in choices:
            raise UserError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    if kv_cache_dtype == "fp8" and (getattr(cfg, "conv_layers", ()) or getattr(cfg, "delta_layers", ())):
        raise UserError("kv_cache_dtype=fp8 with short-convolution or recurrent layers (model.conv_layers, "
                        "model.delta_layers): their cache holds the convolutions' inputs, which are not stored in "
                        "FP8; use kv_cache_dtype=auto")
    if kv_cache_dtype == "fp8" and getattr(cfg, "cca_kernels", ()):
        raise UserError("kv_cache_dtype=fp8 with ZAYA's convolutional attention (model.cca_kernels): its cache holds "
                        "each token's raw q, k and delayed values beside the keys, which are not stored in FP8; use "
                        "kv_cache_dtype=auto")
    if kv_cache_dtype == "fp8" and getattr(cfg, "kv_compress_rates", ()):
        raise UserError("kv_cache_dtype=fp8 with compressed layers (model.kv_compress_rates): their cache holds the "
                        "compressor's projections beside the keys, which are not stored in FP8; use "
                        "kv_cache_dtype=auto")
    layerwise = layerwise_attention(cfg)
    if kv_cache_dtype == "fp8" and layerwise:
        raise UserError(f"kv_cache_dtype=fp8 with {layerwise}: the FP8 cache has one geometry for every layer and no "
                        f"shared layers; use kv_cache_dtype=auto")
    if prefill_chunk_tokens < 1:
        raise UserError(f"prefill_chunk_tokens must be >= 1, got {prefill_chunk_tokens}")
    if dtype is None:
        dtype = torch.bfloat16 if on_cuda and torch.cuda.is_bf16_supported() else torch.float32
    compile = on_cuda if compile is None else compile
    attention = _attention(decode_attention, cfg, device, compile, dtype)
    return DecodePlan(device=device, dtype=dtype, compile=compile,
                      cuda_graphs=on_cuda if cuda_graphs is None else cuda_graphs, attention=attention,
                      linear=_linear(decode_linear, cfg, device, attention, dtype), kv_cache=kv_cache_dtype,
                      kernel_tuning=kernel_tuning and compile, prefill_chunk_tokens=prefill_chunk_tokens)


def _attention(choice: str, cfg, device: torch.device, compile: bool, dtype: torch.dtype) -> str:
    """"triton" or "matmul": triton asked for where it cannot run is an error; auto takes it where the step is
    compiled for a GPU that runs it."""
    if choice == "matmul" or (choice == "auto" and not (compile and device.type == "cuda")):
        return "matmul"
    reason = _triton_attention_unsupported(cfg, device, dtype)
    if reason is None:
        return "triton"
    if choice == "triton":
        raise UserError(reason)
    return "matmul"


def layerwise_attention(cfg) -> str | None:
    """Gemma 4's and Gemma 3n's attention and block options (and Step 3.5's windowed head count), which redline's
    decode kernels and FP8 cache do not take, by name, or None."""
    for name in ("global_head_size", "global_kv_head", "window_n_head", "global_values_from_keys", "v_norm",
                 "kv_shared_layers", "per_layer_embd", "layer_scalars", "moe_beside_dense", "altup_streams", "laurel_rank",
                 "mlp_sparsity"):
        if getattr(cfg, name, 0):
            return f"model.{name}"
    return None


def _triton_attention_unsupported(cfg, device: torch.device, dtype: torch.dtype) -> str | None:
    # (what the kernel's prologue cannot compute, cache.kernel_prologue_unsupported, the layer computes before it)
    if layerwise_attention(cfg):
        return (f"decode_attention triton has no {layerwise_attention(cfg)} (Gemma 4's layers); use decode_attention "
                f"matmul (or auto)")
    if getattr(cfg, "cca_kernels", ()):
        return ("decode_attention triton has no convolutional attention (model.cca_kernels: q, k and v read the "
                "cached inputs of the tokens before); use decode_attention matmul (or auto)")
    if getattr(cfg, "attn_key_bias", False):
        return ("decode_attention triton adds no key biases to its scores (model.attn_key_bias); use decode_attention "
                "matmul (or auto)")
    if getattr(cfg, "kv_conv", 0):
        return ("decode_attention triton attends over the keys and values it stores, not over convolutions of the "
                "cached projections (model.kv_conv); use decode_attention matmul (or auto)")
    if getattr(cfg, "rel_bias_dim", 0):
        return ("decode_attention triton adds no relative-position bias to its scores (model.rel_bias_dim); use "
                "decode_attention matmul (or auto)")
    if getattr(cfg, "diff_attention", False):
        return ("decode_attention triton has no differential attention (model.diff_attention); use decode_attention "
                "matmul (or auto)")
    if getattr(cfg, "attn_softcap", 0):
        return ("decode_attention triton has no soft-cap of the scores (model.attn_softcap); use decode_attention "
                "matmul (or auto)")
    if getattr(cfg, "attn_sinks", False):
        return ("decode_attention triton has no sink logits in its softmax (model.attn_sinks); use decode_attention "
                "matmul (or auto)")
    if getattr(cfg, "shared_kv_attention", False):
        return ("decode_attention triton has no DeepSeek-V4 attention (model.shared_kv_attention: queries through a "
                "normed latent, no raw qkv projection); use decode_attention matmul (or auto)")
    if getattr(cfg, "kv_lora_rank", 0):
        return ("decode_attention triton does not read latent attention's cache (one head of model.kv_lora_rank + "
                "rope_dims, the queries absorbed); use decode_attention matmul (or auto)")
    if getattr(cfg, "reference_window", False):
        return ("decode_attention triton masks by the sliding window alone, not the prompt beside it "
                "(model.reference_window); use decode_attention matmul (or auto)")
    if getattr(cfg, "attn_chunk", 0):
        return ("decode_attention triton masks by a sliding window, not by chunks (model.attn_chunk); use "
                "decode_attention matmul")
    if getattr(cfg, "pos_emb", "rope") == "alibi":
        return ("decode_attention triton adds no ALiBi bias to its scores (model.pos_emb=alibi); use "
                "decode_attention matmul (or auto)")
    if device.type != "cuda":
        return "decode_attention triton runs on CUDA GPUs only; on the CPU use matmul"
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"decode_attention triton computes in bf16, fp16 or fp32, not {dtype}; use matmul"
    try:
        import redline.inference.kernels.decode_attention as kernel
    except ImportError as e:
        return f"decode_attention triton needs the triton package, which failed to import ({e}); use matmul"
    return kernel.check_supported(cfg.head_dim, device)


def _linear(choice: str, cfg, device: torch.device, attention: str, dtype: torch.dtype) -> str:
    """"triton" or "torch" for decode_linear: triton asked for where it cannot run is an error, auto picks it where
    it can (a GPU, redline's attention kernel, an architecture the fused block computes)."""
    if choice == "torch":
        return choice
    from redline.inference.kernels.fused_block import unsupported

    reason = unsupported(cfg)
    if getattr(cfg, "value_tables", 0):  # no machine or other option lifts this one: name it first
        pass
    elif device.type != "cuda":
        reason = "decode_linear triton runs on CUDA GPUs only"
    elif attention != "triton":
        reason = "decode_linear triton works with decode_attention triton (it hands the kernel the qkv output)"
    elif dtype not in (torch.bfloat16, torch.float16, torch.float32):
        reason = f"decode_linear triton computes in bf16, fp16 or fp32, not {dtype}"
    if reason is None:
        try:
            import redline.inference.kernels.linear  # noqa: F401  (registers torch.ops.redline.gemv)
        except ImportError as e:
            reason = f"decode_linear triton needs the triton package, which failed to import ({e})"
    if reason is None:
        return "triton"
    if choice == "triton":
        raise UserError(reason + "; use decode_linear torch (or auto, which picks it where it can run)")
    return "torch"
