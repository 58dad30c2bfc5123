"""`redline sweep RECIPE`: run a matrix of training runs, one subprocess each, resumably.

    redline sweep --list                              # the built-in recipes
    redline sweep smoke                               # a few tiny runs, minutes on a CPU
    redline sweep ablations --data data/corpus --out sweeps/ablations
    redline sweep my.toml --set optim.lr=3e-4 --budget max_time=5 --seeds 1 2 3
    redline sweep ablations --dry-run                 # the runs it would start, and which are finished
    redline sweep quality --data data/corpus --gpus 4 # four runs at once, one on each of four GPUs

Run the same command again after a crash or Ctrl-C: finished runs are skipped. The report (report.md,
plots, results.json/csv, dashboard.html) is written into the sweep directory when it ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import tyro

from redline.errors import UserError

DESCRIPTION = "Run a matrix of training runs (presets × variants × precision × batch × seeds), resumably."


@dataclass
class SweepArgs:
    recipe: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RECIPE")]
    """A built-in recipe name (`redline sweep --list`) or a .toml / .yaml recipe file."""
    out: str | None = None
    """Sweep directory (default: sweeps/RECIPE_NAME). Re-running with the same one resumes."""
    data: str | None = None
    """Data set for every run (data.path): prepared shards or raw text; overrides the recipe's `data`."""
    set: Annotated[list[str], tyro.conf.arg(metavar="KEY=VALUE")] = field(default_factory=list)
    """Extra TrainConfig overrides for every run, e.g. --set device=cpu optim.lr=3e-4 (win over the recipe)."""
    budget: Annotated[list[str], tyro.conf.arg(metavar="KEY=VALUE")] = field(default_factory=list)
    """Replace the recipe's budget per run: max_steps=N, max_tokens=N and/or max_time=MINUTES."""
    seeds: list[int] | None = None
    """Replace the recipe's seeds, e.g. --seeds 1 2 3."""
    retry_failed: bool = False
    """Run again the runs that failed last time (by default a failed run counts as finished)."""
    redo_changed: bool = False
    """Run again finished runs whose recipe entry has changed since (by default that is an error)."""
    dry_run: bool = False
    """List the runs and what a sweep would do with each, and start nothing."""
    stop_after: float = 0.0
    """Start no new run after this many minutes, though always at least one (0: no limit); run the same command
    again to continue."""
    report: bool = True
    """Write the report into the sweep directory when the sweep ends."""
    gpus: int = 1
    """Runs at once, each on a GPU of its own: 1 runs one at a time on whatever device its config picks; N takes
    the first N GPUs visible (those CUDA_VISIBLE_DEVICES lists, else the machine's); 0 takes every one."""


