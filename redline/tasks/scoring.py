"""Scoring a model on tasks: multiple choice by log-likelihood, generative by exact match after extraction.

    result = evaluate_task(generator, task, renderer=..., limit=200, batch_size=32, max_new_tokens=32)
    # TaskResult(task, kind, n, metric, score, chance, centered, extra={"acc_norm": ...})

Multiple choice (as lm-evaluation-harness scores HellaSwag or ARC): each choice's log-likelihood given the
question is the sum of its tokens' log-probabilities; `acc` picks the largest sum, `acc_norm` the largest sum per
UTF-8 byte of the choice (longer choices are not penalised for their length). Every (question, choice) row goes
through the model in batches of one forward each (teacher forcing: all of a row's log-probabilities in one pass,
where the engine's `score` decodes one token at a time).

Generative: the engine generates greedily in batches (redline/inference, the KV-cache engine with its stop
tokens); the task's `extract` reads the answer, exact match against the reference. `sampled_pass_rates` samples n
replies to each prompt at a temperature instead: pass@1 (the mean share right) and pass@n, Chen et al. 2021's
unbiased estimator, as RL papers report their models (a model tuned by GRPO may sample better while its greedy
answer stays the same).

With a chat renderer (a model fine-tuned by `redline sft`, or imported with a template) the question is the user
message and the choice / reply is the assistant's (a choice followed by the end of the turn, so "4" and "42"
differ); without one, plain text: the question, then " " + the choice, or a newline and the completion.

Chance: the mean of 1 / choices for multiple choice, 0 for exact match; centered = (score - chance) /
(1 - chance), 0 at chance and 1 when perfect, so scores of tasks with different numbers of choices compare.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import asdict, dataclass, field

import torch

from redline.model import logprobs_of
from redline.tasks.base import Example, Task


@dataclass
class TaskResult:
    task: str
    kind: str
    n: int
    metric: str
    """The headline metric: acc_norm (multiple choice) or exact_match (generative)."""
    score: float
    chance: float
    centered: float
    extra: dict = field(default_factory=dict)
    """Other metrics (acc for multiple choice) and a few example completions."""

    def to_dict(self) -> dict:
        return asdict(self)


def centered(score: float, chance: float) -> float:
    return (score - chance) / (1 - chance) if chance < 1 else 0.0


def _context_ids(tokenizer, renderer, question: str) -> list[int]:
    if renderer is not None:
        return renderer.prompt([{"role": "user", "content": question}])
    return [tokenizer.eot_id] + tokenizer.encode(question)


def _continuation_ids(tokenizer, renderer, choice: str) -> list[int]:
    if renderer is not None:
        return tokenizer.encode(choice) + renderer.stop_ids[:1]
    return tokenizer.encode(" " + choice)


@torch.no_grad()
def choice_loglikelihoods(model, rows: list[tuple[list[int], list[int]]], batch_size: int) -> list[float]:
    """Sum of log p(continuation | context) for each (context ids, continuation ids), batched, contexts cut from
    the left to fit the model's context."""
    device = next(model.parameters()).device
    ctx_len = model.cfg.context_len
    out: list[float] = []
    cut = sum(len(context) + len(cont) > ctx_len + 1 for context, cont in rows)
    if cut:
        _say_cut(cut, len(rows), "choices' prompts", ctx_len)
    for start in range(0, len(rows), batch_size):
        chunk = []
        for context, cont in rows[start:start + batch_size]:
            ids = (context + cont)[-(ctx_len + 1):]
            chunk.append((ids, len(cont)))
        T = max(len(ids) for ids, _ in chunk) - 1
        inputs = torch.zeros(len(chunk), T, dtype=torch.long)
        targets = torch.full((len(chunk), T), -1, dtype=torch.long)
        for b, (ids, n) in enumerate(chunk):
            inputs[b, :len(ids) - 1] = torch.tensor(ids[:-1])
            targets[b, len(ids) - 1 - n:len(ids) - 1] = torch.tensor(ids[-n:])
        inputs, targets = inputs.to(device), targets.to(device)
        logits = model(inputs).float()  # (B, T, vocab)
        logp = logprobs_of(logits, targets.clamp(min=0))  # -inf for an id past the head (model.head_vocab)
        out += (logp * (targets >= 0)).sum(dim=1).tolist()
    return out


def score_multiple_choice(model, tokenizer, renderer, task: Task, examples: list[Example],
                          batch_size: int) -> TaskResult:
    rows = []
    for e in examples:
        context = _context_ids(tokenizer, renderer, e.prompt)
        rows += [(context, _continuation_ids(tokenizer, renderer, choice)) for choice in e.choices]
    scores = choice_loglikelihoods(model, rows, batch_size)
    acc = acc_norm = 0
    at = 0
    for e in examples:
        sums = scores[at:at + len(e.choices)]
        at += len(e.choices)
        per_byte = [s / max(1, len(c.encode("utf-8"))) for s, c in zip(sums, e.choices)]
        acc += max(range(len(sums)), key=sums.__getitem__) == e.gold
        acc_norm += max(range(len(per_byte)), key=per_byte.__getitem__) == e.gold
    n = len(examples)
    chance = sum(task.chance(e) for e in examples) / n
    score = acc_norm / n
    return TaskResult(task.name, "multiple_choice", n, "acc_norm", score, chance, centered(score, chance),
                      {"acc": acc / n, "acc_centered": centered(acc / n, chance)})


