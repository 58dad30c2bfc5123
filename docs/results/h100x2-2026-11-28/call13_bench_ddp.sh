# 2 GPUs, DDP, modern-124m 16 x 1024 a GPU, redline bench --gpus 2 (random tokens, 30 steps): the tree before
# .exp/base: the tree before the change, `git archive 1062fab redline | tar -x -C .exp/base`
# (.exp/base) against the committed Muon, and AdamW; one machine
. scripts/gpu/env.sh
D=$OUT; ROOT=$PWD
export PYTHONUNBUFFERED=1 REDLINE_CACHE=/tmp/cache
A="--preset modern-124m batch_size=16 seq_len=1024 seq_ramp_steps=0 --gpus 2 --steps 30 --warmup 8"
b() {
  local label=$1 tree=$2; shift 2
  if [ $tree = base ]; then
    (cd $ROOT/.exp/base && PYTHONPATH=$ROOT/.exp/base:${PYTHONPATH#$ROOT:} timeout 130 $PY -m redline bench $A "$@" --label $label --json-out $D/bench.jsonl > $D/$label.log 2>&1)
  else
    timeout 130 $PY -m redline bench $A "$@" --label $label --json-out $D/bench.jsonl > $D/$label.log 2>&1
  fi
  echo "$label rc $?"
}
b new new
b base base
b adamw new optim.name=adamw
$PY -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    for p in r["points"]:
        c = p.get("communication") or {}
        print(r["label"], p.get("world_size"), p.get("status"), round(p.get("tokens_per_second", 0)), "step ms", round(p.get("step_ms_median", 0), 2), "min", round(p.get("step_ms_min", 0), 2), "max", round(p.get("step_ms_max", 0), 2), "comm", c.get("share"), c.get("exposed_share"))
' $D/bench.jsonl
