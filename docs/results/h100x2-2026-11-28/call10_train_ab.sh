# Muon's host cost under DDP: the GPU tests of Muon, then DDP training runs on two GPUs, modern-124m 16 x 1024 a
# .exp/base: the tree before the change, `git archive 1062fab redline | tar -x -C .exp/base`
# rank, 120 steps: the tree before (HEAD, in .exp/base) against the new Muon (one momentum and one update call for
# all stacks, scalars in one copy, Newton-Schulz replayed as CUDA graphs), with graphs off, and AdamW; interleaved
. scripts/gpu/env.sh
D=$OUT; ROOT=$PWD
export PYTHONUNBUFFERED=1 REDLINE_CACHE=/tmp/cache
timeout 240 $PY -m pytest -q -x -m gpu -p no:cacheprovider tests/test_muon.py 2>&1 | tail -n 4 | cut -c1-400
COMMON="--gpus 2 --preset modern-124m --data.path $ROOT/.prepared/corpus max_steps=120 seq_ramp_steps=0 eval_every=0 eval_batches=2 log_every=10 seed=1337 out_dir=/tmp/runs batch_size=16 parallel=ddp"
run() {  # name, tree (new|base), extra settings
  local name=$1 tree=$2; shift 2
  local t0=$(date +%s)
  if [ $tree = base ]; then
    (cd $ROOT/.exp/base && PYTHONPATH=$ROOT/.exp/base:${PYTHONPATH#$ROOT:} timeout 200 $PY -m redline train $COMMON run_name=$name "$@" > $D/$name.log 2>&1)
  else
    timeout 200 $PY -m redline train $COMMON run_name=$name "$@" > $D/$name.log 2>&1
  fi
  echo "$name: rc $? $(( $(date +%s) - t0 )) s | $(grep -E '^step' $D/$name.log | awk -F'|' '{printf "%s%s;", $2, $5}')"
}
run base-muon-1 base
run new-muon-1 new
run adamw-1 new optim.name=adamw
run new-nographs-1 new optim.muon_cuda_graphs=False
run base-muon-2 base
run new-muon-2 new profile_steps=4 profile_from=100
run adamw-2 new optim.name=adamw
$PY docs/results/h100x2-2026-11-28/trace_host_ops.py /tmp/runs/new-muon-2/profile/trace-rank0.json.gz | grep -E "==|Optimizer|forward" 
$PY docs/results/h100x2-2026-11-28/trace_host_ops.py /tmp/runs/new-muon-2/profile/trace-rank1.json.gz | grep -E "==|Optimizer|forward"
grep -h "profile of" $D/new-muon-2.log | cut -c1-250
