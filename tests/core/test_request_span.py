"""``llm.request`` is built finished at the request's end; while the request runs, what other code does
to its span follows the SDK live span's rules, and the exported span is what the live span would be."""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

from llmtrace import semconv, start_request
from llmtrace.lifecycle.pending import RequestSpan
from llmtrace.lifecycle.request import RequestHandle
from tests.core.conftest import Captured, InstallRuntime

MS = 1_000_000
SERVER = SpanContext(0xABC, 0xDEF, False, TraceFlags(TraceFlags.SAMPLED))


def _under_server(request_id: str, model: str | None = None,
                  attributes: dict[str, Any] | None = None) -> RequestHandle:
    token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(SERVER)))
    try:
        return start_request(request_id, arrival_ns=0, model=model, attributes=attributes)
    finally:
        otel_context.detach(token)


def test_the_finished_span_keeps_what_was_set_on_it_with_the_sdk_rules(captured: Captured) -> None:
    handle = _under_server("r1", model="m", attributes={"x.list": ["a", "b"], "x.num": 3})
    assert isinstance(handle.span, RequestSpan) and handle.span.is_recording()
    handle.tokenized(5, 0, 1)
    handle.span.set_attribute(semconv.GEN_AI_REQUEST_MODEL, "m2")  # set again: moves last, as in the SDK
    handle.span.add_event("ev", {"k": [1, 2]}, timestamp=5)
    handle.span.set_status(Status(StatusCode.OK))  # OK is final: the abort below does not override it
    handle.token(at_ns=2 * MS)
    handle.aborted(at_ns=3 * MS)
    request = captured.named(semconv.SPAN_REQUEST)[0]
    attrs = dict(request.attributes or {})
    keys = list(attrs)
    assert attrs["x.list"] == ("a", "b") and attrs[semconv.GEN_AI_REQUEST_MODEL] == "m2"
    assert keys.index(semconv.GEN_AI_REQUEST_MODEL) > keys.index("x.num")
    assert request.status.status_code is StatusCode.OK
    assert [(e.name, dict(e.attributes or {}), e.timestamp) for e in request.events] == [("ev", {"k": (1, 2)}, 5)]
    assert request.parent is not None and request.parent.span_id == SERVER.span_id
    assert request.context is not None and request.context.trace_id == SERVER.trace_id
    assert (request.start_time or 0) < (request.end_time or 0)
    tokenize = captured.named(semconv.SPAN_TOKENIZE)[0]
    assert tokenize.parent is not None and tokenize.parent.span_id == request.context.span_id
    assert not handle.span.is_recording()  # ended, as the live span would be


def test_an_error_is_recorded_with_its_traceback(captured: Captured) -> None:
    handle = _under_server("r2")
    try:
        raise ValueError("boom")
    except ValueError as exc:
        handle.aborted(exc, at_ns=MS)
    request = captured.named(semconv.SPAN_REQUEST)[0]
    assert (request.status.status_code, request.status.description) == (StatusCode.ERROR, "ValueError")
    event = request.events[0]
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"] == "ValueError"
    assert "ValueError: boom" in str((event.attributes or {})["exception.stacktrace"])


def test_an_unsampled_root_request_records_nothing(runtime_with: InstallRuntime) -> None:
    captured = runtime_with(sample_ratio=0.0)
    handle = start_request("r3", arrival_ns=0)
    assert handle.span is not None and not handle.span.is_recording() and not handle.recording
    handle.finished(at_ns=MS)
    assert captured.spans() == []
