"""Where a batch-1 decode step's time goes when its kernels overlap (programmatic dependent launch): for each kernel
of a `bench-infer --profile` trace, by name and grid, the median time from the previous kernel's end to its own
end (what it adds to the step), its duration, and its start relative to the previous kernel's end (negative: it
started early and waited).

    python increments.py trace-b1.json.gz
"""
import collections
import gzip
import json
import statistics
import sys

events = [e for e in json.load(gzip.open(sys.argv[1]))["traceEvents"] if e.get("cat") == "kernel"]
events.sort(key=lambda e: e["ts"])
adds, durations, starts = (collections.defaultdict(list) for _ in range(3))
for before, e in zip(events, events[1:]):
    key = (e["name"][:30], tuple(e.get("args", {}).get("grid", [])))
    end_before = before["ts"] + before["dur"]
    adds[key].append(e["ts"] + e["dur"] - end_before)
    durations[key].append(e["dur"])
    starts[key].append(e["ts"] - end_before)
for key in sorted(adds, key=lambda k: -sum(adds[k])):
    if len(adds[key]) >= 50:
        print(f"{key[0]:32s} grid {str(key[1]):14s} {len(adds[key]):6d}x  adds {statistics.median(adds[key]):6.2f} µs  "
              f"lasts {statistics.median(durations[key]):6.2f}  starts {statistics.median(starts[key]):+6.2f}")
