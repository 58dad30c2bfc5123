"""The KV-cache inference engine: prefill the prompts once, then decode one token per step from a static cache.

How it works
- Prompts of different lengths are left-padded to one length T (with compilation on, T is rounded up to a
  length bucket so the compiled prefill sees few shapes). Row b's prompt fills cache slots [pad_b, T) and its
  positions are `slot - pad_b`, so RoPE and learned position tables see exactly the positions the row would
  see alone, at every offset.
- The cache is static and allocated once per (batch, capacity): per layer k and v of shape (B, KV, S, D) with
  KV = n_kv_head, so GQA/MQA models store n_head/n_kv_head times less. S = T + max_new_tokens (rounded up to
  a bucket when compiling).
- Decode step t writes slot T + t - 1 of every row and attends over the first W slots of the buffer under
  the boolean mask `pad_b <= slot <= current` (and `current - slot < sliding_window` for sliding-window
  models). W is the filled length rounded up to a multiple of 64, so shapes change only every 64 steps: the
  whole step (embedding, every block, head) is captured in one CUDA graph per width and replayed, and early
  steps never read the empty end of the cache.
- Single-token attention lays the H/KV query heads that share a kv head out as H/KV query rows of it:
  (B, KV, H/KV, D) @ (B, KV, D, W) -> softmax -> @ (B, KV, W, D), so each cached kv head is read once and
  never expanded (the grouping of SDPA's enable_gqa: query head h uses kv head h // (H/KV)).
- On a GPU, decode attention is by default redline's own Triton kernel (inference/triton_decode.py): one
  kernel per layer from the qkv projection's output to the attention output (QK-norm, RoPE, the cache write
  and the attention, the mask computed inside from the padding, slot and window); "matmul" (the products and
  softmax above, fused by torch.compile) is the portable path and the CPU's.
- A decode step's Linear layers read their whole weights for a few rows (batch 1: a matrix-vector product),
  so they are bound by memory and by latency, not by flops. decode_linear "triton" (the default where it can
  run) computes each with redline's own kernels (inference/triton_gemv.py) up to LINEAR_KERNEL_MAX_BATCH rows:
  at batch 1 a matrix-vector kernel with the norm before the product and the bias, activation and residual add
  after it fused in (a pre-norm block is five kernels: four products and the attention kernel; the head one);
  for a batch a tiled tensor-core kernel with narrow column tiles (enough programs to keep every SM reading) and
  the same epilogue, the norms running before it. "torch" leaves them to cuBLAS (or, under kernel_tuning, to
  Inductor's generated reductions).
- kv_cache_dtype "fp8" stores keys and values as float8_e4m3fn with an fp32 scale per (row, kv head, slot)
  (quantize_kv): prefill quantises in its compiled block, the Triton kernel reads and writes the FP8 cache as it
  is, the other attention paths dequantise the attended width. score() decodes given tokens teacher-forced, to
  measure what that costs (`redline eval --kv-cache-dtypes`).
- The step writes the new key and value into each layer's whole cache buffer and slices the attended width
  inside (Inductor updates a buffer passed in in place; a written-to view passed in is copied back whole).
- On a GPU the model runs in bf16 and is torch.compile'd with dynamic batch, length and width dims. With
  compile_scope "block" (the default) each block's prefill and decode step, the step's embedding and mask, and
  its head are compiled apart: the same compiled block serves every layer (regional compilation: compile time
  does not grow with depth). "step" compiles the whole decode step as one graph. kernel_tuning turns on
  Inductor's coordinate-descent tuning (with decode_linear torch, batch 1's matrix-vector products then become
  tuned Triton reductions; Linear layers with a bias are made to add it after the product, or they would stay
  cuBLAS calls).
  On a CPU the same code runs eagerly, attending over exactly the filled slots.
- Greedy decoding takes the argmax inside the step (and its graph) and feeds it back as the next input; other
  sampling runs on the device after each step. The host synchronises only every `sync_every` steps (every
  step when a callback streams tokens) to learn which rows hit a stop token, so the CPU queues work ahead.

`naive_generate` is the baseline: no cache, the whole sequence recomputed for every new token.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F

from redline.errors import UserError
from redline.inference.sampling import SamplingParams, make_generator, sample_next
from redline.model import GPT, Block, rope_tables, sdpa_context

WIDTH_STEP = 64  # compiled decode attends over the cache in widths that are multiples of this
# decode_linear triton runs the step's products in redline's kernels up to this batch (one row: matrix-vector;
# more: a tiled product with narrow column tiles); above it they are cuBLAS's
LINEAR_KERNEL_MAX_BATCH = 64
# the greedy step's argmax over a large vocabulary in spans (chunked_argmax) up to this batch: a program per row
# alone took 13 µs of GPT-2's batch-64 step on an H100 (64 programs, each reading its row's 50k logits)
ARGMAX_SPANS_MAX_BATCH = 64
DECODE_ATTENTION = ("auto", "matmul", "sdpa", "flex", "triton")
DECODE_LINEAR = ("auto", "torch", "triton")
KV_CACHE_DTYPES = ("auto", "fp8")
FP8_MAX = 448.0  # the largest float8_e4m3fn


def length_bucket(n: int, smallest: int = 16) -> int:
    """The smallest of 16, 24, 32, 48, 64, 96, 128, ... (powers of two and 1.5× them) that is >= n."""
    b = smallest
    while True:
        if b >= n:
            return b
        if b * 3 // 2 >= n:
            return b * 3 // 2
        b *= 2


@dataclass
class Generation:
    """One row's result."""

    tokens: list[int]
    """Generated token ids (a stop token that ended the row is not included)."""
    finish_reason: str
    """"stop_token" (a stop token came), "stop" (the on_tokens callback ended the row) or "length"."""
    prompt_tokens: int


@dataclass
class Timings:
    """Wall-clock seconds of the last generate call (host-synchronised, so GPU work is included)."""

    batch: int = 0
    prompt_len: int = 0
    """Longest prompt in the batch, in tokens."""
    steps: int = 0
    """Tokens generated per row (the first one from the prefill included)."""
    ttft_s: float = 0.0
    """Call start to the first token of every row on the host: prefill plus one sampling step."""
    decode_s: float = 0.0
    """First token to the last one on the host."""
    total_s: float = 0.0
    setup_s: float = 0.0
    """Part of total_s spent allocating the cache, compiling and capturing (0 once shapes are warm)."""

    @property
    def decode_tokens_per_s(self) -> float:
        """Per sequence: tokens after the first, over decode_s."""
        return (self.steps - 1) / self.decode_s if self.decode_s > 0 and self.steps > 1 else float("nan")


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys or values (..., D) -> (float8_e4m3fn (..., D), fp32 scales (...)): one scale per vector, its absolute
    maximum times fp32(1/448) (at least the smallest normal fp32, so a zero vector stays zero), x / scale rounded
    to e4m3. The Triton decode kernel quantises the step's new key and value exactly so (a product by a constant
    rounds the same everywhere; torch divides a CUDA tensor by a number as a product by its reciprocal)."""
    scale = (x.abs().amax(dim=-1).float() * (1.0 / FP8_MAX)).clamp_min(torch.finfo(torch.float32).tiny)
    return (x.float() / scale[..., None]).to(torch.float8_e4m3fn), scale


def dequantize_kv(x8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """quantize_kv's inverse, up to its rounding: (..., D) in dtype."""
    return (x8.float() * scale[..., None]).to(dtype)


