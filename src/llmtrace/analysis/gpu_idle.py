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

Idle with work waiting is split once more by *where* the work was: in the engine (its
queue or batch held a request: step attributes, and each request from its first
``llm.queue`` to its last phase) or only **upstream** of it — requests the front end was
still receiving, tokenizing or handing over, or streaming out after the engine finished
them. An engine idle with its own queue empty is starved by the API server, not slow
between its steps.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from llmtrace import semconv as sc
from llmtrace.analysis._kernels import KERNELS
from llmtrace.analysis.engine_table import CompiledRows
from llmtrace.analysis.intervals import Interval, merge
from llmtrace.analysis.model import (
    GAP_CAUSES,
    HOST_CAUSE_INDEX,
    EngineView,
    Gap,
    RequestView,
    Span,
    StepView,
    WindowView,
)
from llmtrace.analysis.stats import pcts

CAUSES = GAP_CAUSES
#: How many of the largest gaps a result keeps for the reports (the totals count all gaps).
TOP_GAPS = 20


@dataclass(frozen=True, slots=True)
class EngineIdle:
    """GPU idle summary of one engine over its sampled windows."""

    engine_id: str
    covered_ns: int
    busy_ns: int
    gap_count: int
    by_cause_ns: dict[str, int]
    with_work_waiting_ns: int
    upstream_ns: int  # of with_work_waiting_ns: the engine held no request, work was upstream of it
    gap_p50_ns: float
    gap_p99_ns: float
    top_gaps: tuple[Gap, ...]
    segments: tuple[Interval, ...]
    steps: int
    gaps: Sequence[Gap]  # every gap, by start time (made on demand for a compiled engine)
    windows: tuple[WindowIdle, ...] = ()  # of each of the engine's windows, in their order
    worst: Gap | None = None  # the first gap with the most work waiting, then the longest

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
    if engine.compiled is not None:  # the loop below, over the table's columns
        table, index = engine.compiled
        return merge(table.step_segments(index))
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


def work_intervals(engine: EngineView, requests: Sequence[RequestView],
                   step_runs: list[Interval] | None = None) -> list[Interval]:
    """When work was waiting: requests in flight, plus what step attributes reveal
    (:func:`step_runs`; pass them when already computed).

    Request intervals are added where request traces were kept — they are exact, but
    sampled, which is why the step attributes are always used too.
    """
    runs = step_runs if step_runs is not None else step_runs_of(engine)
    return [(r.request.start_ns, r.request.end_ns) for r in requests] + runs


def engine_work_intervals(engine: EngineView, requests: Sequence[RequestView],
                          step_runs: list[Interval] | None = None) -> list[Interval]:
    """When the engine itself held work: step attributes, and each request from the start of
    its first engine phase to the end of its last (the whole request when it has no phases:
    no claim about upstream without evidence)."""
    runs = step_runs if step_runs is not None else step_runs_of(engine)
    return [_engine_held(r) for r in requests] + runs


def step_runs_of(engine: EngineView) -> list[Interval]:
    """:func:`_step_runs` of the engine's steps; asked of the engine table when compiled."""
    if engine.compiled is not None:
        table, index = engine.compiled
        runs: list[Interval] = table.step_runs(index)
        return runs
    return _step_runs(engine.steps)


_ENGINE_PHASES = (sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE)  # not llm.tokenize: the front end's


def _engine_held(request: RequestView) -> Interval:
    lo = hi = None
    get = request.phases.get
    for name in _ENGINE_PHASES:
        for s in get(name, ()):
            if lo is None or s.start_ns < lo:
                lo = s.start_ns
            if hi is None or s.end_ns > hi:
                hi = s.end_ns
    if lo is None or hi is None:
        return request.request.start_ns, request.request.end_ns
    return lo, hi


