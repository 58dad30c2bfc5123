#!/usr/bin/env bash
# x4: speedrun (nanogpt, default, VARIANTS; 3 seeds) on GPUs 0-2; GPU 3: SIDE work (tests + engine A/B, or import_bench)
set -uo pipefail
mkdir -p .whl && cp .whlmin/*.whl .whl/
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
D=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $D/summary.txt
$PY -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a $D/summary.txt
SR=.exp/sr; mkdir -p $SR
t0=$(date +%s)
( CUDA_VISIBLE_DEVICES=0,1,2 timeout ${LIMIT:-555} $PY -m redline speedrun --recipes nanogpt default ${VARIANTS} --data ${DATA} \
    --no-plot --out $SR --gpus 3 --seeds ${SEEDS:-3} --seed 1337 max_steps=1000 tokens_per_step=32768 > $D/speedrun.log 2>&1
  echo "speedrun rc=$? $(( $(date +%s) - t0 )) s" >> $D/summary.txt ) &
SRPID=$!
export CUDA_VISIBLE_DEVICES=3
if [ -n "${TESTS_K:-}" ]; then
  timeout ${TESTS_LIMIT:-200} $PY -m pytest -v -m gpu -rs -p no:cacheprovider -p no:logging --tb=short tests/test_inference.py -k "$TESTS_K" > $D/tests.txt 2>&1
  echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $D/summary.txt
fi
if [ -n "${IMPORT_MODELS:-}" ]; then
  timeout ${SIDE_LIMIT:-330} $PY scripts/gpu/import_bench.py --models $IMPORT_MODELS --batches 1 64 --out $D > $D/side.txt 2>&1
  echo "import_bench rc=$? $(( $(date +%s) - t0 )) s" >> $D/summary.txt
fi
wait $SRPID
tar -czf $D/sr.tgz --exclude=data -C $SR . 2>/dev/null
tail -n 25 $D/speedrun.log >> $D/summary.txt
