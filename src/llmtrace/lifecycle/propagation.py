"""W3C trace-context carriers for requests that cross a process boundary.

A carrier is a plain ``dict[str, str]`` (``traceparent``, ``tracestate``) that
travels on the request message; reuse a field the engine already has (vLLM's
``trace_headers``) instead of adding one. A malformed carrier yields an empty
context (a new root), logged once — never an exception into the engine.

Both ends run once per request on a serving thread, sampled or not: the common carrier (a
version-00 ``traceparent`` and no ``tracestate``) is written and read here directly, giving the
context OpenTelemetry's W3C propagator would (``tests/core/test_propagation.py`` compares
them); anything else goes through that propagator. Reading it with the propagator's regular
expression was the largest llmtrace line on a traced engine process's serving thread.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from llmtrace._otel.span_context import DIRECT_SPAN_CONTEXT
from llmtrace._safety import warn_once
from llmtrace.lifecycle.current import SPAN_KEY

_PROPAGATOR = TraceContextTextMapPropagator()
_HEX = frozenset("0123456789abcdef")
_ZERO_TRACE_ID, _ZERO_SPAN_ID = "0" * 32, "0" * 16
_EMPTY_TRACE_STATE = trace.DEFAULT_TRACE_STATE
_tuple_new = tuple.__new__


def inject(ctx: otel_context.Context | None = None) -> dict[str, str]:
    """The carrier for *ctx* (default: the current context); empty when it holds no valid span."""
    return carrier_of(trace.get_current_span(ctx).get_span_context())


def carrier_of(span_context: trace.SpanContext) -> dict[str, str]:
    """The carrier naming *span_context* as the parent; empty when it is not valid."""
    if type(span_context) is trace.SpanContext and DIRECT_SPAN_CONTEXT:
        trace_id, span_id, _, flags, state, valid = span_context  # without a property frame per field
    else:
        trace_id, span_id, flags = span_context.trace_id, span_context.span_id, span_context.trace_flags
        state, valid = span_context.trace_state, span_context.is_valid
    if not valid:
        return {}
    carrier = {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"}
    if state is not _EMPTY_TRACE_STATE and state:  # (the usual state is that one: no frame to find it empty)
        carrier["tracestate"] = state.to_header()
    return carrier


def _plain_traceparent(carrier: Mapping[str, str]) -> otel_context.Context | None:
    """The context of a carrier holding only a well-formed version-00 ``traceparent`` (None: any
    other carrier, left to the propagator)."""
    if "tracestate" in carrier:
        return None
    header = carrier.get("traceparent")
    if (type(header) is not str or len(header) != 55 or header[:3] != "00-" or header[35] != "-"
            or header[52] != "-"):
        return None
    trace_hex, span_hex, flags_hex = header[3:35], header[36:52], header[53:]
    if (not _HEX.issuperset(trace_hex) or not _HEX.issuperset(span_hex) or not _HEX.issuperset(flags_hex)
            or trace_hex == _ZERO_TRACE_ID or span_hex == _ZERO_SPAN_ID):
        return None
    flags = trace.TraceFlags(int(flags_hex, 16))
    if DIRECT_SPAN_CONTEXT:  # ids checked above: non-zero hex of their widths, so in range and valid
        span_context = _tuple_new(trace.SpanContext, (int(trace_hex, 16), int(span_hex, 16), True, flags,
                                                      _EMPTY_TRACE_STATE, True))
    else:
        span_context = trace.SpanContext(int(trace_hex, 16), int(span_hex, 16), is_remote=True, trace_flags=flags)
    # The context set_span_in_context would make from an empty one, without its frames.
    return otel_context.Context({SPAN_KEY: trace.NonRecordingSpan(span_context)})


def extract(carrier: Mapping[str, str] | str | None) -> otel_context.Context:
    """The context a carrier describes; an empty one (and one warning) if it is malformed.

    A bare string is taken as the ``traceparent`` header's value (engines that carry only that)."""
    if not carrier:
        return otel_context.Context()
    if isinstance(carrier, str):
        carrier = {"traceparent": carrier}
    if type(carrier) is dict and (plain := _plain_traceparent(carrier)) is not None:
        return plain
    try:
        ctx = _PROPAGATOR.extract(dict(carrier), context=otel_context.Context())
    except Exception:  # noqa: BLE001 - a foreign carrier is untrusted input (not even a mapping, maybe)
        ctx = otel_context.Context()
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        warn_once("bad-carrier", "llmtrace: ignoring a malformed trace carrier %s", _short_repr(carrier))
    return ctx


def _short_repr(value: object, limit: int = 200) -> str:
    """A carrier for a log line: any size arrives from another process, one line goes out."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
