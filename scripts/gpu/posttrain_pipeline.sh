#!/usr/bin/env bash
# Post-training's whole pipeline at 124M on one GPU (issue 23): pretrain modern-124m on a corpus, then
# scripts/posttrain_demo.sh's stages on a task (redline sft, dpo, grpo) and `redline evaluate` after each, side by
# side in `redline report`. TASK=arithmetic_multistep (default: two steps on two-digit numbers, trained on worked
# solutions); TASK=arithmetic is learned whole by SFT at 124M (0.99 exact match), which leaves the later stages
# nothing to show.
#
#     scripts/gpu/posttrain_pipeline.sh CORPUS_DIR            # the shared corpus as raw .jsonl.xz, or prepared shards
#     PRETRAIN_STEPS=1000 OUT=/tmp/pipe scripts/gpu/posttrain_pipeline.sh .corpus/raw
#
# CORPUS_DIR as scripts/gpu/speedrun.sh takes it (scripts/gpu/corpus.sh: raw text is prepared once into
# $OUT/corpus with a 32,768-token BPE). Pretraining: PRESET (modern-124m) for PRETRAIN_STEPS (600) steps of
# BATCH x SEQ (32 x 1024) tokens; SFT and DPO step counts as the demo's (SFT_STEPS, DPO_STEPS). The later stages
# take a 124M model's learning rates, not the tiny CPU model's: DPO at 1e-5 (the demo's 2e-4 took exact match from
# 0.51 to 0.10, and 2e-5 to 0.45), GRPO 60 steps of 16 prompts x 16 samples at 5e-6 (DPO_ARGS, GRPO_ARGS and
# GRPO_STEPS replace them; docs/posttraining.md has the runs). About 8-9 minutes on an H100, compilation
# included. Prints the demo's log, then the report's task-score table: each stage's exact-match and
# log-likelihood scores on the task's held-out test split, next to chance.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
source scripts/gpu/corpus.sh
corpus_argument "scripts/gpu/posttrain_pipeline.sh CORPUS_DIR" "${1:-}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 REDLINE_CACHE="${REDLINE_CACHE:-$OUT/cache}"
# DPO runs eager: a 40-step run would spend most of its time compiling (each new pair length compiles again)
export TASK="${TASK:-arithmetic_multistep}" GRPO_STEPS="${GRPO_STEPS:-60}" DPO_ARGS="${DPO_ARGS:-optim.lr=1e-5 compile=False}"
export GRPO_ARGS="${GRPO_ARGS:-optim.lr=5e-6 optim.warmup_steps=6 grpo.prompts_per_step=16 grpo.group_size=16 batch_size=64 grpo.scale_rewards=group}"
# pretraining as docs/posttraining.md's GPU figures were measured: AdamW, cosine, untied, no warm-up of the rows
# (the modern presets now default to Muon and warmup-stable-decay; PRETRAIN_EXTRA="" trains with those)
PRETRAIN_EXTRA="${PRETRAIN_EXTRA-optim.name=adamw optim.schedule=cosine optim.min_lr_ratio=0.1 optim.warmup_steps=50 model.tie_embeddings=false seq_ramp_steps=0}"
prepare_corpus "$CORPUS" "$OUT" || exit $?
PRETRAIN_ARGS="preset=${PRESET:-modern-124m} data.path=$DATA max_steps=${PRETRAIN_STEPS:-600} batch_size=${BATCH:-32} seq_len=${SEQ:-1024} eval_every=200 $PRETRAIN_EXTRA" \
    OUT="$OUT/pipeline" PYTHON="$PY" scripts/posttrain_demo.sh 2>&1 | tee "$OUT/pipeline.log"
status=${PIPESTATUS[0]}
[ -f "$OUT/pipeline/report.md" ] && awk '/^## Task scores/ {p = 1; print; next} /^## / {p = 0} p' "$OUT/pipeline/report.md"
exit "$status"
