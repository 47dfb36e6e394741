"""Model building: views, joins, duplicates, clock skew between processes."""

from __future__ import annotations

from llmtrace import semconv as sc
from llmtrace.analysis.breakdown import PHASES, request_phases
from llmtrace.analysis.build import build_traceset
from llmtrace.analysis.critical_path import critical_path
from llmtrace.analysis.model import Link, RequestView, SpanKind
from tests.analysis.builders import T0, engine_window, ms, request_trace, span


def test_request_view_finds_server_parent_and_phases() -> None:
    """llm.request under a SERVER span: the server is the latency root, phases are grouped by name."""
    ts = build_traceset(request_trace("a" * 32, 0, 1, 2, 3, 4, server_pad=0.5))
    [r] = ts.requests
    assert r.server is not None and r.root is r.server
    assert {sc.SPAN_TOKENIZE, sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE} == set(r.phases)
    assert 0.011 == round(r.e2e_s, 9)
    assert 0.006 == round(r.ttft_s or 0, 9)


def test_a_request_view_made_directly_decodes_its_metrics_as_the_build_does() -> None:
    """``RequestView(trace, request, server, phases)`` (code written before ``RequestView.of``)
    decodes e2e, TTFT and token counts itself; given values are kept."""
    [r] = build_traceset(request_trace("a" * 32, 0, 1, 2, 3, 4, server_pad=0.5)).requests
    direct = RequestView(r.trace, r.request, r.server, r.phases)
    assert direct == r and (direct.e2e_s, direct.ttft_s, direct.input_tokens) == (r.e2e_s, r.ttft_s, 100)
    assert RequestView(r.trace, r.request, r.server, r.phases, ttft_s=None).ttft_s is None


def test_a_preempted_request_sums_its_queue_spans_and_falls_back_where_attributes_are_missing() -> None:
    """A request queued twice (preempted after its prefill) and without the latency and
    token attributes llmtrace writes: the queue phase is both spans summed, TTFT is the end
    of the last prefill, token counts come from vLLM's older names, and the phases add up to
    the client-visible latency with the HTTP span's surplus as network."""
    tid = "p" * 32
    server = span("POST /v1/completions", 0, 50, trace=tid, kind=SpanKind.SERVER)
    req = span(sc.SPAN_REQUEST, 2, 48, parent=server,
               attrs={sc.VLLM_USAGE_PROMPT_TOKENS: 300, sc.VLLM_USAGE_COMPLETION_TOKENS: 7.0})
    spans = [
        server,
        req,
        span(sc.SPAN_TOKENIZE, 2, 4, parent=req),
        span(sc.SPAN_QUEUE, 4, 10, parent=req),
        span(sc.SPAN_PREFILL, 10, 15, parent=req),
        span(sc.SPAN_QUEUE, 15, 25, parent=req),  # preempted: queued again, prefilled again
        span(sc.SPAN_PREFILL, 25, 30, parent=req),
        span(sc.SPAN_DECODE, 30, 46, parent=req),
    ]
    [r] = build_traceset(spans).requests
    assert [s.start_ns for s in r.phases[sc.SPAN_QUEUE]] == [ms(4), ms(15)]
    assert (r.e2e_s, r.ttft_s, r.input_tokens, r.output_tokens) == (0.05, 0.028, 300, 7)
    phases = request_phases(r)
    assert list(phases) == list(PHASES)
    assert phases["queue"] == 0.016 and phases["prefill"] == 0.010 and phases["tokenize"] == 0.002
    assert phases["network"] == 0.004 and phases["decode"] == 0.016
    assert round(phases["other"], 9) == 0.002  # 46..48 inside llm.request, after the last phase
    assert round(sum(phases.values()), 9) == r.e2e_s


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


def test_processes_of_one_host_share_its_clock() -> None:
    """An engine-process child of the same host (only process.pid differs) that overflows its
    api-server parent is not moved: one host, one clock, so the overflow is real."""
    parent = span("llm.request", 0, 100, resource={"host.name": "a", "process.pid": 1})
    child = span("llm.decode", 70, 130, parent=parent, resource={"host.name": "a", "process.pid": 2})
    ts = build_traceset([parent, child])
    moved = {s.name: s for s in ts.traces[0].spans}
    assert (T0 + 70_000_000, T0 + 130_000_000) == (moved["llm.decode"].start_ns, moved["llm.decode"].end_ns)


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
