#!/usr/bin/env bash
# batch-1 decode: the split attention kernel's q·Kᵀ and p·V row by row in registers (no 16-row tensor-core padding)
# for small groups, against tensor cores; correctness tests first (progressive logs under $OUT)
set -uo pipefail
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
D=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/summary.txt
A=redline.inference.kernels.decode_attention
# 1. the decode-attention tests with the register path for groups up to 4 (FROM=5) and as committed (FROM=2)
for from in 5 2; do
  timeout 150 $PY - $from > $D/tests_from$from.txt 2>&1 <<'PYEOF'
import sys, pytest
import redline.inference.kernels.decode_attention as td
td.SPLIT_MMA_FROM_GROUP = int(sys.argv[1])
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-m", "gpu", "-k", "decode_attention", "tests/test_inference.py"]))
PYEOF
  echo "tests FROM=$from rc=$? $(tail -n 1 $D/tests_from$from.txt)" | tee -a $D/summary.txt
done
CK=$($PY docs/results/h100-2026-11-27j/qwen_ckpt.py CKPT | tail -n 1)
run() {  # label model-args settings...
  local label=$1; local model=$2; shift 2
  local t0=$(date +%s)
  timeout 100 $PY scripts/gpu/with_settings.py "$@" -- bench-infer $model --methods compiled --batch-sizes 1 --prompt-lens 512 --max-new-tokens 256 --repeats 3 --json-out $D/bench_infer.jsonl > $D/$label.txt 2>&1
  echo "$label: $(grep 'cache, compiled' $D/$label.txt | awk -F'│' '{print $6}') ($(( $(date +%s) - t0 )) s)" | tee -a $D/summary.txt
}
run qwen_base "--checkpoint $CK" $A.SPLIT_MMA_FROM_GROUP=2
run qwen_reg "--checkpoint $CK" $A.SPLIT_MMA_FROM_GROUP=3
run qwen_base2 "--checkpoint $CK" $A.SPLIT_MMA_FROM_GROUP=2
run qwen_reg2 "--checkpoint $CK" $A.SPLIT_MMA_FROM_GROUP=3
run m124_base "--preset modern-124m" $A.SPLIT_MMA_FROM_GROUP=2
run m124_reg "--preset modern-124m" $A.SPLIT_MMA_FROM_GROUP=5
