#!/usr/bin/env bash
# H200: the speedrun from raw text on a corpus the recipes were never tuned on (the system's manual pages,
# scripts/man_pages_corpus.py), nanogpt vs default in one call
set -uo pipefail
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
D=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $D/summary.txt
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $D/summary.txt
t0=$(date +%s)
timeout 570 $PY -m redline speedrun --recipes nanogpt ${RECIPES:-default} --data .corpus/man --no-plot --out /tmp/speedrun \
    --seed ${SEED:-1337} max_steps=1000 tokens_per_step=32768 > $D/speedrun.log 2>&1
echo "speedrun rc=$? $(( $(date +%s) - t0 )) s" | tee -a $D/summary.txt
cp /tmp/speedrun/*.json /tmp/sr/*.md $D/ 2>/dev/null; cp /tmp/sr/data/meta.json $D/data_meta.json 2>/dev/null
tail -n 14 $D/speedrun.log >> $D/summary.txt