def _step_runs(steps: Sequence[StepView]) -> list[Interval]:
    """The step evidence, joined into runs as it streams (the union is the same; a busy
    engine has few runs, so :func:`merge` has little left to sort and join)."""
    out: list[Interval] = []
    lo = hi = 0
    joining = False
    for s, e in _step_evidence(steps):
        if e <= s:
            continue  # empty: merge() would drop it
        if joining and s <= hi and e >= lo:
            lo = s if s < lo else lo
            hi = e if e > hi else hi
        else:
            if joining:
                out.append((lo, hi))
            lo, hi, joining = s, e, True
    if joining:
        out.append((lo, hi))
    return out


def _step_evidence(steps: Sequence[StepView]) -> Iterator[Interval]:
    """Work intervals from step attributes, in start order when steps do not overlap.

    A step with a non-empty batch had work during the whole step. The stretch between two
    steps held work when the first left requests waiting, or when a request of its batch is
    in the next one too (it stayed in the engine across the gap). ``llm.queue.running`` on
    both sides is not enough: it is counted when the step is scheduled, so it includes the
    request that finishes in that step — a lone request finishing and the next one arriving
    half a second later would make the quiet time between them look like work. Only steps
    without request ids (no ``llm.batch.request_ids``, no links) fall back to that count.
    """
    prev: StepView | None = None
    prev_ids: Sequence[Any] | None = None
    for st in steps:
        ids = _NOT_READ  # read only when needed, and then once per step
        if prev is not None:
            held = prev.waiting > 0
            if not held and prev.running > 0 and st.running > 0:
                ids = _batch_ids(st)
                held = _continued(prev_ids if prev_ids is not _NOT_READ else _batch_ids(prev), ids)
            if held:
                yield prev.step.end_ns, st.step.start_ns
        if st.batch_size > 0:
            yield st.step.start_ns, st.step.end_ns
        prev, prev_ids = st, ids


def _continued(a: Sequence[Any] | None, b: Sequence[Any] | None) -> bool:
    """Whether a request of batch *a* is also in batch *b* (unknowable without ids: assume so)."""
    if a is None or b is None or a == b:  # equal batches: decode's steady state, compared in C
        return True
    # Both lists are capped (the attribute at 64 ids, links at max_links): a request beyond
    # both caps may still have continued.
    return not set(a).isdisjoint(b) or (len(a) >= _CAPPED and len(b) >= _CAPPED)


_CAPPED = 64
_NOT_READ: Any = object()  # a step whose ids the loop did not need


def _batch_ids(st: StepView) -> Sequence[Any] | None:
    ids = st.step.attributes.get(sc.LLM_BATCH_REQUEST_IDS)
    if isinstance(ids, list | tuple) and ids:
        return ids
    if st.step.links:
        return [link.span_id for link in st.step.links]
    return None


_GC = CAUSES.index("gc")
_TOKENIZE = CAUSES.index("tokenize")
#: Cause index by the engine table's host-span name code - 2 (schedule, forward, sample,
#: postprocess: ``_kernels.ENGINE_SPANS``); forward is never a host span.
_TABLE_HOST_CAUSES = (
    HOST_CAUSE_INDEX[sc.SPAN_SCHEDULE],
    0,
    HOST_CAUSE_INDEX[sc.SPAN_SAMPLE],
    HOST_CAUSE_INDEX[sc.SPAN_POSTPROCESS],
)


def _covered(a: int, b: int, intervals: Sequence[Interval], k: int) -> int:
    """How much of [a, b) the sorted, disjoint *intervals* cover, from index *k* on (the
    first that ends after *a*)."""
    covered = 0
    n = len(intervals)
    while k < n and intervals[k][0] < b:
        s, e = intervals[k]
        ov = (e if e < b else b) - (s if s > a else a)
        if ov > 0:
            covered += ov
        k += 1
    return covered


def _overlap(gaps: Sequence[Interval], intervals: Sequence[Interval]) -> int:
    """Total overlap of sorted, disjoint *gaps* with sorted, disjoint *intervals*."""
    total = i = 0
    n = len(intervals)
    for a, b in gaps:
        while i < n and intervals[i][1] <= a:
            i += 1
        total += _covered(a, b, intervals, i)
    return total


