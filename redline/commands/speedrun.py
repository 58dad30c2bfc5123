"""`redline speedrun`: time to quality. Trains recipes one after another on the same data and reports how soon
each reached a validation bits per byte.

    redline speedrun --recipes nanogpt default --data DATA max_steps=1000 tokens_per_step=32768
    redline speedrun --recipes nanogpt adamw my_recipe.toml --target 1.10 max_time=10
    redline speedrun --recipes nanogpt fast --data DATA --gpus 2    # both at once, one on each of two GPUs
    redline speedrun --list                          # the named training recipes (redline/recipes/)

Every recipe (a named one or a .toml file, as `redline train --recipe` reads them) trains in its own process,
one after the other or, with --gpus, several at once on GPUs of their own (`redline sweep`'s runner: a crash or an out-of-memory error ends that run only, and
running the same command again skips the runs that finished), with the same data, tokenizer and seed and the
overrides given on this command line (KEY=VALUE, which win over what a recipe sets: tokens_per_step=32768 is
every recipe's batch), and the budget given here (max_steps=1000) for each recipe that names none of its own (a
recipe file with max_steps = 300 trains 300 steps, its learning-rate schedule fitted to them, as a speedrun
record is trained for the steps that reach the target and no more). The data is prepared once,
so every run reads the same tokens and the same validation split; each evaluation covers the same number of
validation tokens (--eval-tokens) whatever a recipe's batch shape.

Time to quality is training time: the trainer's own clock (`max_time`'s, logged with each evaluation), which
leaves out evaluations, checkpoints and every step that compiles (the first; a warm-up's first at each batch
shape), with the GPU waited for at each edge. Runs logged before that clock are timed from their records:
the wall time less the evaluations (the time between the training record logged just before each and its own
record; log_every divides eval_every so that one exists) and less compilation (the first logged window counted
as if it had run at the median speed of the later windows). The time at which a run reached the target
is interpolated linearly between the last evaluation above it and the first at or below it, as are the tokens
and steps. The target is --target, else the first recipe's (the baseline's) final value.

Prints a table, then one JSON line (also written to OUT/speedrun.json); a plot of the curves goes to
OUT/speedrun.png when matplotlib is installed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import tyro

from redline.errors import UserError

DESCRIPTION = "Train recipes on the same data and report the training time each needs to reach a validation bits per byte."


@dataclass
class SpeedrunArgs:
    recipes: list[str] = field(default_factory=lambda: ["nanogpt", "default"])
    """Named training recipes (`redline speedrun --list`) or .toml files; the first is the baseline."""
    data: str | None = None
    """Data for every recipe: prepared shards, or raw text (prepared once, into OUT/data, with one BPE for every
    recipe: 32768 tokens, or data.vocab_size=N). None: the embedded corpus."""
    target: float | None = None
    """Validation bits per byte to reach (None: the baseline's final value)."""
    eval_every: int = 50
    """Evaluate every this many steps (and at the end): the resolution of the curves."""
    eval_tokens: int = 1_048_576
    """Validation tokens per evaluation, the same for every recipe (rounded to whole micro-batches)."""
    seed: int = 1337
    """Seed of every run (the first seed with --seeds)."""
    seeds: int = 1
    """Runs of each recipe, seeds seed, seed + 1, ...: a recipe's time and tokens to the target are the medians of
    its runs (each run's own crossing), and the target, unless given, the median of the baseline's final values."""
    out: str | None = None
    """Output folder (default: speedruns/RECIPE+RECIPE...). Running the same command again resumes it."""
    redo_changed: bool = False
    """Run again the finished runs whose settings changed since (by default that is an error)."""
    plot: bool = True
    """Write OUT/speedrun.png (needs matplotlib)."""
    gpus: int = 1
    """Recipes trained at once, each on a GPU of its own (as `redline sweep --gpus`): 1 trains them one after
    another; N (0: every visible GPU) trains N at once, each timed on its own GPU."""


# ----------------------------------------------------------------------------------------------------
# the clock: training time at each evaluation, from a run's metrics.jsonl


def clocked_evals(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Each evaluation with the training time before it (wall time less evaluations and compilation): the
    trainer's clock where the records carry it ("train_time"), else the wall time less the evaluations and the
    first logged window's excess over the steady step time (runs logged before that clock).

    Returns {"evals": [{step, tokens, train_seconds, bpb, loss, epoch}], "compile_seconds", "eval_seconds",
    "steady_step_seconds", "eval_time_known"}."""
    logs: list[tuple[int, float, float, int]] = []  # (step, elapsed, evaluation seconds before it, tokens)
    evals: list[dict[str, Any]] = []
    paused, known = 0.0, True
    for r in records:
        if r.get("kind") == "train" and _number(r.get("elapsed")) is not None:
            logs.append((r["step"], r["elapsed"], paused, r.get("tokens") or 0))
        elif r.get("kind") == "eval" and logs and _number(r.get("bpb")) is not None:
            step, elapsed, before, tokens = logs[-1]
            if step != r.get("step"):  # no training record right before it: its duration is unknown
                known = False
                continue
            evals.append({"step": step, "tokens": tokens, "elapsed": elapsed, "paused": before,
                          "bpb": r["bpb"], "loss": r.get("loss"), "epoch": _number(r.get("epoch"))})
            paused += max(0.0, r["elapsed"] - elapsed)
    rates = [((e1 - p1) - (e0 - p0)) / (s1 - s0) for (s0, e0, p0, _), (s1, e1, p1, _) in zip(logs, logs[1:]) if s1 > s0]
    steady = median(rates) if rates else None
    compile_seconds = max(0.0, logs[0][1] - steady * logs[0][0]) if logs and steady is not None else 0.0
    clock = {r["step"]: r["train_time"] for r in records
             if r.get("kind") == "eval" and _number(r.get("train_time")) is not None}
    if evals and all(e["step"] in clock for e in evals):
        # the trainer's own clock (max_time's): it leaves out every step that compiles, a warm-up's later batch
        # shapes included, which the first-window estimate below cannot see
        last = evals[-1]
        compile_seconds = max(0.0, last["elapsed"] - last["paused"] - clock[last["step"]])
        for e in evals:
            e.pop("elapsed"), e.pop("paused")
            e["train_seconds"] = clock[e["step"]]
    for e in evals:
        if "train_seconds" not in e:
            e["train_seconds"] = e.pop("elapsed") - e.pop("paused") - compile_seconds
    return {"evals": evals, "compile_seconds": compile_seconds, "eval_seconds": paused,
            "steady_step_seconds": steady, "eval_time_known": known}


def crossing(evals: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """When the curve first reached `target` (bpb at or below it), interpolated from the evaluation before."""
    previous = None
    for e in evals:
        if e["bpb"] <= target:
            if previous is None or previous["bpb"] <= target:
                return {"train_seconds": e["train_seconds"], "tokens": e["tokens"], "step": e["step"],
                        "eval_step": e["step"], "interpolated": False}
            frac = (previous["bpb"] - target) / (previous["bpb"] - e["bpb"])
            at = {k: previous[k] + frac * (e[k] - previous[k]) for k in ("train_seconds", "tokens", "step")}
            return {**at, "eval_step": e["step"], "interpolated": True}
        previous = e
    return None


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


# ----------------------------------------------------------------------------------------------------
# planning: one sweep variant per recipe


def split_overrides(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """KEY=VALUE arguments (overrides for every recipe) apart from the command's own options."""
    from redline.commands.sweep import parse_pairs

    pairs = [a for a in argv if not a.startswith("-") and re.match(r"^[A-Za-z_][\w.-]*=", a)]
    return parse_pairs(pairs, "override"), [a for a in argv if a not in pairs]


def variant_name(recipe: str) -> str:
    name = Path(recipe).stem if Path(recipe).suffix else recipe
    return re.sub(r"[^A-Za-z0-9._+-]", "-", name) or "recipe"


def recipe_variant(name: str, batch: tuple[int, int] | None, precision: str | None):
    """A training recipe as a sweep variant: its preset, batch and precision become the variant's axes."""
    from redline.config import named_recipe
    from redline.experiments.recipes import PRECISIONS, Variant, flatten

    overrides = flatten(named_recipe(name), f"recipe {name}")
    preset = overrides.pop("preset", None)
    if preset is None:
        raise UserError(f"recipe {name} names no preset; add preset = \"...\" to it")
    if "seed" in overrides:
        raise UserError(f"recipe {name} sets seed; every recipe of a speedrun uses --seed")
    own_batch = (overrides.pop("batch_size", 0), overrides.pop("seq_len", 0))
    own_precision = overrides.pop("precision", "auto")
    precision = precision or own_precision
    if precision not in PRECISIONS:
        raise UserError(f"recipe {name}: precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    axes = {"presets": [preset], "batch": [batch or own_batch], "precision": [precision]}
    return Variant(variant_name(name), f"recipe {name}", overrides, axes)


def prepared_data(data: str | None, overrides: dict[str, Any], out_dir: Path) -> Path:
    """One prepared folder for every run: the embedded corpus, a prepared folder, or raw text prepared once."""
    from redline.config import TrainConfig, apply_overrides
    from redline.training.loop import resolve_data

    cfg = TrainConfig()
    apply_overrides(cfg, {k: v for k, v in overrides.items() if k.startswith("data.")})
    cfg.data.path = data
    return resolve_data(cfg, out_dir)


def log_every_for(eval_every: int) -> int:
    """The largest divisor of eval_every up to 10: every evaluation then follows a logged training record."""
    return max(d for d in range(1, min(10, eval_every) + 1) if eval_every % d == 0)


def plan(args: SpeedrunArgs, overrides: dict[str, Any], out_dir: Path):
    from redline.experiments.recipes import Recipe, expand, parse_budget, resolve_train_config

    budget = parse_budget({k: overrides.pop(k) for k in ("max_steps", "max_tokens", "max_time") if k in overrides})
    if not budget:
        raise UserError("give a budget for every recipe, e.g. max_steps=1000 (or max_tokens=N, max_time=MINUTES)")
    for key in ("seed", "preset"):
        if key in overrides:
            raise UserError(f"{key} cannot be overridden here: use --seed, and name the preset in a recipe")
    if "batch_size" in overrides or "seq_len" in overrides:
        batch = (overrides.pop("batch_size", 0), overrides.pop("seq_len", 0))
    else:
        batch = None
    if args.eval_every <= 0 or args.eval_tokens <= 0 or args.seeds <= 0:
        raise UserError("--eval-every, --eval-tokens and --seeds must be positive")
    precision = overrides.pop("precision", None)
    variants = [recipe_variant(name, batch, precision) for name in args.recipes]
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise UserError(f"two recipes share the name {next(n for n in names if names.count(n) > 1)!r}; rename one")
    data = prepared_data(args.data, overrides, out_dir)
    common = {k: v for k, v in overrides.items() if not k.startswith("data.") or k == "data.align_rows"}
    common.update({"eval_every": args.eval_every, "log_every": log_every_for(args.eval_every)})
    for variant in variants:  # the command line wins over what a recipe sets (nanogpt's tokens_per_step, say)
        variant.set.update(common)
    presets = list(dict.fromkeys(v.axes["presets"][0] for v in variants))
    recipe = Recipe(name="speedrun", description="time to quality: " + " vs ".join(names), presets=presets,
                    precision=["auto"], batch=[(0, 0)], seeds=[args.seed + i for i in range(args.seeds)],
                    budget=budget, variants=variants,
                    set=common, data=str(data), baseline={"variant": names[0]})
    for variant in variants:  # the same validation tokens for every recipe, whatever its micro-batch
        probe = expand(Recipe(**{**recipe.__dict__, "variants": [variant]}))[0]
        cfg = resolve_train_config(probe.config_file_contents(out_dir))
        if cfg.batch_size == "auto":
            raise UserError(f"recipe {variant.name}: give a batch_size number; a speedrun sizes its evaluations by it")
        per_batch = cfg.batch_size * cfg.effective_seq_len
        variant.set["eval_batches"] = max(1, round(args.eval_tokens / per_batch))
    return recipe, expand(recipe)


# ----------------------------------------------------------------------------------------------------
# report


def analyse(sweep_dir: Path, names: list[str], target: float | None) -> dict[str, Any]:
    """Each recipe's clocked curves and when they reached the target (given, or the median of the baseline's final
    values). A recipe with several runs (seeds) gets the medians of its runs' times and tokens to the target, a run
    that never reached it counting as infinitely late (so it is reached when more than half of its runs reached
    it); its curve is its first seed's, every run's is under "runs"."""
    from redline.experiments.results import load_result_set

    by_variant: dict[str, list[dict]] = {}
    for r in sorted(load_result_set(sweep_dir).runs, key=lambda r: r.get("seed") or 0):
        by_variant.setdefault(r.get("variant"), []).append(r)
    per_recipe = {name: [_run_row(run) for run in by_variant.get(name) or
                         [{"status": "not run", "variant": name}]] for name in names}
    source = "given"
    if target is None:
        finals = [r["final_bpb"] for r in per_recipe[names[0]] if r["final_bpb"] is not None]
        target = median(finals) if finals else None
        source = f"final value of {names[0]}" + (f" (median of {len(finals)} runs)" if len(finals) > 1 else "")
    rows = []
    for name in names:
        runs = per_recipe[name]
        for run in runs:
            hit = crossing(run["curve"], target) if target is not None else None
            run.update(reached=hit is not None, time_to_target=hit and hit["train_seconds"],
                       tokens_to_target=hit and hit["tokens"], step_to_target=hit and hit["step"])
        rows.append(_recipe_row(name, runs))
    base = rows[0]["time_to_target"]
    for row in rows:
        row["speedup_vs_baseline"] = base / row["time_to_target"] if base and row["time_to_target"] else None
    return {"target_bpb": target, "target_from": source, "baseline": names[0], "recipes": rows}


def _run_row(run: dict[str, Any]) -> dict[str, Any]:
    """One run's record and its clocked curve."""
    from redline.experiments.results import read_jsonl

    clock = clocked_evals(read_jsonl(Path(run["run_dir"]) / "metrics.jsonl")) if run.get("run_dir") else None
    evals = clock["evals"] if clock else []
    return {"seed": run.get("seed"), "preset": run.get("preset"), "status": run.get("status"),
            "error": run.get("error"), "steps": run.get("steps"), "tokens": run.get("tokens"),
            "tokens_per_second": run.get("tokens_per_second"), "final_bpb": evals[-1]["bpb"] if evals else None,
            "train_seconds": evals[-1]["train_seconds"] if evals else None,
            "compile_and_warmup_seconds": clock and clock["compile_seconds"], "eval_seconds": clock and clock["eval_seconds"],
            "eval_time_known": clock and clock["eval_time_known"], "device": run.get("device"),
            "epochs": evals[-1]["epoch"] if evals else None,  # of the training split, as the trainer logs them
            "curve": [{k: e[k] for k in ("step", "tokens", "train_seconds", "bpb")} for e in evals]}


def _recipe_row(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A recipe's row: its one run as it is, or the medians of its runs (status completed only if all are; see
    analyse for the times to the target)."""
    first = runs[0]
    row = {"recipe": name, **{k: v for k, v in first.items() if k != "seed"}}
    if len(runs) > 1:
        def middle(key):
            values = [r[key] for r in runs if r[key] is not None]
            return median(values) if values else None

        failed = [r for r in runs if r["status"] != "completed"]
        row.update({key: middle(key) for key in ("tokens_per_second", "final_bpb", "train_seconds",
                                                 "compile_and_warmup_seconds", "eval_seconds")})
        row["status"] = failed[0]["status"] if failed else "completed"
        row["error"] = next((r["error"] for r in failed if r.get("error")), None)
        row["eval_time_known"] = all(r["eval_time_known"] is not False for r in runs)
        # a run that never reached the target counts as reaching it at infinity: the median is defined (finite)
        # when more than half of the runs reached it
        for key in ("time_to_target", "tokens_to_target", "step_to_target"):
            value = median(r[key] if r["reached"] else math.inf for r in runs)
            row[key] = value if math.isfinite(value) else None
        row["reached"] = row["time_to_target"] is not None
        times = [r["time_to_target"] for r in runs if r["reached"]]
        row["time_to_target_range"] = [min(times), max(times)] if times else None
        row["runs_reached"] = len(times)
    row["runs"] = [{k: r[k] for k in ("seed", "status", "final_bpb", "train_seconds", "reached", "time_to_target",
                                      "tokens_to_target", "step_to_target", "curve")} for r in runs]
    return row


def print_table(result: dict[str, Any], console) -> None:
    from rich.table import Table

    def f(value, spec):
        return "—" if value is None else format(value, spec)

    target = result["target_bpb"]
    title = f"time to validation bpb {f(target, '.4f')} ({result['target_from']})"
    table = Table("recipe", "steps", "tok/s", "final bpb", "train s", "to target s", "to target tokens", "speed-up",
                  title=title)
    for r in result["recipes"]:
        runs = len(r.get("runs") or [])
        if r["reached"]:
            to_target = f(r["time_to_target"], ".1f")
            if runs > 1:  # the median, and the range over the runs
                low, high = r["time_to_target_range"]
                to_target += f" ({low:.1f}-{high:.1f})"
        else:
            to_target = "not reached" + (f" ({r.get('runs_reached', 0)}/{runs} runs)" if runs > 1 else "")
        table.add_row(r["recipe"] + ("" if r["status"] == "completed" else f" ({r['status']})")
                      + (f" ×{runs}" if runs > 1 else ""), f(r["steps"], "d"),
                      f(r["tokens_per_second"], ",.0f"), f(r["final_bpb"], ".4f"), f(r["train_seconds"], ".1f"),
                      to_target, f(r["tokens_to_target"], ",.0f"),
                      f(r["speedup_vs_baseline"], ".2f") + "×" * bool(r["speedup_vs_baseline"]))
    console.print(table)
    read = [f"{r['recipe']} {r['epochs']:.2f}" for r in result["recipes"] if r.get("epochs")]
    if read:  # past one epoch a run sees its data again, and how much sooner a recipe gets there depends on it
        console.print(f"epochs of the training data read: {', '.join(read)}", markup=False)
    for r in result["recipes"]:
        if r.get("error"):
            console.print(f"{r['recipe']}: {r['status']}: {r['error']}", markup=False, soft_wrap=True)
        if r.get("eval_time_known") is False:
            console.print(f"{r['recipe']}: some evaluations followed no logged step; their time was left out of "
                          f"the curve", markup=False)


def plot(result: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (by_time, by_tokens) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in result["recipes"]:
        color = None
        for i, run in enumerate(r.get("runs") or [{"curve": r["curve"]}]):  # every run of a recipe in one colour
            curve = run["curve"]
            if not curve:
                continue
            label = r["recipe"] if i == 0 else None
            line, = by_time.plot([p["train_seconds"] for p in curve], [p["bpb"] for p in curve], marker=".",
                                 label=label, color=color, alpha=1.0 if i == 0 else 0.5)
            color = line.get_color()
            by_tokens.plot([p["tokens"] for p in curve], [p["bpb"] for p in curve], marker=".", label=label,
                           color=color, alpha=1.0 if i == 0 else 0.5)
    for axis, label in ((by_time, "training time, s (no compilation, no evaluation)"), (by_tokens, "training tokens")):
        if result["target_bpb"] is not None:
            axis.axhline(result["target_bpb"], color="grey", linestyle="--", linewidth=1)
        axis.set_xlabel(label)
        axis.set_ylabel("validation bits per byte")
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle(f"redline speedrun: target {result['target_bpb']:.4f} bpb ({result['target_from']})"
                 if result["target_bpb"] is not None else "redline speedrun")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def list_recipes() -> None:
    from rich.console import Console
    from rich.table import Table

    from redline.config import training_recipes

    table = Table("recipe", "what it is")
    for name, summary in training_recipes().items():
        table.add_row(name, summary)
    Console().print(table)


def main(argv: list[str]) -> int:
    from rich.console import Console

    from redline.durable import write_atomic
    from redline.experiments.processes import visible_gpus
    from redline.experiments.sweep import Progress, Sweep

    if "--list" in argv:
        list_recipes()
        return 0
    overrides, rest = split_overrides(argv)
    args = tyro.cli(SpeedrunArgs, args=rest, prog="redline speedrun", description=DESCRIPTION)
    if not args.recipes:
        raise UserError("give at least one recipe, e.g. --recipes nanogpt default")
    gpus = visible_gpus(args.gpus) if args.gpus != 1 else None
    out_dir = Path(args.out or Path("speedruns") / "+".join(variant_name(r) for r in args.recipes))
    out_dir.mkdir(parents=True, exist_ok=True)
    recipe, runs = plan(args, overrides, out_dir)
    console = Console(highlight=False)
    Sweep(recipe, runs, out_dir).execute(redo_changed=args.redo_changed, display=Progress(console), gpus=gpus)
    result = analyse(out_dir, [v.name for v in recipe.variants], args.target)
    result["out"] = str(out_dir.resolve())
    print_table(result, console)
    if args.plot and (png := plot(result, out_dir / "speedrun.png")):
        result["plot"] = str(png.resolve())
        console.print(f"plot: {png}")
    write_atomic(out_dir / "speedrun.json", json.dumps(result, indent=2, default=str))
    print(json.dumps(result, default=str))
    return 0 if all(r["status"] == "completed" for r in result["recipes"]) else 1
