"""Where a profiled step's GPU time goes, per rank: busy vs idle on the compute stream, NCCL kernels, long
host calls, and the largest idle gaps with the CPU op that launched the kernel after each gap.
usage: trace_gaps.py trace-rank0.json.gz [trace-rank1.json.gz ...]"""
import gzip
import json
import sys
from collections import defaultdict


def load(path):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)["traceEvents"]


def union(intervals):
    total, end = 0.0, -1e30
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


for path in sys.argv[1:]:
    ev = [e for e in load(path) if e.get("ph") == "X"]
    kernels = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    runtime = {e["args"].get("correlation"): e for e in ev if e.get("cat") == "cuda_runtime"}
    cpu_ops = sorted([e for e in ev if e.get("cat") in ("cpu_op", "python_function")], key=lambda e: e["ts"])
    steps = sorted([e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("train_step_")],
                   key=lambda e: e["ts"])
    gsteps = sorted([e for e in ev if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("train_step_")],
                    key=lambda e: e["ts"])
    print(f"==== {path}: {len(kernels)} kernels, {len(steps)} steps")
    for s in steps:
        print(f"  host {s['name']}: {s['dur'] / 1e3:.2f} ms")
    for s in gsteps:
        print(f"  gpu  {s['name']}: {s['dur'] / 1e3:.2f} ms")
    if not kernels:
        continue
    t0 = min(k["ts"] for k in kernels)
    t1 = max(k["ts"] + k["dur"] for k in kernels)
    by_stream = defaultdict(list)
    for k in kernels:
        by_stream[k["args"].get("stream")].append(k)
    span = t1 - t0
    print(f"  kernel span {span / 1e3:.2f} ms, busy (any stream) {union([(k['ts'], k['ts'] + k['dur']) for k in kernels]) / 1e3:.2f} ms")
    for st, ks in sorted(by_stream.items(), key=lambda kv: -len(kv[1])):
        nccl = [k for k in ks if "nccl" in k["name"].lower()]
        print(f"  stream {st}: {len(ks)} kernels, busy {union([(k['ts'], k['ts'] + k['dur']) for k in ks]) / 1e3:.2f} ms, "
              f"nccl {len(nccl)} kernels {sum(k['dur'] for k in nccl) / 1e3:.2f} ms")
        for k in nccl[:40]:
            print(f"      +{(k['ts'] - t0) / 1e3:8.2f} ms {k['dur'] / 1e3:7.2f} ms {k['name'][:60]}")
    # compute stream = the one with most kernels; its idle gaps
    main = max(by_stream.values(), key=len)
    main.sort(key=lambda k: k["ts"])
    gaps = []
    for a, b in zip(main, main[1:]):
        g = b["ts"] - (a["ts"] + a["dur"])
        if g > 50:
            gaps.append((g, a, b))
    print(f"  compute-stream gaps > 50 us: {len(gaps)}, total {sum(g for g, _, _ in gaps) / 1e3:.2f} ms")
    for g, a, b in sorted(gaps, key=lambda x: -x[0])[:25]:
        launch = runtime.get(b["args"].get("correlation"))
        op = ""
        if launch:
            encl = [c for c in cpu_ops if c["ts"] <= launch["ts"] <= c["ts"] + c["dur"]]
            op = " < ".join(c["name"][:40] for c in encl[-3:])
            lag = (b["ts"] - launch["ts"]) / 1e3
        else:
            lag = float("nan")
        print(f"    gap {g / 1e3:6.2f} ms at +{(a['ts'] + a['dur'] - t0) / 1e3:8.2f}: after {a['name'][:40]} | "
              f"next {b['name'][:40]} (launched {lag:.2f} ms before it ran) | {op}")
    long_rt = sorted([e for e in runtime.values() if e["dur"] > 500], key=lambda e: -e["dur"])[:15]
    print("  host runtime calls > 0.5 ms:")
    for e in long_rt:
        encl = [c for c in cpu_ops if c["ts"] <= e["ts"] <= c["ts"] + c["dur"]]
        print(f"    {e['name']} {e['dur'] / 1e3:.2f} ms at +{(e['ts'] - t0) / 1e3:.2f} | "
              + " < ".join(c["name"][:40] for c in encl[-4:]))
