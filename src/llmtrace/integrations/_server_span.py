"""llmtrace's own SERVER span: its identity decided on the request path, the span built off it.

OpenTelemetry's server middleware opens a live SDK span per call (sampler, ids, attribute
cleaning, processors' ``on_start``), attaches it, and fills it while the call runs — for
every call, sampled or not. llmtrace does what the call's children need and nothing else
while the call runs::

    arrival        ids + sampling decision -> a ServerSpan in the context (children parent on it)
    while running  timestamps and the response status, kept on the call
    response done  metrics folded in-process; if sampled, the finished span is built on the
                   span builder's thread (lifecycle/builder.py) as the SDK's ReadableSpan

:class:`ServerSpan` is the stand-in the call's context holds: its ``SpanContext`` carries the
real ids (a ``traceparent`` made from it, an ``llm.request`` opened under it, point at the
span that will be exported), ``is_recording()`` says whether the call was sampled, and
attributes, events or a status set on it by other code are kept for the finished span.

This applies where the tracer is the OpenTelemetry SDK's with a parent-based sampler
(lifecycle/emit.py decides, as for every finished span); any other tracer gets a live span
through the tracer API, at that API's cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import Event
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from llmtrace import _runtime
from llmtrace._otel.span_context import DIRECT_SPAN_CONTEXT
from llmtrace.lifecycle import emit
from llmtrace.lifecycle.clock import to_wall_ns
from llmtrace.lifecycle.current import NO_PARENT, SPAN_KEY
from llmtrace.lifecycle.pending import PendingSpan

_SERVER = SpanKind.SERVER


class ServerSpan(PendingSpan):
    """The SERVER span while its call runs (see the module docstring); ended by its call, not by ``end()``."""

    kind = _SERVER

    __slots__ = ()


class ServerSpanStart(tuple):  # type: ignore[type-arg]  # a plain tuple: built once per HTTP call
    """How one call's SERVER span began: ``(span, recording, parent, context, spans)`` — the span,
    whether it records, the caller's span context, the call's context (the span in the caller's
    extracted context) and the finished-span emitter it will be built with."""

    __slots__ = ()

    @property
    def span(self) -> trace.Span:
        return cast(trace.Span, self[0])

    @property
    def parent(self) -> SpanContext | None:
        return cast("SpanContext | None", self[2])

    @property
    def spans(self) -> emit.FinishedSpans:
        return cast(emit.FinishedSpans, self[4])


class PropagationFields(NamedTuple):
    """The header (or metadata) names the global propagator reads, lower-case: as text, and as the
    bytes ASGI headers carry."""

    text: frozenset[str]
    raw: frozenset[bytes]


#: ``(propagator, its fields)`` for the propagator last asked about. Server integrations read it
#: inline once per call (a hit costs no frame) and call :func:`propagation_fields` on a miss.
fields_cache: tuple[Any, PropagationFields | None] | None = None


def propagation_fields(propagator: Any) -> PropagationFields | None:
    """*propagator*'s fields (None: it does not say, so every header is offered to it), cached."""
    global fields_cache
    fields = getattr(propagator, "fields", None)
    names = None
    if isinstance(fields, (set, frozenset)):
        text = frozenset(f.lower() for f in fields)
        names = PropagationFields(text, frozenset(f.encode("latin-1") for f in text))
    fields_cache = (propagator, names)
    return names


def begin(parent_context: otel_context.Context, name: str, start_ns: int, offset: int) -> ServerSpanStart:
    """Open the SERVER span of a call that arrived at *start_ns* (monotonic), under *parent_context*
    (the caller's, extracted from the request); *name* is provisional (the route is not known yet)."""
    spans = emit.current()
    parent: SpanContext | None = None
    if parent_context is not NO_PARENT:
        found = trace.get_current_span(parent_context).get_span_context()
        parent = found if found.is_valid else None
    span: trace.Span
    if isinstance(spans, emit.SdkFinishedSpans):
        context, recording = spans.new_context(parent, name, _SERVER)
        span = ServerSpan(context, recording)
    else:
        span = _runtime.tracer().start_span(name, context=parent_context, kind=_SERVER,
                                            start_time=to_wall_ns(start_ns, offset))
        recording = span.is_recording()
    if parent_context is NO_PARENT:
        call_context = otel_context.Context({SPAN_KEY: span})
    else:
        call_context = trace.set_span_in_context(span, parent_context)
    return ServerSpanStart((span, recording, parent, call_context, spans))


def finish(start: ServerSpanStart, name: str, start_ns: int, end_ns: int, offset: int,
           attributes: dict[str, Any], status: Status, events: Sequence[Event] = ()) -> None:
    """Build the finished SERVER span (on the span builder's thread); what other code set on the
    span while the call ran wins over *attributes*, its status over *status* unless that is ERROR."""
    span, _, parent, _, spans = start  # (its fields without a property frame and a cast each)
    if isinstance(span, ServerSpan):
        if not span.is_recording() or not isinstance(spans, emit.SdkFinishedSpans):
            return
        attributes.update(span.attributes or {})
        if span.status is not None and status.status_code is not StatusCode.ERROR:
            status = span.status
        spans.emit(span.name or name, span.get_span_context(), parent, _SERVER,
                         to_wall_ns(start_ns, offset), to_wall_ns(max(start_ns, end_ns), offset), attributes,
                         status, [*events, *(span.events or ())])
        return
    if span.is_recording():
        span.update_name(name)
        span.set_attributes(attributes)
        for event in events:
            span.add_event(event.name, event.attributes, event.timestamp)
        if status.status_code is not StatusCode.UNSET:
            span.set_status(status)
    span.end(end_time=to_wall_ns(max(start_ns, end_ns), offset))


def traceresponse(span: trace.Span) -> str:
    """The W3C Trace Context Level 2 ``traceresponse`` value naming *span*."""
    context = span.get_span_context()
    if type(context) is SpanContext and DIRECT_SPAN_CONTEXT:
        trace_id, span_id, _, flags, _, _ = context  # its fields without a property frame each
    else:
        trace_id, span_id, flags = context.trace_id, context.span_id, context.trace_flags
    # %-formatting: a third cheaper than the f-string's three format specs (once per traced response).
    return "00-%032x-%016x-%02x" % (trace_id, span_id, flags & 0xFF)  # noqa: UP031

