# batch-1 decode of the Qwen3-0.6B shape: where the split attention kernel's ~10 us a layer goes
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
CK=$($PY docs/results/h100-2026-11-27j/qwen_ckpt.py /tmp/q | tail -n 1)
A=redline.inference.kernels.decode_attention
run() {  # label env settings...
  local label=$1; local envs=$2; shift 2
  local t0=$(date +%s)
  env $envs timeout 95 $PY scripts/gpu/with_settings.py "$@" -- bench-infer --checkpoint $CK --methods compiled --batch-sizes 1 --prompt-lens 512 --max-new-tokens 256 --repeats 3 --json-out $D/m1.jsonl > $D/$label.txt 2>&1
  echo "$label: $(grep 'cache, compiled' $D/$label.txt | awk -F'│' '{print $6}') ($(( $(date +%s) - t0 )) s)" | tee -a $D/summary.txt
}
run base X=0
run noattn EXP_NOATTN=1
run empty EXP_EMPTY=1
run empty1span EXP_EMPTY=2
run nopdl EXP_NOPDL=1
run warps4 X=0 $A.SPLIT_WIDE_WARPS=4
run slots64 X=0 $A.SPLIT_MAX_SLOTS=64
run base2 X=0
