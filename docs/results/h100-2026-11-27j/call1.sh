# batch-1 decode of the Qwen3-0.6B shape: the split attention kernel's warps, each run its own process; then
# the decode step's kernels (bench-infer --profile)
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
CK=$($PY docs/results/h100-2026-11-27j/qwen_ckpt.py /tmp/q | tail -n 1)
A=redline.inference.kernels.decode_attention
run() {  # label settings...
  local label=$1; shift
  $PY scripts/gpu/with_settings.py "$@" -- bench-infer --checkpoint $CK --methods compiled --batch-sizes 1 --prompt-lens 512 --max-new-tokens 256 --repeats 3 --json-out $D/k1.jsonl > /tmp/o.txt 2>&1
  echo "$label: $(grep 'cache, compiled' /tmp/o.txt | awk -F'│' '{print $6}')"
}
run base
run warps2 $A.SPLIT_WARPS=2
run warps8 $A.SPLIT_WARPS=8
run base
run warps8-span128 $A.SPLIT_WARPS=8 $A.SPLIT_BYTES=32768
$PY -m redline bench-infer --checkpoint $CK --methods compiled --batch-sizes 1 --prompt-lens 512 --max-new-tokens 256 --repeats 1 --profile $D/trace.json.gz > $D/profile.txt 2>&1
grep -v -i warn $D/profile.txt | tail -n 40 | cut -c1-200
