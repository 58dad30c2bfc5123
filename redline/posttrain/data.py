"""Preference pairs from JSONL records, rendered by the chat renderer, with the checks bad input needs.

A record is {"prompt": "text"} or {"messages": [...the conversation before the reply...]}, plus "chosen" and
"rejected": each a reply's text, or a list of assistant messages (trl's conversational format). Pairs longer than
the context are dropped and counted (an error if every pair is); identical replies are an error, since such a pair
carries no preference.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redline.chat.render import training_example
from redline.errors import UserError
from redline.posttrain.dpo import Pair


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of a JSONL file, or a one-line UserError naming the line that is not a JSON object."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"data file {path} does not exist; give a JSONL file or task:NAME")
    records = []
    try:
        data = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (byte {e.start} cannot be decoded); save it as UTF-8") from None
    # split at newlines only: str.splitlines would also split inside a record at U+2028 or U+0085
    for number, line in enumerate(data.split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number} is not valid JSON ({e.msg}); each line must be one object") from None
        if not isinstance(record, dict):
            raise UserError(f"{path}:{number} is a JSON {type(record).__name__}, not an object")
        records.append(record)
    if not records:
        raise UserError(f"{path} holds no records")
    return records


def _context(record: Mapping[str, Any], where: str) -> list[dict]:
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise UserError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects")
        return [dict(m) for m in messages]
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError(f"{where} has no \"prompt\" text and no \"messages\"; give one of them")
    return [{"role": "user", "content": prompt}]


def _reply(record: Mapping[str, Any], key: str, where: str) -> list[dict]:
    value = record.get(key)
    if isinstance(value, str) and value.strip():
        return [{"role": "assistant", "content": value}]
    if isinstance(value, list) and value and all(isinstance(m, Mapping) and m.get("role") == "assistant"
                                                 for m in value):
        return [dict(m) for m in value]
    raise UserError(f"{where}: \"{key}\" must be the reply's text or a list of assistant messages")


@dataclass
class PairSet:
    pairs: list[Pair]
    dropped: int
    """Pairs longer than the context, left out."""


def pairs_from_records(records: Iterable[Mapping[str, Any]], renderer, max_len: int, source: str = "data"
                       ) -> PairSet:
    """Render each record's chosen and rejected conversation -> training sequences of at most max_len tokens."""
    pairs, dropped = [], 0
    for number, record in enumerate(records, 1):
        where = f"{source} record {number}"
        context = _context(record, where)
        chosen, rejected = _reply(record, "chosen", where), _reply(record, "rejected", where)
        if [m["content"] for m in chosen] == [m["content"] for m in rejected]:
            raise UserError(f"{where}: \"chosen\" and \"rejected\" are identical, so the pair prefers nothing; "
                            f"fix or remove it")
        sequences = []
        for reply in (chosen, rejected):
            rendered = renderer.render(context + reply)
            if not any(rendered.mask):
                raise UserError(f"{where}: the reply renders to no trained tokens; check the conversation")
            sequences.append(training_example(rendered))
        pair = Pair(sequences[0], sequences[1])
        if pair.longest > max_len:
            dropped += 1
            continue
        pairs.append(pair)
    if not pairs:
        raise UserError(f"every pair of {source} ({dropped}) is longer than the context of {max_len} tokens; "
                        f"shorten them or train with a longer seq_len")
    return PairSet(pairs, dropped)


# ----------------------------------------------------------------------------------------------------
# the data source of `redline dpo`


def read_preference_records(source: str, seed: int, eval_fraction: float, task_seed: int = 0
                            ) -> tuple[list[dict], list[dict]]:
    """(training records, held-out records) of a JSONL file (a seeded eval_fraction held out) or of task:NAME
    (its preference pairs of the train and test splits, which task_seed fixes; seed draws the corrupted replies)."""
    import random

    if source.startswith("task:"):
        from redline.tasks import load_task

        task = load_task(source, seed=task_seed)
        if not hasattr(task, "preference_pairs"):
            raise UserError(f"task {task.name} has no preference pairs")
        return task.preference_pairs("train", seed), task.preference_pairs("test", seed)
    records = read_jsonl(source)
    if records and isinstance(records[0], dict) and "chosen" not in records[0] and (
            {"prompt", "answer"} <= set(records[0]) or {"question", "choices"} <= set(records[0])):
        raise UserError(f"{source} holds task lines (prompt/answer or question/choices), not chosen/rejected pairs; "
                        f"give it as --data task:{source} (its pairs are built from the task), or make pairs with "
                        f"`redline pairs`")
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    held = math.ceil(len(records) * eval_fraction) if len(records) > 1 else 0  # as SFT's: a small set keeps one
    return [records[i] for i in order[held:]], [records[i] for i in order[:held]]


