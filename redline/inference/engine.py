"""The KV-cache inference engine: prefill the prompts once, then decode one token per step from a static cache.

How it works
- The engine runs the model's own modules (redline/model.py): each block is called with a cache layer
  (inference/cache.py) that its attention hands itself to. It runs a copy of the model in its dtype when the model
  is not in it already, and never changes the caller's model.
- Every row's sequence starts at cache slot 0: prompts of different lengths are prefilled together right-padded
  (plain causal attention: the padding after a prompt is never attended to; a prefix-LM's prompt, model.prefix_lm,
  attends to itself both ways and to no padding, and is prefilled whole) and each row then decodes at a slot of
  its own, `slot` (B,). With compilation on, the prompt length is rounded up to a length bucket so the compiled
  prefill sees few shapes.
- The cache is static and allocated once per (batch, capacity) (inference/cache.py).
- Decode step t of row b writes slot L_b + t - 1 and attends over the first W slots of the buffer, W the
  longest row's filled length rounded up to a multiple of 64, so shapes change only every 64 steps: the whole
  step (embedding, every block, head) is captured in one CUDA graph per width and replayed (inference/graphs.py),
  and early steps never read the empty end of the cache.
- How a step attends and computes its Linear layers is the plan's (inference/plan.py): on a GPU by default
  redline's decode-attention kernel and its product kernels with the norms, biases, activations and residual adds
  fused in (inference/kernels/); "matmul" and cuBLAS elsewhere.
- On a GPU the model runs in bf16 and each block's prefill and decode step, the step's inputs and its output are
  compiled apart with dynamic batch, length and width dims (inference/compiled.py); the same compiled block serves
  every layer. On a CPU the same code runs eagerly, attending over exactly the filled slots.
- Greedy decoding takes the argmax inside the step (and its graph), records it and advances the slots there;
  other sampling runs on the device after each step. Without a callback waiting for tokens, each chunk of
  `sync_every` steps is copied to the host while the GPU runs the next one and read a chunk later, so the GPU never
  waits for the host (rows may then run up to one chunk past their stop, which is dropped).

`naive_generate` (inference/baseline.py) is the baseline: no cache, the whole sequence recomputed for every token.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from redline.errors import UserError
from redline.inference.cache import KVCache, prefill_mask
from redline.inference.compiled import decode_options, isolated_compile, mark_dynamic
from redline.inference.graphs import StepGraphs
from redline.inference.plan import plan_decode
from redline.inference.sampling import SamplingParams, make_generator, sample_next
from redline.inference.steps import (decode_block, decode_inputs, decode_layers, decode_output, last_logits,
                                     layer_value, prefill_block, value_embeddings)
from redline.inference.transfer import to_device
from redline.model import GPT, logprobs_of

WIDTH_STEP = 64  # compiled decode attends over the cache in widths that are multiples of this


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


@dataclass
class DecodeState:
    """Everything one (batch, capacity) shape needs; the CUDA graphs read and write only these tensors."""

    cache: KVCache
    tokens: torch.Tensor  # (B, 1) input token of the step
    slot: torch.Tensor  # (B,) cache slot each row's step writes: the position of its input token
    slots: torch.Tensor  # (S,) 0..S-1, the attended slots
    history: torch.Tensor  # (B, S + 1) the token at each slot; a greedy step writes its argmax at slot + 1
    active: torch.Tensor  # (B,) 1 for a row whose slot steps advance, 0 for a free row (it rewrites its slot)
    counts: torch.Tensor | None  # int32 zeros the triton kernels count finished spans in
    graphs: StepGraphs | None
    prefills: StepGraphs | None
    """The prefill graphs, in a memory pool of their own: a server replays them on a CUDA stream of its own while
    decode steps run (graphs that share a pool must never run at the same time)."""
    warm: set = field(default_factory=set)  # shapes already compiled
    prefill_inputs: dict = field(default_factory=dict)
    """("prefill", b, T, start) -> the input buffers (tokens (b, T), rows (b,), last indices (b,)) its graph reads."""
    reference: torch.Tensor | None = None
    """(B,) each row's reference length, its prompt's (model.reference_window; None without): the prefill writes
    it, and the windowed layers' decode steps attend to those slots beside the window."""


