"""The engine in a process of its own: `redline serve --engine-process` (the default on a GPU).

Why: the scheduler's thread (scheduler.py: bookkeeping, detokenizing, stop checks per token) and the HTTP side
(FastAPI, JSON, server-sent events) are both Python. In one process they hold one GIL and take turns, so every
microsecond the HTTP side spends is a microsecond the next decode step waits for. In two processes they run at
once, as vLLM runs its API server and its engine core (vllm/v1/engine/core_client.py, core.py).

How it works
- `EngineProcess.start(builder, *args)` spawns a process (spawn: CUDA does not survive a fork) that runs
  `builder(*args)` -> a Scheduler (the model loaded, warmed up: compiled and captured before it reports ready)
  and answers ("ready", what the API needs to know) or ("failed", why).
- The API process's EngineProcess stands where the Scheduler stands in the in-thread server (api.py uses either):
  `submit()` checks the sequences as the Scheduler does and sends them (id, prompt, max_tokens, sampling, stop
  strings, stop ids) in one message; a sequence's `cancel()` sends its id.
- In the engine process each sequence's sink appends (id, event) to an outbox; at the end of each scheduler turn
  (Scheduler.flushes) the outbox goes to the API process as ONE message, with a snapshot of the counters for
  /metrics: one message per group of decode steps, not one per token.
- A reader thread in the API process hands each message's events to the requests' sinks (api.py's Mailbox) and
  flushes them: one wake-up of the event loop per message.
- The engine process ending (a crash, killed) ends every request waiting on it with an error event, makes
  `failure` say why (/health answers 503) and new requests 503. Shutdown: `drain()` and `close()` are sent as
  messages; `close()` waits for the process, and kills it if it does not end. The engine process ends by itself
  when the API process goes away (its end of the pipe closes), and ignores SIGINT and SIGTERM (a terminal's
  Ctrl-C and a service manager's SIGTERM reach the whole process group; the API process drains, then stops it).
"""

from __future__ import annotations

import atexit
import collections
import itertools
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass

from redline.errors import UserError
from redline.serve.scheduler import (Scheduler, Sequence, ShuttingDown, Stats, check_fits, check_queue,
                                     check_sequences)


class EngineFailed(ShuttingDown):
    """The engine process has ended: nothing can run (HTTP 503)."""


WIRE_FIELDS = ("prompt", "max_tokens", "sampling", "stop", "stop_ids", "logprobs", "prompt_logprobs", "penalties",
               "logit_bias")
"""What a sequence sends to the engine process (its sink and state stay on each side)."""


def to_wire(rid: int, seq: Sequence) -> tuple:
    return (rid, *(getattr(seq, name) for name in WIRE_FIELDS))


def from_wire(item: tuple) -> tuple[int, Sequence]:
    """to_wire's (id, fields) -> (id, the engine process's Sequence, its sink not set yet)."""
    rid, *values = item
    return rid, Sequence(sink=None, **dict(zip(WIRE_FIELDS, values)))


@dataclass(eq=False)
class RemoteSequence(Sequence):
    """A sequence in the API process whose tokens are generated in the engine process: its state (tokens counted,
    finish_reason) is what the engine reported."""

    rid: int = -1
    counted: int = 0
    """Output tokens so far as the engine counts them (its `completion_tokens`)."""
    owner: EngineProcess | None = None

    @property
    def completion_tokens(self) -> int:
        return self.counted

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            if self.owner is not None and not self.done:
                self.owner.send_cancel(self.rid)


