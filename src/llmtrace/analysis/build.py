"""Spans -> :class:`~llmtrace.analysis.model.TraceSet`: traces, request views, engine views.

Two repairs happen here, once, so that no analyzer has to care:

* **Duplicates** (a trace fetched in two Jaeger windows, a file read twice) are dropped by
  ``(trace_id, span_id)``.
* **Clock skew** between clocks: a child recorded on another clock (a different
  ``service.name`` or ``host.name``) that does not fit inside its parent is shifted to sit
  centred in the parent — Jaeger's clock-skew adjuster — and the shift carries over to that
  child's own same-clock descendants. Processes of one host read one clock, so a
  different ``process.pid`` alone (an engine process and its API server) moves nothing: a
  child overflowing its parent there is real (an engine finishing after the client left).
  Spans of one clock are never moved relative to each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import compress
from operator import attrgetter
from typing import Any, NamedTuple

from llmtrace import semconv as sc
from llmtrace.analysis import vllm_native
from llmtrace.analysis._gc import paused_gc
from llmtrace.analysis.engine_table import CompiledTraces, EngineTable, build_part
from llmtrace.analysis.model import (
    FINITE_LIMIT,
    EngineView,
    RequestView,
    Span,
    SpanKind,
    StepView,
    Trace,
    TraceSet,
    WindowView,
    fast_constructor,
    finite_number,
)

_new_step = fast_constructor(StepView)
_SERVICE = attrgetter("service")
_RESOURCE = attrgetter("resource")
_FORWARD = sc.SPAN_FORWARD
_STEP = sc.SPAN_STEP
_STEP_ID = sc.LLM_STEP_ID
_HOST_STEP_CHILDREN = frozenset((sc.SPAN_SCHEDULE, sc.SPAN_SAMPLE, sc.SPAN_POSTPROCESS))
_PHASES = frozenset(sc.REQUEST_PHASE_SPANS)
_IS_VIEW_SPAN = frozenset((sc.SPAN_REQUEST, sc.SPAN_STEP, sc.SPAN_ENGINE, sc.SPAN_GC, sc.SPAN_TOKENIZE,
                           sc.VLLM_SPAN_REQUEST)).__contains__
_NAME = attrgetter("name")
_START = attrgetter("start_ns")
_STEP_START = attrgetter("step.start_ns")
_REQUEST_START = attrgetter("request.start_ns")


def _domain(span: Span) -> tuple[Any, ...]:
    """The clock a span was timed by: its service's host (see the module doc)."""
    return (span.service, span.resource.get("host.name"))


def _one_domain(spans: Iterable[Span]) -> bool:
    """Whether every span was timed by one clock (one service and host)."""
    if len(set(map(_SERVICE, spans))) <= 1:
        res = list(map(_RESOURCE, spans))  # map/zip: no bytecode per span
        resources = dict(zip(map(id, res), res, strict=True)).values()
        if len({r.get("host.name") for r in resources}) <= 1:
            return True
    return False


def adjust_clock_skew(spans: list[Span]) -> list[Span]:
    """Return ``spans`` with cross-process children shifted into their parents (see module doc)."""
    if _one_domain(spans):
        return spans
    by_id = {s.span_id: s for s in spans}
    kids: dict[str, list[Span]] = {}
    for s in spans:
        if s.parent_id in by_id:
            kids.setdefault(s.parent_id, []).append(s)
    out: dict[str, Span] = {}
    roots = [s for s in spans if s.parent_id not in by_id]
    stack: list[tuple[Span, int]] = [(r, 0) for r in roots]
    while stack:
        span, skew = stack.pop()
        moved = (
            span if skew == 0 else span._replace(start_ns=span.start_ns + skew, end_ns=span.end_ns + skew)
        )
        out[span.span_id] = moved
        for child in kids.get(span.span_id, ()):
            delta = skew if _domain(child) == _domain(span) else _skew(child, moved)
            stack.append((child, delta))
    return [out.get(s.span_id, s) for s in spans]


def _skew(child: Span, parent: Span) -> int:
    if child.duration_ns > parent.duration_ns:
        return 0  # cannot fit; leave it for the critical path's clipping
    if child.start_ns >= parent.start_ns and child.end_ns <= parent.end_ns:
        return 0
    latency = (parent.duration_ns - child.duration_ns) // 2
    return parent.start_ns + latency - child.start_ns


