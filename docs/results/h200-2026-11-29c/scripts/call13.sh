mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
timeout 150 $PY -m pytest -v -p no:cacheprovider tests/test_moe.py -k "gpu and gpt-oss" > $OUT/pytest_moe_gptoss.log 2>&1; echo "rc $?" >> $OUT/pytest_moe_gptoss.log
mkdir -p /tmp/tf524 && $PY -m pip install -q --no-deps --target /tmp/tf524 .whltf/transformers-*.whl > $OUT/tf.log 2>&1
PYTHONPATH=/tmp/tf524 $PY -c "import transformers; print(transformers.__version__, transformers.Lfm3Config)" >> $OUT/tf.log 2>&1 || {
  $PY -m pip install -q --no-deps --target /tmp/tf524 .whltf/*.whl >> $OUT/tf.log 2>&1
  PYTHONPATH=/tmp/tf524 $PY -c "import transformers; print(transformers.__version__, transformers.Lfm3Config)" >> $OUT/tf.log 2>&1; }
mkdir -p $OUT/lfm3
PYTHONPATH=/tmp/tf524 timeout 360 $PY scripts/gpu/import_bench.py --models lfm3 --out $OUT/lfm3 > $OUT/lfm3/bench.log 2>&1; echo "rc $?" >> $OUT/lfm3/bench.log
