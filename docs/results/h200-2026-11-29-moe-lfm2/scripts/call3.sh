mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
timeout 550 $PY scripts/gpu/import_bench.py --models moe1b --out $OUT > $OUT/import.log 2>&1
echo "rc $?" >> $OUT/import.log
