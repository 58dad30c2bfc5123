# GPU tests of the decode kernels; batch-1 decode of the Qwen3-0.6B shape under scheduling and tile variants
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1
timeout 170 $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_inference.py -k "decode_attention or gemv or fused_block" 2>&1 | tail -n 4 | tee $D/gpu_tests.txt
CK=$($PY docs/results/h100-2026-11-27j/qwen_ckpt.py /tmp/q | tail -n 1)
A=redline.inference.kernels.decode_attention
L=redline.inference.kernels.linear
run() {  # label settings...
  local label=$1; shift
  $PY scripts/gpu/with_settings.py "$@" -- bench-infer --checkpoint $CK --methods compiled --batch-sizes 1 --prompt-lens 512 --max-new-tokens 256 --repeats 3 --json-out $D/k2.jsonl > /tmp/o.txt 2>&1
  echo "$label: $(grep 'cache, compiled' /tmp/o.txt | awk -F'│' '{print $6}' | tr -d ' \n')"
}
run base
run late $A.SPLIT_EARLY_DEPENDENTS=False
run w8s128 $A.SPLIT_WARPS=8 $A.SPLIT_BYTES=32768
run w8s128-late $A.SPLIT_WARPS=8 $A.SPLIT_BYTES=32768 $A.SPLIT_EARLY_DEPENDENTS=False
run longk2 $L.LONG_K_BLOCK_N=2
run qkvn4 $L.NORM_WIDE_BLOCK_N=4
run base
