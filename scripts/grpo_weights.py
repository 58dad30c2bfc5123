"""What direction of update raises greedy exact match: policy-gradient objectives trained exactly, without sampling.

With 0/1 rewards and p a prompt's chance of a right reply, the expected update of the policy-gradient family is
w(p) ∇log p: the expected reward (REINFORCE, Dr. GRPO) w = p, GRPO's std scaling about sqrt(p / (1 - p)), MaxRL
with G samples 1 - (1 - p)^(G-1), SFT's log-likelihood 1. For a task whose reference reply is the one right reply
(the built-in ones), p is the model's probability of it, so each objective can be trained with its exact gradient:
w(p) held constant times -log p, with no sampling noise. The table in docs/posttraining.md (Measured) comes from:

    python scripts/grpo_weights.py runs/dpo --weight reward --seed 1    # also sft, maxrl, grpo

It starts from CKPT (a chat model), takes AdamW steps of --prompts training prompts each, then prints greedy exact
match on the test split's first 1,000 prompts and the training split's, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from redline.chat.render import renderer_for
from redline.inference import InferenceEngine, SamplingParams
from redline.posttrain.logprobs import pad_rows, token_logps
from redline.tasks import load_task
from redline.training.checkpoint import load_for_inference

WEIGHTS = {  # w(p) of the expected update w(p) ∇log p
    "sft": lambda p: torch.ones_like(p),
    "maxrl": lambda p: 1 - (1 - p) ** 7,  # 8 samples a prompt
    "grpo": lambda p: (p / (1 - p).clamp(min=1e-3)).sqrt(),
    "reward": lambda p: p,
}


def greedy_exact_match(model, tokenizer, renderer, task, examples, max_new_tokens: int = 8) -> float:
    model.eval()
    engine, right = InferenceEngine(model, dtype=torch.float32), 0
    for start in range(0, len(examples), 250):
        chunk = examples[start:start + 250]
        prompts = [renderer.prompt(task.messages(e)) for e in chunk]
        for e, g in zip(chunk, engine.generate(prompts, max_new_tokens, SamplingParams(),
                                               stop_tokens=renderer.stop_ids)):
            right += task.is_correct(e, tokenizer.decode(g.tokens))
    model.train()
    return right / len(examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--weight", choices=sorted(WEIGHTS), default="sft")
    parser.add_argument("--task", default="arithmetic")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--prompts", type=int, default=64, help="training prompts a step")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model, tokenizer, _ = load_for_inference(args.checkpoint)
    renderer = renderer_for(tokenizer)
    task = load_task(f"task:{args.task}", seed=0)
    train, test = task.examples("train"), task.examples("test")
    order = list(range(len(train)))
    random.Random(args.seed).shuffle(order)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 3)  # 3 steps of warm-up, then constant
        batch = [train[order[(step * args.prompts + i) % len(order)]] for i in range(args.prompts)]
        prompts = [renderer.prompt(task.messages(e)) for e in batch]
        replies = [tokenizer.encode(e.reply) + renderer.stop_ids[:1] for e in batch]  # the reply and its end of turn
        sequences = [p + r for p, r in zip(prompts, replies)]
        T = max(map(len, sequences)) - 1
        inputs = pad_rows([s[:-1] for s in sequences], 0, T)
        targets = pad_rows([[-1] * (len(p) - 1) + r for p, r in zip(prompts, replies)], -1, T)
        log_p = token_logps(model, inputs, targets).sum(-1)  # (prompts,) log-probability of the right reply
        w = WEIGHTS[args.weight](log_p.exp().detach())
        loss = -(w * log_p).sum() / w.sum().clamp(min=1e-6)  # the weights' scale left to AdamW
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    result = {"weight": args.weight, "lr": args.lr, "steps": args.steps, "prompts": args.prompts, "seed": args.seed,
              "test": greedy_exact_match(model, tokenizer, renderer, task, test[:1000]),
              "train": greedy_exact_match(model, tokenizer, renderer, task, train[:1000])}
    print(f"{args.weight}: greedy exact match {result['test']:.3f} on test prompts, {result['train']:.3f} on "
          f"training prompts")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
