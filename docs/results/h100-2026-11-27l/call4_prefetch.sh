# batch 1: the qkv product prefetching the layer's KV cache spans into L2 (EXP_PF=1) against as it is
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1
CK=$($PY docs/results/h100-2026-11-27j/qwen_ckpt.py /tmp/q | tail -n 1)
L=redline.inference.kernels.linear
run() {  # label model env settings...
  local label=$1; local model=$2; local envs=$3; shift 3
  local t0=$(date +%s)
  env $envs timeout 95 $PY scripts/gpu/with_settings.py "$@" -- bench-infer $model --methods compiled --batch-sizes 1 --prompt-lens 512 --max-new-tokens 256 --repeats 3 --json-out $D/m4.jsonl > $D/$label.txt 2>&1
  echo "$label: $(grep 'cache, compiled' $D/$label.txt | awk -F'│' '{print $6}') ($(( $(date +%s) - t0 )) s)" | tee -a $D/summary4.txt
}
Q="--checkpoint $CK"
M="--preset modern-124m"
run q-base "$Q" X=0
run q-pf "$Q" EXP_PF=1
run q-pf32 "$Q" EXP_PF=1 $L.PF_BLOCK=32
run q-base2 "$Q" X=0
run q-pf2 "$Q" EXP_PF=1
run m-base "$M" X=0
run m-pf "$M" EXP_PF=1
tail -n 5 $D/q-pf.txt
