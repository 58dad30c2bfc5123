"""Tasks from JSONL files, so real sets (HellaSwag, ARC, GSM8K style files) can be dropped in.

One JSON object a line, every line of one kind:
- multiple-choice: {"question": str, "choices": [str, ...], "answer": index | the correct choice's text | "A"...}
- generative:      {"prompt": str, "answer": str | number, "solution": str (optional: a worked reply ending in the
                   answer, which SFT trains on and DPO prefers instead of the bare answer)}
An optional "split" ("train" or "test") puts a line in one split; a file without any is one set used for both
(evaluate it; for training give a file of its own). Generative answers are compared by exact match after
extraction: the last number when every reference is a number or ends in GSM8K's "#### 42", else the first line,
whitespace collapsed, case ignored.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

from redline.errors import UserError
from redline.tasks.base import Example, Split, Task

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    value = found[-1].replace(",", "")
    return value[:-2] if value.endswith(".0") else value


class JsonlTask(Task):
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.name = self.path.stem
        self._by_split: dict[str, list[Example]] = {"train": [], "test": []}
        self._all: list[Example] = []
        self.numeric = True
        self._read()

    def _read(self) -> None:
        if not self.path.is_file():
            raise UserError(f"task file {self.path} not found; give a .jsonl of {{\"prompt\", \"answer\"}} or "
                            f"{{\"question\", \"choices\", \"answer\"}} lines, or task:NAME for a built-in task")
        kinds = set()
        data = self.path.read_bytes()
        try:  # split on "\n" only: JSON strings may hold U+2028 and other characters str.splitlines() breaks at
            lines = data.decode("utf-8").split("\n")
        except UnicodeDecodeError as e:
            n = data[:e.start].count(b"\n") + 1
            raise UserError(f"task file {self.path} line {n} is not UTF-8 text (byte {e.start} cannot be decoded); "
                            "save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise UserError(f"{self.path} line {n} is not valid JSON ({e})") from None
            example, kind = self._example(obj, f"{self.path} line {n}")
            kinds.add(kind)
            if len(kinds) > 1:
                raise UserError(f"{self.path} line {n} is a {kind} example but earlier lines are not; keep "
                                f"one kind per file")
            self._all.append(example)
            split = obj.get("split")
            if split is not None:
                if split not in ("train", "test"):
                    raise UserError(f"{self.path} line {n}: split must be \"train\" or \"test\", got {split!r}")
                self._by_split[split].append(example)
        if not self._all:
            raise UserError(f"task file {self.path} holds no example")
        self.kind = kinds.pop()
        self.numeric = self.kind == "generative" and all(
            _number(e.answer) is not None and (_number(e.answer) == e.answer.strip() or "####" in e.answer)
            for e in self._all)
        for e in self._all:  # a solution is trained on: one that does not end in its answer would teach a wrong one
            if e.solution and not self.is_correct(e, e.solution):
                raise UserError(f"{e.meta['where']}: \"solution\" gives {self.extract(e.solution)!r}, not the answer "
                                f"{self.normalize(e.answer)!r}; end it in the answer")

    def _example(self, obj, where: str) -> tuple[Example, str]:
        if not isinstance(obj, dict):
            raise UserError(f"{where} is not a JSON object")
        if "choices" in obj or "question" in obj:
            question, choices, answer = obj.get("question"), obj.get("choices"), obj.get("answer")
            if not isinstance(question, str) or not question.strip():
                raise UserError(f"{where}: \"question\" must be non-empty text")
            if (not isinstance(choices, list) or len(choices) < 2
                    or not all(isinstance(c, str) and c.strip() for c in choices)):
                raise UserError(f"{where}: \"choices\" must be a list of at least 2 non-empty strings")
            if isinstance(answer, bool) or answer is None:
                gold = -1
            elif isinstance(answer, int):
                gold = answer
            elif isinstance(answer, str) and answer in choices:
                gold = choices.index(answer)
            elif isinstance(answer, str) and len(answer) == 1 and answer.isalpha():
                gold = ord(answer.upper()) - ord("A")
            else:
                gold = -1
            if not 0 <= gold < len(choices):
                raise UserError(f"{where}: \"answer\" must be a choice's index (0-{len(choices) - 1}), its letter "
                                f"or its text; got {answer!r}")
            return Example(question, choices[gold], tuple(choices), gold), "multiple_choice"
        prompt, answer = obj.get("prompt"), obj.get("answer")
        if not isinstance(prompt, str) or not prompt.strip():
            raise UserError(f"{where}: needs a non-empty \"prompt\" (generative) or \"question\" and \"choices\" "
                            f"(multiple-choice)")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or not answer.strip():
            raise UserError(f"{where}: \"answer\" must be non-empty text or a number")
        solution = obj.get("solution", "")
        if not isinstance(solution, str):
            raise UserError(f"{where}: \"solution\" must be text (a worked reply ending in the answer)")
        return Example(prompt, answer, solution=solution.strip(), meta={"where": where}), "generative"

    def examples(self, split: Split) -> list[Example]:
        chosen = self._by_split[split]
        unsplit = not any(self._by_split.values())
        if unsplit and split == "train" and not getattr(self, "_said_unsplit", False):
            # training asks for the train split: its held-out scores would then be on what it trains on
            self._said_unsplit = True
            print(f"note: {self.path} marks no line \"split\": \"test\", so training on it is also evaluated on "
                  f"it (held-out scores are training scores); mark some lines to hold them out", file=sys.stderr)
        return list(chosen if chosen or not unsplit else self._all)

    def extract(self, completion: str) -> str | None:
        if self.numeric:
            return _number(completion.split("\n\n")[0])
        return super().normalize(completion.strip().split("\n")[0]) or None

    def normalize(self, answer: str) -> str:
        if self.numeric:
            return _number(answer) or answer.strip()
        return super().normalize(answer)

    def corrupt(self, example: Example, rng: random.Random) -> str:
        if self.numeric:
            value = int(float(self.normalize(example.answer)))
            return str(value + rng.choice([-3, -2, -1, 1, 2, 3]))
        others = [e.answer for e in self._all if self.normalize(e.answer) != self.normalize(example.answer)]
        if not others:
            raise UserError(f"{self.path}: every answer is the same, so no wrong answer can be made for a "
                            f"preference pair")
        return rng.choice(others)
