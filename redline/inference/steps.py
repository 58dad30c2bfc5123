"""The engine's units of work, each compiled on its own on a GPU: a block's prefill, and a decode step's inputs,
blocks and output. Every one runs the model's own modules: a block is called with a cache layer
(redline/inference/cache.py) and the model's attention hands itself to it.

The same compiled block serves every layer (regional compilation: compile time does not grow with depth; a model
with value embeddings compiles it twice, for the layers that mix a table into their values and those that do not). A
greedy decode step takes its argmax inside its output function, records the token in the step's history and
advances the rows' slots, so that greedy decoding runs entirely inside one CUDA graph per width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from redline.inference.cache import DecodeLayer, PrefillLayer
from redline.inference.kernels.fused_block import MAX_ROWS, fused_block, fused_head
from redline.model import mask_allows

# the greedy step's argmax over a large vocabulary in spans (chunked_argmax) up to this batch (beyond it, a
# program per row is enough to spread the work over the GPU)
ARGMAX_SPANS_MAX_BATCH = 64


def value_embeddings(model, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Each of the model's value-embedding tables looked up once for the call's tokens (b, T) -> [(b, T, KV*D)]
    (none for a model without them); layer i mixes in `layer_value(model, values, i)`."""
    return [table(tokens) for table in model.value_embeds]


def layer_value(model, values: list[torch.Tensor], layer: int) -> torch.Tensor | None:
    """Layer `layer`'s value embedding among value_embeddings' tables, or None (a layer that mixes in none)."""
    table = model.value_table(layer)
    return None if table is None else values[table]


def prefill_block(block, x: torch.Tensor, rope, mask, quantize: bool = False, prefix_k=None, prefix_v=None,
                  ve=None, valid=None, delta_prefix=None, ple=None, ngram_prefix=None):
    """x (b, T, C) -> (x, k, v, delta, ngram): the block's output and the new tokens' keys and values (b, KV, T, D)
    for the cache (quantize: quantize_kv's pairs, for an FP8 cache, in the same compiled function). prefix_k,
    prefix_v: the rows' cached slots before these tokens (a prompt prefilled in chunks), attended to as well. ve: the
    layer's value embedding of these tokens (b, T, KV*D), or None. A gated delta-net layer's (k, v) and prefix are its convolution
    inputs and its rows' states (KVCache); valid (b, T): its rows' prompt tokens, the padding after them past. A
    Mamba-2 mixer beside attention (model.delta_parallel) starts from delta_prefix and gives its part as delta (else
    None): KVCache.write's. A kv-shared layer (model.kv_shared_layers) is handed its source's slots up to these tokens'
    end as the prefix and gives no k, v. ple: the layer's per-layer input (b, T, P) (model.per_layer_embd), or None;
    with model.ngram_layers each token's n-gram window (b, T, ngram_size), and an n-gram layer's convolution starts
    from ngram_prefix (its inputs of slots [0, start), (b, 1, start, N·C)) and gives its inputs as ngram (else
    None): KVCache.write's."""
    prefix = (prefix_k, prefix_v) if prefix_k is not None else None
    layer = PrefillLayer(mask, prefix, quantize, valid, delta_prefix, ngram_prefix)
    x = block(x, rope, cache=layer, ve=ve, ple=ple)
    if layer.kv is None:  # a mixer alone (its part is the layer's k, v) or no mixer (model.mixer_free_layers)
        k, v = layer.delta_kv or (None, None)
        return x, k, v, None, layer.ngram_kv
    return x, *layer.kv, layer.delta_kv, layer.ngram_kv