def generate_replies(generator, renderer, task: Task, rows: list[Example], max_new_tokens: int, sampling,
                     start: int = 0):
    """One batch of replies: through the chat template when there is a renderer, else after the plain question."""
    tokenizer = generator.tokenizer
    stop = [*renderer.stop_ids, tokenizer.eot_id] if renderer is not None else [tokenizer.eot_id]
    if renderer is not None:
        encoded = [generator.encode_chat(task.messages(e), renderer, max_new_tokens, True, start + i)
                   for i, e in enumerate(rows)]
    else:
        encoded = [generator.encode_prompt(e.prompt + "\n", max_new_tokens, True, True, start + i)
                   for i, e in enumerate(rows)]
    cut = sum(truncated for _, truncated in encoded)
    if cut:
        _say_cut(cut, len(rows), "prompts", generator.engine.cfg.context_len - max_new_tokens)
    return generator.generate([e.prompt for e in rows], max_new_tokens, sampling, encoded=encoded, stop_tokens=stop)


def _say_cut(cut: int, total: int, what: str, room: int) -> None:
    """Say that prompts were cut to fit (their beginnings dropped, a chat header among them): scores of such
    examples measure less than the task asks."""
    print(f"redline evaluate: {cut} of {total} {what} were longer than the model's room for them ({room} tokens) "
          f"and were cut from the left", file=sys.stderr)


def score_generative(generator, renderer, task: Task, examples: list[Example], batch_size: int,
                     max_new_tokens: int) -> TaskResult:
    from redline.inference.sampling import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    correct, samples = 0, []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        completions = generate_replies(generator, renderer, task, chunk, max_new_tokens, greedy, start)
        for e, c in zip(chunk, completions):
            ok = task.is_correct(e, c.text)
            correct += ok
            if len(samples) < 3:
                samples.append({"prompt": e.prompt, "completion": c.text, "answer": e.answer, "correct": ok})
    n = len(examples)
    return TaskResult(task.name, "generative", n, "exact_match", correct / n, 0.0, correct / n, {"samples": samples})


def sampled_groups(generator, renderer, task: Task, examples: list[Example], n: int, batch_size: int,
                   max_new_tokens: int, temperature: float, seed: int = 0):
    """Yield (example, its n sampled completions) for each example in order. A batch holds whole groups (batch_size
    // n examples) and is seeded by (seed, batch number): the same replies for the same seed on a CPU (a GPU's
    kernels may differ in the last bit)."""
    from redline.inference.sampling import SamplingParams

    per_batch = max(1, batch_size // n)
    for number, start in enumerate(range(0, len(examples), per_batch)):
        chunk = examples[start:start + per_batch]
        rows = [e for e in chunk for _ in range(n)]
        params = SamplingParams(temperature=temperature, seed=seed * 1_000_003 + number)
        completions = generate_replies(generator, renderer, task, rows, max_new_tokens, params, start * n)
        for j, example in enumerate(chunk):
            yield example, completions[j * n:(j + 1) * n]


def sampled_pass_rates(generator, renderer, task: Task, examples: list[Example], batch_size: int,
                       max_new_tokens: int, n: int, temperature: float, seed: int = 0) -> dict[str, float]:
    """n replies to each example at `temperature` (sampled_groups) -> {"pass@1": mean share right, "pass@n": the
    chance that one of n is right}, averaged over examples."""
    from redline.posttrain.grpo import pass_at_k

    rates = {"pass@1": 0.0, f"pass@{n}": 0.0}
    for example, group in sampled_groups(generator, renderer, task, examples, n, batch_size, max_new_tokens,
                                         temperature, seed):
        right = sum(task.is_correct(example, c.text) for c in group)
        rates["pass@1"] += right / n
        rates[f"pass@{n}"] += pass_at_k(n, right, n)
    return {name: total / len(examples) for name, total in rates.items()}


def evaluate_task(generator, task: Task, renderer=None, split: str = "test", limit: int = 0, batch_size: int = 32,
                  max_new_tokens: int = 32, samples: int = 0, temperature: float = 1.0, seed: int = 0) -> TaskResult:
    """Score the engine's model on a task's split (its first `limit` examples; 0: all). samples > 0: a generative
    task's extra also holds sampled pass@1 and pass@samples at `temperature` (sampled_pass_rates)."""
    from redline.errors import UserError

    examples = task.examples(split)
    if limit:
        examples = examples[:limit]
    if not examples:
        raise UserError(f"task {task.name} has no {split} examples")
    if task.kind == "multiple_choice":
        model = generator.engine.model
        amp = torch.autocast("cuda", dtype=torch.bfloat16) if generator.engine.device.type == "cuda" \
            else contextlib.nullcontext()
        with amp:
            return score_multiple_choice(model, generator.tokenizer, renderer, task, examples, batch_size)
    result = score_generative(generator, renderer, task, examples, batch_size, max_new_tokens)
    if samples:
        result.extra.update(sampled_pass_rates(generator, renderer, task, examples, batch_size, max_new_tokens,
                                               samples, temperature, seed))
        result.extra["sampling"] = {"n": samples, "temperature": temperature}
    return result
