#!/usr/bin/env bash
# Post-training on a CPU in minutes: pretrain the `tiny` preset on the embedded corpus, fine-tune it on the
# arithmetic task (redline sft), and score both on the task's held-out test split (redline evaluate), side by side
# in `redline report`. Deterministic: the same seeds give the same scores (docs/posttraining.md lists them).
#
#   scripts/posttrain_demo.sh                 # writes runs/posttrain-demo/
#   OUT=/tmp/demo PYTHON=.venv/bin/python scripts/posttrain_demo.sh
set -euo pipefail
OUT=${OUT:-runs/posttrain-demo}
PYTHON=${PYTHON:-python}
SFT_STEPS=${SFT_STEPS:-300}
TASKS=${TASKS:-arithmetic,arithmetic_mc}
LIMIT=${LIMIT:-200}
redline() { "$PYTHON" -m redline "$@"; }
start=$(date +%s)

# 1. pretraining: the tiny preset's defaults (360 steps of 16 x 128 tokens)
redline train out_dir="$OUT" run_name=pretrain resume=auto sample_tokens=0 tensorboard=False
# 2. SFT: redline's chat tokens are added, conversations packed best-fit, the loss on the answers only
redline sft --from "$OUT/pretrain" --data task:arithmetic out_dir="$OUT" run_name=sft max_steps="$SFT_STEPS" \
    eval_every=100 tensorboard=False
# 3. both stages on the test split (plain text for the pretrained model, the chat template after SFT)
redline evaluate "$OUT/pretrain" --tasks "$TASKS" --limit "$LIMIT" --max-new-tokens 8
redline evaluate "$OUT/sft" --tasks "$TASKS" --limit "$LIMIT" --max-new-tokens 8
redline report "$OUT" > /dev/null
echo "posttrain demo: done in $(( $(date +%s) - start )) s; scores: $OUT/report.md (Task scores)" >&2
