#!/usr/bin/env bash
# `redline doctor`, `redline fit` and `redline plan` on one GPU, checked against plain-PyTorch measurements.
# About 3-5 minutes on an H100. Run from anywhere:
#
#     scripts/gpu/doctor_fit.sh                 # files under $OUT (default: a new temporary folder)
#     VERIFY=0 scripts/gpu/doctor_fit.sh        # skip the fresh-process checks of the fit answers (~1 min less)
#     PRICE=2.5 GPUS=8 scripts/gpu/doctor_fit.sh
#
# Steps:
#   1. redline doctor (full), timed as a whole (target: under 60 s)
#   2. a separate plain torch.matmul 8192³ bf16 and a 1 GiB device copy, for comparison with doctor's numbers
#      (targets: doctor's GEMM within 3%, its copy within 5%)
#   3. redline fit --preset modern-124m seq_len=2048 (target: under 2 minutes)
#   4. redline fit --preset gpt2-1.5b seq_len=1024 --checkpointing full (when this version has checkpointing)
#   5. with VERIFY=1: each fit answer and the grid point above it, probed again in a fresh process (the answer
#      must fit and the point above must not: the answer is then the true largest on the grid)
#   6. redline plan from the measured modern-124m throughput and doctor's measured power draw
# Prints every step's own output, a summary table, then one JSON line with every number and check.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
OUT="${OUT:-$(mktemp -d)}"
VERIFY="${VERIFY:-1}"
PRICE="${PRICE:-2.5}"
GPUS="${GPUS:-8}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export REDLINE_CACHE="$OUT/cache"  # doctor.json goes here; plan reads the power draw from it
export PYTHONUNBUFFERED=1

if ! "$PY" -c 'import torch, tyro, rich, numpy; assert torch.cuda.is_available(), "no CUDA GPU visible"' 2>"$OUT/import_error.txt"; then
    echo "doctor_fit.sh: this Python cannot run redline on a GPU: $(tail -n 1 "$OUT/import_error.txt")" >&2
    echo "doctor_fit.sh: needs torch with CUDA, tyro, rich and numpy (scripts/setup.sh installs them); set PYTHON=" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,power.limit,temperature.gpu,clocks.max.sm --format=csv 2>/dev/null || true
echo "files: $OUT"

now() { date +%s%N; }
run_step() {  # run_step NAME COMMAND...: tee the output to $OUT/NAME.log, record the wall time in $OUT/NAME.seconds
    local name="$1"; shift
    echo; echo "=== $name: $*"
    local start; start=$(now)
    "$@" 2>&1 | tee "$OUT/$name.log"
    local code=${PIPESTATUS[0]}
    awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.2f\n", (b - a) / 1e9 }' > "$OUT/$name.seconds"
    echo "$code" > "$OUT/$name.code"
    echo "=== $name: exit $code, $(cat "$OUT/$name.seconds") s"
}

# 1. doctor
run_step doctor "$PY" -m redline doctor --out "$OUT/doctor.json"

# 2. plain PyTorch reference: the same two measurements written independently of redline
run_step reference "$PY" - <<'EOF'
import json, time
import torch

dev = torch.device("cuda")
n = 8192
a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
end = time.time() + 1.0  # warm-up: clocks, cuBLAS heuristics
while time.time() < end:
    c = a @ b
    torch.cuda.synchronize()
samples = []
for _ in range(5):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(40):
        c = a @ b
    stop.record()
    stop.synchronize()
    samples.append(2 * n**3 * 40 / (start.elapsed_time(stop) * 1e-3) / 1e12)
del a, b, c
torch.cuda.empty_cache()
nbytes = 2**30
src = torch.empty(nbytes // 4, device=dev).uniform_()
dst = torch.empty_like(src)
for _ in range(20):
    dst.copy_(src)
copies = []
for _ in range(5):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        dst.copy_(src)
    stop.record()
    stop.synchronize()
    copies.append(2 * nbytes * 20 / (start.elapsed_time(stop) * 1e-3) / 1e12)
samples.sort(); copies.sort()
print(f"plain torch.matmul 8192³ bf16: {samples[2]:.1f} TFLOP/s (median of 5×40; all {[round(s) for s in samples]})")
print(f"plain 1 GiB device copy: {copies[2]:.3f} TB/s read+write (median of 5×20)")
print(json.dumps({"bf16_tflops": samples[2], "copy_tbps": copies[2], "gpu": torch.cuda.get_device_name()}))
EOF

# 3-4. fit
run_step fit_124m "$PY" -m redline fit --preset modern-124m seq_len=2048
HAS_AC=$("$PY" -c 'import dataclasses; from redline.config import TrainConfig; print(int("activation_checkpointing" in {f.name for f in dataclasses.fields(TrainConfig)}))')
AC_ARGS=()
[ "$HAS_AC" = "1" ] && AC_ARGS=(--checkpointing full)
[ "$HAS_AC" = "1" ] || echo "activation checkpointing is not available in this version: gpt2-1.5b is searched without it"
run_step fit_1p5b "$PY" -m redline fit --preset gpt2-1.5b seq_len=1024 ${AC_ARGS[@]+"${AC_ARGS[@]}"}

# 5. fresh-process check of each answer and the grid point above it
verify() {  # verify NAME FIT_LOG ARGS...
    local name="$1" log="$2"; shift 2
    local points
    points=$("$PY" - "$log" <<'EOF'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("{")]
if not lines:
    sys.exit(0)
r = json.loads(lines[-1]); grid, b = r["grid"], r["batch_size"]
if b is not None and b != grid[-1]:
    print(b, grid[grid.index(b) + 1])
EOF
)
    if [ -n "$points" ]; then
        # shellcheck disable=SC2086
        run_step "$name" "$PY" -m redline fit "$@" --grid $points probe_steps=2
    fi
}
if [ "$VERIFY" = "1" ]; then
    verify verify_124m "$OUT/fit_124m.log" --preset modern-124m seq_len=2048
    verify verify_1p5b "$OUT/fit_1p5b.log" --preset gpt2-1.5b seq_len=1024 ${AC_ARGS[@]+"${AC_ARGS[@]}"}
