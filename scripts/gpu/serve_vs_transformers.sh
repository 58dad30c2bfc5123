#!/usr/bin/env bash
# `redline serve` against `transformers serve` (transformers' own OpenAI-compatible server) on one GPU (written
# for one H100): the same exported model, the same client load, the same call.
#
#     scripts/gpu/serve_vs_transformers.sh                      # files under $OUT (default: a new temporary folder)
#     PRESET=modern-350m CONCURRENCY="1 64" scripts/gpu/serve_vs_transformers.sh
#     TRANSFORMERS_ARGS="--continuous-batching --cb-use-cuda-graph" scripts/gpu/serve_vs_transformers.sh
#     DEVICE=cpu PRESET=tiny CONCURRENCY="1 2" PROMPT=16 NEW=8 scripts/gpu/serve_vs_transformers.sh  # checks the steps
#
# TRANSFORMERS_ARGS (default --continuous-batching) replaces the options of `transformers serve`; without continuous
# batching it generates one request at a time, and 64 clients take minutes. On a CPU the figures mean nothing (the
# try-out only shows that every step works).
#
# Steps (about 3 to 4 minutes on an H100, most of it redline's compilation and transformers' decoding; $BUDGET, 540 s
# by default, caps the whole run: a load that would overrun it is cut short and the summary still prints):
#   1. A checkpoint of $PRESET with random weights and the bytes tokenizer whose output head picks only printable
#      ASCII (scripts/gpu/serve_vs_transformers.py says why), `redline export --dtype bf16` to a Hugging Face folder,
#      and `redline import` of that folder back: both servers load the same bf16 weights and tokenizer.json.
#   2. `redline serve` on the imported checkpoint (--max-batch: the largest concurrency), warmed up by one wave of
#      requests at each concurrency, then scripts/serve_load.py at each concurrency in $CONCURRENCY (closed loop:
#      $WAVES × C requests, at least 4); then the server stops.
#   3. `transformers serve FOLDER --continuous-batching --dtype bfloat16` ($TRANSFORMERS_ARGS) on the exported
#      folder, the same warm-up and the same loads.
#   Every request: POST /v1/completions, a prompt of $PROMPT random printable ASCII characters ($PROMPT tokens for
#   this tokenizer on both servers; the table shows the count each server reported), $NEW new tokens, greedy,
#   streamed. transformers serve sends no `data: [DONE]` on /v1/completions, so its streams count as complete at
#   their finish_reason (serve_load.py --done-optional).
# Target (from the issue): redline's aggregate output tokens/s >= 5x transformers serve's.
# Needs, besides the image's transformers: the serve extra's wheels in .whl/ (scripts/gpu/serve_bench.sh lists
# them) and, for transformers serve, the openai client (openai 3 needs httpx2, httpcore2 and truststore): for
# Python 3.12 on x86-64, on a machine with internet access:
#     pip download -d .whl --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#         --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform any \
#         openai==3.57.0 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
# Files under $OUT: redline.jsonl, transformers.jsonl (one serve_load summary a concurrency), warmup_*.jsonl,
# probe_*.json (one greedy completion from each server), redline_serve.log, transformers_serve.log,
# serve_vs_transformers.log. The last line printed is one JSON object with every figure and the target check.
set -uo pipefail
START=$(date +%s)
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
OUT="${OUT:-$(mktemp -d)}"
PRESET="${PRESET:-modern-124m}"
PROMPT="${PROMPT:-128}"
NEW="${NEW:-256}"
CONCURRENCY="${CONCURRENCY:-1 16 64}"
WAVES="${WAVES:-2}"                 # requests per client in each measured load
WARMUP="${WARMUP:-1}"               # 0: no warm-up load
DEVICE="${DEVICE:-cuda}"
REDLINE_PORT="${REDLINE_PORT:-8471}"
TRANSFORMERS_PORT="${TRANSFORMERS_PORT:-8472}"
# on a CPU a small paged cache and batch: by default continuous batching sizes them to most of the free memory
DEFAULT_TRANSFORMERS_ARGS=--continuous-batching
[ "$DEVICE" = cpu ] && DEFAULT_TRANSFORMERS_ARGS="--continuous-batching --cb-num-blocks 16 --cb-max-batch-tokens 256"
TRANSFORMERS_ARGS="${TRANSFORMERS_ARGS-$DEFAULT_TRANSFORMERS_ARGS}"
LOAD_TIMEOUT="${LOAD_TIMEOUT:-150}" # seconds for one load before it counts as not finished
BUDGET="${BUDGET:-540}"             # seconds for the whole script: loads are cut short to print the summary in time
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1  # no network there: never ask the Hub
LOG="$OUT/serve_vs_transformers.log"
HELPER=scripts/gpu/serve_vs_transformers.py
: > "$LOG"
rm -f "$OUT"/redline.jsonl "$OUT"/transformers.jsonl "$OUT"/warmup_*.jsonl "$OUT"/probe_*.json
if [ "$DEVICE" = cpu ]; then REDLINE_DTYPE=fp32; HF_DTYPE=float32; else REDLINE_DTYPE=bf16; HF_DTYPE=bfloat16; fi
MAX_C=$(printf '%s\n' $CONCURRENCY | sort -n | tail -n 1)

