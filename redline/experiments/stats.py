"""Statistics for comparing runs over seeds: summaries, Welch's t-test and interval, ratio intervals, and an
exact permutation test.

How it works:
- A difference of means a − b gets Welch's t-test (unequal variances): standard error
  se = sqrt(s_a²/n_a + s_b²/n_b), degrees of freedom by Welch–Satterthwaite,
  df = se⁴ / ((s_a²/n_a)² / (n_a − 1) + (s_b²/n_b)² / (n_b − 1)), and the interval estimate ± t_{df, 1−α/2} · se.
- A ratio (tokens/s, memory, perplexity) is a difference of logs: Welch on log a − log b, then exp. The
  estimate is then the ratio of geometric means, and the interval never crosses zero. Perplexity is
  exp(loss), so a perplexity ratio is exp of the difference of mean losses, exactly.
- With fewer than two values on a side there is no spread to test against: the estimate is given, the
  interval and p-value are None, and the caller must say so (claims.py does).
- The permutation test enumerates every split of the pooled values when there are at most 100,000 of them
  (3 vs 3 seeds: 20 splits, so its smallest possible p is 0.1 — a reason to run more seeds), else samples.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float | None
    std: float | None  # sample standard deviation (n − 1); None below two values
    values: tuple[float, ...]


@dataclass(frozen=True)
class Difference:
    """a − b (or a / b for ratios) with a two-sided interval and p-value; bounds None without a spread."""

    estimate: float
    low: float | None
    high: float | None
    p_value: float | None
    t: float | None
    df: float | None
    n_a: int
    n_b: int
    confidence: float
    method: str  # "welch" | "welch-log" | "single-run"

    @property
    def tested(self) -> bool:
        return self.low is not None


def summarize(values) -> Summary:
    vals = tuple(float(v) for v in values if v is not None and math.isfinite(float(v)))
    if not vals:
        return Summary(0, None, None, ())
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
    return Summary(len(vals), mean, std, vals)


def _t_dist():
    from scipy import stats  # imported here: scipy takes a second to import, and most commands never need it

    return stats.t


def welch(a, b, confidence: float = 0.95) -> Difference | None:
    """Welch's t-test and interval for mean(a) − mean(b); None when a side has no values."""
    sa, sb = summarize(a), summarize(b)
    if sa.n == 0 or sb.n == 0:
        return None
    estimate = sa.mean - sb.mean
    if sa.n < 2 or sb.n < 2:
        return Difference(estimate, None, None, None, None, None, sa.n, sb.n, confidence, "single-run")
    va, vb = sa.std**2 / sa.n, sb.std**2 / sb.n
    se = math.sqrt(va + vb)
    if se == 0.0:  # identical values within each side: the difference is exact
        p = 1.0 if estimate == 0 else 0.0
        return Difference(estimate, estimate, estimate, p, None, None, sa.n, sb.n, confidence, "welch")
    df = (va + vb) ** 2 / (va**2 / (sa.n - 1) + vb**2 / (sb.n - 1))
    t = estimate / se
    dist = _t_dist()
    p = float(2 * dist.sf(abs(t), df))
    half = float(dist.ppf(0.5 + confidence / 2, df)) * se
    return Difference(estimate, estimate - half, estimate + half, p, t, df, sa.n, sb.n, confidence, "welch")


def ratio(a, b, confidence: float = 0.95) -> Difference | None:
    """a / b as the ratio of geometric means, with Welch's interval on the logs; None without positive values."""
    la = [math.log(v) for v in a if v is not None and v > 0]
    lb = [math.log(v) for v in b if v is not None and v > 0]
    d = welch(la, lb, confidence)
    if d is None:
        return None
    low = math.exp(d.low) if d.low is not None else None
    high = math.exp(d.high) if d.high is not None else None
    method = "welch-log" if d.method == "welch" else d.method
    return Difference(math.exp(d.estimate), low, high, d.p_value, d.t, d.df, d.n_a, d.n_b, confidence, method)


def exp_difference(d: Difference | None) -> Difference | None:
    """A difference of logs (e.g. of losses in nats) as a ratio (e.g. of perplexities)."""
    if d is None:
        return None
    low = math.exp(d.low) if d.low is not None else None
    high = math.exp(d.high) if d.high is not None else None
    method = "welch-log" if d.method == "welch" else d.method
    return Difference(math.exp(d.estimate), low, high, d.p_value, d.t, d.df, d.n_a, d.n_b, d.confidence, method)


def permutation_test(a, b, max_exact: int = 100_000, samples: int = 20_000, seed: int = 0) -> float | None:
    """Two-sided p-value of |mean(a) − mean(b)| under random relabelling; None without two values a side."""
    a = [float(v) for v in a if v is not None]
    b = [float(v) for v in b if v is not None]
    if len(a) < 2 or len(b) < 2:
        return None
    pooled, n_a = a + b, len(a)
    total = sum(pooled)
    observed = abs(sum(a) / n_a - sum(b) / len(b))
    tolerance = 1e-12 * max(1.0, observed)

    def stat(sum_a: float) -> float:
        return abs(sum_a / n_a - (total - sum_a) / len(b))

    if math.comb(len(pooled), n_a) <= max_exact:
        hits = count = 0
        for idx in itertools.combinations(range(len(pooled)), n_a):
            count += 1
            hits += stat(sum(pooled[i] for i in idx)) >= observed - tolerance
        return hits / count
    rng = random.Random(seed)
    hits = 0
    for _ in range(samples):
        idx = rng.sample(range(len(pooled)), n_a)
        hits += stat(sum(pooled[i] for i in idx)) >= observed - tolerance
    return (hits + 1) / (samples + 1)


def interpolate(xs: list[float], ys: list[float], x: float) -> float | None:
    """Linear interpolation of y at x on an increasing xs; None outside the range."""
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    for i in range(1, len(xs)):
        if x <= xs[i]:
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return y1 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]
