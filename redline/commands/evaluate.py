"""`redline evaluate`: score a checkpoint on tasks, each next to chance level.

    redline evaluate runs/sft-tiny-... --tasks arithmetic,arithmetic_mc
    redline evaluate CKPT --tasks data/arc.jsonl,gsm8k.jsonl --limit 500 --max-new-tokens 256
    redline evaluate runs/grpo-tiny-... --tasks arithmetic --samples 8 --temperature 1.0   # + sampled pass@1, pass@8

Multiple-choice tasks are scored by log-likelihood (acc and length-normalised acc_norm), generative ones by exact
match after answer extraction, greedy, through the KV-cache engine (redline/tasks/scoring.py). Prints a table and
one JSON line last; appends the results to the run directory's evaluations.jsonl, which `redline report` reads,
so the stages of a pipeline (pretrain, sft, ...) sit side by side in its report.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Literal

import tyro

from redline.inference.runtime import RuntimeOptions

EVALUATIONS_FILE = "evaluations.jsonl"


@dataclass
class EvaluateConfig:
    checkpoint: tyro.conf.Positional[str]
    """A checkpoint folder or a run directory (its newest checkpoint)."""
    tasks: str = "arithmetic"
    """Comma-separated tasks: built-in names (task:NAME or NAME; NAME_mc as multiple choice) or .jsonl task files."""
    split: Literal["test", "train"] = "test"
    """Which split of each task to score."""
    limit: int = 0
    """Score at most this many examples of each task (0: all)."""
    chat: Literal["auto", "on", "off"] = "auto"
    """Ask through the chat template (auto: when the checkpoint has one: an imported template or redline's chat
    tokens after `redline sft`); off: plain text."""
    batch_size: int = 32
    """Rows per forward (multiple choice) or prompts per generation batch."""
    max_new_tokens: int = 32
    """Most tokens a generative answer may take."""
    samples: int = 0
    """Generative tasks: also sample this many replies to each prompt at --temperature and report pass@1 (the mean
    share right) and pass@N (one of N right; Chen et al. 2021), beside greedy exact match (0: greedy only)."""
    temperature: float = 1.0
    """Sampling temperature of --samples."""
    task_seed: int = 0
    """Seed of the built-in tasks' generators (the splits are fixed for a seed; as finetune.task_seed in training)."""
    seed: int = 0
    """Seed of --samples' sampling."""
    write: bool = True
    """Append the results to the run directory's evaluations.jsonl (for redline report)."""
    runtime: tyro.conf.OmitArgPrefixes[RuntimeOptions] = field(default_factory=RuntimeOptions)
    """Device, precision, compilation and CUDA graphs."""

    def validate(self) -> None:
        from redline.errors import UserError

        if self.limit < 0 or self.batch_size < 1 or self.max_new_tokens < 1:
            raise UserError("limit must be >= 0, batch_size and max_new_tokens >= 1")
        if self.samples < 0 or (self.samples and not self.temperature > 0):
            raise UserError(f"--samples must be >= 0 (0: greedy only) and --temperature > 0 with it, got "
                            f"{self.samples} and {self.temperature}")
        if not [t for t in self.tasks.split(",") if t.strip()]:
            raise UserError("give at least one task: --tasks arithmetic,arithmetic_mc or a .jsonl file")


def _renderer(tokenizer, chat: str):
    from redline.chat.render import renderer_for
    from redline.errors import UserError

    has = bool(getattr(tokenizer, "chat_template", None) or tokenizer.chat_token_ids)
    if chat == "on" and not has:
        raise UserError("--chat on but this checkpoint has no chat template and no chat tokens; use --chat off "
                        "(plain text) or fine-tune it with `redline sft` first")
    return renderer_for(tokenizer) if has and chat != "off" else None


def print_table(results, checkpoint: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"redline evaluate {checkpoint}")
    for column in ("task", "kind", "n", "metric", "score", "chance", "centered", "other"):
        table.add_column(column, justify="right" if column in ("n", "score", "chance", "centered") else "left")
    for r in results:
        other = f"acc {r.extra['acc']:.3f}" if "acc" in r.extra else ""
        if "sampling" in r.extra:
            n, t = r.extra["sampling"]["n"], r.extra["sampling"]["temperature"]
            other = f"pass@1 {r.extra['pass@1']:.3f}, pass@{n} {r.extra[f'pass@{n}']:.3f} (T {t:g})"
        table.add_row(r.task, r.kind, str(r.n), r.metric, f"{r.score:.3f}", f"{r.chance:.3f}", f"{r.centered:+.3f}",
                      other)
    Console(file=sys.stderr, width=120).print(table)


def main(argv: list[str]) -> int:
    from redline.config import parse
    from redline.durable import append_line
    from redline.inference.runtime import load_generator
    from redline.tasks import load_task
    from redline.tasks.scoring import evaluate_task
    from redline.training.checkpoint import read_meta, resolve_checkpoint

    cfg = parse(EvaluateConfig, argv, prog="redline evaluate", description=__doc__.strip())
    tasks = [load_task(t.strip(), seed=cfg.task_seed) for t in cfg.tasks.split(",") if t.strip()]  # all before loading
    ckpt = resolve_checkpoint(cfg.checkpoint)
    generator, _ = load_generator(str(ckpt), None, cfg.runtime)
    renderer = _renderer(generator.tokenizer, cfg.chat)
    results = []
    for task in tasks:
        start = time.perf_counter()
        result = evaluate_task(generator, task, renderer, cfg.split, cfg.limit, cfg.batch_size, cfg.max_new_tokens,
                               cfg.samples, cfg.temperature, cfg.seed)
        result.extra["seconds"] = round(time.perf_counter() - start, 3)
        results.append(result)
    print_table(results, cfg.checkpoint)
    step = read_meta(ckpt).get("step")
    record = {"kind": "task_eval", "checkpoint": str(ckpt), "step": step, "split": cfg.split,
              "chat": renderer.name if renderer is not None else "plain", "time": time.time(),
              "tasks": {r.task: {k: v for k, v in r.to_dict().items() if k not in ("task", "extra")}
                        | {k: v for k, v in r.extra.items() if k != "samples"} for r in results}}
    if cfg.write and ckpt.parent.name == "checkpoints":
        path = ckpt.parent.parent / EVALUATIONS_FILE
        # one whole line or nothing: a full disk is one line naming the file, its earlier records intact
        append_line(path, json.dumps(record))
    print(json.dumps(record), flush=True)
    return 0
