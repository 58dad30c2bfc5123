mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
timeout 140 $PY -m pytest -q -p no:cacheprovider tests/test_short_conv.py tests/test_moe.py -k gpu > $OUT/pytest.log 2>&1
echo "pytest rc $?" >> $OUT/pytest.log
