"""Result sets: one run directory → one summary record; many records → cells compared with a baseline.

A run summary (what results.jsonl holds per line, and results.csv per row) has: where the run sits on
each axis (variant, preset, precision, batch_size, seq_len, seed), its status and error, wall time,
parameter count, tokens/s, MFU, peak memory, final and best validation loss / bits per byte, the
validation curve over steps, tokens and time, a thinned training-loss curve, and the resolved config.

Throughput is the median of the logged windows after the first: the first holds compilation and warm-up,
and a window right after an evaluation or checkpoint includes that pause, which the median ignores.

A cell is one configuration (variant, preset, precision, batch, sequence length) over its seeds. Each
cell is compared with the baseline cell: the one matching the recipe's `baseline` selector that agrees
with it on the most other axes (one change at a time).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redline.errors import UserError
from redline.experiments import stats
from redline.experiments.recipes import AXES

TRAIN_CURVE_POINTS = 200
COMPLETED = "completed"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a torn last line (a crash mid-write) is skipped."""
    records = []
    if not path.is_file():
        return records
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def _finite(value) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def count_params(model_dict: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """Parameters (all, without embeddings) of the model a config.json describes, built on the meta device."""
    if not model_dict:
        return None, None
    try:
        import dataclasses

        import torch

        from redline.model import GPT, ModelConfig

        known = {f.name for f in dataclasses.fields(ModelConfig)}
        cfg = ModelConfig(**{k: v for k, v in model_dict.items() if k in known})
        with torch.device("meta"):
            model = GPT(cfg)
        return model.num_params(), model.num_params(embeddings=False)
    except Exception:  # a config this version of the model cannot build: leave the count out
        return None, None


def axes_from_config(config: dict[str, Any], name: str) -> dict[str, Any]:
    """Axis values of a run that was not started by a sweep, read from its resolved config."""
    precision = config.get("precision", "auto")
    fp8 = config.get("fp8")
    if fp8 and fp8 != "off":
        precision = "fp8" if fp8 == "all" else f"fp8-{fp8}"
    model = config.get("model") or {}
    return {"variant": name, "preset": config.get("preset", "?"), "precision": precision,
            "batch_size": config.get("batch_size", 0), "seq_len": config.get("seq_len") or model.get("context_len", 0),
            "seed": config.get("seed")}


def summarize_run(run_dir: Path, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the report needs from one run directory (config.json, metrics.jsonl, environment.json)."""
    run_dir = Path(run_dir)
    config = _json_table(run_dir / "config.json")
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if _well_formed(r)]
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval" and _finite(r.get("loss")) is not None]
    ends = [r for r in records if r.get("kind") == "event" and r.get("event") == "end"]
    logged = [r for r in train if _finite(r.get("tokens_per_second")) is not None]
    steady = logged[1:] if len(logged) > 1 else logged

    summary: dict[str, Any] = dict(spec) if spec else axes_from_config(config, run_dir.name)
    summary.setdefault("run_id", run_dir.name)
    summary["run_dir"] = str(run_dir)
    summary["status"] = ends[-1].get("status", "failed") if ends else "failed"
    summary["steps"] = max((r.get("step", 0) for r in train), default=0)
    summary["tokens"] = (ends[-1].get("tokens") if ends else None) or max((r.get("tokens", 0) or 0 for r in logged), default=0)
    # seconds of training (max_time's clock: no compilation or evaluations); runs from before it was logged, and
    # runs stopped before their end event, give the time since their start
    end = ends[-1] if ends else None
    summary["train_time"] = (_finite(end.get("train_time", end.get("elapsed"))) if end else
                             _finite(logged[-1].get("elapsed")) if logged else None)
    summary["tokens_per_second"] = _median([_finite(r.get("tokens_per_second")) for r in steady])
    summary["mfu"] = _median([_finite(r.get("mfu")) for r in steady])
    memory = [_finite(r.get("peak_memory_gib")) for r in logged]
    summary["peak_memory_gib"] = max((m for m in memory if m is not None), default=None)
    summary["final_train_loss"] = _mean_tail([_finite(r.get("loss")) for r in train], 10)

    # an eval record's "tokens" may be the tokens it evaluated (the evaluation result's own field), so the
    # training tokens at an eval step come from the training records' tokens per step
    per_step = logged[-1]["tokens"] / logged[-1]["step"] if logged and logged[-1].get("tokens") and logged[-1].get("step") else None
    curve = [{"step": r.get("step"), "tokens": round(r["step"] * per_step) if per_step and r.get("step") is not None else r.get("tokens"),
              "elapsed": _finite(r.get("elapsed")), "loss": _finite(r.get("loss")), "bpb": _finite(r.get("bpb"))}
             for r in evals]
    summary["eval_curve"] = curve
    final = curve[-1] if curve else {}
    summary["final_val_loss"] = final.get("loss")
    summary["final_val_bpb"] = final.get("bpb")
    summary["final_val_perplexity"] = math.exp(final["loss"]) if final.get("loss") is not None and final["loss"] < 700 else None
    summary["best_val_loss"] = min((c["loss"] for c in curve if c["loss"] is not None), default=None)
    summary["best_val_bpb"] = min((c["bpb"] for c in curve if c["bpb"] is not None), default=None)
    thin = max(1, math.ceil(len(logged) / TRAIN_CURVE_POINTS))
    summary["train_curve"] = [{"step": r.get("step"), "tokens": r.get("tokens"), "elapsed": _finite(r.get("elapsed")),
                               "loss": _finite(r.get("loss"))} for r in logged[::thin]]
    params, params_non_embedding = count_params(config.get("model"))
    summary["params"] = params
    summary["params_non_embedding"] = params_non_embedding
    env = _json_table(run_dir / "environment.json")
    device = None
    if env:
        gpus = env.get("gpus") if isinstance(env.get("gpus"), list) else []
        if gpus:
            device = gpus[0].get("name") if isinstance(gpus[0], dict) else None
        else:
            device = f"CPU ({env.get('cpu_count', '?')} cores)"
        summary["torch"] = env.get("torch")
        summary["git_commit"] = env.get("git_commit")
    summary["device"] = device
    summary["config"] = config
    summary["task_scores"] = task_scores(run_dir)
    if summary["status"] == "diverged":
        summary.setdefault("error", "diverged: too many non-finite losses in a row")
    return summary


def task_scores(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The newest `redline evaluate` score of each task on this run (RUN/evaluations.jsonl): task -> {metric,
    score, chance, centered, n, step}."""
    scores: dict[str, dict[str, Any]] = {}
    for record in read_jsonl(Path(run_dir) / "evaluations.jsonl"):
        tasks = record.get("tasks") if record.get("kind") == "task_eval" else None
        for name, result in (tasks or {}).items():
            if isinstance(result, dict) and _finite(result.get("score")) is not None:
                scores[name] = {k: result.get(k) for k in ("metric", "score", "chance", "centered", "n")}
                scores[name]["step"] = record.get("step")
    return scores


def _json_table(path: Path) -> dict[str, Any]:
    """A JSON object file of a run directory; {} when it is missing, damaged or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _well_formed(record: dict[str, Any]) -> bool:
    """Whether a metrics record has the types the summary relies on; one that does not (a damaged or hand-edited
    file) is left out rather than trusted."""
    counts = _count(record.get("step", 0)) and (record.get("tokens") is None or _count(record["tokens"]))
    return counts and isinstance(record.get("status", ""), str)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _mean_tail(values: list[float | None], n: int) -> float | None:
    tail = [v for v in values if v is not None][-n:]
    return sum(tail) / len(tail) if tail else None


# ----------------------------------------------------------------------------------------------------
# result sets


@dataclass
class ResultSet:
    name: str
    kind: str  # "sweep" | "run" | "runs"
    root: Path
    runs: list[dict[str, Any]]
    baseline: dict[str, Any] = field(default_factory=dict)
    recipe: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    planned: int | None = None  # runs the recipe asks for (sweeps only)


def load_result_set(path: str | Path) -> ResultSet:
    """A sweep directory (results.jsonl), one run directory (metrics.jsonl), a folder of run directories, or a
    report written without its runs (results.json)."""
    root = Path(path)
    if not root.exists():
        raise UserError(f"{root} does not exist; give a run directory or a sweep directory")
    if not root.is_dir():
        raise UserError(f"{root} is a file; give a run directory or a sweep directory")
    if (root / "results.jsonl").is_file() or (root / "sweep.json").is_file():
        meta = _sweep_meta(root / "sweep.json")
        latest: dict[str, dict] = {}
        for record in read_jsonl(root / "results.jsonl"):
            if isinstance(record.get("run_id"), str):
                latest[record["run_id"]] = record  # a rerun (--retry-failed) replaces the earlier record
        status = None
        if (root / "status.json").is_file():
            try:
                status = json.loads((root / "status.json").read_text())
            except json.JSONDecodeError:
                status = None
        recipe = meta.get("recipe") or {}
        if not isinstance(status, dict):
            status = None
        runs = [_refresh(record, root) for record in latest.values()]
        return ResultSet(recipe.get("name", root.name), "sweep", root, runs,
                         recipe.get("baseline") or {}, recipe, status, len(meta.get("runs", [])) or None)
    if (root / "metrics.jsonl").is_file():
        return ResultSet(root.name, "run", root, [summarize_run(root)])
    run_dirs = sorted(p for p in root.iterdir() if p.is_dir() and (p / "metrics.jsonl").is_file())
    if not run_dirs and (root / "results.json").is_file():
        return _published_result_set(root)
    if not run_dirs:
        raise UserError(f"{root} holds no runs: expected results.jsonl (a sweep), metrics.jsonl (a run), "
                        f"run directories with metrics.jsonl inside, or a report's results.json")
    return ResultSet(root.name, "runs", root, [summarize_run(p) for p in run_dirs])


def read_published_report(root: Path) -> dict[str, Any]:
    """The results.json that `redline report` wrote in root (a dict with its "runs" and "cells"), checked."""
    path = root / "results.json"
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(report["runs"], list) or not isinstance(report["cells"], list):
            raise TypeError("runs and cells must be lists")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a report's results.json ({type(e).__name__}); write it again with "
                        f"`redline report SWEEP_DIR --out {root}`") from None
    return report


def _published_result_set(root: Path) -> ResultSet:
    """A report written by `redline report` without the runs it was made from (docs/results/ keeps these): its
    results.json holds every run's summary, the records results.jsonl held."""
    report = read_published_report(root)
    runs = [r for r in report["runs"] if isinstance(r, dict) and isinstance(r.get("run_id"), str)]
    recipe = report.get("recipe") if isinstance(report.get("recipe"), dict) else {}
    return ResultSet(report.get("name") or root.name, report.get("kind") or "sweep", root, runs,
                     report.get("baseline") or {}, recipe, None, report.get("planned"))


def _sweep_meta(path: Path) -> dict[str, Any]:
    """sweep.json, checked: the recipe (a table) and the planned runs (a list); {} when there is none."""
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is damaged ({e}); run the sweep again to rewrite it (finished runs are kept in "
                        f"results.jsonl)") from None
    if not (isinstance(meta, dict) and isinstance(meta.get("recipe", {}), dict)
            and isinstance(meta.get("runs", []), list)):
        raise UserError(f"{path} is damaged (no recipe table and list of runs); run the sweep again to rewrite it")
    return meta


# what only the sweep knows about a run (how its process ended), kept over a fresh summary of its directory
SWEEP_FIELDS = ("status", "error", "error_kind", "returncode", "wall_time", "fingerprint", "overrides", "config_file",
                "started", "finished")


def _refresh(record: dict[str, Any], root: Path) -> dict[str, Any]:
    """A sweep's record, re-summarized from its run directory when that is still there (so a report made with
    a newer redline reads the metrics the newer way); the stored record as it is otherwise."""
    run_dir = root / "runs" / str(record.get("run_id"))
    if not (run_dir / "metrics.jsonl").is_file():
        return record
    fresh = summarize_run(run_dir, spec={k: record.get(k) for k in ("run_id", *AXES, "seed")})
    fresh.update({k: record[k] for k in SWEEP_FIELDS if k in record})
    for key in ("params", "params_non_embedding"):
        if fresh.get(key) is None:
            fresh[key] = record.get(key)
    return fresh


def cell_key(run: dict[str, Any]) -> tuple:
    return tuple(run.get(axis) for axis in AXES)


def varying_axes(runs: list[dict[str, Any]]) -> list[str]:
    """Axes that take more than one value in this result set (the others are left out of labels)."""
    out = [axis for axis in AXES if len({r.get(axis) for r in runs}) > 1]
    return out or ["variant"]


def cell_label(key: dict[str, Any] | tuple, axes: list[str]) -> str:
    if isinstance(key, tuple):
        key = dict(zip(AXES, key))
    parts = []
    for axis in axes:
        value = key.get(axis)
        if axis == "batch_size":
            parts.append(f"b{value or 'default'}")
        elif axis == "seq_len":
            parts.append(f"T{value or 'default'}")
        else:
            parts.append(str(value))
    return " · ".join(parts)


METRICS = ("tokens_per_second", "mfu", "peak_memory_gib", "final_val_loss", "final_val_bpb", "best_val_bpb",
           "final_val_perplexity", "wall_time", "train_time", "params")


def build_cells(result: ResultSet) -> list[dict[str, Any]]:
    """One entry per configuration: per-metric mean/std over completed seeds, and the comparison with the baseline."""
    axes = varying_axes(result.runs)
    groups: dict[tuple, list[dict]] = {}
    for run in result.runs:
        groups.setdefault(cell_key(run), []).append(run)
    cells = []
    for key, runs in groups.items():
        done = [r for r in runs if r.get("status") == COMPLETED]
        cell: dict[str, Any] = dict(zip(AXES, key))
        cell["key"] = list(key)
        cell["label"] = cell_label(key, axes)
        cell["n_runs"] = len(runs)
        cell["n_completed"] = len(done)
        cell["seeds"] = sorted(r.get("seed") for r in done if r.get("seed") is not None)
        cell["failed"] = [{"run_id": r.get("run_id"), "status": r.get("status"), "error": r.get("error")}
                          for r in runs if r.get("status") != COMPLETED]
        for metric in METRICS:
            s = stats.summarize(r.get(metric) for r in done)
            cell[metric] = {"mean": s.mean, "std": s.std, "n": s.n, "values": list(s.values)}
        cells.append(cell)
    _attach_baseline(cells, result.baseline)
    return cells


def matches(cell: dict[str, Any], selector: dict[str, Any]) -> bool:
    return all(cell.get(axis) == value for axis, value in selector.items())


def find_reference(cell: dict[str, Any], candidates: list[dict[str, Any]], changed: set[str]) -> dict[str, Any] | None:
    """The candidate that agrees with `cell` on the most axes outside `changed`; None on a tie or none."""
    others = [a for a in AXES if a not in changed]
    scored = [(sum(c.get(a) == cell.get(a) for a in others), c) for c in candidates]
    if not scored:
        return None
    best = max(score for score, _ in scored)
    top = [c for score, c in scored if score == best]
    return top[0] if len(top) == 1 else None


def _values(cell: dict[str, Any], metric: str) -> list[float]:
    return cell[metric]["values"]


def compare(cell: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """cell vs base: speed and memory ratios, bpb difference (Welch + permutation), perplexity ratio."""
    out: dict[str, Any] = {"baseline": base["label"]}
    out["tokens_per_second"] = _diff_dict(stats.ratio(_values(cell, "tokens_per_second"), _values(base, "tokens_per_second")))
    out["peak_memory_gib"] = _diff_dict(stats.ratio(_values(cell, "peak_memory_gib"), _values(base, "peak_memory_gib")))
    bpb = stats.welch(_values(cell, "final_val_bpb"), _values(base, "final_val_bpb"))
    out["final_val_bpb"] = _diff_dict(bpb)
    if out["final_val_bpb"] is not None:
        out["final_val_bpb"]["p_permutation"] = stats.permutation_test(_values(cell, "final_val_bpb"), _values(base, "final_val_bpb"))
    out["final_val_perplexity"] = _diff_dict(stats.exp_difference(
        stats.welch(_values(cell, "final_val_loss"), _values(base, "final_val_loss"))))
    return out


def _diff_dict(d: stats.Difference | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {"estimate": d.estimate, "low": d.low, "high": d.high, "p_value": d.p_value, "df": d.df,
            "n": [d.n_a, d.n_b], "method": d.method, "confidence": d.confidence}


def _attach_baseline(cells: list[dict[str, Any]], selector: dict[str, Any]) -> None:
    candidates = [c for c in cells if selector and matches(c, selector)]
    for cell in cells:
        cell["is_baseline"] = cell in candidates
        cell["vs_baseline"] = None
        if cell["is_baseline"] or not candidates:
            continue
        base = find_reference(cell, candidates, set(selector))
        if base is not None and base["n_completed"] and cell["n_completed"]:
            cell["vs_baseline"] = compare(cell, base)


def best_cells(cells: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest cell, the best-quality cell, and the one with the lowest validation bpb at a common wall time,
    each with `clear`: whether it leads the runner-up by more than the noise the plots draw (see `leader`)."""
    done = [c for c in cells if c["n_completed"]]
    out: dict[str, Any] = {"speed": None, "quality": None, "quality_per_time": None}
    speed = leader({c["label"]: c["tokens_per_second"]["values"] for c in done}, higher_is_better=True)
    if speed:
        out["speed"] = {**speed, "tokens_per_second": speed["mean"]}
    quality = leader({c["label"]: c["final_val_bpb"]["values"] for c in done}, higher_is_better=False)
    if quality:
        out["quality"] = {**quality, "final_val_bpb": quality["mean"]}
    out["quality_per_time"] = quality_at_common_time(done, runs)
    return out


def leader(values: dict[str, list[float]], higher_is_better: bool) -> dict[str, Any] | None:
    """The configuration with the best mean over its seeds, and whether it is a clear winner: it is when its
    mean ± std band (the error bars of the plots) does not overlap the runner-up's. With one seed on either side
    there is no spread to compare with, so there is no clear winner; nor with a single configuration."""
    summaries = {label: stats.summarize(v) for label, v in values.items()}
    ranked = sorted((s.mean, label) for label, s in summaries.items() if s.mean is not None)
    if not ranked:
        return None
    if higher_is_better:
        ranked.reverse()
    best = summaries[ranked[0][1]]
    out = {"label": ranked[0][1], "mean": best.mean, "std": best.std, "n": best.n, "clear": False,
           "runner_up": None, "runner_up_mean": None}
    if len(ranked) == 1:
        out["reason"] = "the only configuration"
        return out
    second = summaries[ranked[1][1]]
    out.update(runner_up=ranked[1][1], runner_up_mean=second.mean)
    if best.std is None or second.std is None:
        out["reason"] = "one seed: no spread over seeds to compare the difference with"
        return out
    sign = 1 if higher_is_better else -1
    gap = sign * (best.mean - second.mean) - best.std - second.std  # > 0: the mean ± std bands do not overlap
    out["clear"] = gap > 0
    if not out["clear"]:
        out["reason"] = "within the spread over seeds (mean ± std)"
    return out


def quality_at_common_time(cells: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Validation bpb of each cell (mean over seeds) interpolated at the shortest final training time of all
    cells: who got furthest in the same wall time. Returns the leader (see `leader`), the time used, and every
    cell's mean."""
    curves: dict[str, list[list[tuple[float, float]]]] = {}
    for cell in cells:
        for run in runs:
            if run.get("status") == COMPLETED and cell_key(run) == tuple(cell["key"]):
                points = [(p["elapsed"], p["bpb"]) for p in run.get("eval_curve", [])
                          if p.get("elapsed") is not None and p.get("bpb") is not None]
                if points:
                    curves.setdefault(cell["label"], []).append(points)
    if len(curves) < 1:
        return None
    horizon = min(points[-1][0] for seeds in curves.values() for points in seeds)
    per_seed = {}
    for label, seeds in curves.items():
        values = [stats.interpolate([p[0] for p in pts], [p[1] for p in pts], horizon) for pts in seeds]
        per_seed[label] = [v for v in values if v is not None]
    best = leader(per_seed, higher_is_better=False)
    if best is None:
        return None
    scores = {label: sum(v) / len(v) for label, v in per_seed.items() if v}
    return {**best, "val_bpb_at_time": best["mean"], "seconds": horizon, "all": scores}
