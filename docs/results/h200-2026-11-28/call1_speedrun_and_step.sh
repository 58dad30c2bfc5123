#!/usr/bin/env bash
# H200: the speedrun from raw text as a user runs it (nanogpt vs default, one call), then gpt2-124m's step against
# the plain compiled GPT-2 step, same call
# .corpus/raw: the shared English corpus's JSONL shards (train-*.jsonl.xz, val.jsonl.xz) copied into the repository, unprepared
set -uo pipefail
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
D=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $D/summary.txt
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $D/summary.txt
t0=$(date +%s)
timeout 400 $PY -m redline speedrun --recipes nanogpt default --data .corpus/raw --no-plot --out $D/sr \
    max_steps=1000 tokens_per_step=32768 > $D/speedrun.log 2>&1
echo "speedrun rc=$? $(( $(date +%s) - t0 )) s" | tee -a $D/summary.txt
cp $D/sr/*.json $D/ 2>/dev/null; tail -n 12 $D/speedrun.log >> $D/summary.txt
for i in 1 2; do
  timeout 90 $PY scripts/gpu/plain_gpt2_baseline.py > $D/plain$i.txt 2>&1; echo "plain$i: $(tail -n 2 $D/plain$i.txt | tr '\n' ' ')" | tee -a $D/summary.txt
  timeout 120 $PY -m redline bench --preset gpt2-124m batch_size=32 seq_len=1024 --steps 20 --warmup 8 --json-out $D/bench.jsonl > $D/bench$i.txt 2>&1
  echo "redline$i: $(grep -i 'tokens/s\|tok/s' $D/bench$i.txt | tail -n 2 | tr '\n' ' ')" | tee -a $D/summary.txt
done
