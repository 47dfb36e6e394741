"""Half-open integer intervals ``(start, end)``: union, intersection and subtraction over
sorted disjoint lists (the shape :func:`merge` returns)."""

from __future__ import annotations

from bisect import bisect_right
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


class Cover:
    """A merged interval list with fast ``[a, b)`` queries (bisect on the starts)."""

    __slots__ = ("ends", "intervals", "starts")

    def __init__(self, intervals: Iterable[Interval]) -> None:
        self.intervals = merge(intervals)
        self.starts = [s for s, _ in self.intervals]
        self.ends = [e for _, e in self.intervals]

    def pieces(self, a: int, b: int) -> list[Interval]:
        """The parts of ``[a, b)`` this cover contains."""
        out = []
        i = max(0, bisect_right(self.starts, a) - 1)
        n = len(self.intervals)
        while i < n and self.starts[i] < b:
            s, e = max(self.starts[i], a), min(self.ends[i], b)
            if s < e:
                out.append((s, e))
            i += 1
        return out

    def overlap(self, a: int, b: int) -> int:
        return sum(e - s for s, e in self.pieces(a, b))


def subtract(pieces: list[Interval], cover: Cover) -> tuple[list[Interval], int]:
    """Remove ``cover`` from ``pieces``; return the remainder and how many ns were removed."""
    remaining: list[Interval] = []
    removed = 0
    for a, b in pieces:
        cur = a
        for s, e in cover.pieces(a, b):
            if s > cur:
                remaining.append((cur, s))
            removed += e - s
            cur = e
        if cur < b:
            remaining.append((cur, b))
    return remaining, removed


def gaps(covered: Interval, busy: list[Interval]) -> list[Interval]:
    """The parts of ``covered`` not in the merged list ``busy``."""
    a, b = covered
    out = []
    cur = a
    for s, e in busy:
        if e <= a or s >= b:
            continue
        if s > cur:
            out.append((cur, s))
        cur = max(cur, e)
    if cur < b:
        out.append((cur, b))
    return out
