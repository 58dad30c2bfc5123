"""From command-line options to a ready engine: device, dtype, compile and CUDA-graph choices (checked against
the machine), a checkpoint loaded with its tokenizer (checked against any --tokenizer override), and the sampling
its generation_config.json recommends."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

import torch

from redline.errors import UserError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def expand_bool_flags(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """Booleans take values on redline's command lines (`--stream False`); also accept `--no-stream` for these
    names (a bare `--stream` is config.parse's, for every boolean field)."""
    out = []
    for arg in argv:
        name = arg.removeprefix("--no-")
        out += [f"--{name}", "False"] if arg.startswith("--no-") and name in names else [arg]
    return out


@dataclass
class RuntimeOptions:
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to run (auto: CUDA when present)."""
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    """Weights, activations and KV cache (auto: bf16 on a GPU that has it, fp32 on a CPU)."""
    compile: Literal["auto", "on", "off"] = "auto"
    """torch.compile each block's prefill and decode step (auto: on for CUDA, off on a CPU)."""
    cuda_graphs: Literal["auto", "on", "off"] = "auto"
    """Capture the decode step in a CUDA graph (auto: on for CUDA; needs a GPU)."""
    cpu_threads: int = 0
    """CPU only: PyTorch threads (0: PyTorch's default). 1 is often as fast for small models, and immune to
    other processes busy on the same cores (which can slow tiny multi-threaded ops down a hundredfold)."""
    decode_attention: Literal["auto", "matmul", "triton"] = "auto"
    """How a decode step attends over the cache (auto: triton when the step is compiled for a GPU that runs it,
    else matmul): matmul (q·Kᵀ, masked softmax, ·V, fused by torch.compile; the portable path) or triton
    (redline's own decode kernel: one kernel per layer from the qkv projection's output, with QK-norm, RoPE and the
    cache write inside, split-K at batch 1; CUDA only, power-of-two head widths). Both group query heads per kv
    head, so the cache is read once per kv head."""
    decode_linear: Literal["auto", "torch", "triton"] = "auto"
    """How the decode step computes its Linear layers (auto: triton where it can run): torch (cuBLAS, or
    Inductor's reductions under --kernel-tuning on) or triton (redline's kernels up to 64 rows: at batch 1 a
    matrix-vector kernel with the norm before the product and the bias, activation and residual add after it,
    five kernels per block with the attention kernel; for a batch a tiled kernel with the same epilogue; CUDA
    only, with decode-attention triton, pre-norm fused-qkv models)."""
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    """What the KV cache stores (auto: the model's dtype): fp8 stores keys and values as float8_e4m3fn with an fp32
    scale per token and kv head, about half a bf16 cache's bytes: more sequences fit, and decoding that is bound
    by reading the cache (large batches, long contexts) gets faster, at a cost in accuracy that `redline eval
    --kv-cache-dtypes auto fp8` measures on your checkpoint. Works on every device and decode-attention path
    (the Triton kernel reads it as it is; matmul dequantises the attended width)."""
    kernel_tuning: Literal["on", "off"] = "off"
    """Let Inductor tune the decode step's generated kernels by coordinate descent (longer compilation); with it
    and --decode-linear torch, batch 1's matrix-vector products become tuned Triton reductions instead of cuBLAS
    calls (BENCHMARKS.md compares it with redline's own kernel, the default). GPU only."""

    def resolve_device(self) -> torch.device:
        from redline.hardware import resolve_device

        device = resolve_device(self.device)  # raises a clear error for device=cuda without a GPU
        if device.type != "cuda" and self.cuda_graphs == "on":
            raise UserError("--cuda-graphs on needs a CUDA GPU, and this run is on the CPU; "
                            "drop it (auto) or pass --cuda-graphs off")
        if device.type != "cuda" and self.dtype == "fp16":
            raise UserError("--dtype fp16 is for GPUs; on the CPU use fp32 (or bf16)")
        if self.cpu_threads < 0:
            raise UserError(f"--cpu-threads must be >= 0 (0: PyTorch's default), got {self.cpu_threads}")
        if device.type == "cpu" and self.cpu_threads:
            torch.set_num_threads(self.cpu_threads)
        return device

    def engine(self, model):
        """An InferenceEngine for a model already on its device (run in the chosen dtype; a copy if it is not in
        it already)."""
        from redline.inference.engine import InferenceEngine

        device = next(model.parameters()).device
        if self.dtype == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise UserError("--dtype bf16 but this GPU has no bf16 support; use --dtype fp16 or fp32")
        flag = {"auto": None, "on": True, "off": False}
        return InferenceEngine(model, dtype=DTYPES.get(self.dtype), compile=flag[self.compile],
                               cuda_graphs=flag[self.cuda_graphs], decode_attention=self.decode_attention,
                               kernel_tuning=self.kernel_tuning == "on",
                               decode_linear=self.decode_linear, kv_cache_dtype=self.kv_cache_dtype)


def load_generator(checkpoint: str | None, tokenizer_spec: str | None, runtime: RuntimeOptions):
    """(TextGenerator, TrainConfig) for a checkpoint; the tokenizer must be the one the checkpoint was trained with."""
    from redline.inference.text import TextGenerator
    from redline.tokenizer import load_tokenizer
    from redline.training.checkpoint import load_for_inference, read_meta, resolve_checkpoint

    if not checkpoint:
        raise UserError("give --checkpoint: a run directory (its newest checkpoint) or RUN/checkpoints/step_N")
    device = runtime.resolve_device()
    ckpt = resolve_checkpoint(checkpoint)
    expected = read_meta(ckpt).get("tokenizer_identity")
    override = load_tokenizer(tokenizer_spec) if tokenizer_spec else None  # fail early, before the weights load
    if override is not None and expected and override.identity != expected:
        raise UserError(
            f"--tokenizer {tokenizer_spec} (identity {override.identity[:12]}) is not the tokenizer checkpoint "
            f"{ckpt} was trained with (identity {expected[:12]}); drop --tokenizer to use the checkpoint's own"
        )
    model, tokenizer, train_cfg = load_for_inference(ckpt, device)
    if expected and tokenizer.identity != expected:
        raise UserError(f"the tokenizer stored in {ckpt} (identity {tokenizer.identity[:12]}) does not match its "
                        f"meta.json ({expected[:12]}); the checkpoint is damaged, use another one")
    return TextGenerator(runtime.engine(model), override or tokenizer), train_cfg


def recommended_sampling(checkpoint: str) -> dict:
    """The sampling settings the checkpoint's generation_config.json recommends (inference/sampling.py
    model_sampling_defaults): an imported model's, or that of the one a run started from."""
    from redline.inference.sampling import model_sampling_defaults
    from redline.training.checkpoint import generation_config, resolve_checkpoint

    return model_sampling_defaults(generation_config(resolve_checkpoint(checkpoint)))


def checkpoint_sampling(options, fallback: dict, command: str):
    """SamplingParams for a command's options (inference/sampling.py sampling_from: given, else the checkpoint's
    recommended_sampling, else `fallback`), saying on stderr what it took from the model."""
    from redline.inference.sampling import sampling_from

    params, taken = sampling_from(options, fallback, recommended_sampling(options.checkpoint))
    if taken:
        settings = ", ".join(f"{k} {getattr(params, k):g}" for k in taken)
        print(f"{command}: {settings}, from the model's generation_config.json (set them to override)",
              file=sys.stderr)
    return params
