#!/usr/bin/env bash
# x4: decode attention A/B (matmul vs auto=triton with the torch prologue) on real models' shapes; GPU tests on GPU 3
set -uo pipefail
mkdir -p .whl && cp .whlmin/*.whl .whl/
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
D=$OUT
t0=$(date +%s)
ab() {  # GPU, models...
  local gpu=$1; shift
  for m in "$@"; do
    CUDA_VISIBLE_DEVICES=$gpu $PY .exp/s60_shapes.py $m /tmp/ck_$m > $D/make_$m.txt 2>&1
    for a in matmul auto; do
      CUDA_VISIBLE_DEVICES=$gpu timeout 200 $PY -m redline bench-infer --checkpoint /tmp/ck_$m --methods compiled \
        --batch-sizes 1 64 --prompt-lens 512 --max-new-tokens 256 --decode-attention $a --json-out $D/ab_$m.jsonl > $D/ab_${m}_$a.txt 2>&1
      echo "$m $a rc=$? $(( $(date +%s) - t0 )) s" >> $D/summary.txt
    done
  done
}
ab 0 olmo2 & P0=$!
ab 1 gemma3 & P1=$!
ab 2 pythia410m stablelm2 & P2=$!
CUDA_VISIBLE_DEVICES=3 timeout 420 $PY -m pytest -v -m gpu -rs -p no:cacheprovider -p no:logging --tb=short \
  tests/test_inference.py tests/test_inference_value_embeddings.py -k "fused_block_refuses or takes_values or triton_decode_attention or matches_full_forward" > $D/tests.txt 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $D/summary.txt
wait $P0 $P1 $P2
cat $D/summary.txt
tail -3 $D/tests.txt
for f in $D/ab_*_*.txt; do echo "== $f"; grep -E "^│ compiled|decode" $f | head -4; done
