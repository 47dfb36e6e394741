"""Critical path of a request, and its CRISP-style aggregation across requests.

Per request this is the Jaeger UI's algorithm: start at the root's end, walk back to the
child that finished last, and recurse into it; when a span has no child finishing before
the current point, the span itself owns the time back to its start, and the walk returns to
the parent at that child's start::

    root |0..................................................180|
    a        |10....40|
    b                      |45..........120|
    c                               |80..................170|

    path, latest first: root 170-180, c 80-170, root 40-80 (b ends at 120, after c
    started, so it is not on the path), a 10-40, root 0-10.

Children are clipped to their parent first (a child outliving its parent — clock skew, an
un-ended span — only counts inside the parent) and children entirely outside are dropped.
Links (follows-from) are not children and never extend the path. Two deliberate
deviations from the Jaeger UI, both documented in docs/analysis.md:

* a child that ends *exactly* when the next one starts is on the path (Jaeger uses ``<``,
  which would skip every phase of a request, since our phases are contiguous by construction);
* ``overlap_allowance_ns`` lets a child that overlaps the next one by up to that much
  still count, cut at the overlap (useful when phases are recorded by different threads).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from llmtrace.analysis._kernels import KERNELS
from llmtrace.analysis.model import Dominant, PathItem, RequestView, Section, Span, Trace, clamped_ns
from llmtrace.analysis.stats import pcts


def critical_path(trace: Trace, root: Span, *, overlap_allowance_ns: int = 0) -> list[Section]:
    """Sections of the critical path of ``root``'s subtree, latest first; they tile ``root``."""
    return KERNELS.critical_path(trace.children, root, overlap_allowance_ns)


@dataclass(frozen=True, slots=True)
class SegmentStats:
    """Aggregate of one span name's exclusive critical-path time across requests."""

    name: str
    total_s: float
    share: float
    requests: int
    p50_s: float
    p95_s: float
    p99_s: float


def exclusive_by_name(sections: Iterable[Section]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in sections:
        name = s.span.name
        out[name] = out.get(name, 0) + s.end_ns - s.start_ns
    return out


def aggregate(
    per_request: Sequence[tuple[int, Sequence[Section]]],
) -> tuple[list[SegmentStats], dict[tuple[str, ...], int]]:
    """CRISP-style aggregation of ``(latency_ns, sections)`` pairs.

    Returns per-name stats sorted by share (descending) — the share is the name's total
    critical-path time over the total latency of all requests, so shares sum to 1 — and the
    folded stacks (name path -> total ns) that the flame view draws. Percentiles are over the
    requests in which the name is on the critical path.
    """
    totals: dict[str, list[int]] = {}
    folded: dict[tuple[str, ...], int] = {}
    latency_total = 0
    for latency, sections in per_request:
        latency_total += latency
        for name, ns in exclusive_by_name(sections).items():
            totals.setdefault(name, []).append(ns)
        for s in sections:
            stack = s.stack
            folded[stack] = folded.get(stack, 0) + s.end_ns - s.start_ns
    return segment_stats(totals, latency_total), folded


def segment_stats(totals: Mapping[str, Sequence[int]], latency_total: int) -> list[SegmentStats]:
    """Per-name stats from each name's exclusive nanoseconds in the requests it is on."""
    stats = []
    for name, values in totals.items():
        total = sum(values)
        p = pcts([v / 1e9 for v in values], (50, 95, 99))
        stats.append(
            SegmentStats(
                name,
                total / 1e9,
                total / latency_total if latency_total else 0.0,
                len(values),
                p["p50"],
                p["p95"],
                p["p99"],
            )
        )
    stats.sort(key=lambda s: (-s.share, s.name))
    return stats


class PathTotals(NamedTuple):
    """What the analysis keeps of every request's critical path."""

    stats: list[SegmentStats]
    folded: dict[tuple[str, ...], int]
    dominant: Dominant


def request_paths(requests: Sequence[RequestView], *, overlap_allowance_ns: int = 0) -> PathTotals:
    """Each request's critical path (from :attr:`RequestView.root`), aggregated
    (:func:`aggregate`), with each request's dominant segment of the whole path and of its
    part before the first token (the anomalies name them)."""
    sums = KERNELS.path_totals(path_items(requests), overlap_allowance_ns)
    return PathTotals(segment_stats(sums.totals, sums.latency_ns), sums.folded, sums.dominant)


def path_items(requests: Sequence[RequestView]) -> list[PathItem]:
    """What each request's walk needs (:data:`~llmtrace.analysis.model.PathItem`)."""
    # The first-token offset is truncated to whole nanoseconds, and clamped (an absurd TTFT
    # attribute lies past every span).
    return [
        (r.trace.children, r.root, None if (t := r.ttft_s) is None else r.request.start_ns + int(clamped_ns(t)),
         r.request.span_id)
        for r in requests
    ]


__all__ = [
    "Dominant",
    "PathTotals",
    "Section",
    "SegmentStats",
    "aggregate",
    "critical_path",
    "exclusive_by_name",
    "path_items",
    "request_paths",
    "segment_stats",
]
