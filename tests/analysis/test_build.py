"""Model building: views, joins, duplicates, clock skew between processes."""

from __future__ import annotations

from llmtrace import semconv as sc
from llmtrace.analysis.build import build_traceset
from llmtrace.analysis.critical_path import critical_path
from llmtrace.analysis.model import Link
from tests.analysis.builders import T0, engine_window, request_trace, span


def test_request_view_finds_server_parent_and_phases() -> None:
    """llm.request under a SERVER span: the server is the latency root, phases are grouped by name."""
    ts = build_traceset(request_trace("a" * 32, 0, 1, 2, 3, 4, server_pad=0.5))
    [r] = ts.requests
    assert r.server is not None and r.root is r.server
    assert {sc.SPAN_TOKENIZE, sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE} == set(r.phases)
    assert 0.011 == round(r.e2e_s, 9)
    assert 0.006 == round(r.ttft_s or 0, 9)


def test_duplicate_spans_are_dropped_with_a_warning() -> None:
    """The same span twice (a trace fetched in two Jaeger windows) counts once."""
    spans = request_trace("a" * 32, 0, 1, 2, 3, 4)
    ts = build_traceset(spans + spans[:2])
    assert len(spans) == ts.span_count
    assert any("2 duplicate" in w for w in ts.warnings)


def test_orphans_are_reported() -> None:
    """Spans whose parent is missing are roots and produce a partial-trace warning."""
    spans = request_trace("a" * 32, 0, 1, 2, 3, 4)
    ts = build_traceset([s for s in spans if s.name != sc.SPAN_REQUEST])
    assert any("4 span(s) reference a parent" in w for w in ts.warnings)


def test_clock_skew_between_processes_is_corrected() -> None:
    """An engine-process child 50 ms ahead of its api-server parent is shifted into the parent.

    Its own children (same process) move with it, so their relative timing is unchanged.
    """
    parent = span("llm.request", 0, 100, service="api", resource={"host.name": "a"})
    child = span("engine.work", 70, 130, parent=parent, service="engine", resource={"host.name": "b"})
    grandchild = span("llm.forward", 80, 90, parent=child, service="engine", resource={"host.name": "b"})
    ts = build_traceset([parent, child, grandchild])
    moved = {s.name: s for s in ts.traces[0].spans}
    assert (T0 + 20_000_000, T0 + 80_000_000) == (moved["engine.work"].start_ns, moved["engine.work"].end_ns)
    assert (T0 + 30_000_000, T0 + 40_000_000) == (moved["llm.forward"].start_ns, moved["llm.forward"].end_ns)
    sections = critical_path(ts.traces[0], moved["llm.request"])
    assert 100_000_000 == sum(s.duration_ns for s in sections)


def test_skew_is_left_alone_within_one_process() -> None:
    """Spans of one process are never moved, even when a child overflows its parent."""
    parent = span("p", 0, 100)
    child = span("c", 90, 120, parent=parent)
    ts = build_traceset([parent, child])
    assert T0 + 90_000_000 == next(s for s in ts.traces[0].spans if s.name == "c").start_ns


def test_engine_view_joins_steps_to_requests_by_link_and_step_id() -> None:
    """A step's link to an llm.request (or the request's step-id range) joins the two views."""
    req = request_trace("a" * 32, 0, 1, 2, 3, 4, attrs={sc.LLM_STEP_FIRST_ID: 0, sc.LLM_STEP_LAST_ID: 1})
    window = engine_window("dp0", [(3.0, 3.5, 5.5, 6.0), (6.0, 6.5, 9.5, 10.0)])
    ts = build_traceset(req + window)
    [r] = ts.requests
    assert [0, 1] == [s.step_id for s in ts.steps_of(r)]
    request_span = next(s for s in req if s.name == sc.SPAN_REQUEST)
    linked = span(
        sc.SPAN_STEP,
        20,
        21,
        trace="c" * 32,
        attrs={sc.LLM_ENGINE_ID: "dp1", sc.LLM_STEP_ID: 99},
        links=(Link(request_span.trace_id, request_span.span_id),),
    )
    ts = build_traceset([*req, linked])
    assert [99] == [s.step_id for s in ts.steps_of(ts.requests[0])]
