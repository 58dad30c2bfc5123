#!/usr/bin/env bash
set -uo pipefail
mkdir -p .whl && cp .whlmin/*.whl .whl/
. scripts/gpu/env.sh
run() { CUDA_VISIBLE_DEVICES=$1 timeout 330 $PY -m pytest -q -m gpu -rs -p no:cacheprovider -p no:logging --tb=short $2 -k "$3" > /tmp/t$1.txt 2>&1; echo "rc=$?" >> /tmp/t$1.txt; }
run 0 tests/test_inference.py "fused_block_refuses and (olmo2 or gemma3)" &
run 1 tests/test_inference.py "fused_block_refuses and (neox or phi or opt)" &
run 2 tests/test_inference_value_embeddings.py "takes_values or cuda" &
run 3 tests/test_inference.py "triton_decode_attention or matches_full_forward" &
wait
for i in 0 1 2 3; do echo "== GPU $i"; grep -E "FAILED|Error|passed|failed|rc=" /tmp/t$i.txt | tail -12; done
