mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
timeout 120 $PY .exp/diag_oss.py > $OUT/diag.log 2>&1; echo "rc $?" >> $OUT/diag.log
