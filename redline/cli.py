"""The `redline` command: one dispatch table, one module per command under redline/commands/.

Each command module has `main(argv: list[str]) -> int | None` and builds its own typed config with
`redline.config.parse`. A UserError anywhere becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import importlib
import os
import sys

from redline.errors import UserError

# name -> (module under redline.commands, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("train", "Train a model (no arguments: the embedded default, on any machine)."),
    "eval": ("eval", "Loss, perplexity and bits per byte of a checkpoint on a data set."),
    "sample": ("sample", "Print continuations of a prompt from a checkpoint."),
    "data": ("data", "Turn text (txt, jsonl, parquet, HF datasets) into token shards: `redline data prepare`."),
    "tokenizer": ("tokenizer", "Train a byte-level BPE tokenizer: `redline tokenizer train`."),
    "generate": ("generate", "Complete prompts with a checkpoint (KV-cache engine, streaming, JSONL output)."),
    "chat": ("chat", "Talk to a checkpoint in a prompt loop (plain text; replies streamed)."),
    "serve": ("serve", "An OpenAI-compatible HTTP server for a checkpoint, with continuous batching."),
    "bench-infer": ("bench_infer", "Time generation: TTFT, decode tokens/s, memory; naive vs cached vs compiled."),
    "sweep": ("sweep", "Run a matrix of training runs from a recipe, resumably (`redline sweep --list`)."),
    "report": ("report", "Report on a run or sweep directory: report.md, plots, results.json/csv, dashboard.html."),
    "dashboard": ("dashboard", "Serve a run or sweep directory's dashboard on localhost, refreshing while it runs."),
    "claims": ("claims", "Set the source design's claims against a sweep's measurements."),
    "speedrun": ("speedrun", "Time to quality: train recipes on the same data, report when each reaches a validation bpb."),
    "doctor": ("doctor", "What this machine can do and what is wrong with it: GPUs, precisions, measured peaks, verdicts."),
    "fit": ("fit", "Find the largest micro-batch that fits in GPU memory, by running real training steps."),
    "plan": ("plan", "Time, cost and energy to train a model to a token budget, from a measured throughput."),
    "bench": ("bench", "Time the training step of a preset or config: tokens/s, MFU, peak memory; matrix; profile."),
    "import": ("import_", "Bring in a model: a Hugging Face folder, a Hub name or a GGUF file, as a checkpoint."),
    "export": ("export", "Write a checkpoint as a Hugging Face folder or a GGUF file (transformers, llama.cpp)."),
    "evaluate": ("evaluate", "Score a checkpoint on tasks: multiple choice by log-likelihood, exact match, vs chance."),
    "sft": ("sft", "Fine-tune a checkpoint on conversations (chat template, packing, loss on replies)."),
    "pairs": ("pairs", "Preference pairs from a checkpoint's own samples, graded by a task (on-policy DPO data)."),
    "dpo": ("dpo", "Preference-tune a checkpoint on chosen/rejected pairs (DPO, IPO, hinge)."),
    "grpo": ("grpo", "Reinforce a checkpoint on a task's rewards with samples from its own weights (GRPO)."),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [
        "usage: redline COMMAND [ARGS...]",
        "",
        "Pretrain small modern GPT models fast, and measure which optimizations pay on your GPU.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "`redline COMMAND --help` lists every option of a command with its meaning and default."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        sys.exit(0)
    if argv[0] in ("-V", "--version"):
        from redline import __version__

        print(f"redline {__version__}")
        sys.exit(0)
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"did you mean `redline {close[0]}`?" if close else "run `redline --help` for the list"
        print(f"redline: unknown command {name!r}; {hint}", file=sys.stderr)
        sys.exit(2)
    module = importlib.import_module(f"redline.commands.{COMMANDS[name][0]}")
    try:
        code = module.main(rest)
    except UserError as e:
        print(f"redline {name}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"redline {name}: interrupted", file=sys.stderr)
        sys.exit(130)
    if "torch.distributed" in sys.modules:  # a rank of a finished distributed run: see exit_after_teardown
        from redline.distributed import exit_after_teardown

        exit_after_teardown(code or 0)
    sys.exit(code or 0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
