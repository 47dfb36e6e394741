"""Carriers between processes: llmtrace's direct reading and writing of the common W3C carrier
gives exactly what OpenTelemetry's own TraceContext propagator gives, for good and bad input."""

from __future__ import annotations

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from llmtrace.lifecycle.propagation import extract, inject
from tests.core.conftest import Captured

_OTEL = TraceContextTextMapPropagator()
_TRACE, _SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

CARRIERS = [
    {"traceparent": f"00-{_TRACE}-{_SPAN}-01"},
    {"traceparent": f"00-{_TRACE}-{_SPAN}-00"},
    {"traceparent": f"00-{_TRACE}-{_SPAN}-03"},
    {"traceparent": f"00-{_TRACE}-{_SPAN}-01", "tracestate": "vendor=abc,other=1"},
    {"traceparent": f"01-{_TRACE}-{_SPAN}-01-future-field"},
    {"traceparent": f" 00-{_TRACE}-{_SPAN}-01\t"},
    {"traceparent": f"00-{_TRACE.upper()}-{_SPAN}-01"},
    {"traceparent": f"00-{'0' * 32}-{_SPAN}-01"},
    {"traceparent": f"00-{_TRACE}-{'0' * 16}-01"},
    {"traceparent": f"ff-{_TRACE}-{_SPAN}-01"},
    {"traceparent": f"00-{_TRACE}-{_SPAN}-01-extra"},
    {"traceparent": f"00-{_TRACE[:-1]}g-{_SPAN}-01"},
    {"traceparent": f"00-{_TRACE}-{_SPAN}-0x"},
    {"traceparent": f"00-{_TRACE}_{_SPAN}-01"},
    {"traceparent": f"00-+{_TRACE[1:]}-{_SPAN}-01"},
    {"traceparent": ""},
    {"other": "x"},
]


def _span_context(ctx: otel_context.Context) -> SpanContext:
    return trace.get_current_span(ctx).get_span_context()


@pytest.mark.parametrize("carrier", CARRIERS, ids=[str(i) for i in range(len(CARRIERS))])
def test_extract_gives_the_w3c_propagators_context(carrier: dict[str, str]) -> None:
    ours = _span_context(extract(carrier))
    theirs = _span_context(_OTEL.extract(dict(carrier), context=otel_context.Context()))
    assert (ours.trace_id, ours.span_id, ours.is_remote, ours.trace_flags, ours.is_valid) == \
           (theirs.trace_id, theirs.span_id, theirs.is_remote, theirs.trace_flags, theirs.is_valid)
    assert type(ours.trace_flags) is type(theirs.trace_flags)
    assert ours.trace_state.to_header() == theirs.trace_state.to_header()


@pytest.mark.parametrize("flags", [0, 1, 3])
@pytest.mark.parametrize("state", [None, TraceState([("vendor", "abc"), ("other", "1")])])
def test_inject_writes_the_w3c_propagators_carrier(flags: int, state: TraceState | None) -> None:
    span_context = SpanContext(int(_TRACE, 16), int(_SPAN, 16), is_remote=False, trace_flags=TraceFlags(flags),
                               trace_state=state)
    ctx = trace.set_span_in_context(NonRecordingSpan(span_context))
    theirs: dict[str, str] = {}
    _OTEL.inject(theirs, context=ctx)
    assert inject(ctx) == theirs
    assert _span_context(extract(inject(ctx))).span_id == span_context.span_id


def test_inject_without_a_valid_span_is_an_empty_carrier() -> None:
    assert {} == inject(otel_context.Context())


@pytest.mark.parametrize("parent", [None, *CARRIERS[:3], {"traceparent": f"00-{_TRACE}-{_SPAN}-01",
                                                         "tracestate": "vendor=1,other=two"}])
def test_a_requests_carrier_names_its_span_as_the_propagator_would(captured: Captured,
                                                                  parent: dict[str, str] | None) -> None:
    """``RequestHandle.carrier()`` reads its span's context directly: the same carrier as OpenTelemetry's
    propagator writes for the request's context, sampled or not, with the parent's trace state."""
    from llmtrace import start_request

    handle = start_request("c1", carrier=parent)
    expected: dict[str, str] = {}
    _OTEL.inject(expected, context=handle.context())
    assert expected == handle.carrier()
    handle.finished()