def group_traces(spans: Iterable[Span], *, skew: bool = True) -> tuple[list[Trace], int]:
    """Group spans by trace id, de-duplicate, adjust skew; also return the duplicate count."""
    groups: dict[str, dict[str, Span]] = {}
    dupes = 0
    spans = spans if isinstance(spans, list | tuple) else list(spans)
    for s in spans:
        g = groups.get(s.trace_id)
        sid = s.span_id
        if g is None:
            groups[s.trace_id] = {sid: s}
        elif sid in g:
            dupes += 1
        else:
            g[sid] = s
    # One process wrote everything (the common case): no trace can need a skew repair,
    # so the per-trace check is skipped.
    skew = skew and not _one_domain(spans)
    build = Trace.build
    traces = []
    for tid, g in groups.items():
        members = list(g.values())
        if skew and len(members) > 1:
            adjusted = adjust_clock_skew(members)
            if adjusted is not members:
                traces.append(build(tid, adjusted))
                continue
        traces.append(build(tid, members, g))
    return traces, dupes


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def build_traceset(
    spans: Iterable[Span], *, warnings: Iterable[str] = (), skew: bool = True, table: EngineTable | None = None
) -> TraceSet:
    """Build the joined views the analyzers use.

    ``table``: the engine-side spans the compiled decoder kept as columns during the read
    (:mod:`llmtrace.analysis.engine_table`); its engines are built compiled when it can
    build them exactly as this module would, else its spans join ``spans`` first."""
    with paused_gc():
        if table is not None and len(table):
            spans = spans if isinstance(spans, list | tuple) else list(spans)
            built = _build(spans, warnings, skew, table)
            if built is not None:
                return built
            spans = table.merged_with(spans)
        built = _build(spans, warnings, skew, None)
        assert built is not None
        return built


def _build(spans: Iterable[Span], warnings: Iterable[str], skew: bool, table: EngineTable | None) -> TraceSet | None:
    traces, dupes = group_traces(spans, skew=skew)
    part = build_part(table, (t.trace_id for t in traces)) if table is not None else None
    if table is not None and part is None:
        return None
    views = _views(traces)
    engines = views.engines
    all_traces: Sequence[Trace] = tuple(traces)
    orphans = views.orphans
    if table is not None and part is not None:
        if not engines.keys().isdisjoint(part.engines):
            return None  # one engine on both sides: its steps must be sorted together
        for eid, (win_c, steps_c, gc_c, handle) in part.engines.items():
            engines[eid] = EngineView(eid, win_c, steps_c, gc_c, handle)
        engines = dict(sorted(engines.items()))
        dupes += part.duplicates
        orphans += part.orphans
        all_traces = CompiledTraces(all_traces, table.native, part.traces, part.spans)
    notes = list(warnings)
    if dupes:
        notes.append(f"dropped {dupes} duplicate span(s)")
    if orphans:
        notes.append(f"{orphans} span(s) reference a parent that is not in the data (partial traces)")
    return TraceSet(all_traces, views.requests, engines, views.tokenize, tuple(notes))


class _Views(NamedTuple):
    requests: tuple[RequestView, ...]
    engines: dict[str, EngineView]
    tokenize: tuple[Span, ...]
    orphans: int


def _views(traces: list[Trace]) -> _Views:
    """The request and engine views of ``traces`` (vLLM's traces are replaced in the list
    by their expanded form)."""
    requests: list[RequestView] = []
    steps: dict[str, list[StepView]] = {}
    windows: dict[str, list[WindowView]] = {}
    gcs: dict[str, list[Span]] = {}
    tokenize: list[Span] = []
    orphans = 0
    for index, trace in enumerate(traces):
        orphans += len(trace.orphans)
        members = trace.spans
        native_done = False
        for span in compress(members, map(_IS_VIEW_SPAN, map(_NAME, members))):
            name = span.name
            if name == sc.SPAN_REQUEST:
                requests.append(_request_view(trace, span))
            elif name == sc.VLLM_SPAN_REQUEST and not native_done:  # vLLM's own tracing
                native_done = True  # all of this trace's llm_request spans are read at once
                trace, views = _vllm_requests(trace)  # noqa: PLW2901
                traces[index] = trace
                requests += views
            elif name == sc.SPAN_STEP:
                sv = _step_view(trace, span)
                steps.setdefault(sv.engine_id, []).append(sv)
            elif name == sc.SPAN_ENGINE:
                wv = _window_view(trace, span)
                windows.setdefault(wv.engine_id, []).append(wv)
            elif name == sc.SPAN_GC:
                gcs.setdefault(_engine_of(trace, span), []).append(span)
            else:
                tokenize.append(span)
    engines = {}
    for eid in sorted(set(steps) | set(windows)):
        st = sorted(steps.get(eid, ()), key=_STEP_START)
        win = sorted(windows.get(eid, ()), key=_START)
        gc = sorted(gcs.get(eid, ()), key=_START)
        engines[eid] = EngineView(eid, tuple(win), tuple(st), tuple(gc))
    requests.sort(key=_REQUEST_START)
    tokenize.sort(key=_START)
    return _Views(tuple(requests), engines, tuple(tokenize), orphans)


