"""Rows filled and freed one at a time on one static batch: the engine's side of continuous batching.

    batch = DecodeBatch(engine, rows=64, capacity=2048)
    logits = batch.prefill(row, prompt_ids)          # (vocab,): what follows the prompt; in spans if asked
    logits = batch.prefill_many(rows, prompts)       # (n, vocab): several free rows' whole prompts in one forward
    logits = batch.prefill_many(rows, rests, start)  # ... or the rests of prompts whose first `start` they hold
    batch.start(row, first_token)                    # the row decodes from here on
    tokens = batch.step()                            # (rows,) every active row's next token (greedy, in the graph)
    tokens = batch.decode_greedy(8)                  # (8, rows): eight such steps, read back together
    tokens = batch.decode_sampled(8, generators={row: gen})  # rows that sample (start(..., temperature=...))
    logits = batch.step(greedy=False)                # or the logits, to sample from; then batch.advance(tokens)
    batch.free(row)                                  # the row stops at once; its cache is reused by the next one
    src, n = batch.match(prompt)                     # a row whose cache holds prompt[:n] (a finished sequence's)
    batch.copy_prefix(src, row, n)                   # ... copied: prefill only prompt[n:] (prefill_many(..., n))
    batch.park([row])                                # keep what a free row holds before it is given out again

The batch is the engine's static decode state (its cache, CUDA graphs and compiled step): its size never changes, so
a row's tokens do not depend on which other rows are busy (the same kernels run whatever the occupancy). A row that
is not decoding (free, or between the spans of its prompt) still runs through each step, parked at the last slot,
which no sequence's tokens fill (a generated token's key and value are written by the step after it, and a row's
last token has none) and its own decode step writes before it reads it: so a free row keeps what its last sequence
left in slots [0, n) until it is prefilled again, and the batch records which tokens those are
(inference/prefix_cache.py) for a later prompt that begins the same way. With parked_rows, the cache has that many
rows more, which no step touches: park() copies a free row's tokens there before the row is given to another
sequence (the least recently used parked row makes room), so a chat's history outlives its row while other
conversations' turns take every row of the batch; match() finds parked rows as it finds the batch's own.
A step attends over the width the busiest active row needs. With CUDA graphs, prefill_many pads its prompts to a
multiple of PREFILL_WIDTH_STEP tokens (and its rows to graph_rows) and replays one graph per (rows, width, start)
(InferenceEngine.prefill_rows): a server prefills between groups of decode steps, and a prefill launched kernel by
kernel from Python would hold the decoding rows for milliseconds of host time.
"""

from __future__ import annotations

import sys

import torch

from redline.errors import UserError
from redline.inference.prefix_cache import BLOCK, PrefixIndex
from redline.inference.sampling import draw_rows
from redline.inference.steps import feed_back
from redline.inference.transfer import put, to_device


PREFILL_WIDTH_STEP = 32  # prompts padded to a multiple of this many tokens for a CUDA-graph prefill
PREFILL_GRAPHS = 64  # the most (rows, width, start) prefill shapes captured; others run without a graph
# With CUDA graphs, a copied beginning is cut to a multiple of this many tokens: the rest after it is prefilled at the
# slot it starts at, a dimension of its graph's shape, so whole 64-token beginnings meet 4× fewer start slots than
# whole hash blocks (16) do: fewer captures, each of which stalls every decoding row, and fewer shapes toward
# PREFILL_GRAPHS, for at most 48 more prompt tokens computed a request.
PREFIX_START_STEP = 64


