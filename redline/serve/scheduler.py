"""Continuous batching: one background thread runs the engine's DecodeBatch for every request of the server.

How it works
- `submit()` checks a request (its prompt and max_tokens must fit a row, the queue must have room) and queues it;
  the caller gets a `Sequence` whose `sink` receives ("text", new_text, tokens_so_far), then
  ("done", finish_reason) or ("error", message[, HTTP status]), from the scheduler's thread.
- The thread loops: admit waiting requests into free rows of the static batch, prefill them in spans of at most
  `prefill_tokens` tokens per turn while other rows are decoding (so a long prompt stalls running streams for one
  span at a time, not for its whole length), then launch `sync_every` decode steps and read the tokens of the
  previous group of steps while the device runs these (the device never waits for the host). The first tokens of
  the requests just prefilled are copied before the steps are queued and handed over while they run.
- On a GPU the prefills (with what goes with them: parking, copied beginnings, the first tokens' draw) run on a
  CUDA stream of their own, beside the group of steps the device is running, not after it: a small model's
  decode step leaves most of the GPU idle, so a prompt costs the decoding rows a little time instead of holding
  them for the whole prefill. The prefill stream first waits for the end of the last group in which each row it
  writes decoded (a row freed inside a group runs to the group's end), the rows start on the decode stream once
  their prefills are done, and their first tokens go to the clients before the running group ends. Prefill
  graphs have a memory pool of their own for it (inference/engine.py).
- A row is freed the moment its request is done: at launch time when it has been given its max_tokens (known
  without reading anything back), or when its tokens reach the host and hold a stop token or a stop string, or
  when its client went away (`cancel()`). Tokens a freed row computed in steps already launched are dropped.
- Each request samples with its own parameters; greedy rows take the argmax. When every decoding row is greedy the
  step takes its argmax inside the captured step. When some rows sample, every row's draw is captured with the
  step too (DecodeBatch.decode_sampled: each row's temperature and top-p in device tensors set when it starts);
  the host fills the step's noise first, a seeded request's from a generator of its own, the others' from the
  scheduler's. A request with top-k makes its group's steps draw after each step instead (inference/sampling.py's
  RowSampler: one set of kernels for all the rows, launched from here), as does a request that wants logprobs
  (each step's log-softmax, the taken token's and the top k, copied back with the tokens: token_logprobs) or a
  presence or frequency penalty or a logit bias (each row's counts of the tokens it generated and its bias, kept
  on the device). Either way a row's tokens do not depend on the other rows (the batch's shape never changes), so
  greedy and seeded output is the same alone or among others.
- Prefix reuse: a row keeps its last sequence's keys and values until it is prefilled again, and the batch records
  which tokens they are (inference/prefix_cache.py). A new prompt whose first `prefix_min_tokens` or more tokens
  some row holds (a chat's history sent again with one more turn, a shared system prompt) gets them copied from
  that row (a turn's copies together) and prefills only the rest, the rests that start at the same slot in one
  forward; requests that arrive in the same turn with the same beginning (the choices of n > 1) are prefilled one
  first, the others copy from it a turn later. A request takes the free row that holds its beginning, else the free
  row given out longest ago (what recently finished requests hold outlives older ones'); what a row held is first
  parked (DecodeBatch.park: cache rows beyond the batch's, least recently used out) unless its new request goes on
  from it, so a conversation's history outlives its row on a busy server. The response's usage counts the copied
  tokens (prompt_tokens_details.cached_tokens).
- Text is decoded incrementally (inference/text.py's IncrementalText): never half a UTF-8 character, never the
  start of a stop string that may still complete.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence as Seq
from dataclasses import dataclass, field

import torch

from redline.errors import UserError
from redline.inference.batch import DecodeBatch
from redline.inference.prefix_cache import BLOCK
from redline.inference.sampling import RowSampler, SamplingParams, make_generator
from redline.inference.text import IncrementalText
from redline.inference.transfer import put, to_device
from redline.model import logprobs_of


class QueueFull(Exception):
    """The waiting queue is at its limit: the client should retry later (HTTP 429)."""


class ShuttingDown(QueueFull):
    """The server is stopping and admits nothing new (HTTP 503)."""


class ContextTooLong(UserError):
    """The prompt and max_tokens do not fit a row of the batch (HTTP 400)."""


@dataclass(eq=False)  # a sequence is itself: two with the same fields are two requests
class Sequence:
    """One generation: a prompt and how to continue it, and where it stands."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    sink: Callable[[tuple], None]
    """Called from the scheduler's thread with ("text", new text, tokens so far) as tokens reach the host (the text
    may be empty: held back, or tokens that decode to nothing), then ("done", reason) or ("error", message)."""
    stop_ids: frozenset[int] | None = None
    """Tokens that end it (None: the scheduler's; a chat turn ends at its template's end-of-turn tokens)."""
    prompt_logprobs: int | None = None
    """Also hand out the prompt's tokens' log-probabilities (and this many alternatives) first, as one ("prompt",
    entries) event, the first token's logprob None (nothing precedes it); with max_tokens 0 that is all it asks."""
    logprobs: int | None = None
    """Hand out each generated token's log-probability and this many most likely alternatives (None: none): text
    events are then ("text", text, tokens so far, entries), entries a (token id, logprob, [(id, logprob), ...])
    for each token the event adds."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to those logits before every token is chosen, the first included."""
    penalties: tuple[float, float] = (0.0, 0.0)
    """(presence, frequency): each token's logit lowered by the first once the sequence has generated it, and by
    the second times the number of times it has (OpenAI's presence_penalty and frequency_penalty)."""
    tokens: list[int] = field(default_factory=list)
    """Tokens generated so far (read back to the host), a stop token excluded."""
    finish_reason: str | None = None
    """"stop" (a stop token or string), "length" (max_tokens), "cancelled" or "error", once done."""
    row: int | None = None
    prefilled: int = 0  # prompt tokens in the row's cache so far
    cached_tokens: int = 0  # of them, copied from another sequence's row (prefix reuse) instead of computed
    launched: int = 0  # tokens the device has been asked for (the first from the prefill, then one per step)
    submitted_s: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    cancelled: bool = False
    decoder: IncrementalText | None = None
    generator: torch.Generator | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def completion_tokens(self) -> int:
        """Tokens that count as output: up to the one completing a stop string, if one stopped it."""
        if self.decoder is not None and self.decoder.stopped:
            return self.decoder.final_tokens
        return len(self.tokens)

    def cancel(self) -> None:
        """The client went away: the scheduler frees the row at its next turn (safe from any thread)."""
        self.cancelled = True


