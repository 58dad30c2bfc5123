#!/usr/bin/env bash
# DPO settings side by side at 124M on one GPU (issue 23): pretrain modern-124m and SFT it on a task as
# scripts/gpu/posttrain_pipeline.sh does, sample on-policy pairs from the SFT model (`redline pairs`), then run each
# DPO variant from the same SFT checkpoint and score it on the task's test split, next to the SFT model's score.
#
#     scripts/gpu/dpo_grid.sh CORPUS_DIR
#     VARIANTS="lr1e-5|optim.lr=1e-5;apo|optim.lr=2e-5 dpo.loss=apo_zero" scripts/gpu/dpo_grid.sh .corpus/raw
#
# VARIANTS: "NAME|SETTINGS" items separated by ';' (SETTINGS: redline dpo key=value settings, after the common ones:
# batch_size=16, dpo.beta=0.1, dpo.nll_weight=1, 5 warm-up steps, compile=False). DATA=sampled (the default: the
# SFT model's pairs) or task (the task's own pairs) per variant through a "data=task" item in its SETTINGS.
# Scoring: `redline evaluate` greedy exact match on LIMIT (1000) test prompts, eager with large batches (the same for
# every row, SFT included). Choosing a setting by these scores selects on the test split: confirm the chosen one
# with a fresh pipeline run (posttrain_pipeline.sh) before quoting it. About 8-9 minutes on an H100 for 6 variants.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
source scripts/gpu/corpus.sh
corpus_argument "scripts/gpu/dpo_grid.sh CORPUS_DIR" "${1:-}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 REDLINE_CACHE="${REDLINE_CACHE:-$OUT/cache}"
TASK="${TASK:-arithmetic_multistep}"
MAX_NEW="${MAX_NEW:-40}"
LIMIT="${LIMIT:-1000}"
STEPS="${STEPS:-120}"
VARIANTS="${VARIANTS:-lr1e-5|optim.lr=1e-5;lr2e-5|optim.lr=2e-5;lr5e-5|optim.lr=5e-5;apo2e-5|optim.lr=2e-5 dpo.loss=apo_zero;nll3-2e-5|optim.lr=2e-5 dpo.nll_weight=3;task2e-5|optim.lr=2e-5 data=task}"
prepare_corpus "$CORPUS" "$OUT" || exit $?
redline() { "$PY" -m redline "$@"; }
score() {  # run dir -> exact match on the test prompts
    redline evaluate "$1" --tasks "$TASK" --limit "$LIMIT" --max-new-tokens "$MAX_NEW" --batch-size 250 \
        --compile off --cuda-graphs off 2>/dev/null | tail -n 1 | "$PY" -c \
        "import json, sys; print(json.loads(sys.stdin.read())['tasks']['$TASK']['score'])"
}
set -e
redline train preset="${PRESET:-modern-124m}" data.path="$DATA" max_steps="${PRETRAIN_STEPS:-600}" batch_size=32 \
    seq_len=1024 eval_every=200 out_dir="$OUT" run_name=pretrain sample_tokens=0 tensorboard=False 2>&1 | grep -v "^step "
redline sft --from "$OUT/pretrain" --data "task:$TASK" out_dir="$OUT" run_name=sft max_steps=300 eval_every=100 \
    tensorboard=False 2>&1 | grep -v "^step "
redline pairs "$OUT/sft" --task "$TASK" --out "$OUT/pairs.jsonl" --prompts "${PAIR_PROMPTS:-2000}" --samples 8 \
    --max-new-tokens "$MAX_NEW" 2>&1 | tail -n 2
set +e
RESULTS="$OUT/dpo_grid.tsv"
printf "variant\tsettings\texact_match\n" > "$RESULTS"
printf "sft\t-\t%s\n" "$(score "$OUT/sft")" | tee -a "$RESULTS"
IFS=';' read -ra ITEMS <<< "$VARIANTS"
for item in "${ITEMS[@]}"; do
    name="${item%%|*}" settings="${item#*|}" data="$OUT/pairs.jsonl"
    if [[ " $settings " == *" data=task "* ]]; then data="task:$TASK"; settings="${settings/data=task/}"; fi
    # shellcheck disable=SC2086  # settings is a list of key=value items
    if redline dpo --from "$OUT/sft" --data "$data" out_dir="$OUT" run_name="dpo_$name" dpo.max_pairs=0 \
        dpo.beta=0.1 dpo.nll_weight=1.0 batch_size=16 max_steps="$STEPS" optim.warmup_steps=5 eval_every="$STEPS" \
        eval_batches=4 tensorboard=False compile=False $settings > "$OUT/dpo_$name.log" 2>&1; then
        printf "%s\t%s\t%s\n" "$name" "$settings" "$(score "$OUT/dpo_$name")" | tee -a "$RESULTS"
    else
        printf "%s\t%s\tfailed: %s\n" "$name" "$settings" "$(tail -n 1 "$OUT/dpo_$name.log")" | tee -a "$RESULTS"
    fi
    grep "eval step" "$OUT/dpo_$name.log" | tail -n 1
done
column -t -s $'\t' "$RESULTS"
