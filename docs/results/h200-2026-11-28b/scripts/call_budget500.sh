#!/usr/bin/env bash
# H200: the default recipe on the manual-page corpus with a 500-step budget (cool-down over steps 300-500), timed
# to seed 1337's nanogpt final value of call 1 (0.5790)
set -uo pipefail
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
D=$OUT
t0=$(date +%s)
timeout 420 $PY -m redline speedrun --recipes default --target 0.578971 --data .corpus/man --no-plot --out /tmp/speedrun \
    --seed 1337 max_steps=500 tokens_per_step=32768 > $D/speedrun.log 2>&1
echo "speedrun rc=$? $(( $(date +%s) - t0 )) s" | tee -a $D/summary.txt
cp /tmp/speedrun/speedrun.json $D/ 2>/dev/null
