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
from operator import itemgetter
from typing import NamedTuple

from llmtrace.analysis._native import native
from llmtrace.analysis.model import RequestView, Span, Trace, clamped_ns
from llmtrace.analysis.stats import pcts


class Section(NamedTuple):
    """``span`` owns the critical path in ``[start_ns, end_ns)``; ``stack`` is the name path.

    A named tuple (like ``Span``): there are several per request, and the compiled walk
    allocates them directly."""

    span: Span
    start_ns: int
    end_ns: int
    stack: tuple[str, ...]

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


_compiled = native.critical_path if native is not None else None
_compiled_totals = native.path_totals if native is not None else None
_END_THEN_START = itemgetter(1, 0)



def _clipped_children(trace: Trace, span: Span, lo: int, hi: int) -> list[tuple[int, int, Span]]:
    out = []
    for c in trace.children.get(span.span_id, ()):
        s, e = max(c.start_ns, lo), min(c.end_ns, hi)
        if s < e or (s == e and lo <= c.start_ns <= hi):
            out.append((s, e, c))
    out.sort(key=_END_THEN_START, reverse=True)
    return out


def critical_path(trace: Trace, root: Span, *, overlap_allowance_ns: int = 0) -> list[Section]:
    """Sections of the critical path of ``root``'s subtree, latest first; they tile ``root``."""
    if _compiled is not None and type(trace.children) is dict:
        try:  # the same walk compiled (native/src/critical_path.rs)
            sections: list[Section] = _compiled(trace.children, root, overlap_allowance_ns, Section)
            return sections
        except OverflowError:  # a time beyond int64 (the generic decoder accepts any integer)
            pass
    return _critical_path(trace, root, overlap_allowance_ns)


def _critical_path(trace: Trace, root: Span, overlap_allowance_ns: int) -> list[Section]:
    """:func:`critical_path` in Python: the reference, and the path without llmtrace-native."""
    sections: list[Section] = []
    # A frame: the span, its clipped start, its children (clipped, latest end first), a
    # cursor into them, and its name path (built once per frame, shared by its sections).
    frames: list[tuple[Span, int, list[tuple[int, int, Span]], list[int], tuple[str, ...]]] = [
        (root, root.start_ns, _clipped_children(trace, root, root.start_ns, root.end_ns), [0], (root.name,))
    ]
    returning = root.end_ns
    # Spans on the current path. Corrupt data can make parent ids form a cycle (a request
    # whose HTTP parent names the request as its own parent): a child already on the path
    # is not descended into again, or the walk would never end.
    on_path = {root.span_id}
    while frames:
        span, lo, kids, cursor, stack = frames[-1]
        end = returning
        chosen = None
        i = cursor[0]
        while i < len(kids):
            k = kids[i]
            i += 1
            if k[1] <= end + overlap_allowance_ns and k[0] < end and k[2].span_id not in on_path:
                chosen = k
                break
        cursor[0] = i
        if chosen is not None:
            cs, ce, child = chosen
            cut = min(ce, end)
            if cut < end:
                sections.append(Section(span, cut, end, stack))
            frames.append((child, cs, _clipped_children(trace, child, cs, cut), [0], (*stack, child.name)))
            on_path.add(child.span_id)
            returning = cut
        else:
            if lo < end:
                sections.append(Section(span, lo, end, stack))
            frames.pop()
            on_path.discard(span.span_id)
            returning = lo
    return sections


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


#: (request span id, "e2e_s" | "ttft_s") -> (span name, seconds): the top critical-path
#: segment of that part of the request.
Dominant = dict[tuple[str, str], tuple[str, float]]


class PathTotals(NamedTuple):
    """What the analysis keeps of every request's critical path."""

    stats: list[SegmentStats]
    folded: dict[tuple[str, ...], int]
    dominant: Dominant


def request_paths(requests: Sequence[RequestView], *, overlap_allowance_ns: int = 0) -> PathTotals:
    """Each request's critical path (from :attr:`RequestView.root`), aggregated
    (:func:`aggregate`), with each request's dominant segment of the whole path and of its
    part before the first token (the anomalies name them)."""
    items = _path_items(requests)
    if _compiled_totals is not None and all(type(item[0]) is dict for item in items):
        try:  # the walks and their sums in one call (native/src/critical_path.rs)
            totals, folded, latency_total, dominant = _compiled_totals(items, overlap_allowance_ns)
            return PathTotals(segment_stats(totals, latency_total), folded, dominant)
        except OverflowError:  # a time beyond int64 (the generic decoder accepts any integer)
            pass
    return _request_paths(requests, items, overlap_allowance_ns)


#: What one request's walk needs: its trace's children, the root, the first token's time
#: (``None``: unknown) and the request span id that keys its dominant segments.
PathItem = tuple[object, Span, int | None, str]


def _path_items(requests: Sequence[RequestView]) -> list[PathItem]:
    # The first-token offset is truncated to whole nanoseconds, as it always was, and clamped
    # (an absurd TTFT attribute lies past every span).
    return [
        (r.trace.children, r.root, None if (t := r.ttft_s) is None else r.request.start_ns + int(clamped_ns(t)),
         r.request.span_id)
        for r in requests
    ]


def _request_paths(
    requests: Sequence[RequestView], items: Sequence[PathItem], overlap_allowance_ns: int
) -> PathTotals:
    """:func:`request_paths` in Python: the reference, and the path without llmtrace-native."""
    paths = [
        (r.root.duration_ns, critical_path(r.trace, r.root, overlap_allowance_ns=overlap_allowance_ns))
        for r in requests
    ]
    stats, folded = aggregate(paths)
    dominant: Dominant = {}
    for (_, _, ttft_ns, span_id), (_, sections) in zip(items, paths, strict=True):
        _dominant(dominant, span_id, sections, ttft_ns)
    return PathTotals(stats, folded, dominant)


def _dominant(out: Dominant, span_id: str, sections: Sequence[Section], ttft_ns: int | None) -> None:
    """The span name owning most of the critical path (``(span_id, "e2e_s")``) and, with
    ``ttft_ns``, of its part before the first token (``(span_id, "ttft_s")``): one pass."""
    whole: dict[str, int] = {}
    first: dict[str, int] = {}
    for s in sections:
        start, end, name = s.start_ns, s.end_ns, s.span.name
        if end > start:
            whole[name] = whole.get(name, 0) + end - start
        if ttft_ns is not None:
            cut = end if end < ttft_ns else ttft_ns
            if cut > start:
                first[name] = first.get(name, 0) + cut - start
    for metric, excl in (("e2e_s", whole), ("ttft_s", first)):
        if excl:  # max keeps the first of equal totals, in first-seen order
            name, ns = max(excl.items(), key=_NS)
            out[(span_id, metric)] = (name, ns / 1e9)


_NS = itemgetter(1)