class WindowIdle(NamedTuple):
    """The gaps' time inside one window (:func:`window_idle`)."""

    idle_ns: int
    with_work_ns: int
    causes: dict[str, int]  # cause -> ns, in the order the gaps name them


def window_idle(gaps: Sequence[Gap], gap_starts: Sequence[int], start_ns: int, end_ns: int) -> WindowIdle:
    """Idle and work-waiting time of the sorted ``gaps`` inside ``[start_ns, end_ns]``; a gap
    the window cuts counts its work-waiting and cause times in proportion (truncated)."""
    idle_ns = work_ns = 0
    causes: dict[str, int] = {}
    ws, we = start_ns, end_ns
    for _, gs, ge, split, waiting in gaps[max(0, bisect_left(gap_starts, ws) - 1) : bisect_right(gap_starts, we)]:
        if gs >= ws and ge <= we:  # inside the window: frac = 1 and int(ns * 1.0) == ns
            idle_ns += ge - gs
            work_ns += waiting
            for c, ns in split:
                causes[c] = causes.get(c, 0) + ns
            continue
        ov = (ge if ge < we else we) - (gs if gs > ws else ws)
        if ov <= 0:
            continue
        frac = ov / (ge - gs)
        idle_ns += ov
        work_ns += int(waiting * frac)
        for c, ns in split:
            causes[c] = causes.get(c, 0) + int(ns * frac)
    return WindowIdle(idle_ns, work_ns, causes)


def _gap_inputs(
    engine: EngineView, requests: Sequence[RequestView], tokenize: Sequence[Span], step_runs: list[Interval] | None
) -> tuple[list[Interval], list[Interval], list[tuple[int, int, int]]]:
    """What the sweeps take besides the steps: segments, merged work, gc/tokenize extras."""
    segs = segments(engine)
    work = merge(work_intervals(engine, requests, step_runs))
    extras = [(g.start_ns, g.end_ns, _GC) for g in engine.gc]
    extras += [(t.start_ns, t.end_ns, _TOKENIZE) for t in tokenize]
    return segs, work, extras


def iter_gaps(
    engine: EngineView,
    requests: Sequence[RequestView],
    tokenize: Sequence[Span],
    step_runs: list[Interval] | None = None,
) -> tuple[list[Interval], list[Gap]]:
    """The analysed segments of ``engine`` and all its classified gaps, sorted by start."""
    segs, work, extras = _gap_inputs(engine, requests, tokenize, step_runs)
    if engine.compiled is not None:  # the same sweeps over the engine table's columns
        table, index = engine.compiled
        try:
            gap_set = table.idle(index, segs, _TABLE_HOST_CAUSES, extras, work, [], [], CAUSES)[0]
            return segs, gap_set.rows(0, len(gap_set), engine.engine_id, Gap, CAUSES)
        except OverflowError:  # a request time beyond int64: the Python sweeps below
            pass
    forwards = [f for st in engine.steps for f in st.forwards]
    hosts = [h for st in engine.steps for h in st.host]
    return segs, KERNELS.classify_gaps(engine.engine_id, segs, forwards, hosts, extras, work)


class GapTotals(NamedTuple):
    """What :func:`engine_idle` reports from an engine's gaps."""

    by_cause_ns: dict[str, int]
    with_work_ns: int
    engine_side_ns: int  # of with_work_ns: the engine itself held work
    idle_ns: int
    p50_ns: float
    p99_ns: float
    top: tuple[Gap, ...]
    worst: Gap | None  # the timeline's gap: the first with the most work waiting, then longest
    windows: tuple[WindowIdle, ...]


