"""vLLM's own request spans (``llm_request``, phases as latency attributes) read as requests of
the span model: known answers on hand-built spans shaped as vLLM 0.33's ``do_tracing`` makes
them. The same path against the real vLLM and the real Jaeger is tests/vllm/test_native_tracing.py."""

from __future__ import annotations

from typing import Any

import pytest

from llmtrace import semconv as sc
from llmtrace.analysis import analyze, build_traceset, to_json
from llmtrace.analysis.breakdown import request_phases
from llmtrace.analysis.model import SpanKind
from llmtrace.analysis.vllm_native import DERIVED_FROM, derived_phases
from tests.analysis.builders import T0, ms, span


def vllm_request(trace: str, start: float, end: float, *, ttft: float | None, queue: float | None,
                 prefill: float | None, decode: float | None, rid: str = "0", **extra: Any) -> Any:
    """An ``llm_request`` span (times in ms; latencies in seconds, as vLLM writes them)."""
    attrs: dict[str, Any] = {sc.VLLM_REQUEST_ID: rid, sc.GEN_AI_LATENCY_E2E: (end - start) / 1e3,
                             sc.VLLM_USAGE_PROMPT_TOKENS: 12, sc.VLLM_USAGE_COMPLETION_TOKENS: 20, **extra}
    for key, value in ((sc.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN, ttft), (sc.GEN_AI_LATENCY_TIME_IN_QUEUE, queue),
                       (sc.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL, prefill),
                       (sc.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE, decode)):
        if value is not None:
            attrs[key] = value
    return span(sc.VLLM_SPAN_REQUEST, start, end, trace=trace, kind=SpanKind.SERVER, attrs=attrs)


def test_phases_are_placed_back_to_back_ending_with_the_span() -> None:
    """arrival 0, end 452 (ms): decode 400 ends at the end, prefill 15 and queue 30 before it."""
    req = vllm_request("a" * 32, 0, 452, ttft=0.050, queue=0.030, prefill=0.015, decode=0.400)
    got = {s.name: ((s.start_ns - T0) / 1e6, (s.end_ns - T0) / 1e6) for s in derived_phases(req)}
    assert {sc.SPAN_QUEUE: (7.0, 37.0), sc.SPAN_PREFILL: (37.0, 52.0), sc.SPAN_DECODE: (52.0, 452.0)} == got
    assert all(s.parent_id == req.span_id and s.attributes[DERIVED_FROM] == "llm_request"
               for s in derived_phases(req))


def test_phases_are_clipped_to_the_span_and_bad_numbers_place_nothing() -> None:
    # A decode longer than the span (inconsistent numbers) is cut at the span's start.
    req = vllm_request("b" * 32, 0, 100, ttft=0.050, queue=-1.0, prefill=float("nan"), decode=0.400)
    got = {s.name: ((s.start_ns - T0) / 1e6, (s.end_ns - T0) / 1e6) for s in derived_phases(req)}
    assert {sc.SPAN_DECODE: (0.0, 100.0)} == got  # negative queue and NaN prefill: no span
    # Without a decode latency the first token anchors at arrival + ttft.
    req = vllm_request("c" * 32, 0, 100, ttft=0.050, queue=0.010, prefill=0.020, decode=None)
    got = {s.name: ((s.start_ns - T0) / 1e6, (s.end_ns - T0) / 1e6) for s in derived_phases(req)}
    assert {sc.SPAN_QUEUE: (20.0, 30.0), sc.SPAN_PREFILL: (30.0, 50.0)} == got
    assert [] == derived_phases(vllm_request("d" * 32, 0, 100, ttft=None, queue=0.01, prefill=0.01, decode=None))


def test_a_vllm_only_trace_analyses_like_one_of_ours() -> None:
    reqs = [vllm_request(f"{i:032x}", i * 1000, i * 1000 + 452, rid=str(i), ttft=0.050, queue=0.030,
                         prefill=0.015, decode=0.400) for i in range(5)]
    ts = build_traceset(reqs)
    assert ["0", "1", "2", "3", "4"] == [r.request_id for r in ts.requests]
    r = ts.requests[0]
    assert (12, 20) == (r.input_tokens, r.output_tokens)
    assert r.ttft_s == pytest.approx(0.050)
    phases = request_phases(r)
    assert phases["queue"] == pytest.approx(0.030) and phases["prefill"] == pytest.approx(0.015)
    assert phases["decode"] == pytest.approx(0.400)
    assert phases["other"] == pytest.approx(0.452 - 0.445)  # before the queue: input processing, hand-off
    summary = to_json(analyze(ts))
    assert 5 == summary["requests"]["count"]
    assert summary["critical_path"][sc.SPAN_DECODE]["share"] == pytest.approx(400 / 452, abs=1e-6)
    assert summary["critical_path"][sc.SPAN_QUEUE]["share"] == pytest.approx(30 / 452, abs=1e-6)
    assert summary["critical_path"]["llm_request"]["share"] == pytest.approx(7 / 452, abs=1e-6)


def test_a_request_span_without_anchors_is_still_a_request() -> None:
    req = vllm_request("d" * 32, 0, 452, ttft=None, queue=0.030, prefill=None, decode=None)
    (r,) = build_traceset([req]).requests
    assert {} == dict(r.phases)
    assert request_phases(r)["queue"] == pytest.approx(0.030)  # the attribute stands in


def test_llmtrace_request_in_the_same_trace_wins() -> None:
    """llmtrace's vLLM integration next to vLLM's own tracing: one request, not two."""
    trace = "e" * 32
    ours = span(sc.SPAN_REQUEST, 0, 452, trace=trace, attrs={sc.LLM_REQUEST_ID: "x"})
    theirs = vllm_request(trace, 0, 452, ttft=0.050, queue=0.030, prefill=0.015, decode=0.400)
    ts = build_traceset([ours, theirs])
    assert ["x"] == [r.request_id for r in ts.requests]
    assert len(ts.traces[0].spans) == 2  # nothing derived
    assert ms(0) == ts.requests[0].request.start_ns


def test_absurd_latency_attributes_are_clipped_not_overflowed() -> None:
    """vLLM latency attributes that are finite but absurd (9e299 s) place their phases at
    the request's edges instead of overflowing to infinity."""
    req = span(sc.VLLM_SPAN_REQUEST, 0, 100, attrs={sc.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE: 9e299,
                                                    sc.GEN_AI_LATENCY_TIME_IN_QUEUE: 9e299,
                                                    sc.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: 9e299})
    phases = derived_phases(req)
    assert [p.name for p in phases] == [sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE]
    assert all(req.start_ns <= p.start_ns <= p.end_ns <= req.end_ns for p in phases)
