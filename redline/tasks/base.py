"""What a task is: examples in fixed train/test splits, answer extraction and a verifiable reward.

    task = load_task("arithmetic")                      # or "task:arithmetic", or a .jsonl file
    task.examples("train")                              # [Example(prompt, answer, choices, gold), ...]
    task.conversations("train")                         # SFT: [[{"role": "user", ...}, {"role": "assistant", ...}]]
    task.preference_pairs("train")                      # DPO: [{"messages", "chosen", "rejected"}]
    task.reward(example, completion)                    # GRPO / evaluation: 1.0 when the extracted answer matches

A generative task is scored by exact match after `extract` (a task-specific reading of the answer in a
completion: the last number, a list, a spelling); a multiple-choice task by which of its choices the model finds
most likely (redline/evaluation), with chance level 1 / len(choices).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

Split = Literal["train", "test"]


@dataclass(frozen=True)
class Example:
    prompt: str
    """The question as the user asks it."""
    answer: str
    """The reference answer (generative) or the correct choice's text (multiple-choice)."""
    choices: tuple[str, ...] = ()
    """Multiple-choice only: the candidate answers."""
    gold: int = -1
    """Multiple-choice only: the index of the correct choice."""
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    """Anything the task keeps with an example (e.g. a corruption's inputs)."""
    solution: str = ""
    """Generative only, optional: a worked reply (its steps, ending in the answer) that SFT trains on and DPO
    prefers, where a bare answer would have to be memorised; graded like any completion, by its extracted answer."""

    @property
    def reply(self) -> str:
        """What the assistant says in training: the worked solution when there is one, else the answer."""
        return self.solution or self.answer


class Task:
    """A named set of examples with fixed splits. Subclasses give `examples` and, for generative tasks, `extract`,
    `normalize` and `corrupt`."""

    name: str = "task"
    kind: Literal["generative", "multiple_choice"] = "generative"
    description: str = ""

    def examples(self, split: Split) -> list[Example]:
        raise NotImplementedError

    def extract(self, completion: str) -> str | None:
        """The answer a completion gives, normalised (None: none found)."""
        return self.normalize(completion)

    def normalize(self, answer: str) -> str:
        """The canonical form of an answer (what exact match compares)."""
        return " ".join(answer.split()).lower()

    def corrupt(self, example: Example, rng: random.Random) -> str:
        """A plausible wrong reply (the rejected side of a preference pair): a wrong answer, or a worked solution
        with a slip where the task has solutions."""
        raise NotImplementedError

    # -- derived ----------------------------------------------------------------------------------------

    def is_correct(self, example: Example, completion: str) -> bool:
        got = self.extract(completion)
        return got is not None and got == self.normalize(example.answer)

    def reward(self, example: Example, completion: str) -> float:
        """1.0 when the completion's extracted answer equals the reference, else 0.0 (a verifiable reward)."""
        return 1.0 if self.is_correct(example, completion) else 0.0

    def chance(self, example: Example) -> float:
        """The score of a random guess: 1 / choices for multiple-choice, 0 for exact match."""
        return 1.0 / len(example.choices) if example.choices else 0.0

    def messages(self, example: Example) -> list[dict]:
        """The prompt as a conversation (one user message)."""
        return [{"role": "user", "content": example.prompt}]

    def conversations(self, split: Split = "train") -> list[list[dict]]:
        """SFT conversations: the question and the reference reply (the worked solution where there is one)."""
        return [self.messages(e) + [{"role": "assistant", "content": e.reply}] for e in self.examples(split)]

    def preference_pairs(self, split: Split = "train", seed: int = 0) -> list[dict]:
        """DPO pairs: {"messages": the prompt, "chosen": the reference reply, "rejected": a corrupted one}
        (seeded: the same pairs on every call)."""
        rng = random.Random(f"{self.name}:pairs:{split}:{seed}")
        pairs = []
        for example in self.examples(split):
            if self.kind == "multiple_choice":
                wrong = [c for i, c in enumerate(example.choices) if i != example.gold]
                rejected = rng.choice(wrong)
            else:
                rejected = self.corrupt(example, rng)
            pairs.append({"messages": self.messages(example), "chosen": example.reply, "rejected": rejected})
        return pairs
