"""One engine's steps in plain Python: the reference the compiled engine table is tested against.

The analyzers ask about an engine's steps through
:class:`~llmtrace.analysis._kernels.EngineSteps` (``KERNELS.engine(view)``). An engine the
compiled table holds answers from its columns; every other engine — and every engine,
when the Python kernels are in use — answers with :class:`PythonEngine` here, over its
``StepView`` objects. ``test_engine_table.py`` compares the two on random engines.

* :func:`step_segments` — the analysed time of an engine without windows: runs of
  consecutive step ids.
* :func:`step_runs` — when the step attributes say work was waiting (:func:`_step_evidence`).
* :func:`step_stats` — what the verdicts read from a run of steps.
* :func:`gap_totals` — an engine's classified gaps summed: per cause, work waiting, the
  engine-side part, percentiles, the longest, the timeline's gap, each window's share
  (:func:`window_idle`).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from llmtrace import semconv as sc
from llmtrace.analysis.intervals import Interval, merge
from llmtrace.analysis.model import GAP_CAUSES, EngineView, Gap, Span, StepView
from llmtrace.analysis.stats import pcts, percentile

#: How many of the largest gaps a result keeps for the reports (the totals count all gaps).
TOP_GAPS = 20
#: Classifies one engine's gaps (``Kernels.classify_gaps``: compiled or the Python one).
ClassifyGaps = Callable[
    [str, Sequence[Interval], Sequence[Span], Sequence[Span], Sequence[tuple[int, int, int]], Sequence[Interval]],
    list[Gap],
]


class GapInputs(NamedTuple):
    """What an engine's gap sweeps take besides its steps."""

    segs: list[Interval]  # the analysed time: sorted, disjoint
    work: list[Interval]  # when work was waiting: merged
    extras: list[tuple[int, int, int]]  # gc pauses and tokenize spans: start, end, cause index


class IdleGaps(NamedTuple):
    """An engine's classified gaps, sorted by start, and their totals."""

    gaps: Sequence[Gap]
    totals: GapTotals


class PythonEngine:
    """:class:`~llmtrace.analysis._kernels.EngineSteps` over an engine's ``StepView``
    objects; its gaps are classified by ``classify_gaps``."""

    def __init__(self, engine: EngineView, classify_gaps: ClassifyGaps) -> None:
        self._engine = engine
        self._classify = classify_gaps

    def segments(self) -> list[Interval]:
        return step_segments(self._engine.steps)

    def step_runs(self) -> list[Interval]:
        return step_runs(self._engine.steps)

    def step_starts(self) -> list[int]:
        return [s.step.start_ns for s in self._engine.steps]

    def step_stats(self, lo: int, hi: int) -> StepStats:
        return step_stats(self._engine.steps[lo:hi])

    def gaps(self, sweep: GapInputs) -> list[Gap]:
        steps = self._engine.steps
        forwards = [f for st in steps for f in st.forwards]
        hosts = [h for st in steps for h in st.host]
        return self._classify(self._engine.engine_id, sweep.segs, forwards, hosts, sweep.extras, sweep.work)

    def idle(self, sweep: GapInputs, engine_work: Sequence[Interval], windows: Sequence[Interval]) -> IdleGaps:
        found = tuple(self.gaps(sweep))
        return IdleGaps(found, gap_totals(found, engine_work, windows))


def step_segments(steps: Sequence[StepView]) -> list[Interval]:
    """Runs of consecutive step ids (a step without an id joins its neighbours), merged."""
    out: list[Interval] = []
    prev: StepView | None = None
    for st in steps:
        contiguous = prev is not None and (st.step_id is None or prev.step_id is None or st.step_id == prev.step_id + 1)
        if contiguous and out:
            out[-1] = (out[-1][0], max(out[-1][1], st.step.end_ns))
        else:
            out.append((st.step.start_ns, st.step.end_ns))
        prev = st
    return merge(out)


def step_runs(steps: Sequence[StepView]) -> list[Interval]:
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


class StepStats(NamedTuple):
    """What the verdicts read from a run of steps (:func:`step_stats`; the compiled engine
    table computes the same numbers over its columns)."""

    steps: int
    batch_sum: float
    waiting_sum: float
    preempted_sum: float
    linked: int  # distinct span ids the steps link (requests); counted only when preempted_sum
    kv_p90: float
    queue_growth: float

    @property
    def preemptions_per_request(self) -> float:
        """Preemptions per request from step attributes: requests are counted by their links."""
        return self.preempted_sum / self.linked if self.preempted_sum and self.linked else 0.0

    @property
    def mean_batch(self) -> float:
        return self.batch_sum / self.steps if self.steps else 0.0


def step_stats(steps: Sequence[StepView]) -> StepStats:
    """:class:`StepStats` of ``steps`` (in order: the queue growth is a fit over time)."""
    total = sum(s.preempted for s in steps)
    # Collecting every link of every step only matters when something was preempted.
    linked = len({link.span_id for s in steps for link in s.step.links}) if total else 0
    return StepStats(
        len(steps),
        sum(s.batch_size for s in steps),
        sum(s.waiting for s in steps),
        total,
        linked,
        _kv_p90(steps),
        _queue_growth(steps),
    )


def _kv_p90(steps: Sequence[StepView]) -> float:
    vals = [s.kv_usage for s in steps]
    vals = [v for v in vals if v >= 0]
    return percentile(vals, 90) if vals else 0.0


def _queue_growth(steps: Sequence[StepView]) -> float:
    """Waiting-queue growth in requests/s, least-squares over the steps (positive: falling behind)."""
    if len(steps) < 3:
        return 0.0
    xs = [s.step.start_ns / 1e9 for s in steps]
    ys = [s.waiting for s in steps]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


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


class GapTotals(NamedTuple):
    """What ``gpu_idle.engine_idle`` reports from an engine's gaps."""

    by_cause_ns: dict[str, int]
    with_work_ns: int
    engine_side_ns: int  # of with_work_ns: the engine itself held work
    idle_ns: int
    p50_ns: float
    p99_ns: float
    top: tuple[Gap, ...]
    worst: Gap | None  # the timeline's gap: the first with the most work waiting, then longest
    windows: tuple[WindowIdle, ...]


def gap_totals(found: Sequence[Gap], engine_work: Sequence[Interval], windows: Sequence[Interval]) -> GapTotals:
    """Totals of the sorted gaps ``found`` (the compiled engine table computes the same)."""
    by_cause = dict.fromkeys(GAP_CAUSES, 0)
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
    per_window = tuple(window_idle(found, starts, ws, we) for ws, we in windows)
    return GapTotals(by_cause, with_work, engine_side, sum(durations), q["p50"], q["p99"], top, worst, per_window)
