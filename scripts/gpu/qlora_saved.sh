#!/usr/bin/env bash
# What QLoRA keeps for backward on one GPU: torchao's linear_nf4 vs redline's opaque NF4 op, eager vs compiled, on
# 4 blocks of modern-1.5b at batch 4 × 1024 (scripts/gpu/qlora_saved.py says how each number is taken), with
# activation checkpointing on every block and then off.
#
#     scripts/gpu/qlora_saved.sh                     # files under $OUT (default: a new temporary folder)
#
# Needs torchao (env.sh installs the wheel in .whl/). Expected: a few minutes (8 cases, 4 of them compile).
# Files under $OUT: qlora_saved.log. Per checkpointing mode, four lines (impl × eager/compiled) and a JSON line.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for AC in full none; do
    "$PY" scripts/gpu/qlora_saved.py --preset "${PRESET:-modern-1.5b}" --layers "${LAYERS:-4}" --checkpointing "$AC"
done 2>&1 | tee "$OUT/qlora_saved.log"