@dataclass
class Stats:
    """Counters for /metrics (read from other threads; each is updated whole)."""

    requests: int = 0
    finished: collections.Counter = field(default_factory=collections.Counter)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens whose keys and values were copied from a row that held them (prefix reuse)."""
    completion_tokens: int = 0
    steps: int = 0
    busy_row_steps: int = 0
    """Sum over decode steps of the rows decoding: / steps = mean batch occupancy."""
    prefill_graphs: int = 0
    """Prompt shapes (rows, width, start) captured as CUDA graphs so far: each capture under load is a stall the
    decoding rows waited through (a count still growing in a steady load says the warm-up missed shapes)."""
    ttft_s: collections.deque = field(default_factory=lambda: collections.deque(maxlen=1024))
    """Recent times to first token (seconds); read them with ttft_snapshot()."""
    ttft_count: int = 0
    ttft_sum_s: float = 0.0
    """Every time to first token so far: how many, and their sum (the summary's cumulative _count and _sum)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_ttft(self, seconds: float) -> None:
        with self.lock:
            self.ttft_s.append(seconds)
            self.ttft_count += 1
            self.ttft_sum_s += seconds

    def ttft_snapshot(self) -> list[float]:
        with self.lock:
            return list(self.ttft_s)


@dataclass
class _Group:
    """Decode steps launched together: their tokens (steps, rows) on their way to the host, the sequences that
    decoded in them as (sequence, row, steps it decoded: the group's first n), and the first tokens (n,) of the
    sequences admitted just before them."""

    tokens: torch.Tensor | None
    event: object
    decoded: list[tuple[Sequence, int, int]]
    firsts: torch.Tensor | None
    first_owners: list[Sequence]
    first_event: object = None
    """Recorded after the first tokens' copy, before the group's steps: they can reach their clients while the
    steps run (a group earlier than the steps' tokens)."""
    logprobs: torch.Tensor | None = None
    """(steps, rows, 1 + 2k) the steps' logprobs (see token_logprobs), when a sequence in them asked."""
    first_logprobs: list = field(default_factory=list)
    """Each first token's (1, 1 + 2k) logprobs, or None, as first_owners."""


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """logits (R, vocab), the tokens taken (R,) -> (R, 1 + 2k) fp32: each token's log-probability under the model
    (the logits' log-softmax: before temperature and top-p, as OpenAI's and vLLM's logprobs), then the k most likely
    tokens' log-probabilities, then their ids (floats: exact below 2**24). A token past the head (model.head_vocab:
    a prompt's image or audio code) is one the model never predicts: log-probability -inf."""
    chosen = logprobs_of(logits, tokens)[:, None]
    if not k:
        return chosen
    lp = logits.float().log_softmax(dim=-1)
    top = lp.topk(k, dim=-1)
    return torch.cat([chosen, top.values, top.indices.float()], dim=1)


def logprob_entries(packed: list[list[float]], ids: list[int], k: int) -> list[tuple]:
    """token_logprobs' rows on the host (each of 1 + 2K numbers, K >= k) -> (token id, logprob, [(id, logprob)
    of the k most likely]) for each of ids."""
    out = []
    for token, row in zip(ids, packed):
        K = (len(row) - 1) // 2
        out.append((token, row[0], [(int(row[1 + K + j]), row[1 + j]) for j in range(k)]))
    return out


def check_fits(prompt_tokens: int, max_tokens: int, capacity: int) -> None:
    """ContextTooLong unless a prompt of this length and max_tokens fit a row of `capacity` tokens."""
    if prompt_tokens + max_tokens > capacity:
        raise ContextTooLong(
            f"this model's maximum context length is {capacity} tokens; the request has {prompt_tokens} "
            f"prompt tokens and max_tokens={max_tokens} ({prompt_tokens + max_tokens} in all): shorten the "
            f"prompt or lower max_tokens")


def check_queue(waiting: int, new: int, max_queue: int) -> None:
    """QueueFull (retry later) when `new` sequences do not fit beside `waiting` ones; a UserError when they never
    could (a retry would fail again)."""
    if new > max_queue:
        raise UserError(f"this request makes {new} sequences (prompts × n) and the queue holds at most {max_queue} "
                        f"(--max-queue); ask for fewer")
    if waiting + new > max_queue:
        raise QueueFull(f"{waiting} sequences are waiting and this request adds {new} (the limit is {max_queue}); "
                        f"retry later")


def check_sequences(sequences: Seq[Sequence], vocab: int, capacity: int, head: int | None = None) -> None:
    """A UserError (ContextTooLong among them) for the first sequence that cannot run. vocab: the ids a prompt may
    hold; head: those the model generates, which a logit bias may name (None: vocab)."""
    head = head or vocab
    for seq in sequences:
        if not seq.prompt:
            raise UserError("the prompt is empty; give some text")
        if seq.max_tokens < (0 if seq.prompt_logprobs is not None else 1):
            raise UserError(f"max_tokens must be >= 1 (0 only to score the prompt), got {seq.max_tokens}")
        if any(not 0 <= t < head for t, _ in seq.logit_bias):
            raise UserError(f"logit_bias names a token id outside the ids the model generates [0, {head})")
        if any(not -2 <= p <= 2 for p in seq.penalties):
            raise UserError(f"presence and frequency penalties must be in [-2, 2], got {seq.penalties}")
        if min(seq.prompt) < 0 or max(seq.prompt) >= vocab:
            raise UserError(f"the prompt has a token id outside the model's vocabulary [0, {vocab})")
        seq.sampling.validate()
        check_fits(len(seq.prompt), seq.max_tokens, capacity)


def default_sync_every(device: torch.device) -> int:
    """Decode steps per read of their tokens: on a GPU a few (one wait per group), on a CPU each step is the work
    itself."""
    return 8 if device.type == "cuda" else 1


class Scheduler:
    """Runs `batch` for queued sequences in a background thread (see the module docstring)."""

    sequence_type = Sequence
    """What the API makes a request's sequences of (engine_process.py's scheduler in another process has its
    own)."""
    prefix_min_tokens: int = 0
    """Copy a prompt's beginning from a row that holds it when it is at least this long (0: never)."""
    failure: str | None = None
    """Why the scheduler can serve nothing more (/health fails); None while it can. This thread survives its own
    errors (each fails the requests in flight); the engine in another process can die."""

    def __init__(self, batch: DecodeBatch, tokenizer, stop_ids: Seq[int], max_queue: int = 256,
                 prefill_tokens: int = 2048, sync_every: int | None = None, prefill_wait_ms: float = 0.0,
                 prefix_min_tokens: int = 0, prefill_stream: bool = True):
        if max_queue < 1 or prefill_tokens < 1:
            raise UserError(f"max_queue and prefill_tokens must be >= 1, got {max_queue} and {prefill_tokens}")
        if prefix_min_tokens < 0:
            raise UserError(f"prefix_min_tokens must be >= 0 (0: no prefix reuse), got {prefix_min_tokens}")
        self.prefix_min_tokens = prefix_min_tokens
        if batch.engine.cfg.prefix_lm:
            # a prefix-LM's prompt attends to itself both ways (model.prefix_lm): no copied beginning, and each
            # prompt prefilled whole, in one turn (a turn's budget of the batch's capacity takes any prompt)
            self.prefix_min_tokens, prefill_tokens = 0, max(prefill_tokens, batch.capacity)
        if batch.engine.cfg.reference_window:
            # model.reference_window: a parked row's slots past its prompt were windowed, so no copied beginning
            # (DecodeBatch.match); its prompt's spans are prefilled in order, the last one setting the reference
            self.prefix_min_tokens = 0
        if prefill_wait_ms < 0:
            raise UserError(f"prefill_wait_ms must be >= 0, got {prefill_wait_ms}")
        self.prefill_wait_s = prefill_wait_ms / 1000
        """While rows decode, a request that got a row waits up to this long for others to be prefilled with it
        (see _admit)."""
        self.batch, self.tokenizer = batch, tokenizer
        self.stop_ids = {int(t) for t in stop_ids}
        self.max_queue, self.prefill_tokens = max_queue, prefill_tokens
        self.device = batch.engine.device
        # on a GPU, read tokens back every few steps (one wait per group); on a CPU each step is the work itself
        self.sync_every = sync_every or default_sync_every(self.device)
        # read a group's tokens while the next group runs (on a GPU: the device never waits for the host); on a
        # CPU the steps are done when launched, and lagging would only delay the tokens
        self.lag_reads = self.device.type == "cuda"
        # on a GPU, prompts are prefilled on a stream of their own, beside the decode steps already queued (see the
        # module docstring); each row's last group's end event says when its cache is the prefill's to write
        self._side: torch.cuda.Stream | None = None
        self.prefill_stream = prefill_stream
        self._main = None
        self._row_done: list = [None] * batch.rows
        self.rows: list[Sequence | None] = [None] * batch.rows
        self._holders: list[Sequence | None] = [None] * batch.rows  # the last sequence given each row
        self._admissions = itertools.count(1)
        self._given_at = [0] * batch.rows  # when each row was last given (the count of admissions then)
        self.waiting: collections.deque[Sequence] = collections.deque()
        # first tokens sampled, not yet sent to the host: (sequence, token (1,), its logprobs or None)
        self._firsts: list[tuple[Sequence, torch.Tensor, torch.Tensor | None]] = []
        # penalties and logit biases: each row's (presence, frequency) (rows, 2), counts of its generated tokens
        # (rows, vocab) and bias (rows, vocab), allocated when a request first asks for one
        self._penalty: torch.Tensor | None = None
        self._counts: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None
        self._generator = torch.Generator(device=self.device)  # the draws of the requests without a seed
        self._generator.seed()
        self.stats = Stats(prefill_graphs=batch.prefill_graphs)  # those the warm-up captured
        self.flushes: list[Callable[[], None]] = []
        """Called by the scheduler's thread at the end of each turn, after the turn's events: a sink may hold its
        events until then (the API's Mailbox does, to wake its event loop once per turn, not once per event)."""
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="redline-scheduler", daemon=True)
        self._thread.start()

    # -- the caller's side (any thread) --------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Most prompt plus generated tokens of one sequence."""
        return self.batch.capacity

    @property
    def vocab_size(self) -> int:
        """Token ids a prompt may hold (the embedding's rows)."""
        return self.batch.engine.cfg.vocab_size

    @property
    def head_width(self) -> int:
        """Token ids the model can generate, and the logits' width (below vocab_size with model.head_vocab)."""
        return self.batch.engine.cfg.head_width

    @property
    def batch_rows(self) -> int:
        """Rows of the static batch."""
        return self.batch.rows

    def describe(self) -> dict:
        """The engine's plan (device, dtype, compilation...)."""
        return self.batch.engine.describe()

    def check(self, prompt_tokens: int, max_tokens: int) -> None:
        """ContextTooLong unless a prompt of this length and max_tokens fit a row."""
        check_fits(prompt_tokens, max_tokens, self.capacity)

    def submit(self, sequences: list[Sequence]) -> None:
        """Queue sequences (all or none): ContextTooLong, QueueFull, or a UserError for a bad one."""
        check_sequences(sequences, self.vocab_size, self.capacity, self.head_width)
        with self._cond:
            if self._closing:
                raise ShuttingDown("the server is shutting down; retry against another one or later")
            check_queue(len(self.waiting), len(sequences), self.max_queue)
            self.waiting.extend(sequences)
            self.stats.requests += len(sequences)
            self._cond.notify()

    @property
    def prefill_stream(self) -> bool:
        """Whether prompts are prefilled on a CUDA stream of their own (always False on a CPU)."""
        return self._side is not None

    @prefill_stream.setter
    def prefill_stream(self, on: bool) -> None:
        # (a benchmark switches it between loads, with nothing in flight)
        self._side = torch.cuda.Stream(self.device) if on and self.device.type == "cuda" else None

    def queue_depth(self) -> int:
        return len(self.waiting)

    @property
    def alive(self) -> bool:
        """Whether its thread runs (False once closed, or if the thread died of an error outside a turn)."""
        return self._thread.is_alive()

    def refresh_stats(self, timeout: float = 2.0) -> None:
        """`stats` are this scheduler's own, always current (EngineProcess.refresh_stats asks its process)."""

    def busy_rows(self) -> int:
        return sum(seq is not None for seq in self.rows)

    def drain(self, timeout: float) -> bool:
        """Stop admitting (submit raises ShuttingDown) and let what is queued and running finish, for at most
        `timeout` seconds; then close(). -> whether everything finished in time."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        drained = not self._thread.is_alive()
        self.close()
        return drained

    def close(self, timeout: float = 10.0) -> None:
        """Stop admitting, cancel what is queued and running (their clients get an error event saying that the
        server shut down), and wait for the thread."""
        with self._cond:
            self._closing = True
            for seq in list(self.waiting) + [s for s in self.rows if s is not None]:
                seq.cancel()
            self._cond.notify()
        self._thread.join(timeout)

    # -- the scheduler's thread ------------------------------------------------------------------------

    def _run(self) -> None:
        pending: _Group | None = None
        while True:
            with self._cond:
                while not self._closing and not self.waiting and pending is None and not self._occupied():
                    self._cond.wait()
                if self._closing and not self.waiting and pending is None and not self._occupied():
                    return
            try:
                with torch.no_grad():
                    self._drop_cancelled()
                    self._admit()
                    group = self._launch()
                    if group is not None and group.firsts is not None and self._side is not None:
                        # the first tokens of this turn's prompts are ready before the group the device runs now
                        # (their prefills ran beside it): to their clients without waiting for its end
                        self._deliver_firsts(group)
                        for flush in self.flushes:
                            flush()
                    if pending is not None:
                        self._deliver(pending)
                    if group is not None:
                        self._deliver_firsts(group)
                    pending = group
                    if group is not None and not self.lag_reads:
                        self._deliver(group)
                        pending = None
            except Exception as e:  # a bug or a device failure: fail every sequence in flight, keep serving
                self._fail_all(f"{type(e).__name__}: {e}", pending)
                pending = None
            for flush in self.flushes:
                flush()

    def _occupied(self) -> bool:
        return any(seq is not None for seq in self.rows)

    def _finish(self, seq: Sequence, reason: str) -> None:
        """Mark seq done, free its row (if it still holds one) and tell its client."""
        if seq.done:
            return
        seq.finish_reason = reason
        if seq.row is not None and self.rows[seq.row] is seq:
            if self.batch.busy[seq.row]:
                self.batch.free(seq.row)
            self.rows[seq.row] = None
        if (self.prefix_min_tokens and seq.row is not None and self._holders[seq.row] is seq
                and seq.prefilled == len(seq.prompt)):
            # its row (freed now, or at launch) has not been given to another since: it holds the prompt and every
            # generated token but the last (each of those was fed to the step after it, which wrote its key and
            # value; steps launched past the end wrote only later slots)
            self.batch.hold(seq.row, seq.prompt + seq.tokens[:-1])
        self.stats.finished[reason] += 1
        self.stats.completion_tokens += seq.completion_tokens
        if reason in ("stop", "length"):
            rest = seq.decoder.finish()
            if rest:
                seq.sink(("text", rest, seq.completion_tokens) + (() if seq.logprobs is None else ([],)))
        if reason == "cancelled" and self._closing:  # cut off by a shutdown, not by its client: tell the client
            seq.sink(("error", "the server shut down before this request finished; retry it", 503))
        else:
            seq.sink(("done", reason))

    def _fail_all(self, message: str, pending: _Group | None) -> None:
        """End every sequence not done yet with an error: queued, in a row, or only awaiting its last tokens."""
        with self._cond:
            victims = list(self.waiting) + [s for s in self.rows if s is not None]
            self.waiting.clear()
        victims += [first[0] for first in self._firsts]
        if pending is not None:
            victims += pending.first_owners + [s for s, _, _ in pending.decoded]
        for seq in {id(s): s for s in victims if not s.done}.values():
            seq.finish_reason = "error"
            seq.sink(("error", message))
        self.rows = [None] * self.batch.rows
        self._firsts = []
        for r in range(self.batch.rows):
            if self.batch.busy[r]:
                self.batch.free(r)
        if self.prefix_min_tokens:
            self.batch.forget()  # after a failure no row's cache is trusted

    def _drop_cancelled(self) -> None:
        with self._cond:
            gone = [s for s in self.waiting if s.cancelled]
            for seq in gone:
                self.waiting.remove(seq)
        for seq in gone + [s for s in self.rows if s is not None and s.cancelled]:
            self._finish(seq, "cancelled")

    def _admit(self) -> None:
        """Give free rows to waiting sequences, and prefill the rows' prompts: at most prefill_tokens tokens this
        turn while other rows are decoding, everything when none is."""
        scored, admitted = [], []
        with self._cond:
            if any(s.max_tokens == 0 for s in self.waiting):  # the prompt scored, nothing generated: no row
                scored = [s for s in self.waiting if s.max_tokens == 0]
                self.waiting = collections.deque(s for s in self.waiting if s.max_tokens)
            free = [r for r in range(self.batch.rows) if self.rows[r] is None]
            leaving = []  # rows whose last sequence's tokens their new one does not go on from: parked first
            # with a prefill stream, the free rows whose last group has ended (asked once a turn: event queries)
            settled = {r for r in free if self._row_done[r] is None or self._row_done[r].query()} \
                if self._side is not None and self.waiting else set(free)
            while free and self.waiting:
                seq = self.waiting.popleft()
                r, kept = self._row_for(seq, free, settled)
                free.remove(r)
                if self.batch.parked and not kept and len(self.batch.held[r]) >= self.prefix_min_tokens:
                    leaving.append(r)
                self._given_at[r] = next(self._admissions)
                seq.row, self.rows[r], self._holders[r] = r, seq, seq
                seq.decoder = IncrementalText(self.tokenizer, seq.stop)
                # a seeded request draws from its own generator, the others from the scheduler's (RowSampler)
                seeded = seq.sampling.seed is not None
                seq.generator = make_generator(seq.sampling, self.device) if seeded else None
                admitted.append(seq)
        waiting_rows = [s.row for s in self.rows if s is not None and not self.batch.busy[s.row]]
        with self._beside_decoding(waiting_rows):
            self._prefill_admitted(scored, admitted, leaving)

    def _prefill_admitted(self, scored: list[Sequence], admitted: list[Sequence], leaving: list[int]) -> None:
        """_admit's work on the device: park what the rows given out held, score the prompts that ask for their
        logprobs, copy reused beginnings and prefill the prompts (within the turn's budget), sample their first
        tokens and start their rows."""
        if leaving:  # not into a parked row a new sequence is about to copy its beginning from
            batch_rows = range(self.batch.rows)
            wanted = {self.batch.match(s.prompt[:-1], exclude=batch_rows)[0] for s in admitted}
            self.batch.park(leaving, keep=wanted)
        for seq in scored + [s for s in admitted if s.prompt_logprobs is not None]:
            self._score_prompt(seq)
        for seq in scored:
            seq.decoder = IncrementalText(self.tokenizer, seq.stop)
            self.stats.prompt_tokens += len(seq.prompt)
            self._finish(seq, "length")
        budget = self.prefill_tokens if any(self.batch.busy) else None
        prefilling = sorted((s for s in self.rows if s is not None and not self.batch.busy[s.row]),
                            key=lambda s: s.submitted_s)  # first come, first served
        if budget is not None and prefilling and not self._prefill_due(prefilling):
            return
        if self.prefix_min_tokens and prefilling:
            later = self._reuse_prefixes(prefilling)
            prefilling = [s for s in prefilling if s not in later]
        # prompts (or their rests after a copied beginning) that fit what is left of the turn's budget go through
        # in one batched forward per slot they start at (padded to the longest of them); those that do not wait
        # for the next turn; a prompt begun in spans, or longer than a turn's budget, goes on in spans on its own
        batched = set()
        by_start: dict[int, list[Sequence]] = {}  # nothing computed yet (0, or copied), by the slot they go on at
        for seq in prefilling:
            if seq.prefilled == seq.cached_tokens:
                by_start.setdefault(seq.prefilled, []).append(seq)
        # (grouped before any is prefilled: one prefilled at one start must not join the group of a later start
        # that its prompt's length happens to equal)
        for start, group in by_start.items():
            whole, padded = [], 0
            for seq in group:
                rest = len(seq.prompt) - seq.prefilled
                if budget is not None and rest > budget:
                    continue
                longest = max(padded // max(len(whole), 1), rest)
                if budget is not None and longest * (len(whole) + 1) > budget:
                    break
                whole.append(seq)
                padded = longest * len(whole)
            if whole:
                logits = self.batch.prefill_many([s.row for s in whole], [s.prompt[start:] for s in whole], start)
                self.stats.prefill_graphs = self.batch.prefill_graphs
                for seq in whole:
                    seq.prefilled = len(seq.prompt)
                self._first_tokens(whole, logits)
                budget = None if budget is None else budget - padded
                batched.update(whole)
        for seq in prefilling:
            if seq in batched:
                continue
            if budget is not None and budget <= 0:
                break
            rest = len(seq.prompt) - seq.prefilled
            if budget is not None and seq.prefilled == seq.cached_tokens and rest <= self.prefill_tokens:
                continue  # fits a whole turn: batched at the next (a span alone is a forward of its own)
            while seq.prefilled < len(seq.prompt) and (budget is None or budget > 0):
                n = len(seq.prompt) - seq.prefilled
                n = n if budget is None else min(n, budget)
                logits = self.batch.prefill(seq.row, seq.prompt[seq.prefilled:seq.prefilled + n], seq.prefilled)
                seq.prefilled += n
                budget = None if budget is None else budget - n
            if seq.prefilled == len(seq.prompt):
                self._first_tokens([seq], logits[None])

    def _row_for(self, seq: Sequence, free: list[int], settled: set[int]) -> tuple[int, bool]:
        """The free row to give seq, and whether it was chosen for what it holds: with prefix reuse, one that holds
        the longest beginning of its prompt (nothing to copy), else the one given longest ago (what it holds is
        the least likely to be asked for again: a conversation's next turn comes soon after its last); without,
        the first. Other than for what it holds, one of `settled` if any is free: with a prefill stream, a row
        freed inside the group the device runs now would hold its prefill back until that group's end."""
        others = [r for r in free if r in settled] or free
        if not self.prefix_min_tokens:
            return others[0], False
        row, n = self.batch.match(seq.prompt[:-1], exclude=set(range(self.batch.rows)).difference(free),
                                  parked=False)
        if n >= self.prefix_min_tokens:
            return row, True
        return min(others, key=self._given_at.__getitem__), False

    def _score_prompt(self, seq: Sequence) -> None:
        """Send seq its prompt's logprobs: a forward of the whole prompt (the model's logits at every position, which
        a prefill does not keep), its log-softmax read back at once (the one place this thread waits for the device
        outside a group's read: only for requests that ask for prompt logprobs)."""
        from redline.inference.engine import _evaluating

        engine, k = self.batch.engine, seq.prompt_logprobs
        ids = torch.tensor([seq.prompt], device=self.device)
        with _evaluating(engine.model):
            logits = engine.model(ids)[0]  # (T, head_width)
        entries = [(seq.prompt[0], None, [])]
        for i in range(0, len(seq.prompt) - 1, 1024):  # in slices: an fp32 copy of every position's logits is large
            end = min(i + 1024, len(seq.prompt) - 1)  # position j's logits score token j + 1
            part = token_logprobs(logits[i:end], ids[0, i + 1:end + 1], k)
            entries += logprob_entries(part.tolist(), seq.prompt[i + 1:end + 1], k)
        seq.sink(("prompt", entries))

    def _reuse_prefixes(self, prefilling: list[Sequence]) -> list[Sequence]:
        """Copy into each row not prefilled yet the longest beginning of its prompt that another row holds, if at
        least prefix_min_tokens long (the prompt's last token is always computed: its logits give the first new
        token). Rows being prefilled this turn are not copied from. -> the sequences to prefill at a later turn:
        those whose beginning another sequence of this turn is about to compute, which they then copy."""
        fresh = {s.row for s in prefilling if not s.prefilled}
        least = -(-self.prefix_min_tokens // BLOCK) * BLOCK  # the shortest beginning worth copying, whole blocks
        computing, later, copies = set(), [], {}
        for seq in prefilling:
            if seq.prefilled:
                continue
            probe = seq.prompt[:-1]
            src, n = self.batch.match(probe, exclude=fresh - {seq.row})
            n -= n % self.batch.start_step  # (whole steps: the rests' prefill graphs meet fewer start slots)
            if n >= self.prefix_min_tokens:
                copies.setdefault(n, []).append((src, seq.row))  # sources are not prefilled this turn: copy later
                seq.prefilled = seq.cached_tokens = n
                self.stats.cached_tokens += n
                continue
            if len(probe) >= least:
                head = tuple(probe[:least])
                if head in computing:
                    later.append(seq)
                else:
                    computing.add(head)
        for n, pairs in copies.items():  # the copies of one length together: a few launches for all of them
            self._after_rows([src for src, _ in pairs])  # a finished sequence's generated tokens among them
            self.batch.copy_prefixes(pairs, n)
        return later

    def _prefill_due(self, prefilling: list[Sequence]) -> bool:
        """Whether to prefill now while other rows decode. Each prefill holds the decoding rows back, and one of
        several prompts costs them less than several of one (fewer launches, larger products): with
        prefill_wait_s, requests that arrive one by one are gathered for up to that long since the oldest arrived,
        or until no row is left for another; Hugging Face text-generation-inference's router holds waiting
        requests back the same way (max_waiting_tokens, waiting_served_ratio). Off by default: with prefills
        replayed as CUDA graphs it did not pay at 124M (docs/serve.md)."""
        if not self.prefill_wait_s or any(s.prefilled for s in prefilling):
            return True  # a prompt begun in spans goes on at every turn
        if all(r is not None for r in self.rows):
            return True
        return time.perf_counter() - prefilling[0].submitted_s >= self.prefill_wait_s

    @contextlib.contextmanager
    def _beside_decoding(self, rows: Seq[int]):
        """With a prefill stream: run what is inside on it, beside the decode steps queued on the device's stream,
        once the last group in which any of `rows` decoded has ended (what is inside writes their caches: a row
        freed inside a group still decodes up to its end). Without one: in place."""
        if self._side is None:
            yield
            return
        self._main = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._side):
            self._after_rows(rows)
            yield

    def _after_rows(self, rows: Seq[int]) -> None:
        """Make the prefill stream wait for the end of the last group in which any of `rows` decoded (parked rows
        beyond the batch's never decode)."""
        if self._side is None:
            return
        events = {id(e): e for e in (self._row_done[r] for r in rows if r < self.batch.rows) if e is not None}
        for event in events.values():
            self._side.wait_event(event)

    @contextlib.contextmanager
    def _on_decode_stream(self, *made: torch.Tensor):
        """Inside _beside_decoding: back on the device's stream, which waits for what the prefill stream has queued
        so far (the rows' prompts) before what is queued inside (the rows' starts); `made` (tensors the prefill
        stream wrote) are read there, so their memory is not reused before it has."""
        if self._side is None:
            yield
            return
        for t in made:
            t.record_stream(self._main)
        with torch.cuda.stream(self._main):
            self._main.wait_stream(self._side)
            yield

    def _first_tokens(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Sample the token after each prompt (logits (n, vocab)) on the device and start the rows from them: they
        reach the host with the next group of steps, so admitting requests never makes the host wait for the
        device. Greedy ones take one argmax together, the others one RowSampler draw (after each one's logit
        bias: logprobs are the model's, before it)."""
        raw, biases = logits, [self._bias_of(seq) for seq in seqs]
        if any(b is not None for b in biases):
            logits = logits.clone()
            for i, bias in enumerate(biases):
                if bias is not None:
                    logits[i].index_add_(0, *bias)
        firsts = logits.argmax(dim=-1)  # (n,)
        sampled = [i for i, seq in enumerate(seqs) if not seq.sampling.greedy]
        if sampled:
            sampler = self._sampler([seqs[i] for i in sampled], sampled)
            firsts = firsts.index_copy(0, sampler.rows, sampler.sample(logits))
        for i, seq in enumerate(seqs):
            first = firsts[i:i + 1]  # (1,)
            logprobs = None if seq.logprobs is None else token_logprobs(raw[i:i + 1], first, seq.logprobs)
            self._firsts.append((seq, first, logprobs))
            seq.launched = 1
        with self._on_decode_stream(firsts, *[t for bias in biases if bias is not None for t in bias]):
            for i, seq in enumerate(seqs):
                if seq.max_tokens == 1:  # nothing to decode: the row is free once the token is sampled
                    self.rows[seq.row] = None
                    continue
                first = firsts[i:i + 1]
                if any(seq.penalties) or seq.logit_bias or self._penalty is not None:
                    self._start_adjusted(seq, first, biases[i])
                self.batch.start(seq.row, first[0], len(seq.prompt), seq.sampling.temperature,
                                 seq.sampling.top_p)

    def _launch(self) -> _Group | None:
        """Up to sync_every decode steps, stopping early when no row is left; their tokens (and the first tokens of
        the sequences just admitted) start for the host. Rows are admitted only between groups, so within a group
        a row's sequence decodes the group's first n steps (n < steps when it got its max_tokens): its row is
        freed right after its last step, known here without reading anything back."""
        firsts, self._firsts = self._firsts, []
        first_event, first_logprobs = None, [lp for _, _, lp in firsts]
        with self._beside_decoding(()):  # where they were sampled: with a prefill stream, before the steps queued
            first_tokens = torch.cat([f for _, f, _ in firsts]) if firsts else None  # (n,)
            if first_tokens is not None and self.device.type == "cuda":  # on their way before the steps are queued
                first_tokens = first_tokens.to("cpu", non_blocking=True)
                first_logprobs = [lp if lp is None else lp.to("cpu", non_blocking=True) for lp in first_logprobs]
                first_event = torch.cuda.Event()
                first_event.record()
        running = [s for s in self.rows if s is not None and self.batch.busy[s.row]]
        counts = [min(self.sync_every, seq.max_tokens - seq.launched) for seq in running]
        steps = max(counts, default=0)
        tokens = logprobs = None
        if steps:
            ends: dict[int, list[int]] = {}
            for seq, n in zip(running, counts):
                if seq.launched + n >= seq.max_tokens:
                    ends.setdefault(n - 1, []).append(seq.row)
            sampling = [seq for seq in running if not seq.sampling.greedy]
            k = max((seq.logprobs for seq in running if seq.logprobs is not None), default=None)
            top_k = any(0 < (seq.sampling.top_k or 0) < self.head_width for seq in sampling)
            adjusted = any(any(seq.penalties) or seq.logit_bias for seq in running)
            if k is not None or adjusted or (sampling and (top_k or not self.batch.captured_draw)):
                # logprobs, penalties, biases or top-k (each row's k-th logit): each step from its logits, a
                # RowSampler draw for the rows that sample, the adjustments and the logprobs launched from here
                sampler = self._sampler(sampling, [seq.row for seq in sampling]) if sampling else None
                outs = [self._step(sampler, ends.get(i, ()), k, adjusted) for i in range(steps)]
                tokens = torch.stack([t for t, _ in outs])
                logprobs = torch.stack([lp for _, lp in outs]) if k is not None else None
            elif not sampling:  # the host only launches the steps
                tokens = self.batch.decode_greedy(steps, ends)
            else:  # the draw inside each captured step; the host fills the step's noise and launches it
                own = {seq.row: seq.generator for seq in sampling if seq.generator is not None}
                tokens = self.batch.decode_sampled(steps, ends, own, self._generator,
                                                   top_p=any(seq.sampling.top_p < 1 for seq in sampling))
            self.stats.steps += steps
            self.stats.busy_row_steps += sum(counts)
        decoded = []
        for seq, n in zip(running, counts):
            seq.launched += n
            decoded.append((seq, seq.row, n))
            if seq.launched >= seq.max_tokens:  # its last token is on its way: the row is free from now on
                self.rows[seq.row] = None
        if not steps and not firsts:
            return None
        event = None
        if self.device.type == "cuda":  # one copy per group, while the device runs on; _deliver waits for the event
            tokens = tokens.to("cpu", non_blocking=True) if tokens is not None else None
            logprobs = logprobs.to("cpu", non_blocking=True) if logprobs is not None else None
            event = torch.cuda.Event()
            event.record()
            for seq in running:  # until the group's end, a prefill on the other stream must not touch these rows
                self._row_done[seq.row] = event
        return _Group(tokens, event, decoded, first_tokens, [seq for seq, _, _ in firsts], first_event, logprobs,
                      first_logprobs)

    def _bias_of(self, seq: Sequence) -> tuple[torch.Tensor, torch.Tensor] | None:
        """seq's logit bias as (token ids, biases) on the device (from pinned memory, not waiting), or None."""
        if not seq.logit_bias:
            return None
        return (to_device([t for t, _ in seq.logit_bias], self.device),
                to_device([b for _, b in seq.logit_bias], self.device, torch.float32))

    def _start_adjusted(self, seq: Sequence, first: torch.Tensor, bias) -> None:
        """A row starting with penalties or a logit bias (or after some request had them): its counts hold its first
        token alone; its (presence, frequency) and bias set, zeros for none."""
        if self._counts is None:
            self._counts = torch.zeros(self.batch.rows, self.head_width, device=self.device)  # as the logits
            self._penalty = torch.zeros(self.batch.rows, 2, device=self.device)
            self._bias = torch.zeros(self.batch.rows, self.head_width, device=self.device)
        row = seq.row
        self._counts[row].zero_()
        self._counts[row].index_fill_(0, first, 1.0)
        put(self._penalty, (row, 0), seq.penalties[0])
        put(self._penalty, (row, 1), seq.penalties[1])
        self._bias[row].zero_()
        if bias is not None:
            self._bias[row].index_add_(0, *bias)

    def _sampler(self, seqs: list[Sequence], rows: list[int]) -> RowSampler:
        """The sampler of sequences that sample, whose logits are rows `rows` of what it will be given."""
        return RowSampler(rows, [s.sampling for s in seqs], [s.generator for s in seqs], self._generator,
                          self.device)

    def _step(self, sampler: RowSampler | None, ending: Seq[int], logprobs: int | None = None,
              adjusted: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One decode step from its logits -> (each row's next token (rows,) on the device (a copy: the step's output
        buffer is reused by the next step), and with `logprobs` = k token_logprobs' (rows, 1 + 2k) or None): the
        argmax, and the sampler's draw for its rows (if any), all of them at once, after the rows' logit biases and
        penalties (adjusted: some row has one); the rows in `ending` are freed after it. A row that has ended earlier
        in the group still steps (freed rows run parked), its token dropped. Logprobs are the model's, before
        biases and penalties."""
        logits = raw = self.batch.step(greedy=False)
        if adjusted:  # (rows, vocab): the bias, presence once a token was generated, frequency for each time
            counts = self._counts
            logits = raw + self._bias - (counts > 0) * self._penalty[:, :1] - counts * self._penalty[:, 1:]
        tokens = logits.argmax(dim=-1)
        if sampler is not None:
            tokens.index_copy_(0, sampler.rows, sampler.sample(logits))
        if adjusted:
            self._counts.scatter_add_(1, tokens[:, None], torch.ones_like(self._counts[:, :1]))
        packed = None if logprobs is None else token_logprobs(raw, tokens, logprobs)
        self.batch.advance(tokens)
        for row in ending:
            self.batch.free(row)
        return tokens, packed

    def _deliver_firsts(self, group: _Group) -> None:
        """The first tokens of the sequences admitted before the group (copied before its steps were queued): wait
        for them alone and hand them over while the steps run."""
        if group.firsts is None:
            return
        if group.first_event is not None:
            group.first_event.synchronize()
        now = time.perf_counter()
        for seq, first, lp in zip(group.first_owners, group.firsts.tolist(), group.first_logprobs):
            seq.first_token_s = now
            self.stats.add_ttft(now - seq.submitted_s)
            self.stats.prompt_tokens += len(seq.prompt)
            if not seq.done:
                self._take(seq, [first], None if lp is None else lp.tolist())
        group.firsts, group.first_owners, group.first_logprobs = None, [], []

    def _deliver(self, group: _Group) -> None:
        """The tokens of a group reached (or are reaching) the host: hand each sequence its tokens, in one piece."""
        self._deliver_firsts(group)
        if group.event is not None:
            group.event.synchronize()
        if group.tokens is None:
            return
        by_row = group.tokens.t().tolist()  # (rows, steps)
        logprobs = group.logprobs.transpose(0, 1).tolist() if group.logprobs is not None else None
        for seq, row, n in group.decoded:
            if not seq.done:
                self._take(seq, by_row[row][:n], logprobs[row][:n] if logprobs and seq.logprobs is not None else None)

    def _take(self, seq: Sequence, ids: list[int], logprobs: list[list[float]] | None = None) -> None:
        """New tokens of seq on the host (and their token_logprobs rows, if it asked): cut at a stop token or
        max_tokens, stream the text that became final, finish the sequence where it ended."""
        reason, stops = None, self.stop_ids if seq.stop_ids is None else seq.stop_ids
        if not stops.isdisjoint(ids):  # one pass in C; the loop below only for the group that holds a stop token
            for j, t in enumerate(ids):
                if t in stops:
                    ids, reason = ids[:j], "stop"
                    break
        room = seq.max_tokens - len(seq.tokens)
        if len(ids) >= room:
            ids, reason = ids[:room], reason or "length"
        before = len(seq.tokens)
        seq.tokens += ids
        text = seq.decoder.add(ids)
        if (ids or text) and seq.logprobs is None:
            seq.sink(("text", text, seq.completion_tokens))
        elif ids or text:  # the entries of the tokens that count (up to the one completing a stop string)
            kept = ids[:max(0, seq.completion_tokens - before)]
            seq.sink(("text", text, seq.completion_tokens, logprob_entries(logprobs or [], kept, seq.logprobs)))
        if seq.decoder.stopped:
            reason = "stop"
        if reason is not None or seq.cancelled:
            self._finish(seq, reason or "cancelled")
