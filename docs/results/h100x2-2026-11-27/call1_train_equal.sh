# Two GPUs: training with Muon (the modern presets' default) under DDP and FSDP2 against one GPU, the same global
# batch (32 x 1024 tokens a step), data, seed and steps; then each run's last losses and the final validation bpb.
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1 REDLINE_CACHE=$D/cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
COMMON="--preset modern-124m --data.path .prepared/corpus max_steps=80 seq_ramp_steps=0 eval_every=0 eval_batches=16 log_every=10 seed=1337 out_dir=$D/runs"
t0=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 170 $PY -m redline train $COMMON run_name=one batch_size=32 > $D/one.log 2>&1; echo "one: rc $? $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 170 $PY -m redline train --gpus 2 $COMMON run_name=ddp batch_size=16 parallel=ddp > $D/ddp.log 2>&1; echo "ddp: rc $? $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 170 $PY -m redline train --gpus 2 $COMMON run_name=fsdp2 batch_size=16 parallel=fsdp2 > $D/fsdp2.log 2>&1; echo "fsdp2: rc $? $(( $(date +%s) - t0 )) s"
for r in one ddp fsdp2; do
  echo "== $r"; grep -v '^{' $D/$r.log | grep -i -E "step +[0-9]+|val|error|Error|tok/s" | tail -n 12
done
$PY - $D/runs <<'PY'
import json, sys, pathlib
for name in ("one", "ddp", "fsdp2"):
    f = pathlib.Path(sys.argv[1]) / name / "metrics.jsonl"
    if not f.exists():
        print(name, "no metrics"); continue
    rows = [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    print(name, "loss at", [(r["step"], round(r["loss"], 4)) for r in train if r["step"] in (1, 10, 40, 80)],
          "last eval", {k: round(v, 4) for k, v in (evals[-1] if evals else {}).items() if k in ("step", "loss", "bpb")},
          "tok/s", [round(r.get("tokens_per_second", 0)) for r in train[-3:]], "step s", [round(r.get("step_time") or 0, 4) for r in train[-3:]])
PY