fi

# 6. plan from the measured throughput (eager probe, no compile: a lower bound) and doctor's power draw
grep '^{' "$OUT/fit_124m.log" | tail -n 1 > "$OUT/fit_124m.jsonl"
run_step plan "$PY" -m redline plan --bench-json "$OUT/fit_124m.jsonl" --price-per-gpu-hour "$PRICE" --gpus "$GPUS"

# summary
"$PY" - "$OUT" "$VERIFY" <<'EOF'
import json, sys
from pathlib import Path

out, verify = Path(sys.argv[1]), sys.argv[2] == "1"


def last_json(name):
    p = out / f"{name}.log"
    if not p.exists():
        return None
    lines = [l for l in p.read_text().splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def seconds(name):
    p = out / f"{name}.seconds"
    return round(float(p.read_text()), 1) if p.exists() else None


doctor, ref = last_json("doctor"), last_json("reference")
gpu = (doctor or {}).get("gpus", [{}])[0] if doctor and doctor.get("gpus") else {}
summary = {"script": "doctor_fit", "gpu": gpu.get("name"), "files": str(out)}
checks = {}
if doctor and ref:
    d_gemm, r_gemm = gpu.get("bf16_gemm_tflops"), ref["bf16_tflops"]
    d_copy, r_copy = gpu.get("copy_tbps"), ref["copy_tbps"]
    summary.update(doctor_seconds=seconds("doctor"), doctor_status=doctor.get("status"),
                   doctor_bf16_tflops=d_gemm, reference_bf16_tflops=round(r_gemm, 1),
                   doctor_fp8_tflops=gpu.get("fp8_gemm_tflops"), doctor_copy_tbps=d_copy,
                   reference_copy_tbps=round(r_copy, 3), h2d_pinned_gbps=gpu.get("h2d_pinned_gbps"),
                   power_under_load_w=(gpu.get("nvml_under_load") or {}).get("power_draw_w"),
                   attention_ms={k: v.get("fwd_bwd_ms") for k, v in (gpu.get("attention") or {}).items()})
    checks["doctor_under_60s"] = (seconds("doctor") or 1e9) < 60
    checks["bf16_gemm_within_3pct"] = bool(d_gemm) and abs(d_gemm / r_gemm - 1) <= 0.03
    checks["copy_within_5pct"] = bool(d_copy) and abs(d_copy / r_copy - 1) <= 0.05
for name in ("124m", "1p5b"):
    fit = last_json(f"fit_{name}")
    if not fit:
        checks[f"fit_{name}_ran"] = False
        continue
    level = fit["levels"][0]
    entry = {"batch_size": fit["batch_size"], "checkpointing": fit["activation_checkpointing"],
             "tokens_per_second": fit["tokens_per_second"], "peak_memory_gib": fit["peak_memory_gib"],
             "grad_accum": f"{level['train_batch_size']}×{level['grad_accum']}", "probes": len(level["points"]),
             "seconds": seconds(f"fit_{name}"), "points": [(p["batch_size"], p["status"]) for p in level["points"]]}
    checks[f"fit_{name}_under_120s"] = (entry["seconds"] or 1e9) < 120
    check = last_json(f"verify_{name}") if verify else None
    if check:
        pts = {p["batch_size"]: p["status"] for p in check["levels"][0]["points"]}
        entry["fresh_process"] = pts
        grid = fit["grid"]
        above = grid[grid.index(fit["batch_size"]) + 1]
        checks[f"fit_{name}_true_largest_on_grid"] = pts.get(fit["batch_size"]) == "fits" and pts.get(above) != "fits"
    summary[f"fit_{name}"] = entry
plan = last_json("plan")
if plan:
    summary["plan"] = {"params": plan["params"], "tokens_per_second": plan["tokens_per_second"],
                       "power_watts": plan["power_watts"],
                       "rows": [{k: r[k] for k in ("target", "gpus", "hours", "cost", "energy_kwh")} for r in plan["rows"]]}
summary["checks"] = checks
summary["all_passed"] = bool(checks) and all(checks.values())

print("\n=== summary")
width = max(len(k) for k in checks) if checks else 10
for key in ("doctor_seconds", "doctor_bf16_tflops", "reference_bf16_tflops", "doctor_copy_tbps", "reference_copy_tbps",
            "doctor_fp8_tflops", "h2d_pinned_gbps", "power_under_load_w"):
    if key in summary:
        print(f"  {key:<24} {summary[key]}")
for name in ("fit_124m", "fit_1p5b"):
    if name in summary:
        e = summary[name]
        print(f"  {name:<24} micro-batch {e['batch_size']} ({e['checkpointing']}), {e['tokens_per_second']} tok/s, "
              f"{e['peak_memory_gib']} GiB, {e['probes']} probes in {e['seconds']} s; fresh: {e.get('fresh_process', '-')}")
for key, ok in checks.items():
    print(f"  {'PASS' if ok else 'FAIL'}  {key}")
print(json.dumps(summary))
(out / "summary.json").write_text(json.dumps(summary, indent=2))
EOF