def last_logits(model, x: torch.Tensor) -> torch.Tensor:
    """Final hidden states (b, C) -> the logits of the tokens the head predicts (b, head_width: vocab_size unless
    model.head_vocab narrows it), fp32 at least."""
    logits = model.logits(model.norm_f(x))[..., : model.cfg.head_width]
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def decode_inputs(model, tokens: torch.Tensor, slot: torch.Tensor, slots: torch.Tensor, impl: str = "matmul",
                  token_ids: torch.Tensor | None = None, reference: torch.Tensor | None = None):
    """The step's embeddings x (B, 1, C), RoPE tables, attention masks {window: (B, 1, 1, W)} (row b attends to
    slots 0..slot_b, within the window; one per distinct window of the layers, ModelConfig.windows), value
    embeddings ([(B, 1, KV*D)], value_embeddings') and per-layer inputs ((B, 1, n_layer, P), GPT.per_layer_inputs,
    or None). tokens (B, 1), slot (B,), slots (W,) 0..W-1. impl "triton": the kernel computes the mask itself and
    reads only its width, so the slots stand in for it (a view: no kernel).
    token_ids: the cache's (B, S + 1) token ids (model.smear_gate, ngram_layers: KVCache.token_ids), or None: the
    step reads the tokens before each row's slot (ngram_eos before slot 0) and writes its own into the slot.
    reference: (B,) each row's reference length (model.reference_window: its prompt, which the windowed layers
    see beyond the window), or None."""
    before = window = None
    if token_ids is not None and model.cfg.ngram_layers:  # the ngram_size - 1 ids before each row's slot
        index = slot[:, None] + torch.arange(1 - model.cfg.ngram_size, 0, device=slot.device)  # (B, n - 1)
        window = torch.where(index >= 0, token_ids.gather(1, index.clamp(min=0)), model.cfg.ngram_eos)
    if token_ids is not None:
        before = token_ids.gather(1, (slot - 1).clamp(min=0)[:, None])  # (B, 1); a row at slot 0 smears none
        token_ids.scatter_(1, slot[:, None], tokens)
    x, rope = model.embed(tokens, slot[:, None], before)  # a token's position is its slot
    values = value_embeddings(model, tokens)
    ple = model.per_layer_inputs(tokens, x, window)
    if impl == "triton":
        return x, rope, {w: slots.expand(tokens.shape[0], 1, 1, -1) for w in model.cfg.windows}, values, ple
    causal = slots[None, :] <= slot[:, None]  # (B, W)
    masks = {}
    for window in model.cfg.windows:  # a window, 0 or a negative chunk size (ModelConfig.layer_mask)
        mask = causal & mask_allows(slot[:, None], slots[None, :], window) if window else causal
        if reference is not None and window > 0:  # the reference's slots beside the window (B, W)
            mask = mask | (causal & (slots[None, :] < reference[:, None]))
        masks[window] = mask[:, None, None, :]
    return x, rope, masks, values, ple


def decode_block(block, x, rope, mask, k_buf, v_buf, slot, impl: str = "matmul", counts=None, fused: bool = False,
                 scales=None, ve=None, ple=None):
    """x (B, 1, C) -> (B, 1, C): writes each row's key and value into its slot of the layer's whole cache buffers
    and attends over their first W = mask.shape[-1] slots. fused: up to MAX_ROWS rows, the block in redline's
    product kernels (kernels/fused_block.py); scales: an FP8 cache's (k_scale, v_scale) buffers, a gated delta-net
    layer's states (KVCache.layer_extras), or None; ve: the
    layer's value embedding of the step's tokens (B, 1, KV*D), or None (the plan never fuses a model that has
    them); ple: the layer's per-layer input (B, 1, P), or None (the plan fuses no model that has them). A kv-shared
    layer's buffers are its source's, which it reads and does not write."""
    layer = DecodeLayer(k_buf, v_buf, scales, slot, mask, mask.shape[-1], counts, impl)
    if fused and x.shape[0] <= MAX_ROWS:
        return fused_block(block, x, lambda attn, qkv: layer.attend_projected(attn, qkv, rope), counts)
    return block(x, rope, cache=layer, ve=ve, ple=ple)


