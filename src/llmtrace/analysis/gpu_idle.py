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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llmtrace import semconv as sc
from llmtrace.analysis.intervals import Cover, Interval, gaps, merge, subtract
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


@dataclass(frozen=True, slots=True)
class Gap:
    """One idle interval of one engine, with its cause split and work-waiting time."""

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
        contiguous = prev is not None and (
            st.step_id is None or prev.step_id is None or st.step_id == prev.step_id + 1
        )
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
        if st.num(sc.LLM_BATCH_SIZE) > 0:
            out.append((st.step.start_ns, st.step.end_ns))
        if prev is not None and (
            prev.num(sc.LLM_QUEUE_WAITING) > 0
            or (prev.num(sc.LLM_QUEUE_RUNNING) > 0 and st.num(sc.LLM_QUEUE_RUNNING) > 0)
        ):
            out.append((prev.step.end_ns, st.step.start_ns))
        prev = st
    return out


def host_covers(engine: EngineView, tokenize: Iterable[Span]) -> list[tuple[str, Cover]]:
    per: dict[str, list[Interval]] = {c: [] for c in CAUSES}
    per["gc"] = [(s.start_ns, s.end_ns) for s in engine.gc]
    for st in engine.steps:
        for h in st.host:
            per[_STEP_HOST_CAUSE[h.name]].append((h.start_ns, h.end_ns))
    per["tokenize"] = [(s.start_ns, s.end_ns) for s in tokenize]
    return [(c, Cover(per[c])) for c in CAUSES if c != "other"]


def _classify(engine_id: str, a: int, b: int, covers: list[tuple[str, Cover]], work: Cover) -> Gap:
    remaining = [(a, b)]
    split = []
    for cause, cover in covers:
        remaining, ns = subtract(remaining, cover)
        if ns:
            split.append((cause, ns))
    rest = sum(e - s for s, e in remaining)
    if rest:
        split.append(("other", rest))
    return Gap(engine_id, a, b, tuple(split), work.overlap(a, b))


def iter_gaps(
    engine: EngineView,
    requests: Sequence[RequestView],
    tokenize: Sequence[Span],
    lo: int | None = None,
    hi: int | None = None,
) -> Iterable[tuple[Interval, list[Gap]]]:
    """Per analysed segment (clipped to ``[lo, hi)`` when given): its classified gaps."""
    busy = merge((f.start_ns, f.end_ns) for st in engine.steps for f in st.forwards)
    covers = host_covers(engine, tokenize)
    work = Cover(work_intervals(engine, requests))
    for seg in segments(engine):
        s = seg[0] if lo is None else max(seg[0], lo)
        e = seg[1] if hi is None else min(seg[1], hi)
        if s < e:
            yield (s, e), [_classify(engine.engine_id, a, b, covers, work) for a, b in gaps((s, e), busy)]


def engine_idle(engine: EngineView, requests: Sequence[RequestView], tokenize: Sequence[Span]) -> EngineIdle:
    """Measure and classify the idle gaps of one engine."""
    by_cause = dict.fromkeys(CAUSES, 0)
    found: list[Gap] = []
    covered = idle = with_work = 0
    segs = []
    for seg, seg_gaps in iter_gaps(engine, requests, tokenize):
        segs.append(seg)
        covered += seg[1] - seg[0]
        for g in seg_gaps:
            idle += g.duration_ns
            with_work += g.work_waiting_ns
            for cause, ns in g.causes:
                by_cause[cause] += ns
        found.extend(seg_gaps)
    q = pcts([g.duration_ns for g in found], (50, 99)) if found else {"p50": 0.0, "p99": 0.0}
    top = tuple(sorted(found, key=lambda g: (-g.duration_ns, g.start_ns))[:TOP_GAPS])
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
