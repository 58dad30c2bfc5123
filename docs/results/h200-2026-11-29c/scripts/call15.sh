mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
timeout 290 $PY -m pytest -v -p no:cacheprovider tests/test_delta_net.py tests/test_inference.py -k "gpu or (blocks_the_fused_block_refuses and qwen3)" > $OUT/pytest_delta.log 2>&1; echo "rc $?" >> $OUT/pytest_delta.log
timeout 170 $PY .exp/delta_speed.py > $OUT/delta_speed.log 2>&1; echo "rc $?" >> $OUT/delta_speed.log
