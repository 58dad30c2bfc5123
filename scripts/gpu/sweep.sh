#!/usr/bin/env bash
# A built-in sweep recipe on every GPU of one machine (one run per GPU at a time), then its report and the verdicts
# of `redline claims`.
#
#     scripts/gpu/sweep.sh RECIPE CORPUS [SWEEP_DIR]     # e.g. quality ../shared/corpus
#     GPUS=2 STOP_AFTER=8 scripts/gpu/sweep.sh levers CORPUS runs/levers
#     RESUME=old/levers_results.jsonl scripts/gpu/sweep.sh levers CORPUS   # go on from an earlier call's records
#
# CORPUS: prepared shards (`redline data prepare`) or the raw corpus (.jsonl[.xz] files, val* the validation
# split), prepared as scripts/gpu/corpus.sh does (a 32768-token BPE: the speedrun's data). SWEEP_DIR (default
# ${TMPDIR:-/tmp}/redline-sweeps/NAME, NAME the recipe's name or its file's stem) may hold the same sweep from an
# earlier call: finished runs are kept, the rest run (resumable). RESUME: an earlier call's NAME_results.jsonl,
# copied into a SWEEP_DIR that has no records yet, so that its runs count as finished (a fresh machine keeps no
# files between calls). GPUS: runs at once (0, the default: every visible GPU). STOP_AFTER: minutes after which no
# new run starts (0: no limit), so that a call with a time limit ends with its report.
# Files: SWEEP_DIR (results.jsonl, report.md, runs/*/train.log, ...), and in $OUT a short list, for a remote
# runner that copies back a few files only: sweep.log, gpus.txt, NAME_results.jsonl (every run's record: the file
# RESUME takes), NAME_report.md, NAME_claims.txt and NAME_sweep.tgz (the sweep directory without checkpoints).
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
NAME="$(basename "$RECIPE")"
NAME="${NAME%.toml}"
NAME="${NAME%.yaml}"
SWEEP_DIR="${3:-${TMPDIR:-/tmp}/redline-sweeps/$NAME}"
mkdir -p "$OUT" "$SWEEP_DIR"
if [ -n "${RESUME:-}" ] && [ ! -s "$SWEEP_DIR/results.jsonl" ]; then
    cp "$RESUME" "$SWEEP_DIR/results.jsonl" || exit 1
fi
export PYTHONUNBUFFERED=1
prepare_corpus "$CORPUS" "$OUT" || exit 1
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null | tee "$OUT/gpus.txt"
"$PY" -m redline sweep "$RECIPE" --data "$DATA" --out "$SWEEP_DIR" --gpus "${GPUS:-0}" \
    --stop-after "${STOP_AFTER:-0}" 2>&1 | tee "$OUT/sweep.log" | grep -v '^{'
status=${PIPESTATUS[0]}
"$PY" -m redline claims "$SWEEP_DIR" > "$SWEEP_DIR/claims.txt" 2>&1 && cat "$SWEEP_DIR/claims.txt"
for f in results.jsonl report.md claims.txt; do
    [ -f "$SWEEP_DIR/$f" ] && cp "$SWEEP_DIR/$f" "$OUT/${NAME}_$f"
done
tar -czf "$OUT/${NAME}_sweep.tgz" --exclude='checkpoints' -C "$(dirname "$SWEEP_DIR")" "$(basename "$SWEEP_DIR")"
grep '^{' "$OUT/sweep.log" | tail -n 1
exit "$status"
