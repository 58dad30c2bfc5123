#!/usr/bin/env bash
# lm-evaluation-harness through `redline serve` against lm-evaluation-harness on transformers, same model, same task:
# the harness's own OpenAI-completions client (token ids, echo, logprobs: its loglikelihood requests) on the server,
# its Hugging Face backend on the checkpoint exported with `redline export`; then each choice's loglikelihood from
# both, compared.
#
#     scripts/lm_eval_parity.sh CKPT [TASK_DIR TASK]
#     LM_EVAL=/path/to/venv/bin/lm_eval scripts/lm_eval_parity.sh runs/NAME
#
# CKPT: any checkpoint `redline serve` takes (an imported model too). TASK_DIR/TASK: an lm-eval task (YAML) to run;
# by default a tiny multiple-choice task written here (8 questions, local JSONL: no download). lm-eval is not a
# redline dependency (it pins its own): install it in a venv of its own, `pip install "lm-eval[api]" transformers
# accelerate torch`, and point LM_EVAL at its lm_eval. Prints both tables, then one JSON line: the choices compared
# and the largest loglikelihood difference.
set -euo pipefail
CKPT="${1:?usage: scripts/lm_eval_parity.sh CKPT [TASK_DIR TASK]}"
LM_EVAL="${LM_EVAL:-lm_eval}"
PY="${PYTHON:-python}"
PORT="${PORT:-8431}"
OUT="${OUT:-$(mktemp -d)}"
TASKS="${2:-$OUT/tasks}"
TASK="${3:-tinymc}"
command -v "$LM_EVAL" >/dev/null || { echo "lm_eval_parity.sh: no lm_eval ($LM_EVAL); set LM_EVAL (see the header)" >&2; exit 2; }
"$PY" -m redline export "$CKPT" --out "$OUT/hf" | tail -n 1
if [ -z "${2:-}" ]; then
    mkdir -p "$TASKS"
    "$PY" - "$TASKS" <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
qs = [("The capital of France is", ["Paris", "Berlin", "Madrid", "Rome"]),
      ("Water freezes at zero degrees", ["Celsius", "Kelvin", "miles", "seconds"]),
      ("A kernel module can be loaded with the command", ["modprobe", "banana", "the sea", "loudly"]),
      ("In Python, a list is written with", ["square brackets", "a hammer", "blue paint", "the moon"]),
      ("The opposite of hot is", ["cold", "tall", "seven", "green"]),
      ("Cats and dogs are", ["animals", "numbers", "planets", "verbs"]),
      ("The sun rises in the", ["east", "fridge", "keyboard", "pencil"]),
      ("Two plus two equals", ["four", "purple", "Tuesday", "salt"])]
(d / "mc.jsonl").write_text("".join(json.dumps({"question": q, "choices": c, "answer": 0}) + "\n" for q, c in qs))
(d / "tinymc.yaml").write_text(f"""task: tinymc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {d / 'mc.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
target_delimiter: " "
metric_list:
  - metric: acc
  - metric: acc_norm
""")
PY
fi
"$PY" -m redline serve "$CKPT" --model-name served --port "$PORT" --max-batch 4 > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    kill -0 $SERVER 2>/dev/null || { cat "$OUT/serve.log" >&2; exit 1; }
    sleep 1
done
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
echo "=== lm-eval through redline serve ==="
"$LM_EVAL" --model local-completions --model_args "model=served,base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer=$OUT/hf,num_concurrent=1,max_retries=1,tokenized_requests=True" \
    --tasks "$TASK" --include_path "$TASKS" --log_samples --output_path "$OUT/served" 2>&1 | grep "^|"
echo "=== lm-eval on transformers (the exported folder) ==="
"$LM_EVAL" --model hf --model_args "pretrained=$OUT/hf,dtype=float32" --device "${DEVICE:-cpu}" \
    --tasks "$TASK" --include_path "$TASKS" --log_samples --output_path "$OUT/transformers" 2>&1 | grep "^|"
"$PY" - "$OUT" "$TASK" <<'PY'
import glob, json, sys
out, task = sys.argv[1], sys.argv[2]
def samples(d):
    return {r["doc_id"]: r for f in glob.glob(f"{out}/{d}/**/samples_{task}_*.jsonl", recursive=True)
            for r in map(json.loads, open(f))}
a, b = samples("served"), samples("transformers")
diffs, greedy_same = [], True
for doc in sorted(a):
    for ra, rb in zip(a[doc]["resps"], b[doc]["resps"]):
        (la, ga), (lb, gb) = ra[0], rb[0]
        diffs.append(abs(float(la) - float(lb)))
        greedy_same &= ga == gb
print(json.dumps({"script": "lm_eval_parity", "task": task, "docs": len(a), "choices": len(diffs),
                  "max_loglikelihood_diff": max(diffs), "is_greedy_equal": greedy_same}))
PY