def inference_copy(model: GPT, dtype: torch.dtype) -> GPT:
    """The model in `dtype`: the model itself if it is in it already, else a copy (the caller's model is never
    changed; the engine only switches it to eval mode for the duration of a call)."""
    if all(p.dtype == dtype for p in model.parameters()) or has_adapters(model):
        return model  # a LoRA model (GRPO's rollouts) runs as it is: its adapted layers compute in their own dtype
    device = next(model.parameters()).device
    with torch.device("meta"):
        copy = GPT(model.cfg)
    copy = copy.to(dtype).to_empty(device=device)
    copy.load_state_dict(model.state_dict())
    # the copy is the engine's own and only ever runs inference: in eval mode for good, so that _evaluating need
    # not walk its modules (eval() then train()) around every prefill and decode call of a serving batch
    return copy.eval()


def has_adapters(model: torch.nn.Module) -> bool:
    """Whether LoRA layers (redline/converters/lora.py) adapt the model: their update is only in their forward."""
    return any(hasattr(m, "lora_A") for m in model.modules())


@contextlib.contextmanager
def _evaluating(model: GPT):
    """The model in eval mode (no dropout) for the call, its mode restored after. A model already in eval mode is
    left alone: eval() and train() walk every module, which costs more than a small decode step's launch."""
    if not model.training:
        yield
        return
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _delta_width(cfg) -> int:
    """The channels of a delta layer's convolution, which its cache layer keeps a token: a gated delta net's q, k
    and v, Mamba-2's x, B and C, Mamba-1's x alone (delta_heads channels)."""
    if cfg.delta_rule == "mamba1":
        return cfg.delta_heads
    if cfg.delta_rule == "rglru":  # Griffin's: its linear_x output, delta_heads blocks of delta_value_dim
        return cfg.delta_heads * cfg.delta_value_dim
    if cfg.delta_rule in ("lightning", "mlstm"):  # no convolution: only the state
        return 0
    if cfg.delta_rule == "rwkv":  # RWKV-4's token shifts: the time mixing's input, then the channel mixing's
        return 2 * cfg.n_embd
    return 2 * cfg.delta_key_heads * cfg.delta_key_dim + cfg.delta_heads * cfg.delta_value_dim


def _delta_state(cfg) -> tuple[int, ...]:
    """A delta layer's state a row: (heads, key width, value width), RWKV-4's WKV (numerator, denominator, their
    log scale) a channel, (3, delta_value_dim), xLSTM's mLSTM memory with its normalizer and scale a head."""
    if cfg.delta_rule == "rwkv":
        return (3, cfg.delta_value_dim)
    if cfg.delta_rule == "mlstm":  # the matrix memory C, its normalizer n and the log scale m, packed (MLSTM._pack)
        return (cfg.delta_heads, cfg.delta_key_dim + 1, cfg.delta_value_dim + 1)
    return (cfg.delta_heads, cfg.delta_key_dim, cfg.delta_value_dim)


