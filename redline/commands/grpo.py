"""`redline grpo`: reinforcement learning of a checkpoint on a task's verifiable rewards (GRPO), through the
training loop of `redline train` (budgets, evaluation, metrics, checkpoints, exact resume).

    redline grpo --from runs/sft-tiny-20260101 --task arithmetic max_steps=50
    redline grpo --from CKPT --task arithmetic grpo.group_size=16 grpo.kl_coef=0.02 grpo.loss_norm=constant
    redline grpo --resume runs/grpo-tiny-20260101     # exactly where it stopped

Every step samples grpo.prompts_per_step prompts × grpo.group_size completions from the weights being trained,
with redline's KV-cache engine in the same process (no second copy of the model), rewards them with the task,
and takes one update on group-relative advantages (redline/posttrain/grpo.py). metrics.jsonl logs each step's
reward_mean, pass_at_1 and pass_at_K; evaluations score the task's test split greedily (exact match). With
lora.enabled=True only adapters train: the engine samples from the adapted model (the adapters on, through the
model's own forward), and grpo.kl_coef's reference is the base with the adapters off (no second copy). Without
optim.lr a full fine-tune takes the starting run's peak / 200 (docs/posttraining.md says why).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from redline.errors import UserError

def reference_builder(init_from: Path, device_dtype=None):
    """step -> () -> the reference model: the converters off where LoRA holds the trained difference, else a
    frozen copy of the starting checkpoint (the one case where KL costs a second model)."""
    from redline.posttrain.rollouts import disabled_reference, frozen_reference

    def for_step(step):
        if step.converters.get("lora") is not None:
            return disabled_reference(step)

        def build():
            import torch

            from redline.commands.sft import init_from_checkpoint
            from redline.model import GPT

            with torch.device(step.device):
                model = GPT(step.model.cfg)
            init_from_checkpoint(init_from)(model)
            return model
        return frozen_reference(build)
    return for_step


def main(argv: list[str]) -> int:
    from redline.chat.render import renderer_for
    from redline.commands.sft import chat_tokenizer, lora_start
    from redline.distributed import dist_info, leave_process_group
    from redline.posttrain.grpo import GRPO
    from redline.posttrain.launch import exit_code, start_run
    from redline.posttrain.rollouts import RolloutSettings, TaskRollouts
    from redline.tasks import load_task
    from redline.training.loop import train
    from redline.training.wrap import set_cuda_allocator_defaults

    set_cuda_allocator_defaults()
    run = start_run(argv, "grpo", __doc__.strip(), need="--task")
    cfg = run.cfg
    if run.value is not None:
        cfg.grpo.task = run.value
    if not cfg.grpo.task:
        raise UserError("no task: give --task NAME")
    g = cfg.grpo
    sequences = g.prompts_per_step * g.group_size
    if cfg.batch_size == "auto":
        raise UserError("redline grpo needs a number for batch_size (sequences per micro-batch)")
    if sequences % cfg.batch_size:
        raise UserError(f"grpo.prompts_per_step × grpo.group_size = {sequences} sequences per step is not a multiple "
                        f"of batch_size={cfg.batch_size}; change one of them")
    task = load_task(g.task, seed=cfg.finetune.task_seed)  # the splits evaluate uses, whatever the run's seed
    if task.kind != "generative":
        raise UserError(f"task {task.name} is multiple-choice; GRPO samples answers, so give a generative task")
    tokenizer = chat_tokenizer(run.start, cfg.finetune.template, grow=not cfg.lora.enabled)
    settings = RolloutSettings(group_size=g.group_size, prompts_per_step=g.prompts_per_step,
                               max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_k=g.top_k or None,
                               scale_rewards=g.scale_rewards, loss_norm=g.loss_norm, pass_k=g.pass_k,
                               updates_per_rollout=g.updates_per_rollout, rollout_weights=g.rollout_weights)
    objective = GRPO(g.kl_coef, g.clip_eps)
    source = TaskRollouts(task, tokenizer, renderer_for(tokenizer, cfg.finetune.template), settings, objective,
                          cfg.model.context_len, g.eval_examples, reference_builder(run.init_from))
    info = dist_info()
    if info.is_main:
        print(f"redline grpo: {source.describe()}", file=sys.stderr, flush=True)
        if run.note:
            print(f"redline grpo: {run.note}", file=sys.stderr, flush=True)
    # one step trains on one rollout (updates_per_rollout steps each): its sequences make up the step's micro-batches
    cfg = dataclasses.replace(cfg, tokens_per_step=sequences * cfg.effective_seq_len * info.world_size)
    if not (cfg.max_steps or cfg.max_tokens or cfg.max_time):
        rollouts = max(1, round(cfg.finetune.epochs * len(source.prompts) / g.prompts_per_step))
        cfg.max_steps = rollouts * g.updates_per_rollout
    init = lora_start(cfg, run.init_from)  # None under LoRA: the run starts through init_from
    result = train(cfg, run.resume_from, data=lambda run_dir: source, objective=objective, init=init)
    leave_process_group()
    return exit_code(result.status)
