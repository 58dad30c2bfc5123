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


def start_run(argv: list[str], command: str, description: str, need: str) -> PostTrainRun:
    """Parse `--from CKPT <need> VALUE [overrides]` or `--resume RUN [overrides]` as `redline sft` does."""
    from redline.commands.sft import _pop, base_config
    from redline.training import checkpoint as ckpt_io

    argv = list(argv)
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
        return PostTrainRun(cfg, resume_from, resume_from, Path(cfg.finetune.init_from), None)
    if not init_from or not value:
        raise UserError(f"give --from CHECKPOINT (the run directory or checkpoint to start from) and {need} "
                        f"{'SRC (a .jsonl of pairs or task:NAME)' if need == '--data' else 'NAME (a task)'}")
    source = ckpt_io.resolve_checkpoint(init_from)
    ckpt_io.verify_checkpoint(source)
    cfg = parse(TrainConfig, argv, prog=prog, description=description, default=base_config(source))
    cfg.finetune.init_from = str(source)
    cfg.run_name = cfg.run_name or f"{command}-{cfg.preset}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    return PostTrainRun(cfg, source, None, source, value)


def exit_code(status: str) -> int:
    return {"completed": 0, "already_complete": 0, "diverged": 1, "interrupted": 130}[status]
