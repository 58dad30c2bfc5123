# One H100: Muon's GPU tests, then the step timed by redline bench: the tree before (.exp/base) against the new
# .exp/base: the tree before the change, `git archive 1062fab redline | tar -x -C .exp/base`
# Muon at the fast recipe's 32 x 1024 and at 8 x 1024 (where the host sets the pace), and AdamW at 8 x 1024
. scripts/gpu/env.sh
D=$OUT; ROOT=$PWD
export PYTHONUNBUFFERED=1 REDLINE_CACHE=/tmp/cache
timeout 150 $PY -m pytest -q -x -m gpu -p no:cacheprovider tests/test_muon.py 2>&1 | grep -v -i warn | tail -n 25 | cut -c1-400
b() {  # label, tree, settings
  local label=$1 tree=$2; shift 2
  if [ $tree = base ]; then
    (cd $ROOT/.exp/base && PYTHONPATH=$ROOT/.exp/base:${PYTHONPATH#$ROOT:} timeout 150 $PY -m redline bench --recipe fast "$@" --steps 30 --warmup 8 --label $label --json-out $D/bench.jsonl > $D/$label.log 2>&1)
  else
    timeout 150 $PY -m redline bench --recipe fast "$@" --steps 30 --warmup 8 --label $label --json-out $D/bench.jsonl > $D/$label.log 2>&1
  fi
  echo "$label rc $?"
}
b new32 new batch_size=32 seq_len=1024
b base32 base batch_size=32 seq_len=1024
b new8 new batch_size=8 seq_len=1024
b base8 base batch_size=8 seq_len=1024
b adamw8 new batch_size=8 seq_len=1024 optim.name=adamw
$PY -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line); p = r["points"][0]
    print(r["label"], p.get("status"), round(p.get("tokens_per_second", 0)), "step ms", round(p.get("step_ms_median", 0), 2), "min", round(p.get("step_ms_min", 0), 2), "max", round(p.get("step_ms_max", 0), 2))
' $D/bench.jsonl
