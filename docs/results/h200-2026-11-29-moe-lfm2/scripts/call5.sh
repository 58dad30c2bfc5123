mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
timeout 150 $PY -m pytest -q -p no:cacheprovider tests/test_short_conv.py tests/test_moe.py -k gpu > $OUT/pytest.log 2>&1
echo "pytest rc $?" >> $OUT/pytest.log
timeout 380 $PY scripts/gpu/import_bench.py --models lfm2 --out $OUT > $OUT/import.log 2>&1
echo "rc $?" >> $OUT/import.log
