"""The analyzer's kernels in plain Python: the reference the compiled ones are tested against.

:mod:`llmtrace.analysis._kernels` picks these or the compiled ``llmtrace_native`` ones.
Each function here is written to be read, not to be fast — the compiled module carries the
speed budget (docs/analysis.md, "Performance"); without it these run, with the same results
(``test_critical_path.py``, ``test_gpu_idle_compiled.py`` and ``test_native_decoder.py`` in
tests/analysis/ compare both on random input).

* :func:`critical_path` — the backward walk described in :mod:`.critical_path`.
* :func:`path_totals` — that walk for every request, summed.
* :func:`classify_gaps` — the GPU idle gaps of one engine described in :mod:`.gpu_idle`:
  forward intervals joined, the gaps between them inside the analysed segments, the host's
  activities painted by priority in one interval sweep, each gap split by them.
* :meth:`PythonKernels.engine` — an engine's steps answered from its ``StepView`` objects
  (:class:`~llmtrace.analysis._steps.PythonEngine`), whether or not the compiled table
  holds them.
* The OTLP line decoder declines every line (the generic reader in ``sources/otlp.py`` reads
  them), and there is no engine table: every span is a Python object.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar

from llmtrace.analysis._steps import PythonEngine, StepStats, step_stats
from llmtrace.analysis.engine_table import EngineTable
from llmtrace.analysis.intervals import Interval, merge
from llmtrace.analysis.model import (
    GAP_CAUSES,
    HOST_CAUSE_INDEX,
    Dominant,
    EngineView,
    Gap,
    PathItem,
    PathSums,
    Section,
    Span,
)

_OTHER = GAP_CAUSES.index("other")

Children = Mapping[str, Sequence[Span]]
#: A host activity: start, end, cause index into GAP_CAUSES.
Painted = list[tuple[int, int, int]]


def _clipped_children(children: Children, span: Span, lo: int, hi: int) -> list[tuple[int, int, Span]]:
    """``span``'s children clipped to ``[lo, hi]`` (those entirely outside dropped; an empty
    child at an edge kept), latest end first, then latest start."""
    out = []
    for c in children.get(span.span_id, ()):
        s, e = max(c.start_ns, lo), min(c.end_ns, hi)
        if s < e or (s == e and lo <= c.start_ns <= hi):
            out.append((s, e, c))
    out.sort(key=lambda k: (k[1], k[0]), reverse=True)
    return out


def critical_path(children: Children, root: Span, overlap_allowance_ns: int) -> list[Section]:
    """Sections of the critical path of ``root``'s subtree, latest first; they tile ``root``."""
    sections: list[Section] = []
    # A frame: the span, its clipped start, its children (clipped, latest end first), a
    # cursor into them, and its name path.
    frames: list[tuple[Span, int, list[tuple[int, int, Span]], list[int], tuple[str, ...]]] = [
        (root, root.start_ns, _clipped_children(children, root, root.start_ns, root.end_ns), [0], (root.name,))
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
        while cursor[0] < len(kids):
            k = kids[cursor[0]]
            cursor[0] += 1
            if k[1] <= end + overlap_allowance_ns and k[0] < end and k[2].span_id not in on_path:
                chosen = k
                break
        if chosen is not None:
            cs, ce, child = chosen
            cut = min(ce, end)
            if cut < end:
                sections.append(Section(span, cut, end, stack))
            frames.append((child, cs, _clipped_children(children, child, cs, cut), [0], (*stack, child.name)))
            on_path.add(child.span_id)
            returning = cut
        else:
            if lo < end:
                sections.append(Section(span, lo, end, stack))
            frames.pop()
            on_path.discard(span.span_id)
            returning = lo
    return sections


def path_totals(items: Sequence[PathItem], overlap_allowance_ns: int) -> PathSums:
    """:func:`critical_path` of every request, summed (see :class:`PathSums`)."""
    totals: dict[str, list[int]] = {}
    folded: dict[tuple[str, ...], int] = {}
    dominant: Dominant = {}
    latency = 0
    for children, root, ttft_ns, span_id in items:
        sections = critical_path(children, root, overlap_allowance_ns)
        latency += root.end_ns - root.start_ns
        exclusive: dict[str, int] = {}
        for s in sections:
            exclusive[s.span.name] = exclusive.get(s.span.name, 0) + s.duration_ns
            folded[s.stack] = folded.get(s.stack, 0) + s.duration_ns
        for name, ns in exclusive.items():
            totals.setdefault(name, []).append(ns)
        _dominant(dominant, span_id, sections, ttft_ns)
    return PathSums(totals, folded, latency, dominant)


def _dominant(out: Dominant, span_id: str, sections: Sequence[Section], ttft_ns: int | None) -> None:
    """The span name owning most of the critical path (``(span_id, "e2e_s")``) and, with
    ``ttft_ns``, of its part before the first token (``(span_id, "ttft_s")``)."""
    whole: dict[str, int] = {}
    first: dict[str, int] = {}
    for s in sections:
        name = s.span.name
        if s.end_ns > s.start_ns:
            whole[name] = whole.get(name, 0) + s.end_ns - s.start_ns
        if ttft_ns is not None and min(s.end_ns, ttft_ns) > s.start_ns:
            first[name] = first.get(name, 0) + min(s.end_ns, ttft_ns) - s.start_ns
    for metric, exclusive in (("e2e_s", whole), ("ttft_s", first)):
        if exclusive:  # max keeps the first of equal totals, in first-seen order
            name, ns = max(exclusive.items(), key=lambda item: item[1])
            out[(span_id, metric)] = (name, ns / 1e9)


def classify_gaps(
    engine_id: str,
    segs: Sequence[Interval],
    forwards: Sequence[Span],
    hosts: Sequence[Span],
    extras: Sequence[tuple[int, int, int]],
    work: Sequence[Interval],
) -> list[Gap]:
    """The idle gaps of one engine, sorted: inside the sorted, disjoint analysed ``segs``,
    the time no forward covers, each split by what the host was doing (``hosts``: step host
    spans; ``extras``: ``(start, end, cause index)`` of gc pauses and tokenize spans) and
    measured against ``work`` (merged intervals when work was waiting)."""
    busy = merge((f.start_ns, f.end_ns) for f in forwards)
    painted = paint([(h.start_ns, h.end_ns, HOST_CAUSE_INDEX[h.name]) for h in hosts] + list(extras))
    painted_ends = [e for _, e, _ in painted]
    work_ends = [e for _, e in work]
    gaps = []
    for a, b in segment_gaps(segs, busy):
        per = [0] * len(GAP_CAUSES)
        for s, e, cause in _within(painted, painted_ends, a, b):
            per[cause] += _overlap(a, b, s, e)
        per[_OTHER] = (b - a) - sum(per)  # what no host activity explains
        causes = tuple((name, ns) for name, ns in zip(GAP_CAUSES, per, strict=True) if ns)
        waiting = sum(_overlap(a, b, s, e) for s, e in _within(work, work_ends, a, b))
        gaps.append(Gap(engine_id, a, b, causes, waiting))
    return gaps


def segment_gaps(segs: Sequence[Interval], busy: Sequence[Interval]) -> list[Interval]:
    """The parts of each segment that the sorted, disjoint ``busy`` intervals leave free."""
    busy_ends = [e for _, e in busy]
    out: list[Interval] = []
    for a, b in segs:
        cur = a
        for s, e in _within(busy, busy_ends, a, b):
            if s > cur:
                out.append((cur, s))
            cur = max(cur, e)
        if cur < b:
            out.append((cur, b))
    return out


def paint(intervals: Sequence[tuple[int, int, int]]) -> Painted:
    """Overlapping ``(start, end, cause)`` intervals as disjoint sorted segments, each owned
    by the active cause earliest in :data:`GAP_CAUSES` (one sweep over start/end events)."""
    # At one instant, ends come before starts (an interval ending where another starts
    # does not overlap it).
    events = sorted([(s, 1, c) for s, _, c in intervals] + [(e, 0, c) for _, e, c in intervals])
    active = [0] * len(GAP_CAUSES)
    out: Painted = []
    prev = events[0][0] if events else 0
    for pos, is_start, cause in events:
        owner = next((c for c, n in enumerate(active) if n > 0), None)
        if pos > prev and owner is not None:
            if out and out[-1][2] == owner and out[-1][1] == prev:
                out[-1] = (out[-1][0], pos, owner)
            else:
                out.append((prev, pos, owner))
        active[cause] += 1 if is_start else -1
        prev = pos
    return out


_I = TypeVar("_I", bound=tuple[int, ...])


def _within(intervals: Sequence[_I], ends: Sequence[int], a: int, b: int) -> Iterator[_I]:
    """The sorted, disjoint ``intervals`` (``ends``: their ends) that reach into ``(a, b)``."""
    i = bisect_right(ends, a)
    while i < len(intervals) and intervals[i][0] < b:
        yield intervals[i]
        i += 1


def _overlap(a: int, b: int, s: int, e: int) -> int:
    return max(0, min(e, b) - max(s, a))


class PythonKernels:
    """The kernels in Python (see the module doc)."""

    compiled = False
    critical_path = staticmethod(critical_path)
    path_totals = staticmethod(path_totals)
    classify_gaps = staticmethod(classify_gaps)

    def decode_line(self, data: bytes, strings: dict[str, str], table: EngineTable | None) -> list[Span] | None:
        """Declines: the generic reader reads every line."""
        return None

    def new_engine_table(self) -> EngineTable | None:
        """None: every span is a Python object."""
        return None

    def chrome_trace_events(self) -> None:
        """None: the Python writer (``analysis/perfetto.py``) writes exports."""
        return None

    def engine(self, view: EngineView) -> PythonEngine:
        """The reference over ``view``'s ``StepView`` objects (those of an engine the
        compiled table holds are made from it)."""
        return PythonEngine(view, classify_gaps)

    def step_stats(self, views: Sequence[EngineView]) -> StepStats:
        return step_stats([s for v in views for s in v.steps])
