"""`redline sft`: supervised fine-tuning of a checkpoint on conversations, through the training loop of `redline
train` (budgets, evaluation, metrics, checkpoints, exact resume, compile, FP8, DDP), with the SFT objective.

    redline sft --from runs/tiny-20260101 --data task:arithmetic
    redline sft --from CKPT --data chats.jsonl max_steps=500 optim.lr=3e-4
    redline sft --resume runs/sft-tiny-20260101      # exactly where it stopped

The run starts from the checkpoint's model and training settings, with its budget cleared: with none given it
trains finetune.epochs passes over the conversations. A tokenizer without a Jinja chat template gets redline's
chat tokens (the model's embedding grows with them, new rows at the mean of the old). Overrides as for `redline
train` (key=value); finetune.* are SFT's own (template, packing, epochs, eval_fraction).

With lora.enabled=True the run trains adapters on the frozen checkpoint (docs/lora.md): it starts through
init_from, so its checkpoints hold the adapters and a verified reference to CKPT. The vocabulary does not grow
under LoRA (the embedding and head are frozen and the adapters reference an unchanged base), so CKPT needs a chat
template or redline's chat tokens already (e.g. from a full `redline sft`).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from redline.config import TrainConfig, from_dict, parse
from redline.errors import UserError

DESCRIPTION = "Fine-tune a checkpoint on conversations (--from CKPT --data SRC). Overrides as for redline train."


def _pop(argv: list[str], name: str) -> tuple[str | None, list[str]]:
    for i, arg in enumerate(argv):
        if arg == name or arg.startswith(name + "="):
            if "=" in arg:
                return arg.split("=", 1)[1], argv[:i] + argv[i + 1:]
            if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                raise UserError(f"{name} needs a value")
            return argv[i + 1], argv[:i] + argv[i + 2:]
    return None, argv


def local_path(value: str) -> str:
    """A data source or checkpoint as the run's config keeps it: an existing local path made absolute (so that
    `--resume` works from any directory), anything else (task:NAME, a Hub dataset name) as given."""
    return str(Path(value).resolve()) if value and Path(value).exists() else value


def refuse_changed_on_resume(command: str, given: dict[str, str | None], saved: dict[str, str | None]) -> None:
    """--resume continues a run with its own data and starting point: a different one given beside it is an
    error rather than silently dropped (the same one, as a script repeats its arguments, is fine)."""
    for option, value in given.items():
        if value is not None and local_path(value) != local_path(saved.get(option) or ""):
            raise UserError(f"{option} {value} with --resume: the run continues from its own {option} "
                            f"({saved.get(option)}); leave {option} out, or start a new run with `redline {command} "
                            f"--from ...`")


def refuse_existing_run(cfg: TrainConfig, command: str) -> None:
    """The training loop's check that a new run's directory holds no run, before the data is read."""
    from redline.training.loop import refuse_used_run_dir

    refuse_used_run_dir(Path(cfg.out_dir) / cfg.run_name, command=command)


def base_config(source: Path) -> TrainConfig:
    """The source checkpoint's config as the start of a fine-tuning run: same model and settings, budget cleared,
    no resume, a new run name, no closing text sample (a chat model is sampled with `redline chat`), and none of
    the pretraining run's warm-ups of the batch's shape (batch_ramp_steps, seq_ramp_steps: fine-tuning packs
    conversations into full rows, and refuses them)."""
    from redline.training import checkpoint as ckpt_io

    from redline.config import LoRAConfig

    cfg = from_dict(TrainConfig, ckpt_io.load_config_dict(source))
    # the source's own start (its init_from, its LoRA settings) is not this run's: the weights come from source
    # (merged, if it is a LoRA run), and LoRA is on only when this run asks for it. init_from=source lets a
    # lora.enabled=True override validate; lora_start clears it for a run without LoRA
    return dataclasses.replace(cfg, max_steps=0, max_tokens=0, max_time=0.0, resume="never", run_name=None,
                               sample_tokens=0, init_from=str(source), lora=LoRAConfig(), batch_ramp_steps=0,
                               seq_ramp_steps=0)


def switch_from_muon(cfg: TrainConfig, argv: list[str], command: str) -> None:
    """A fine-tune of a Muon-trained base (the modern presets' default) takes AdamW at the base's AdamW rate unless
    the command line names optim.name: Muon's fixed-size orthogonal steps are a pretraining tool, and AdamW is what
    redline's post-training was measured with (docs/posttraining.md)."""
    from redline.distributed import dist_info
    from redline.posttrain.launch import adamw_instead_of_muon

    if adamw_instead_of_muon(cfg, argv) and dist_info().is_main:
        print(f"redline {command}: AdamW at optim.lr {cfg.optim.lr:.2g} instead of the starting run's Muon (set "
              f"optim.name to choose)", file=sys.stderr, flush=True)


def chat_tokenizer(checkpoint: Path, template: str, grow: bool = True):
    """The checkpoint's tokenizer, with redline's chat tokens added unless its Jinja template is used. grow=False
    (LoRA: the vocabulary is the base's) refuses a tokenizer that would need them added."""
    from redline.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(checkpoint / "tokenizer")
    if template == "redline" or (template == "auto" and not tokenizer.chat_template):
        if not grow and not tokenizer.chat_token_ids:
            raise UserError(f"{checkpoint} has no chat template and no chat tokens, and LoRA does not grow the "
                            f"vocabulary; fine-tune it without LoRA first (`redline sft --from {checkpoint}` adds "
                            f"them), or start from a model with a chat template")
        tokenizer.add_chat_tokens()
    elif not tokenizer.chat_template:
        raise UserError(f"finetune.template=jinja but the tokenizer of {checkpoint} has no chat template; use "
                        f"finetune.template=auto (redline's chat tokens)")
    return tokenizer


def init_from_checkpoint(source: Path):
    """model -> None: the source checkpoint's weights into the run's model, the vocabulary grown to fit."""

    def init(model) -> None:
        from redline.chat.render import resize_vocab
        from redline.training.checkpoint import load_for_inference

        pretrained, _, _ = load_for_inference(source, "cpu")
        grown = resize_vocab(pretrained.float(), model.cfg.vocab_size)
        if grown.cfg.vocab_size != model.cfg.vocab_size:
            raise UserError(f"{source} has a vocabulary of {grown.cfg.vocab_size}, more than the tokenizer's "
                            f"{model.cfg.vocab_size}; its tokenizer folder is not its own")
        model.load_state_dict(grown.state_dict())

    return init


def lora_start(cfg: TrainConfig, source: Path) -> Callable | None:
    """The `init` to give train(): None under LoRA, which starts through init_from=source instead (its checkpoints
    then hold the adapters and a reference to source); else source's weights with the vocabulary grown (and no
    init_from, whose path keeps the checkpoint's vocabulary)."""
    if cfg.lora.enabled:
        cfg.init_from = str(source)
        return None
    cfg.init_from = None
    return init_from_checkpoint(source)


def default_budget(cfg: TrainConfig, rows_per_epoch: int, world_size: int) -> TrainConfig:
    """cfg with max_steps set to finetune.epochs passes when no budget is given."""
    if cfg.max_steps or cfg.max_tokens or cfg.max_time:
        return cfg
    per_step = (cfg.tokens_per_step // cfg.effective_seq_len) if cfg.tokens_per_step else cfg.batch_size * world_size
    return dataclasses.replace(cfg, max_steps=max(1, math.floor(cfg.finetune.epochs * rows_per_epoch / per_step)))


def main(argv: list[str]) -> int:
    from redline.distributed import dist_info, leave_process_group
    from redline.training import checkpoint as ckpt_io
    from redline.training.conversations import ConversationData
    from redline.training.loop import train
    from redline.training.objectives import SupervisedFineTuning
    from redline.training.wrap import set_cuda_allocator_defaults

    set_cuda_allocator_defaults()
    argv = list(argv)
    if "--help" in argv or "-h" in argv:  # the training fields, with SFT's usage above them
        parse(TrainConfig, argv, prog="redline sft --from CKPT --data SRC", description=__doc__.strip())
    init_from, argv = _pop(argv, "--from")
    data, argv = _pop(argv, "--data")
    resume, argv = _pop(argv, "--resume")
    resume_from = None
    if resume is not None:
        resume_from = ckpt_io.resolve_checkpoint(resume)
        saved = from_dict(TrainConfig, ckpt_io.load_config_dict(resume_from))
        cfg = parse(TrainConfig, argv, prog="redline sft", description=DESCRIPTION, default=saved)
        cfg.run_name, cfg.out_dir = resume_from.parent.parent.name, str(resume_from.parent.parent.parent)
        refuse_changed_on_resume("sft", {"--from": init_from, "--data": data},
                                 {"--from": cfg.finetune.init_from, "--data": cfg.finetune.data})
        start = resume_from
    else:
        if not init_from or not data:
            raise UserError("give --from CHECKPOINT (a run directory or checkpoint to fine-tune) and --data SRC "
                            "(a .jsonl of conversations, task:NAME, or a Hugging Face dataset name)")
        source = ckpt_io.resolve_checkpoint(init_from)
        ckpt_io.verify_checkpoint(source)
        cfg = parse(TrainConfig, argv, prog="redline sft", description=DESCRIPTION, default=base_config(source))
        switch_from_muon(cfg, argv, "sft")
        cfg.finetune.base_lr = None  # this run's rate is the peak a later dpo or grpo divides
        cfg.finetune.init_from, cfg.finetune.data = str(source.resolve()), local_path(data)
        cfg.run_name = cfg.run_name or f"sft-{cfg.preset}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        refuse_existing_run(cfg, "sft")
        start = source
    if cfg.model.prefix_lm and cfg.finetune.packing:
        raise UserError("model.prefix_lm attends each row's prompt both ways, one conversation a row: set "
                        "finetune.packing=false")
    tokenizer = chat_tokenizer(start, cfg.finetune.template, grow=not cfg.lora.enabled)
    conversations = ConversationData.load(cfg.finetune.data, tokenizer, cfg.effective_seq_len, seed=cfg.seed,
                                          task_seed=cfg.finetune.task_seed,
                                          template=cfg.finetune.template, packing=cfg.finetune.packing,
                                          eval_fraction=cfg.finetune.eval_fraction)
    info = dist_info()
    if info.is_main:
        print(f"redline sft: {conversations.describe(cfg.seed)}", file=sys.stderr, flush=True)
    cfg = default_budget(cfg, len(conversations.rows_for_epoch(cfg.seed, 0)), info.world_size)
    init = lora_start(cfg, Path(cfg.finetune.init_from))
    result = train(cfg, resume_from, data=lambda run_dir: conversations, objective=SupervisedFineTuning(), init=init)
    leave_process_group()
    return {"completed": 0, "already_complete": 0, "diverged": 1, "interrupted": 130}[result.status]
