# the compiled FP8 head's GPU test after the tests that ran before it in t1 (it failed there, passed alone)
. scripts/gpu/env.sh
D=$OUT
timeout 500 $PY -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_doctor.py tests/test_fit.py tests/test_float8.py tests/test_float8_head.py > $D/fp8_seq.txt 2>&1
grep -v "warn" $D/fp8_seq.txt | grep -E "^E |Error|assert|passed|failed|FAILED" | head -40 | cut -c1-400
