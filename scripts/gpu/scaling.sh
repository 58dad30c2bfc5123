#!/usr/bin/env bash
# Multi-GPU scaling on one node through torchrun: `redline bench --gpus` (DDP modern-124m at T=2048, tokens/s,
# efficiency, communication share, plot), DDP modern-124m training at T=2048 on 1, 2, 4 GPUs (fixed per-GPU
# batch), FSDP2 modern-1.5b on 2 and 4 GPUs, and a resume of the 4-GPU DDP run on 2 and then 1 GPU.
#
#     scripts/gpu/scaling.sh DATA_DIR ["1 2 4"]        # files under $OUT (default: a temporary folder)
set -uo pipefail
cd "$(dirname "$0")/../.."
DATA="${1:?usage: scaling.sh DATA_DIR [\"1 2 4\"]}"
SIZES="${2:-1 2 4}"
PY="${PYTHON:-python3}"
OUT="${OUT:-$(mktemp -d)}"
RUNS="${RUNS:-/tmp/redline-scaling}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 REDLINE_CACHE="${REDLINE_CACHE:-$RUNS/cache}"
env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)=' || true
nvidia-smi topo -m 2>/dev/null | head -8 || true
# AdamW and no warm-up of the rows, as BENCHMARKS.md's figures were measured (the modern presets default to Muon)
common=(--data.path "$DATA" eval_every=0 eval_batches=2 sample_tokens=0 log_every=10 out_dir="$RUNS" tensorboard=False
        optim.name=adamw seq_ramp_steps=0)
train() {  # train NPROC NAME ARGS...
    local n="$1" name="$2"; shift 2
    echo "=== $name on $n GPU(s)"
    "$PY" -m torch.distributed.run --standalone --nproc_per_node="$n" -m redline train run_name="$name" \
        "${common[@]}" "$@" 2>&1 | tee "$OUT/$name.log" | grep -E "^(step|eval|redline|resumed)" | tail -n 4
}
# the scaling benchmark: each world size under torchrun in its own processes; JSON line and plot into $OUT
echo "=== redline bench --gpus $(echo $SIZES | tr ' ' ',')"
"$PY" -m redline bench --preset modern-124m batch_size=16 seq_len=2048 optim.name=adamw --gpus "$(echo $SIZES | tr ' ' ',')" \
    out_dir="$RUNS" --json-out "$OUT/bench-scaling.jsonl" --plot "$OUT/bench-scaling.png" 2>&1 \
    | tee "$OUT/bench-scaling.log" | grep -v '^{'
# FSDP2 at 1.5B: no activation checkpointing (it fits a 141 GB H200 at 8 × 2048 per GPU; on an 80 GB GPU add
# activation_checkpointing=selective, which recomputes half the blocks: about 8% of the model FLOPs MFU does not count)
if [ "$(echo $SIZES | awk '{print $NF}')" -ge 2 ]; then
    echo "=== redline bench --gpus (FSDP2, modern-1.5b)"
    "$PY" -m redline bench --preset modern-1.5b batch_size=8 seq_len=2048 parallel=fsdp2 warmup=4 steps=8 optim.name=adamw \
        --gpus "$(echo $SIZES | tr ' ' '\n' | awk '$1 >= 2' | paste -sd,)" out_dir="$RUNS" \
        --json-out "$OUT/bench-scaling-fsdp2.jsonl" --plot "$OUT/bench-scaling-fsdp2.png" 2>&1 \
        | tee "$OUT/bench-scaling-fsdp2.log" | grep -v '^{'
fi
for n in $SIZES; do
    train "$n" "ddp-124m-$n" --preset modern-124m batch_size=16 seq_len=2048 max_steps=50 parallel=ddp
done
for n in $SIZES; do
    [ "$n" -ge 2 ] || continue
    train "$n" "fsdp2-1.5b-$n" --preset modern-1.5b batch_size=8 seq_len=2048 max_steps=30 parallel=fsdp2
done
# a constant-LR run on the most GPUs for 30 steps, resumed on half as many (gradient accumulation keeps the
# global batch), then on 1 GPU: the loss curve must go on without a jump
biggest=$(echo $SIZES | awk '{print $NF}')
if [ "$biggest" -ge 2 ]; then
    chain=(--preset modern-124m batch_size=16 seq_len=2048 tokens_per_step=$((biggest * 16 * 2048)) compile=False
           optim.schedule=constant optim.warmup_steps=10)
    train "$biggest" resume-124m "${chain[@]}" max_steps=30
    train $((biggest / 2)) resume-124m --resume max_steps=40
    train 1 resume-124m --resume max_steps=50
fi
"$PY" - "$RUNS" "$SIZES" "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
root, sizes, out = Path(sys.argv[1]), [int(s) for s in sys.argv[2].split()], Path(sys.argv[3])
def windows(run):
    recs = [json.loads(l) for l in (root / run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == "train" and "tokens_per_second" in r]
rows, base = [], None
for kind, sizes_k in (("ddp-124m", sizes), ("fsdp2-1.5b", [s for s in sizes if s >= 2])):
    for n in sizes_k:
        try:
            logs = windows(f"{kind}-{n}")[2:]  # the first windows include compilation
        except FileNotFoundError:
            rows.append({"run": f"{kind}-{n}", "gpus": n, "status": "failed"}); continue
        tps = statistics.median(r["tokens_per_second"] for r in logs)
        mfu = statistics.median(r.get("mfu", 0) for r in logs)
        row = {"run": f"{kind}-{n}", "gpus": n, "tokens_per_second": round(tps), "per_gpu": round(tps / n),
               "mfu_per_gpu": round(mfu, 4), "peak_memory_gib": round(max(r["peak_memory_gib"] for r in logs), 1)}
        if kind == "ddp-124m":
            base = base or (tps if n == 1 else None)
            row["efficiency_vs_1"] = round(tps / (n * base), 4) if base else None
        rows.append(row)
resume = {}
if (root / "resume-124m").exists():
    recs = [json.loads(l) for l in (root / "resume-124m" / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in recs if r["kind"] == "train"}
    resume = {s: round(losses[s], 4) for s in sorted(losses) if s >= 21}
for r in rows:
    print("  ".join(f"{k}={v}" for k, v in r.items()))
print("resume losses (steps 21-50; most GPUs to 30, then half as many to 40, then 1 to 50):", resume)
bench = []
if (out / "bench-scaling.jsonl").exists():
    report = json.loads((out / "bench-scaling.jsonl").read_text().strip().splitlines()[-1])
    bench = [{k: p.get(k) for k in ("gpus", "status", "tokens_per_second", "tokens_per_second_per_gpu",
                                    "scaling_efficiency", "mfu", "comm_share", "comm_exposed_share", "peak_memory_gib")}
             for p in report["points"]]
    for b in bench:
        print("bench", "  ".join(f"{k}={v}" for k, v in b.items()))
print(json.dumps({"script": "scaling.sh", "rows": rows, "resume_losses": resume, "bench_scaling": bench}))
PY
