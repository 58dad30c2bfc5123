import gzip, json, sys
ev = [e for e in json.load(gzip.open(sys.argv[1], "rt"))["traceEvents"] if e.get("ph") == "X"]
steps = sorted([e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("train_step_")], key=lambda e: e["ts"])
cpu = sorted([e for e in ev if e.get("cat") in ("cpu_op", "user_annotation") and not e["name"].startswith("train_step_")], key=lambda e: (e["ts"], -e["dur"]))
for s in steps[1:3]:
    s0, s1 = s["ts"], s["ts"] + s["dur"]
    print("==", s["name"], round(s["dur"]/1e3, 2))
    end = -1
    for e in cpu:
        if e["ts"] < s0 or e["ts"] > s1: continue
        if e["ts"] < end: continue  # nested
        end = e["ts"] + e["dur"]
        if e["dur"] > 150: print(f"  +{(e['ts']-s0)/1e3:7.2f} {e['dur']/1e3:7.2f} ms {e['name'][:90]}")
