mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
timeout 150 $PY -m pytest -q -x -p no:cacheprovider tests/test_moe.py -k gpu > $OUT/pytest.log 2>&1
echo "pytest rc $?" >> $OUT/pytest.log
timeout 150 $PY .exp/moe_decode_micro.py > $OUT/micro.log 2>&1
echo "rc $?" >> $OUT/micro.log
