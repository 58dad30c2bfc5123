#!/bin/bash
# seed 3 of the levers sweep, on the training code of commit f41385b (that of seeds 1 and 2)
nvidia-smi -L | tee "$OUT/gpus.txt"
[ "$(nvidia-smi -L | grep -c H100)" = 4 ] || { echo "not four H100s: stop"; exit 3; }
cd .old
D=$(cd ../.prepared/corpus && pwd)
. scripts/gpu/env.sh
$PY carry_records.py "$D" /tmp/sw/levers || exit 1
STOP_AFTER=8 scripts/gpu/sweep.sh levers "$D" /tmp/sw/levers
