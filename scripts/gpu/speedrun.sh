#!/usr/bin/env bash
# Time to quality on one GPU (issue 26): the `nanogpt` recipe trained for STEPS steps of 32,768 tokens sets the
# target (its final validation bits per byte; with SEEDS, the median of its runs'), then the `default` recipe (the
# modern presets' defaults) and the `fast` recipe (TIMED) are timed to that target, in the same call, on the same
# prepared data, tokenizer, seed and validation tokens.
#
#     scripts/gpu/speedrun.sh CORPUS_DIR [STEPS]        # STEPS: the nanogpt run's steps (default 1000)
#
# CORPUS_DIR: a folder made by `redline data prepare`, or raw text: *.jsonl[.xz|.gz] / *.txt / *.parquet files,
# those named val* becoming the validation split (else 2% of the documents). Raw text is prepared once into
# $OUT/corpus with a 32,768-token byte-level BPE trained on it (VOCAB=...).
#
# The fast recipe is a warmup-stable-decay run: its learning rate is cooled to zero at the end of its own budget,
# so it is trained at two step counts, each a recipe file of its own (fast-300.toml = redline/recipes/fast.toml
# with max_steps = 300): 30% of STEPS, then 22% if that reached the target, else 45% (FAST_STEPS="N M ..." gives
# them instead). So is each recipe of TIMED. The fastest run that reaches the target is the verdict's. nanogpt trains at 32 × 1024 (one
# micro-batch a step, as fast's). Timings exclude compilation and evaluation (the trainer's clock); see
# redline/commands/speedrun.py.
#
# Environment:
# - SEEDS (1): runs of each recipe, seeds SEED, SEED + 1, ...; times to the target are their medians.
# - SEED (1337): the first seed (another call's seeds: SEED=1338).
# - GPUS (1): runs at once, each on a GPU of its own (0: every GPU).
# - TIMED ("default fast"): the named recipes (redline/recipes/NAME.toml) timed at those budgets (the modern
#   presets' defaults are a warmup-stable-decay run too); the first is the verdict's headline.
# - FAST_STEPS ("auto", or step counts).
# - EXTRA_RECIPES: more recipes timed to the same target, e.g. "default muon", or recipe files; each a STEPS-step
#   run unless its file sets max_steps.
# - TOKENS_PER_STEP (32768), EVAL_EVERY (25 steps), EVAL_TOKENS (262144 validation tokens per evaluation), VOCAB
#   (32768), TOKENIZER_BYTES (the BPE is trained on the first 25 MB of text).
# - LIMIT (540): the call's wall-time budget in seconds; a recipe after nanogpt starts only if it fits, estimated
#   as 60 s + the nanogpt run's wall time scaled by its steps.
# - OUT (default: a temporary folder).
# - CPU=1: the plumbing on a CPU in a few minutes: every recipe at 6 layers × 64 wide (the fast recipe's 3 value
#   embeddings need 5), 4 × 64 tokens a step (the sequence-length warm-up from rows of 16), a 512-token BPE, no
#   compilation (STEPS defaults to 40 there).
#
# Prints the speedrun's table after each recipe, then one JSON line last: each recipe's time to the target
# (training seconds, compilation and evaluation excluded), tokens to the target, the ratio of the nanogpt
# recipe's time to each timed recipe's best budget (`timed`), and, for the first of them (`ratio`),
# three_times_met (that ratio >= 3).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
source scripts/gpu/corpus.sh
corpus_argument "scripts/gpu/speedrun.sh CORPUS_DIR [STEPS]" "${1:-}"
CPU="${CPU:-0}"
if [ "$CPU" = 1 ]; then DEFAULT_STEPS=40; else DEFAULT_STEPS=1000; fi
STEPS="${2:-$DEFAULT_STEPS}"
FAST_STEPS="${FAST_STEPS:-auto}"
TIMED="${TIMED:-default fast}"
EXTRA_RECIPES="${EXTRA_RECIPES:-}"
TOKENS_PER_STEP="${TOKENS_PER_STEP:-32768}"
EVAL_EVERY="${EVAL_EVERY:-25}"
EVAL_TOKENS="${EVAL_TOKENS:-262144}"
VOCAB="${VOCAB:-32768}"
TOKENIZER_BYTES="${TOKENIZER_BYTES:-25000000}"
LIMIT="${LIMIT:-540}"
SEEDS="${SEEDS:-1}"
SEED="${SEED:-1337}"
GPUS="${GPUS:-1}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 REDLINE_CACHE="${REDLINE_CACHE:-$OUT/cache}"
SETTINGS=("max_steps=$STEPS" "tokens_per_step=$TOKENS_PER_STEP")
if [ "$CPU" = 1 ]; then
    [ "$VOCAB" = 32768 ] && VOCAB=512
    [ "$TOKENS_PER_STEP" = 32768 ] && TOKENS_PER_STEP=256
    [ "$EVAL_TOKENS" = 262144 ] && EVAL_TOKENS=1024
    [ "$EVAL_EVERY" = 25 ] && EVAL_EVERY=10
    SETTINGS=("max_steps=$STEPS" "tokens_per_step=$TOKENS_PER_STEP" device=cpu compile=false batch_size=4 seq_len=64
              seq_ramp_start=16 model.n_layer=6 model.n_embd=64 model.n_head=4 model.n_kv_head=2)
    CHECK='import torch, tyro, rich'
