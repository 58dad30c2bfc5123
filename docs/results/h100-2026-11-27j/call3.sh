# GPU tests of the decode kernels (the split kernel's new spans and warps); the long-K product's rows per program
# at head_dim-64 models, each run its own process
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
git log -1 --format=%H > $D/commit.txt 2>/dev/null
timeout 300 $PY -m pytest -q -x -m gpu -p no:cacheprovider tests/test_inference.py -k "decode_attention or gemv or fused_block" 2>&1 | tail -n 6 > $D/gpu_tests.txt
tail -n 3 $D/gpu_tests.txt | cut -c1-300
L=redline.inference.kernels.linear
run() {  # label setting bench-infer-args...
  local label=$1 setting=$2; shift 2
  $PY scripts/gpu/with_settings.py $setting -- bench-infer "$@" --methods compiled --batch-sizes 1 --prompt-lens 512 --max-new-tokens 256 --repeats 3 --json-out $D/v1.jsonl > /tmp/o.txt 2>&1
  echo "$label: $(grep 'cache, compiled' /tmp/o.txt | awk -F'│' '{print $6}' | tr -d ' \n')"
}
for p in modern-124m gpt2-124m; do
  run "$p longk1" $L.LONG_K_BLOCK_N=1 --preset $p
  run "$p longk2" $L.LONG_K_BLOCK_N=2 --preset $p
done
