# DDP on two GPUs, modern-124m 16 x 1024 a rank: Muon and AdamW training runs, steps 41-44 profiled on each rank;
# the traces read for idle gaps, collectives and host waits
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1 REDLINE_CACHE=/tmp/cache
nvidia-smi --query-gpu=index,name,clocks.sm --format=csv
COMMON="--gpus 2 --preset modern-124m --data.path .prepared/corpus max_steps=60 seq_ramp_steps=0 eval_every=0 eval_batches=2 log_every=10 seed=1337 out_dir=/tmp/runs batch_size=16 parallel=ddp profile_steps=4 profile_from=40"
for opt in muon adamw; do
  t0=$(date +%s)
  timeout 200 $PY -m redline train $COMMON run_name=ddp-$opt optim.name=$opt > $D/ddp-$opt.log 2>&1 &
  P=$!; sleep 45; nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv; wait $P
  echo "ddp-$opt: rc $? $(( $(date +%s) - t0 )) s"
  grep -E "^step|profile" $D/ddp-$opt.log | cut -c1-250
  $PY docs/results/h100x2-2026-11-28/trace_gaps.py /tmp/runs/ddp-$opt/profile/trace-rank0.json.gz /tmp/runs/ddp-$opt/profile/trace-rank1.json.gz > $D/gaps-$opt.txt 2>&1
  head -c 6000 $D/gaps-$opt.txt
  cp /tmp/runs/ddp-$opt/profile/trace-rank0.json.gz $D/trace-$opt-rank0.json.gz
  cp /tmp/runs/ddp-$opt/profile/trace-rank1.json.gz $D/trace-$opt-rank1.json.gz
done
ls -la $D
