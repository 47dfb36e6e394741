"""GPU idle gaps per engine: the white space between ``llm.forward`` spans.

For each engine (``llm.engine.id``) the analysed time is the union of its sampled
``llm.engine`` windows; windows whose step ids are consecutive are joined, so the gap
between the last forward of one window and the first of the next counts, while an
unsampled stretch never does. Without windows, runs of consecutive step ids stand in.
Inside that time, idle = covered time minus the union of forward intervals::

    window  |-------------------------------------------------------------|
    step       |--sched--|=====forward=====|--post--|  |--sched--|==forward==|
    gaps    |~~|~~~~~~~~~|                 |~~~~~~~~~~~~~~~~~~~~~~~|        |~|
             other schedule                 postprocess   other  schedule

Each gap is split by what the host was doing, in priority order: ``gc`` (a collector pause
stops everything), ``schedule``, ``postprocess``, ``sample``, ``tokenize``, else ``other``;
and separately into "idle with work waiting" (a request was in flight — from ``llm.request``
intervals, or from step attributes when request traces are sampled out) and "idle, nothing
to do". The first is lost throughput; the second is just a quiet server.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from llmtrace import semconv as sc
from llmtrace.analysis.intervals import Interval, merge
from llmtrace.analysis.model import EngineView, RequestView, Span, StepView, WindowView
from llmtrace.analysis.stats import pcts

CAUSES = ("gc", "schedule", "postprocess", "sample", "tokenize", "other")
_STEP_HOST_CAUSE = {
    sc.SPAN_SCHEDULE: "schedule",
    sc.SPAN_POSTPROCESS: "postprocess",
    sc.SPAN_SAMPLE: "sample",
}
#: How many of the largest gaps a result keeps for the reports (the totals count all gaps).
TOP_GAPS = 20


class Gap(NamedTuple):
    """One idle interval of one engine, with its cause split and work-waiting time.

    A named tuple, not a dataclass: there is one per step, and a frozen dataclass's
    ``__init__`` would cost more than classifying the gap.
    """

    engine_id: str
    start_ns: int
    end_ns: int
    causes: tuple[tuple[str, int], ...]  # (cause, ns), only non-zero causes
    work_waiting_ns: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def main_cause(self) -> str:
        return max(self.causes, key=lambda c: c[1])[0] if self.causes else "other"


@dataclass(frozen=True, slots=True)
class EngineIdle:
    """GPU idle summary of one engine over its sampled windows."""

    engine_id: str
    covered_ns: int
    busy_ns: int
    gap_count: int
    by_cause_ns: dict[str, int]
    with_work_waiting_ns: int
    gap_p50_ns: float
    gap_p99_ns: float
    top_gaps: tuple[Gap, ...]
    segments: tuple[Interval, ...]
    steps: int
    gaps: tuple[Gap, ...]  # every gap, by start time (per-window diagnosis, the timeline)

    @property
    def idle_ns(self) -> int:
        return self.covered_ns - self.busy_ns

    @property
    def ratio(self) -> float:
        return self.idle_ns / self.covered_ns if self.covered_ns else 0.0

    @property
    def nothing_to_do_ns(self) -> int:
        return self.idle_ns - self.with_work_waiting_ns


def segments(engine: EngineView) -> list[Interval]:
    """The engine's analysed time: windows joined where their step ids are consecutive."""
    if engine.windows:
        return _join_windows(engine.windows)
    out: list[Interval] = []
    prev: StepView | None = None
    for st in engine.steps:
        contiguous = prev is not None and (st.step_id is None or prev.step_id is None or st.step_id == prev.step_id + 1)
        if contiguous and out:
            out[-1] = (out[-1][0], max(out[-1][1], st.step.end_ns))
        else:
            out.append((st.step.start_ns, st.step.end_ns))
        prev = st
    return merge(out)


def _join_windows(windows: Sequence[WindowView]) -> list[Interval]:
    out: list[Interval] = []
    prev: WindowView | None = None
    for w in sorted(windows, key=lambda w: w.start_ns):
        joined = (
            prev is not None
            and prev.last_step_id is not None
            and w.first_step_id is not None
            and w.first_step_id == prev.last_step_id + 1
        )
        if out and (joined or w.start_ns <= out[-1][1]):
            out[-1] = (out[-1][0], max(out[-1][1], w.end_ns))
        else:
            out.append((w.start_ns, w.end_ns))
        prev = w
    return out


def work_intervals(engine: EngineView, requests: Sequence[RequestView]) -> list[Interval]:
    """When work was waiting: requests in flight, plus what step attributes reveal.

    A step with a non-empty batch had work during the whole step; the stretch between two
    steps had work when the first left requests waiting, or requests were running on both
    sides of it. Request intervals are added where request traces were kept — they are
    exact, but sampled, which is why the step attributes are always used too.
    """
    out: list[Interval] = [(r.request.start_ns, r.request.end_ns) for r in requests]
    prev: StepView | None = None
    for st in engine.steps:
        if st.batch_size > 0:
            out.append((st.step.start_ns, st.step.end_ns))
        if prev is not None and (prev.waiting > 0 or (prev.running > 0 and st.running > 0)):
            out.append((prev.step.end_ns, st.step.start_ns))
        prev = st
    return out