class EngineProcess:
    """The API process's side of the engine process: the interface of scheduler.Scheduler that api.py uses."""

    sequence_type = RemoteSequence

    def __init__(self, process, conn, info: dict, max_queue: int):
        self.process, self.conn = process, conn  # process: None in an API process that attached
        self.pid = process.pid if process is not None else info.get("pid")
        self.spare: list = []  # start(frontends=N): the other API processes' pipe ends
        self.capacity, self.vocab_size, self.batch_rows = info["capacity"], info["vocab_size"], info["rows"]
        self.head_width = info["head_width"]
        self._describe = info["describe"]
        self.max_queue = max_queue
        self.stats = Stats()
        self.flushes = []
        self.failure: str | None = None
        self._fatal: str | None = None  # why the engine process is about to end, when it knows
        self._seqs: dict[int, RemoteSequence] = {}  # in flight: submitted, no final event yet
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._sent = self._received = self._waiting = self._busy = 0
        self._replies: collections.deque = collections.deque()
        self._replied = threading.Condition()
        self._closing = False
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="redline-engine-reader", daemon=True)
        self._reader.start()
        atexit.register(self.close)  # before multiprocessing's own atexit joins the (non-daemon) process

    @classmethod
    def start(cls, builder, *args, max_queue: int = 256, switch_interval_s: float | None = None,
              frontends: int = 1) -> EngineProcess:
        """Spawn the engine process, which builds its scheduler with `builder(*args)` (a module-level function:
        it travels by name), and wait until it is ready. A UserError with the engine's own message if it fails.
        frontends > 1: the engine serves that many API processes, each over a pipe of its own; this one is the
        first, and `spare` holds the other pipes' ends for the others (attach())."""
        ctx = multiprocessing.get_context("spawn")
        pairs = [ctx.Pipe() for _ in range(frontends)]
        conn, child_conns = pairs[0][0], [child for _, child in pairs]
        process = ctx.Process(target=engine_main, args=(child_conns, builder, args, switch_interval_s),
                              name="redline-engine")
        process.start()
        for child in child_conns:
            child.close()  # the child holds its own copies: when it ends, recv() here sees the end of the pipe
        try:
            reply = conn.recv()
        except (EOFError, OSError):
            process.join(5)
            raise UserError(f"the engine process ended while starting (exit code {process.exitcode}); see the "
                            f"messages above") from None
        except BaseException:  # Ctrl-C while it loads (or compiles, for minutes): do not leave it behind
            conn.close()
            _stop(process, 1.0)
            raise
        if reply[0] != "ready":
            conn.close()
            _stop(process)
            raise UserError(reply[1])
        engine = cls(process, conn, reply[1], max_queue)
        engine.spare = [end for end, _ in pairs[1:]]
        return engine

    @classmethod
    def attach(cls, conn, max_queue: int = 256) -> EngineProcess:
        """In another API process: the engine process's side of one of start()'s spare pipes (its "ready" message
        waits in it). This process does not own the engine process: close() ends only its own connection."""
        reply = conn.recv()
        if reply[0] != "ready":
            raise UserError(f"the engine process did not start: {reply[1]}")
        return cls(None, conn, reply[1], max_queue)

    # -- what api.py uses (the event loop's thread, and executors at shutdown) ---------------------------

    def describe(self) -> dict:
        return dict(self._describe)

    def check(self, prompt_tokens: int, max_tokens: int) -> None:
        check_fits(prompt_tokens, max_tokens, self.capacity)

    def queue_depth(self) -> int:
        """Sequences waiting for a row: the engine's last count plus those sent since it counted."""
        return self._waiting + max(self._sent - self._received, 0)

    def busy_rows(self) -> int:
        return self._busy

    def submit(self, sequences: list[RemoteSequence]) -> None:
        """Check and send sequences (all or none), as Scheduler.submit queues them."""
        if self.failure:
            raise EngineFailed(f"{self.failure}; restart the server")
        if self._closing:
            raise ShuttingDown("the server is shutting down; retry against another one or later")
        check_sequences(sequences, self.vocab_size, self.capacity, self.head_width)
        check_queue(self.queue_depth(), len(sequences), self.max_queue)
        wire = []
        for seq in sequences:
            seq.rid, seq.owner = next(self._ids), self
            self._seqs[seq.rid] = seq
            wire.append(to_wire(seq.rid, seq))
        self.stats.requests += len(sequences)
        self._sent += len(sequences)
        if not self._send(("submit", wire)):
            for seq in sequences:
                self._seqs.pop(seq.rid, None)
            raise EngineFailed(f"{self.failure or 'the engine process has ended'}; restart the server")

    def refresh_stats(self, timeout: float = 2.0) -> None:
        """Bring `stats` up to the engine's counters now (a round trip over the pipe; blocks up to `timeout`).
        Between turns' messages they lag, and with several API processes one that has answered nothing lately
        holds counters from then: a scrape of /metrics that reached it would see them go back."""
        if self._send(("snapshot",)):
            self._reply("snapshot", timeout)

    def send_cancel(self, rid: int) -> None:
        self._send(("cancel", rid))

    def drain(self, timeout: float) -> bool:
        """Stop admitting; let the engine finish what is queued and running for at most `timeout` seconds, then
        cancel the rest (their clients get a 503 error event) and close. -> whether everything finished."""
        self._closing = True
        drained = False
        if self._send(("drain", timeout)):
            reply = self._reply("drained", timeout + 30)
            drained = bool(reply and reply[1])
        self.close()
        return drained

    def close(self, timeout: float = 10.0) -> None:
        """Cancel whatever still runs (503 error events), stop the engine process and wait for it (killed if it
        does not end in time). Safe to call more than once, from any thread."""
        with self._close_lock:  # a second caller waits for the first's close to end
            if self._closed:
                return
            self._closed = self._closing = True
            if self._send(("close",)):
                self._reply("closed", timeout)
            if self.process is not None:
                _stop(self.process, timeout)  # its end of the pipe closes with it: the reader sees the end and stops
            # (an attached process's: the engine closes its end of this pipe after answering "closed")
            self._reader.join(timeout)
            self.conn.close()

    # -- messages to the engine, and the reader thread of its messages -----------------------------------

    def _send(self, message) -> bool:
        """Send a message to the engine process; False if it is gone."""
        try:
            with self._send_lock:
                self.conn.send(message)
            return True
        except (OSError, ValueError):  # a broken pipe, or our end already closed
            return False

    def _reply(self, kind: str, timeout: float):
        deadline = time.monotonic() + timeout
        with self._replied:
            while not any(r[0] == kind for r in self._replies):
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    return None
                self._replied.wait(min(left, 0.5))
            reply = next(r for r in self._replies if r[0] == kind)
            self._replies.remove(reply)
            return reply

    def _read(self) -> None:
        try:
            while True:
                message = self.conn.recv()
                if message[0] == "events":
                    self._take(message[1], message[2])
                elif message[0] == "snapshot":  # refresh_stats()'s answer: applied here, in order with events
                    self._apply(message[1])
                    with self._replied:
                        self._replies.append(message[:1])
                        self._replied.notify_all()
                elif message[0] == "fatal":  # the engine process ends next: _ended says why
                    self._fatal = message[1]
                else:
                    with self._replied:
                        self._replies.append(message)
                        self._replied.notify_all()
        except (EOFError, OSError):  # the engine process ended (or close() closed our end)
            pass
        except Exception as e:  # a message that cannot be read: the engine cannot be trusted any more
            print(f"redline serve: reading from the engine process failed: {type(e).__name__}: {e}",
                  file=sys.stderr, flush=True)
        self._ended()

    def _take(self, items: list, snapshot: tuple) -> None:
        """One scheduler turn's events: into each request's sink, then one flush (one wake-up per event loop)."""
        seqs = self._seqs
        for item in items:
            seq = seqs.get(item[0])
            if seq is None:
                continue
            event = item[1]
            if event[0] == "text":
                seq.counted = event[2]
            elif event[0] != "prompt":  # its last event
                seq.counted, seq.cached_tokens = item[2], item[3]
                seq.finish_reason = event[1] if event[0] == "done" else "error"
                del seqs[item[0]]
            seq.sink(event)
        self._apply(snapshot)
        for flush in self.flushes:
            flush()

    def _apply(self, snapshot: tuple) -> None:
        s = self.stats
        (self._received, finished, s.prompt_tokens, s.cached_tokens, s.completion_tokens, s.steps, s.busy_row_steps,
         s.prefill_graphs, self._waiting, self._busy, ttfts, ttft_count, ttft_sum_s) = snapshot
        s.finished = collections.Counter(finished)
        with s.lock:  # the recent ones this process was sent, for quantiles; the count and sum are the engine's
            s.ttft_s.extend(ttfts)
            s.ttft_count, s.ttft_sum_s = ttft_count, ttft_sum_s

    def _ended(self) -> None:
        """The engine process is gone: every request still waiting on it ends with an error."""
        if not self._closed:
            code = None
            if self.process is not None:
                self.process.join(2)
                code = self.process.exitcode
            self.failure = (self._fatal or (f"the engine process ended unexpectedly (exit code {code})"
                                            if code is not None else "the connection to the engine process broke"))
            print(f"redline serve: {self.failure}", file=sys.stderr, flush=True)
        message = self.failure or "the server shut down before this request finished; retry it"
        for rid, seq in list(self._seqs.items()):
            seq.finish_reason = "error"
            seq.sink(("error", message) if self.failure else ("error", message, 503))
            self._seqs.pop(rid, None)
        self._busy = self._waiting = 0
        self._sent = self._received
        for flush in self.flushes:
            flush()
        with self._replied:
            self._replied.notify_all()


