#!/usr/bin/env bash
# Chat histories under load: `redline serve` without prefix reuse, with reuse in place (the default) and with
# parked rows, on one GPU, against the engine's offline batched figure (BENCHMARKS.md, "Prefix reuse").
#
#     scripts/gpu/serve_chat_bench.sh                       # files under $OUT (default: a new temporary folder)
#     CONVERSATIONS="64" PARKED=128 scripts/gpu/serve_chat_bench.sh
#     SERVERS="reuse parked" REPEATS=2 scripts/gpu/serve_chat_bench.sh      # some of the three servers
#
# Steps (about 4 minutes on one H100):
#   1. `redline bench-infer --preset $PRESET` (random weights), compiled, batch 64, $PROMPT-token prompts, $NEW
#      new tokens: the offline figure.
#   2. A checkpoint of the preset with random weights and the bytes tokenizer, served by `redline serve
#      --max-batch 64 --engine-process` three times in turn: `--prefix-min-tokens 0` (no reuse), the defaults
#      (reuse of what the batch's rows hold), `--prefix-parked-rows $PARKED`.
#   3. On each server, scripts/serve_load.py with 64 kept-alive streaming greedy clients: a warm-up load of 256
#      requests, then $REPEATS recorded loads of 1,024 for each number of conversations in progress in
#      $CONVERSATIONS (64: one per client, carried turn after turn; more: a client's next request belongs to
#      another conversation than its last). Conversations of $TURNS turns: the first prompt $PROMPT random
#      tokens, each later one the last prompt and $TURN_TOKENS more; $NEW × a seeded draw in [0.5, 1.5] new tokens
#      a request. The server without reuse runs the first number only (it copies nothing at any).
# Each load reports its tokens/s, TTFT and the prompt tokens the server copied a request (mean: at most what all
# turns but the first repeat). Needs the serve extra's wheels in .whl/ as scripts/gpu/serve_bench.sh does.
# Files under $OUT: bench_infer.jsonl, loads.jsonl (one line per recorded load, with "server" and
# "conversations"), server_<name>.log.gz, serve_chat_bench.log. The last line printed is one JSON object: each
# server's and conversation count's median tokens/s, its share of bench-infer, TTFT p50 and copied tokens.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
OUT="${OUT:-$(mktemp -d)}"
PRESET="${PRESET:-modern-124m}"
PROMPT="${PROMPT:-512}"
NEW="${NEW:-256}"
TURNS="${TURNS:-4}"
TURN_TOKENS="${TURN_TOKENS:-64}"
CONVERSATIONS="${CONVERSATIONS:-64 128}"
PARKED="${PARKED:-64}"
REPEATS="${REPEATS:-3}"
SERVERS="${SERVERS:-noreuse reuse parked}"
PORT="${PORT:-8473}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/serve_chat_bench.log"
: > "$LOG"
: > "$OUT/loads.jsonl"
if ! "$PY" -c 'import torch, tyro, fastapi, uvicorn; assert torch.cuda.is_available(), "no CUDA GPU visible"' 2>"$OUT/import_error.txt"; then
    echo "serve_chat_bench.sh: this Python cannot run the benchmark: $(tail -n 1 "$OUT/import_error.txt"); put the serve extra's wheels in .whl/ (docs/serve.md) or set PYTHON=" | tee -a "$LOG" >&2
    exit 2
fi

echo "=== redline bench-infer --preset $PRESET (offline, batch 64) ===" | tee -a "$LOG"
timeout 150 "$PY" -m redline bench-infer --preset "$PRESET" --batch-sizes 64 --methods compiled --prompt-lens "$PROMPT" \
    --max-new-tokens "$NEW" --repeats 3 --json-out "$OUT/bench_infer.jsonl" 2>&1 | tail -n 4 | tee -a "$LOG"

CKPT_RUN=$(mktemp -d)
"$PY" scripts/gpu/random_checkpoint.py "$PRESET" "$CKPT_RUN" 2>&1 | sed "s/^/random-weight checkpoint of $PRESET: /" \
    | tee -a "$LOG"
CKPT=$(ls -d "$CKPT_RUN"/checkpoints/step_* | head -n 1)
CONTEXT=$(( (PROMPT + (TURNS - 1) * TURN_TOKENS + NEW * 3 / 2 + 63) / 64 * 64 ))
LOAD=(--url "http://127.0.0.1:$PORT" --model "$PRESET" --concurrency 64 --prompt-tokens "$PROMPT" --turns "$TURNS"
      --turn-tokens "$TURN_TOKENS" --max-tokens "$NEW" --max-tokens-spread 0.5 --redline-metrics)
