"""`redline report DIR`: report.md, plots, results.json, results.csv and dashboard.html for a run or a sweep.

    redline report sweeps/ablations           # a sweep directory (results.jsonl)
    redline report runs/tiny-20250101-120000  # one run directory (metrics.jsonl)
    redline report runs                       # a folder of run directories
    redline report sweeps/ablations --out docs/results
    redline report docs/results/ablations-h200  # a published report (results.json only): plots and dashboard again
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

import tyro

DESCRIPTION = "Write report.md, PNG plots, results.json/csv and a self-contained dashboard.html for a run or a sweep."


@dataclass
class ReportArgs:
    path: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="DIR")]
    """A sweep directory, a run directory, or a folder of run directories."""
    out: str | None = None
    """Where to write the report files (default: into PATH itself)."""
    claims: str | None = None
    """A claims TOML file to test instead of the built-in one (same [[claim]] tables)."""


def main(argv: list[str]) -> int:
    from rich.console import Console
    from rich.table import Table

    from redline.experiments.report import write_report

    args = tyro.cli(ReportArgs, args=argv, prog="redline report", description=DESCRIPTION)
    files = write_report(args.path, out=args.out, claims_path=args.claims)
    report = json.loads(files["results_json"].read_text())
    table = Table("configuration", "seeds", "tokens/s", "Δ tokens/s", "val bpb", "Δ val bpb", "p")
    for cell in report["cells"]:
        vs = cell.get("vs_baseline") or {}
        speed, bpb = vs.get("tokens_per_second"), vs.get("final_val_bpb")
        table.add_row(cell["label"] + (" (baseline)" if cell["is_baseline"] else ""), f"{cell['n_completed']}/{cell['n_runs']}",
                      _f(cell["tokens_per_second"]["mean"], ",.0f"), _f(speed and (speed["estimate"] - 1) * 100, "+.1f", "%"),
                      _f(cell["final_val_bpb"]["mean"], ".4f"), _f(bpb and bpb["estimate"], "+.4f"), _f(bpb and bpb["p_value"], ".3f"))
    console = Console(highlight=False)
    console.print(table)
    for name, path in files.items():
        console.print(f"{name}: {path}")
    verdicts = {}
    for row in report["claims"]:
        verdicts[row["verdict"]] = verdicts.get(row["verdict"], 0) + 1
    print(json.dumps({"path": args.path, "runs": len(report["runs"]), "cells": len(report["cells"]),
                      "claims": verdicts, "files": {k: str(v) for k, v in files.items()}}))
    return 0


def _f(value, spec: str, suffix: str = "") -> str:
    return "—" if value is None else format(value, spec) + suffix