def chunked_argmax(logits: torch.Tensor, chunks: int = 64) -> torch.Tensor:
    """logits (B, V) -> (B,): argmax (the first maximum) in two steps, the maximum of each of `chunks` spans,
    then the first span holding the overall one. A one-row argmax compiled by Inductor runs as one program;
    spans spread it over the GPU."""
    B, V = logits.shape
    span = -(-V // chunks)
    padded = F.pad(logits, (0, span * chunks - V), value=float("-inf")).view(B, chunks, span)
    best, where = padded.max(dim=-1)
    chunk = best.argmax(dim=-1, keepdim=True)
    return chunk[:, 0] * span + where.gather(1, chunk)[:, 0]


def decode_output(model, x, tokens, greedy: bool, fused: bool, slot, history, active):
    """(logits (B, vocab) fp32, next tokens (B,) or None). greedy: also take the argmax and write it into `tokens`,
    the next step's input, and into `history` (B, S + 1) at each row's slot + 1, then advance the slots of the
    active rows (active: (B,) 1 or 0) by one, so that greedy decoding runs entirely inside the step (and its
    graph): the host launches steps and nothing else. fused: up to MAX_ROWS rows, the head in redline's product
    kernel."""
    if fused and x.shape[0] <= MAX_ROWS:
        logits = fused_head(model, x)[:, : model.cfg.head_width]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    else:
        logits = last_logits(model, x[:, -1])
    if not greedy:
        return logits, None
    spans = logits.shape[0] <= ARGMAX_SPANS_MAX_BATCH and logits.shape[1] >= 8192
    nxt = chunked_argmax(logits) if spans else logits.argmax(dim=-1)
    feed_back(nxt, tokens, history, slot, active)
    return logits, nxt


def feed_back(nxt: torch.Tensor, tokens: torch.Tensor, history: torch.Tensor, slot: torch.Tensor,
              active: torch.Tensor) -> None:
    """Each row's next token nxt (B,) becomes its input `tokens` (B, 1) and goes into `history` (B, S + 1) at its
    slot + 1; the active rows' slots (active: (B,) 1 or 0) move on by one. In place, on the device."""
    tokens.copy_(nxt[:, None])
    history.scatter_(1, (slot + 1)[:, None], nxt[:, None])
    slot.add_(active)


def decode_layers(model, tokens, slot, slots, ks, vs, scales, impl: str, greedy: bool, fns=None, mark_dynamic=None,
                  counts=None, fused: bool = False, history=None, active=None, token_ids=None, reference=None):
    """One decode step through the whole model: tokens (B, 1) at each row's slot -> decode_output's pair.

    slots: (W,) 0..W-1, the cache slots attended over; ks, vs: per layer, the whole cache buffers; scales: per
    layer an FP8 cache's (k_scale, v_scale), or None. fns: the (inputs, block, output) functions, each compiled
    apart (None: these plain ones); mark_dynamic marks the blocks' inputs' batch and width dims dynamic; history and
    active: decode_output's; token_ids and reference: decode_inputs'.
    Between the blocks, the model's own stream scalars (GPT.stream_in, stream_out: model.layer_lambdas, backout)."""
    inputs_fn, block_fn, output_fn = fns or (decode_inputs, decode_block, decode_output)
    x, rope, masks, values, ple = inputs_fn(model, tokens, slot, slots, impl, token_ids, reference)
    if mark_dynamic is not None:
        mark_dynamic((x, 0), *[(t, 0) for t in rope or ()], *[(m, 0, 3) for m in masks.values()],
                     *[(v, 0) for v in values], *([] if ple is None else [(ple, 0)]))
    x0, mid = x, None
    for i, (block, k_buf, v_buf, layer_scales) in enumerate(zip(model.blocks, ks, vs, scales or [None] * len(ks))):
        x = block_fn(block, model.stream_in(i, x, x0), rope, masks[block.window], k_buf, v_buf, slot, impl, counts,
                     fused, layer_scales, layer_value(model, values, i), None if ple is None else ple[:, :, i])
        if i == model.backout_layer:
            mid = x
    return output_fn(model, model.stream_out(x, mid), tokens, greedy, fused, slot, history, active)