if ! "$PY" - "$DEVICE" <<'EOF' 2>"$OUT/import_error.txt" | tee -a "$LOG"; then
import sys
import fastapi, openai, pydantic, torch, transformers, tyro, uvicorn
from transformers.utils.import_utils import is_serve_available
assert sys.argv[1] != "cuda" or torch.cuda.is_available(), "no CUDA GPU visible"
assert is_serve_available(), "transformers says its serving extras are missing"
import transformers.cli.serve, transformers.cli.serving.completion  # what `transformers serve` imports
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"openai {openai.__version__}, fastapi {fastapi.__version__}, uvicorn {uvicorn.__version__}")
EOF
    echo "serve_vs_transformers.sh: this Python cannot run the comparison: $(tail -n 1 "$OUT/import_error.txt");" \
        "put the wheels in .whl/ (see this script's header) or set PYTHON=" | tee -a "$LOG" >&2
    exit 2
fi
WORK=$(mktemp -d)
# limit [CAP]: seconds the next step may take: CAP (default LOAD_TIMEOUT), or what is left of BUDGET less 30 s
# for stopping the server and the summary
limit() {
    local cap=${1:-$LOAD_TIMEOUT} left=$(( BUDGET - 30 - ($(date +%s) - START) ))
    echo $(( left < cap ? (left > 1 ? left : 1) : cap ))
}
SERVER=
stop_server() {  # SIGTERM, then SIGKILL after 20 s
    [ -n "$SERVER" ] || return 0
    kill "$SERVER" 2>/dev/null
    for _ in $(seq 40); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$SERVER" 2>/dev/null
    wait "$SERVER" 2>/dev/null
    SERVER=
}
trap 'stop_server; rm -rf "$WORK"' EXIT

echo "=== model: $PRESET, random weights, printable-ASCII head; redline export (bf16) and import ===" | tee -a "$LOG"
CKPT=$("$PY" "$HELPER" model "$PRESET" "$WORK/run" 2>>"$LOG" | tail -n 1)
HF="$WORK/hf"
"$PY" -m redline export "$CKPT" --out "$HF" --dtype bf16 2>&1 | tee -a "$LOG"
"$PY" -m redline import "$HF" --out "$WORK/imported" 2>&1 | tee -a "$LOG"
if [ ! -f "$HF/config.json" ] || [ ! -d "$WORK/imported" ]; then
    echo "serve_vs_transformers.sh: the model was not made (see $LOG)" | tee -a "$LOG" >&2
    exit 1
