# test_inference.py's GPU tests but the decode attention kernel's (run in parts in h100-2026-11-27j)
. scripts/gpu/env.sh
D=$OUT
timeout 560 $PY -m pytest -q -m gpu -p no:cacheprovider -rfE -v tests/test_inference.py -k "not decode_attention" > $D/gpu_inference.txt 2>&1
grep -c PASSED $D/gpu_inference.txt; grep -E "FAILED|ERROR" $D/gpu_inference.txt | head -20 | cut -c1-300; tail -n 3 $D/gpu_inference.txt | cut -c1-300