def _stop(process, timeout: float = 10.0) -> None:
    """Wait for the engine process to end, then kill it (it ignores SIGTERM: see engine_main)."""
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join(5)


# -- the engine process ------------------------------------------------------------------------------------


class _ReportedStats(Stats):
    """The scheduler's counters, with the times to first token not yet sent to the API process."""

    def __init__(self):
        super().__init__()
        self.fresh: list[float] = []

    def add_ttft(self, seconds: float) -> None:
        super().add_ttft(seconds)
        with self.lock:
            self.fresh.append(seconds)

    def take_fresh(self) -> list[float]:
        with self.lock:
            fresh, self.fresh = self.fresh, []
            return fresh


class _Outbox:
    """The engine process's side: each sequence's sink appends (id, event) here from the scheduler's thread, under
    the API process (frontend) it came from; the scheduler's flush sends each frontend its events as one message."""

    def __init__(self, conns: list, scheduler: Scheduler):
        self.conns, self.scheduler = conns, scheduler
        self.locks = [threading.Lock() for _ in conns]  # the scheduler's thread and the main thread both send
        self.items: list[list[tuple]] = [[] for _ in conns]
        self.live: dict[tuple[int, int], Sequence] = {}  # (frontend, id) -> its sequence
        self.received = [0] * len(conns)
        reported = _ReportedStats()
        reported.prefill_graphs = scheduler.stats.prefill_graphs  # the warm-up's, counted before this outbox
        scheduler.stats = reported
        scheduler.flushes.append(self.flush)

    def sink(self, frontend: int, rid: int, seq: Sequence):
        """Seq's sink (called from the scheduler's thread alone: items needs no lock)."""
        live, items = self.live, self.items

        def put(event: tuple) -> None:
            if event[0] in ("text", "prompt"):
                items[frontend].append((rid, event))
            else:  # its last event, with the tokens that count as its output and the prompt's copied ones
                items[frontend].append((rid, event, seq.completion_tokens, seq.cached_tokens))
                live.pop((frontend, rid), None)

        return put

    def snapshot(self, frontend: int) -> tuple:
        """The counters for a frontend's /metrics: the engine's, with what that frontend sent (its queue depth),
        the times to first token since the last snapshot (recent ones for its quantiles: split among frontends when
        there are several), and the engine's count and sum of them all."""
        s, sched = self.scheduler.stats, self.scheduler
        return (self.received[frontend], dict(s.finished), s.prompt_tokens, s.cached_tokens, s.completion_tokens,
                s.steps, s.busy_row_steps, s.prefill_graphs, len(sched.waiting), sched.busy_rows(), s.take_fresh(),
                s.ttft_count, s.ttft_sum_s)

    def flush(self) -> None:
        for frontend, items in enumerate(self.items):
            if items:
                self.items[frontend] = []
                self.send(frontend, ("events", items, self.snapshot(frontend)))

    def send(self, frontend: int, message) -> None:
        try:
            with self.locks[frontend]:
                self.conns[frontend].send(message)
        except (OSError, ValueError):  # that API process is gone; the main thread sees it too
            pass

    def submit(self, frontend: int, wire: list[tuple]) -> None:
        seqs = []
        for item in wire:
            rid, seq = from_wire(item)
            seq.sink = self.sink(frontend, rid, seq)
            seqs.append(seq)
            self.live[frontend, rid] = seq
        try:
            self.scheduler.submit(seqs)
        except Exception as e:  # checked in the API process already: a race with the queue's limit, or shutdown
            event = ("error", str(e), 503) if isinstance(e, ShuttingDown) else ("error", str(e))
            for rid, *_ in wire:
                self.live.pop((frontend, rid), None)
            self.received[frontend] += len(wire)
            # sent from this thread, apart from the outbox (which the scheduler's thread alone fills and sends)
            self.send(frontend, ("events", [(rid, event, 0) for rid, *_ in wire], self.snapshot(frontend)))
            return
        self.received[frontend] += len(wire)


