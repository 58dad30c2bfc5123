# batch-1 decode of the Qwen3-0.6B shape: the split kernel's span and warps, and its loads before or after the wait
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1
CK=$($PY docs/results/h100-2026-11-27j/qwen_ckpt.py /tmp/q | tail -n 1)
A=redline.inference.kernels.decode_attention
run() {  # label env settings...
  local label=$1; local envs=$2; shift 2
  local t0=$(date +%s)
  env $envs timeout 95 $PY scripts/gpu/with_settings.py "$@" -- bench-infer --checkpoint $CK --methods compiled --batch-sizes 1 --prompt-lens 512 --max-new-tokens 256 --repeats 3 --json-out $D/m2.jsonl > $D/$label.txt 2>&1
  echo "$label: $(grep 'cache, compiled' $D/$label.txt | awk -F'│' '{print $6}') ($(( $(date +%s) - t0 )) s)" | tee -a $D/summary2.txt
}
run base X=0
run warps16 X=0 $A.SPLIT_WIDE_WARPS=16
run s64w8 X=0 $A.SPLIT_BYTES=16384
run s64w16 X=0 $A.SPLIT_BYTES=16384 $A.SPLIT_WIDE_WARPS=16
run s256w8 X=0 $A.SPLIT_BYTES=65536 $A.SPLIT_MAX_SLOTS=256
run s256w16 X=0 $A.SPLIT_BYTES=65536 $A.SPLIT_MAX_SLOTS=256 $A.SPLIT_WIDE_WARPS=16
run late EXP_LATE=1
run base2 X=0