def graph_rows(n: int) -> int:
    """The rows of the CUDA-graph prefill that takes n prompts: 1, 2, 4, 8, then multiples of 8 (padded with
    repeats of the last), so that the prompts a server admits at once, however many, replay a few graphs instead
    of capturing one per count (vLLM pads its captured batch sizes the same way)."""
    return n if n <= 2 else 1 << (n - 1).bit_length() if n <= 8 else -(-n // 8) * 8


class DecodeBatch:
    def __init__(self, engine, rows: int, capacity: int, group_steps: int = 0, parked_rows: int = 0):
        if rows < 1 or capacity < 2:
            raise UserError(f"a decode batch needs at least one row and a capacity of 2, got {rows} and {capacity}")
        if capacity > engine.cfg.context_len:
            raise UserError(f"capacity {capacity} exceeds the model's context_len {engine.cfg.context_len}")
        if parked_rows < 0:
            raise UserError(f"parked_rows must be >= 0, got {parked_rows}")
        self.engine = engine
        self.state = engine._state_for(rows, capacity, spare=parked_rows)
        self.capacity = self.state.cache.capacity
        self.lengths = [0] * rows  # host copy of each active row's slot (its tokens so far); 0 for a free row
        self.busy = [False] * rows
        self.state.slot.fill_(self.capacity - 1)  # every row parked (see the module docstring)
        self.state.active.zero_()
        # decode_greedy's group_steps steps as one CUDA graph (with CUDA graphs only): one launch per group, so the
        # host, which may be waiting for the GIL, is out of the device's way for the whole group
        self.group_steps = group_steps if group_steps > 1 and self.state.graphs is not None else 0
        # the step of a group after which each row is freed (read by the group graphs)
        self._end_at = torch.zeros(rows, dtype=torch.long, device=engine.device) if self.group_steps else None
        # each row's sampling for decode_sampled, set by start(): temperature (0: greedy) and top-p (+inf: off)
        self._temperature = torch.zeros(rows, 1, device=engine.device)
        self._top_p = torch.full((rows, 1), float("inf"), device=engine.device)
        self._noise: torch.Tensor | None = None  # (rows, vocab) Exp(1), drawn before each sampled step
        self.captured_draw = True  # whether decode_sampled may be used (a server turns it off if it cannot capture)
        self._warned_graphs = False  # whether the PREFILL_GRAPHS limit was reported
        # copied beginnings are whole multiples of this many tokens (a multiple of prefix_cache.BLOCK)
        self.start_step = PREFIX_START_STEP if self.state.graphs is not None else BLOCK
        # the tokens at slots [0, n) of each row's cache: the batch's rows, then the parked rows
        self.held: list[list[int]] = [[] for _ in range(rows + parked_rows)]
        self.prefixes = PrefixIndex(rows + parked_rows)
        self.parked = list(range(rows, rows + parked_rows))  # the parked rows, least recently used first

    @property
    def rows(self) -> int:
        return len(self.busy)

    def free_rows(self) -> list[int]:
        return [r for r, busy in enumerate(self.busy) if not busy]

    @torch.no_grad()
    def prefill(self, row: int, tokens: list[int], start: int = 0) -> torch.Tensor:
        """Put `tokens` into the row's cache at slots [start, start + len): a whole prompt, or one span of it after
        the spans before (start > 0), so that a long prompt need not stall the other rows for long. -> the logits
        after the last token (vocab,) fp32, on the device."""
        if self.busy[row]:
            raise UserError(f"row {row} is decoding; free it before prefilling it again")
        if not tokens or start + len(tokens) >= self.capacity:
            raise UserError(f"a span of {len(tokens)} tokens at slot {start} does not fit a row of capacity "
                            f"{self.capacity} (it must leave room for a generated token)")
        engine = self.engine
        from redline.inference.engine import _evaluating

        ids = to_device([list(tokens)], engine.device)

        if start > len(self.held[row]):
            raise UserError(f"row {row} holds {len(self.held[row])} tokens; a span cannot start at slot {start}")
        with _evaluating(engine.model):
            logits = engine._prefill(self.state, ids, [len(tokens)], row0=row, start=start)[0]
        # until start(), decode steps of the other rows run this row too, parked at the last slot (as a free row)
        put(self.state.slot, row, self.capacity - 1)
        self.hold(row, self.held[row][:start] + list(tokens))
        return logits

    @torch.no_grad()
    def prefill_many(self, rows: list[int], prompts: list[list[int]], start: int = 0) -> torch.Tensor:
        """Prompts into the caches of several free rows (any rows, any order) in one batched forward, at slots
        [start, start + len) of each: whole prompts (start 0), or the rest of prompts whose first `start` tokens
        the rows hold already (copy_prefix). Right-padded to the longest (the padding's keys and values land in
        slots past each prompt, which its row's decode steps write before they read them). -> the logits after
        each prompt (len(rows), vocab) fp32, on the device."""
        if len(rows) != len(prompts) or not rows:
            raise UserError(f"prefill_many needs one prompt per row, got {len(rows)} rows and {len(prompts)} prompts")
        longest = max(len(p) for p in prompts)
        for row, prompt in zip(rows, prompts):
            if self.busy[row]:
                raise UserError(f"row {row} is decoding; free it before prefilling it again")
            if not prompt or start + longest >= self.capacity:
                raise UserError(f"a prompt of {len(prompt)} tokens (padded to {longest}) at slot {start} does not "
                                f"fit a row of capacity {self.capacity} (it must leave room for a generated token)")
            if start > len(self.held[row]):
                raise UserError(f"row {row} holds {len(self.held[row])} tokens; a span cannot start at slot {start}")
        engine = self.engine
        from redline.inference.engine import _evaluating

        n = len(rows)
        graphed = self._graph_width(graph_rows(n), longest, start)
        if graphed:  # the last prompt again in the padding rows: it writes its own row again, the same values
            rows, prompts = rows + rows[-1:] * (graph_rows(n) - n), prompts + prompts[-1:] * (graph_rows(n) - n)
        ids = torch.zeros(len(rows), graphed or longest, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, :len(prompt)] = torch.as_tensor(prompt, dtype=torch.long)
        # every host-to-device copy here is from pinned memory, non-blocking (to_device): the rows decoding keep
        # the device busy while the host goes on to launch their next steps
        ids, where = to_device(ids, engine.device), to_device(rows, engine.device)
        with _evaluating(engine.model):
            if graphed:
                logits = engine.prefill_rows(self.state, ids, where,
                                             to_device([len(p) - 1 for p in prompts], engine.device), start)[:n]
            else:
                logits = engine._prefill(self.state, ids, [len(p) for p in prompts], start=start, rows_at=rows)
        self.state.slot.index_fill_(0, where, self.capacity - 1)  # as prefill()
        rows, prompts = rows[:n], prompts[:n]
        for row, prompt in zip(rows, prompts):
            self.hold(row, self.held[row][:start] + list(prompt))
        return logits

    def hold(self, row: int, tokens: list[int]) -> None:
        """Record that the row's cache holds `tokens` at slots [0, len(tokens)): its prompt once prefilled, its prompt
        and generated tokens (all but the last, whose key and value no step wrote) once its sequence ends."""
        if len(tokens) >= self.capacity:
            tokens = tokens[:self.capacity - 1]  # the last slot is where rows that do not decode are parked
        old = self.held[row]
        grew = len(tokens) >= len(old) and tokens[:len(old)] == old  # a sequence that went on: its hashes stay
        self.held[row] = tokens
        self.prefixes.set(row, tokens, grew)

    def match(self, tokens: list[int], exclude=(), parked: bool = True) -> tuple[int, int]:
        """(row, n): a row, not in exclude, whose cache holds tokens[:n] (n in whole blocks of
        prefix_cache.BLOCK tokens), or (-1, 0); a parked row too unless parked=False. The row may be decoding: its
        first slots stay as they are. None for a model with gated delta nets: their state belongs to a row's whole
        sequence, not to its slots, and a copied prefix would not carry it; none for a prefix-LM (model.prefix_lm)
        either: its prompt's keys and values depend on the whole prompt, which attends to itself both ways; none with
        model.reference_window: a row's slots past its prompt were windowed, which a longer prompt would not be."""
        if self.state.cache.states or self.engine.cfg.prefix_lm or self.engine.cfg.reference_window:
            return -1, 0
        return self.prefixes.match(tokens, exclude if parked else set(exclude).union(self.parked))

    def forget(self) -> None:
        """Trust no row's cache any more (after a failure): every row, parked ones too, holds nothing."""
        for row in range(len(self.held)):
            self.held[row] = []
            self.prefixes.set_hashes(row, [])

    def touch(self, row: int, first_out: bool = False) -> None:
        """A parked row becomes the most recently used (the last to make room), or with first_out the first."""
        if row in self.parked:
            self.parked.remove(row)
            self.parked.insert(0, row) if first_out else self.parked.append(row)

    @torch.no_grad()
    def park(self, rows: list[int], keep=()) -> None:
        """Copy what each of these free rows holds into a parked row, before they are prefilled or copied into
        again: into the parked row that holds a beginning of it (a conversation's last turn, which this one goes
        on from), else the least recently used one not in `keep` (those the new sequences are about to copy from).
        A row holding less than a block, or nothing a parked row does not hold already, is left. One gather and
        one scatter per cache buffer for all of them."""
        if any(self.busy[row] for row in rows):
            raise UserError(f"rows {[r for r in rows if self.busy[r]]} are decoding; they cannot be parked")
        moves = []
        for row in rows if self.parked else ():
            hashes = self.prefixes.hashes[row]
            if not hashes:
                continue
            src_n = len(hashes) * BLOCK
            chosen = {d for _, d, _ in moves}.union(keep)
            dst, n = self.prefixes.match_hashes(hashes, [p for p in self.parked if p not in chosen])
            if n == src_n:
                self.touch(dst)  # parked already
                continue
            if dst < 0 or n < len(self.prefixes.hashes[dst]) * BLOCK:  # not a beginning of it: the LRU one
                dst = next((p for p in self.parked if p not in chosen), -1)
                if dst < 0:  # more rows than parked rows in one call: the first ones keep their places
                    break
            moves.append((row, dst, src_n))
            self.touch(dst)
        if not moves:
            return
        device = self.engine.device
        src, dst, lengths = zip(*moves)
        self.state.cache.copy_slots(to_device(list(src), device), to_device(list(dst), device), max(lengths))
        for row, p, n in moves:
            self.held[p] = self.held[row][:n]
            self.prefixes.set_hashes(p, self.prefixes.hashes[row])

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Copy slots [0, n) of row src's cache (what match() found) into row dst, which is not decoding; dst then
        holds src's first n tokens, and prefill_many([dst], [rest], n) goes on from there. Queued after whatever
        the device has been asked for before (src may be decoding meanwhile: a decode step writes only at its
        row's own slot, past its prompt)."""
        self.copy_prefixes([(src, dst)], n)

    @torch.no_grad()
    def copy_prefixes(self, copies: list[tuple[int, int]], n: int) -> None:
        """copy_prefix for several (src, dst) pairs of one length: one gather and one scatter per cache buffer for
        all of them, every layer at once. A dst must not be any pair's src."""
        moved = []
        for src, dst in copies:
            if self.busy[dst]:
                raise UserError(f"row {dst} is decoding; free it before copying a prefix into it")
            if not 0 < n <= len(self.held[src]):
                raise UserError(f"row {src} holds {len(self.held[src])} tokens; cannot copy {n}")
            if src != dst:
                moved.append((src, dst))
        if moved:
            src, dst = zip(*moved)
            if set(src) & set(dst):
                raise UserError("copy_prefixes: a row is both copied from and copied into")
            device = self.engine.device
            self.state.cache.copy_slots(to_device(list(src), device), to_device(list(dst), device), n)
            self.state.slot.index_fill_(0, to_device(list(dst), device), self.capacity - 1)
        held = {src: (self.held[src][:n], self.prefixes.hashes[src][:n // BLOCK]) for src, _ in copies}
        for src in held:  # a parked row copied into the batch: its tokens live in a row of the batch now (parked
            self.touch(src, first_out=True)  # again from there when that row is given out): the first to make room
        for src, dst in copies:
            self.held[dst] = held[src][0]
            self.prefixes.set_hashes(dst, held[src][1])

    @property
    def prefill_graphs(self) -> int:
        """How many prefill shapes (rows, width, start) this batch holds CUDA graphs of."""
        return self.engine.prefill_graphs(self.state)

    def _graph_width(self, n: int, longest: int, start: int = 0) -> int:
        """The padded width of a CUDA-graph prefill of n prompts of at most `longest` tokens at slot `start` (one
        graph per (n, width, start)), or 0 for none (no CUDA graphs, more tokens than one chunk, or PREFILL_GRAPHS
        shapes captured already). Widths are multiples of PREFILL_WIDTH_STEP, so prompts of similar lengths share a
        graph; the padding's keys and values land past each prompt, where its row's decode steps write before they
        read (as the padding to the longest does)."""
        engine = self.engine
        if self.state.graphs is None:
            return 0
        width = min(-(-longest // PREFILL_WIDTH_STEP) * PREFILL_WIDTH_STEP, self.capacity - 1 - start)
        if n * width > engine.plan.prefill_chunk_tokens:
            return 0
        known = ("prefill", n, width, start) in self.state.prefill_inputs
        if known or engine.prefill_graphs(self.state) < PREFILL_GRAPHS:
            return width
        if not self._warned_graphs:  # once: from here on such prefills launch kernel by kernel, far slower
            self._warned_graphs = True
            print(f"redline: {PREFILL_GRAPHS} prompt shapes (rows, width, start) are captured as CUDA graphs, the "
                  f"most kept; prompts of other shapes are prefilled without one from now on (slower)",
                  file=sys.stderr, flush=True)
        return 0

    def start(self, row: int, first_token: int, length: int, temperature: float = 0.0, top_p: float = 1.0) -> None:
        """The row decodes from `first_token` on, its prompt having `length` tokens in the cache; in decode_sampled's
        steps it samples at `temperature` (0: greedy) among the tokens that reach `top_p`."""
        st = self.state
        put(st.tokens, (row, 0), first_token)
        put(st.history, (row, length), first_token)
        put(st.slot, row, length)
        put(st.active, row, 1)
        put(self._temperature, (row, 0), temperature)
        put(self._top_p, (row, 0), top_p if top_p < 1 else float("inf"))
        self.lengths[row], self.busy[row] = length, True

    def free(self, row: int) -> None:
        """The row stops decoding at once (finished, stopped, or its client went away)."""
        st = self.state
        put(st.active, row, 0)
        put(st.slot, row, self.capacity - 1)  # parked where it writes nothing its cache holds (module docstring)
        self.lengths[row], self.busy[row] = 0, False

    def room(self, row: int) -> int:
        """Tokens the row can still generate before its cache is full."""
        return self.capacity - 1 - self.lengths[row]

    @torch.no_grad()
    def step(self, greedy: bool = True) -> torch.Tensor:
        """One decode step of every active row. greedy: -> the next tokens (rows,) on the device, already fed back
        as the next step's inputs and recorded (the argmax runs inside the captured step); else -> the logits
        (rows, vocab) fp32, and the caller samples and calls advance()."""
        if not any(self.busy):
            raise UserError("no row is decoding: prefill and start one first")
        engine, st = self.engine, self.state
        longest = max(self.lengths)  # a free row's length is 0: the busy rows' longest
        if self.capacity - 1 - longest < 1:
            raise UserError("a row's cache is full: free it (it reached the batch's capacity)")
        width = engine._width(st, longest)
        from redline.inference.engine import _evaluating

        with _evaluating(engine.model):
            engine._prepare_step(st, width, greedy)
            logits, nxt = engine._step(st, width, greedy)
        if greedy:
            self._advanced()
            return nxt
        return logits

    @torch.no_grad()
    def decode_greedy(self, n: int, ends: dict[int, list[int]] | None = None) -> torch.Tensor:
        """n greedy steps in a row (the argmax inside each captured step), with the host doing no more than
        launching them; the rows in ends[i] are freed right after step i (0-based: they got their last token).
        -> each row's n new tokens (n, rows) on the device, read from the history in one gather (a row freed
        part-way: its tokens after that are junk)."""
        engine, st, ends = self.engine, self.state, ends or {}
        longest, where = self._group_start(n, ends)
        from redline.inference.engine import _evaluating

        with _evaluating(engine.model):
            if n == self.group_steps:
                self._group_replay(n, engine._width(st, min(longest + n - 1, self.capacity - 1)), ends)
            else:
                for i in range(n):
                    width = engine._width(st, min(longest + i, self.capacity - 1))
                    engine._prepare_step(st, width, True)
                    engine._step(st, width, True)
                    for row in ends.get(i, ()):
                        self.free(row)
        return self._group_end(n, where)

    @torch.no_grad()
    def decode_sampled(self, n: int, ends: dict[int, list[int]] | None = None,
                       generators: dict[int, torch.Generator] | None = None, shared: torch.Generator | None = None,
                       top_p: bool = False) -> torch.Tensor:
        """n steps in which each row takes its token as start() set it: sampled at its temperature (and top-p, if
        `top_p`: some row filters), or the argmax at temperature 0. Before each step the host draws the step's noise
        (one kernel from `shared` for every row, then one per row with a generator of its own in `generators`: a
        seeded request draws as it would alone), then launches the step, whose draw (sampling.draw_rows) is
        captured with it: one graph per (width, top_p). Rows in ends[i] are freed after step i. -> (n, rows) as
        decode_greedy."""
        engine, st, ends, generators = self.engine, self.state, ends or {}, generators or {}
        longest, where = self._group_start(n, ends)
        if self._noise is None:
            self._noise = torch.empty(self.rows, engine.cfg.head_width, device=engine.device)  # as the logits
        from redline.inference.engine import _evaluating

        with _evaluating(engine.model):
            for i in range(n):
                self._noise.exponential_(1, generator=shared)
                for row, generator in generators.items():
                    self._noise[row].exponential_(1, generator=generator)
                width = engine._width(st, min(longest + i, self.capacity - 1))
                if st.graphs is None:
                    self._sampled_step(width, top_p)
                else:
                    key = ("sampled", width, top_p)
                    if key not in st.graphs:
                        step = lambda: self._sampled_step(width, top_p)  # noqa: E731
                        st.graphs.capture(key, step, lambda: engine._warm_step(st, width, False, step))
                    st.graphs.replay(key)
                for row in ends.get(i, ()):
                    self.free(row)
        return self._group_end(n, where)

    def _sampled_step(self, width: int, top_p: bool) -> torch.Tensor:
        """decode_sampled's step on the device alone (what its graph holds): the logits, every row's draw, the
        tokens fed back. -> (rows,)"""
        st = self.state
        logits, _ = self.engine._decode_step(st, width, False)
        tokens = draw_rows(logits, self._temperature, self._top_p if top_p else None, self._noise)
        feed_back(tokens, st.tokens, st.history, st.slot, st.active)
        return tokens

    def _group_start(self, n: int, ends: dict[int, list[int]]) -> tuple[int, torch.Tensor]:
        """Checks for n steps (ends as decode_greedy's) -> the busy rows' longest length, and where in the history
        each row's n new tokens will be (rows, n)."""
        if not any(self.busy):
            raise UserError("no row is decoding: prefill and start one first")
        st = self.state
        last = {row: i + 1 for i, rows in ends.items() for row in rows}  # steps a row ending in the group takes
        if any(n_ + last.get(r, n) > self.capacity - 1 for r, n_ in enumerate(self.lengths) if self.busy[r]):
            raise UserError(f"{n} steps would run a row past the batch's capacity of {self.capacity}: free it "
                            f"before (pass it in `ends`) or decode fewer steps")
        # the step producing a row's token at slot s writes it to history[s + 1]
        where = (st.slot[:, None] + 1 + torch.arange(n, device=st.slot.device)).clamp_(max=st.history.shape[1] - 1)
        return max(self.lengths), where

    def _group_end(self, n: int, where: torch.Tensor) -> torch.Tensor:
        self.lengths = [n_ + n if busy else 0 for n_, busy in zip(self.lengths, self.busy)]
        return self.state.history.gather(1, where).t()

    def _group_replay(self, n: int, width: int, ends: dict[int, list[int]]) -> None:
        """decode_greedy's n steps as one graph: every step attends over `width` (the last step's: the earlier
        steps mask the slots past each row's own), and after step i the rows whose _end_at is i are freed on the
        device (active to 0, the slot parked at the last, as free() does), so the graph needs nothing from the host
        mid-group."""
        engine, st = self.engine, self.state
        key = ("group", width, n)
        if key not in st.graphs:
            engine._prepare_step(st, width, True)  # the single step compiled and warm for this width

            def steps():
                for i in range(n):
                    engine._decode_step(st, width, True)
                    keep = self._end_at != i  # (rows,)
                    st.active.mul_(keep)
                    st.slot.copy_(torch.where(keep, st.slot, self.capacity - 1))

            st.graphs.capture(key, steps, lambda: engine._warm_step(st, width, True))
        end_at = [n] * self.rows
        for i, rows in ends.items():
            for row in rows:
                end_at[row] = i
        self._end_at.copy_(to_device(end_at, engine.device))
        st.graphs.replay(key)
        for rows in ends.values():
            for row in rows:
                self.free(row)  # the host's record (the device did it in the graph)

    def advance(self, tokens: torch.Tensor) -> None:
        """After step(greedy=False): feed each row's sampled token (rows,) back and record it."""
        st = self.state
        feed_back(tokens, st.tokens, st.history, st.slot, st.active)
        self._advanced()

    def _advanced(self) -> None:
        self.lengths = [n + busy for n, busy in zip(self.lengths, self.busy)]
