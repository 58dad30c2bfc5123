"""Carry the levers sweep's seed-1 and seed-2 records (docs/results/h100x4-2026-11-26-levers/results.json) into a
sweep directory on this machine: their fingerprints are recomputed for this machine's data path (the recipe
entries are the same; only where the prepared corpus lies differs)."""
import json, sys, os
from redline.experiments.recipes import load_recipe, expand
data, out = sys.argv[1], sys.argv[2]
recipe = load_recipe("levers")
fp = {r.run_id: r.fingerprint(recipe.command) for r in expand(recipe, data=data)}
recs = [json.loads(l) for l in open(os.path.join(os.path.dirname(__file__), "levers_prev.jsonl"))]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "results.jsonl"), "w") as f:
    for r in recs:
        r["fingerprint"] = fp[r["run_id"]]
        f.write(json.dumps(r) + "\n")
print(f"{len(recs)} records carried; {len(fp)} runs planned; {len(set(fp) - {r['run_id'] for r in recs})} to run")
