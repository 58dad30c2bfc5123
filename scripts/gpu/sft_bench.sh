#!/usr/bin/env bash
# SFT with packing against pretraining on one GPU (modern-124m, 16 x 1024): scripts/gpu/sft_bench.py's four
# modes (pretrain, sft-flex, sft-sdpa, sft-nopack), then the document-masking GPU test. About 3-4 minutes on an
# H100, most of it torch.compile (once per mode). Extra arguments go to sft_bench.py (--preset, --batch-size, ...).
# Prints a table, the test's result, then one JSON line (sft_flex_vs_pretrain; the target is >= 0.90).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
"$PY" -m pytest -q -m gpu tests/test_sft.py -p no:cacheprovider 2>&1 | tail -n 3
"$PY" scripts/gpu/sft_bench.py "$@"
