"""Continued pretraining of an imported model on one GPU (`redline train --init-from`), and what masking the padded
vocabulary out of the loss costs in training speed.

1. mask cost: `redline bench` of gpt2-124m at model.vocab_size 50257 (47 padding rows, masked out of the softmax)
   and 50304 (no padding), with the full and the chunked cross-entropy: the head's GEMMs are the same size in
   both, so tokens/s should agree within noise.
2. init_from (with --model: SmolLM2-135M-Instruct's GGUF, or any folder or file `redline import` reads): import
   it; write the embedded corpus (stdlib docstrings) as raw text; `redline eval` of the import on it (bf16 on a
   GPU) against transformers' fp32 loss on the same batches (the exported import); `redline train --init-from` for
   --steps steps (bf16, compiled on a GPU): its first step's loss must be near the import's eval loss (a random
   init starts near ln(vocab), 10.8 for SmolLM2), its last lower; `--resume` for 10 more steps; export of the run,
   loaded by transformers, logits against redline's.

    python scripts/gpu/init_from.py --model /tmp/SmolLM2-135M-Instruct.Q4_1.gguf --out $OUT
    python scripts/gpu/init_from.py --no-mask-cost --model HF_FOLDER --batch 2 --seq 32 --steps 3 --out /tmp/x  # CPU

Prints what it runs and a table, then one JSON line with every number; also writes init_from.jsonl under --out.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def redline(*args, out: Path, name: str) -> str:
    """Run a redline command in a fresh process; its output goes to OUT/NAME.log; returns stdout."""
    cmd = [sys.executable, "-m", "redline", *map(str, args)]
    print("+ redline " + " ".join(map(str, args)), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    print(f"  exit {proc.returncode} in {time.perf_counter() - start:.0f} s", flush=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], flush=True)
        raise SystemExit(f"{name} failed")
    return proc.stdout


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def mask_cost(out: Path) -> list[dict]:
    rows = []
    for chunk in (0, 8192):
        for vocab in (50304, 50257):
            name = f"bench-v{vocab}-ce{chunk}"
            text = redline("bench", "--preset", "gpt2-124m", f"model.vocab_size={vocab}",
                           f"model.ce_chunk_tokens={chunk}", "batch_size=16", "seq_len=1024", out=out, name=name)
            point = last_json(text)["points"][0]
            rows.append({"vocab_size": vocab, "ce_chunk_tokens": chunk, "tokens_per_second": point.get("tokens_per_second"),
                         "status": point.get("status")})
    return rows


@torch.no_grad()
def hf_loss(folder: Path, data: Path, batch: int, seq: int, batches: int) -> float:
    import transformers

    from redline.data.loader import TokenLoader

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(DEVICE).eval()
    loader = TokenLoader(data, "val", batch, seq, prefetch=False)
    losses = [F.cross_entropy(model(x.to(DEVICE)).logits.flatten(0, 1).float(), y.to(DEVICE).flatten()).item()
              for x, y in loader.eval_batches(batches)]
    return sum(losses) / len(losses)


def train_losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r.get("kind") == "train"]


@torch.no_grad()
def export_parity(exported: Path, run: Path) -> float:
    import transformers

    from redline.training.checkpoint import load_for_inference

    model, _, cfg = load_for_inference(run, DEVICE)
    back = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).to(DEVICE).eval()
    T = min(256, cfg.model.context_len)
    tokens = torch.randint(0, cfg.model.vocab_size, (2, T), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    return (back(tokens).logits - model(tokens)).abs().max().item()


def init_from(out: Path, source: str, steps: int, batch: int, seq: int) -> dict:
    from redline.data.embedded import embedded_documents
    from redline.training.checkpoint import load_for_inference

    ckpt, text, run = out / "imported", out / "docstrings.jsonl", out / "runs" / "cpt"
    redline("import", source, "--out", ckpt, out=out, name="import")
    text.write_text("".join(json.dumps({"text": d}) + "\n" for d in embedded_documents(4_000_000)))
    data = out / "data"
    redline("data", "prepare", "--inputs", text, "--out", data, "--tokenizer", ckpt / "tokenizer", out=out, name="prepare")
    vocab = load_for_inference(ckpt)[2].model.vocab_size
    batches = 8
    evaluated = last_json(redline("eval", "--checkpoint", ckpt, "--data", data, "--batches", batches, "--batch-size",
                                  batch, "--seq-len", seq, out=out, name="eval-import"))
    redline("export", ckpt, "--out", out / "import-hf", "--dtype", "fp32", out=out, name="export-import")
    reference = hf_loss(out / "import-hf", data, batch, seq, batches)
    common = [f"out_dir={out / 'runs'}", "run_name=cpt", f"seq_len={seq}", f"batch_size={batch}", "optim.lr=3e-5",
              "optim.warmup_steps=10", "eval_every=0", f"eval_batches={batches}", "sample_tokens=64", "log_every=10"]
    redline("train", "--init-from", ckpt, "--data.path", data, f"max_steps={steps}", *common, out=out, name="train")
    redline("train", "--resume", run, f"max_steps={steps + 10}", out=out, name="resume")
    losses = train_losses(run)
    redline("export", run, "--out", out / "cpt-hf", "--dtype", "fp32", out=out, name="export-run")
    return {"import_eval_loss": evaluated["loss"], "import_hf_loss_fp32": reference,
            "random_init_loss": math.log(vocab), "first_train_loss": losses[0], "last_train_loss": losses[-1],
            "train_steps": len(losses), "export_max_abs_logit_diff": export_parity(out / "cpt-hf", run)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default=None, help="what to import, e.g. SmolLM2-135M-Instruct.Q4_1.gguf "
                        "(else only the mask cost)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--no-mask-cost", action="store_true", help="skip part 1")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu",
              "mask_cost": [] if args.no_mask_cost else mask_cost(out)}
    print(f"{'vocab':>6} {'CE chunk':>8} {'tokens/s':>12}")
    for r in report["mask_cost"]:
        print(f"{r['vocab_size']:>6} {r['ce_chunk_tokens']:>8} {r['tokens_per_second'] or 0:>12,.0f} {r['status']}")
    if args.model:
        report["init_from"] = result = init_from(out, args.model, args.steps, args.batch, args.seq)
        for key, value in result.items():
            print(f"{key:>28}: {value:.4f}" if isinstance(value, float) else f"{key:>28}: {value}")
    line = json.dumps(report)
    (out / "init_from.jsonl").write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
