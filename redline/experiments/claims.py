"""The source design's claims (claims.toml) set against what a sweep measured.

Each claim is a ratio treatment / control on one metric. What we measured becomes a ratio with a 95%
interval (stats.ratio: Welch on the logs; for perplexity, Welch on the losses). The verdict:

- the claim band: the claimed change and anything within a factor of `tolerance` (2) of its size, in log
  space — "+5% speed" covers +2.5% … +10.25%, "4× better" covers 2× … 8× better. Claims are stated
  loosely; this band is what "the claim holds" is taken to mean;
- refuted: the whole interval lies outside the band (the effect is clearly smaller, larger, or the other
  way round);
- confirmed: at least two runs a side, the interval excludes "no effect" on the claimed side, and the
  measured ratio lies inside the band;
- inconclusive: anything else.

With a single run on a side there is no measured spread. The interval is then the measured ratio
± 3·√2 × an assumed run-to-run noise (ASSUMED_NOISE, a relative standard deviation per metric), which
can only refute a claim that is far off; such a claim is never confirmed.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from redline.errors import UserError, one_line, read_text_file
from redline.experiments import stats
from redline.experiments.recipes import AXES
from redline.experiments.results import COMPLETED, matches

METRICS = ("tokens_per_second", "perplexity", "peak_memory_gib")
# relative run-to-run standard deviation assumed when a side has one run (then nothing is confirmed)
ASSUMED_NOISE = {"tokens_per_second": 0.03, "perplexity": 0.02, "peak_memory_gib": 0.01}


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    metric: str
    ratio: float | None = None
    treatment: dict[str, Any] = field(default_factory=dict)
    control: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    measurable: bool = True
    reason: str = ""
    tolerance: float = 2.0

    def band(self) -> tuple[float, float]:
        change = math.log(self.ratio)
        a, b = math.exp(change / self.tolerance), math.exp(change * self.tolerance)
        return min(a, b), max(a, b)


def load_claims(path: str | Path | None = None) -> list[Claim]:
    """The built-in claims, or those of a TOML file with the same [[claim]] tables."""
    if path is None:
        text, where = resources.files("redline.experiments").joinpath("claims.toml").read_text(), "built-in claims"
    else:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"claims file {path} not found; give a .toml file with [[claim]] tables")
        text, where = read_text_file(p, "claims file"), str(p)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"cannot parse {where}: {one_line(e)}") from None
    claims = []
    known = [f.name for f in fields(Claim)]
    for raw in data.get("claim", []):
        unknown = [k for k in raw if k not in known]
        if unknown:
            raise UserError(f"{where}: claim {raw.get('id', '?')}: unknown key {unknown[0]!r}; a claim takes "
                            f"{', '.join(known)}")
        try:
            claim = Claim(**raw)
        except TypeError as e:
            raise UserError(f"{where}: claim {raw.get('id', '?')}: {e}") from None
        if claim.metric not in METRICS:
            raise UserError(f"{where}: claim {claim.id}: metric must be one of {', '.join(METRICS)}, got {claim.metric!r}")
        if claim.measurable and (claim.ratio is None or claim.ratio <= 0 or claim.ratio == 1 or not claim.treatment
                                 or not claim.control):
            raise UserError(f"{where}: claim {claim.id} needs a positive ratio other than 1, a treatment and a control")
        for selector in (claim.treatment, claim.control):
            unknown = set(selector) - set(AXES)
            if unknown:
                raise UserError(f"{where}: claim {claim.id}: unknown axis {sorted(unknown)[0]!r}; use {', '.join(AXES)}")
        claims.append(claim)
    if not claims:
        raise UserError(f"{where} holds no [[claim]] tables")
    return claims


def _context(run: dict[str, Any], open_axes: list[str]) -> tuple:
    return tuple(run.get(axis) for axis in open_axes)


def measure(claim: Claim, side_t: list[dict], side_c: list[dict]) -> stats.Difference | None:
    if claim.metric == "perplexity":
        loss_t = [r.get("final_val_loss") for r in side_t]
        loss_c = [r.get("final_val_loss") for r in side_c]
        return stats.exp_difference(stats.welch(loss_t, loss_c))
    return stats.ratio([r.get(claim.metric) for r in side_t], [r.get(claim.metric) for r in side_c])


def verdict(claim: Claim, d: stats.Difference) -> tuple[str, float, float, str]:
    """(verdict, low, high, how the interval was made) for a measured ratio d."""
    band_lo, band_hi = claim.band()
    if d.tested:
        low, high = d.low, d.high
        how = f"{d.n_a} vs {d.n_b} runs, Welch {d.confidence:.0%} interval"
    else:
        width = 3 * math.sqrt(2) * ASSUMED_NOISE[claim.metric]
        low, high = d.estimate * math.exp(-width), d.estimate * math.exp(width)
        how = (f"{d.n_a} vs {d.n_b} runs: no measured spread; interval = ±3·√2 × an assumed "
               f"{ASSUMED_NOISE[claim.metric]:.0%} run-to-run noise, so this can refute but never confirm")
    if high < band_lo or low > band_hi:
        return "refuted", low, high, how
    claimed_side = low > 1.0 if claim.ratio > 1 else high < 1.0
    if d.tested and claimed_side and band_lo <= d.estimate <= band_hi:
        return "confirmed", low, high, how
    return "inconclusive", low, high, how


def evaluate_claims(runs: list[dict[str, Any]], claims: list[Claim] | None = None) -> list[dict[str, Any]]:
    """One row per claim and context where both sides were measured (or one row saying why not)."""
    claims = claims if claims is not None else load_claims()
    done = [r for r in runs if r.get("status") == COMPLETED]
    varying = {a for a in AXES if len({r.get(a) for r in done}) > 1}
    rows = []
    for claim in claims:
        base = {"id": claim.id, "claim": claim.text, "metric": claim.metric, "claimed_ratio": claim.ratio,
                "note": claim.note, "treatment": claim.treatment, "control": claim.control}
        if not claim.measurable:
            rows.append({**base, "verdict": "not measured", "reason": claim.reason})
            continue
        open_axes = [a for a in AXES if a not in claim.treatment and a not in claim.control]
        side_t: dict[tuple, list] = {}
        side_c: dict[tuple, list] = {}
        for run in done:
            if matches(run, claim.treatment):
                side_t.setdefault(_context(run, open_axes), []).append(run)
            if matches(run, claim.control):
                side_c.setdefault(_context(run, open_axes), []).append(run)
        contexts = [c for c in side_t if c in side_c]
        if not contexts:
            missing = "treatment" if not side_t else "control" if not side_c else "treatment and control in a common setting"
            # absent: neither side ran here (the claim is another recipe's), as against a sweep missing one side
            rows.append({**base, "verdict": "not measured", "absent": not side_t and not side_c,
                         "reason": f"no completed runs for the {missing} in this result set ({_selector(claim.treatment)} vs {_selector(claim.control)})"})
            continue
        band = claim.band()
        for context in contexts:
            d = measure(claim, side_t[context], side_c[context])
            if d is None:
                rows.append({**base, "verdict": "not measured", "reason": f"no {claim.metric} values recorded"})
                continue
            result, low, high, how = verdict(claim, d)
            shown = {a: v for a, v in zip(open_axes, context) if a in varying}
            rows.append({**base, "context": shown, "verdict": result,
                         "measured_ratio": d.estimate, "low": low, "high": high, "interval": how,
                         "p_value": d.p_value, "n": [d.n_a, d.n_b], "band": list(band),
                         "measured_change_pct": (d.estimate - 1) * 100})
    return rows


def _selector(selector: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in selector.items())


def claims_markdown(rows: list[dict[str, Any]]) -> str:
    """The claims as a markdown table; claims neither side of which ran here (other recipes') are counted in a line
    after it, not listed."""
    lines = ["| claim | measured (treatment / control) | 95% interval | claim band | runs | verdict |",
             "|---|---|---|---|---|---|"]
    notes = []
    absent = [row for row in rows if row.get("absent")]
    for row in (row for row in rows if not row.get("absent")):
        if "measured_ratio" not in row:
            lines.append(f"| {row['claim']} | — | — | — | — | {row['verdict']}: {row.get('reason', '')} |")
            continue
        context = ", ".join(f"{k}={v}" for k, v in row.get("context", {}).items())
        change = f"{row['measured_ratio']:.3f}× ({row['measured_change_pct']:+.1f}%)"
        lines.append(f"| {row['claim']}{f' ({context})' if context else ''} | {row['metric']}: {change} | "
                     f"{row['low']:.3f}–{row['high']:.3f}× | {row['band'][0]:.3f}–{row['band'][1]:.3f}× | "
                     f"{row['n'][0]} vs {row['n'][1]} | **{row['verdict']}** |")
        if row["n"][0] < 2 or row["n"][1] < 2:
            notes.append(row["id"])
    out = "\n".join(lines)
    if absent:
        out += (f"\n\n{len(absent)} claim(s) of other recipes are not listed: none of their runs is in this result set "
                f"(`redline claims DIR --all` lists them).")
    if notes:
        out += ("\n\nWith one run on a side the interval is not measured: it is the measured ratio ± 3·√2 × an assumed "
                "run-to-run noise (3% for speed, 2% for perplexity, 1% for memory), so those rows can refute a far-off claim "
                "but cannot confirm one. Run more seeds to test them.")
    return out