else
    CHECK='import torch, tyro, rich; assert torch.cuda.is_available(), "no CUDA GPU visible"'
fi
if ! "$PY" -c "$CHECK" 2>"$OUT/import_error.txt"; then
    echo "speedrun.sh: this Python cannot run it: $(tail -n 1 "$OUT/import_error.txt") (set PYTHON=, or CPU=1)" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || true
echo "files: $OUT"
start=$(date +%s)

# -- the data: prepared once, shared by every recipe --------------------------------------------------------
prepare_corpus "$CORPUS" "$OUT" || exit $?
prepare_seconds=$(( $(date +%s) - start ))

# -- the recipes: nanogpt first (the target), then fast at each budget, then the extras ---------------------
SPEEDRUN="$OUT/speedrun"
done_recipes=()
skipped=()
baseline_seconds=0

# run_recipe FILE STEPS: add FILE to the speedrun (the finished runs are kept) if its estimate fits in LIMIT
run_recipe() {
    local r="$1" n="$2" name elapsed estimate phase_start
    name="$(basename "$r" .toml)"
    elapsed=$(( $(date +%s) - start ))
    estimate=$(( 60 + baseline_seconds * n / STEPS ))
    if [ ${#done_recipes[@]} -gt 0 ] && [ $(( elapsed + estimate )) -gt "$LIMIT" ]; then
        echo "== $name: skipped, about ${estimate} s would end past LIMIT=${LIMIT} s (${elapsed} s in)"
        skipped+=("$name")
        return 1
    fi
    done_recipes+=("$r")
    echo "== $name ($n steps, ${elapsed} s in)"
    phase_start=$(date +%s)
    "$PY" -m redline speedrun --recipes "${done_recipes[@]}" --data "$DATA" --out "$SPEEDRUN" --seed "$SEED" --seeds "$SEEDS" \
        --gpus "$GPUS" --eval-every "$EVAL_EVERY" --eval-tokens "$EVAL_TOKENS" --no-plot "${SETTINGS[@]}" \
        > "$OUT/speedrun-$name.log" 2>&1
    grep -v '^{' "$OUT/speedrun-$name.log" | tail -n 14
    [ ${#done_recipes[@]} -eq 1 ] && baseline_seconds=$(( $(date +%s) - phase_start ))
    return 0
}

# budget_recipe NAME N: redline/recipes/NAME.toml with max_steps = N (its schedule cooled at the end of them), as
# a file
budget_recipe() {
    { echo "max_steps = $2   # the $1 recipe trained for $2 steps, its schedule cooled at the end of them"
      cat "redline/recipes/$1.toml"; } > "$OUT/$1-$2.toml"
    echo "$OUT/$1-$2.toml"
}

# reached NAME: whether that recipe reached the target in the speedrun so far
reached() {
    "$PY" -c 'import json, sys; rows = {r["recipe"]: r for r in json.load(open(sys.argv[1]))["recipes"]}
sys.exit(0 if rows.get(sys.argv[2], {}).get("reached") else 1)' "$SPEEDRUN/speedrun.json" "$1" 2>/dev/null
}

# nanogpt at 32 × 1024 (one micro-batch of 32,768 tokens a step, as fast): the recipe's own 16 × 1024
# would accumulate two micro-batches a step, a slower step for the same training
{ echo "batch_size = 32   # one micro-batch a step"; cat redline/recipes/nanogpt.toml; } > "$OUT/nanogpt.toml"
run_recipe "$OUT/nanogpt.toml" "$STEPS"
for timed in $TIMED; do
    if [ "$FAST_STEPS" = auto ]; then
        # 30% of the baseline's steps first; then 22% if that reached the target (is less enough?), else 45%
        first=$(( STEPS * 30 / 100 ))
        run_recipe "$(budget_recipe "$timed" "$first")" "$first" && {
            if reached "$timed-$first"; then second=$(( STEPS * 22 / 100 )); else second=$(( STEPS * 45 / 100 )); fi
            run_recipe "$(budget_recipe "$timed" "$second")" "$second"
        }
    else
        for n in $FAST_STEPS; do run_recipe "$(budget_recipe "$timed" "$n")" "$n"; done
    fi
done
for r in $EXTRA_RECIPES; do  # a recipe file's own max_steps (as fast-N.toml's) is its budget, else STEPS
    n=$( [ -f "$r" ] && sed -n 's/^max_steps *= *\([0-9]*\).*/\1/p' "$r" | head -n 1 )
    run_recipe "$r" "${n:-$STEPS}"
done
wall=$(( $(date +%s) - start ))

"$PY" - "$SPEEDRUN/speedrun.json" "$STEPS" "$TOKENS_PER_STEP" "$wall" "$prepare_seconds" "${skipped[*]:-}" "$TIMED" <<'EOF'
import json, sys

path, steps, tokens_per_step, wall, prepare, skipped, timed = sys.argv[1:8]
try:
    result = json.load(open(path))
except (OSError, ValueError) as e:
    print(json.dumps({"script": "speedrun", "error": f"no speedrun result ({e})", "wall_seconds": int(wall)}))
    sys.exit(1)
rows = {r["recipe"]: r for r in result["recipes"]}
base = rows.get("nanogpt", {})
base_time = base.get("time_to_target")


def verdict_of(name):
    """The fastest of NAME's budgets (NAME-300, ...) that reached the target, and its ratios to nanogpt's."""
    reached = {n: r for n, r in rows.items()
               if n.startswith(name + "-") and r.get("reached") and r.get("time_to_target")}
    best = min(reached, key=lambda n: reached[n]["time_to_target"]) if reached else None
    ratio = base_time / reached[best]["time_to_target"] if best and base_time else None
    tokens = base.get("tokens_to_target")
    return {"best": best, "seconds": best and reached[best]["time_to_target"], "ratio": ratio,
            "tokens_ratio": tokens / reached[best]["tokens_to_target"] if best and tokens else None,
            "three_times_met": bool(ratio is not None and ratio >= 3.0)}


timed_verdicts = {name: verdict_of(name) for name in timed.split()}
first = timed_verdicts[timed.split()[0]]  # the verdict's headline: the first of TIMED
keys = ("status", "steps", "final_bpb", "reached", "time_to_target", "tokens_to_target", "step_to_target",
        "train_seconds", "tokens_per_second", "compile_and_warmup_seconds", "eval_seconds", "speedup_vs_baseline",
        "error")
verdict = {
    "script": "speedrun", "device": base.get("device"), "steps": int(steps), "tokens_per_step": int(tokens_per_step),
    "target_bpb": result.get("target_bpb"), "target_from": result.get("target_from"),
    "recipes": {n: {k: r.get(k) for k in keys} for n, r in rows.items()},
    "baseline_seconds": base_time, "timed_recipe": timed.split()[0], "best": first["best"],
    "seconds": first["seconds"], "ratio": first["ratio"], "tokens_ratio": first["tokens_ratio"],
    "three_times_met": first["three_times_met"], "timed": timed_verdicts,
    "skipped_for_time": skipped.split() if skipped else [], "prepare_seconds": int(prepare), "wall_seconds": int(wall),
    "out": result.get("out"),
}
for n, r in rows.items():
    t = r.get("time_to_target")
    print(f"{n:<12} final bpb {r.get('final_bpb') or float('nan'):.4f}  to target: "
          + (f"{t:.1f} s, {r['tokens_to_target']:,.0f} tokens" if r.get("reached") else "not reached"))
for name, v in timed_verdicts.items():
    print(f"nanogpt / {name} time to target: {v['ratio']:.2f}× ({v['best']})" if v["ratio"]
          else f"nanogpt / {name}: the {name} recipe did not reach the target")
print(json.dumps(verdict, default=str))
EOF
