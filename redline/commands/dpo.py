"""`redline dpo`: direct preference optimisation of a checkpoint on preference pairs, through the training loop of
`redline train` (budgets, evaluation, metrics, checkpoints, exact resume) with the DPO objective.

    redline dpo --from runs/sft-tiny-20260101 --data task:arithmetic
    redline dpo --from CKPT --data pairs.jsonl dpo.beta=0.1 dpo.loss=ipo max_steps=200
    redline dpo --resume runs/dpo-tiny-20260101      # exactly where it stopped

Pairs are JSONL lines {"prompt" | "messages", "chosen", "rejected"} or a task's (task:NAME). The starting model's
log-probabilities of every pair are computed once, before the first step, and kept in the checkpoints: no
reference model is held during training. Evaluation reports the held-out pairs' loss, reward margin and
preference accuracy. With lora.enabled=True only adapters train and the reference is the base with the adapters
off (computed once, no second copy; docs/lora.md). Other options as for `redline sft` (key=value overrides;
finetune.eval_fraction, finetune.template, finetune.epochs when no budget is given). Without optim.lr a full
fine-tune takes the starting run's peak / 100 (docs/posttraining.md says why).
"""

from __future__ import annotations

import sys

from redline.errors import UserError


def main(argv: list[str]) -> int:
    from redline.commands.sft import chat_tokenizer, default_budget, lora_start
    from redline.chat.render import renderer_for
    from redline.distributed import dist_info, leave_process_group
    from redline.hardware import autocast_dtype
    from redline.posttrain.data import PairData
    from redline.posttrain.dpo import DPO
    from redline.posttrain.launch import exit_code, start_run
    from redline.training.loop import train
    from redline.training.wrap import set_cuda_allocator_defaults

    set_cuda_allocator_defaults()
    run = start_run(argv, "dpo", __doc__.strip(), need="--data")
    cfg = run.cfg
    if run.value is not None:
        cfg.finetune.data = run.value
    if not cfg.finetune.data:
        raise UserError("no preference data: give --data SRC")
    tokenizer = chat_tokenizer(run.start, cfg.finetune.template, grow=not cfg.lora.enabled)
    objective = DPO(cfg.dpo.beta, cfg.dpo.loss, nll_weight=cfg.dpo.nll_weight)
    batch = cfg.batch_size if isinstance(cfg.batch_size, int) else 8  # for evaluation and the reference pass
    pairs = PairData.load(cfg.finetune.data, tokenizer, renderer_for(tokenizer, cfg.finetune.template),
                          cfg.effective_seq_len, objective, seed=cfg.seed, eval_fraction=cfg.finetune.eval_fraction,
                          max_pairs=cfg.dpo.max_pairs, max_heldout=cfg.eval_batches * batch,
                          task_seed=cfg.finetune.task_seed)
    info = dist_info()
    if info.is_main:
        print(f"redline dpo: {pairs.describe()}", file=sys.stderr, flush=True)
        if run.note:
            print(f"redline dpo: {run.note}", file=sys.stderr, flush=True)
    cfg = default_budget(cfg, len(pairs.train.pairs), info.world_size)
    load_start = lora_start(cfg, run.init_from)

    def init(model) -> None:
        """The starting weights, then the reference log-probabilities they give (once, before wrapping)."""
        load_start(model)
        device = next(model.parameters()).device
        pairs.set_reference(model, batch, device, autocast_dtype(device, cfg.precision))

    # under LoRA the run starts through init_from and the reference comes from the base with the adapters off
    # (PairData.reference_from_base, before the first step)
    result = train(cfg, run.resume_from, data=lambda run_dir: pairs, objective=objective,
                   init=None if load_start is None else init)
    leave_process_group()
    return exit_code(result.status)