def engine_main(conns: list, builder, args: tuple, switch_interval_s: float | None) -> None:
    """The engine process: build the scheduler, report ready on every API process's pipe (conns), then serve
    their messages until the first says close or goes away."""
    # a terminal's Ctrl-C and a service manager's SIGTERM reach every process of the group: the API process drains,
    # then closes this one (which also ends by itself when the API process's end of the pipe closes)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if switch_interval_s:
        sys.setswitchinterval(switch_interval_s)
    try:
        scheduler = builder(*args)
    except BaseException as e:
        if not isinstance(e, UserError):
            traceback.print_exc()
        message = str(e) if isinstance(e, UserError) else f"the engine failed to start: {type(e).__name__}: {e}"
        for conn in conns:
            try:
                conn.send(("failed", message))
            except (OSError, ValueError):
                pass
            conn.close()
        return
    outbox = _Outbox(conns, scheduler)
    info = {"capacity": scheduler.capacity, "vocab_size": scheduler.vocab_size, "head_width": scheduler.head_width,
            "rows": scheduler.batch_rows,
            "describe": scheduler.describe(), "pid": os.getpid()}
    for frontend in range(len(conns)):
        outbox.send(frontend, ("ready", info))
    try:
        _serve(conns, scheduler, outbox)
    finally:
        scheduler.close()
        for frontend, conn in enumerate(conns):
            outbox.send(frontend, ("closed",))
            conn.close()


