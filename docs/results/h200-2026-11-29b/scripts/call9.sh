mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
timeout 170 $PY -m pytest -q -p no:cacheprovider tests/test_moe.py tests/test_inference.py tests/test_model.py -k "gpu_compiled and gpt-oss" > $OUT/pytest_gpt_oss.log 2>&1; echo "rc $?" >> $OUT/pytest_gpt_oss.log
