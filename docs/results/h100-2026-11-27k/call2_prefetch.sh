# batch-1 decode: the MLP's weights prefetched into L2 by the split attention kernel while it waits
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1
CK=$($PY docs/results/h100-2026-11-27j/qwen_ckpt.py /tmp/q | tail -n 1)
F=redline.inference.kernels.fused_block
run() {  # label setting args...
  local label=$1 setting=$2; shift 2
  timeout 100 $PY scripts/gpu/with_settings.py $setting -- bench-infer "$@" --methods compiled --batch-sizes 1 --prompt-lens 512 --max-new-tokens 256 --repeats 3 --json-out $D/m2.jsonl > /tmp/o.txt 2>&1
  echo "$label: $(grep 'cache, compiled' /tmp/o.txt | awk -F'│' '{print $6}' | tr -d ' \n')"
  grep -i -E "error|Traceback" /tmp/o.txt | head -3
}
run "qwen base" $F.PREFETCH=0 --checkpoint $CK
run "qwen pf mlp" $F.PREFETCH=1 --checkpoint $CK
run "qwen pf fc" $F.PREFETCH=2 --checkpoint $CK
run "qwen base" $F.PREFETCH=0 --checkpoint $CK
run "qwen pf mlp" $F.PREFETCH=1 --checkpoint $CK
run "modern-124m base" $F.PREFETCH=0 --preset modern-124m
run "modern-124m pf mlp" $F.PREFETCH=1 --preset modern-124m
