# the split kernel alone under Nsight Compute: Qwen3-0.6B shape, batch 1, width 768, caches flushed between launches
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
D=$OUT
timeout 120 $PY scripts/gpu/decode_attention_bench.py --shapes "qwen3-0.6b b1" --splits 0 64 128 --repeats 20 > $D/bench.txt 2>&1
tail -n 12 $D/bench.txt
timeout 300 /usr/local/cuda/bin/ncu --kernel-name regex:_split_kernel --launch-skip 5 --launch-count 2 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
  --section LaunchStats --section SchedulerStats \
  $PY scripts/gpu/decode_attention_bench.py --shapes "qwen3-0.6b b1" --splits 128 --repeats 2 > $D/ncu.txt 2>&1
grep -v "^==PROF==" $D/ncu.txt | grep -E "Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Stall|Warp Cycles|Block Limit|Dynamic Shared|Static Shared|ERR|Error|One or More|Issued|Eligible|L2 Hit|L1/TEX Hit|Mem Busy|Max Bandwidth|Grid Size|Block Size|Waves" | head -70
