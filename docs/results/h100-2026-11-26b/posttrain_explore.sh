#!/usr/bin/env bash
# Exploration for docs/results/h100-2026-11-26b/NOTES.md (its last version): pretrain modern-124m, SFT, DPO with
# dpo.nll_weight, then four GRPO settings in parallel on the one GPU; run from the repository root with the
# shared corpus in .corpus/raw: `SFT=60 docs/results/h100-2026-11-26b/posttrain_explore.sh`.
set -uo pipefail
source scripts/gpu/env.sh
source scripts/gpu/corpus.sh
OUT=/tmp/ex2; rm -rf $OUT/sft* $OUT/dpo* $OUT/grpo* $OUT/curve.txt; mkdir -p $OUT; export PYTHONUNBUFFERED=1 REDLINE_CACHE=$OUT/cache
prepare_corpus .corpus/raw $OUT || exit 1
R() { $PY -m redline "$@"; }
ev() { R evaluate "$1" --tasks arithmetic --limit 200 --max-new-tokens 8 2>&1 | grep '^{' | $PY -c "import json,sys; r=json.loads(sys.stdin.read()); print('EVAL', r['checkpoint'], r['tasks']['arithmetic']['score'])"; }
t0=$(date +%s)
R train out_dir=$OUT run_name=pretrain resume=auto sample_tokens=0 tensorboard=False preset=modern-124m data.path=$DATA max_steps=600 batch_size=32 seq_len=1024 eval_every=0 2>&1 | tail -1
echo "T pretrain $(( $(date +%s) - t0 ))"
R sft --from $OUT/pretrain --data task:arithmetic out_dir=$OUT run_name=sft max_steps=${SFT:-50} checkpoint_every=10 keep_checkpoints=20 eval_every=0 tensorboard=False 2>&1 | grep -v Warn | tail -1
echo "T sft $(( $(date +%s) - t0 ))"
ev $OUT/sft
pick=$OUT/sft
echo "PICK $pick"
R dpo --from $pick --data task:arithmetic out_dir=$OUT run_name=dpo dpo.max_pairs=640 dpo.beta=0.1 dpo.nll_weight=1.0 batch_size=16 max_steps=30 optim.lr=5e-5 optim.warmup_steps=5 eval_every=0 tensorboard=False > $OUT/dpo.log 2>&1
ev $OUT/dpo
echo "T dpo $(( $(date +%s) - t0 ))"
chain() {  # name lr prompts extra...
  n=$1 lr=$2 p=$3; shift 3
  R grpo --from $OUT/dpo --task arithmetic out_dir=$OUT run_name=grpo$n grpo.prompts_per_step=$p grpo.group_size=8 grpo.max_new_tokens=8 grpo.eval_examples=100 batch_size=$(( p * 4 )) max_steps=${GS:-100} optim.lr=$lr optim.warmup_steps=3 eval_every=25 tensorboard=False "$@" > $OUT/grpo$n.log 2>&1
  ev $OUT/grpo$n | sed "s/^/chain $n /"
  $PY -c "import json; r=[json.loads(l) for l in open('$OUT/grpo$n/metrics.jsonl')]; t=[x for x in r if x.get('kind')=='train']; print('chain $n reward', [round(x.get('reward_mean',-1),2) for x in t[::5]])"
}
chain A 1e-5 8 & chain B 1e-5 16 & chain C 5e-6 8 & chain D 1e-5 8 grpo.kl_coef=0.05 & wait
echo "T chains $(( $(date +%s) - t0 ))"
grep -h "eval step\|Error" $OUT/grpo*.log | tail -20
