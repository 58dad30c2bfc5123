#!/usr/bin/env bash
# The numbers behind BENCHMARKS.md, in one GPU call under 9 minutes (H100): the plain PyTorch GPT-2 baseline,
# then `redline bench` points in priority order, each in its own process, then a summary with the targets.
#
#     scripts/gpu/bench_all.sh                       # files under $OUT (default: a new temporary folder)
#     BUDGET=900 scripts/gpu/bench_all.sh            # seconds for all points (default 480; the whole call adds ~30 s)
#     ONLY='1.5b|774m' scripts/gpu/bench_all.sh      # only the points whose name matches this regex
#     STEPS=20 WARMUP=10 DOCTOR=1 scripts/gpu/bench_all.sh   # DOCTOR=1: run `redline doctor` first (measured-peak MFU)
#
# Compile time counts: points run one after another, 10 warm-up + 20 timed steps each, and a point is started
# only while at least MIN_LEFT seconds of the budget remain (it is stopped at the budget's end); points that did
# not run are listed as skipped, with the ONLY= line that runs them in a second call.
# Wheels: a .whl/ folder in the repo root (torchao, and tyro with docstring_parser and typeguard, which the
# GPU image lacks) is installed into /tmp/site first.
#
# Files under $OUT: bench_all.jsonl (one JSON line per point, the baseline included), bench_all.log (everything
# printed), plain_gpt2_baseline.json, trace-gpt2-124m.json.gz (a profiler trace), cache/ (the measured attention
# backends and FP8 shape timings). The last line printed is one JSON object with every point and target check.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
OUT="${OUT:-$(mktemp -d)}"
export OUT  # the baseline writes $OUT/plain_gpt2_baseline.json
BUDGET="${BUDGET:-480}"
MIN_LEFT="${MIN_LEFT:-45}"
STEPS="${STEPS:-20}"
WARMUP="${WARMUP:-10}"
ONLY="${ONLY:-.}"
mkdir -p "$OUT/cache"
export REDLINE_CACHE="$OUT/cache"
export PYTHONUNBUFFERED=1
JSONL="$OUT/bench_all.jsonl"
LOG="$OUT/bench_all.log"
: > "$JSONL"
exec > >(tee -a "$LOG") 2>&1

if ! "$PY" -c 'import torch, tyro, rich, numpy; assert torch.cuda.is_available(), "no CUDA GPU visible"'; then
    echo "bench_all.sh: this Python cannot run redline on a GPU (needs torch with CUDA, tyro, rich, numpy; carry wheels in .whl/)" >&2
    exit 2
fi
"$PY" -c 'import torchao' 2>/dev/null || echo "bench_all.sh: torchao is not installed: the fp8 points will report it (carry its wheel in .whl/)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
echo "files: $OUT   budget: ${BUDGET}s"
[ "${DOCTOR:-0}" = 1 ] && "$PY" -m redline doctor | tail -n 3

skipped=()
# point NAME ARGS...: one bench point, within the budget
point() {
    local name="$1"; shift
    [[ "$name" =~ $ONLY ]] || return 0
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt "$MIN_LEFT" ]; then
        skipped+=("$name")
        echo "{\"label\": \"$name\", \"status\": \"skipped\", \"error\": \"time budget\"}" >> "$JSONL"
        return 0
    fi
    echo
    echo "=== $name ($((SECONDS))s elapsed, ${left}s left): redline bench $*"
    local before after rc
    before=$(wc -l < "$JSONL")
    # AdamW at every point (the modern presets train with Muon by default): the table compares presets, shapes and
    # precisions with one optimizer, as it always has; the levers' own costs are in BENCHMARKS.md "Time to quality"
    timeout --kill-after=15 "$left" "$PY" -m redline bench optim.name=adamw "$@" warmup="$WARMUP" steps="$STEPS" \
        --label "$name" --json-out "$JSONL"
    rc=$?
    after=$(wc -l < "$JSONL")
    if [ "$after" -eq "$before" ]; then  # it died before writing its line
        local status=error
        [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status=timeout
        echo "{\"label\": \"$name\", \"status\": \"$status\", \"exit_code\": $rc}" >> "$JSONL"
    fi
}

# --- the baseline: plain PyTorch GPT-2 124M, B=32 T=1024, compiled --------------------------------------------
if [[ "plain-gpt2-124m-b32" =~ $ONLY ]]; then
    echo "=== plain-gpt2-124m-b32"
    timeout --kill-after=15 "$((BUDGET - SECONDS))" "$PY" scripts/gpu/plain_gpt2_baseline.py --batch-size 32 \
        --seq-len 1024 --warmup "$WARMUP" --steps "$STEPS" | tee "$OUT/baseline.stdout"
    if ! tail -n 1 "$OUT/baseline.stdout" | grep '^{' | "$PY" -c 'import json,sys; d=json.load(sys.stdin); d["label"]="plain-gpt2-124m-b32"; print(json.dumps(d))' >> "$JSONL"; then
        echo '{"label": "plain-gpt2-124m-b32", "status": "error"}' >> "$JSONL"
    fi
    rm -f "$OUT/baseline.stdout"
fi

