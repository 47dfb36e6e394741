"""Small, dependency-free statistics: percentiles, median/MAD, Mann-Whitney U."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float, *, presorted: bool = False) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation (numpy's default method)."""
    if not values:
        return math.nan
    xs = values if presorted else sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def pcts(values: Sequence[float], qs: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
    xs = sorted(values)
    return {f"p{q:g}": percentile(xs, q, presorted=True) for q in qs}


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def mad(values: Sequence[float], center: float | None = None) -> float:
    """Median absolute deviation (unscaled)."""
    if not values:
        return math.nan
    c = median(values) if center is None else center
    return median([abs(v - c) for v in values])


def mann_whitney_greater(base: Sequence[float], current: Sequence[float]) -> float:
    """One-sided p-value that ``current`` tends to be larger than ``base``.

    Normal approximation with tie correction and continuity correction; fine for the sample
    sizes a benchmark run produces (tens or more per side). Returns 1.0 when either side is
    empty or every value is tied.
    """
    n1, n2 = len(base), len(current)
    if n1 == 0 or n2 == 0:
        return 1.0
    merged = sorted([(v, 0) for v in base] + [(v, 1) for v in current])
    ranks = [0.0] * len(merged)
    tie_term = 0.0
    i = 0
    while i < len(merged):
        j = i
        while j + 1 < len(merged) and merged[j + 1][0] == merged[i][0]:
            j += 1
        rank = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[k] = rank
        t = j - i + 1
        tie_term += t**3 - t
        i = j + 1
    r2 = sum(r for r, (_, side) in zip(ranks, merged, strict=True) if side == 1)
    u2 = r2 - n2 * (n2 + 1) / 2
    mean = n1 * n2 / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (u2 - mean - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2))