def gap_totals(found: Sequence[Gap], engine_work: Sequence[Interval], windows: Sequence[WindowView]) -> GapTotals:
    """Totals of the sorted gaps ``found`` (the compiled engine table computes the same)."""
    by_cause = dict.fromkeys(CAUSES, 0)
    with_work = 0
    for g in found:
        with_work += g.work_waiting_ns
        for cause, ns in g.causes:
            by_cause[cause] += ns
    # Idle with the engine holding work, inside the gaps with work waiting (engine work is a
    # subset of all work: the step evidence is in both, and a request's engine phases lie
    # inside the request); what is left was waiting upstream.
    engine_side = _overlap([(g.start_ns, g.end_ns) for g in found if g.work_waiting_ns], engine_work)  # sorted
    durations = [g.end_ns - g.start_ns for g in found]
    q = pcts(durations, (50, 99)) if found else {"p50": 0.0, "p99": 0.0}
    # The 20 longest, ties by start: one pass with a heap instead of sorting every gap.
    ranked = zip([-d for d in durations], [g.start_ns for g in found], found, strict=True)
    top = tuple(g for _, _, g in heapq.nsmallest(TOP_GAPS, ranked))
    keys = list(zip([g.work_waiting_ns for g in found], durations, strict=True))
    worst = found[keys.index(max(keys))] if keys else None
    starts = [g.start_ns for g in found]
    per_window = tuple(window_idle(found, starts, w.start_ns, w.end_ns) for w in windows)
    return GapTotals(by_cause, with_work, engine_side, sum(durations), q["p50"], q["p99"], top, worst, per_window)


def engine_idle(engine: EngineView, requests: Sequence[RequestView], tokenize: Sequence[Span]) -> EngineIdle:
    """Measure and classify the idle gaps of one engine."""
    runs = step_runs_of(engine)  # once: both work measures use it
    engine_work = merge(engine_work_intervals(engine, requests, runs))
    found: Sequence[Gap]
    compiled = _compiled_idle(engine, requests, tokenize, runs, engine_work)
    if compiled is not None:
        segs, found, totals = compiled
    else:
        segs, gaps = iter_gaps(engine, requests, tokenize, runs)
        found = tuple(gaps)
        totals = gap_totals(found, engine_work, engine.windows)
    covered = sum(b - a for a, b in segs)
    return EngineIdle(
        engine.engine_id,
        covered,
        covered - totals.idle_ns,
        len(found),
        totals.by_cause_ns,
        totals.with_work_ns,
        max(0, totals.with_work_ns - totals.engine_side_ns),
        totals.p50_ns,
        totals.p99_ns,
        totals.top,
        tuple(segs),
        len(engine.steps),
        found,
        totals.windows,
        totals.worst,
    )


def _compiled_idle(
    engine: EngineView,
    requests: Sequence[RequestView],
    tokenize: Sequence[Span],
    runs: list[Interval],
    engine_work: list[Interval],
) -> tuple[list[Interval], Sequence[Gap], GapTotals] | None:
    """:func:`iter_gaps` and :func:`gap_totals` in one call to the engine table, or ``None``
    when the engine is not compiled (or a request time is beyond int64). The gaps stay in
    Rust (a ``GapSet`` this result alone holds), made into :class:`Gap` tuples when read
    (the reports read a few dozen)."""
    if engine.compiled is None:
        return None
    table, index = engine.compiled
    segs, work, extras = _gap_inputs(engine, requests, tokenize, runs)
    windows = [(w.start_ns, w.end_ns) for w in engine.windows]
    try:
        gap_set, per_cause, with_work, side, idle, p50, p99, top, worst, per_window = table.idle(
            index, segs, _TABLE_HOST_CAUSES, extras, work, engine_work, windows, CAUSES
        )
    except OverflowError:
        return None
    engine_id = engine.engine_id

    def fetch(lo: int, hi: int) -> tuple[Gap, ...]:
        return tuple(gap_set.rows(lo, hi, engine_id, Gap, CAUSES))

    found: CompiledRows[Gap] = CompiledRows(fetch, len(gap_set))
    totals = GapTotals(
        dict(zip(CAUSES, per_cause, strict=True)),
        with_work,
        side,
        idle,
        p50,
        p99,
        tuple(found[k] for k in top),
        found[worst] if worst >= 0 else None,
        tuple(WindowIdle(i, w, {CAUSES[c]: ns for c, ns in causes}) for i, w, causes in per_window),
    )
    return segs, found, totals
