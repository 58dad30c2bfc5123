mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
timeout 170 $PY -m pytest -v -p no:cacheprovider tests/test_inference.py -k "blocks_the_fused_block_refuses and granite-swa" > $OUT/pytest_engine_granite.log 2>&1; echo "rc $?" >> $OUT/pytest_engine_granite.log
timeout 330 $PY -m pytest -v -p no:cacheprovider tests/test_moe.py tests/test_model.py -k "gpu" > $OUT/pytest_moe_model.log 2>&1; echo "rc $?" >> $OUT/pytest_moe_model.log
