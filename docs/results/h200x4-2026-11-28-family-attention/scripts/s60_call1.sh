#!/usr/bin/env bash
# x4: modern-350m rates speedrun (default vs table+gains at 10x; 3 seeds) on GPUs 0-2; GPU 3: phi/opt GPU tests, OLMo-2-1B import_bench
set -uo pipefail
mkdir -p .whl && cp .whlmin/*.whl .whl/
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
D=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $D/summary.txt
$PY -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a $D/summary.txt
SR=.exp/sr350; mkdir -p $SR
t0=$(date +%s)
( CUDA_VISIBLE_DEVICES=0,1,2 timeout ${LIMIT:-560} $PY -m redline speedrun --recipes .exp/r350/m350-default.toml .exp/r350/m350-rates10x.toml --data .prepared/corpus \
    --no-plot --out $SR --gpus 3 --seeds 3 --seed 1337 max_steps=${STEPS:-800} tokens_per_step=32768 > $D/speedrun.log 2>&1
  echo "speedrun rc=$? $(( $(date +%s) - t0 )) s" >> $D/summary.txt ) &
SRPID=$!
export CUDA_VISIBLE_DEVICES=3
timeout 200 $PY -m pytest -v -m gpu -rs -p no:cacheprovider -p no:logging --tb=short tests/test_inference.py -k "refuse" > $D/tests.txt 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $D/summary.txt
timeout 330 $PY scripts/gpu/import_bench.py --models olmo2 --batches 1 64 --out $D > $D/side.txt 2>&1
echo "import_bench rc=$? $(( $(date +%s) - t0 )) s" >> $D/summary.txt
wait $SRPID
tar -czf $D/sr.tgz --exclude=data -C $SR . 2>/dev/null
tail -n 25 $D/speedrun.log >> $D/summary.txt
cat $D/summary.txt; tail -5 $D/tests.txt
