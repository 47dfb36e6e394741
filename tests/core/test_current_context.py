"""The request path reads OpenTelemetry's current context and span contexts directly
(``lifecycle/current.py``, ``_otel/span_context.py``): what it finds must be what the API would say, for every kind of
parent a host can put in the context."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from llmtrace import start_request
from llmtrace._otel.span_context import DIRECT_SPAN_CONTEXT
from llmtrace.lifecycle import current
from tests.core.conftest import Captured

_TRACE, _SPAN = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7


def test_the_installed_api_is_read_directly() -> None:
    """The fast reads are on with the OpenTelemetry API installed here (the default runtime context,
    ``SpanContext`` the tuple it has always been): were either to change, they would fall back to
    the API — correct, but the request path's cost would grow, and this says so."""
    assert DIRECT_SPAN_CONTEXT
    assert current.current_context.__self__ is otel_context._RUNTIME_CONTEXT._current_context  # type: ignore[attr-defined]
    span = NonRecordingSpan(SpanContext(_TRACE, _SPAN, False, TraceFlags(1)))
    token = current.attach(trace.set_span_in_context(span))
    try:
        assert span is current.current_context().get(current.SPAN_KEY)
        assert span is trace.get_current_span()
    finally:
        current.detach(token)


class _NotASpan:
    """What a confused host might leave under the span key: not a span at all."""


def _parents() -> dict[str, otel_context.Context]:
    def holding(value: Any) -> otel_context.Context:
        return otel_context.Context({current.SPAN_KEY: value})

    def span(flags: int, state: TraceState | None = None, remote: bool = True) -> otel_context.Context:
        return trace.set_span_in_context(NonRecordingSpan(SpanContext(_TRACE, _SPAN, remote, TraceFlags(flags),
                                                                      state)))

    return {
        "empty": otel_context.Context(),
        "sampled": span(1),
        "unsampled": span(0),
        "unsampled, random-id flag": span(2),
        "unsampled, with trace state": span(0, TraceState([("vendor", "abc")])),
        "invalid span": trace.set_span_in_context(trace.INVALID_SPAN),
        "not a span": holding(_NotASpan()),
        "none under the key": holding(None),
    }


PARENTS = _parents()


@pytest.mark.parametrize("name", list(PARENTS))
@pytest.mark.parametrize("owns_span", [True, False])
def test_a_request_reads_its_parent_as_the_api_does(captured: Captured, name: str, owns_span: bool) -> None:
    parent = PARENTS[name]
    found = trace.get_current_span(parent).get_span_context()  # the API's reading, the reference
    token = otel_context.attach(parent)
    try:
        handle = start_request(f"r-{name}", owns_span=owns_span)
    finally:
        otel_context.detach(token)
    if not owns_span:
        assert found.trace_flags.sampled == handle.recording
        handle.finished()
        return
    assert handle.span is not None
    made = handle.span.get_span_context()
    assert made.is_valid
    if found.is_valid:  # a child of the parent: its trace, its decision, a span id of its own
        assert (found.trace_id, found.trace_flags.sampled, found.trace_state) == \
               (made.trace_id, made.trace_flags.sampled, made.trace_state)
        assert found.span_id != made.span_id
        assert found.trace_flags.sampled == handle.recording
    handle.finished()
    if handle.recording:
        (span,) = captured.named("llm.request")
        assert (span.parent.span_id if span.parent else None) == (found.span_id if found.is_valid else None)


@pytest.mark.parametrize("flags", [0, 1])
def test_a_request_under_a_carrier_reads_it_as_the_api_does(captured: Captured, flags: int) -> None:
    """An engine's request under the API server's carrier, its span owned over there: recording
    exactly when the carrier says sampled; a carrier naming no valid span makes it own its span."""
    good = start_request("engine-side", carrier=f"00-{_TRACE:032x}-{_SPAN:016x}-{flags:02x}", owns_span=False)
    assert bool(flags) == good.recording
    assert good.owns_span is False
    good.finished()
    bad = start_request("engine-side-bad", carrier=f"00-{'0' * 32}-{_SPAN:016x}-01", owns_span=False)
    assert bad.owns_span is True
    bad.finished()
