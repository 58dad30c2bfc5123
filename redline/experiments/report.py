"""The report of a run or a sweep directory: report.md, plots/*.png, results.json, results.csv, dashboard.html.

It only reads what runs and sweeps wrote (results.jsonl, or config.json + metrics.jsonl), so it can be
rerun at any time, also while a sweep is still going (the report then says it is partial).
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from redline.durable import write_atomic
from redline.errors import UserError
from redline.experiments import claims as claims_mod
from redline.experiments.results import COMPLETED, best_cells, build_cells, load_result_set, read_published_report

CSV_COLUMNS = ["run_id", "variant", "preset", "precision", "batch_size", "seq_len", "seed", "status", "error",
               "params", "params_non_embedding", "steps", "tokens", "tokens_per_second", "mfu", "peak_memory_gib",
               "final_val_loss", "final_val_bpb", "final_val_perplexity", "best_val_loss", "best_val_bpb",
               "final_train_loss", "train_time", "wall_time", "device", "run_dir"]


def build_report(path: str | Path, claims_path: str | None = None) -> dict[str, Any]:
    """Everything the report files are made from, as one JSON-able dict (this is results.json)."""
    result = load_result_set(path)
    cells = build_cells(result)
    claim_rows = claims_mod.evaluate_claims(result.runs, claims_mod.load_claims(claims_path))
    devices = sorted({r["device"] for r in result.runs if r.get("device")})
    return {
        "title": f"{'sweep' if result.kind == 'sweep' else 'run' if result.kind == 'run' else 'runs'} {result.name}",
        "name": result.name, "kind": result.kind, "root": str(result.root),
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "recipe": result.recipe, "baseline": result.baseline, "status": result.status, "planned": result.planned,
        "devices": devices, "torch": sorted({r["torch"] for r in result.runs if r.get("torch")}),
        "git_commits": sorted({r["git_commit"] for r in result.runs if r.get("git_commit")}),
        "runs": result.runs, "cells": cells, "best": best_cells(cells, result.runs), "claims": claim_rows,
    }


def is_published_report(path: str | Path) -> bool:
    """A folder holding a written report (results.json) but none of the runs it was made from, as the reports
    under docs/results/ are: its plots and dashboard can be drawn again from results.json alone."""
    root = Path(path)
    if not (root / "results.json").is_file():
        return False
    if any((root / name).exists() for name in ("results.jsonl", "sweep.json", "metrics.jsonl")):
        return False
    return not any(p.is_dir() and (p / "metrics.jsonl").is_file() for p in root.iterdir())


def redraw_report(path: str | Path, out: str | Path | None = None) -> dict[str, Path]:
    """plots/*.png and dashboard.html of a published report, drawn again from its results.json (report.md and
    the results files are left as they are: they are the record)."""
    from redline.experiments.dashboard import dashboard_data, write_dashboard
    from redline.experiments.plots import write_plots

    root = Path(path)
    report = read_published_report(root)
    cells, runs = report["cells"], report["runs"]
    out_dir = Path(out) if out else root
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"results_json": root / "results.json", "dashboard": out_dir / "dashboard.html"}
    write_dashboard(dashboard_data(report), files["dashboard"])
    files.update({f"plot_{k}": p for k, p in write_plots(cells, runs, out_dir / "plots").items()})
    return files


def write_report(path: str | Path, out: str | Path | None = None, claims_path: str | None = None) -> dict[str, Path]:
    """Every report file for a run or sweep directory; for a published report (is_published_report), only its
    plots and dashboard, drawn again."""
    from redline.experiments.dashboard import dashboard_data, write_dashboard
    from redline.experiments.plots import write_plots

    if is_published_report(path):
        return redraw_report(path, out)
    report = build_report(path, claims_path)
    out_dir = Path(out) if out else Path(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = write_plots(report["cells"], report["runs"], out_dir / "plots")
    files = {
        "report": out_dir / "report.md",
        "results_json": out_dir / "results.json",
        "results_csv": out_dir / "results.csv",
        "dashboard": out_dir / "dashboard.html",
    }
    # each file whole or not at all: a full disk leaves the previous report's files as they were
    write_atomic(files["report"], markdown(report, {k: p.relative_to(out_dir) for k, p in plots.items()}))
    write_atomic(files["results_json"], json.dumps(report, indent=1, default=str))
    write_csv(report["runs"], files["results_csv"])
    write_dashboard(dashboard_data(report), files["dashboard"])
    files.update({f"plot_{k}": p for k, p in plots.items()})
    return files


def write_csv(runs: list[dict[str, Any]], path: Path) -> None:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for run in runs:
        writer.writerow({k: run.get(k) for k in CSV_COLUMNS})
    write_atomic(path, text.getvalue())


# ----------------------------------------------------------------------------------------------------
# markdown


def _f(value, spec: str, missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


def _params(count: float | None) -> str:
    if count is None:
        return "—"
    if count >= 1e9:
        return f"{count / 1e9:.2f}B"
    return f"{count / 1e6:.1f}M" if count >= 1e7 else f"{count / 1e6:.2f}M"


def _pct(d: dict | None) -> str:
    if not d:
        return "—"
    text = f"{(d['estimate'] - 1) * 100:+.1f}%"
    if d.get("low") is not None:
        text += f" [{(d['low'] - 1) * 100:+.1f}, {(d['high'] - 1) * 100:+.1f}]"
    return text


def _bpb_delta(d: dict | None) -> str:
    if not d:
        return "—"
    text = f"{d['estimate']:+.4f}"
    if d.get("low") is not None:
        text += f" [{d['low']:+.4f}, {d['high']:+.4f}]"
    return text


def _p(d: dict | None, key: str = "p_value") -> str:
    if not d or d.get(key) is None:
        return "—"
    value = d[key]
    return f"{value:.3f}{' *' if value < 0.05 else ''}"


def _mean_std(stat: dict, spec: str) -> str:
    if stat["mean"] is None:
        return "—"
    return format(stat["mean"], spec) + (f" ± {format(stat['std'], spec)}" if stat["std"] is not None else "")


def headline(lead: dict[str, Any], fmt) -> str:
    """"LABEL — VALUE" for a clear winner; "no clear winner (…)" with both values and why, otherwise."""
    if lead.get("clear"):
        return f"{lead['label']} — {fmt(lead['mean'])}"
    if lead.get("runner_up") is None:
        return f"no clear winner ({lead['label']}, {fmt(lead['mean'])}, is {lead.get('reason', '')})"
    return (f"no clear winner ({lead['label']} {fmt(lead['mean'])} vs {lead['runner_up']} "
            f"{fmt(lead['runner_up_mean'])}: {lead.get('reason', '')})")


def task_score_lines(runs: list[dict[str, Any]]) -> list[str]:
    """A table of `redline evaluate` scores, one row per run (the stages of a pipeline side by side), one column
    per task: score (centered score in brackets); nothing when no run was evaluated."""
    tasks = sorted({name for r in runs for name in (r.get("task_scores") or {})})
    if not tasks:
        return []
    lines = ["", "## Task scores", "", "From `redline evaluate` (RUN/evaluations.jsonl): each task's headline metric, "
             "its centered score in brackets ((score - chance) / (1 - chance): 0 is chance, 1 perfect).", "",
             "| run | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for r in runs:
        scores = r.get("task_scores") or {}
        if scores:
            cells = [f"{s['score']:.3f} ({s['centered']:+.3f})" if (s := scores.get(t)) else "—" for t in tasks]
            lines.append(f"| {r.get('run_id')} | " + " | ".join(cells) + " |")
    return lines


def markdown(report: dict[str, Any], plots: dict[str, Path]) -> str:
    failed = [r for r in report["runs"] if r.get("status") != COMPLETED]
    lines = _header_lines(report)
    lines += _configuration_lines(report)
    lines += _best_lines(report["best"])
    lines += ["", "## The source design's claims", "",
              "Each claim is a ratio treatment / control. Verdicts: **confirmed** (≥ 2 runs a side, the interval "
              "excludes no effect on the claimed side, and the measured ratio is within a factor of 2 of the claimed "
              "change), **refuted** (the whole interval lies outside that band), else **inconclusive**.", "",
              claims_mod.claims_markdown(report["claims"])]
    lines += task_score_lines(report["runs"])
    lines += _failed_lines(failed)
    lines += _plot_lines(plots)
    lines += ["", "## How these numbers are made", "",
              "- tokens/s of a run: the median of its logged windows after the first (which holds compilation and "
              "warm-up); a window that contains an evaluation is slower, and the median sets it aside.",
              "- Δ tokens/s and Δ memory: the ratio of geometric means over seeds, with a Welch interval on the logs.",
              "- Δ val bpb: the difference of mean final validation bits per byte, Welch's t-test and interval, and an "
              "exact permutation test (with 3 vs 3 seeds its smallest possible p is 0.10).",
              "- A single seed gives no interval and no p-value: differences smaller than seed-to-seed noise "
              "(often 0.01–0.02 bpb early in training) mean nothing there.",
              "- MFU: model FLOPs (6N + 12·L·d·T per token) against the GPU's datasheet bf16 peak; none on a CPU.",
              "- Files: results.json (everything here), results.csv (one row per run), dashboard.html (open it "
              "offline, or `redline dashboard DIR` to follow a running sweep).", ""]
    return "\n".join(lines)


def _header_lines(report: dict[str, Any]) -> list[str]:
    runs = report["runs"]
    done = [r for r in runs if r.get("status") == COMPLETED]
    failed = [r for r in runs if r.get("status") != COMPLETED]
    recipe = report.get("recipe") or {}
    lines = [f"# Report: {report['title']}", ""]
    meta = [f"generated {report['generated']}", f"{len(done)} completed and {len(failed)} failed run(s)"]
    if report.get("planned"):
        meta[-1] += f" of {report['planned']} planned"
        if len(runs) < report["planned"]:
            meta.append(f"**partial: {report['planned'] - len(runs)} run(s) not finished yet**")
    if recipe:
        budget = ", ".join(f"{k}={v}" for k, v in (recipe.get("budget") or {}).items())
        meta.append(f"recipe `{recipe.get('name')}` ({recipe.get('source', '')}), budget per run: {budget}")
    if report["devices"]:
        meta.append("device: " + ", ".join(report["devices"]))
    if report["torch"]:
        meta.append("torch " + ", ".join(report["torch"]))
    if report["git_commits"]:
        meta.append("git commit " + ", ".join(c[:10] for c in report["git_commits"]))
    lines += [f"- {m}" for m in meta]
    if recipe.get("description"):
        lines += ["", "> " + recipe["description"].replace("\n", "\n> ")]
    return lines


def _configuration_lines(report: dict[str, Any]) -> list[str]:
    cells = report["cells"]
    lines: list[str] = []
    baseline_cells = [c for c in cells if c.get("is_baseline")]
    lines += ["", "## Configurations against the baseline", ""]
    if report.get("baseline"):
        sel = ", ".join(f"{k}={v}" for k, v in report["baseline"].items())
        found = ", ".join(c["label"] for c in baseline_cells) or "none completed"
        lines.append(f"Baseline: {sel} ({found}). Each configuration is compared with the baseline that differs from it "
                     f"the least. Δ are variant − baseline; [brackets] are 95% intervals (Welch); * marks p < 0.05.")
    else:
        lines.append("No baseline (a single run or a folder of runs): values only.")
    lines += ["", "| configuration | params | tokens/s | Δ tokens/s | MFU | val bpb | Δ val bpb | p (Welch) | p (perm.) "
                  "| peak GiB | Δ memory | seeds |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        vs = c.get("vs_baseline") or {}
        name = c["label"] + (" **(baseline)**" if c.get("is_baseline") else "")
        mfu = c["mfu"]["mean"]
        lines.append(
            f"| {name} | {_params(c['params']['mean'])} | {_mean_std(c['tokens_per_second'], ',.0f')} | "
            f"{_pct(vs.get('tokens_per_second'))} | {_f(mfu and mfu * 100, '.1f')}{'%' if mfu is not None else ''} | "
            f"{_mean_std(c['final_val_bpb'], '.4f')} | {_bpb_delta(vs.get('final_val_bpb'))} | {_p(vs.get('final_val_bpb'))} | "
            f"{_p(vs.get('final_val_bpb'), 'p_permutation')} | {_mean_std(c['peak_memory_gib'], '.2f')} | "
            f"{_pct(vs.get('peak_memory_gib'))} | {c['n_completed']}/{c['n_runs']} |")
    return lines


def _best_lines(best: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    lines += ["", "## Best configurations", "",
              "A configuration is named only where it leads the runner-up by more than the spread over seeds "
              "(mean ± std bands that do not overlap, the error bars of the plots).", ""]
    if best.get("speed"):
        lines.append(f"- **fastest**: {headline(best['speed'], lambda v: f'{v:,.0f} tokens/s')}")
    if best.get("quality"):
        lines.append(f"- **best quality**: {headline(best['quality'], lambda v: f'{v:.4f} bits per byte')}")
    if best.get("quality_per_time"):
        q = best["quality_per_time"]
        lines.append(f"- **best quality for the time**: {headline(q, lambda v: f'{v:.4f} bits per byte')} after "
                     f"{q['seconds']:.0f} s of training (the shortest configuration's training time; each curve is "
                     f"interpolated there)")
    if not any(best.values()):
        lines.append("No completed runs yet.")
    return lines


def _failed_lines(failed: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    lines += ["", "## Runs that did not complete", ""]
    if failed:
        lines += ["| run | status | error |", "|---|---|---|"]
        for r in failed:
            error = (r.get("error") or "").replace("|", "\\|")
            lines.append(f"| {r.get('run_id')} | {r.get('status')} | {error} |")
    else:
        lines.append("None.")
    return lines


def _plot_lines(plots: dict[str, Path]) -> list[str]:
    lines: list[str] = []
    if plots:
        lines += ["", "## Plots", ""]
        titles = {"loss_vs_tokens": "Loss against tokens", "loss_vs_time": "Loss against training time",
                  "tokens_per_second": "Throughput", "peak_memory": "Peak GPU memory",
                  "speed_vs_quality": "Speed against quality"}
        for key, rel in plots.items():
            lines += [f"### {titles.get(key, key)}", "", f"![{titles.get(key, key)}]({rel.as_posix()})", ""]
        if "peak_memory" not in plots:
            lines.append("No peak memory was recorded (CPU runs record none), so there is no memory plot.")
    return lines