def _serve(conns: list, scheduler: Scheduler, outbox: _Outbox) -> None:
    """The engine process's main thread: the API processes' messages, until the first (the one that started this
    process) says close or goes away; another that says close is answered and let go. A scheduler thread that
    died (nothing would ever answer the requests) is reported as fatal."""
    draining = False
    index = {id(conn): frontend for frontend, conn in enumerate(conns)}
    open_conns = list(conns)
    while open_conns:
        ready = multiprocessing.connection.wait(open_conns, 1.0)
        if not ready:
            if not scheduler.alive and not draining:
                for frontend in range(len(conns)):
                    outbox.send(frontend, ("fatal", "the engine's scheduler thread died (its error is printed "
                                                    "above)"))
                return
            continue
        for conn in ready:
            frontend = index[id(conn)]
            try:
                message = conn.recv()
            except (EOFError, OSError):  # that API process is gone
                if frontend == 0:
                    return
                open_conns.remove(conn)
                continue
            if message[0] == "submit":
                outbox.submit(frontend, message[1])
            elif message[0] == "snapshot":
                outbox.send(frontend, ("snapshot", outbox.snapshot(frontend)))
            elif message[0] == "cancel":
                seq = outbox.live.get((frontend, message[1]))
                if seq is not None:
                    seq.cancel()
            elif message[0] == "drain":
                draining = True
                def drain(t=message[1], f=frontend):  # each API process drains (SIGTERM reaches them all)
                    outbox.send(f, ("drained", scheduler.drain(t)))

                threading.Thread(target=drain, daemon=True).start()
            elif message[0] == "close":
                if frontend == 0:
                    return
                outbox.send(frontend, ("closed",))
                open_conns.remove(conn)
                conn.close()
