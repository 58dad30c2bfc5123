"""`redline pairs`: preference pairs from a checkpoint's own samples, graded by a task (on-policy DPO data).

    redline pairs runs/sft-... --task arithmetic_multistep --out pairs.jsonl
    redline pairs CKPT --task arithmetic --samples 16 --prompts 2000 --temperature 1.0
    redline dpo --from runs/sft-... --data pairs.jsonl dpo.nll_weight=1

For each of the task's first `prompts` training prompts, `samples` replies are sampled from the checkpoint through
its chat template and the KV-cache engine, and graded by the task. A prompt with a wrong reply gives one pair: a
right reply as chosen (the task's reference reply where no sample is right; --chosen reference always takes it)
and a wrong one as rejected. A prompt whose replies are all right is left out: there is nothing to move away from.
A task's built-in pairs (`redline dpo --data task:NAME`) corrupt a reference reply in ways the model may never err;
these pairs hold the mistakes the model makes. Iterative RPO (Pang et al. 2024) trains DPO with an NLL term
(`dpo.nll_weight`) on pairs made this way.

Writes JSONL records {"messages", "chosen", "rejected", "chosen_from"} that `redline dpo --data` reads, all at
once (a failed run leaves no partial file), then prints one JSON line of counts.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import tyro

from redline.inference.runtime import RuntimeOptions


@dataclass
class PairsConfig:
    checkpoint: tyro.conf.Positional[str]
    """A checkpoint folder or a run directory (its newest checkpoint), with a chat template (after `redline sft`)."""
    task: str
    """A built-in generative task (NAME or task:NAME) or a generative .jsonl task file: its prompts and grader."""
    out: str
    """The JSONL file to write (it must not exist, unless --overwrite)."""
    overwrite: bool = False
    """Replace --out if it exists."""
    samples: int = 8
    """Replies sampled per prompt."""
    prompts: int = 0
    """Sample the first this many training prompts (0: the whole training split)."""
    temperature: float = 1.0
    """Sampling temperature (> 0: greedy replies would all be the same)."""
    max_new_tokens: int = 64
    """Most tokens a reply may take; a reply cut there is graded as it stands."""
    chosen: Literal["sample", "reference"] = "sample"
    """The chosen reply: a right sample where there is one (else the task's reference reply), or always the
    reference reply."""
    batch_size: int = 256
    """Sequences per generation batch (prompts × samples)."""
    seed: int = 0
    """Seed of the sampling."""
    task_seed: int = 0
    """Seed of a built-in task's generator: its train/test splits (as finetune.task_seed in training)."""
    runtime: tyro.conf.OmitArgPrefixes[RuntimeOptions] = field(default_factory=RuntimeOptions)
    """Device, precision, compilation and CUDA graphs."""

    def validate(self) -> None:
        from redline.errors import UserError

        if self.samples < 2:
            raise UserError(f"--samples must be >= 2 (a pair needs two replies to differ), got {self.samples}")
        if self.prompts < 0 or self.max_new_tokens < 1 or self.batch_size < 1:
            raise UserError("--prompts must be >= 0 (0: all), --max-new-tokens and --batch-size >= 1")
        if not self.temperature > 0:
            raise UserError(f"--temperature must be > 0 (greedy replies are all the same), got {self.temperature}")
        from redline.durable import check_output_file

        check_output_file(self.out, "--out")
        if Path(self.out).expanduser().exists() and not self.overwrite:
            raise UserError(f"--out {self.out} exists; give another path, or --overwrite to replace it")


@dataclass
class PairCounts:
    prompts: int = 0
    samples: int = 0
    right: int = 0
    all_right: int = 0
    """Prompts left out: every reply right."""
    none_right: int = 0
    """Prompts whose chosen reply is the reference one: no reply right."""
    truncated: int = 0
    """Replies that reached max_new_tokens."""


def sample_pairs(generator, renderer, task, examples, cfg: PairsConfig) -> tuple[list[dict], PairCounts]:
    """cfg.samples replies to each example (scoring.sampled_groups), graded -> (pair records, counts)."""
    from redline.tasks.scoring import sampled_groups

    records, counts = [], PairCounts()
    for example, group in sampled_groups(generator, renderer, task, examples, cfg.samples, cfg.batch_size,
                                         cfg.max_new_tokens, cfg.temperature, cfg.seed):
        texts = [c.text.strip() for c in group]
        right = [task.is_correct(example, t) for t in texts]
        counts.prompts += 1
        counts.samples += len(group)
        counts.right += sum(right)
        counts.truncated += sum(c.finish_reason == "length" for c in group)
        wrong = [t for t, ok in zip(texts, right) if not ok and t]
        if not wrong:  # every reply right (or the wrong ones empty): nothing to prefer against
            counts.all_right += all(right)
            continue
        good = [t for t, ok in zip(texts, right) if ok]
        if cfg.chosen == "sample" and good:
            chosen, source = good[0], "sample"
        else:
            chosen, source = example.reply, "reference"
            counts.none_right += not good
        if chosen.strip() == wrong[0]:  # a reference reply the grader rejects: no preference to learn
            continue
        records.append({"messages": task.messages(example), "chosen": chosen, "rejected": wrong[0],
                        "chosen_from": source})
    return records, counts


def main(argv: list[str]) -> int:
    from redline.chat.render import renderer_for
    from redline.config import parse
    from redline.durable import write_atomic
    from redline.errors import UserError
    from redline.inference.runtime import load_generator
    from redline.tasks import load_task
    from redline.training.checkpoint import resolve_checkpoint

    cfg = parse(PairsConfig, argv, prog="redline pairs", description=__doc__.strip())
    task = load_task(cfg.task, seed=cfg.task_seed)  # before the weights load: an unknown task fails at once
    if task.kind != "generative":
        raise UserError(f"task {task.name} is {task.kind}: its pairs need no sampling; give it to `redline dpo "
                        f"--data task:{task.name}`, or give a generative task here")
    examples = task.examples("train")[:cfg.prompts or None]
    if not examples:
        raise UserError(f"task {task.name} has no training examples")
    generator, _ = load_generator(str(resolve_checkpoint(cfg.checkpoint)), None, cfg.runtime)
    tokenizer = generator.tokenizer
    if not (getattr(tokenizer, "chat_template", None) or tokenizer.chat_token_ids):
        raise UserError(f"{cfg.checkpoint} has no chat template and no chat tokens, so its replies would not be "
                        f"what DPO trains; fine-tune it with `redline sft` first")
    started = time.perf_counter()
    records, counts = sample_pairs(generator, renderer_for(tokenizer), task, examples, cfg)
    seconds = time.perf_counter() - started
    if not records:
        raise UserError(f"no pairs: none of {counts.prompts} prompts had a wrong reply to set against a right one "
                        f"({counts.right} of {counts.samples} replies right); raise --temperature or --samples, or "
                        f"use the task's pairs (--data task:{task.name})")
    write_atomic(cfg.out, [json.dumps(r) + "\n" for r in records])
    summary = {"kind": "pairs", "checkpoint": cfg.checkpoint, "task": task.name, "out": cfg.out,
               "pairs": len(records), **counts.__dict__, "sample_accuracy": round(counts.right / counts.samples, 4),
               "seconds": round(seconds, 1)}
    print(f"redline pairs: {len(records):,} pairs from {counts.prompts:,} prompts × {cfg.samples} samples "
          f"({counts.right / counts.samples:.1%} of replies right; {counts.all_right:,} prompts all right and left "
          f"out, {counts.none_right:,} with the reference reply as chosen) in {seconds:.0f} s -> {cfg.out}",
          file=sys.stderr, flush=True)
    print(json.dumps(summary), flush=True)
    return 0