# --- redline points, most important first ----------------------------------------------------------------------
G=(--preset gpt2-124m seq_len=1024)
point gpt2-124m-b32-bf16          "${G[@]}" batch_size=32
point gpt2-124m-b32-fp8auto       "${G[@]}" batch_size=32 fp8=auto
point gpt2-124m-b32-bf16-profile  "${G[@]}" batch_size=32 --profile profile_steps=3 --trace "$OUT/trace-gpt2-124m.json.gz"
point modern-124m-t2048-bf16      --preset modern-124m seq_len=2048 batch_size=16
point modern-124m-t2048-fp8auto   --preset modern-124m seq_len=2048 batch_size=16 fp8=auto
point gpt2-1.5b-b8-bf16           --preset gpt2-1.5b seq_len=1024 batch_size=8
point gpt2-1.5b-b8-fp8auto        --preset gpt2-1.5b seq_len=1024 batch_size=8 fp8=auto
point modern-1.5b-b8-bf16         --preset modern-1.5b seq_len=1024 batch_size=8
point modern-1.5b-b8-fp8auto      --preset modern-1.5b seq_len=1024 batch_size=8 fp8=auto
point gpt2-774m-b8-bf16           --preset gpt2-774m seq_len=1024 batch_size=8
point gpt2-774m-b8-fp8auto        --preset gpt2-774m seq_len=1024 batch_size=8 fp8=auto
point gpt2-1.5b-b8-fp8all         --preset gpt2-1.5b seq_len=1024 batch_size=8 fp8=all
point gpt2-124m-b64-bf16          "${G[@]}" batch_size=64
point gpt2-124m-b64-fp8auto       "${G[@]}" batch_size=64 fp8=auto
point modern-774m-b8-bf16         --preset modern-774m seq_len=1024 batch_size=8
point modern-774m-b8-fp8auto      --preset modern-774m seq_len=1024 batch_size=8 fp8=auto
point gpt2-350m-b16-bf16          --preset gpt2-350m seq_len=1024 batch_size=16
point gpt2-350m-b16-fp8auto       --preset gpt2-350m seq_len=1024 batch_size=16 fp8=auto
point modern-350m-b16-bf16        --preset modern-350m seq_len=1024 batch_size=16
point modern-350m-b16-fp8auto     --preset modern-350m seq_len=1024 batch_size=16 fp8=auto
point gpt2-124m-b32-fp8all        "${G[@]}" batch_size=32 fp8=all
point gpt2-774m-b8-fp8all         --preset gpt2-774m seq_len=1024 batch_size=8 fp8=all
point modern-1.5b-b8-fp8all       --preset modern-1.5b seq_len=1024 batch_size=8 fp8=all
point modern-774m-b8-fp8all       --preset modern-774m seq_len=1024 batch_size=8 fp8=all
point gpt2-350m-b16-fp8all        --preset gpt2-350m seq_len=1024 batch_size=16 fp8=all
point modern-350m-b16-fp8all      --preset modern-350m seq_len=1024 batch_size=16 fp8=all
point gpt2-1.5b-b16-bf16-acsel    --preset gpt2-1.5b seq_len=1024 batch_size=16 activation_checkpointing=selective
# the 1.5B step: where its time goes, and the optimizer's share (AdamW over 1.5B parameters every 8k tokens) made
# small by accumulating 8 micro-batches per optimizer step, as a real run of this size would
point gpt2-1.5b-b8-bf16-profile   --preset gpt2-1.5b seq_len=1024 batch_size=8 --profile profile_steps=3 --trace "$OUT/trace-gpt2-1.5b.json.gz"
point gpt2-1.5b-b8x8-bf16         --preset gpt2-1.5b seq_len=1024 batch_size=8 tokens_per_step=65536
point gpt2-1.5b-b8x8-fp8auto      --preset gpt2-1.5b seq_len=1024 batch_size=8 tokens_per_step=65536 fp8=auto
point modern-1.5b-b8x8-bf16       --preset modern-1.5b seq_len=1024 batch_size=8 tokens_per_step=65536
point gpt2-1.5b-b8-bf16-modelcompile --preset gpt2-1.5b seq_len=1024 batch_size=8 compile_scope=model
point gpt2-1.5b-b12-bf16          --preset gpt2-1.5b seq_len=1024 batch_size=12
point modern-124m-t2048-b32-bf16  --preset modern-124m seq_len=2048 batch_size=32
# T=2048 at the larger sizes (the gpt2 presets keep GPT-2's 1024-token context)
point modern-350m-t2048-b8-bf16   --preset modern-350m seq_len=2048 batch_size=8
point modern-774m-t2048-b4-bf16   --preset modern-774m seq_len=2048 batch_size=4
point modern-1.5b-t2048-b4-bf16   --preset modern-1.5b seq_len=2048 batch_size=4
point modern-1.5b-t2048-b4-fp8auto --preset modern-1.5b seq_len=2048 batch_size=4 fp8=auto
# what each part of the fast path is worth (each one switched off, or an alternative)
point gpt2-124m-b32-blockscompile "${G[@]}" batch_size=32 compile_scope=blocks
point gpt2-124m-b32-pytorchattn   "${G[@]}" batch_size=32 attn_autotune=False
point gpt2-124m-b32-nocompile     "${G[@]}" batch_size=32 compile=False
point gpt2-124m-b32-maxautotune   "${G[@]}" batch_size=32 compile_mode=max-autotune-no-cudagraphs

