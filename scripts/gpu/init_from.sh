#!/usr/bin/env bash
# `redline train --init-from` on one GPU (written for one H100), and the training-speed cost of masking the padded
# vocabulary out of the loss. scripts/gpu/init_from.py says how each number is taken.
#
#     scripts/gpu/init_from.sh                          # files under $OUT (default: a new temporary folder)
#     GGUF=/path/SmolLM2-135M-Instruct.Q4_1.gguf scripts/gpu/init_from.sh
#     STEPS=200 scripts/gpu/init_from.sh
#
# The model: SmolLM2-135M-Instruct's Q4_1 GGUF, found as scripts/gpu/import_bench.sh finds it (GGUF=, or .models/
# with the file or its .part-* pieces); without it only the mask-cost benchmark runs.
# Expected on one H100: about 5-8 minutes (4 `redline bench` runs of gpt2-124m, then import, eval, 100 + 10
# compiled training steps, two exports). Expected numbers: tokens/s of vocab 50257 within ~2% of 50304 at each CE
# setting; first_train_loss near import_eval_loss (and far below random_init_loss = 10.8); last_train_loss below
# first_train_loss; import_eval_loss (bf16) within ~0.02 of import_hf_loss_fp32; export_max_abs_logit_diff small
# (fp32 on both sides: < 1e-3).
# Files under $OUT: init_from.jsonl, init_from.log and one .log per command. The last line printed is one JSON object.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/gpu/smollm2_gguf.sh
ARGS=(--out "$OUT" --steps "${STEPS:-100}")
[ -n "$GGUF" ] && ARGS+=(--model "$GGUF")
[ -z "$GGUF" ] && echo "init_from.sh: no SmolLM2 GGUF (GGUF= or .models/): only the mask-cost benchmark runs" >&2
"$PY" scripts/gpu/init_from.py "${ARGS[@]}" 2>&1 | tee "$OUT/init_from.log"