def _vllm_requests(trace: Trace) -> tuple[Trace, list[RequestView]]:
    """vLLM's own ``llm_request`` spans as requests, in *trace* extended by their derived
    phases (docs/analysis.md, "Sources"); none when llmtrace's ``llm.request`` is there."""
    expanded = vllm_native.expand(trace)
    if expanded is None:
        return trace, []
    return expanded, [_request_view(expanded, s) for s in expanded.spans if s.name == sc.VLLM_SPAN_REQUEST]


def _request_view(trace: Trace, span: Span) -> RequestView:
    parent = trace.by_id.get(span.parent_id) if span.parent_id else None
    server = parent if parent is not None and parent.kind == SpanKind.SERVER else None
    phases: dict[str, tuple[Span, ...]] = {}
    for child in trace.children.get(span.span_id, ()):
        name = child.name
        if name in _PHASES:
            seen = phases.get(name)
            phases[name] = (child,) if seen is None else (*seen, child)  # llm.queue recurs after preemption
    return RequestView.of(trace, span, server, phases)


def _engine_of(trace: Trace, span: Span) -> str:
    eid = span.attributes.get(sc.LLM_ENGINE_ID)
    seen = 0
    cur: Span | None = span
    while eid is None and cur is not None and cur.parent_id and seen < 8:
        cur = trace.by_id.get(cur.parent_id)
        eid = cur.attributes.get(sc.LLM_ENGINE_ID) if cur is not None else None
        seen += 1
    return str(eid) if eid is not None else (span.service or "engine")


def _step_view(trace: Trace, span: Span) -> StepView:
    forwards, host = [], []
    for child in trace.children.get(span.span_id, ()):
        name = child.name
        if name == _FORWARD:
            forwards.append(child)
        elif name in _HOST_STEP_CHILDREN:
            host.append(child)
    get: Any = span.attributes.get
    # _num inlined for the plain, finite int/float values every parsed span carries.
    bs: Any = get(sc.LLM_BATCH_SIZE)
    wt: Any = get(sc.LLM_QUEUE_WAITING)
    rn: Any = get(sc.LLM_QUEUE_RUNNING)
    kv: Any = get(sc.LLM_KV_CACHE_USAGE)
    pe: Any = get(sc.LLM_PREEMPTED)
    eid = get(sc.LLM_ENGINE_ID)
    sid = get(sc.LLM_STEP_ID)
    return _new_step(
        span,
        str(eid) if eid is not None else _engine_of(trace, span),
        sid if sid.__class__ is int else _int(sid),
        tuple(forwards),
        tuple(host),
        float(bs) if bs.__class__ in _PLAIN_NUM and -_LIMIT < bs < _LIMIT else _num(bs, 0.0),
        float(wt) if wt.__class__ in _PLAIN_NUM and -_LIMIT < wt < _LIMIT else _num(wt, 0.0),
        float(rn) if rn.__class__ in _PLAIN_NUM and -_LIMIT < rn < _LIMIT else _num(rn, 0.0),
        float(kv) if kv.__class__ in _PLAIN_NUM and -_LIMIT < kv < _LIMIT else _num(kv, -1.0),
        float(pe) if pe.__class__ in _PLAIN_NUM and -_LIMIT < pe < _LIMIT else _num(pe, 0.0),
    )


_PLAIN_NUM: frozenset[Any] = frozenset((int, float))
_LIMIT = FINITE_LIMIT


def _num(value: Any, default: float) -> float:
    number = finite_number(value)
    return default if number is None else number


def _window_view(trace: Trace, span: Span) -> WindowView:
    ids = [
        sid
        for c in trace.children.get(span.span_id, ())
        if c.name == _STEP
        and (sid := (v if (v := c.attributes.get(_STEP_ID)).__class__ is int else _int(v))) is not None
    ]
    return WindowView(
        _engine_of(trace, span),
        span.start_ns,
        span.end_ns,
        min(ids) if ids else None,
        max(ids) if ids else None,
        span.span_id,
    )