def paint_host(engine: EngineView, tokenize: Iterable[Span]) -> tuple[list[int], list[int], list[int]]:
    """What the host was doing, as disjoint sorted segments (starts, ends, cause index).

    One sweep over every host interval's start/end events; where causes overlap the one
    earliest in :data:`CAUSES` wins (a gc pause inside a postprocess span is gc time).
    """
    # Each event is one int, ``pos << 4 | is_start << 3 | cause``: ints sort in C several
    # times faster than (pos, delta, cause) tuples, in exactly the same order (ends before
    # starts at the same instant, then by cause).
    index = {c: i for i, c in enumerate(CAUSES)}
    events: list[int] = [g.start_ns << 4 | 8 for g in engine.gc]
    events += [g.end_ns << 4 for g in engine.gc]
    host_ci = {name: index[cause] for name, cause in _STEP_HOST_CAUSE.items()}
    for st in engine.steps:
        for h in st.host:
            ci = host_ci[h.name]
            events.append(h.start_ns << 4 | 8 | ci)
            events.append(h.end_ns << 4 | ci)
    tok = index["tokenize"]
    events += [t.start_ns << 4 | 8 | tok for t in tokenize]
    events += [t.end_ns << 4 | tok for t in tokenize]
    events.sort()
    # counts per cause, and a bitmask of the causes active now: the lowest set bit is the
    # highest-priority activity, found without scanning the counts at every event.
    counts = [0] * len(CAUSES)
    mask = 0
    starts: list[int] = []
    ends: list[int] = []
    causes: list[int] = []
    prev = events[0] >> 4 if events else 0
    for ev in events:
        pos = ev >> 4
        if pos > prev and mask:
            active = (mask & -mask).bit_length() - 1
            if causes and causes[-1] == active and ends[-1] == prev:
                ends[-1] = pos
            else:
                starts.append(prev)
                ends.append(pos)
                causes.append(active)
        ci = ev & 7
        n = counts[ci] + (1 if ev & 8 else -1)
        counts[ci] = n
        if n > 0:
            mask |= 1 << ci
        else:
            mask &= ~(1 << ci)
        prev = pos
    return starts, ends, causes


def _segment_gaps(segs: Sequence[Interval], busy: Sequence[Interval]) -> list[Interval]:
    """Gaps of every segment in the merged ``busy`` list, one pass over both sorted lists."""
    out: list[Interval] = []
    j = 0
    for a, b in segs:
        while j < len(busy) and busy[j][1] <= a:
            j += 1
        k = j
        cur = a
        while k < len(busy) and busy[k][0] < b:
            s, e = busy[k]
            if s > cur:
                out.append((cur, s))
            cur = max(cur, e)
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def _classify_all(
    engine_id: str,
    raw: Sequence[Interval],
    painted: tuple[list[int], list[int], list[int]],
    work: Sequence[Interval],
) -> list[Gap]:
    """Cause split and work-waiting time of sorted, disjoint gaps (two-pointer sweeps)."""
    starts, ends, causes = painted
    n, nw = len(starts), len(work)
    out = []
    j = w = 0
    ncause = len(CAUSES)
    names = CAUSES
    for a, b in raw:
        while j < n and ends[j] <= a:
            j += 1
        k = j
        if k < n and starts[k] < b:
            per = [0] * ncause
            while k < n and starts[k] < b:
                s, e = starts[k], ends[k]
                ov = (e if e < b else b) - (s if s > a else a)
                if ov > 0:
                    per[causes[k]] += ov
                k += 1
            per[-1] = (b - a) - sum(per)  # "other": what no host span explains
            split = tuple([(names[i], ns) for i, ns in enumerate(per) if ns])
        else:
            split = (("other", b - a),) if b != a else ()
        while w < nw and work[w][1] <= a:
            w += 1
        ww = 0
        k = w
        while k < nw and work[k][0] < b:
            s, e = work[k]
            ov = (e if e < b else b) - (s if s > a else a)
            if ov > 0:
                ww += ov
            k += 1
        out.append(_new_gap(Gap, (engine_id, a, b, split, ww)))
    return out


_new_gap = tuple.__new__


def iter_gaps(
    engine: EngineView,
    requests: Sequence[RequestView],
    tokenize: Sequence[Span],
) -> tuple[list[Interval], list[Gap]]:
    """The analysed segments of ``engine`` and all its classified gaps, sorted by start."""
    segs = segments(engine)
    busy = merge((f.start_ns, f.end_ns) for st in engine.steps for f in st.forwards)
    raw = _segment_gaps(segs, busy)
    work = merge(work_intervals(engine, requests))
    return segs, _classify_all(engine.engine_id, raw, paint_host(engine, tokenize), work)


def engine_idle(engine: EngineView, requests: Sequence[RequestView], tokenize: Sequence[Span]) -> EngineIdle:
    """Measure and classify the idle gaps of one engine."""
    segs, found = iter_gaps(engine, requests, tokenize)
    by_cause = dict.fromkeys(CAUSES, 0)
    with_work = 0
    for g in found:
        with_work += g.work_waiting_ns
        for cause, ns in g.causes:
            by_cause[cause] += ns
    durations = [g.end_ns - g.start_ns for g in found]
    idle = sum(durations)
    covered = sum(b - a for a, b in segs)
    q = pcts(durations, (50, 99)) if found else {"p50": 0.0, "p99": 0.0}
    # The 20 longest, ties by start: one pass with a heap instead of sorting every gap.
    ranked = zip([-d for d in durations], [g.start_ns for g in found], found, strict=True)
    top = tuple(g for _, _, g in heapq.nsmallest(TOP_GAPS, ranked))
    return EngineIdle(
        engine.engine_id,
        covered,
        covered - idle,
        len(found),
        by_cause,
        with_work,
        q["p50"],
        q["p99"],
        top,
        tuple(segs),
        len(engine.steps),
        tuple(found),
    )
