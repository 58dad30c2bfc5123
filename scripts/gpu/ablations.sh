#!/usr/bin/env bash
# The `ablations` recipe on one GPU: modern-124m, the baseline and 12 single changes × 3 seeds = 39 runs of
# 120 steps × 16 × 1024 tokens (2M tokens each), then the report and the claims. Run from anywhere:
#
#     scripts/gpu/ablations.sh CORPUS_DIR        # a shard folder made by `redline data prepare`
#     STOP_AFTER=20 scripts/gpu/ablations.sh CORPUS_DIR
#
# Expected on one H100: about 13-16 s a run (4-5 s process start and CUDA init, 6-7 s of steps, ~1 s of
# evaluation, 2-3 s saving the final checkpoint that `redline train` always writes), so 8-10 minutes for 36.
# The sweep starts no new run after STOP_AFTER minutes (default 8), so the script ends within about 8.5
# minutes; seeds are the outer loop, so every configuration has seeds 1 and 2 before any has seed 3.
# Running the same command again resumes: finished runs are skipped, the rest run.
#
# torch.compile is off (the recipe's choice): compiling a 124M model takes 40-60 s, longer than a whole
# run here, and each run is a fresh process that would pay it again (36 × ~50 s ≈ 30 min). Speed
# differences are therefore eager-mode differences, which matters most for FP8 (its casts are unfused).
#
# Writes $OUT/sweeps/ablations (configs/, runs/, results.jsonl, report.md, plots/, results.json/csv,
# dashboard.html) and $OUT/ablations.log. Prints the sweep's progress, a summary table, then one JSON line.
set -uo pipefail
cd "$(dirname "$0")/../.."
CORPUS="${1:-}"
if [ -z "$CORPUS" ] || [ ! -e "$CORPUS" ]; then
    echo "usage: scripts/gpu/ablations.sh CORPUS_DIR   (a shard folder made by redline data prepare; got '${CORPUS}')" >&2
    exit 2
fi
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
OUT="${OUT:-$(mktemp -d)}"
STOP_AFTER="${STOP_AFTER:-8}"
SWEEP="$OUT/sweeps/ablations"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if ! "$PY" -c 'import torch, tyro, rich, yaml, scipy, matplotlib; assert torch.cuda.is_available(), "no CUDA GPU visible"' 2>"$OUT/import_error.txt"; then
    echo "ablations.sh: this Python cannot run the sweep on a GPU: $(tail -n 1 "$OUT/import_error.txt")" >&2
    echo "ablations.sh: needs torch with CUDA, tyro, rich, pyyaml, scipy, matplotlib (scripts/setup.sh report); set PYTHON=" >&2
    exit 2
fi
if ! "$PY" -c 'import sys; from redline.data.prepare import is_prepared; sys.exit(not is_prepared(sys.argv[1]))' "$CORPUS"; then
    echo "ablations.sh: $CORPUS is not a prepared shard folder; every run would tokenize it again." >&2
    echo "ablations.sh: prepare it once: $PY -m redline data prepare --inputs $CORPUS --out DIR, then pass DIR" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || true
echo "files: $OUT"

start=$(date +%s)
"$PY" -m redline sweep ablations --data "$CORPUS" --out "$SWEEP" --stop-after "$STOP_AFTER" --no-report 2>&1 | tee "$OUT/ablations.log"
sweep_status=${PIPESTATUS[0]}
sweep_seconds=$(( $(date +%s) - start ))
"$PY" -m redline report "$SWEEP" > "$OUT/report.log" 2>&1
report_status=$?
tail -n 25 "$OUT/report.log" | grep -v '^{' || true
"$PY" -m redline claims "$SWEEP" > "$OUT/claims.log" 2>&1 || true
grep -v '^{' "$OUT/claims.log" || true

"$PY" - "$SWEEP" "$sweep_status" "$report_status" "$sweep_seconds" <<'EOF'
import json, sys
from redline.experiments.report import build_report

sweep, sweep_status, report_status, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
report = build_report(sweep)
rows = []
print(f"\n{'configuration':<16} {'seeds':>5} {'tokens/s':>10} {'Δ tok/s':>8} {'val bpb':>8} {'Δ bpb':>8} {'p':>6} {'GiB':>6}")
for c in report["cells"]:
    vs = c.get("vs_baseline") or {}
    speed, bpb = vs.get("tokens_per_second"), vs.get("final_val_bpb")
    row = {"variant": c["variant"], "precision": c["precision"], "seeds": c["n_completed"], "runs": c["n_runs"],
           "tokens_per_second": c["tokens_per_second"]["mean"], "mfu": c["mfu"]["mean"],
           "final_val_bpb": c["final_val_bpb"]["mean"], "final_val_bpb_std": c["final_val_bpb"]["std"],
           "peak_memory_gib": c["peak_memory_gib"]["mean"], "params": c["params"]["mean"],
           "speed_ratio": speed and speed["estimate"], "bpb_delta": bpb and bpb["estimate"],
           "bpb_p_value": bpb and bpb["p_value"], "failed": [f["error"] for f in c["failed"]]}
    rows.append(row)
    f = lambda v, s: "—" if v is None else format(v, s)
    print(f"{c['label']:<16} {c['n_completed']:>2}/{c['n_runs']:<2} {f(row['tokens_per_second'], ',.0f'):>10} "
          f"{f(row['speed_ratio'] and (row['speed_ratio'] - 1) * 100, '+.1f'):>8} {f(row['final_val_bpb'], '.4f'):>8} "
          f"{f(row['bpb_delta'], '+.4f'):>8} {f(row['bpb_p_value'], '.3f'):>6} {f(row['peak_memory_gib'], '.1f'):>6}")
runs = report["runs"]
result = {
    "script": "ablations", "sweep_dir": sweep, "sweep_status": sweep_status, "report_status": report_status,
    "sweep_wall_seconds": seconds, "planned": report["planned"], "finished": len(runs),
    "completed": sum(r["status"] == "completed" for r in runs), "failed": sum(r["status"] != "completed" for r in runs),
    "mean_run_wall_seconds": (sum(r.get("wall_time") or 0 for r in runs) / len(runs)) if runs else None,
    "devices": report["devices"], "best": {k: v and {kk: vv for kk, vv in v.items() if kk != "all"} for k, v in report["best"].items()},
    "claims": {row["id"] + (f"@{json.dumps(row['context'])}" if row.get("context") else ""): {
        "verdict": row["verdict"], "ratio": row.get("measured_ratio"), "low": row.get("low"), "high": row.get("high")}
        for row in report["claims"]},
    "cells": rows,
}
print(json.dumps(result, default=str))
EOF
