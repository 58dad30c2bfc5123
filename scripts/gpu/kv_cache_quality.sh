#!/usr/bin/env bash
# What an FP8 KV cache costs in accuracy, on models trained briefly on a real corpus (written for one H100).
#
#     DATA=path/to/shards scripts/gpu/kv_cache_quality.sh     # files under $OUT (default: a new temporary folder)
#     PRESETS="gpt2-124m" STEPS=200 DATA=... scripts/gpu/kv_cache_quality.sh
#
# For each preset (default: gpt2-124m modern-124m): `redline train` for STEPS steps of TOKENS_PER_STEP tokens at
# seq_len 1024 (default 150 × 262,144 ≈ 39M tokens, about a minute and a half on an H100), then
# `redline eval --kv-cache-dtypes auto fp8`: the validation split's sequences scored token by token through the
# inference engine (prefill of the first half, then one compiled, captured decode step per token), once with
# the cache in bf16 and once in FP8, each against the full forward pass of the same bf16 weights: the loss of
# the decoded half and how often the next-token argmax agrees.
# Files under $OUT: kv_cache_quality.jsonl (eval's JSON line per preset), kv_cache_quality.log, runs/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
OUT="${OUT:-$(mktemp -d)}"
: "${DATA:?set DATA to a prepared shard folder (redline data prepare)}"
STEPS="${STEPS:-150}"
TOKENS_PER_STEP="${TOKENS_PER_STEP:-262144}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
JSONL="$OUT/kv_cache_quality.jsonl"
LOG="$OUT/kv_cache_quality.log"
: > "$JSONL"
: > "$LOG"

for preset in ${PRESETS:-gpt2-124m modern-124m}; do
    echo "=== train $preset, $STEPS steps of $TOKENS_PER_STEP tokens ===" | tee -a "$LOG"
    if ! "$PY" -m redline train --preset "$preset" --data.path "$DATA" max_steps="$STEPS" \
            tokens_per_step="$TOKENS_PER_STEP" seq_len=1024 batch_size=32 out_dir="$OUT/runs" run_name="$preset" \
            eval_every=0 sample_tokens=0 tensorboard=False 2>&1 | tail -n 5 | tee -a "$LOG"; then
        echo "kv_cache_quality.sh: training $preset failed" | tee -a "$LOG"
        continue
    fi
    echo "=== eval $preset with the KV cache in bf16 and FP8 ===" | tee -a "$LOG"
    "$PY" -m redline eval --checkpoint "$OUT/runs/$preset" --batches 20 --batch-size 16 \
        --kv-cache-dtypes auto fp8 --kv-batches "${KV_BATCHES:-2}" 2>&1 | tee -a "$LOG" | tail -n 1 >> "$JSONL"
done
cat "$JSONL"