def _prefill_attention(device: torch.device, backend: str):
    """SDPA's backends for a prefill on a GPU when the model leaves the choice to PyTorch: flash, memory-efficient
    or math, not cuDNN's. cuDNN attention builds an execution plan for each new shape it meets, milliseconds of host
    time per layer, and a serving batch prefills every count of rows and padded length as requests arrive."""
    if device.type != "cuda" or backend != "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class InferenceEngine:
    """Batched generation with a static KV cache for any redline GPT.

    Options (see inference/plan.py, which checks them all): dtype None: bf16 on a GPU that has it, fp32 elsewhere;
    compile / cuda_graphs None: on for CUDA, off on a CPU; decode_attention "auto" | "matmul" | "triton";
    decode_linear "auto" | "torch" | "triton"; kv_cache_dtype "auto" (the model's dtype) | "fp8"; kernel_tuning:
    Inductor's coordinate-descent tuning of the compiled step.
    """

    def __init__(self, model: GPT, *, dtype: torch.dtype | None = None, compile: bool | None = None,
                 cuda_graphs: bool | None = None, decode_attention: str = "auto", kernel_tuning: bool = False,
                 prefill_chunk_tokens: int = 32768, decode_linear: str = "auto", kv_cache_dtype: str = "auto"):
        device = next(model.parameters()).device
        if has_adapters(model):  # the fused products read each layer's weight and would skip the adapters
            if decode_linear not in ("auto", "torch"):
                raise UserError(f"decode_linear={decode_linear} would skip the model's LoRA adapters; use auto or "
                                "torch (or merge the adapters first: redline export --merge)")
            decode_linear = "torch"
        self.plan = plan_decode(model.cfg, device, dtype=dtype, compile=compile, cuda_graphs=cuda_graphs,
                                decode_attention=decode_attention, decode_linear=decode_linear,
                                kv_cache_dtype=kv_cache_dtype, kernel_tuning=kernel_tuning,
                                prefill_chunk_tokens=prefill_chunk_tokens)
        self.model = inference_copy(model, self.plan.dtype)
        self.cfg, self.device, self.dtype = model.cfg, device, self.plan.dtype
        self._prefill_fn, self._decode_fns = prefill_block, None
        if self.plan.compile:
            self._prefill_fn = isolated_compile(prefill_block)
            options = decode_options(device, self.plan.kernel_tuning, grouped_gemm=model.cfg.moe_experts > 0)
            self._decode_fns = tuple(isolated_compile(fn, options=options)
                                     for fn in (decode_inputs, decode_block, decode_output))
        self._state: DecodeState | None = None
        self.last = Timings()

    # -- description -----------------------------------------------------------------------------------

    def describe(self) -> dict:
        return self.plan.describe()

    @property
    def kv_cache_bytes(self) -> int:
        return self._state.cache.nbytes if self._state is not None else 0

    def kv_bytes_per_token(self) -> int:
        """Cache bytes one token of one sequence takes: 2 · attention layers · n_kv_head · (head_dim · itemsize,
        plus an fp32 scale for FP8), n_embd · itemsize for each short-convolution layer (its b·h) and the
        convolution's channels · itemsize for each gated delta-net layer (whose state a row holds once, whatever
        its length), and N·C · itemsize for each n-gram embedding's convolution (model.ngram_layers)."""
        c, fp8 = self.cfg, self.plan.kv_cache == "fp8"
        size = torch.empty((), dtype=self.plan.cache_dtype).element_size()
        conv, delta = len(c.conv_layers), len(c.delta_layers)
        # each layer its own heads and width (model.global_head_size, latent attention's one head: layer_cache_geometry);
        # a kv-shared layer holds none of its own
        attention = sum(heads * (width * size + 4 * fp8) for heads, width in
                        (c.layer_cache_geometry(i) for i in c.attention_layers if c.kv_source(i) is None))
        ngram = len(c.ngram_layers) * c.hc_streams * c.n_embd  # model.ngram_layers' convolution inputs
        return 2 * attention + conv * c.n_embd * size + delta * _delta_width(c) * size + ngram * size

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

    def reserve(self, batch: int, capacity: int) -> None:
        """Allocate the cache for `batch` rows of `capacity` slots now: later calls of that batch size that fit reuse
        it, so their numerics do not depend on which earlier call sized the cache (exact resume of GRPO)."""
        self._state_for(batch, capacity)

    def _state_for(self, batch: int, capacity: int, spare: int = 0) -> DecodeState:
        """The cache and graphs for this batch size; a larger cache of the same batch size is reused as it is
        (decode reads only the filled width, so spare capacity costs memory, not time). spare: cache rows past the
        batch's (KVCache), at least this many."""
        st = self._state
        if st is not None and st.cache.batch == batch and st.cache.capacity >= capacity and st.cache.spare >= spare:
            return st
        del st
        self.release()  # free the old cache and graphs before allocating the new ones
        c, dev = self.cfg, self.device
        self._state = DecodeState(
            cache=KVCache(c.n_layer, batch, c.kv_heads, capacity, c.head_dim, self.plan.cache_dtype, dev, spare,
                          c.conv_layers, c.n_embd, c.delta_layers, _delta_width(c),
                          _delta_state(c), c.mixer_free_layers,
                          c.parallel_delta_layers, [c.layer_cache_geometry(i) for i in range(c.n_layer)],
                          {i: c.kv_source(i) for i in range(c.n_layer) if c.kv_source(i) is not None},
                          bool(c.smear_gate or c.ngram_layers), c.ngram_layers, c.hc_streams * c.n_embd),
            tokens=torch.zeros(batch, 1, dtype=torch.long, device=dev),
            slot=torch.zeros(batch, dtype=torch.long, device=dev),
            slots=torch.arange(capacity, device=dev),
            history=torch.zeros(batch, capacity + 1, dtype=torch.long, device=dev),
            active=torch.ones(batch, dtype=torch.long, device=dev),
            counts=self._counters(),
            graphs=StepGraphs(dev) if self.plan.cuda_graphs else None,
            prefills=StepGraphs(dev) if self.plan.cuda_graphs else None,
            reference=torch.zeros(batch, dtype=torch.long, device=dev) if c.reference_window else None,
        )
        return self._state

    def _counters(self) -> torch.Tensor | None:
        """The zeros the triton kernels count in (each leaves them zero, so the attention and the products share
        them); fixed in size, so the compiled step never specialises on it."""
        if self.plan.attention != "triton":
            return None
        from redline.inference.kernels import decode_attention, fused_block

        n = decode_attention.counters_needed(self.cfg.kv_heads)
        if self.plan.linear == "triton":
            n = max(n, fused_block.counters_needed(self.cfg))
        return torch.zeros(n, dtype=torch.int32, device=self.device)

    def _width(self, st: DecodeState, last_slot: int) -> int:
        """How many cache slots a step attends over when its highest row slot is `last_slot`: exactly
        last_slot + 1 when nothing is compiled or captured, else rounded up to a multiple of WIDTH_STEP (one CUDA
        graph per width), so early steps do not read the empty end of the cache."""
        if not (self.plan.compile or self.plan.cuda_graphs):
            return last_slot + 1
        return min(st.cache.capacity, -(-(last_slot + 1) // WIDTH_STEP) * WIDTH_STEP)

    def _mark_dynamic(self, *specs) -> None:
        if self.plan.compile:
            mark_dynamic(*specs)

    def _decode_step(self, st: DecodeState, width: int, greedy: bool):
        """(logits (B, vocab), next tokens or None) of the step that reads st.tokens and writes each row's slot,
        attending over the first `width` slots; greedy: the argmax is taken and written to st.tokens and
        st.history, and st.slot advances by one."""
        cache = st.cache
        slots = st.slots[:width]
        scales = [t for pair in cache.scales or () for t in pair]
        self._mark_dynamic((st.tokens, 0), (st.slot, 0), (slots, 0), (st.history, 0, 1), (st.active, 0),
                           *([] if st.reference is None else [(st.reference, 0)]),
                           *[(t, 0, 2) for t in cache.k + cache.v + scales],
                           *[(t, 0) for t in cache.states.values()],
                           *[(cache.delta_inputs[i], 0, 2) for i in cache.parallel],
                           *[(t, 0, 2) for t in cache.ngram_inputs.values()])
        return decode_layers(self.model, st.tokens, st.slot, slots, cache.k, cache.v, cache.layer_extras,
                             self.plan.attention, greedy, self._decode_fns,
                             self._mark_dynamic if self._decode_fns else None, st.counts,
                             self.plan.linear == "triton", st.history, st.active, cache.token_ids, st.reference)

    def _warm_step(self, st: DecodeState, width: int, greedy: bool, step=None) -> None:
        """Run the step (or `step()`, another that feeds its tokens back as a greedy one does) without advancing
        anything: it rewrites the current slots with the same values, and the input tokens and slots a greedy step
        changes are put back (what it writes into the history, the same step writes again)."""
        tokens, slot = st.tokens.clone(), st.slot.clone()
        if step is None:
            self._decode_step(st, width, greedy)
        else:
            step()
        st.tokens.copy_(tokens)
        st.slot.copy_(slot)

    def _step(self, st: DecodeState, width: int, greedy: bool):
        if st.graphs is not None:
            return st.graphs.replay((width, greedy))
        return self._decode_step(st, width, greedy)

    def _prepare_step(self, st: DecodeState, width: int, greedy: bool) -> float:
        """Capture the graph (or compile) for this width if that has not happened yet; returns seconds spent."""
        key = (width, greedy)
        if st.graphs is not None and key not in st.graphs:
            t0 = time.perf_counter()
            st.graphs.capture(key, lambda: self._decode_step(st, width, greedy),
                              lambda: self._warm_step(st, width, greedy))
            torch.cuda.synchronize(self.device)
            return time.perf_counter() - t0
        if self.plan.compile and st.graphs is None and ("decode", key) not in st.warm:
            t0 = time.perf_counter()
            self._warm_step(st, width, greedy)  # compiles on a new shape
            st.warm.add(("decode", key))
            return time.perf_counter() - t0
        return 0.0

    def _prefill(self, st: DecodeState, tokens: torch.Tensor, lengths: Sequence[int], row0: int = 0,
                 start: int = 0, rows_at: Sequence[int] | None = None) -> torch.Tensor:
        """tokens (b, T), right-padded prompts of `lengths` tokens, into cache rows [row0, row0 + b) (or the b rows
        `rows_at`, in any order) at slots [start, start + T) -> the logits after each row's last prompt token
        (b, vocab). Rows go through in chunks of about prefill_chunk_tokens tokens to bound activation memory, and
        a prompt longer than that in spans of as many tokens, each attending to the spans before it in the cache."""
        b, T = tokens.shape
        at = None if rows_at is None else to_device(list(rows_at), self.device)
        span = min(T, self.plan.prefill_chunk_tokens)
        if self.cfg.prefix_lm:  # the prompt is the prefix, which attends both ways: one span, from slot 0
            self.check_prefix_start(start)
            span = T
        rows = max(1, self.plan.prefill_chunk_tokens // span)
        last = to_device([start + n - 1 for n in lengths], self.device)  # each row's last slot
        out = []
        for r0 in range(0, b, rows):
            r1 = min(b, r0 + rows)
            final = None
            for s0 in range(0, T, span):
                where = slice(row0 + r0, row0 + r1) if at is None else at[r0:r1]
                h = self._prefill_span(st, tokens[r0:r1, s0:s0 + span], where, start + s0, last[r0:r1])
                inside = (last[r0:r1] >= start + s0) & (last[r0:r1] < start + s0 + h.shape[1])
                index = (last[r0:r1] - start - s0).clamp(0, h.shape[1] - 1)
                picked = h[torch.arange(r1 - r0, device=self.device), index]  # (rows, C)
                final = picked if final is None else torch.where(inside[:, None], picked, final)
            out.append(last_logits(self.model, final))
        return torch.cat(out) if len(out) > 1 else out[0]

    def prefill_rows(self, st: DecodeState, tokens: torch.Tensor, rows: torch.Tensor,
                     last: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Prompts, right-padded (b, T), into cache rows `rows` (b,) at slots [start, start + T) (each row holding
        its first `start` tokens already: a copied prefix) -> the logits after token `last` (b,) of each row's
        span (b, vocab), a tensor of the caller's. One span, one chunk (b · T at most prefill_chunk_tokens). With
        CUDA graphs, each (b, T, start) is captured in one graph the first time it is met (its input buffers
        filled in place, in the state's pool of prefill graphs) and replayed after, on the caller's stream: a forward of
        dozens of kernels per layer, launched from Python with shapes that change from call to call, costs
        milliseconds of host time that a server's decoding rows would otherwise wait for."""
        b, T = tokens.shape
        if b * T > self.plan.prefill_chunk_tokens:
            raise ValueError(f"prefill_rows takes at most {self.plan.prefill_chunk_tokens} tokens, got {b} × {T}")
        self.check_prefix_start(start)
        if st.graphs is None:
            final = self._prefill_final(st, tokens.to(self.device), rows.to(self.device), last.to(self.device),
                                        start)
            return last_logits(self.model, final)
        key = ("prefill", b, T, start)
        if key not in st.prefill_inputs:
            st.prefill_inputs[key] = (torch.zeros(b, T, dtype=torch.long, device=self.device),
                                      torch.zeros(b, dtype=torch.long, device=self.device),
                                      torch.zeros(b, dtype=torch.long, device=self.device))
        inputs = st.prefill_inputs[key]
        for buf, value in zip(inputs, (tokens, rows, last)):
            buf.copy_(value, non_blocking=True)
        if key not in st.prefills:
            # the warm-up runs (on a side stream, after the work queued before it) prefill the same rows with the
            # same prompts as the replay that follows: what they write is what the replay writes again
            st.prefills.capture(key, lambda: self._prefill_final(st, *inputs, start),
                                lambda: self._prefill_final(st, *inputs, start))
        # the graph ends at the hidden states (b, C): no graph keeps a (b, vocab) output; the head reads the
        # graph's output buffer now, before its next replay rewrites it
        return last_logits(self.model, st.prefills.replay(key))

    def check_prefix_start(self, start: int) -> None:
        """A prefix-LM's prompt (model.prefix_lm) attends to itself both ways: it is prefilled whole, never after
        slots a row holds already (a span of a longer prompt, a copied beginning)."""
        if self.cfg.prefix_lm and start:
            raise UserError(f"a prefix-LM's prompt (model.prefix_lm) is prefilled whole from slot 0, not from slot "
                            f"{start}: its tokens attend to later ones")

    def prefill_graphs(self, st: DecodeState) -> int:
        """How many prefill shapes the state holds graphs of."""
        return len(st.prefill_inputs) if st.graphs is not None else 0

    def _prefill_final(self, st: DecodeState, tokens: torch.Tensor, rows: torch.Tensor,
                       last: torch.Tensor, start: int = 0) -> torch.Tensor:
        """prefill_rows' forward -> the hidden states (b, C) at index `last` of each row's span."""
        h = self._prefill_span(st, tokens, rows, start, start + last)  # (b, T, C)
        return h[torch.arange(tokens.shape[0], device=self.device), last]

    def _prefill_span(self, st: DecodeState, tokens: torch.Tensor, rows: slice | torch.Tensor,
                      start: int, last: torch.Tensor | None = None) -> torch.Tensor:
        """One span of prompt tokens (b, t) into `rows` at slots [start, start + t) -> hidden states (b, t, C).
        last (b,): each row's last prompt slot, past which a gated delta net's state takes no token (padding)."""
        m = self.model
        b, t = tokens.shape
        positions = torch.arange(start, start + t, device=self.device)
        ids = st.cache.token_ids  # model.smear_gate: the token before the span's first, then the span's own in
        before = ids[rows, start - 1][:, None] if ids is not None and start else None
        window = None  # model.ngram_layers: the ngram_size - 1 ids before the span's first, ngram_eos before slot 0
        if self.cfg.ngram_layers and start:
            window = ids[rows, max(0, start - self.cfg.ngram_size + 1):start]
            window = F.pad(window, (self.cfg.ngram_size - 1 - window.shape[1], 0), value=self.cfg.ngram_eos)
        if ids is not None:
            ids[rows, start:start + t] = tokens
        x, rope = m.embed(tokens, positions, before)
        values = value_embeddings(m, tokens)  # (b, t, KV*D) per table, looked up once for every layer
        ple = m.per_layer_inputs(tokens, x, window)  # (b, t, n_layer, P) or None
        # model.prefix_lm: each row's prompt, its slots up to `last`, is the prefix (prefilled from slot 0);
        # model.reference_window: its reference, which the span after it (the last, of a prompt in spans) sets for
        # the decode steps
        reference = self.cfg.reference_window and last is not None
        prefix = last + 1 if self.cfg.prefix_lm or reference else None
        if reference:
            st.reference[rows] = prefix
        masks = {w: prefill_mask(t, start, self.device, w, prefix, reference)  # one per window
                 for w in self.cfg.windows}
        self._mark_dynamic((x, 0, 1), *[(r, 0) for r in rope or ()],
                           *[(mask, 0, 2, 3) if mask.dim() == 4 else (mask, 0, 1)
                             for mask in masks.values() if mask is not None],
                           *[(ve, 0, 1) for ve in values], *([] if ple is None else [(ple, 0, 1)]))
        quantize = st.cache.quantized
        valid = None
        if st.cache.states and last is not None:  # (b, t): the rows' prompt tokens, padding after them
            valid = positions[None, :] <= last[:, None]
            self._mark_dynamic((valid, 0, 1))
        x0, mid = x, None  # model.layer_lambdas' and model.backout's streams (GPT.forward's)
        with _prefill_attention(self.device, self.cfg.attn_backend):
            for layer, block in enumerate(m.blocks):
                x = m.stream_in(layer, x, x0)
                source = self.cfg.kv_source(layer)
                if source is not None:  # a kv-shared layer: its source's slots, this span's included (written)
                    prefix = st.cache.read(source, rows, start + t, self.dtype)
                else:
                    prefix = st.cache.read(layer, rows, start, self.dtype) if start else (None, None)
                if prefix[0] is not None:
                    self._mark_dynamic((prefix[0], 0, 2), (prefix[1], 0, 2) if layer not in st.cache.states
                                       or layer in st.cache.parallel else (prefix[1], 0))
                delta = layer in st.cache.states
                mixer = None  # a Mamba-2 mixer beside attention: its own part of the cache (model.delta_parallel)
                if layer in st.cache.parallel and start:
                    mixer = st.cache.read_delta(layer, rows, start)
                    self._mark_dynamic((mixer[0], 0, 2), (mixer[1], 0))
                ngram = st.cache.ngram_inputs.get(layer)  # an n-gram layer's convolution inputs before the span
                ngram = ngram[rows, :, :start] if ngram is not None and start else None
                if ngram is not None:
                    self._mark_dynamic((ngram, 0, 2))
                x, k, v, side, ngram = self._prefill_fn(block, x, rope, masks[block.window], quantize, *prefix,
                                                        layer_value(m, values, layer), valid if delta else None,
                                                        mixer, None if ple is None else ple[:, :, layer], ngram)
                st.cache.write(layer, rows, start, k, v, side, ngram)
                if layer == m.backout_layer:
                    mid = x
        return m.stream_out(x, mid)

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
        with _evaluating(self.model):
            return self._generate(prompts, max_new_tokens, sampling, stop_tokens, on_tokens, sync_every)

    def _generate(self, prompts, max_new_tokens: int, sampling: SamplingParams, stop_tokens, on_tokens,
                  sync_every) -> list[Generation]:
        t_start = time.perf_counter()
        B, lens = len(prompts), [len(p) for p in prompts]
        T = length_bucket(max(lens)) if self.plan.compile else max(lens)
        capacity = max(lens) + max_new_tokens
        if self.plan.compile or self.plan.cuda_graphs:
            capacity = length_bucket(max(T, capacity))
        st = self._state_for(B, max(capacity, T))
        setup_s = time.perf_counter() - t_start

        dev = self.device
        host_tokens = torch.zeros(B, T, dtype=torch.long)
        for b, p in enumerate(prompts):
            host_tokens[b, :len(p)] = torch.as_tensor(list(p), dtype=torch.long)
        t0 = time.perf_counter()
        logits = self._prefill(st, to_device(host_tokens, dev), lens)
        if self.plan.compile and ("prefill", T) not in st.warm:  # count a first call's compilation as setup
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            setup_s += time.perf_counter() - t0
            st.warm.add(("prefill", T))
        st.slot.copy_(to_device(lens, dev))
        st.active.fill_(1)

        generator = make_generator(sampling, dev)
        seen = None
        if sampling.repetition_penalty != 1.0:
            seen = torch.zeros(B, logits.shape[-1], dtype=torch.bool, device=dev)
            for b, p in enumerate(prompts):
                seen[b, to_device(sorted(set(p)), dev)] = True
        nxt = sample_next(logits, sampling, generator, seen)
        st.history.scatter_(1, st.slot[:, None], nxt[:, None])
        if seen is not None:
            seen.scatter_(1, nxt[:, None], True)
        rows = _Rows(lens, stop_tokens, on_tokens)
        all_done = rows.take([[t] for t in nxt.tolist()])
        t_first = time.perf_counter()
        steps, setup_decode = self._decode_loop(st, nxt, max_new_tokens, sampling, generator, seen, rows, all_done,
                                                sync_every or (1 if on_tokens is not None else 16))
        t_end = time.perf_counter()
        self.last = Timings(batch=B, prompt_len=max(lens), steps=steps, ttft_s=t_first - t_start - setup_s,
                            decode_s=t_end - t_first - setup_decode, total_s=t_end - t_start,
                            setup_s=setup_s + setup_decode)
        return rows.results

    def _decode_loop(self, st: DecodeState, nxt: torch.Tensor, max_new_tokens: int, sampling: SamplingParams,
                     generator, seen, rows: "_Rows", all_done: bool, sync_every: int) -> tuple[int, float]:
        """Steps 1..max_new_tokens-1 of generate: -> (tokens generated per row, seconds spent compiling/capturing).

        The new tokens of row b are history[b, L_b:]; without a callback each chunk of sync_every steps is copied
        to the host while the GPU runs the next chunk and read one chunk later (lagged), so the GPU never waits for
        the host."""
        lens = [r.prompt_tokens for r in rows.results]
        first_slot = to_device(lens, self.device)  # the first new token's slot in the history
        offsets = torch.arange(max_new_tokens, device=self.device)
        lagged = rows.on_tokens is None and self.device.type == "cuda"
        in_step = sampling.greedy and seen is None  # the step itself takes the argmax, records it, moves on
        pending, synced, steps, setup_s = None, 1, 1, 0.0
        for i in range(1, max_new_tokens):
            if all_done:
                break
            if i == 1 or not in_step:
                st.tokens.copy_(nxt[:, None])
            width = self._width(st, max(lens) + i - 1)
            setup_s += self._prepare_step(st, width, in_step)
            logits, nxt = self._step(st, width, in_step)
            if not in_step:
                nxt = sample_next(logits, sampling, generator, seen)
                st.history.scatter_(1, (st.slot + 1)[:, None], nxt[:, None])
                st.slot.add_(st.active)
            if seen is not None:
                seen.scatter_(1, nxt[:, None], True)
            steps = i + 1
            if steps - synced >= sync_every or steps == max_new_tokens:
                chunk = _to_host(st.history.gather(1, first_slot[:, None] + offsets[None, synced:steps]))
                synced = steps
                if lagged:
                    chunk, pending = pending, chunk
                if chunk is not None:
                    all_done = rows.take(_read(chunk))
        if pending is not None:
            rows.take(_read(pending))
        return steps, setup_s

    @torch.no_grad()
    def score(self, tokens: torch.Tensor, prefill: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced decoding, to measure what the cache (an FP8 one, say) does to the model's predictions.

        tokens (B, N): the first `prefill` tokens of each row go through the prefill, then each later token is fed
        to a decode step in turn (the step generation runs: cache, kernels, graphs), and every prediction of the
        next token is kept (a prefix-LM's prefix: the prefilled tokens). -> (log-probabilities of tokens[:, prefill:]
        (B, N - prefill) fp32, the argmax predictions at those positions (B, N - prefill)), both on the host."""
        B, N = tokens.shape
        if not 1 <= prefill < N:
            raise UserError(f"score: prefill must be in [1, {N - 1}] for {N}-token rows, got {prefill}")
        if N > self.cfg.context_len:
            raise UserError(f"score: {N}-token rows exceed the model's context_len {self.cfg.context_len}")
        with _evaluating(self.model):
            return self._score(tokens, prefill)

    def _score(self, tokens: torch.Tensor, prefill: int) -> tuple[torch.Tensor, torch.Tensor]:
        B, N = tokens.shape
        capacity = length_bucket(N) if self.plan.compile or self.plan.cuda_graphs else N
        st = self._state_for(B, capacity)
        st.active.fill_(1)
        tokens = tokens.to(self.device)
        logits = self._prefill(st, tokens[:, :prefill], [prefill] * B)
        logps, picks = [], []

        def keep(logits, target):
            logps.append(logprobs_of(logits, target))  # -inf for an id past the head (model.head_vocab)
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


class _Rows:
    """The rows' results as tokens reach the host: stop tokens end a row, and so does on_tokens returning True."""

    def __init__(self, lens: Sequence[int], stop_tokens: Sequence[int], on_tokens):
        self.results = [Generation([], "length", n) for n in lens]
        self.done = [False] * len(lens)
        self.stop = {int(t) for t in stop_tokens}
        self.on_tokens = on_tokens

    def take(self, new_rows: list[list[int]]) -> bool:
        """Move tokens that reached the host into the results; True when every row is done."""
        for b, new in enumerate(new_rows):
            if self.done[b]:
                continue
            for j, t in enumerate(new):
                if t in self.stop:
                    new, self.done[b] = new[:j], True
                    self.results[b].finish_reason = "stop_token"
                    break
            self.results[b].tokens += new
            if self.on_tokens is not None and new and self.on_tokens(b, new) and not self.done[b]:
                self.done[b] = True
                self.results[b].finish_reason = "stop"
        return all(self.done)


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