echo
echo "=== done in ${SECONDS}s"
if [ "${#skipped[@]}" -gt 0 ]; then
    pattern=$(IFS='|'; echo "${skipped[*]}")
    echo "skipped for time (${#skipped[@]}): run them in another call with: ONLY='^(${pattern})\$' scripts/gpu/bench_all.sh"
fi

# --- summary: a table, the targets, one JSON line ----------------------------------------------------------------
"$PY" - "$JSONL" <<'EOF'
import json, sys

rows = []
for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    d = json.loads(line)
    if "points" in d:  # a redline bench report: one point
        p = dict(d["points"][0])
        p["label"] = d.get("label")
        rows.append(p)
    else:
        rows.append(d)
by = {r.get("label"): r for r in rows}


def tps(label):
    r = by.get(label) or {}
    return r.get("tokens_per_second") if r.get("status") == "ok" else None


print(f"\n{'point':<30} {'status':<9} {'tokens/s':>11} {'MFU':>6} {'peak GiB':>9} {'step ms':>8} {'1st step s':>10} {'fp8 layers':>10}  vs bf16")
for r in rows:
    label = r.get("label") or "?"
    ratio = ""
    if "fp8" in label:
        base = tps(label.replace("fp8auto", "bf16").replace("fp8all", "bf16"))
        if base and r.get("tokens_per_second"):
            ratio = f"{r['tokens_per_second'] / base:.2f}x"
    mfu = f"{r['mfu'] * 100:.1f}%" if r.get("mfu") else "-"
    t = f"{r['tokens_per_second']:,.0f}" if r.get("tokens_per_second") else "-"
    mem = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") else "-"
    step = f"{r['step_ms_median']:.1f}" if r.get("step_ms_median") else "-"
    first = f"{r['first_step_seconds']:.0f}" if r.get("first_step_seconds") else "-"
    layers = str(len(r["fp8_layers"])) if isinstance(r.get("fp8_layers"), list) and r.get("fp8_mode", "off") != "off" else "-"
    print(f"{label:<30} {r.get('status', '?'):<9} {t:>11} {mfu:>6} {mem:>9} {step:>8} {first:>10} {layers:>10}  {ratio}")

checks = []


def check(name, value, target, ok):
    checks.append({"target": name, "value": value, "goal": target, "met": ok if value is not None else None})


measured = [v for v in (tps("gpt2-124m-b32-bf16"), tps("gpt2-124m-b64-bf16")) if v]
best124 = max(measured) if measured else None
check("gpt2-124m T=1024 BF16 tokens/s (best batch)", best124, ">= 600000", best124 is not None and best124 >= 600e3)
mfus = [by[k]["mfu"] for k in ("gpt2-124m-b32-bf16", "gpt2-124m-b64-bf16") if by.get(k, {}).get("mfu")]
check("gpt2-124m T=1024 BF16 MFU", max(mfus) if mfus else None, ">= 0.52", bool(mfus) and max(mfus) >= 0.52)
base = tps("plain-gpt2-124m-b32")
ours = tps("gpt2-124m-b32-bf16")
check("redline gpt2-124m B=32 / plain compiled baseline B=32", ours / base if ours and base else None, "> 1.0",
      bool(ours and base and ours > base))
m = (by.get("modern-124m-t2048-bf16") or {}).get("mfu")
check("modern-124m T=2048 BF16 MFU", m, ">= 0.50", m is not None and m >= 0.50)
for label in [r.get("label") for r in rows if r.get("label") and "fp8auto" in r.get("label")]:
    a, b = tps(label), tps(label.replace("fp8auto", "bf16"))
    ratio = a / b if a and b else None
    big = "774m" in label or "1.5b" in label
    goal = 1.15 if big else 0.97
    check(f"{label} / bf16", ratio, f">= {goal}", ratio is not None and ratio >= goal)
for label in ("gpt2-1.5b-b8-bf16", "modern-1.5b-b8-bf16", "gpt2-1.5b-b8x8-bf16", "modern-1.5b-b8x8-bf16",
              "gpt2-1.5b-b16-bf16-acsel"):
    m = (by.get(label) or {}).get("mfu")
    check(f"{label} MFU (fits one 80 GB GPU)", m, ">= 0.45", m is not None and m >= 0.45)

print(f"\n{'target':<58} {'value':>10} {'goal':>10}  met")
for c in checks:
    v = c["value"]
    vs = "-" if v is None else (f"{v:,.0f}" if v > 10 else f"{v:.3f}")
    met = {True: "yes", False: "NO", None: "not run"}[c["met"]]
    print(f"{c['target']:<58} {vs:>10} {c['goal']:>10}  {met}")
print(json.dumps({"name": "bench_all", "points": rows, "targets": checks}, default=str))
EOF
sleep 1  # let tee finish writing bench_all.log before the call's files are collected
