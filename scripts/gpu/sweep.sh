#!/usr/bin/env bash
# A built-in sweep recipe on every GPU of one machine (one run per GPU at a time), then its report and the verdicts
# of `redline claims`.
#
#     scripts/gpu/sweep.sh RECIPE CORPUS [SWEEP_DIR]     # e.g. quality ../shared/corpus
#     GPUS=2 STOP_AFTER=8 scripts/gpu/sweep.sh levers CORPUS runs/levers
#
# CORPUS: prepared shards (`redline data prepare`) or the raw corpus (.jsonl[.xz] files, val* the validation
# split), prepared as scripts/gpu/corpus.sh does (a 32768-token BPE: the speedrun's data). SWEEP_DIR (default
# $OUT/RECIPE) may hold the same sweep from an earlier call: finished runs are kept, the rest run (resumable).
# GPUS: runs at once (0, the default: every visible GPU). STOP_AFTER: minutes after which no new run starts (0: no
# limit), so that a call with a time limit ends with its report; call again with the same SWEEP_DIR to go on.
# Files: SWEEP_DIR (results.jsonl, report.md, runs/*/train.log, ...), SWEEP_DIR/claims.txt, $OUT/sweep.log.
# The last line printed is the sweep's JSON summary.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
. scripts/gpu/corpus.sh
RECIPE="${1:-}"
if [ -z "$RECIPE" ]; then
    echo "usage: scripts/gpu/sweep.sh RECIPE CORPUS [SWEEP_DIR]   (RECIPE: a built-in recipe name or a .toml file)" >&2
    exit 2
fi
corpus_argument "scripts/gpu/sweep.sh RECIPE CORPUS [SWEEP_DIR]" "${2:-}"
OUT="${OUT:-$(mktemp -d)}"
SWEEP_DIR="${3:-$OUT/$RECIPE}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
prepare_corpus "$CORPUS" "$OUT" || exit 1
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null | tee "$OUT/gpus.txt"
"$PY" -m redline sweep "$RECIPE" --data "$DATA" --out "$SWEEP_DIR" --gpus "${GPUS:-0}" \
    --stop-after "${STOP_AFTER:-0}" 2>&1 | tee "$OUT/sweep.log" | grep -v '^{'
status=${PIPESTATUS[0]}
"$PY" -m redline claims "$SWEEP_DIR" > "$SWEEP_DIR/claims.txt" 2>&1 && cat "$SWEEP_DIR/claims.txt"
grep '^{' "$OUT/sweep.log" | tail -n 1
exit "$status"
