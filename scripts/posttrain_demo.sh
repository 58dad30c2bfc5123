#!/usr/bin/env bash
# Post-training on a CPU in minutes: pretrain the `tiny` preset on the embedded corpus, fine-tune it on the
# arithmetic task's worked replies (redline sft), prefer right answers to corrupted ones (redline dpo), reinforce on
# the task's reward (redline grpo), and score every stage on the task's held-out test split (redline evaluate), side
# by side in `redline report`. Deterministic: the same seeds give the same scores (docs/posttraining.md lists them).
# A stage whose run directory already holds a checkpoint is kept, so a stopped demo continues where it was.
#
#   scripts/posttrain_demo.sh                 # writes runs/posttrain-demo/
#   OUT=/tmp/demo PYTHON=.venv/bin/python scripts/posttrain_demo.sh
#   PRETRAIN_ARGS="preset=modern-124m data.path=DATA max_steps=600" scripts/posttrain_demo.sh   # another model
#
# PRETRAIN_ARGS: settings for the pretraining run (default: the tiny preset on the embedded corpus); STAGE_ARGS:
# settings added to every post-training stage (e.g. compile=True); TASK (arithmetic_worked: arithmetic's problems
# with worked column sums; arithmetic: bare answers; arithmetic_multistep is harder), SFT_STEPS, DPO_STEPS,
# GRPO_STEPS, TASKS (evaluated: TASK and TASK_mc), LIMIT; MAX_NEW, the tokens a reply may take in GRPO's rollouts
# and in evaluation (32 for arithmetic_worked and 40 for arithmetic_multistep, whose replies are worked solutions,
# else 8);
# GRPO_LR: GRPO's learning rate (5e-5, for the tiny preset's SFT peak of 3e-3; `default`: the command's, the SFT
# peak / 200). SFT_ARGS, DPO_ARGS, GRPO_ARGS: settings for one stage, after the demo's own (the last of a key wins).
# DPO_PAIRS: task (the task's pairs: the reference reply chosen, a corrupted one rejected) or sampled (`redline
# pairs`: the SFT model's own replies, PAIR_SAMPLES (8) to each of PAIR_PROMPTS (2000) training prompts, a right one
# chosen and a wrong one rejected).
# scripts/gpu/posttrain_pipeline.sh runs it at 124M on a GPU.
set -euo pipefail
OUT=${OUT:-runs/posttrain-demo}
PYTHON=${PYTHON:-python}
[ "$PYTHON" = python ] && [ -x .venv/bin/python ] && PYTHON=.venv/bin/python  # the setup script's environment
SFT_STEPS=${SFT_STEPS:-300}
DPO_STEPS=${DPO_STEPS:-40}
GRPO_STEPS=${GRPO_STEPS:-60}
GRPO_LR=${GRPO_LR:-5e-5}
TASK=${TASK:-arithmetic_worked}
case "$TASK" in  # room for a worked reply and its end of turn (arithmetic_worked: 27 tokens with tiny's)
    arithmetic_multistep) MAX_NEW=${MAX_NEW:-40} ;;
    arithmetic_worked) MAX_NEW=${MAX_NEW:-32} ;;
    *) MAX_NEW=${MAX_NEW:-8} ;;
esac
TASKS=${TASKS:-$TASK,${TASK}_mc}
LIMIT=${LIMIT:-1000}
PRETRAIN_ARGS=${PRETRAIN_ARGS:-}
STAGE_ARGS=${STAGE_ARGS:-}
SFT_ARGS=${SFT_ARGS:-}
DPO_ARGS=${DPO_ARGS:-}
GRPO_ARGS=${GRPO_ARGS:-}
DPO_PAIRS=${DPO_PAIRS:-task}
redline() { "$PYTHON" -m redline "$@"; }
done_already() { compgen -G "$OUT/$1/checkpoints/step_*" > /dev/null; }
start=$(date +%s)

# 1. pretraining: the tiny preset's defaults (360 steps of 16 x 128 tokens)
# shellcheck disable=SC2086  # PRETRAIN_ARGS and STAGE_ARGS are lists of KEY=VALUE settings
redline train out_dir="$OUT" run_name=pretrain resume=auto sample_tokens=0 tensorboard=False $PRETRAIN_ARGS
# 2. SFT: redline's chat tokens are added, conversations packed best-fit, the loss on the answers only
done_already sft || redline sft --from "$OUT/pretrain" --data "task:$TASK" out_dir="$OUT" run_name=sft \
    max_steps="$SFT_STEPS" eval_every=100 tensorboard=False $STAGE_ARGS $SFT_ARGS
# 3. DPO: the task's pairs (the right answer chosen, a near miss rejected) or the SFT model's own (DPO_PAIRS); the
#    SFT model is the reference; with the chosen answer's NLL added (RPO), as plain DPO lowered greedy exact match
#    here (docs/posttraining.md)
PAIRS="task:$TASK"
case "$DPO_PAIRS" in
    task) ;;
    sampled)
        PAIRS="$OUT/pairs.jsonl"
        done_already dpo || [ -f "$PAIRS" ] || redline pairs "$OUT/sft" --task "$TASK" --out "$PAIRS" \
            --prompts "${PAIR_PROMPTS:-2000}" --samples "${PAIR_SAMPLES:-8}" --max-new-tokens "$MAX_NEW" ;;
    *) echo "posttrain_demo.sh: DPO_PAIRS=$DPO_PAIRS; give task or sampled" >&2; exit 2 ;;
esac
done_already dpo || redline dpo --from "$OUT/sft" --data "$PAIRS" out_dir="$OUT" run_name=dpo \
    dpo.max_pairs=640 dpo.beta=0.1 dpo.nll_weight=1.0 batch_size=16 max_steps="$DPO_STEPS" optim.warmup_steps=5 \
    eval_every=20 eval_batches=4 tensorboard=False $STAGE_ARGS $DPO_ARGS
# 4. GRPO: 8 prompts x 8 samples a step from the weights being trained, rewarded by exact match, with MaxRL's
#    advantages (r - mean) / mean. DPO takes the command's default learning rate (the SFT run's peak / 100); GRPO
#    takes GRPO_LR, as the default (peak / 200) and group-scaled advantages left greedy exact match within the error
#    (docs/posttraining.md)
GRPO_LR_ARG=(); [ "$GRPO_LR" = default ] || GRPO_LR_ARG=(optim.lr="$GRPO_LR")
done_already grpo || redline grpo --from "$OUT/dpo" --task "$TASK" out_dir="$OUT" run_name=grpo \
    grpo.prompts_per_step=8 grpo.group_size=8 grpo.scale_rewards=mean grpo.max_new_tokens=$MAX_NEW \
    grpo.eval_examples=100 batch_size=32 "${GRPO_LR_ARG[@]}" max_steps="$GRPO_STEPS" optim.warmup_steps=3 \
    eval_every=10 tensorboard=False $STAGE_ARGS $GRPO_ARGS
# 5. every stage on the test split (plain text for the pretrained model, the chat template after)
for stage in pretrain sft dpo grpo; do
    redline evaluate "$OUT/$stage" --tasks "$TASKS" --limit "$LIMIT" --max-new-tokens "$MAX_NEW"
done
redline report "$OUT" > /dev/null
echo "posttrain demo: done in $(( $(date +%s) - start )) s; scores: $OUT/report.md (Task scores)" >&2