def parse_value(text: str):
    """A --set value: JSON (numbers, true/false, null, lists) where it parses, else the string itself."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_pairs(items: list[str], flag: str) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"{flag} {item!r}: write KEY=VALUE, e.g. {flag} optim.lr=3e-4")
        key, value = item.split("=", 1)
        out[key.strip()] = parse_value(value)
    return out


def list_recipes() -> None:
    from rich.console import Console
    from rich.table import Table

    from redline.experiments.recipes import builtin_recipes, describe_budget, expand, load_recipe

    table = Table("recipe", "runs", "budget per run", "what it measures")
    for name, summary in builtin_recipes().items():
        recipe = load_recipe(name)
        table.add_row(name, str(len(expand(recipe))), describe_budget(recipe.budget), summary)
    Console().print(table)


def main(argv: list[str]) -> int:
    from rich.console import Console

    from redline.experiments.processes import visible_gpus
    from redline.experiments.recipes import DEFAULT_COMMAND, check_overrides, expand, load_recipe, parse_budget
    from redline.experiments.sweep import Progress, Sweep, default_out_dir, print_plan

    if "--list" in argv:
        list_recipes()
        return 0
    args = tyro.cli(SweepArgs, args=argv, prog="redline sweep", description=DESCRIPTION)
    recipe = load_recipe(args.recipe)
    if args.budget:
        recipe.budget = parse_budget(parse_pairs(args.budget, "--budget"))
    if args.seeds:
        recipe.seeds = list(args.seeds)
        for variant in recipe.variants:
            variant.axes.pop("seeds", None)
    extra_set = parse_pairs(args.set, "--set")
    if recipe.command == DEFAULT_COMMAND:  # another runner may take other keys
        check_overrides(recipe.set, "recipe [set]")
        check_overrides(extra_set, "--set")
        for variant in recipe.variants:  # a typo in one variant would fail its runs only after others trained
            check_overrides(variant.set, f"variant {variant.name}")
    runs = expand(recipe, extra_set=extra_set, data=args.data)
    check_data_paths(runs)
    out_dir = Path(args.out) if args.out else default_out_dir(recipe)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file; give a folder for the sweep (new, or an earlier run of it)")
    earlier = _recipe_name_in(out_dir)
    if earlier is not None and earlier != recipe.name:  # its runs would be reported as this sweep's
        raise UserError(f"{out_dir} holds the sweep of recipe {earlier!r}, not {recipe.name!r}; give another --out")
    sweep = Sweep(recipe, runs, out_dir)
    console = Console(highlight=False)
    warn_raw_data({r.overrides.get("data.path") for r in runs} - {None}, console)
    if args.dry_run:
        plans = sweep.plan()
        print_plan(plans, console)
        states = {s: sum(p.state == s for p in plans) for s in ("todo", "done", "failed", "changed")}
        print(json.dumps({"sweep_dir": str(sweep.out_dir), "recipe": recipe.name, "runs": len(plans), **states}))
        return 0

    gpus = visible_gpus(args.gpus) if args.gpus != 1 else None
    counts = sweep.execute(retry_failed=args.retry_failed, redo_changed=args.redo_changed,
                           stop_after_minutes=args.stop_after, display=Progress(console), gpus=gpus)
    report_path = None
    if args.report:
        from redline.experiments.report import write_report

        files = write_report(sweep.out_dir)
        report_path = str(files["report"])
        console.print(f"report: {report_path} | dashboard: {files['dashboard']} | `redline dashboard {sweep.out_dir}`")
    print_summary(sweep.out_dir, console)
    result = {"sweep_dir": str(sweep.out_dir), "recipe": recipe.name, **counts, "report": report_path}
    print(json.dumps(result, default=str))
    return 0 if not counts["failed"] else 1


def check_data_paths(runs) -> None:
    """Every run's data.path must exist: a dry run would list runs that cannot start, and a real sweep would
    find out only once each run had started. A path naming a run of this sweep ({runs}) is made by that run."""
    for run in runs:
        path = run.overrides.get("data.path")
        if path and "{runs}" not in str(path) and not Path(path).exists():
            raise UserError(f"data path {path} does not exist (run {run.run_id}); give --data (or the recipe's data) "
                            "a folder of prepared shards (`redline data prepare`) or .txt/.jsonl/.parquet files")


def warn_raw_data(paths: set[str], console) -> None:
    """Raw text is tokenized inside each run's directory: once per run. Say so before hours go into it."""
    from redline.data.prepare import check_prepared

    for path in sorted(paths):
        if Path(path).exists() and not check_prepared(path):
            console.print(f"[yellow]warning: {path} is raw text, so every run will tokenize it again; prepare it once "
                          f"(`redline data prepare --inputs {path} --out DIR`) and give --data DIR")


def print_summary(sweep_dir: Path, console) -> None:
    from rich.table import Table

    from redline.experiments.results import load_result_set

    result = load_result_set(sweep_dir)
    table = Table("status", "tok/s", "val bpb", "peak GiB", "wall s")
    table.add_column("run", no_wrap=True)
    for r in result.runs:
        table.add_row(r["status"], _fmt(r.get("tokens_per_second"), ",.0f"), _fmt(r.get("final_val_bpb"), ".4f"),
                      _fmt(r.get("peak_memory_gib"), ".2f"), _fmt(r.get("wall_time"), ".0f"), r["run_id"])
    console.print(table)
    for r in result.runs:
        if r.get("error"):
            console.print(f"{r['run_id']}: {r['status']}: {r['error']}", markup=False, soft_wrap=True)


def _fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _recipe_name_in(out_dir: Path) -> str | None:
    """The recipe name of the sweep an --out folder already holds (None: none, or unreadable)."""
    try:
        return json.loads((out_dir / "sweep.json").read_text())["recipe"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        return None