class KVCache:
    """Static per-layer key/value buffers of shape (B, KV, S, D): only the n_kv_head heads are stored.

    dtype float8_e4m3fn: FP8 keys and values with one fp32 scale per (row, kv head, slot) (quantize_kv), in
    `scales`: per layer (k_scale, v_scale) of shape (B, KV, S); half the bytes of a bf16 cache, plus 4 bytes per
    head_dim elements."""

    def __init__(self, n_layer: int, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        # one slot more than is ever attended over: every width is then a strict view of the buffer, which
        # keeps the compiled decode step from specialising (and recompiling) on the full-buffer case
        shape = (batch, kv_heads, capacity + 1, head_dim)
        # zeros, not empty: masked slots are multiplied by 0 in p @ V, and 0 * NaN from stale memory is NaN
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.scales = None  # per layer (k_scale, v_scale), FP8 only
        if dtype == torch.float8_e4m3fn:
            self.scales = [tuple(torch.zeros(shape[:-1], device=device) for _ in range(2)) for _ in range(n_layer)]
        self.batch, self.capacity = batch, capacity

    @property
    def nbytes(self) -> int:
        scales = [t for pair in self.scales or () for t in pair]
        return sum(t.numel() * t.element_size() for t in self.k + self.v + scales)

    def write(self, layer: int, rows: slice, k, v) -> None:
        """Store k, v (b, KV, T, D) in slots [0, T) of `rows`; for an FP8 cache k and v are quantize_kv's pairs."""
        if self.scales is None:
            T = k.shape[2]
            self.k[layer][rows, :, :T].copy_(k)
            self.v[layer][rows, :, :T].copy_(v)
            return
        for buf, scales, (x8, scale) in ((self.k[layer], self.scales[layer][0], k),
                                         (self.v[layer], self.scales[layer][1], v)):
            T = x8.shape[2]
            buf[rows, :, :T].copy_(x8)
            scales[rows, :, :T].copy_(scale)


@dataclass
class _DecodeState:
    """Everything one (batch, capacity) shape needs; the CUDA graphs read and write only these tensors."""

    cache: KVCache
    tokens: torch.Tensor  # (B, 1) input token of the step
    slot: torch.Tensor  # (1,) cache slot the step writes (shared by all rows: prompts are left-padded)
    pad: torch.Tensor  # (B,) left padding of each row; position = slot - pad
    slots: torch.Tensor  # (S,) 0..S-1, for the mask
    history: torch.Tensor  # (B, S + 1) the token at each slot; a greedy step writes its argmax at slot + 1
    counts: torch.Tensor | None = None  # int32 zeros the "triton" decode kernel counts finished spans in
    graphs: dict = field(default_factory=dict)  # (width, greedy) -> (CUDAGraph, its outputs)
    pool: object = None  # one memory pool shared by the graphs of every width (they never run concurrently)
    warm: set = field(default_factory=set)  # shapes already compiled


# ----------------------------------------------------------------------------------------------------
# the per-block functions (compiled once on a GPU and reused by every layer)


def _block_forward(block: Block, x: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Block.forward with the attention core swapped for `attend(h) -> (B, T, H*D)` (dropout is off in eval)."""
    if block.pre:
        x = x + block.attn.proj(attend(block.norm1(x)))
        return x + block.mlp(block.norm2(x))
    x = block.norm1(x + block.attn.proj(attend(x)))
    return block.norm2(x + block.mlp(x))


def cached_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor,
                     impl: str = "matmul", bounds: tuple | None = None) -> torch.Tensor:
    """One query token against the cache. q: (B, H, 1, D); caches (B, KV, W, D); mask (B, 1, 1, W) bool
    -> (B, 1, H*D). bounds (pad (B,), slot (1,), window int): the same mask as ranges, which "flex" reads
    inside its kernel (the mask tensor is then not read). The H/KV query heads of a kv head are laid out as H/KV
    query rows of that head, so the cache is read once per kv head and never expanded (query head h uses kv head
    h // (H/KV), as enable_gqa).

    impl "matmul": q·Kᵀ, masked fp32 softmax, ·V written out; "sdpa": the same through
    F.scaled_dot_product_attention with the mask (one fused kernel where the backend allows); "flex":
    FlexAttention with the mask applied as a score modification from `bounds` (compiled, its decoding kernel
    splits the cache length across thread blocks and packs the query heads of a kv head together). ("triton",
    redline's own kernel, starts from the projections instead: see _triton_attend.)"""
    B, H, _, D = q.shape
    KV = k_cache.shape[1]
    if impl == "flex":
        from torch.nn.attention.flex_attention import flex_attention

        pad, slot, window = bounds

        def masked(score, b, h, q_idx, kv_idx):
            keep = (kv_idx >= pad[b]) & (kv_idx <= slot[0])
            if window > 0:
                keep = keep & (slot[0] - kv_idx < window)
            return torch.where(keep, score, -float("inf"))

        y = flex_attention(q, k_cache, v_cache, score_mod=masked, enable_gqa=KV != H)
        return y.reshape(B, 1, H * D)  # (B, H, 1, D): one query token, so heads are already in order
    qg = q.reshape(B, KV, H // KV, D)  # head h = kv * (H/KV) + g
    if impl == "sdpa":
        return F.scaled_dot_product_attention(qg, k_cache, v_cache, attn_mask=mask).reshape(B, 1, H * D)
    scores = torch.matmul(qg, k_cache.transpose(-1, -2)) * (D ** -0.5)  # (B, KV, H/KV, W)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)).masked_fill(~mask, float("-inf"))
    probs = F.softmax(scores, dim=-1).to(v_cache.dtype)
    return torch.matmul(probs, v_cache).reshape(B, 1, H * D)  # (B, KV, H/KV, D) -> (B, 1, H*D)


def _triton_attend(attn, h, rope, k_cache, v_cache, slot, pad, counts, width: int, scales=None) -> torch.Tensor:
    """redline's decode kernel for one layer: h (B, 1, C) -> (B, 1, H*D). The kernel takes the projections as
    they are and does QK-norm, RoPE, the cache write and the attention itself (inference/triton_decode.py)."""
    # one (B, (H + 2·KV)·D) input: the fused layer's output as it is (splitting it first can make Inductor copy
    # each part out); separate q, k, v layers are concatenated
    qkv = attn.qkv(h) if attn.cfg.fused_qkv else torch.cat(attn.project(h), dim=-1)
    return _triton_attention(attn, qkv, rope, k_cache, v_cache, slot, pad, counts, width, scales)[:, None]


def _triton_attention(attn, qkv, rope, k_cache, v_cache, slot, pad, counts, width: int, scales=None) -> torch.Tensor:
    """The decode kernel from the qkv projection's output (B, 1 or none, (H + 2·KV)·D) -> (B, H*D). scales: an
    FP8 cache's (k_scale, v_scale), or None."""
    B = qkv.shape[0]
    cos, sin = (t.reshape(B, -1) for t in rope) if rope is not None else (None, None)  # (B, D/2) each
    norms, eps = (None, None), 0.0
    if attn.cfg.qk_norm:
        norms = (attn.q_norm.weight, attn.k_norm.weight)
        eps = attn.q_norm.eps if attn.q_norm.eps is not None else torch.finfo(qkv.dtype).eps
    if scales is not None:
        return torch.ops.redline.decode_attention_fp8(qkv.view(B, -1), k_cache, v_cache, *scales, pad, slot, counts,
                                                      width, attn.cfg.sliding_window, eps, *norms, cos, sin)
    return torch.ops.redline.decode_attention(qkv.view(B, -1), k_cache, v_cache, pad, slot, counts, width,
                                              attn.cfg.sliding_window, eps, *norms, cos, sin)


_MATVEC_ACT = {"gelu": "gelu_tanh", "relu2": "relu2", "swiglu": "swiglu"}


def matvec_unsupported(cfg) -> str | None:
    """Why decode_linear "triton" cannot run this architecture, or None."""
    if cfg.norm_position != "pre":
        return "decode_linear triton needs pre-norm blocks (the norm is fused into the next product)"
    if not cfg.fused_qkv:
        return "decode_linear triton needs a fused qkv projection (model.fused_qkv)"
    if cfg.mlp == "swiglu" and not cfg.fused_mlp:
        return "decode_linear triton needs SwiGLU's gate and up in one matrix (model.fused_mlp)"
    if cfg.mlp not in _MATVEC_ACT:
        return f"decode_linear triton has no fused {cfg.mlp} activation"
    return None


def product_counters_needed(cfg) -> int:
    """Counters the batched product kernel's split-K needs for this model's block layers, at any batch up to
    LINEAR_KERNEL_MAX_BATCH: one per output tile, of 16 x 16 at the smallest (triton_gemv.gemv_split)."""
    widest = max((cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim, cfg.n_embd, cfg.hidden_dim)
    return -(-LINEAR_KERNEL_MAX_BATCH // 16) * -(-widest // 16)


def _norm_args(norm) -> tuple:
    """The gemv op's (norm, weight, bias, eps) for a LayerNorm or RMSNorm module, rounded as the module rounds."""
    if isinstance(norm, torch.nn.RMSNorm):
        eps = norm.eps if norm.eps is not None else torch.finfo(norm.weight.dtype).eps
        return "rmsnorm", norm.weight, None, eps
    return "layernorm", norm.weight, norm.bias, norm.eps


def _matvec_block(block: Block, x, attention, counts) -> torch.Tensor:
    """A pre-norm block in four product kernels of redline's own and the attention kernel: x (B, 1, C), B up to
    LINEAR_KERNEL_MAX_BATCH.

    Each product adds its bias, activation and residual after it in the same kernel (inference/triton_gemv.py)
    and, for one row, applies the norm before it too (LayerNorm or RMSNorm): for a batch the norm runs first, in
    its own kernel, as every program of the batched product would compute the rows' statistics again (about 3x
    slower on an H100), and the product splits a long K where that pays (counts: its int32 zeros, at least
    product_counters_needed). `attention(qkv)` -> (B, H*D)."""
    attn, mlp = block.attn, block.mlp
    B = x.shape[0]

    def product(h, layer, residual=None, act="none", norm=None):
        if B > 1:
            return torch.ops.redline.gemv_split(h if norm is None else norm(h), layer.weight, counts, layer.bias,
                                                residual, act)
        return torch.ops.redline.gemv(h, layer.weight, layer.bias, residual, act,
                                      *(_norm_args(norm) if norm is not None else ()))

    h = x.view(B, -1)
    qkv = product(h, attn.qkv, norm=block.norm1)
    h = product(attention(qkv), attn.proj, h)
    u = product(h, mlp.fc, act=_MATVEC_ACT[mlp.kind], norm=block.norm2)
    return product(u, mlp.proj, h).view(B, 1, -1)


def _decode_block(block: Block, x, rope, mask, k_cache, v_cache, slot, impl: str = "matmul", pad=None,
                  counts=None, matvec: bool = False, scales=None):
    """x: (B, 1, C). Writes this step's k/v into slot `slot` of the layer's whole cache buffer, then attends over
    its first W slots, W = mask.shape[-1] (pad: (B,) left padding, needed by impl "flex" and "triton"; counts:
    the "triton" kernel's counter buffer; matvec: up to LINEAR_KERNEL_MAX_BATCH rows, the block's products in
    redline's kernels;
    scales: an FP8 cache's (k_scale, v_scale) buffers, or None).

    The write goes to the buffer itself, not to a view of it: Inductor then updates it in place, where a write
    into a view passed in is copied back whole (the full cache, twice per layer and step)."""

    if matvec and x.shape[0] <= LINEAR_KERNEL_MAX_BATCH:
        return _matvec_block(block, x, lambda qkv: _triton_attention(block.attn, qkv, rope, k_cache, v_cache, slot,
                                                                     pad, counts, mask.shape[-1], scales), counts)

    def attend(h):
        if impl == "triton":
            return _triton_attend(block.attn, h, rope, k_cache, v_cache, slot, pad, counts, mask.shape[-1], scales)
        q, k, v = block.attn.project_qkv(h, rope)  # q (B, H, 1, D); k, v (B, KV, 1, D)
        W = mask.shape[-1]
        if scales is None:
            k_cache[:, :, slot] = k
            v_cache[:, :, slot] = v
            keys, values = k_cache[:, :, :W], v_cache[:, :, :W]
        else:  # FP8: store the quantised vectors, attend to the whole width dequantised (what was stored)
            (k8, k_scale), (v8, v_scale) = quantize_kv(k), quantize_kv(v)
            k_cache[:, :, slot], scales[0][:, :, slot] = k8, k_scale
            v_cache[:, :, slot], scales[1][:, :, slot] = v8, v_scale
            keys = dequantize_kv(k_cache[:, :, :W], scales[0][:, :, :W], q.dtype)
            values = dequantize_kv(v_cache[:, :, :W], scales[1][:, :, :W], q.dtype)
        return cached_attention(q, keys, values, mask, impl, (pad, slot, block.attn.cfg.sliding_window))

    return _block_forward(block, x, attend)


def _head_logits(model: GPT, x: torch.Tensor, matvec: bool = False) -> torch.Tensor:
    """x: (B, 1, C) -> (B, vocab_size) in fp32 (fp64 for an fp64 model). matvec: up to LINEAR_KERNEL_MAX_BATCH
    rows, the head in redline's kernel (at batch 1 with the final norm in it; see _matvec_block)."""
    if matvec and x.shape[0] == 1:
        logits = torch.ops.redline.gemv(x.view(1, -1), model.lm_head.weight, None, None, "none",
                                        *_norm_args(model.norm_f))
    elif matvec and x.shape[0] <= LINEAR_KERNEL_MAX_BATCH:  # the norm first (see _matvec_block)
        logits = torch.ops.redline.gemv(model.norm_f(x).view(x.shape[0], -1), model.lm_head.weight)
    else:
        logits = model.lm_head(model.norm_f(x))[:, -1]
    logits = logits[:, : model.cfg.vocab_size]
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


class _LinearThenBias(torch.nn.Linear):
    """A Linear computing x·Wᵀ, then adding the bias: a plain matrix product Inductor can turn into a reduction."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight) + self.bias


def split_linear_bias(model: torch.nn.Module) -> int:
    """Make every Linear layer with a bias compute x·Wᵀ, then add the bias (in place; returns how many).

    Under kernel tuning Inductor computes a one-row product (batch 1's decode step) as a tuned Triton reduction,
    with what follows fused in, but only for a plain matrix product: a Linear with a bias is one addmm, which it
    leaves to cuBLAS. Split apart, the product becomes a reduction and the bias is fused into it. The layers'
    class is changed, not their forward: every block keeps the same code, so the one compiled block serves all.
    The result is the same sum, rounded once more in bf16 at most."""
    n = 0
    for m in model.modules():
        if type(m) is torch.nn.Linear and m.bias is not None:
            m.__class__ = _LinearThenBias
            n += 1
    return n


def _load_triton_decode(head_dim: int, device: torch.device) -> None:
    """Register torch.ops.redline.decode_attention, or raise a UserError saying why it cannot run here."""
    if device.type == "cuda":
        try:
            import redline.inference.triton_decode as triton_decode
        except ImportError as e:
            raise UserError(f"decode_attention triton needs the triton package, which failed to import ({e}); "
                            "install triton or use matmul") from None
        reason = triton_decode.check_supported(head_dim, device)
    else:
        reason = "decode_attention triton runs on CUDA GPUs only; on the CPU use matmul or sdpa"
    if reason:
        raise UserError(reason)


def _decode_inputs(model: GPT, tokens, slot, pad, slots, impl: str = "matmul"):
    """The step's embeddings x (B, 1, C), RoPE tables and attention mask (B, 1, 1, W): row b attends to slots
    pad_b..slot (and within the sliding window). impl "triton": the kernel computes the mask itself and reads
    only its width, so the slots stand in for it (a view: no kernel)."""
    positions = (slot - pad).unsqueeze(1)  # (B, 1)
    x, rope = model.embed(tokens, positions)
    if impl == "triton":
        return x, rope, slots.expand(tokens.shape[0], 1, 1, -1)
    mask = (slots >= pad[:, None]) & (slots <= slot)  # (B, W)
    if model.cfg.sliding_window > 0:
        mask = mask & (slot - slots < model.cfg.sliding_window)
    return x, rope, mask[:, None, None, :]


def chunked_argmax(logits: torch.Tensor, chunks: int = 64) -> torch.Tensor:
    """logits (B, V) -> (B,): argmax (the first maximum) in two steps, the maximum of each of `chunks` spans,
    then the first span holding the overall one. A one-row argmax compiled by Inductor runs as one program
    (12 µs over GPT-2's 50k vocab on an H100); spans spread it over the GPU."""
    B, V = logits.shape
    span = -(-V // chunks)
    padded = F.pad(logits, (0, span * chunks - V), value=float("-inf")).view(B, chunks, span)
    best, where = padded.max(dim=-1)
    chunk = best.argmax(dim=-1, keepdim=True)
    return chunk[:, 0] * span + where.gather(1, chunk)[:, 0]


def _decode_output(model: GPT, x, tokens, greedy: bool, matvec: bool, slot, history):
    """(logits (B, vocab) fp32, next tokens (B,) or None). greedy: also take the argmax and write it into
    `tokens`, the next step's input, and into `history` (B, S + 1) at slot + 1, then advance `slot` by one, so that
    greedy decoding runs entirely inside the step (and its graph): the host launches steps and nothing else.
    matvec: see _head_logits."""
    logits = _head_logits(model, x, matvec)
    if not greedy:
        return logits, None
    # over a large vocabulary, in spans up to ARGMAX_SPANS_MAX_BATCH rows (beyond, a program per row is enough)
    spans = logits.shape[0] <= ARGMAX_SPANS_MAX_BATCH and logits.shape[1] >= 8192
    nxt = chunked_argmax(logits) if spans else logits.argmax(dim=-1)
    tokens.copy_(nxt[:, None])
    history.index_copy_(1, slot + 1, nxt[:, None])
    slot.add_(1)
    return logits, nxt


def _decode_layers(model: GPT, tokens, slot, pad, slots, ks, vs, impl: str, greedy: bool, fns=None,
                   mark_dynamic=None, counts=None, matvec: bool = False, scales=None, history=None):
    """One decode step through the whole model: tokens (B, 1) at cache slot `slot` -> _decode_output's pair
    (greedy: the step also records its tokens in `history` and advances `slot`).

    slots: (W,) 0..W-1, the cache slots attended over; ks, vs: per layer, the whole cache buffers. fns: the
    (inputs, block, output) functions, each compiled alone (None: the plain ones, inlined when this whole
    function is compiled); mark_dynamic marks the blocks' other inputs' batch and width dims dynamic; counts:
    the "triton" kernel's counter buffer; matvec: the blocks and head in redline's product kernels (up to
    LINEAR_KERNEL_MAX_BATCH rows);
    scales: per layer, an FP8 cache's (k_scale, v_scale) (None: the cache is in the model's dtype)."""
    inputs_fn, block_fn, output_fn = fns or (_decode_inputs, _decode_block, _decode_output)
    x, rope, mask = inputs_fn(model, tokens, slot, pad, slots, impl)
    if mark_dynamic is not None:
        mark_dynamic((x, 0), *[(t, 0) for t in rope or ()], (mask, 0, 3))
    for block, k_cache, v_cache, layer_scales in zip(model.blocks, ks, vs, scales or [None] * len(ks)):
        x = block_fn(block, x, rope, mask, k_cache, v_cache, slot, impl, pad, counts, matvec, layer_scales)
    return output_fn(model, x, tokens, greedy, matvec, slot, history)


def _prefill_attention(attn, q, k, v, mask):
    """q (B, H, T, D), k/v (B, KV, T, D); mask None (plain causal) or (B, 1, T, T) bool -> (B, T, H*D)."""
    if mask is None:
        return attn.attend(q, k, v, None, is_causal=True)
    if attn.n_kv != attn.n_head:  # the kernels that take an explicit mask do not all take enable_gqa
        k = k.repeat_interleave(attn.n_head // attn.n_kv, dim=1)
        v = v.repeat_interleave(attn.n_head // attn.n_kv, dim=1)
    with sdpa_context(attn.cfg.attn_backend):
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    B, H, T, D = q.shape
    return y.transpose(1, 2).reshape(B, T, H * D)


def _prefill_block(block: Block, x, rope, mask, quantize: bool = False):
    """x: (B, T, C) -> (x, k, v) with k, v (B, KV, T, D) for the cache (quantize: quantize_kv's pairs instead, for
    an FP8 cache, in the same compiled function)."""
    kv = []

    def attend(h):
        q, k, v = block.attn.project_qkv(h, rope)
        kv.append((k, v))
        return _prefill_attention(block.attn, q, k, v, mask)

    x = _block_forward(block, x, attend)
    k, v = kv[0]
    return (x, quantize_kv(k), quantize_kv(v)) if quantize else (x, k, v)


def prefill_mask(T: int, pad: torch.Tensor, window: int) -> torch.Tensor:
    """(B, 1, T, T) bool, True where query i may attend key j: causal, not padding, inside the window.
    Padding queries attend to themselves only, which keeps their (never used) outputs finite."""
    i = torch.arange(T, device=pad.device)
    allowed = i[None, :] <= i[:, None]  # (T, T): key j <= query i
    if 0 < window < T:
        allowed = allowed & (i[:, None] - i[None, :] < window)
    allowed = allowed[None] & (i[None, None, :] >= pad[:, None, None])  # (B, T, T)
    allowed = allowed | torch.eye(T, dtype=torch.bool, device=pad.device)
    return allowed[:, None]


def _inductor_pdl(device: torch.device) -> bool:
    """Have Inductor launch the decode step's kernels with programmatic dependent launch too, as redline's own are
    (inference/triton_launch.py): on a GPU where those are, with a torch whose Inductor has the option. On an
    H100, gpt2-124m at batch 64 with the FP8 cache: 93.0k -> 97.2k tokens/s (its norms, embedding and argmax
    start while the kernel before them ends)."""
    import torch._inductor.config as inductor_config

    if device.type != "cuda" or not hasattr(inductor_config.triton, "enable_pdl"):
        return False
    try:
        from redline.inference.triton_launch import use_pdl
    except ImportError:  # (no triton: nothing is compiled for a GPU)
        return False
    return use_pdl(device)


def _compiled(fn: Callable, **options) -> Callable:
    """torch.compile(fn) for this engine alone, its shapes static except the dims marked dynamic.

    torch.compile keeps compiled code per code object and remembers per function (file, line, name) which
    shapes changed between compilations ("automatic dynamic"): a second engine in the process, for another
    model, would share the first one's recompile limit and recompile with its weights, head counts and cache
    made dynamic (slower kernels; and Inductor 2.11 fails scheduling the Triton ops with them). So each engine
    compiles a copy of fn with a code object of its own, and calls it with automatic dynamic shapes off; the
    batch, length and width dims stay dynamic, as they are marked so at each call."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    compiled = torch.compile(copy, fullgraph=True, **options)

    def call(*args, **kwargs):
        with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
            return compiled(*args, **kwargs)

    return call


# ----------------------------------------------------------------------------------------------------
# the engine


class InferenceEngine:
    """Batched generation with a static KV cache for any redline GPT.

    The model is put in eval mode and cast to `dtype` in place (the RoPE tables stay fp32). dtype None: bf16
    on a GPU that has it, fp32 elsewhere. compile / cuda_graphs None: on for CUDA, off on a CPU.
    decode_attention "auto": "triton" (our decode kernel) when compiling for a GPU where it can run, else
    "matmul". kv_cache_dtype "auto": the cache in the model's dtype; "fp8": float8_e4m3fn with a scale per token
    and kv head (quantize_kv), about half a bf16 cache's bytes, at a cost in accuracy (`redline eval
    --kv-cache-dtypes auto fp8` measures it on a checkpoint).
    """

    def __init__(self, model: GPT, *, dtype: torch.dtype | None = None, compile: bool | None = None,
                 cuda_graphs: bool | None = None, decode_attention: str = "auto",
                 compile_scope: str = "block", kernel_tuning: bool = False, prefill_chunk_tokens: int = 32768,
                 decode_linear: str = "auto", kv_cache_dtype: str = "auto"):
        self.model = model
        self.cfg = model.cfg
        self.device = next(model.parameters()).device
        on_cuda = self.device.type == "cuda"
        if cuda_graphs and not on_cuda:
            raise UserError("CUDA graphs need a CUDA device, but the model is on the CPU; "
                            "use cuda_graphs=off (or auto) on a CPU")
        if dtype is None:
            dtype = torch.bfloat16 if on_cuda and torch.cuda.is_bf16_supported() else torch.float32
        self.dtype = dtype
        self.compile = on_cuda if compile is None else compile
        self.cuda_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        if decode_attention not in DECODE_ATTENTION:
            raise UserError(f"decode_attention must be one of {', '.join(DECODE_ATTENTION)}, got {decode_attention!r}")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise UserError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
        self.kv_cache_dtype = kv_cache_dtype
        if compile_scope not in ("block", "step"):
            raise UserError(f"compile_scope must be block or step, got {compile_scope!r}")
        if decode_attention == "flex" and self.compile and not on_cuda:
            raise UserError("decode_attention flex compiles for CUDA GPUs only (Inductor's CPU FlexAttention "
                            "fails on the cache's dynamic width); on the CPU use matmul or sdpa, or compile off")
        if decode_attention == "auto":  # our kernel where the step is compiled for a GPU, plain PyTorch elsewhere
            decode_attention = "matmul"
            if self.compile and on_cuda:
                try:
                    _load_triton_decode(self.cfg.head_dim, self.device)
                    decode_attention = "triton"
                except UserError:
                    pass
        elif decode_attention == "triton":
            _load_triton_decode(self.cfg.head_dim, self.device)
        self.decode_attention = decode_attention
        self.decode_linear = self._resolve_decode_linear(decode_linear, dtype)
        self.compile_scope = compile_scope
        self.kernel_tuning = kernel_tuning and self.compile
        self.prefill_chunk_tokens = prefill_chunk_tokens
        model.eval()
        model.to(dtype)
        if self.kernel_tuning and on_cuda:
            split_linear_bias(model)
        if self.cfg.pos_emb == "rope":  # bf16 angles are too coarse at large positions: keep the tables fp32
            cos, sin = rope_tables(self.cfg)
            model.rope_cos, model.rope_sin = cos.to(self.device), sin.to(self.device)
        if self.compile:
            # the batch, length and width dims are marked dynamic at each call (_mark_dynamic), so one
            # compilation serves every size (dynamo specialises size-1 dims: batch 1 compiles apart)
            self._prefill_fn = _compiled(_prefill_block)
            # kernel tuning: Inductor tunes its generated kernels by coordinate descent, and (its own rule) then
            # computes one-row matrix products as Triton reductions, not cuBLAS (batch 1's Linear layers, where
            # decode_linear leaves them to PyTorch)
            options = {"coordinate_descent_tuning": self.kernel_tuning}
            if _inductor_pdl(self.device):
                options["triton.enable_pdl"] = True
            decode = partial(_compiled, options=options)
            if compile_scope == "block":  # the embedding and mask, each block, and the head (+ argmax) apart
                self._decode_fns = (decode(_decode_inputs), decode(_decode_block), decode(_decode_output))
                self._decode_all = _decode_layers
            else:  # the whole step in one graph: fusion across blocks, embedding, mask and head included
                self._decode_fns, self._decode_all = None, decode(_decode_layers)
        else:
            self._prefill_fn, self._decode_fns, self._decode_all = _prefill_block, None, _decode_layers
        self._state: _DecodeState | None = None
        self.last = Timings()

    def _resolve_decode_linear(self, choice: str, dtype: torch.dtype) -> str:
        """"triton" or "torch" for the decode_linear option; "triton" asked for where it cannot run is an error,
        "auto" picks it where it can (a GPU, redline's attention kernel, a pre-norm fused-qkv architecture)."""
        if choice not in DECODE_LINEAR:
            raise UserError(f"decode_linear must be one of {', '.join(DECODE_LINEAR)}, got {choice!r}")
        if choice == "torch":
            return choice
        reason = matvec_unsupported(self.cfg)
        if self.device.type != "cuda":
            reason = "decode_linear triton runs on CUDA GPUs only"
        elif self.decode_attention != "triton":
            reason = "decode_linear triton works with decode_attention triton (it hands the kernel the qkv output)"
        elif dtype not in (torch.bfloat16, torch.float16, torch.float32):
            reason = f"decode_linear triton computes in bf16, fp16 or fp32, not {dtype}"
        if reason is None:
            try:
                import redline.inference.triton_gemv  # noqa: F401  (registers torch.ops.redline.gemv)
            except ImportError as e:
                reason = f"decode_linear triton needs the triton package, which failed to import ({e})"
        if reason is None:
            return "triton"
        if choice == "triton":
            raise UserError(reason + "; use decode_linear torch (or auto, which picks it where it can run)")
        return "torch"

    # -- description -----------------------------------------------------------------------------------

    def describe(self) -> dict:
        return {"device": str(self.device), "dtype": str(self.dtype).removeprefix("torch."),
                "compile": self.compile, "compile_scope": self.compile_scope if self.compile else None,
                "kernel_tuning": self.kernel_tuning,
                "cuda_graphs": self.cuda_graphs, "decode_attention": self.decode_attention,
                "decode_linear": self.decode_linear, "kv_cache_dtype": self.kv_cache_dtype}

    @property
    def kv_cache_bytes(self) -> int:
        return self._state.cache.nbytes if self._state is not None else 0

    @property
    def cache_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn if self.kv_cache_dtype == "fp8" else self.dtype

    def kv_bytes_per_token(self) -> int:
        """Cache bytes one token of one sequence takes: 2 · layers · n_kv_head · (head_dim · itemsize, plus an
        fp32 scale for FP8)."""
        c = self.cfg
        per_head = c.head_dim * torch.empty((), dtype=self.cache_dtype).element_size()
        return 2 * c.n_layer * c.kv_heads * (per_head + 4 * (self.kv_cache_dtype == "fp8"))

    # -- validation ------------------------------------------------------------------------------------

    def check_prompts(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        ctx, vocab = self.cfg.context_len, self.cfg.vocab_size
        if not prompts:
            raise UserError("no prompts were given")
        if max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if max_new_tokens >= ctx:
            raise UserError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's "
                            f"context_len {ctx}; lower max_new_tokens")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise UserError(f"prompt {i} is empty; give at least one token (for example the end-of-text token)")
            if len(p) + max_new_tokens > ctx:
                raise UserError(
                    f"prompt {i} has {len(p)} tokens, which with max_new_tokens={max_new_tokens} exceeds the "
                    f"model's context_len {ctx}; shorten it to {ctx - max_new_tokens} tokens or lower max_new_tokens"
                )
            lo, hi = min(p), max(p)
            if lo < 0 or hi >= vocab:
                raise UserError(f"prompt {i} has token id {lo if lo < 0 else hi} outside the model's vocabulary "
                                f"[0, {vocab}); was it encoded with another tokenizer?")

    # -- state, prefill and the decode step ------------------------------------------------------------

    def release(self) -> None:
        """Free the KV cache and the CUDA graphs (the compiled code stays)."""
        self._state = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _state_for(self, batch: int, capacity: int) -> _DecodeState:
        """The cache and graphs for this batch size; a larger cache of the same batch size is reused as it is
        (decode reads only the filled width, so spare capacity costs memory, not time)."""
        st = self._state
        if st is not None and st.cache.batch == batch and st.cache.capacity >= capacity:
            return st
        del st
        self.release()  # free the old cache and graphs before allocating the new ones
        c, dev = self.cfg, self.device
        self._state = _DecodeState(
            cache=KVCache(c.n_layer, batch, c.kv_heads, capacity, c.head_dim, self.cache_dtype, dev),
            tokens=torch.zeros(batch, 1, dtype=torch.long, device=dev),
            slot=torch.zeros(1, dtype=torch.long, device=dev),
            pad=torch.zeros(batch, dtype=torch.long, device=dev),
            slots=torch.arange(capacity, device=dev),
            history=torch.zeros(batch, capacity + 1, dtype=torch.long, device=dev),
            counts=self._counters(),
        )
        return self._state

    def _counters(self) -> torch.Tensor | None:
        """The zeros the "triton" decode kernels count in (each leaves them zero, so the attention and the products
        share them); fixed in size, so the compiled step never specialises on it."""
        if self.decode_attention != "triton":
            return None
        from redline.inference.triton_decode import counters_needed

        n = counters_needed(self.cfg.kv_heads)
        if self.decode_linear == "triton":
            n = max(n, product_counters_needed(self.cfg))
        return torch.zeros(n, dtype=torch.int32, device=self.device)

    def _width(self, st: _DecodeState, slot: int) -> int:
        """How many cache slots the step at `slot` attends over: exactly slot + 1 when nothing is compiled or
        captured, else rounded up to a multiple of WIDTH_STEP (one CUDA graph per width), so early steps do
        not read the empty end of the cache."""
        if not (self.compile or self.cuda_graphs):
            return slot + 1
        return min(st.cache.capacity, -(-(slot + 1) // WIDTH_STEP) * WIDTH_STEP)

    def _decode_step(self, st: _DecodeState, width: int, greedy: bool):
        """(logits (B, vocab), next tokens or None) of the step that reads st.tokens and writes cache slot
        st.slot, attending over the first `width` slots; greedy: the argmax is taken and written to st.tokens and
        st.history, and st.slot advances by one."""
        ks, vs, scales = st.cache.k, st.cache.v, st.cache.scales
        slots = st.slots[:width]
        self._mark_dynamic((st.tokens, 0), (st.pad, 0), (slots, 0), (st.history, 0, 1), *[(t, 0, 2) for t in ks + vs],
                           *[(t, 0, 2) for pair in scales or () for t in pair])
        return self._decode_all(self.model, st.tokens, st.slot, st.pad, slots, ks, vs, self.decode_attention, greedy,
                                self._decode_fns, self._mark_dynamic if self._decode_fns else None, st.counts,
                                self.decode_linear == "triton", scales, st.history)

    def _warm_step(self, st: _DecodeState, width: int, greedy: bool) -> None:
        """Run the step without advancing anything: it rewrites the current slot with the same values, and the
        input tokens and the slot a greedy step changes are put back (what it writes into the history, the same
        step writes again)."""
        tokens, slot = st.tokens.clone(), st.slot.clone()
        self._decode_step(st, width, greedy)
        st.tokens.copy_(tokens)
        st.slot.copy_(slot)

    def _mark_dynamic(self, *specs) -> None:
        """Batch, length and width dims are dynamic for torch.compile: one compilation for all sizes (instead
        of dynamic=True, which would make head counts symbolic too). specs: (tensor, dim, ...)."""
        if not self.compile:
            return
        from torch._dynamo import maybe_mark_dynamic

        for tensor, *dims in specs:
            for d in dims:
                maybe_mark_dynamic(tensor, d)

    def _capture(self, st: _DecodeState, width: int, greedy: bool) -> None:
        """Warm up (compiling on the first call) on a side stream, then record the step in a CUDA graph
        (capturing runs nothing, so it changes nothing either)."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._warm_step(st, width, greedy)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if st.pool is None:
            st.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=st.pool):
            outputs = self._decode_step(st, width, greedy)
        st.graphs[width, greedy] = (graph, outputs)

    def _step(self, st: _DecodeState, width: int, greedy: bool):
        if self.cuda_graphs:
            graph, outputs = st.graphs[width, greedy]
            graph.replay()
            return outputs
        return self._decode_step(st, width, greedy)

    def _prepare_step(self, st: _DecodeState, width: int, greedy: bool) -> float:
        """Capture the graph (or compile) for this width if that has not happened yet; returns seconds spent."""
        if self.cuda_graphs and (width, greedy) not in st.graphs:
            t0 = time.perf_counter()
            self._capture(st, width, greedy)
            torch.cuda.synchronize(self.device)
            return time.perf_counter() - t0
        if self.compile and not self.cuda_graphs and ("decode", width, greedy) not in st.warm:
            t0 = time.perf_counter()
            self._warm_step(st, width, greedy)  # compiles on a new shape
            st.warm.add(("decode", width, greedy))
            return time.perf_counter() - t0
        return 0.0

    def _prefill(self, st: _DecodeState, tokens: torch.Tensor, pad: torch.Tensor, padded: bool) -> torch.Tensor:
        """tokens (B, T) left-padded -> last-position logits (B, vocab); fills cache slots [0, T).
        Rows go through in chunks of about prefill_chunk_tokens tokens to bound activation memory."""
        m = self.model
        B, T = tokens.shape
        rows = max(1, self.prefill_chunk_tokens // T)
        out = []
        for r0 in range(0, B, rows):
            r1 = min(B, r0 + rows)
            pd = pad[r0:r1]
            positions = (torch.arange(T, device=tokens.device)[None, :] - pd[:, None]).clamp(min=0)  # (b, T)
            x, rope = m.embed(tokens[r0:r1], positions)
            window = self.cfg.sliding_window
            mask = prefill_mask(T, pd, window) if padded or 0 < window < T else None
            self._mark_dynamic((x, 0, 1), *[(t, 0, 2) for t in rope or ()], *[(mask, 0, 2, 3)] * (mask is not None))
            for layer, block in enumerate(m.blocks):
                x, k, v = self._prefill_fn(block, x, rope, mask, self.kv_cache_dtype == "fp8")
                st.cache.write(layer, slice(r0, r1), k, v)
            out.append(_head_logits(self.model, x[:, -1:]))
        return torch.cat(out) if len(out) > 1 else out[0]

    # -- generation ------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        stop_tokens: Sequence[int] = (),
        on_tokens: Callable[[int, list[int]], bool] | None = None,
        sync_every: int | None = None,
    ) -> list[Generation]:
        """Generate up to max_new_tokens for each prompt (a batch; lengths may differ).

        on_tokens(row, new_token_ids) is called as tokens reach the host (after each step when given);
        returning True ends that row ("stop"). Rows also end at any of stop_tokens. Timings: `self.last`.
        """
        sampling = sampling or SamplingParams()
        sampling.validate()
        self.check_prompts(prompts, max_new_tokens)
        t_start = time.perf_counter()
        B, lens = len(prompts), [len(p) for p in prompts]
        T = length_bucket(max(lens)) if self.compile else max(lens)
        capacity = T + max_new_tokens
        if self.compile or self.cuda_graphs:
            capacity = length_bucket(capacity)
        t0 = time.perf_counter()
        st = self._state_for(B, capacity)
        prefill_setup_s, decode_setup_s = time.perf_counter() - t0, 0.0

        dev = self.device
        host_tokens = torch.zeros(B, T, dtype=torch.long)
        for b, p in enumerate(prompts):
            host_tokens[b, T - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
        pads = [T - n for n in lens]
        tokens = host_tokens.to(dev, non_blocking=True)
        st.pad.copy_(torch.as_tensor(pads, dtype=torch.long), non_blocking=True)
        t0 = time.perf_counter()
        logits = self._prefill(st, tokens, st.pad, padded=any(pads))
        if self.compile and ("prefill", T) not in st.warm:  # count a first call's compilation as setup
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            prefill_setup_s += time.perf_counter() - t0
            st.warm.add(("prefill", T))

        generator = make_generator(sampling, dev)
        seen = None
        if sampling.repetition_penalty != 1.0:
            seen = torch.zeros(B, logits.shape[-1], dtype=torch.bool, device=dev)
            for b, p in enumerate(prompts):
                seen[b, torch.as_tensor(sorted(set(p)), device=dev)] = True
        stop_set = {int(t) for t in stop_tokens}
        out = st.history[:, T:T + max_new_tokens]  # the new tokens; the greedy step writes them there itself
        results = [Generation([], "length", n) for n in lens]
        done = [False] * B

        def take(new_rows: list[list[int]]) -> bool:
            """Move tokens that reached the host into the results; True when every row is done."""
            for b, new in enumerate(new_rows):
                if done[b]:
                    continue
                for j, t in enumerate(new):
                    if t in stop_set:
                        new, done[b] = new[:j], True
                        results[b].finish_reason = "stop_token"
                        break
                results[b].tokens += new
                if on_tokens is not None and new and on_tokens(b, new) and not done[b]:
                    done[b] = True
                    results[b].finish_reason = "stop"
            return all(done)

        nxt = sample_next(logits, sampling, generator, seen)
        out[:, 0] = nxt
        if seen is not None:
            seen.scatter_(1, nxt[:, None], True)
        all_done = take([[t] for t in nxt.tolist()])
        t_first = time.perf_counter()
        sync_every = sync_every or (1 if on_tokens is not None else 16)
        # Without a callback waiting for tokens, each chunk is copied to the host while the GPU runs the next
        # one and read a chunk later, so the GPU never waits for the host (rows may then run up to one chunk
        # past their stop, which take() drops).
        lagged = on_tokens is None and dev.type == "cuda"
        pending = None  # (event, host copy) of the chunk copied but not yet read
        synced, steps = 1, 1
        in_step = sampling.greedy and seen is None  # the step itself takes the argmax, records it, moves on
        for i in range(1, max_new_tokens):
            if all_done:
                break
            if i == 1 or not in_step:
                st.tokens.copy_(nxt[:, None])
                st.slot.fill_(T + i - 1)
            width = self._width(st, T + i - 1)
            decode_setup_s += self._prepare_step(st, width, in_step)
            logits, nxt = self._step(st, width, in_step)
            if not in_step:
                nxt = sample_next(logits, sampling, generator, seen)
                out[:, i] = nxt
            if seen is not None:
                seen.scatter_(1, nxt[:, None], True)
            steps = i + 1
            if steps - synced >= sync_every or steps == max_new_tokens:
                chunk = _to_host(out[:, synced:steps])
                synced = steps
                if lagged:
                    chunk, pending = pending, chunk
                if chunk is not None:
                    all_done = take(_read(chunk))
        if pending is not None:
            take(_read(pending))
        t_end = time.perf_counter()
        self.last = Timings(batch=B, prompt_len=max(lens), steps=steps, ttft_s=t_first - t_start - prefill_setup_s,
                            decode_s=t_end - t_first - decode_setup_s, total_s=t_end - t_start,
                            setup_s=prefill_setup_s + decode_setup_s)
        # a row that was still running when the batch ended early keeps "length"
        return results


    @torch.no_grad()
    def score(self, tokens: torch.Tensor, prefill: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced decoding, to measure what the cache (an FP8 one, say) does to the model's predictions.

        tokens (B, N): the first `prefill` tokens of each row go through the prefill, then each later token is fed
        to a decode step in turn (the step generation runs: cache, kernels, graphs), and every prediction of the
        next token is kept. -> (log-probabilities of tokens[:, prefill:] (B, N - prefill) fp32, the argmax
        predictions at those positions (B, N - prefill)), both on the host."""
        B, N = tokens.shape
        if not 1 <= prefill < N:
            raise UserError(f"score: prefill must be in [1, {N - 1}] for {N}-token rows, got {prefill}")
        if N > self.cfg.context_len:
            raise UserError(f"score: {N}-token rows exceed the model's context_len {self.cfg.context_len}")
        capacity = length_bucket(N) if self.compile or self.cuda_graphs else N
        st = self._state_for(B, capacity)
        tokens = tokens.to(self.device)
        st.pad.zero_()
        logits = self._prefill(st, tokens[:, :prefill], st.pad, padded=False)
        logps, picks = [], []

        def keep(logits, target):
            logps.append(torch.log_softmax(logits.float(), dim=-1).gather(1, target[:, None])[:, 0])
            picks.append(logits.argmax(dim=-1))

        keep(logits, tokens[:, prefill])
        for i in range(prefill, N - 1):
            st.tokens.copy_(tokens[:, i:i + 1])
            st.slot.fill_(i)
            width = self._width(st, i)
            self._prepare_step(st, width, False)
            logits, _ = self._step(st, width, False)
            keep(logits, tokens[:, i + 1])
        return torch.stack(logps, 1).cpu(), torch.stack(picks, 1).cpu()


def _to_host(x: torch.Tensor) -> tuple:
    """Start copying x to the host: -> (an event recorded after the copy, or None on a CPU; the host tensor)."""
    if x.device.type != "cuda":
        return None, x
    host = x.to("cpu", non_blocking=True)  # (into pinned memory)
    event = torch.cuda.Event()
    event.record()
    return event, host


def _read(copy: tuple) -> list:
    """The rows of a _to_host copy, once it has arrived."""
    event, host = copy
    if event is not None:
        event.synchronize()
    return host.tolist()


# ----------------------------------------------------------------------------------------------------
# the baseline


@torch.no_grad()
def naive_generate(model: GPT, prompts: torch.Tensor, max_new_tokens: int,
                   sampling: SamplingParams | None = None) -> tuple[torch.Tensor, Timings]:
    """No cache: the whole sequence goes through the model for every new token (equal-length prompts only).

    prompts: (B, T) token ids on the model's device -> (generated ids (B, max_new_tokens), timings).
    """
    sampling = sampling or SamplingParams()
    sampling.validate()
    B, T = prompts.shape
    if T + max_new_tokens > model.cfg.context_len:
        raise UserError(f"prompt length {T} + max_new_tokens {max_new_tokens} exceeds "
                        f"context_len {model.cfg.context_len}")
    generator = make_generator(sampling, prompts.device)
    t_start = time.perf_counter()
    idx, t_first = prompts, None
    for i in range(max_new_tokens):
        logits = model(idx)[:, -1, :]
        nxt = sample_next(logits, sampling, generator)
        idx = torch.cat([idx, nxt[:, None]], dim=1)
        if i == 0:
            nxt.tolist()  # synchronise: the first token is on the host
            t_first = time.perf_counter()
    idx[:, -1].tolist()
    t_end = time.perf_counter()
    timings = Timings(batch=B, prompt_len=T, steps=max_new_tokens, ttft_s=t_first - t_start,
                      decode_s=t_end - t_first, total_s=t_end - t_start)
    return idx[:, T:], timings
