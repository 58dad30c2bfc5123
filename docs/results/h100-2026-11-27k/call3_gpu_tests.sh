# the GPU tests, all files but test_inference.py
. scripts/gpu/env.sh
D=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
git log -1 --format=%H > $D/commit.txt 2>/dev/null
timeout 570 $PY -m pytest -q -m gpu -p no:cacheprovider --durations=15 $(ls tests/test_*.py | grep -v test_inference.py) > $D/gpu_tests_rest.txt 2>&1
tail -n 40 $D/gpu_tests_rest.txt | cut -c1-300
