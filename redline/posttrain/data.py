"""Preference pairs from JSONL records, rendered by the chat renderer, with the checks bad input needs.

A record is {"prompt": "text"} or {"messages": [...the conversation before the reply...]}, plus "chosen" and
"rejected": each a reply's text, or a list of assistant messages (trl's conversational format). Pairs longer than
the context are dropped and counted (an error if every pair is); identical replies are an error, since such a pair
carries no preference.
"""

from __future__ import annotations

import json
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
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
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
