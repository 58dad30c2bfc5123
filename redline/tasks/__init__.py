"""Tasks: offline generators with fixed splits and JSONL task files, each with answer extraction and a reward.

    from redline.tasks import load_task, task_names
    task = load_task("task:arithmetic", seed=0)     # built-in: see task_names(); NAME_mc asks it as multiple choice
    task = load_task("data/arc.jsonl")              # a JSONL task file (redline/tasks/jsonl.py)
    task.examples("test"), task.conversations("train"), task.preference_pairs("train"), task.reward(example, text)

See redline/tasks/base.py for the Task interface.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from redline.errors import UserError
from redline.tasks.base import Example, Split, Task
from redline.tasks.jsonl import JsonlTask
from redline.tasks.synthetic import GENERATORS, GeneratedTask, MultipleChoiceOf

__all__ = ["Example", "GeneratedTask", "JsonlTask", "Split", "Task", "load_task", "task_names"]


def task_names() -> list[str]:
    """The built-in tasks' names (each also as NAME_mc, multiple choice)."""
    return sorted(GENERATORS)


def load_task(spec: str, seed: int = 0, train_size: int | None = None, test_size: int = 1000) -> Task:
    """A task by name ("arithmetic", "task:arithmetic", "arithmetic_mc") or a .jsonl task file; a one-line error
    naming the built-in tasks for an unknown name. train_size None: the task's own default."""
    name = spec[len("task:"):] if spec.startswith("task:") else spec
    if name.endswith(".jsonl") or ("/" in name and not spec.startswith("task:")) or Path(name).is_file():
        return JsonlTask(name)
    multiple_choice = name.endswith("_mc")
    base = name[:-3] if multiple_choice else name
    if base not in GENERATORS:
        names = task_names() + [f"{n}_mc" for n in task_names()]
        close = difflib.get_close_matches(name, names, n=2, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise UserError(f"unknown task {name!r}; {hint}built-in tasks: {', '.join(task_names())} (each also as "
                        f"NAME_mc), or give a .jsonl task file")
    task = GENERATORS[base](seed=seed, train_size=train_size, test_size=test_size)
    return MultipleChoiceOf(task) if multiple_choice else task
