#!/usr/bin/env bash
set -uo pipefail
mkdir -p .whl && cp .whlmin/*.whl .whl/
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
D=$OUT
( CUDA_VISIBLE_DEVICES=0,1,2 timeout 300 $PY -m redline speedrun --recipes fast --data .prepared/corpus --no-plot --out .exp/srf --gpus 3 --seeds 3 --seed 1337 --target 1.6125 max_steps=1000 tokens_per_step=32768 > $D/speedrun_fast.log 2>&1
  echo "speedrun rc=$?" >> $D/summary.txt ) &
P=$!
CUDA_VISIBLE_DEVICES=3 timeout 330 $PY scripts/gpu/import_bench.py --models olmo2 --batches 1 64 --out $D > $D/side_olmo2.txt 2>&1
echo "import rc=$?" >> $D/summary.txt
wait $P
tar -czf $D/srf.tgz --exclude=data -C .exp/srf . 2>/dev/null
cat $D/summary.txt; tail -14 $D/speedrun_fast.log; grep batch $D/side_olmo2.txt
