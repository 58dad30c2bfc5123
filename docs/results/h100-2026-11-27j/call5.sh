# the Qwen3-0.6B shape at batch 1 against transformers' generate (static cache), a second call
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
timeout 420 $PY scripts/gpu/import_bench.py --out $D/ib --models qwen3 --batches 1 > $D/import_bench.log 2>&1
grep -E "^qwen3|import_bench" $D/import_bench.log | cut -c1-400
