# batch-1 decode of the Qwen3-0.6B shape: what each part of the split attention kernel costs (ablations: wrong
# results, right timing), and the spans merged in one load
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
CK=$($PY docs/results/h100-2026-11-27j/qwen_ckpt.py /tmp/q | tail -n 1)
A=redline.inference.kernels.decode_attention
run() {  # label settings...
  local label=$1; shift
  timeout 100 $PY scripts/gpu/with_settings.py "$@" -- bench-infer --checkpoint $CK --methods compiled --batch-sizes 1 --prompt-lens 512 --max-new-tokens 256 --repeats 3 --json-out $D/m1.jsonl > /tmp/o.txt 2>&1
  echo "$label: $(grep 'cache, compiled' /tmp/o.txt | awk -F'│' '{print $6}')"
}
run base
run norm-rope-off $A.ABLATE=1
run no-combine $A.ABLATE=2
run no-count $A.ABLATE=4
run no-math $A.ABLATE=8
run combine-at-once $A.COMBINE_AT_ONCE=True
run base
run no-math-no-count-no-norm $A.ABLATE=13
run combine-at-once $A.COMBINE_AT_ONCE=True
