#!/usr/bin/env bash
# Full fine-tuning (AdamW) vs bf16 LoRA vs NF4 QLoRA on one GPU (written for one H100): the 1.5B preset
# (modern-1.5b) at batch 4 × 1024 with activation checkpointing on every block, bf16, eager. Per mode: peak memory
# of the training steps, median step time over 10 timed steps (after 3 untimed), tokens/s. scripts/gpu/lora_bench.py
# says how each number is taken.
#
#     scripts/gpu/lora_bench.sh                      # files under $OUT (default: a new temporary folder)
#     PRESET=modern-774m STEPS=20 scripts/gpu/lora_bench.sh
#     COMPILE=1 scripts/gpu/lora_bench.sh            # torch.compile in all three modes (adds minutes)
#     AC=selective COMPILE=1 scripts/gpu/lora_bench.sh   # every other block checkpointed, in every mode alike
#     NF4_BACKEND=bitsandbytes MODES="lora qlora" scripts/gpu/lora_bench.sh   # QLoRA through bitsandbytes' NF4
#
# Needs, beyond the image: torchao (NF4Tensor, for the QLoRA mode) as a wheel in .whl/, which env.sh installs; a
# wheel for the image's Python and torch (NF4 is pure Python in torchao: its C-extension load warnings are harmless). Without it the
# qlora line carries the one-line error and the other two modes still run. NF4_BACKEND=bitsandbytes needs a
# bitsandbytes wheel in .whl/ too (py3-none-manylinux x86_64: one wheel for every Python, CUDA libraries inside).
# Expected: well under 6 minutes (three processes, each building the model on the GPU and running 13 steps).
# Files under $OUT: lora_bench.jsonl (one line per mode), lora_bench.log. The last line printed is one JSON object
# with the ratios the issue's targets name (qlora_peak_over_full, lora_speed_over_full, qlora_step_over_lora), and
# per mode activations_gib (what a forward leaves for backward) and saved_weight_shaped_gib (0 expected).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
ARGS=(--out "$OUT" --preset "${PRESET:-modern-1.5b}" --batch "${BATCH:-4}" --seq "${SEQ:-1024}" --steps "${STEPS:-10}"
      --nf4-backend "${NF4_BACKEND:-auto}" --ac "${AC:-full}")
[ -n "${MODES:-}" ] && ARGS+=(--modes $MODES)
[ -n "${COMPILE:-}" ] && ARGS+=(--compile)
[ -n "${SCOPE:-}" ] && ARGS+=(--compile-scope "$SCOPE")   # SCOPE=model: COMPILE=1 as one graph, not per block
[ -n "${CUDA_GRAPHS:-}" ] && ARGS+=(--cuda-graphs "$CUDA_GRAPHS")   # on / off in every mode (auto: LoRA, QLoRA)
[ -n "${INDUCTOR:-}" ] && ARGS+=(--inductor $INDUCTOR)   # e.g. INDUCTOR=cpp_wrapper=True
[ -n "${PROFILE:-}" ] && ARGS+=(--profile "$PROFILE")   # PROFILE=3: GPU kernel ms per step by group, 3 steps
"$PY" scripts/gpu/lora_bench.py "${ARGS[@]}" 2>&1 | tee "$OUT/lora_bench.log"
