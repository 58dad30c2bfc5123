# modern-124m, 16 x 1024 a GPU: the step under DDP at 1 and 2 GPUs with Muon (profiled), and with AdamW at 2
. scripts/gpu/env.sh
D=$OUT
export PYTHONUNBUFFERED=1 REDLINE_CACHE=$D/cache
B="--preset modern-124m batch_size=16 seq_len=1024 seq_ramp_steps=0 warmup=10 steps=30"
timeout 250 $PY -m redline bench $B --gpus 2 --profile profile_steps=3 > $D/muon.log 2>&1; echo "muon rc $?"
grep -v '^{' $D/muon.log | tail -n 8
grep '^{' $D/muon.log | $PY -c '
import json, sys
for p in json.loads(sys.stdin.read())["points"]:
    pr = p.get("profile") or {}
    print(p["world_size"], "step ms", round(p["step_ms_median"], 2), "min", round(p["step_ms_min"], 2), "max", round(p["step_ms_max"], 2),
          "comm", p.get("communication", {}).get("collectives_rank0"), "groups", {k: round(v, 2) for k, v in pr.get("groups_ms_per_step", {}).items()})
    for t in pr.get("top", [])[:12]: print("   ", t["name"][:70], round(t["ms_per_step"], 3), t["calls_per_step"])
'
