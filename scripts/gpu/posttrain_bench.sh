#!/usr/bin/env bash
# DPO and GRPO speed on one GPU (written for one H100): scripts/gpu/posttrain_bench.py at modern-124m.
#   DPO step vs SFT step of the same batch (16 pairs vs 16 rows of 1024 tokens; target <= 2.2x)
#   GRPO rollout decode tokens/s (engine on the fp32 training weights, sampling) vs bench-infer's batched decode
#   (bf16 copy, greedy), batch 64, 512-token prompts, 256 new tokens (target >= 50%)
# About 3-4 minutes, most of it torch.compile. Prints two short tables, then one JSON line, also written to
# $OUT/posttrain_bench.json (OUT defaults to a new temporary folder). Extra arguments go to posttrain_bench.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
"$PY" scripts/gpu/posttrain_bench.py --out "$OUT/posttrain_bench.json" "$@"
