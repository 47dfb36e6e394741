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

from collections.abc import Sequence
from dataclasses import dataclass

from llmtrace import semconv as sc
from llmtrace.analysis._kernels import KERNELS
from llmtrace.analysis._steps import GapInputs, WindowIdle
from llmtrace.analysis.intervals import Interval, merge
from llmtrace.analysis.model import GAP_CAUSES, EngineView, Gap, RequestView, Span, WindowView

CAUSES = GAP_CAUSES


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
    return KERNELS.engine(engine).segments()


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
    """When the engine's step attributes say work was waiting (``_steps.step_runs``)."""
    return KERNELS.engine(engine).step_runs()


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


_GC = CAUSES.index("gc")
_TOKENIZE = CAUSES.index("tokenize")


def _gap_inputs(
    engine: EngineView, requests: Sequence[RequestView], tokenize: Sequence[Span], step_runs: list[Interval] | None
) -> GapInputs:
    """What the sweeps take besides the steps: segments, merged work, gc/tokenize extras."""
    segs = segments(engine)
    work = merge(work_intervals(engine, requests, step_runs))
    extras = [(g.start_ns, g.end_ns, _GC) for g in engine.gc]
    extras += [(t.start_ns, t.end_ns, _TOKENIZE) for t in tokenize]
    return GapInputs(segs, work, extras)


def iter_gaps(
    engine: EngineView,
    requests: Sequence[RequestView],
    tokenize: Sequence[Span],
    step_runs: list[Interval] | None = None,
) -> tuple[list[Interval], list[Gap]]:
    """The analysed segments of ``engine`` and all its classified gaps, sorted by start."""
    sweep = _gap_inputs(engine, requests, tokenize, step_runs)
    return sweep.segs, KERNELS.engine(engine).gaps(sweep)


def engine_idle(engine: EngineView, requests: Sequence[RequestView], tokenize: Sequence[Span]) -> EngineIdle:
    """Measure and classify the idle gaps of one engine."""
    steps = KERNELS.engine(engine)
    runs = steps.step_runs()  # once: both work measures use it
    engine_work = merge(engine_work_intervals(engine, requests, runs))
    sweep = _gap_inputs(engine, requests, tokenize, runs)
    found, totals = steps.idle(sweep, engine_work, [(w.start_ns, w.end_ns) for w in engine.windows])
    covered = sum(b - a for a, b in sweep.segs)
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
        tuple(sweep.segs),
        len(engine.steps),
        found,
        totals.windows,
        totals.worst,
    )