class PairData:
    """Preference pairs as a training data source (redline/training/sources.py): PairBatches for training, the
    held-out pairs' DPO loss, rewards and preference accuracy for evaluation. The reference log-probabilities of
    both sets live on the objective (`set_reference` fills them from the starting model)."""

    rows_cut = True  # batches are as long as their longest pair (redline/training/sources.py)

    def __init__(self, name: str, tokenizer, train: PairSet, heldout: PairSet | None, objective):
        self.name, self.tokenizer, self.objective = name, tokenizer, objective
        self.train, self.heldout = train, heldout

    @classmethod
    def load(cls, source: str, tokenizer, renderer, max_len: int, objective, seed: int = 0,
             eval_fraction: float = 0.02, max_pairs: int = 0, max_heldout: int = 0, task_seed: int = 0) -> PairData:
        """max_pairs, max_heldout: keep the first so many training and held-out pairs (0: all)."""
        train_records, heldout_records = read_preference_records(source, seed, eval_fraction, task_seed)
        train_records = train_records[:max_pairs or None]
        heldout_records = heldout_records[:max_heldout or None]
        train = pairs_from_records(train_records, renderer, max_len, source)
        heldout = None
        if heldout_records:
            try:
                heldout = pairs_from_records(heldout_records, renderer, max_len, f"{source} (held out)")
            except UserError as e:
                if "is longer than the context" not in str(e):
                    raise
                # every held-out pair too long: train without a held-out evaluation rather than not at all
                print(f"note: {e}; training goes on without held-out pairs", file=sys.stderr)
        return cls(source, tokenizer, train, heldout, objective)

    def describe(self) -> str:
        held = len(self.heldout.pairs) if self.heldout else 0
        dropped = self.train.dropped + (self.heldout.dropped if self.heldout else 0)
        return (f"{len(self.train.pairs):,} preference pairs from {self.name}, {held:,} held out"
                + (f"; {dropped:,} longer than the context left out" if dropped else ""))

    def set_reference(self, model, batch_size: int, device, amp) -> None:
        """The starting model's log-probabilities of every pair, once, before the first step."""
        from redline.posttrain.dpo import reference_logps

        self.objective.reference = reference_logps(model, self.train.pairs, batch_size, device, amp)
        if self.heldout:
            self.objective.heldout_reference = reference_logps(model, self.heldout.pairs, batch_size, device, amp)

    def reference_from_base(self, step, batch_size: int, amp) -> None:
        """Under LoRA: the reference log-probabilities from the training model with its adapters off (the base as
        the run holds it: cast, or NF4 for QLoRA), no second copy. Before the first step, adapters at their start."""
        lora = step.converters.get("lora")
        if lora is None:
            raise RuntimeError("DPO without LoRA computes its reference in the run's init (redline dpo)")
        with step.evaluation() as model, lora.disabled():
            self.set_reference(model, batch_size, step.device, amp)

    def train_loader(self, cfg, info, device):
        from redline.hardware import autocast_dtype
        from redline.posttrain.dpo import PairBatches

        if self.objective.reference is None:  # a new LoRA run (else init or the resumed state gave it)
            batch = cfg.batch_size if isinstance(cfg.batch_size, int) else 8
            self.reference_from_base(self.objective.step, batch, autocast_dtype(device, cfg.precision))

        # each process its own seeded order: ranks draw different pairs
        return PairBatches(self.train.pairs, cfg.batch_size, device, seed=cfg.seed * 7919 + info.rank)

    def evaluate(self, model, cfg, info, device) -> dict[str, float]:
        from redline.hardware import autocast_dtype
        from redline.posttrain.dpo import evaluate_pairs

        if not self.heldout:
            return {}
        return evaluate_pairs(model, self.objective, self.heldout.pairs, self.objective.heldout_reference,
                              cfg.batch_size, device, autocast_dtype(device, cfg.precision))

    def eval_line(self, result: dict[str, float]) -> str:
        if not result:
            return "no held-out pairs"
        return (f"held-out DPO loss {result['loss']:.4f} | reward margin {result['reward_margin']:.3f} | "
                f"preference accuracy {result['preference_accuracy']:.1%}")
