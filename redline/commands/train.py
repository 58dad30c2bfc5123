"""`redline train`: train a model. With no arguments: the `tiny` preset on the embedded default corpus.

    redline train                                   # embedded default, CPU or GPU
    redline train --preset modern-124m --data.path data/corpus max_steps=2000
    redline train --config recipe.toml optim.lr=3e-4
    redline train --resume                          # newest run, exactly where it stopped
    redline train --init-from models/smollm2 --data.path my_texts/ optim.lr=1e-4   # from a checkpoint's weights
"""

from __future__ import annotations

import os
import sys

from redline.config import TrainConfig, from_dict, parse
from redline.distributed import dist_info, leave_process_group, peer_failure_message
from redline.errors import UserError

# a stopped run (Ctrl-C, SIGTERM) exits as an interrupted shell command does, so `redline train ... && next`
# stops there; a run that was already complete is a success
EXIT_CODES = {"completed": 0, "already_complete": 0, "diverged": 1, "interrupted": 130}

DESCRIPTION = ("Train a GPT model. Overrides: --section.field VALUE or section.field=VALUE; --config FILE; --preset NAME; "
               "--recipe NAME (a shipped training recipe); --list-presets prints the presets.")


def list_presets() -> None:
    from rich.console import Console
    from rich.table import Table

    import torch

    from redline.model import GPT
    from redline.presets import PRESETS

    table = Table("preset", "params", "non-emb", "layers", "width", "heads/kv", "mlp", "pos", "norm", "vocab", "ctx")
    for name, cfg in PRESETS.items():
        with torch.device("meta"):
            model = GPT(cfg)
        table.add_row(name, f"{model.num_params() / 1e6:.1f}M", f"{model.num_params(False) / 1e6:.1f}M",
                      str(cfg.n_layer), str(cfg.n_embd), f"{cfg.n_head}/{cfg.kv_heads}", cfg.mlp, cfg.pos_emb,
                      f"{cfg.norm_position}-{cfg.norm}", str(cfg.vocab_size), str(cfg.context_len))
    console = Console()
    if not console.is_terminal:  # piped or captured: rich would cut the table to 80 columns
        console = Console(width=160)
    console.print(table)


def launch_torchrun(nproc: int, argv: list[str]) -> int:
    """`redline train --gpus N`: the same command under torchrun, one process per GPU on this node."""
    import subprocess

    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() < nproc:
        raise UserError(f"gpus={nproc} but this machine has {torch.cuda.device_count()} GPU(s)")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "redline", "train", *argv]
    print("redline train: launching " + " ".join(cmd[2:]), file=sys.stderr, flush=True)
    return subprocess.call(cmd)


def main(argv: list[str]) -> int:
    from redline.training import checkpoint as ckpt_io
    from redline.training.loop import find_resume_checkpoint, train
    from redline.training.wrap import set_cuda_allocator_defaults

    set_cuda_allocator_defaults()  # before anything touches CUDA

    if "--list-presets" in argv:
        list_presets()
        return 0
    bare = {"--resume": "auto"}
    cfg = parse(TrainConfig, argv, prog="redline train", description=DESCRIPTION, bare_flags=bare)
    if cfg.gpus > 1 and "WORLD_SIZE" not in os.environ:
        return launch_torchrun(cfg.gpus, argv)
    resume_from = find_resume_checkpoint(cfg)
    if cfg.resume != "never" and resume_from is None:
        if cfg.resume == "auto":
            print("redline train: nothing to resume, starting a new run", file=sys.stderr)
        else:
            raise UserError(f"no checkpoint at {cfg.resume}")
    if resume_from is not None:
        # the saved config is the base; only what this command line says explicitly changes it
        saved = from_dict(TrainConfig, ckpt_io.load_config_dict(resume_from))
        cfg = parse(TrainConfig, argv, prog="redline train", description=DESCRIPTION, bare_flags=bare, default=saved)
        cfg.run_name = resume_from.parent.parent.name
        cfg.out_dir = str(resume_from.parent.parent.parent)
    try:
        result = train(cfg, resume_from=resume_from)
    except RuntimeError as error:  # torch.distributed.DistBackendError is one
        message = peer_failure_message(error, dist_info(), cfg.dist_timeout)
        if message is None:
            raise
        raise UserError(message) from None
    # train's objects are freed by now; a distributed rank leaves its group here and the CLI ends the process
    # without the interpreter's finalization (redline/distributed.py says why)
    leave_process_group()
    return EXIT_CODES[result.status]
