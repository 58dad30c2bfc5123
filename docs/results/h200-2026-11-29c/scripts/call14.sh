mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
# transformers 5.24 (Lfm3Config), installed in call13 into /tmp/tf524 from a carried wheel, before the image's 5.17
mkdir -p $OUT/lfm3
PYTHONPATH=/tmp/tf524:$PYTHONPATH timeout 430 $PY scripts/gpu/import_bench.py --models lfm3 --out $OUT/lfm3 > $OUT/lfm3/bench.log 2>&1; echo "rc $?" >> $OUT/lfm3/bench.log