SERVER=
trap 'kill $SERVER 2>/dev/null; rm -rf "$CKPT_RUN"' EXIT
for name in $SERVERS; do
    case "$name" in
        noreuse) args=(--prefix-min-tokens 0) ;;
        reuse) args=() ;;
        parked) args=(--prefix-parked-rows "$PARKED") ;;
    esac
    echo "=== $name: redline serve --max-batch 64 --context $CONTEXT --engine-process ${args[*]} ===" | tee -a "$LOG"
    "$PY" -m redline serve "$CKPT" --port "$PORT" --max-batch 64 --context "$CONTEXT" --model-name "$PRESET" \
        --engine-process "${args[@]}" > "$OUT/server_$name.log" 2>&1 &
    SERVER=$!
    up=0
    for _ in $(seq 240); do
        "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null \
            && { up=1; break; }
        kill -0 "$SERVER" 2>/dev/null || break
        sleep 1
    done
    if [ "$up" != 1 ]; then
        echo "serve_chat_bench.sh: the $name server did not come up (see server_$name.log)" | tee -a "$LOG" >&2
        tail -n 20 "$OUT/server_$name.log" | tee -a "$LOG"
        exit 1
    fi
    timeout 120 "$PY" scripts/serve_load.py "${LOAD[@]}" --requests 256 --seed 0 2>&1 | grep -v '^{' | tail -n 2 \
        | sed "s/^/$name warm-up: /" | tee -a "$LOG"
    ci=0
    for conv in $CONVERSATIONS; do
        ci=$(( ci + 1 ))
        for r in $(seq "$REPEATS"); do
            # a seed of its own per load: two loads with one seed begin with the same prompts, and the second
            # would find the first's histories still held
            timeout 120 "$PY" scripts/serve_load.py "${LOAD[@]}" --requests 1024 --conversations "$conv" \
                --seed $(( 100 * ci + r )) \
                --json-out "$OUT/load.tmp" 2>&1 | grep -v '^{' | tail -n 3 | sed "s/^/$name conv=$conv $r: /" | tee -a "$LOG"
            "$PY" -c "import json, sys; d = json.loads(open(sys.argv[1]).readlines()[-1]); d.update(server=sys.argv[2], conversations=int(sys.argv[3])); print(json.dumps(d))" \
                "$OUT/load.tmp" "$name" "$conv" >> "$OUT/loads.jsonl"
        done
        [ "$name" = noreuse ] && break  # nothing is copied at any number of conversations
    done
    kill -TERM "$SERVER"
    wait "$SERVER" 2>/dev/null
    SERVER=
    gzip -9f "$OUT/server_$name.log"
done
rm -f "$OUT/load.tmp"

"$PY" - "$OUT" <<'EOF' 2>&1 | tee -a "$LOG"
import json, statistics, sys

out = sys.argv[1]
offline = None  # bench-infer's batch-64 decode tokens/s (None if it failed: see the log)
try:
    for line in open(f"{out}/bench_infer.jsonl"):
        for r in json.loads(line)["results"]:
            if r.get("status") == "ok" and r["batch"] == 64:
                offline = r["decode_tok_s_total"]
except OSError:
    pass
groups = {}
for line in open(f"{out}/loads.jsonl"):
    d = json.loads(line)
    groups.setdefault((d["server"], d["conversations"]), []).append(d)
rows = []
print(f"{'server':<9} {'conversations':>13} {'tok/s':>9} {'of offline':>10} {'TTFT p50':>9} {'copied a request':>17}")
for (server, conv), loads in groups.items():
    tok = statistics.median(d["output_tokens_per_s"] for d in loads)
    row = {"server": server, "conversations": conv, "tokens_per_s": round(tok),
           "share_of_offline": round(tok / offline, 3) if offline else None,
           "ttft_p50_ms": round(statistics.median(d["ttft_ms"]["p50"] for d in loads), 1),
           "cached_prompt_tokens": round(statistics.median(d["cached_prompt_tokens"] or 0 for d in loads), 1),
           "prompt_tokens": loads[0]["server_prompt_tokens"]}
    rows.append(row)
    share = f"{100 * row['share_of_offline']:.1f}%" if offline else "-"
    print(f"{server:<9} {conv:>13} {row['tokens_per_s']:>9,} {share:>10} {row['ttft_p50_ms']:>9} "
          f"{row['cached_prompt_tokens']:>8} of {row['prompt_tokens']}")
print(json.dumps({"script": "serve_chat_bench.sh", "offline_decode_tok_s": offline, "servers": rows}))
EOF
