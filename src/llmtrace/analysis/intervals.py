"""Half-open integer intervals ``(start, end)`` and their union."""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Union of ``intervals`` as a sorted list of disjoint, non-touching intervals."""
    out: list[Interval] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out
