#!/usr/bin/env bash
# FP8 numerics check: does an FP8 run's loss curve stay within 2% of the BF16 run's? (GPU, ~4-6 minutes on an H100)
#
#     scripts/gpu/fp8_numerics.sh DATA_DIR            # DATA_DIR: a folder prepared by `redline data prepare`
#     PRESET=modern-124m STEPS=300 BATCH=16 scripts/gpu/fp8_numerics.sh DATA_DIR
#
# Three `redline train` runs from the same seed on the same data, STEPS steps each (default 300):
#   bf16          fp8=off
#   fp8-all-now   fp8=all fp8_warmup_steps=0   (every eligible Linear in FP8 from the first step: the hardest case)
#   fp8-auto      fp8=auto                       (the default warm-up: BF16 for 100 steps, then the layers that pay)
# Compared per step on the loss smoothed over 20 steps, from step 50 on (the first steps move too fast to compare):
# the largest and the final relative difference to BF16 must be <= 2%; the final eval losses are listed too.
# Wheels in .whl/ (torchao, tyro, docstring_parser, typeguard) are installed into /tmp/site first.
# Files under $OUT: fp8_numerics.jsonl (one line per run and the verdict), fp8_numerics.log, curves.csv.
# The runs themselves (checkpoints included) go to /tmp/fp8_numerics_runs, not $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ] || [ ! -d "$1" ]; then
    echo "usage: scripts/gpu/fp8_numerics.sh DATA_DIR   (a folder made by \`redline data prepare\`)" >&2
    exit 2
fi
DATA="$(cd "$1" && pwd)"
. scripts/gpu/env.sh
OUT="${OUT:-$(mktemp -d)}"
PRESET="${PRESET:-gpt2-124m}"
STEPS="${STEPS:-300}"
BATCH="${BATCH:-16}"
SEQ="${SEQ:-1024}"
RUNS="${RUNS:-/tmp/fp8_numerics_runs}"
mkdir -p "$OUT/cache" "$RUNS"
export REDLINE_CACHE="$OUT/cache"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/fp8_numerics.log") 2>&1

"$PY" -c 'import torch, torchao; assert torch.cuda.is_available(), "no CUDA GPU visible"' || {
    echo "fp8_numerics.sh: needs a CUDA GPU and torchao (carry its wheel in .whl/)" >&2; exit 2; }
echo "data $DATA | preset $PRESET | $STEPS steps of $BATCH×$SEQ | files: $OUT"

train() {  # train NAME ARGS...
    local name="$1"; shift
    rm -rf "${RUNS:?}/$name"
    echo
    echo "=== $name: redline train $*"
    # AdamW and no warm-up of the rows, as BENCHMARKS.md's figures were measured (the modern presets default to Muon)
    "$PY" -m redline train --preset "$PRESET" --data.path "$DATA" max_steps="$STEPS" batch_size="$BATCH" \
        seq_len="$SEQ" log_every=10 eval_every=0 eval_batches=20 sample_tokens=0 tensorboard=False seed=1337 \
        optim.name=adamw seq_ramp_steps=0 out_dir="$RUNS" run_name="$name" "$@" || echo "fp8_numerics.sh: run $name failed (exit $?)"
}
train bf16 fp8=off
train fp8-all-now fp8=all fp8_warmup_steps=0
train fp8-auto fp8=auto

"$PY" - "$RUNS" "$OUT" <<'EOF'
import json, sys
from pathlib import Path

runs, out = Path(sys.argv[1]), Path(sys.argv[2])
WINDOW, FROM, LIMIT = 20, 50, 0.02


def load(name):
    path = runs / name / "metrics.jsonl"
    if not path.exists():
        return None, None
    train, final_eval = {}, None
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "train":
            train[r["step"]] = r["loss"]
        elif r.get("kind") == "eval":
            final_eval = r["loss"]
    return train, final_eval


def smooth(curve):
    steps = sorted(curve)
    return {s: sum(curve[t] for t in steps[max(0, i - WINDOW + 1): i + 1]) / len(steps[max(0, i - WINDOW + 1): i + 1])
            for i, s in enumerate(steps)}


ref, ref_eval = load("bf16")
lines, csv = [], {}
if ref is None:
    print("fp8_numerics: the bf16 run left no metrics; nothing to compare")
    sys.exit(1)
ref_s = smooth(ref)
csv["bf16"] = ref
print(f"\n{'run':<14} {'steps':>5} {'final loss':>10} {'eval loss':>10} {'max rel diff':>13} {'at step':>8} {'final rel diff':>15}  within 2%")
print(f"{'bf16':<14} {len(ref):>5} {ref[max(ref)]:>10.4f} {ref_eval if ref_eval is None else f'{ref_eval:.4f}':>10}")
verdicts = []
for name in ("fp8-all-now", "fp8-auto"):
    curve, ev = load(name)
    if curve is None:
        verdicts.append({"run": name, "status": "failed"})
        print(f"{name:<14} run failed")
        continue
    csv[name] = curve
    s = smooth(curve)
    common = [t for t in sorted(s) if t >= FROM and t in ref_s]
    diffs = {t: abs(s[t] - ref_s[t]) / ref_s[t] for t in common}
    worst = max(diffs, key=diffs.get) if diffs else None
    final = diffs[common[-1]] if common else None
    ok = bool(diffs) and max(diffs.values()) <= LIMIT
    verdicts.append({"run": name, "steps": len(curve), "final_loss": curve[max(curve)], "eval_loss": ev,
                     "bf16_eval_loss": ref_eval, "max_rel_diff": diffs.get(worst), "max_rel_diff_step": worst,
                     "final_rel_diff": final, "within_2pct": ok})
    evs = "-" if ev is None else f"{ev:.4f}"
    print(f"{name:<14} {len(curve):>5} {curve[max(curve)]:>10.4f} {evs:>10} "
          f"{(diffs.get(worst) or 0) * 100:>12.2f}% {worst or '-':>8} {(final or 0) * 100:>14.2f}%  {'yes' if ok else 'NO'}")
steps = sorted(set().union(*[set(c) for c in csv.values()]))
(out / "curves.csv").write_text("step," + ",".join(csv) + "\n" + "\n".join(
    f"{t}," + ",".join(f"{c[t]:.5f}" if t in c else "" for c in csv.values()) for t in steps) + "\n")
result = {"name": "fp8_numerics", "window": WINDOW, "from_step": FROM, "limit": LIMIT, "runs": verdicts,
          "passed": all(v.get("within_2pct") for v in verdicts)}
with (out / "fp8_numerics.jsonl").open("a") as f:
    f.write(json.dumps(result) + "\n")
print(json.dumps(result))
EOF
sleep 1  # let tee finish writing fp8_numerics.log before the call's files are collected