fi

# load NAME URL MODEL [serve_load options]: the warm-up (one wave a concurrency) and the measured loads
load() {
    local name=$1 url=$2 model=$3 c n
    shift 3
    if [ "$WARMUP" != 0 ]; then
        for c in $CONCURRENCY; do
            echo "--- $name warm-up: $c clients, $c requests ---" | tee -a "$LOG"
            timeout "$(limit)" "$PY" scripts/serve_load.py --url "$url" --model "$model" --concurrency "$c" \
                --requests "$c" --prompt-tokens "$PROMPT" --max-tokens "$NEW" --prompt-text "$@" \
                --json-out "$OUT/warmup_$name.jsonl" 2>&1 | tee -a "$LOG"
        done
    fi
    for c in $CONCURRENCY; do
        n=$(( c * WAVES > 4 ? c * WAVES : 4 ))
        echo "=== $name: $c concurrent clients, $n requests ===" | tee -a "$LOG"
        timeout "$(limit)" "$PY" scripts/serve_load.py --url "$url" --model "$model" --concurrency "$c" \
            --requests "$n" --prompt-tokens "$PROMPT" --max-tokens "$NEW" --prompt-text "$@" \
            --json-out "$OUT/$name.jsonl" 2>&1 | tee -a "$LOG"
    done
    timeout "$(limit 60)" "$PY" "$HELPER" probe "$name" "$url" "$model" "$OUT" "$PROMPT" "$NEW" 2>&1 | tee -a "$LOG"
}

CONTEXT=$(( (PROMPT + NEW + 63) / 64 * 64 ))
echo "=== redline serve (imported checkpoint) --max-batch $MAX_C --context $CONTEXT ===" | tee -a "$LOG"
"$PY" -m redline serve "$WORK/imported" --port "$REDLINE_PORT" --max-batch "$MAX_C" --context "$CONTEXT" \
    --model-name "$PRESET" --device "$DEVICE" --dtype "$REDLINE_DTYPE" > "$OUT/redline_serve.log" 2>&1 &
SERVER=$!
if "$PY" "$HELPER" wait "http://127.0.0.1:$REDLINE_PORT" "$SERVER" "$(limit 240)" 2>&1 | tee -a "$LOG"; then
    load redline "http://127.0.0.1:$REDLINE_PORT" "$PRESET"
else
    tail -n 20 "$OUT/redline_serve.log" | tee -a "$LOG"
fi
stop_server

echo "=== transformers serve (exported folder) $TRANSFORMERS_ARGS --dtype $HF_DTYPE ===" | tee -a "$LOG"
"$PY" -m transformers.cli.transformers serve "$HF" $TRANSFORMERS_ARGS --device "$DEVICE" --dtype "$HF_DTYPE" \
    --host 127.0.0.1 --port "$TRANSFORMERS_PORT" > "$OUT/transformers_serve.log" 2>&1 &
SERVER=$!
if "$PY" "$HELPER" wait "http://127.0.0.1:$TRANSFORMERS_PORT" "$SERVER" "$(limit 240)" 2>&1 | tee -a "$LOG"; then
    load transformers "http://127.0.0.1:$TRANSFORMERS_PORT" "$HF" --done-optional
else
    tail -n 20 "$OUT/transformers_serve.log" | tee -a "$LOG"
fi
stop_server

INFO=$("$PY" - "$PRESET" "$DEVICE" "$TRANSFORMERS_ARGS" "$(( $(date +%s) - START ))" <<'EOF'
import json, sys
import torch, transformers
preset, device, args, wall = sys.argv[1:]
name = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else "cpu"
print(json.dumps({"device": name, "preset": preset, "transformers": transformers.__version__,
                  "transformers_args": args, "wall_s": float(wall)}))
EOF
)
"$PY" "$HELPER" summary "$OUT" "$INFO" 2>&1 | tee -a "$LOG"
