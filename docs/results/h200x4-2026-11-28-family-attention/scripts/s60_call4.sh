#!/usr/bin/env bash
set -uo pipefail
mkdir -p .whl && cp .whlmin/*.whl .whl/
. scripts/gpu/env.sh
i=0
for m in olmo2 gemma3 pythia410m stablelm2; do
  ( CUDA_VISIBLE_DEVICES=$i timeout 400 $PY scripts/gpu/import_bench.py --models $m --batches 1 64 --out $OUT/$m > /tmp/ib_$m.txt 2>&1; echo "$m rc=$?" >> /tmp/ib_$m.txt ) &
  i=$((i+1))
done
wait
for m in olmo2 gemma3 pythia410m stablelm2; do grep -E "batch|rc=|Error" /tmp/ib_$m.txt | tail -4; done
