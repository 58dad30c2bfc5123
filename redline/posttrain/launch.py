"""What `redline dpo` and `redline grpo` share with `redline sft` before the loop starts: the run's config from the
starting checkpoint (or, on --resume, from the run's own), and the tokenizer with its chat template.

    run = start_run(argv, "dpo", DESCRIPTION, need="--data")   # PostTrainRun(cfg, start, resume_from, value)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from redline.config import TrainConfig, from_dict, parse
from redline.errors import UserError


@dataclass
class PostTrainRun:
    cfg: TrainConfig
    start: Path
    """The checkpoint the tokenizer is read from: the starting one, or the one resumed."""
    resume_from: Path | None
    init_from: Path
    """The starting checkpoint (the reference model's weights)."""
    value: str | None
    """The value of the command's own option (--data, --task); None on resume (it is in the saved config)."""
    note: str | None = None
    """What the run changed from the starting run's settings without being asked (its learning rate), to print."""


# A full fine-tune by `redline dpo` or `redline grpo` that names no learning rate starts from the starting run's
# peak divided by this. Inherited as it is (a pretraining or SFT peak), the step is far too large for a preference
# or policy-gradient update: at 124M after an SFT at 1e-3, DPO at 2e-4 took exact match from 0.51 to 0.10 and
# 2e-5 still lowered it, where 1e-5 did not; GRPO fell at 2e-5 and rose at 5e-6 (docs/posttraining.md, Measured).
# trl's DPO and GRPO default to 1e-6 whatever the model.
LR_DIVISOR = {"dpo": 100, "grpo": 200}


def _given(argv: list[str], key: str) -> bool:
    """Whether argv sets `key` (key=value, --key value or --key=value)."""
    return any(a in (key, f"--{key}") or a.startswith((f"{key}=", f"--{key}=")) for a in argv)


def _base_lr(cfg: TrainConfig) -> float:
    """The peak of the pretraining or SFT run a chain of runs started from: carried as finetune.base_lr by dpo and
    grpo runs, else the run's own peak."""
    return cfg.finetune.base_lr if cfg.finetune.base_lr is not None else cfg.optim.lr


def adamw_instead_of_muon(cfg: TrainConfig, argv: list[str]) -> bool:
    """Switch a run that inherited Muon (a Muon-trained base: the modern presets' default) to AdamW unless the command
    line names optim.name; -> whether it switched. Muon's fixed-size orthogonal steps are a pretraining tool. The
    embedding, head and gain rates that trained beside Muon (modern-124m's at 10x the AdamW rate) go with it, unless
    the command line sets them: AdamW then trains every weight at optim.lr, as post-training was measured."""
    if cfg.optim.name == "muon" and not _given(argv, "optim.name"):
        cfg.optim.name = "adamw"
        for key in ("embed_lr", "head_lr", "gain_lr"):
            if not _given(argv, f"optim.{key}"):
                setattr(cfg.optim, key, None)
        return True
    return False


def _post_training_lr(cfg: TrainConfig, argv: list[str], command: str, base: float | None = None) -> str | None:
    """Lower an inherited learning rate for a DPO or GRPO full fine-tune: the peak of the pretraining or SFT run
    the chain started from (finetune.base_lr, carried from run to run) / LR_DIVISOR; and train it with AdamW when
    the starting run used Muon (whose fixed-size orthogonal steps are a pretraining tool), unless the command line
    chose them; -> a line saying what changed, or None. A LoRA run keeps what it is given: adapters start at zero
    and take larger steps. base: that peak, from the starting run's config before the command line's settings
    (None: cfg's own, as the starting run left it)."""
    start_lr = cfg.optim.lr
    base = _base_lr(cfg) if base is None else base
    cfg.finetune.base_lr = base  # for the run after this one (GRPO after DPO divides the same peak)
    if cfg.lora.enabled or _given(argv, "optim.lr") or cfg.optim.name == "prodigy":
        return None
    switched_optimizer = adamw_instead_of_muon(cfg, argv)
    scale = base / LR_DIVISOR[command] / start_lr  # embed_lr, head_lr and gain_lr keep their ratio to lr
    for key in ("lr", "embed_lr", "head_lr", "gain_lr"):  # optim.lr is not given (above); the others may be
        value = getattr(cfg.optim, key)
        if value is not None and not _given(argv, f"optim.{key}"):
            setattr(cfg.optim, key, value * scale)
    switched = ", AdamW instead of the starting run's Muon" if switched_optimizer else ""
    source = "the starting run's" if base == start_lr else "the pretraining or SFT run's"
    return (f"optim.lr {cfg.optim.lr:.2g} ({source} {base:.2g} / {LR_DIVISOR[command]}{switched}; "
            f"set optim.lr to choose)")


def start_run(argv: list[str], command: str, description: str, need: str) -> PostTrainRun:
    """Parse `--from CKPT <need> VALUE [overrides]` or `--resume RUN [overrides]` as `redline sft` does."""
    from redline.commands.sft import _pop, base_config, local_path, refuse_changed_on_resume, refuse_existing_run
    from redline.training import checkpoint as ckpt_io

    argv = list(argv)
    if "--help" in argv or "-h" in argv:  # the training fields, with the command's usage above them
        parse(TrainConfig, argv, prog=f"redline {command} --from CKPT {need} {'SRC' if need == '--data' else 'NAME'}",
              description=description)
    init_from, argv = _pop(argv, "--from")
    value, argv = _pop(argv, need)
    resume, argv = _pop(argv, "--resume")
    prog = f"redline {command}"
    if resume is not None:
        resume_from = ckpt_io.resolve_checkpoint(resume)
        saved = from_dict(TrainConfig, ckpt_io.load_config_dict(resume_from))
        cfg = parse(TrainConfig, argv, prog=prog, description=description, default=saved)
        cfg.run_name, cfg.out_dir = resume_from.parent.parent.name, str(resume_from.parent.parent.parent)
        if not cfg.finetune.init_from:
            raise UserError(f"{resume_from} is not a run of `{prog}` (its config names no starting checkpoint)")
        saved_value = cfg.finetune.data if need == "--data" else cfg.grpo.task
        refuse_changed_on_resume(command, {"--from": init_from, need: value},
                                 {"--from": cfg.finetune.init_from, need: saved_value})
        return PostTrainRun(cfg, resume_from, resume_from, Path(cfg.finetune.init_from), None)
    if not init_from or not value:
        raise UserError(f"give --from CHECKPOINT (the run directory or checkpoint to start from) and {need} "
                        f"{'SRC (a .jsonl of pairs or task:NAME)' if need == '--data' else 'NAME (a task)'}")
    source = ckpt_io.resolve_checkpoint(init_from)
    ckpt_io.verify_checkpoint(source)
    start = base_config(source)
    base = _base_lr(start)  # the starting run's, before the command line's settings
    cfg = parse(TrainConfig, argv, prog=prog, description=description, default=start)
    cfg.finetune.init_from = str(source.resolve())
    cfg.run_name = cfg.run_name or f"{command}-{cfg.preset}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    refuse_existing_run(cfg, command)
    note = _post_training_lr(cfg, argv, command, base)
    return PostTrainRun(cfg, source, None, source, local_path(value), note)


def exit_code(status: str) -> int:
    return {"completed": 0, "already_complete": 0, "diverged": 1, "interrupted": 130}[status]
