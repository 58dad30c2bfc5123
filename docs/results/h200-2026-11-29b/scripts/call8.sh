mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
mkdir -p $OUT/nanochat $OUT/olmo1b
timeout 330 $PY scripts/gpu/import_bench.py --models nanochat --out $OUT/nanochat > $OUT/nanochat/bench.log 2>&1; echo "rc $? at $(date +%s)" >> $OUT/nanochat/bench.log
timeout 230 $PY scripts/gpu/import_bench.py --models olmo1b --out $OUT/olmo1b > $OUT/olmo1b/bench.log 2>&1; echo "rc $?" >> $OUT/olmo1b/bench.log
