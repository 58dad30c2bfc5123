#!/usr/bin/env bash
# FP8 on several GPUs of one node, and sharded checkpoints across world sizes (written for 2 GPUs):
#   1. `redline bench --gpus N`, FSDP2 modern-1.5b at 8 × 2048 per GPU: BF16 against fp8=all (tensorwise, so
#      FSDP2 all-gathers the FP8 layers' weights in FP8, scales precomputed after each optimizer step);
#   2. a training chain on the corpus with fp8=all (5 BF16 warm-up steps), constant learning rate:
#      steps 1-20 FSDP2 on N GPUs (a sharded checkpoint), 21-30 on 1 GPU (read whole from the shards),
#      31-40 DDP on N GPUs; the loss must go on without a jump at 20 and 30.
#
#     scripts/gpu/fp8_parallel.sh DATA_DIR [N]      # files under $OUT (default: a temporary folder)
set -uo pipefail
cd "$(dirname "$0")/../.."
DATA="${1:?usage: fp8_parallel.sh DATA_DIR [N]}"
N="${2:-2}"
PY="${PYTHON:-python3}"
OUT="${OUT:-$(mktemp -d)}"
RUNS="${RUNS:-/tmp/redline-fp8-parallel}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 REDLINE_CACHE="${REDLINE_CACHE:-$RUNS/cache}"
env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)=' || true
# AdamW and no warm-up of the rows, as BENCHMARKS.md's figures were measured (the modern presets default to Muon)
for fp8 in off all; do
    echo "=== redline bench --gpus $N: FSDP2 modern-1.5b fp8=$fp8"
    "$PY" -m redline bench --preset modern-1.5b batch_size=8 seq_len=2048 parallel=fsdp2 fp8=$fp8 warmup=4 steps=8 \
        optim.name=adamw \
        --gpus "$N" out_dir="$RUNS" --json-out "$OUT/bench-fsdp2-fp8.jsonl" 2>&1 \
        | tee "$OUT/bench-fsdp2-fp8-$fp8.log" | grep -v '^{' | tail -n 8
done
common=(--data.path "$DATA" --preset modern-124m batch_size=16 seq_len=1024 tokens_per_step=$((N * 16 * 1024))
        fp8=all fp8_warmup_steps=5 compile=False optim.schedule=constant optim.warmup_steps=5 eval_every=0
        eval_batches=2 sample_tokens=0 log_every=1 checkpoint_every=10 out_dir="$RUNS" run_name=fp8-chain
        tensorboard=False optim.name=adamw seq_ramp_steps=0)
chain() {  # chain NPROC PARALLEL MAX_STEPS [--resume]
    echo "=== fp8-chain: $1 GPU(s), parallel=$2, to step $3"
    "$PY" -m torch.distributed.run --standalone --nproc_per_node="$1" -m redline train "${common[@]}" \
        parallel="$2" max_steps="$3" "${@:4}" 2>&1 | tee -a "$OUT/fp8-chain.log" | grep -E "^(redline|resumed)|rror" | tail -n 3
}
chain "$N" fsdp2 20
ls "$RUNS/fp8-chain/checkpoints/"*/ "$RUNS/fp8-chain/checkpoints/"*/dcp 2>/dev/null | head -20
chain 1 ddp 30 --resume
chain "$N" ddp 40 --resume
"$PY" - "$RUNS" "$OUT" <<'PY'
import json, sys
from pathlib import Path
root, out = Path(sys.argv[1]), Path(sys.argv[2])
recs = [json.loads(l) for l in (root / "fp8-chain" / "metrics.jsonl").read_text().splitlines()]
losses = {r["step"]: round(r["loss"], 4) for r in recs if r["kind"] == "train"}
events = [{k: r.get(k) for k in ("step", "event", "path")} for r in recs if r["kind"] == "event"]
meta = {}
for ck in sorted((root / "fp8-chain" / "checkpoints").iterdir()):
    m = json.loads((ck / "meta.json").read_text())
    meta[ck.name] = {"format": m.get("format"), "layout": m.get("layout"), "files": len(m.get("sha256", {}))}
bench = []
if (out / "bench-fsdp2-fp8.jsonl").exists():
    for line in (out / "bench-fsdp2-fp8.jsonl").read_text().splitlines():
        rep = json.loads(line)
        for p in rep.get("points", []):
            bench.append({k: p.get(k) for k in ("gpus", "status", "fp8", "tokens_per_second", "tokens_per_second_per_gpu",
                                                "mfu", "comm_share", "comm_exposed_share", "peak_memory_gib")})
for b in bench:
    print("bench", "  ".join(f"{k}={v}" for k, v in b.items()))
print("losses:", losses)
print("checkpoints:", meta)
print(json.dumps({"script": "fp8_parallel.sh", "bench": bench, "losses": losses, "checkpoints": meta}))
PY
