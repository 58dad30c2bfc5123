#!/usr/bin/env bash
# 2 x H200: the default recipe and variants of it (VARIANTS: recipe files, one change each) timed to nanogpt's final
# value (or TARGET) on prepared data (DATA: the folder `redline speedrun --data RAW` prepares into OUT/data), two runs
# at once, one on each GPU
set -uo pipefail
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
D=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $D/summary.txt
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $D/summary.txt
SR=${SRDIR:-speedruns/variants}
mkdir -p $SR
t0=$(date +%s)
timeout ${LIMIT:-560} $PY -m redline speedrun --recipes ${BASE:-nanogpt default} ${VARIANTS} --data ${DATA:-.prepared/man} --no-plot --out $SR ${TARGET:+--target $TARGET} \
    --gpus 2 --seed ${SEED:-1337} max_steps=1000 tokens_per_step=32768 > $D/speedrun.log 2>&1
echo "speedrun rc=$? $(( $(date +%s) - t0 )) s" | tee -a $D/summary.txt
mkdir -p $D/sr && cp -r $SR/* $D/sr/ 2>/dev/null; rm -rf $D/sr/data
tail -n 20 $D/speedrun.log >> $D/summary.txt
