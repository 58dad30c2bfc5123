#!/usr/bin/env bash
# DPO and GRPO speed on one GPU (written for one H100): scripts/gpu/posttrain_bench.py at modern-124m.
#   DPO step vs SFT step of the same batch (16 pairs vs 16 rows of 1024 tokens; target <= 2.2x)
#   GRPO rollout decode tokens/s (engine on the fp32 training weights, sampling) vs bench-infer's batched decode
#   (bf16 copy, greedy), batch 64, 512-token prompts, 256 new tokens (target >= 50%)
# About 3-4 minutes, most of it torch.compile. Prints two short tables, then one JSON line, also written to
# $OUT/posttrain_bench.json (OUT defaults to a new temporary folder), then with RUN_COMMANDS=1 (about 4 more minutes) 3 steps
# of the real `redline grpo` and `redline dpo` at modern-124m. Extra arguments go to posttrain_bench.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
"$PY" scripts/gpu/posttrain_bench.py --out "$OUT/posttrain_bench.json" "$@"
# 3. the real commands on the GPU (compiled training step and engine on the same weights): a 1-step checkpoint of
# the preset, then 3 steps of redline grpo and of redline dpo from it; their last lines say whether they ran.
if [ "${RUN_COMMANDS:-0}" = 1 ]; then
    R="$OUT/runs"
    timeout 120 "$PY" -m redline train --preset modern-124m max_steps=1 batch_size=4 seq_len=256 eval_every=0 \
        eval_batches=1 sample_tokens=0 tensorboard=False out_dir="$R" run_name=base 2>&1 | tail -n 1
    timeout 150 "$PY" -m redline grpo --from "$R/base" --task arithmetic max_steps=3 batch_size=64 \
        grpo.prompts_per_step=8 grpo.group_size=8 grpo.max_new_tokens=16 grpo.eval_examples=64 eval_every=0 \
        log_every=1 tensorboard=False out_dir="$R" run_name=grpo 2>&1 | grep -E "step|done|error" | tail -n 5
    timeout 120 "$PY" -m redline dpo --from "$R/base" --data task:arithmetic dpo.max_pairs=256 max_steps=3 \
        batch_size=16 eval_every=0 eval_batches=1 log_every=1 tensorboard=False out_dir="$R" run_name=dpo \
        2>&1 | grep -E "step|done|error" | tail -n 5
fi
