# Two GPUs, DDP, modern-124m, 16 x 1024 a rank: Muon (the default) against AdamW over 150 steps, with the GPUs'
# clocks, power and temperature sampled every 2 s (does the step slow down over a run, and is it Muon's?)
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1 REDLINE_CACHE=$D/cache
nvidia-smi --query-gpu=index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 2 > $D/smi.csv 2>&1 &
SMI=$!
COMMON="--gpus 2 --preset modern-124m --data.path .prepared/corpus max_steps=150 seq_ramp_steps=0 eval_every=0 eval_batches=4 log_every=10 seed=1337 out_dir=$D/runs batch_size=16 parallel=ddp"
for opt in muon adamw; do
  t0=$(date +%s)
  timeout 200 $PY -m redline train $COMMON run_name=ddp-$opt optim.name=$opt > $D/ddp-$opt.log 2>&1; echo "ddp-$opt: rc $? $(( $(date +%s) - t0 )) s"
  grep -E "^step" $D/ddp-$opt.log | awk -F'|' '{print $1 $5}' | tr '\n' ';'; echo
done
kill $SMI
awk -F', ' 'NR>1 {print $1, $2, $4, $5, $6}' $D/smi.csv | sort -k1,1 -s | awk '{a[$1]=a[$1]" "$2"/"$3} END {for (k in a) print k": "substr(a[k],1,900)}'
