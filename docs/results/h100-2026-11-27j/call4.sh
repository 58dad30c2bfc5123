# the Qwen3-0.6B shape against transformers' generate (static cache) with the split kernel's 128-slot, 8-warp spans
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
timeout 190 $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_inference.py -k "decode_attention and (128 or dtype0 or fp8)" 2>&1 | tail -n 3 | cut -c1-300 > $D/gpu_tests.txt
cat $D/gpu_tests.txt
OUT=$D/ib MODELS=qwen3 timeout 390 bash scripts/gpu/import_bench.sh > $D/import_bench.log 2>&1
cp $D/ib/import_bench.jsonl $D/ 2>/dev/null
grep -v -i warn $D/import_bench.log | tail -n 14 | cut -c1-300
