#!/usr/bin/env bash
# Where the `fast` recipe's step time goes against the `nanogpt` recipe's (issue 26: the fast recipe needs 2.67x
# fewer tokens than nanogpt to reach its loss but trains fewer tokens/s, which caps its time to quality): the
# training step of each, and of the fast recipe with one of its levers undone at a time, timed by `redline bench`
# (compiled, random data, the speedrun's 32,768 tokens a step), each point in its own process.
#
#     scripts/gpu/fast_speed.sh                    # every variant (about 8 minutes on one H100)
#     VARIANTS="nanogpt fast fast-t2048" scripts/gpu/fast_speed.sh
#
# Variants: nanogpt (gpt2-124m, 32 x 1024), fast (modern-124m, 32 x 1024, as the speedrun trains it), fast-t2048
# (16 x 2048: attention over twice the length), fast-tied (tied embeddings and head), fast-nocap (no logit
# soft-cap), fast-adamw (AdamW instead of Muon for the matrices), fast-matmul (Muon's Newton–Schulz products by
# torch.matmul, not redline's symmetric kernel), fast-noqknorm (no QK-norm).
# Files under $OUT: fast_speed.jsonl (bench's JSON line per variant, labelled). The last line printed is one JSON
# object: each variant's tokens/s, step ms and its tokens/s over nanogpt's.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
VARIANTS="${VARIANTS:-nanogpt fast fast-t2048 fast-tied fast-nocap fast-adamw fast-noqknorm}"
JSON="$OUT/fast_speed.jsonl"
: > "$JSON"
for v in $VARIANTS; do
    case "$v" in
        nanogpt) args=(--recipe nanogpt batch_size=32 seq_len=1024 tokens_per_step=32768) ;;
        fast) args=(--recipe fast batch_size=32 seq_len=1024) ;;
        fast-t2048) args=(--recipe fast batch_size=16 seq_len=2048) ;;
        fast-tied) args=(--recipe fast batch_size=32 seq_len=1024 model.tie_embeddings=True) ;;
        fast-nocap) args=(--recipe fast batch_size=32 seq_len=1024 model.logit_softcap=0) ;;
        fast-adamw) args=(--recipe fast batch_size=32 seq_len=1024 optim.name=adamw) ;;
        fast-matmul) args=(--recipe fast batch_size=32 seq_len=1024 optim.muon_symmetric=False) ;;
        fast-noqknorm) args=(--recipe fast batch_size=32 seq_len=1024 model.qk_norm=False) ;;
        *) echo "fast_speed.sh: unknown variant $v" >&2; exit 2 ;;
    esac
    echo "=== $v: redline bench ${args[*]} ==="
    timeout 240 "$PY" -m redline bench "${args[@]}" --steps 20 --warmup 8 --label "$v" --json-out "$JSON" 2>&1 \
        | grep -v -i warn | tail -n 4
done
"$PY" - "$JSON" <<'EOF'
import json, sys

rows = {}
for line in open(sys.argv[1]):
    if line.strip():
        rec = json.loads(line)
        point = rec["points"][0]
        if point.get("status") == "ok":
            rows[rec["label"]] = {"tokens_per_second": round(point["tokens_per_second"]),
                                  "step_ms": round(point["step_ms_median"], 2), "mfu": point.get("mfu"),
                                  "gpu": point.get("gpu")}
base = rows.get("nanogpt", {}).get("tokens_per_second")
print(f"{'variant':<16} {'tokens/s':>10} {'step ms':>9} {'vs nanogpt':>11}")
for name, r in rows.items():
    r["over_nanogpt"] = round(r["tokens_per_second"] / base, 3) if base else None
    print(f"{name:<16} {r['tokens_per_second']:>10,} {r['step_ms']:>9} {r['over_nanogpt'] or '-':>11}")
print(json.dumps({"script": "fast_speed.sh", "variants": rows}))
EOF
