#!/usr/bin/env python3
"""How many CUDA-graph prefill shapes a chat load makes the server capture, by how copied beginnings are cut.

    python scripts/serve_prefill_shapes.py [--conversations 16] [--turns 8] [--steps 16 64]

A tiny random model on the CPU, served by redline's scheduler (prefix reuse on, --prefix-min-tokens 128) with as many
rows as conversations; each conversation's next prompt is its last prompt, the answer, and 10-60 new tokens (a chat
client sends its history back). Every batched prefill of the rests after copied beginnings is counted as the shape
(rows, width, start) that a GPU server captures a graph of (inference/batch.py: rows padded as graph_rows pads them,
the width to PREFILL_WIDTH_STEP), with the copied beginnings cut to multiples of each step in --steps (16: whole hash
blocks; 64: PREFIX_START_STEP, what a GPU server does). A GPU server keeps at most PREFILL_GRAPHS shapes; each
capture stalls every decoding row once. Prints one line per step: distinct shapes, distinct starts, tokens copied.
"""

from __future__ import annotations

import argparse
import queue
import random

import torch

from redline.inference import InferenceEngine, SamplingParams
from redline.inference.batch import PREFILL_WIDTH_STEP, DecodeBatch, graph_rows
from redline.model import GPT, ModelConfig
from redline.serve.scheduler import Scheduler, Sequence
from redline.tokenizer import load_tokenizer

EOT = 256


def shapes(model, conversations: int, turns: int, step: int, seed: int) -> tuple[set, int, int]:
    """(the distinct (rows, width, start) shapes of rest prefills, rests prefilled, prompt tokens copied)."""
    rng = random.Random(seed)
    batch = DecodeBatch(InferenceEngine(model), rows=conversations, capacity=model.cfg.context_len)
    batch.start_step = step
    seen, rests = set(), 0
    prefill_many = batch.prefill_many

    def counting(rows, prompts, start=0):
        nonlocal rests
        if start:
            width = -(-max(map(len, prompts)) // PREFILL_WIDTH_STEP) * PREFILL_WIDTH_STEP
            seen.add((graph_rows(len(rows)), width, start))
            rests += len(rows)
        return prefill_many(rows, prompts, start)

    batch.prefill_many = counting
    sched = Scheduler(batch, load_tokenizer("bytes"), [EOT], prefix_min_tokens=128)
    try:
        prompts = [[rng.randrange(250) for _ in range(rng.randint(150, 250))] for _ in range(conversations)]
        for _ in range(turns):
            sinks = [queue.Queue() for _ in prompts]
            seqs = [Sequence(list(p), rng.randint(10, 60), SamplingParams(), (), q.put) for p, q in zip(prompts, sinks)]
            sched.submit(seqs)
            for q in sinks:
                while q.get(timeout=120)[0] == "text":
                    pass
            prompts = [s.prompt + s.tokens + [rng.randrange(250) for _ in range(rng.randint(10, 60))] for s in seqs]
        return seen, rests, sched.stats.cached_tokens
    finally:
        sched.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--steps", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=261, context_len=1024, n_layer=1, n_embd=32, n_head=2, n_kv_head=1))
    for step in args.steps:
        seen, rests, copied = shapes(model, args.conversations, args.turns, step, args.seed)
        print(f"copied beginnings in multiples of {step}: {len(seen)} prefill shapes over {rests} rests, "
              f"{len({s[2] for s in seen})} start slots, {copied:,} prompt tokens copied")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
