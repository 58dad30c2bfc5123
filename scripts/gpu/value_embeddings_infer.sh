#!/usr/bin/env bash
# The KV-cache engine on a model with value embeddings (model.value_embeddings), on one GPU (written for one H100).
#
#     scripts/gpu/value_embeddings_infer.sh          # files under $OUT (default: a new temporary folder)
#     VE=3 scripts/gpu/value_embeddings_infer.sh     # tables (default 2)
#
# 1. Correctness: the GPU tests of tests/test_inference_value_embeddings.py (the engine's compiled steps and CUDA
#    graphs, and the server's DecodeBatch, on the portable decode paths a value-embedding model gets), greedy
#    tokens equal to GPT.generate.
# 2. Speed: `redline bench-infer` (batch 1 and 64, 512-token prompts, 256 new tokens, compiled) on modern-124m with
#    random weights, without and with VE value-embedding tables (saved as a checkpoint under $OUT), and the
#    value-embedding model once more with the portable decode paths named (--decode-attention matmul
#    --decode-linear torch: what it gets by default, until the Triton paths mix the tables in).
# Expected: about 3-4 minutes, most of it torch.compile. Files under $OUT: ve_infer.jsonl (bench-infer's JSON line
# per step), ve_infer.log. The last line printed is one JSON object: the tests' outcome and each step's numbers.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
OUT="${OUT:-$(mktemp -d)}"
VE="${VE:-2}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
JSONL="$OUT/ve_infer.jsonl"
LOG="$OUT/ve_infer.log"
: > "$JSONL"
: > "$LOG"

echo "=== GPU tests: tests/test_inference_value_embeddings.py -m gpu ===" | tee -a "$LOG"
"$PY" -m pytest -q -m gpu tests/test_inference_value_embeddings.py 2>&1 | tee -a "$LOG"
TESTS_RC=${PIPESTATUS[0]}

CKPT="$OUT/modern-124m-ve$VE"
"$PY" - "$CKPT" "$VE" <<'EOF' 2>&1 | tee -a "$LOG"
import sys
from dataclasses import replace

import torch

from redline.config import TrainConfig, to_dict
from redline.model import GPT
from redline.presets import get_preset
from redline.tokenizer import load_tokenizer
from redline.training.checkpoint import save_checkpoint

torch.manual_seed(0)
cfg = TrainConfig(model=replace(get_preset("modern-124m"), value_embeddings=int(sys.argv[2])))
tokenizer = load_tokenizer("bytes")
cfg.model = replace(cfg.model, vocab_size=max(cfg.model.vocab_size, tokenizer.vocab_size))
print("saved", save_checkpoint(sys.argv[1], 1, GPT(cfg.model), {}, to_dict(cfg), tokenizer, keep=1))
EOF

COMMON=(--batch-sizes 1 64 --prompt-lens 512 --max-new-tokens 256 --repeats 3 --methods compiled --json-out "$JSONL")
STEPS=("--preset modern-124m" "--checkpoint $CKPT" "--checkpoint $CKPT --decode-attention matmul --decode-linear torch")
for step in "${STEPS[@]}"; do
    echo "=== redline bench-infer $step ===" | tee -a "$LOG"
    # shellcheck disable=SC2086
    "$PY" -m redline bench-infer $step "${COMMON[@]}" 2>&1 | tee -a "$LOG"
done

"$PY" - "$JSONL" "$TESTS_RC" "$VE" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys

steps = []
for line in (json.loads(l) for l in open(sys.argv[1]) if l.strip()):
    eng = line["engine"]
    for r in line["results"]:
        step = {"model": line["model"], "decode_attention": eng.get("decode_attention"),
                "decode_linear": eng.get("decode_linear"), "batch": r["batch"], "status": r.get("status")}
        if r.get("status") == "ok":
            step.update(ttft_ms=round(r["ttft_ms"], 2), decode_tok_s_per_seq=round(r["decode_tok_s_per_seq"]),
                        decode_tok_s_total=round(r["decode_tok_s_total"]), first_call_s=round(r["first_call_s"], 1))
        steps.append(step)
for s in steps:
    print(f"{s['model'][:40]:<40} {s['decode_attention']}/{s['decode_linear']:<7} batch {s['batch']:>3}: "
          f"{s.get('decode_tok_s_per_seq', '-')} tok/s per seq, {s.get('decode_tok_s_total', '-')} total, "
          f"ttft {s.get('ttft_ms', '-')} ms")
print(json.dumps({"script": "value_embeddings_infer.sh", "value_embeddings": int(sys.argv[3]),
                  "gpu_tests_passed": sys.argv[2] == "0", "steps": steps}))
EOF
