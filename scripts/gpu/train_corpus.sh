#!/usr/bin/env bash
# Train modern-124m (T=2048) and gpt2-124m (T=1024) for a few hundred steps on a prepared corpus folder and
# print each run's throughput, MFU and validation bits per byte (the foundation issue's GPU check).
#
#     scripts/gpu/train_corpus.sh DATA_DIR [STEPS]      # runs under $OUT (default: a temporary folder)
set -uo pipefail
cd "$(dirname "$0")/../.."
DATA="${1:?usage: train_corpus.sh DATA_DIR [STEPS]}"
STEPS="${2:-300}"
PY="${PYTHON:-python3}"
OUT="${OUT:-$(mktemp -d)}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 REDLINE_CACHE="${REDLINE_CACHE:-$OUT/cache}"
# modern-124m through the `adamw` recipe: the training this table was measured with (AdamW, cosine), not the modern
# presets' time-to-quality defaults (scripts/gpu/speedrun.sh measures those)
for spec in "modern-124m 16 2048" "gpt2-124m 32 1024"; do
    set -- $spec
    recipe=()
    [ "$1" = modern-124m ] && recipe=(--recipe adamw)
    "$PY" -m redline train "${recipe[@]}" --preset "$1" --data.path "$DATA" batch_size="$2" seq_len="$3" max_steps="$STEPS" \
        eval_every=100 eval_batches=20 log_every=25 sample_tokens=40 sample_prompt="The kernel" \
        out_dir="$OUT/runs" run_name="$1" 2>&1 | tee "$OUT/train-$1.log"
done
"$PY" - "$OUT/runs" <<'PY'
import json, statistics, sys
from pathlib import Path
rows = []
for run in sorted(Path(sys.argv[1]).iterdir()):
    recs = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    logs = [r for r in recs if r["kind"] == "train" and "tokens_per_second" in r][1:]  # the first window compiles
    evals = [r for r in recs if r["kind"] == "eval"]
    rows.append({"run": run.name, "tokens_per_second_median": statistics.median(r["tokens_per_second"] for r in logs),
                 "mfu_median": statistics.median(r.get("mfu", 0) for r in logs),
                 "peak_memory_gib": max(r["peak_memory_gib"] for r in logs),
                 "val_bpb": [(e["step"], round(e["bpb"], 4)) for e in evals]})
for r in rows:
    print(f"{r['run']:<12} {r['tokens_per_second_median']:>10,.0f} tok/s  MFU {r['mfu_median']:.1%}  "
          f"mem {r['peak_memory_gib']:.1f} GiB  val bpb {r['val_bpb']}")
print(json.dumps(rows))
PY
