"""The KV cache: static per-layer key/value buffers, and the cache layers the model's attention hands itself to.

Storage (`KVCache`): per layer, k and v of shape (B, KV, S + 1, D) with KV = n_kv_head, so GQA/MQA models store
n_head/n_kv_head times less than multi-head ones; allocated once per (batch, capacity). Row b's token at
position p lives in slot p: every row starts at slot 0, so a batch of prompts of different lengths is prefilled
right-padded and each row then decodes at a slot of its own (`slot`, (B,)), and a row can be refilled with a new
sequence while the others go on (continuous batching). With dtype float8_e4m3fn the keys and values are stored as
FP8 with an fp32 scale per (row, kv head, slot) (`quantize_kv`), about half a bf16 cache's bytes.

With model.kv_conv a layer's slots hold its raw k and v projections: the cache layers convolve and norm them
(Attention.convolved_kv) over the slots they attend to.

Cache layers: `Attention.forward(x, rope, cache=layer, ve=ve)` (redline/model.py) calls
`layer.attend(attn, x, rope, ve)`, which computes the projections through the attention module's own methods (the
layer's value embedding `ve`, if any, mixed into the values, so the cache holds the mixed values), stores what the
cache must hold, and attends over it:
- `PrefillLayer`: T new tokens per row at slots [start, start + T); they attend causally to each other and to the
  rows' cached slots before `start` (a prompt prefilled in chunks); their keys and values are kept on the layer
  for the engine to store.
- `DecodeLayer`: one new token per row, written into the cache at the row's slot, attending to slots 0..slot (or
  the sliding window's last ones) of the first `width` slots of the buffer: by "matmul" (q·Kᵀ, masked fp32
  softmax, ·V; the portable path) or by "triton", redline's decode kernel (kernels/decode_attention.py), which
  starts from the qkv projection's output and does QK-norm, RoPE, the cache write and the attention in one launch
  (for a model whose QK-norm, RoPE or values it cannot compute there, `kernel_prologue_unsupported`, the layer
  computes q, k and v in torch first and the kernel does the rest).
  The new key and value are scattered into the layer's whole buffer (not into a view of it): Inductor then updates
  the buffer in place, where a write into a view passed in is copied back whole.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from redline.model import alibi_mask, alibi_slopes, mask_allows, prefix_pairs, reference_pairs, sdpa_context

FP8_MAX = 448.0  # the largest float8_e4m3fn


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
    """Static per-layer key/value buffers of shape (B, KV, capacity + 1, D): only the n_kv_head heads are stored.

    dtype float8_e4m3fn: FP8 keys and values with one fp32 scale per (row, kv head, slot) (quantize_kv), in
    `scales`: per layer (k_scale, v_scale) of shape (B, KV, capacity + 1).

    spare: rows stored past the batch's B (rows B..B + spare - 1 of `stacked`), which no step reads or writes: a
    server parks finished sequences' prefixes there (DecodeBatch.park) and copies them back with copy_slots.

    conv_layers: layers whose token mixer is a short convolution (model.conv_layers): each holds one (B, 1,
    capacity + 1, conv_width) buffer, a token's convolution input b·h in its slot (ShortConv), as both its k and its
    v, so that prefill, decode, chunked prompts and parked prefixes treat it as any layer's slots.

    delta_layers: layers whose token mixer is a gated delta net (model.delta_layers): each holds its convolution's
    inputs as a conv layer does, (B, 1, capacity + 1, delta_width), and each row's recurrent state after its last
    token, `states[layer]` (B, *delta_state) fp32. A state belongs to a row's whole sequence, not to slots: a prefix
    copied by copy_slots does not carry it (DecodeBatch reuses no prefixes for such models); a delta-net layer's
    (k, v) in write and read are (its convolution inputs, the rows' states).

    mixer_free: layers with no token mixer (model.mixer_free_layers): they hold nothing; their k and v are None,
    write ignores them and read gives (None, None).

    delta_parallel: True where every delta layer runs its mixer beside attention (model.delta_parallel, Falcon-H1's),
    else the delta layers that do (ModelConfig.parallel_delta_layers: Zamba2's shared-block calls): each holds
    an attention layer's k and v buffers and, apart, the mixer's convolution inputs (`delta_inputs[layer]`) and
    states; their (k, v) in write and read are attention's, the mixer's part going to write's `delta` and coming from
    read_delta, and a decode step's cache layer is handed it as layer_extras' DeltaSide.

    geometry: per layer its (kv heads, head width) where they differ between layers (Gemma 4's full-attention layers:
    model.global_head_size, global_kv_head), else None (kv_heads and head_dim for all): the layers of each geometry
    share one stacked buffer. kv_sources: {layer: the layer whose keys and values it reads} (model.kv_shared_layers):
    such a layer holds no buffer of its own, its k and v being its source's (the engine writes none for it).

    token_ids: the token id in each slot, `token_ids` (B, capacity + 1) long, for a model that smears each token's
    predecessor into it (model.smear_gate, nanochat's) or hashes its last tokens (model.ngram_layers): a span or step
    reads the ids before its first slot, and a prefix copied by copy_slots carries its ids (the buffer is one of
    `stacked`); None for other models.

    ngram_layers: layers with a per-layer n-gram embedding (model.ngram_layers, Qwen4-Exp's PLE): each holds its
    dilated convolution's inputs, a token's normed gated values (ngram_width = N·C) in its slot,
    `ngram_inputs[layer]` (B, 1, capacity + 1, ngram_width), beside the layer's delta-net buffers; write's `ngram`
    fills them, a decode step's cache layer reads them through layer_extras' NGramSide. ZAYA's convolutional
    attention (model.cca_kernels) keeps its tokens' raw q, k and delayed values (CCAAttention.slot_inputs) there the
    same way, on every layer, a decode step's cache layer reading them as its layer_extras."""

    def __init__(self, n_layer: int, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, spare: int = 0, conv_layers: tuple[int, ...] = (),
                 conv_width: int = 0, delta_layers: tuple[int, ...] = (), delta_width: int = 0,
                 delta_state: tuple[int, ...] = (), mixer_free: tuple[int, ...] = (),
                 delta_parallel: bool | tuple[int, ...] = False,
                 geometry: list[tuple[int, int]] | None = None, kv_sources: dict[int, int] | None = None,
                 token_ids: bool = False, ngram_layers: tuple[int, ...] = (), ngram_width: int = 0):
        # one slot more than is ever attended over: every width is then a strict view of the buffer, which
        # keeps the compiled decode step from specialising (and recompiling) on the full-buffer case
        shape = (batch + spare, kv_heads, capacity + 1, head_dim)
        # delta layers that attend as well: True for every one, else those named (ModelConfig.parallel_delta_layers)
        self.parallel = set(delta_layers) if delta_parallel is True else set(delta_parallel or ())
        alone = set(delta_layers) - self.parallel
        kv_sources = kv_sources or {}
        attention = [i for i in range(n_layer) if i not in {*conv_layers, *alone, *mixer_free, *kv_sources}]
        # zeros, not empty: masked slots are multiplied by 0 in p @ V, and 0 * NaN from stale memory is NaN
        # each kind's layers in one buffer (layers, *shape): copy_slots moves a prefix in every layer at once
        geometry = geometry or [(kv_heads, head_dim)] * n_layer
        groups: dict[tuple[int, int], list[int]] = {}
        for i in attention:
            groups.setdefault(geometry[i], []).append(i)
        self.stacked = []
        # per layer (B, KV, capacity + 1, D): the batch's rows, the first of the buffer's (a contiguous view)
        self.k, self.v = [None] * n_layer, [None] * n_layer
        for (heads, width), layers in groups.items():
            bufs = [torch.zeros((len(layers), batch + spare, heads, capacity + 1, width), dtype=dtype, device=device)
                    for _ in range(2)]
            self.stacked += bufs
            for i, k, v in zip(layers, bufs[0].unbind(0), bufs[1].unbind(0)):
                self.k[i], self.v[i] = k[:batch], v[:batch]
        for i, source in kv_sources.items():  # a kv-shared layer reads its source's buffers
            self.k[i], self.v[i] = self.k[source], self.v[source]
        self.kv_sources = kv_sources
        if conv_layers:
            if dtype == torch.float8_e4m3fn:
                raise ValueError("an FP8 cache has no short-convolution layers (the plan keeps such models in bf16)")
            conv = torch.zeros((len(conv_layers), batch + spare, 1, capacity + 1, conv_width), dtype=dtype,
                               device=device)
            self.stacked.append(conv)
            for i, buf in zip(conv_layers, conv.unbind(0)):
                self.k[i] = self.v[i] = buf[:batch]
        self.states: dict[int, torch.Tensor] = {}
        self.delta_inputs: dict[int, torch.Tensor] = {}  # per delta layer (B, 1, capacity + 1, delta_width)
        if delta_layers:
            if dtype == torch.float8_e4m3fn:
                raise ValueError("an FP8 cache has no recurrent layers (the plan keeps such models in bf16)")
            inputs = torch.zeros((len(delta_layers), batch + spare, 1, capacity + 1, delta_width), dtype=dtype,
                                 device=device)
            states = torch.zeros((len(delta_layers), batch + spare, *delta_state), device=device)
            self.stacked.append(inputs)
            self.delta_states = states
            for i, buf, state in zip(delta_layers, inputs.unbind(0), states.unbind(0)):
                self.delta_inputs[i] = buf[:batch]
                if i not in self.parallel:  # the mixer in attention's place: its buffer is the layer's k and v
                    self.k[i] = self.v[i] = buf[:batch]
                self.states[i] = state[:batch]
        self.ngram_inputs: dict[int, torch.Tensor] = {}
        if ngram_layers:
            inputs = torch.zeros((len(ngram_layers), batch + spare, 1, capacity + 1, ngram_width), dtype=dtype,
                                 device=device)
            self.stacked.append(inputs)
            for i, buf in zip(ngram_layers, inputs.unbind(0)):
                self.ngram_inputs[i] = buf[:batch]
        self.token_ids = None
        if token_ids:  # (1, B + spare, 1, capacity + 1): copy_slots' [:, rows, :, :n] indexing, as the others'
            ids = torch.zeros((1, batch + spare, 1, capacity + 1), dtype=torch.long, device=device)
            self.stacked.append(ids)
            self.token_ids = ids[0, :batch, 0]
        self.scales = None
        if dtype == torch.float8_e4m3fn:
            scales = [torch.zeros((n_layer, *shape[:-1]), device=device) for _ in range(2)]
            self.stacked += scales
            self.scales = list(zip(*([layer[:batch] for layer in buf.unbind(0)] for buf in scales)))
        self.batch, self.spare, self.capacity, self.dtype = batch, spare, capacity, dtype

    @property
    def quantized(self) -> bool:
        return self.scales is not None

    @property
    def nbytes(self) -> int:
        states = self.delta_states.numel() * 4 if self.states else 0
        return sum(t.numel() * t.element_size() for t in self.stacked) + states

    @property
    def layer_extras(self) -> list | None:
        """Per layer what a decode step's cache layer takes beside its k and v buffers: an FP8 cache's (k_scale,
        v_scale), a delta-net layer's states (B, H, Dk, Dv), a parallel delta layer's DeltaSide (its mixer's
        convolution inputs and states), else None; None for a cache with neither."""
        if self.scales is not None:
            return self.scales
        if not self.states:  # model.cca_kernels: each layer's raw inputs (B, 1, S, width), else none
            return [self.ngram_inputs[i] for i in range(len(self.k))] if self.ngram_inputs else None
        return [DeltaSide(self.delta_inputs[i], self.states[i]) if i in self.parallel
                else NGramSide(self.states[i], self.ngram_inputs[i]) if i in self.ngram_inputs else self.states.get(i)
                for i in range(len(self.k))]

    def write(self, layer: int, rows: slice | torch.Tensor, start: int, k, v, delta=None, ngram=None) -> None:
        """Store k, v (b, KV, T, D) in slots [start, start + T) of `rows` (a slice, or the b row indices as a long
        tensor: rows that are not contiguous); for an FP8 cache k and v are quantize_kv's pairs. delta: a parallel
        delta layer's mixer part (its convolution inputs (b, 1, T, channels), the rows' states after the span);
        ngram: an n-gram layer's convolution inputs (b, 1, T, ngram_width), or None."""
        # item assignment, not [...].copy_(): with a tensor of rows the indexing would copy, and the write be lost
        if ngram is not None:
            self.ngram_inputs[layer][rows, :, start:start + ngram.shape[2]] = ngram
        if self.k[layer] is None or layer in self.kv_sources:  # no token mixer, or another layer's keys and values
            return
        if layer in self.states and layer not in self.parallel:  # the mixer alone: (k, v) is its part
            delta, k = (k, v), None
        if delta is not None:  # the convolution's inputs into the slots, the state after the span into the rows
            self.delta_inputs[layer][rows, :, start:start + delta[0].shape[2]] = delta[0]
            self.states[layer][rows] = delta[1]
        if k is None:
            return
        if not self.quantized:
            T = k.shape[2]
            self.k[layer][rows, :, start:start + T] = k
            self.v[layer][rows, :, start:start + T] = v
            return
        for buf, scales, (x8, scale) in ((self.k[layer], self.scales[layer][0], k),
                                         (self.v[layer], self.scales[layer][1], v)):
            T = x8.shape[2]
            buf[rows, :, start:start + T] = x8
            scales[rows, :, start:start + T] = scale

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor, n: int) -> None:
        """Slots [0, n) of rows src (r,) into rows dst (r,) (long tensors on the cache's device; no row in both; spare
        rows included), in every layer: keys, values and an FP8 cache's scales, one gather and one scatter per
        buffer."""
        for buf in self.stacked:
            buf[:, dst, :, :n] = buf[:, src, :, :n]

    def read(self, layer: int, rows: slice | torch.Tensor, end: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots [0, end) of `rows` as (k, v) (b, KV, end, D) in dtype (dequantised from FP8); a delta-net layer's
        as (its convolution inputs of those slots, the rows' states); a layer without a token mixer's as
        (None, None)."""
        if self.k[layer] is None:
            return None, None
        if layer in self.states and layer not in self.parallel:
            return self.read_delta(layer, rows, end)
        k, v = self.k[layer][rows, :, :end], self.v[layer][rows, :, :end]
        if not self.quantized:
            return k, v
        k_scale, v_scale = (s[rows, :, :end] for s in self.scales[layer])
        return dequantize_kv(k, k_scale, dtype), dequantize_kv(v, v_scale, dtype)

    def read_delta(self, layer: int, rows: slice | torch.Tensor, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A delta layer's mixer part: its convolution inputs of slots [0, end) (b, 1, end, channels) and the rows'
        states."""
        return self.delta_inputs[layer][rows, :, :end], self.states[layer][rows]


class NGramSide(NamedTuple):
    """What a decode step's cache layer takes for a delta-net layer with a per-layer n-gram embedding
    (model.ngram_layers) besides its convolution inputs: the rows' states and the n-gram convolution's inputs
    (B, 1, S, ngram_width)."""

    states: torch.Tensor
    inputs: torch.Tensor


class DeltaSide(NamedTuple):
    """What a decode step's cache layer takes for a Mamba-2 mixer beside attention (model.delta_parallel) besides
    attention's k and v buffers: the mixer's convolution inputs (B, 1, S, channels) and its rows' states."""

    inputs: torch.Tensor
    states: torch.Tensor


# ----------------------------------------------------------------------------------------------------
# prefill


def prefill_mask(T: int, start: int, device, window: int, prefix_len: torch.Tensor | None = None,
                 reference: bool = False) -> torch.Tensor | None:
    """(T, start + T) bool, True where new token i (at slot start + i) may attend slot j: j <= start + i, within
    the window (window > 0) or the chunk (window < 0: chunks of -window slots, ModelConfig.layer_mask); None where
    that is plain causal attention over the new tokens alone (start 0, no window or chunk cut). prefix_len (b,)
    (model.prefix_lm): (b, 1, T, start + T), each row's slots [0, prefix_len) also attending to one another both
    ways (GPT.attention_mask's prefix); reference (model.reference_window): those slots seen beyond the window
    instead, causally (GPT.attention_mask's reference)."""
    if reference and window <= 0:  # a layer without a window sees its whole context: the reference changes nothing
        prefix_len = None
    if start == 0 and not 0 < abs(window) < T and prefix_len is None:
        return None
    i = torch.arange(T, device=device)[:, None] + start
    j = torch.arange(start + T, device=device)[None, :]
    allowed = (j <= i) & mask_allows(i, j, window)
    if prefix_len is None:
        return allowed
    pairs = reference_pairs if reference else prefix_pairs
    return (allowed | pairs(prefix_len, T, start + T, start))[:, None]


def _last_slots(slots: torch.Tensor, kernel: int) -> torch.Tensor:
    """A convolution layer's cached inputs of slots [0, start), (b, 1, start, C) -> the last kernel - 1 of them
    (b, kernel - 1, C), zeros before slot 0: what a causal convolution reads before a span that starts there."""
    prev = slots[:, 0, -(kernel - 1):] if kernel > 1 else slots[:, 0, :0]
    return F.pad(prev, (0, 0, kernel - 1 - prev.shape[1], 0))


class PrefillLayer:
    """A cache layer for T new tokens per row at slots [start, start + T): attends over `prefix` (the rows' cached
    (k, v) of slots [0, start), or None at start 0) and the new tokens under `mask` (prefill_mask), and keeps the
    new keys and values in `kv` for the engine to store (quantize_kv's pairs when `quantize`). A delta layer's mixer
    keeps its part in `delta_kv` (its convolution inputs, the rows' states after the span), starting from
    `delta_prefix` (a layer whose mixer stands in attention's place: from `prefix`). An n-gram embedding's
    convolution (model.ngram_layers) keeps its inputs in `ngram_kv`, reading those of slots [0, start) in
    `ngram_prefix` (b, 1, start, ngram_width), or None at start 0."""

    def __init__(self, mask: torch.Tensor | None, prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
                 quantize: bool = False, valid: torch.Tensor | None = None,
                 delta_prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
                 ngram_prefix: torch.Tensor | None = None):
        self.mask, self.prefix, self.quantize, self.valid = mask, prefix, quantize, valid
        self.delta_prefix, self.ngram_prefix = delta_prefix, ngram_prefix
        self.kv = self.delta_kv = self.ngram_kv = None

    def attend(self, attn, x: torch.Tensor, rope, ve: torch.Tensor | None = None) -> torch.Tensor:
        """x (b, T, C) -> (b, T, H*D); ve: the layer's value embedding of these tokens (b, T, KV*D), or None. A CCA
        layer's (model.cca_kernels) raw inputs go to `ngram_kv` for their slots, its q, k and v reading those of the
        attn.span slots before the first from `ngram_prefix` (zeros before slot 0)."""
        if hasattr(attn, "slot_inputs"):
            u = attn.slot_inputs(x)  # (b, T, width)
            self.ngram_kv = u[:, None]
            before = None if self.ngram_prefix is None else _last_slots(self.ngram_prefix, attn.span + 1)
            q, k, v = attn.project_qkv(x, rope, ve, before, u)
        else:
            q, k, v = attn.project_qkv(x, rope, ve)  # q (b, H, T, D); k, v (b, KV, T, D)
        if k is None:  # a kv-shared layer: prefix is its source's slots [0, start + T), these tokens' included
            k, v = self.prefix
        else:
            self.kv = (quantize_kv(k), quantize_kv(v)) if self.quantize else (k, v)
            if self.prefix is not None:
                k, v = torch.cat([self.prefix[0], k], dim=2), torch.cat([self.prefix[1], v], dim=2)
            if getattr(attn, "k_conv", None) is not None:  # model.kv_conv: raw projections, convolved from slot 0
                k, v = attn.convolved_kv(k, v)
        mask = self.mask
        if hasattr(attn, "position_bias"):  # model.rel_bias_dim: new token i at slot start + i, key j at slot j
            S, T = k.shape[2], q.shape[2]
            return attn.attend(q, k, v, attn.biased_mask(x, S - T, S, self.mask), is_causal=False)
        if attn.cfg.pos_emb == "alibi":  # new token i at slot start + i, key j at slot j: the bias by slot distance
            S, T = k.shape[2], q.shape[2]  # (1, H, T, S) fp32 (alibi_mask's cost), S = start + T
            slots = torch.arange(S, device=q.device)
            mask = alibi_mask(attn.n_head, slots[S - T:], slots, self.mask)[None].to(q.dtype)
        elif (self.mask is None or attn.cfg.attn_softcap or attn.sinks is not None
              or getattr(attn, "differential", False)  # SDPA takes neither (DiffAttention.attend: two calls)
              or getattr(attn, "compress_rate", 0)  # compressed keys joined to the window's (SharedKVAttention)
              or hasattr(attn, "key_bias")):  # KeyBiasAttention.attend: the keys' biases in its mask
            return attn.attend(q, k, v, self.mask, is_causal=self.mask is None)
        if attn.n_kv != attn.n_head:  # the kernels that take an explicit mask do not all take enable_gqa
            k = k.repeat_interleave(attn.n_head // attn.n_kv, dim=1)
            v = v.repeat_interleave(attn.n_head // attn.n_kv, dim=1)
        with sdpa_context(attn.cfg.attn_backend):
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scale)
        B, H, T, D = q.shape
        return y.transpose(1, 2).reshape(B, T, H * D)


    def convolve(self, conv, x: torch.Tensor) -> torch.Tensor:
        """A short-convolution layer's (model.conv_layers) T new tokens: x (b, T, C) -> (b, T, C). Each token's b·h
        goes to `kv` for its slot; the tokens before the first (a prompt prefilled in chunks) come from the prefix's
        last slots."""
        u, c = conv.gated_input(x)  # (b, T, C) each
        self.kv = (u[:, None], u[:, None])  # (b, 1, T, C): the layer's one buffer, as k and as v
        before = None if self.prefix is None else _last_slots(self.prefix[0], conv.kernel)
        return conv.proj(c * conv.convolve(u, before))

    def ngram_before(self, ngram, u: torch.Tensor) -> torch.Tensor | None:
        """An n-gram embedding's (model.ngram_layers) convolution inputs of the T new tokens u (b, T, N·C) go to
        `ngram_kv` for their slots -> those of the ngram.span tokens before the first (b, span, N·C), zeros before
        slot 0, or None at start 0 (zeros)."""
        self.ngram_kv = u[:, None]
        return None if self.ngram_prefix is None else _last_slots(self.ngram_prefix, ngram.span + 1)

    def delta(self, net, x: torch.Tensor) -> torch.Tensor:
        """A gated delta-net layer's (model.delta_layers) T new tokens: x (b, T, C) -> (b, T, C). Its convolution's
        inputs go to `delta_kv` for their slots and the state after each row's last valid token (`valid`: (b, T), the
        padding of a shorter prompt leaves it as it is) as the second of the pair; a prompt prefilled in chunks starts
        from the prefix's last slots and the rows' states (delta_prefix, or prefix for a mixer alone)."""
        before = state = None
        prefix = self.delta_prefix if self.delta_prefix is not None else self.prefix
        if prefix is not None:  # (b, 1, start, channels), (b, H, Dk, Dv)
            before, state = _last_slots(prefix[0], net.kernel), prefix[1]
        y, u, state = net.mix(x, before, state, valid=self.valid)
        self.delta_kv = (u[:, None], state)
        return y

    def shift(self, ffn, x: torch.Tensor) -> torch.Tensor:
        """RWKV-4's channel mixing (model.mlp=rwkv) of T new tokens: x (b, T, C) -> (b, T, C). Its inputs join the
        layer's time mixing's in `delta_kv` (channels C..2C of the slots); the first token's predecessor is the
        prefix's last slot's (a prompt prefilled in chunks), else zeros."""
        prefix = self.delta_prefix if self.delta_prefix is not None else self.prefix
        before = None if prefix is None else _last_slots(prefix[0], 2)[..., -x.shape[-1]:]
        self.delta_kv = (torch.cat([self.delta_kv[0], x[:, None]], dim=-1), self.delta_kv[1])
        return ffn.mix(x, before)


# ----------------------------------------------------------------------------------------------------
# decode


def cached_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor,
                     scale: float | None = None, softcap: float = 0.0,
                     sinks: torch.Tensor | None = None, alibi_slot: torch.Tensor | None = None,
                     key_bias: torch.Tensor | None = None, score_bias: torch.Tensor | None = None) -> torch.Tensor:
    """One query token against the cache. q: (B, H, 1, D); caches (B, KV, W, D); mask (B, 1, 1, W) bool; scale: the
    scores' (None: 1 / sqrt(D)); sinks: None or the heads' sink logits (H,), each one more term exp(sink) in its
    head's softmax denominator (model.attn_sinks); alibi_slot: None or each row's query slot (B,) (model.pos_emb=
    alibi: head h's scores plus -m_h·(slot - j) for slot j, a slot being a position); key_bias: None or each kv
    head's keys' biases (B, KV, W) added to their scores (model.attn_key_bias); score_bias: None or each query head's
    biases over the slots (B, H, W) (model.rel_bias_dim) -> (B, 1, H*D). The H/KV query
    heads of a kv head are laid out as H/KV query rows of that head, so the cache is read once per kv head and never
    expanded (query head h uses kv head h // (H/KV), as SDPA's enable_gqa): (B, KV, H/KV, D) @ (B, KV, D, W) ->
    masked fp32 softmax -> @ (B, KV, W, D)."""
    B, H, _, D = q.shape
    KV = k_cache.shape[1]
    qg = q.reshape(B, KV, H // KV, D)  # head h = kv * (H/KV) + g
    scores = torch.matmul(qg, k_cache.transpose(-1, -2)) * (scale or D ** -0.5)  # (B, KV, H/KV, W)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if softcap:  # Gemma 2's, before the mask (model.attn_softcap)
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slot is not None:  # head h = kv * (H/KV) + g: its slope at [kv, g]; (B, KV, H/KV, W)
        dist = alibi_slot[:, None] - torch.arange(scores.shape[-1], device=scores.device)  # (B, W)
        slopes = alibi_slopes(H, scores.device).view(1, KV, H // KV, 1)
        scores = scores - slopes * dist[:, None, None, :].to(scores.dtype)
    if key_bias is not None:  # model.attn_key_bias: (B, KV, W), each kv head's keys' own bias
        scores = scores + key_bias[:, :, None, :].to(scores.dtype)
    if score_bias is not None:  # model.rel_bias_dim: head h = kv * (H/KV) + g at [kv, g]
        scores = scores + score_bias.reshape(B, KV, H // KV, -1).to(scores.dtype)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        probs = F.softmax(scores, dim=-1).to(v_cache.dtype)
    else:  # head h = kv * (H/KV) + g: its sink at [kv, g]; the denominator's log logaddexp(lse, sink)
        sink = sinks.to(scores.dtype).view(1, KV, H // KV, 1)
        probs = torch.exp(scores - torch.logaddexp(scores.logsumexp(dim=-1, keepdim=True), sink)).to(v_cache.dtype)
    return torch.matmul(probs, v_cache).reshape(B, 1, H * D)  # (B, KV, H/KV, D) -> (B, 1, H*D)


def _scatter_slot(buf: torch.Tensor, slot: torch.Tensor, x: torch.Tensor) -> None:
    """buf (B, KV, S, ...) [b, :, slot_b] = x (B, KV, 1, ...), in place."""
    index = slot.view(-1, *[1] * (buf.dim() - 1)).expand(*x.shape)
    if buf.dtype == torch.float8_e4m3fn:  # scatter has no FP8 kernels: move the bytes
        buf, x = buf.view(torch.uint8), x.view(torch.uint8)
    buf.scatter_(2, index, x)


def kernel_prologue_unsupported(cfg) -> str | None:
    """What of this model the decode kernel's prologue cannot compute from the raw qkv projection (it normalizes q
    and k per head by the weight and rotates whole heads with one table), or None. The cache layer then computes q,
    k and v in torch (Attention.project_qkv, compiled with the block, as the matmul path does) and hands the kernel
    those, to store and attend over; redline's fused decode block, which hands the kernel the raw projection, cannot
    run such a model."""
    if getattr(cfg, "kv_lora_rank", 0):
        return "latent attention (model.kv_lora_rank: keys and values expanded from a latent)"
    if getattr(cfg, "shared_attn_layers", ()):
        return "a shared block's calls, each adding its own adapters to q, k and v (model.shared_attn_layers)"
    if getattr(cfg, "value_tables", 0):
        return "value embeddings mixed into the values (model.value_embeddings, value_embed_layers)"
    if cfg.qk_norm and getattr(cfg, "qk_norm_scope", "head") != "head":
        return "QK-norm over whole projections (model.qk_norm_scope=all)"
    if cfg.qk_norm and getattr(cfg, "qk_norm_after_rope", False):
        return "QK-norm after RoPE (model.qk_norm_after_rope)"
    if getattr(cfg, "qk_layernorm", False):
        return "LayerNorm QK-norm (model.qk_layernorm: the kernel's is an RMSNorm)"
    if cfg.qk_norm and getattr(cfg, "norm_unit_offset", False):
        return "QK-norm scaling by 1 + weight (model.norm_unit_offset)"
    if getattr(cfg, "qkv_clip", 0):
        return "q, k and v clamped (model.qkv_clip)"
    if getattr(cfg, "rope_dims", 0):
        return "RoPE on part of each head (model.rope_dims)"
    if getattr(cfg, "rope_local_dims", 0):
        return "RoPE on part of each windowed layer's heads (model.rope_local_dims)"
    if getattr(cfg, "rope_local_theta", 0):
        return "the windowed layers' own RoPE tables (model.rope_local_theta)"
    if getattr(cfg, "nope_interval", 0):
        return "layers without RoPE (model.nope_interval)"
    if getattr(cfg, "rope_layer_theta", ()):
        return "a RoPE base of its own for each layer (model.rope_layer_theta)"
    if getattr(cfg, "rope_qk_norm", False):
        return "weightless QK-norm after RoPE on the layers that rotate (model.rope_qk_norm)"
    if getattr(cfg, "nope_temperature", 0):
        return "query scales by position on the layers without RoPE (model.nope_temperature)"
    return None


class DecodeLayer:
    """A cache layer for one decode step: each row's new key and value go into its slot (slot (B,)), and it
    attends to the first `width` slots under `mask` (B, 1, 1, width), its layer's ("matmul"; the "triton" kernel computes the mask
    itself from the slots and the window). k_buf, v_buf: the layer's whole cache buffers; scales: an FP8 cache's
    (k_scale, v_scale) buffers, or None; counts: the triton kernels' int32 counters."""

    def __init__(self, k_buf, v_buf, scales, slot, mask, width: int, counts=None, impl: str = "matmul"):
        self.k_buf, self.v_buf, self.scales, self.slot = k_buf, v_buf, scales, slot
        self.mask, self.width, self.counts, self.impl = mask, width, counts, impl
        # a delta layer's mixer part: a mixer beside attention hands its own (DeltaSide), one alone has its
        # convolution inputs as k_buf and its states as scales
        self.delta_inputs, self.states, self.ngram_inputs, self.delta_u = k_buf, scales, None, None
        if isinstance(scales, DeltaSide):
            self.delta_inputs, self.states = scales
            self.scales = None
        elif isinstance(scales, NGramSide):  # model.ngram_layers: the n-gram convolution's inputs too
            self.states, self.ngram_inputs = scales
            self.scales = None

    def attend(self, attn, x: torch.Tensor, rope, ve: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, 1, C) -> (B, 1, H*D); ve: the layer's value embedding of the step's tokens (B, 1, KV*D), or None
        (with "triton", a model that has them gets q, k and v made here, kernel_prologue_unsupported)."""
        if hasattr(attn, "slot_inputs"):  # model.cca_kernels (the plan keeps it on the matmul path)
            return self.attend_cca(attn, x, rope)
        if self.impl == "triton":
            if kernel_prologue_unsupported(attn.cfg):  # q, k, v made here, as the matmul path makes them
                B = x.shape[0]
                q, k, v = attn.project_qkv(x, rope, ve)  # q (B, H, 1, D); k, v (B, KV, 1, D)
                qkv = torch.cat([q.reshape(B, -1), k.reshape(B, -1), v.reshape(B, -1)], dim=-1)
                return self.attend_projected(attn, qkv, None, prepared=True)[:, None]
            # one (B, (H + 2·KV)·D) input: the fused layer's output as it is (splitting it first can make Inductor
            # copy each part out); separate q, k, v layers are concatenated
            qkv = attn.qkv(x) if attn.cfg.fused_qkv else torch.cat(attn.project(x), dim=-1)
            return self.attend_projected(attn, qkv, rope)[:, None]
        q, k, v = attn.project_qkv(x, rope, ve)  # q (B, H, 1, D); k, v (B, KV, 1, D)
        W = self.width
        if k is None:  # a kv-shared layer: its source wrote this step's key and value into these buffers already
            keys, values = self.k_buf[:, :, :W], self.v_buf[:, :, :W]
        elif self.scales is None:
            _scatter_slot(self.k_buf, self.slot, k)
            _scatter_slot(self.v_buf, self.slot, v)
            keys, values = self.k_buf[:, :, :W], self.v_buf[:, :, :W]
        else:  # FP8: store the quantised vectors, attend to the whole width dequantised (what was stored)
            for buf, scales, (x8, scale) in ((self.k_buf, self.scales[0], quantize_kv(k)),
                                             (self.v_buf, self.scales[1], quantize_kv(v))):
                _scatter_slot(buf, self.slot, x8)
                _scatter_slot(scales, self.slot, scale)
            keys = dequantize_kv(self.k_buf[:, :, :W], self.scales[0][:, :, :W], q.dtype)
            values = dequantize_kv(self.v_buf[:, :, :W], self.scales[1][:, :, :W], q.dtype)
        if getattr(attn, "k_conv", None) is not None:  # model.kv_conv: the slots' raw projections convolved and
            keys, values = attn.convolved_kv(keys, values)  # normed (causal: slots after a row's own reach none)
        alibi = self.slot if attn.cfg.pos_emb == "alibi" else None
        if getattr(attn, "compress_rate", 0):  # DeepSeek-V4's compressed keys, pooled from the cached projections
            return attn.attend_slots(q, keys, self.mask, self.slot)
        if hasattr(attn, "position_bias"):  # model.rel_bias_dim: the new token's biases over the slots by distance
            bias = attn.position_bias(x, self.slot, W)[:, :, 0]  # (B, H, W)
            return cached_attention(q, keys, values, self.mask, attn.scale, score_bias=bias)
        if hasattr(attn, "key_bias"):  # model.attn_key_bias: each cached key's bias from its cached values
            return cached_attention(q, keys, values, self.mask, attn.scale, attn.cfg.attn_softcap, attn.sinks, alibi,
                                    key_bias=attn.key_bias(values))
        if getattr(attn, "differential", False):  # model.diff_attention: the map over each half of the values
            return attn.combine(*(cached_attention(q, keys, half, self.mask, attn.scale, attn.cfg.attn_softcap,
                                                   attn.sinks, alibi).view(q.shape[0], 1, -1)
                                  for half in attn.value_halves(values)))
        return cached_attention(q, keys, values, self.mask, attn.scale, attn.cfg.attn_softcap, attn.sinks, alibi)

    def attend_cca(self, attn, x: torch.Tensor, rope) -> torch.Tensor:
        """ZAYA's convolutional attention's step (model.cca_kernels): x (B, 1, C) -> (B, 1, H*D). Each row's raw
        inputs go into its slot of the layer's inputs buffer (the cache's layer_extras, (B, 1, S, width), in
        `scales`), its q, k and v reading the attn.span slots before (zeros before slot 0); its key and value go into
        the slot as any layer's."""
        u = attn.slot_inputs(x)  # (B, 1, width)
        before = self._slots_before(self.scales, attn.span + 1)
        _scatter_slot(self.scales, self.slot, u[:, None])
        q, k, v = attn.project_qkv(x, rope, None, before, u)  # q (B, H, 1, D); k, v (B, KV, 1, D)
        _scatter_slot(self.k_buf, self.slot, k)
        _scatter_slot(self.v_buf, self.slot, v)
        W = self.width
        return cached_attention(q, self.k_buf[:, :, :W], self.v_buf[:, :, :W], self.mask, attn.scale)

    def convolve(self, conv, x: torch.Tensor) -> torch.Tensor:
        """A short-convolution layer's step: x (B, 1, C) -> (B, 1, C). Each row's b·h goes into its slot of the
        layer's buffer (B, 1, S, C); the convolution reads slots slot - kernel + 1 .. slot (none before slot 0)."""
        u, c = conv.gated_input(x)  # (B, 1, C) each
        before = self._slots_before(self.k_buf, conv.kernel)
        _scatter_slot(self.k_buf, self.slot, u[:, None])
        return conv.proj(c * conv.convolve(u, before))

    def _slots_before(self, buf: torch.Tensor, kernel: int) -> torch.Tensor:
        """A convolution's inputs (buf (B, 1, S, C)) in the kernel - 1 slots before each row's (B, kernel - 1, C),
        oldest first, zeros before slot 0."""
        index = self.slot[:, None] + torch.arange(1 - kernel, 0, device=self.slot.device)  # (B, kernel - 1)
        width = buf.shape[-1]
        before = buf[:, 0].gather(1, index.clamp_min(0)[:, :, None].expand(-1, -1, width))
        return before * (index >= 0)[:, :, None].to(before.dtype)

    def ngram_before(self, ngram, u: torch.Tensor) -> torch.Tensor:
        """An n-gram embedding's (model.ngram_layers) step: u (B, 1, N·C) goes into each row's slot of
        ngram_inputs (B, 1, S, N·C) -> the inputs of the ngram.span slots before it (B, span, N·C), zeros before
        slot 0."""
        before = self._slots_before(self.ngram_inputs, ngram.span + 1)
        _scatter_slot(self.ngram_inputs, self.slot, u[:, None])
        return before

    def delta(self, net, x: torch.Tensor) -> torch.Tensor:
        """A gated delta-net layer's step: x (B, 1, C) -> (B, 1, C). Each row's convolution input goes into its slot
        of the layer's buffer (delta_inputs (B, 1, S, channels)); the convolution reads the kernel - 1 slots before
        it (none before slot 0); the rows' states (`states`: (B, H, Dk, Dv) fp32) move on by the token, in place, but
        for rows parked at the buffer's last usable slot (a free row, or one between the spans of its prompt:
        DecodeBatch), whose states stay as they are."""
        buf = self.delta_inputs
        before = self._slots_before(buf, net.kernel)
        active = self.slot != buf.shape[2] - 2  # (B,): the last usable slot is where rows are parked
        y, u, state = net.mix(x, before, self.states, valid=active[:, None])
        _scatter_slot(buf, self.slot, u[:, None])
        self.delta_u = u  # (B, 1, channels): RWKV's channel mixing (shift) writes the slot whole again with its own
        self.states.copy_(state)
        return y

    def shift(self, ffn, x: torch.Tensor) -> torch.Tensor:
        """RWKV-4's channel mixing (model.mlp=rwkv) step: x (B, 1, C) -> (B, 1, C). Each row's input goes into
        channels C..2C of its slot of the layer's buffer (the time mixing's take the first C), its predecessor read
        from the slot before (zeros before slot 0)."""
        C = x.shape[-1]
        before = self._slots_before(self.delta_inputs, 2)[..., -C:]  # (B, 1, C)
        # the slot whole, the time mixing's channels again beside these: a write into the buffer, not into a view of
        # it (which a compiled step would copy back whole)
        _scatter_slot(self.delta_inputs, self.slot, torch.cat([self.delta_u, x], dim=-1)[:, None])
        return ffn.mix(x, before)

    def attend_projected(self, attn, qkv: torch.Tensor, rope, prepared: bool = False) -> torch.Tensor:
        """redline's decode kernel from the qkv projection's output (B, 1 or none, (H + 2·KV)·D) -> (B, H*D), the
        kernel applying the QK-norm and RoPE; prepared: qkv holds q, k and v with them applied already."""
        B = qkv.shape[0]
        cos, sin = (None, None) if rope is None or prepared else (t.reshape(B, -1) for t in rope)  # (B, D/2) each
        norms, eps = (None, None), 0.0
        if attn.cfg.qk_norm and not prepared:
            norms = (attn.q_norm.weight, attn.k_norm.weight)
            if norms[0] is None:  # norms without weights (model.norm_affine=false): the kernel scales by ones
                norms = (qkv.new_ones(attn.head_dim),) * 2
            eps = attn.q_norm.eps if attn.q_norm.eps is not None else torch.finfo(qkv.dtype).eps
        args = (self.slot, self.counts, self.width, attn.window, eps, *norms, cos, sin)
        scale = attn.scale or 0.0  # 0: the kernel's 1 / sqrt(D)
        if self.scales is not None:
            return torch.ops.redline.decode_attention_fp8(qkv.view(B, -1), self.k_buf, self.v_buf, *self.scales, *args,
                                                          scale=scale)
        return torch.ops.redline.decode_attention(qkv.view(B, -1), self.k_buf, self.v_buf, *args, scale=scale)
