"""`redline claims DIR`: the source design's claims set against a sweep's measurements.

    redline claims sweeps/ablations                 # speed and quality claims (the `ablations` recipe)
    redline claims sweeps/batch                     # the FP8 × batch claims (the `batch` recipe)
    redline claims sweeps/mine --claims my_claims.toml

Each claim gets confirmed / refuted / inconclusive with the effect we measured and its 95% interval;
the same table is part of `redline report`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

import tyro

DESCRIPTION = "Set the source design's claims against measured runs: confirmed, refuted or inconclusive, with intervals."


@dataclass
class ClaimsArgs:
    path: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="DIR")]
    """A sweep directory, a run directory, or a folder of run directories."""
    claims: str | None = None
    """A claims TOML file to test instead of the built-in one (same [[claim]] tables)."""
    all: bool = False
    """List every claim, also those none of whose runs is in DIR (other recipes' claims; counted, not listed, by
    default). The JSON line holds every claim either way."""


def main(argv: list[str]) -> int:
    from rich.console import Console
    from rich.table import Table

    from redline.experiments.claims import evaluate_claims, load_claims
    from redline.experiments.results import load_result_set

    args = tyro.cli(ClaimsArgs, args=argv, prog="redline claims", description=DESCRIPTION)
    result = load_result_set(args.path)
    rows = evaluate_claims(result.runs, load_claims(args.claims))
    table = Table("claim", "measured", "95% interval", "claim band", "runs", "verdict")
    style = {"confirmed": "green", "refuted": "red", "inconclusive": "yellow"}
    absent = [row for row in rows if row.get("absent")]
    for row in rows:
        if row.get("absent") and not args.all:
            continue
        context = ", ".join(f"{k}={v}" for k, v in (row.get("context") or {}).items() if k != "variant")
        name = row["claim"] + (f" ({context})" if context else "")
        verdict = f"[{style.get(row['verdict'], 'dim')}]{row['verdict']}[/]"
        if "measured_ratio" not in row:
            table.add_row(name, "—", "—", "—", "—", f"{verdict}: {row.get('reason', '')}")
            continue
        table.add_row(name, f"{row['metric']} {row['measured_ratio']:.3f}× ({row['measured_change_pct']:+.1f}%)",
                      f"{row['low']:.3f}–{row['high']:.3f}×", f"{row['band'][0]:.3f}–{row['band'][1]:.3f}×",
                      f"{row['n'][0]} vs {row['n'][1]}", verdict)
    console = Console(highlight=False)
    console.print(table)
    if absent and not args.all:
        console.print(f"{len(absent)} claim(s) of other recipes not listed: none of their runs is in {args.path} "
                      f"(--all lists them)")
    counts = {}
    for row in rows:
        counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
    print(json.dumps({"path": args.path, "claims": counts, "rows": rows}, default=str))
    return 0
