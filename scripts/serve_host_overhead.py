"""Host (CPU) time of `redline serve`'s scheduler per decode step and per generated token, with the model's work
taken out: a stand-in DecodeBatch hands back precomputed tokens at once, so everything timed is the scheduler's
own per-group work (reading tokens back, stop checks, incremental detokenization, the sinks) and, by default, the
engine process's outbox (redline/serve/engine_process.py: each turn's events pickled and written as one message,
here to /dev/null).

    python scripts/serve_host_overhead.py [--rows 64] [--max-tokens 256] [--sync-every 8] [--stop STR ...]
        [--sink outbox|null] [--repeats 7] [--profile 30]

The tokens are real text (the embedded corpus's docstrings) through the embedded default tokenizer (a 4096-token
byte-level BPE, built once into redline's cache), so decoding costs what it does in a server. Prints the median
over the repeats of host microseconds per decode step and per token, and a digest of every event the requests
got (compare it before and after a change: it must not move). On a GPU the host keeps up while this per-step
time is below the device's time per step (~0.36 ms for 64 rows of a 124M model on an H100).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import os
import pickle
import pstats
import statistics
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from redline.data.embedded import embedded_documents, prepare_embedded  # noqa: E402
from redline.inference.sampling import SamplingParams  # noqa: E402
from redline.inference.text import stop_token_ids  # noqa: E402
from redline.model import ModelConfig  # noqa: E402
from redline.serve.engine_process import _Outbox, to_wire  # noqa: E402
from redline.serve.scheduler import Scheduler, Sequence  # noqa: E402
from redline.tokenizer import load_tokenizer  # noqa: E402


PROMPT = 16  # tokens of each request's prompt


class InstantBatch:
    """DecodeBatch's interface as the Scheduler uses it, with no model: row r's k-th generated token is
    tokens[r, k] of a precomputed (rows, width) table."""

    def __init__(self, table: torch.Tensor, vocab: int, capacity: int):
        rows, self.width = table.shape
        self.table, self.vocab, self.capacity = table, vocab, capacity
        # a real config (every field the scheduler may read, at its default), of the table's vocabulary
        self.engine = SimpleNamespace(device=torch.device("cpu"), cfg=ModelConfig(vocab_size=vocab), describe=dict)
        self.busy = [False] * rows
        self.made = torch.zeros(rows, dtype=torch.long)  # tokens each row has generated
        self.group_steps = 0
        self.prefill_graphs = 0  # no CUDA graphs
        self.parked: list[int] = []  # no prefix reuse

    @property
    def rows(self) -> int:
        return len(self.busy)

    def prefill_many(self, rows: list[int], prompts: list[list[int]], start: int = 0) -> torch.Tensor:
        logits = torch.zeros(len(rows), self.vocab)  # (n, vocab): one-hot at each row's first token
        logits[torch.arange(len(rows)), self.table[rows, 0]] = 1.0
        return logits

    def start(self, row: int, first_token, length: int, temperature: float = 0.0, top_p: float = 1.0) -> None:
        self.busy[row], self.made[row] = True, 1

    def free(self, row: int) -> None:
        self.busy[row] = False

    def decode_greedy(self, n: int, ends: dict[int, list[int]] | None = None) -> torch.Tensor:
        where = (self.made[:, None] + torch.arange(n)).clamp_(max=self.width - 1)  # (rows, n)
        tokens = self.table.gather(1, where).t().contiguous()  # (n, rows), as the device's copy reaches the host
        self.made += n
        for rows in (ends or {}).values():
            for row in rows:
                self.free(row)
        return tokens


def token_table(tokenizer, rows: int, width: int, stops: set[int]) -> torch.Tensor:
    """(rows, width) token ids of real text, each row from its own place in the corpus, no stop token."""
    text = "\n".join(embedded_documents(400_000))
    ids = [t for t in tokenizer.encode(text) if t not in stops]
    return torch.tensor([[ids[(r * 997 + k) % len(ids)] for k in range(width)] for r in range(rows)])


class DevNull:
    """The outbox's connection: each message pickled and written, as multiprocessing's Connection.send does."""

    def __init__(self, keep: list | None):
        self.conn = Connection(os.open(os.devnull, os.O_WRONLY), readable=False)
        self.keep = keep

    def send(self, message) -> None:
        self.conn.send(message)
        if self.keep is not None and message[0] == "events":
            self.keep.extend(message[1])


def run(args, tokenizer, table: torch.Tensor, record: list | None = None) -> tuple[float, int, int]:
    """One load of `rows` requests -> (host seconds, decode steps, completion tokens)."""
    batch = InstantBatch(table, tokenizer.vocab_size, PROMPT + args.max_tokens + 1)
    sched = Scheduler(batch, tokenizer, stop_token_ids(tokenizer),
                      max_queue=args.rows, prefill_tokens=1 << 20, sync_every=args.sync_every)
    sched.lag_reads = True  # as on a GPU: a group's tokens are read while the next group is launched
    done = threading.Event()
    prompts = [[1 + i % 50] * PROMPT for i in range(args.rows)]
    wire = [to_wire(i, Sequence(p, args.max_tokens, SamplingParams(temperature=0.0), tuple(args.stop), None))
            for i, p in enumerate(prompts)]
    if args.sink == "outbox":
        outbox = _Outbox([DevNull(record)], sched)
        sched.flushes.append(lambda: outbox.live or done.set())
        start = time.perf_counter()
        outbox.submit(0, wire)
    else:
        left = [args.rows]

        def sink(i: int):
            def put(event: tuple) -> None:
                if record is not None:
                    record.append((i, event))
                if event[0] != "text":
                    left[0] -= 1
                    if not left[0]:
                        done.set()
            return put

        seqs = [Sequence(p, args.max_tokens, SamplingParams(temperature=0.0), tuple(args.stop), sink(i))
                for i, p in enumerate(prompts)]
        start = time.perf_counter()
        sched.submit(seqs)
    if not done.wait(600):
        raise RuntimeError("the requests did not finish")
    seconds = time.perf_counter() - start
    sched.close()
    return seconds, sched.stats.steps, sched.stats.completion_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--sync-every", type=int, default=8)
    parser.add_argument("--stop", nargs="*", default=[], help="stop strings of every request")
    parser.add_argument("--sink", choices=("outbox", "null"), default="outbox")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's N costliest functions")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(prepare_embedded(verbose=False))
    table = token_table(tokenizer, args.rows, args.max_tokens + 1, set(stop_token_ids(tokenizer)))

    events: list = []
    run(args, tokenizer, table, record=events)  # also the warm-up
    by_request: dict[int, list] = {}
    for item in events:  # each request's events in order (a final event carries its counted tokens)
        by_request.setdefault(item[0], []).append(item[1:])
    digest = hashlib.sha256(pickle.dumps(sorted(by_request.items()))).hexdigest()[:16]

    runs = [run(args, tokenizer, table) for _ in range(args.repeats)]
    seconds = statistics.median(r[0] for r in runs)
    steps, tokens = runs[0][1], runs[0][2]
    print(f"{args.rows} rows x {args.max_tokens} tokens, sync_every {args.sync_every}, sink {args.sink}, "
          f"stop {args.stop}: {steps} steps, {tokens} tokens, events digest {digest}")
    print(f"host per decode step: {seconds / steps * 1e6:8.1f} us   per token: {seconds / tokens * 1e6:6.2f} us   "
          f"(median of {args.repeats}; runs {', '.join(f'{r[0] * 1e3:.1f}' for r in runs)} ms)")
    if args.profile:
        profiler = cProfile.Profile()
        threading.setprofile(lambda *a: (profiler.enable(), threading.setprofile(None)))  # the scheduler's thread
        run(args, tokenizer, table)
        profiler.disable()
        threading.setprofile(None)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
