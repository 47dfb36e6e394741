"""Spans that are already over: how the span builder materialises records.

A record reaches the span builder after the fact — its start, end, parent and
attributes are all known. The SDK's live-span path (a sampler call per span, a lock,
attribute cleaning, processors' ``on_start``, ``end``) costs ~50 µs a span on a
2-core VM; an engine step (``llm.step``, four phases, a link per request) took
~300 µs of CPU that an inference server's own threads would rather have. When the
tracer is the OTel SDK's, :class:`SdkFinishedSpans` builds each span directly as the
``ReadableSpan`` that processors receive at ``on_end`` — the same object the SDK
would hand them — at a fraction of the cost. Any other tracer (a vendor SDK, the
no-op proxy) goes through the tracer API unchanged (:class:`ApiFinishedSpans`).

On purpose, the direct path differs from the live one in two ways:

* a child takes its parent's sampling decision without asking the sampler again
  (what ``ParentBased`` — the SDK default and llmtrace's own sampler — decides anyway),
  so an engine window is recorded whole or not at all; a provider with any other
  sampler gets the API path;
* processors' ``on_start`` is not called: these spans are born finished.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, ParentBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from llmtrace import _runtime
from llmtrace._otel.export import BoundedSpanProcessor
from llmtrace._otel.ids import PrivateRandomIdGenerator, getrandbits
from llmtrace._otel.span_context import DIRECT_SPAN_CONTEXT

_tuple_new = tuple.__new__
_DIRECT_SPAN_CONTEXT = DIRECT_SPAN_CONTEXT  # made as the tuple it is (_otel/span_context.py)
_DEFAULT_TRACE_STATE = trace.DEFAULT_TRACE_STATE
_RANDOM_TRACE_ID = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)  # the flag is newer than the oldest SDK we support
_INTERNAL = SpanKind.INTERNAL
_UNSET = Status(StatusCode.UNSET)
_PLAIN = frozenset((str, int, float, bool))  # attribute values the SDK keeps as they are
_TRACE_ID_LIMIT = (1 << 64) - 1  # the low 64 bits a ratio sampler compares (TraceIdRatioBased.TRACE_ID_LIMIT)


class OpenSpan(Protocol):
    """A span opened by :meth:`FinishedSpans.open`; only its context is read."""

    def get_span_context(self) -> SpanContext | None: ...


class FinishedSpans(Protocol):
    def open(self, name: str, parent: SpanContext | None, start_ns: int,
             attributes: Mapping[str, Any] | None = None, links: Sequence[Link] = (),
             kind: SpanKind = _INTERNAL) -> OpenSpan | None:
        """A span starting at wall time *start_ns* under *parent* (None: a new trace).

        Returns None when the span is not sampled: its children are skipped."""

    def close(self, span: OpenSpan, end_ns: int) -> None:
        """End *span* at wall time *end_ns* and hand it to the export pipeline."""


class ApiFinishedSpans:
    """Through the tracer API: works with any tracer, at the live path's cost."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def open(self, name: str, parent: SpanContext | None, start_ns: int,
             attributes: Mapping[str, Any] | None = None, links: Sequence[Link] = (),
             kind: SpanKind = _INTERNAL) -> OpenSpan | None:
        span = trace.INVALID_SPAN if parent is None else trace.NonRecordingSpan(parent)
        opened = self._tracer.start_span(name, context=trace.set_span_in_context(span), kind=kind,
                                         attributes=attributes, links=links, start_time=start_ns)
        return opened if opened.is_recording() else None

    def close(self, span: OpenSpan, end_ns: int) -> None:
        span.end(end_time=end_ns)  # type: ignore[attr-defined]


class SdkFinishedSpans:
    """Builds the SDK's ``ReadableSpan`` directly and hands it to the provider's processors."""

    def __init__(self, tracer: SdkTracer) -> None:
        self._processor = tracer.span_processor
        self._resource = tracer.resource
        self._sampler = tracer.sampler
        self._ids = tracer.id_generator
        self._random_ids = _RANDOM_TRACE_ID if self._ids.is_trace_id_random() else 0
        scope = getattr(tracer, "_instrumentation_scope", None)
        self._scope = scope if isinstance(scope, InstrumentationScope) else InstrumentationScope("llmtrace")
        limits = getattr(tracer, "_span_limits", None)
        self._limits = limits if isinstance(limits, SpanLimits) else SpanLimits()
        self._max_links = getattr(limits, "max_links", None) or 128
        # The SDK's generator or llmtrace's: getrandbits is what they do (ids from llmtrace's own
        # generator either way: a host that seeds `random` does not repeat them, _otel/ids.py).
        self._fast_ids = type(self._ids) in (RandomIdGenerator, PrivateRandomIdGenerator)
        self._root_bound: int | None = getattr(self._sampler, "root_bound", None)  # llmtrace's own sampler
        #: Whether :meth:`new_context` decides a new trace exactly as the SDK would (llmtrace's own
        #: sampler, read directly); with another root sampler it is not asked the span's attributes.
        self.reads_root_sampler = self._root_bound is not None
        self._root_flags = {True: TraceFlags(TraceFlags.SAMPLED | self._random_ids),
                            False: TraceFlags(self._random_ids)}

    def open(self, name: str, parent: SpanContext | None, start_ns: int,
             attributes: Mapping[str, Any] | None = None, links: Sequence[Link] = (),
             kind: SpanKind = _INTERNAL) -> OpenSpan | None:
        if parent is None or not parent.is_valid:
            trace_id = self._ids.generate_trace_id()
            decision = self._sampler.should_sample(None, trace_id, name, kind, attributes, links)
            if decision.decision is not Decision.RECORD_AND_SAMPLE:
                return None
            flags, state, parent = TraceFlags(TraceFlags.SAMPLED | self._random_ids), decision.trace_state, None
            if decision.attributes:
                attributes = {**decision.attributes, **(attributes or {})}
        elif parent.trace_flags.sampled:
            trace_id, flags, state = parent.trace_id, TraceFlags(parent.trace_flags), parent.trace_state
        else:
            return None
        span_id = self._ids.generate_span_id()
        context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags, trace_state=state)
        return ReadableSpan(name, context, parent, self._resource, dict(attributes) if attributes else {},
                            (), tuple(links[:self._max_links]), kind, None, _UNSET, start_ns, None, self._scope)

    def close(self, span: OpenSpan, end_ns: int) -> None:
        readable = cast(ReadableSpan, span)  # what open() returned
        readable._end_time = end_ns  # the SDK's own Span.end() sets exactly this
        self._processor.on_end(readable)

    # ------------------------------------------------------------ a request's spans, in one go
    def child(self, name: str, parent: SpanContext, start_ns: int, end_ns: int,
              attributes: Mapping[str, Any] | None, links: Sequence[Link] = ()) -> ReadableSpan | None:
        """The finished child of *parent* that :meth:`open` then :meth:`close` would hand the processors,
        returned instead, for :meth:`end_all` (None: *parent* is not sampled, no child is recorded)."""
        if not parent.trace_flags.sampled:
            return None
        if self._fast_ids and _DIRECT_SPAN_CONTEXT:  # ids in range: getrandbits's, and a sampled parent's
            context = _tuple_new(SpanContext, (parent.trace_id, getrandbits(64) or self._ids.generate_span_id(),
                                               False, TraceFlags(parent.trace_flags), parent.trace_state, True))
        else:
            context = SpanContext(parent.trace_id, self._ids.generate_span_id(), is_remote=False,
                                  trace_flags=TraceFlags(parent.trace_flags), trace_state=parent.trace_state)
        return ReadableSpan(name, context, parent, self._resource, dict(attributes) if attributes else {}, (),
                            tuple(links[:self._max_links]) if links else (), _INTERNAL, None, _UNSET, start_ns,
                            end_ns, self._scope)

    def end_all(self, spans: Sequence[ReadableSpan]) -> None:
        """Hand finished *spans* to the processors: llmtrace's own export processors take them in one
        call (a request's five spans were five passes through three processors' ``on_end``)."""
        processor = self._processor
        processors = getattr(processor, "_span_processors", None)
        if type(processor) is not SynchronousMultiSpanProcessor or processors is None:
            for span in spans:
                processor.on_end(span)
            return
        for one in processors:
            if type(one) is BoundedSpanProcessor:
                one.on_end_many(spans)
            else:
                for span in spans:
                    one.on_end(span)

    # ------------------------------------------------------------ a span whose ids came first
    def new_context(self, parent: SpanContext | None, name: str, kind: SpanKind) -> tuple[SpanContext, bool]:
        """The identity of a span starting now under *parent* (a valid context; None: a new trace) and whether it is
        sampled: fresh ids and the parent-based decision, as the SDK's ``start_span`` would take
        them. Asked on a request path, so the SDK's random ids and llmtrace's sampler are read directly."""
        fast = self._fast_ids
        span_id = (getrandbits(64) if fast else 0) or self._ids.generate_span_id()
        if parent is not None:
            if fast and _DIRECT_SPAN_CONTEXT:  # ids in range: getrandbits's, and a valid parent's
                trace_id, _, _, flags, state, _ = parent  # its fields without a property frame each
                return _tuple_new(SpanContext, (trace_id, span_id, False, flags, state, True)), flags & 1 == 1
            flags = parent.trace_flags
            return SpanContext(parent.trace_id, span_id, False, flags, parent.trace_state), flags.sampled
        trace_id = (getrandbits(128) if fast else 0) or self._ids.generate_trace_id()
        bound = self._root_bound
        if bound is not None:
            sampled = trace_id & _TRACE_ID_LIMIT < bound
        else:
            decision = self._sampler.should_sample(None, trace_id, name, kind)
            sampled = decision.decision is Decision.RECORD_AND_SAMPLE
        if fast and _DIRECT_SPAN_CONTEXT:
            return (_tuple_new(SpanContext, (trace_id, span_id, False, self._root_flags[sampled],
                                             _DEFAULT_TRACE_STATE, True)), sampled)
        return SpanContext(trace_id, span_id, False, self._root_flags[sampled], None), sampled

    def emit(self, name: str, context: SpanContext, parent: SpanContext | None, kind: SpanKind, start_ns: int,
             end_ns: int, attributes: Mapping[str, Any], status: Status, events: Sequence[Event] = (),
             links: Sequence[Link] = ()) -> None:
        """A finished span whose context was handed out while it ran (children already point at it)."""
        self._processor.on_end(self.finished(name, context, parent, kind, start_ns, end_ns, attributes, status,
                                             events, links))

    def finished(self, name: str, context: SpanContext, parent: SpanContext | None, kind: SpanKind, start_ns: int,
                 end_ns: int, attributes: Mapping[str, Any], status: Status, events: Sequence[Event] = (),
                 links: Sequence[Link] = ()) -> ReadableSpan:
        """What :meth:`emit` hands the processors, returned instead (for :meth:`end_all`)."""
        return ReadableSpan(name, context, parent, self._resource, dict(attributes), tuple(events), tuple(links),
                            kind, None, status, start_ns, end_ns, self._scope)

    # ------------------------------------------------ what the SDK's live span would hold
    def attributes(self, attributes: dict[str, Any]) -> Mapping[str, Any]:
        """*attributes* as the SDK's live span keeps them: *attributes* itself when every key is a
        non-empty string and every value a plain scalar or a list of strings (made a tuple, as the
        SDK does) and no limit applies — the common case, at a fraction of the SDK's per-value
        checks — else the SDK's own ``BoundedAttributes``."""
        limits = self._limits
        if limits.max_span_attribute_length is None and (limits.max_span_attributes or 0) >= len(attributes):
            for key, value in attributes.items():
                kind = type(value)
                if kind is list and all(type(item) is str for item in value):
                    attributes[key] = tuple(value)  # a value replaced in place: no key added or moved
                elif kind not in _PLAIN or type(key) is not str or not key:
                    break
            else:
                return attributes
        return BoundedAttributes(limits.max_span_attributes, attributes, immutable=False,
                                 max_value_len=limits.max_span_attribute_length)

    def event(self, name: str, attributes: Any, timestamp: int | None) -> Event:
        """An event as the SDK's live span's ``add_event`` makes it."""
        limits = self._limits
        return Event(name, BoundedAttributes(limits.max_event_attributes, attributes, immutable=True,
                                             max_value_len=limits.max_attribute_length), timestamp)

    def link(self, context: SpanContext, attributes: Any) -> Link | None:
        """A link as the SDK's live span's ``add_link`` makes it (None: the SDK would not add it)."""
        if not (context and (context.is_valid or attributes or context.trace_state)):
            return None
        limits = self._limits
        return Link(context, BoundedAttributes(limits.max_link_attributes, attributes, immutable=True,
                                               max_value_len=limits.max_attribute_length))


def finished_spans(tracer: trace.Tracer) -> FinishedSpans:
    """The cheapest correct way to emit finished spans through *tracer*."""
    if isinstance(tracer, SdkTracer) and _parent_based(tracer.sampler) and _enabled(tracer):
        return SdkFinishedSpans(tracer)
    return ApiFinishedSpans(tracer)


_cached: tuple[Any, FinishedSpans] | None = None


def current() -> FinishedSpans:
    """:func:`finished_spans` for llmtrace's tracer, rebuilt when the tracer provider changes."""
    global _cached
    provider = _runtime.tracer_provider()
    cached = _cached
    if cached is None or cached[0] is not provider:
        cached = _cached = (provider, finished_spans(_runtime.tracer()))
    return cached[1]


def _parent_based(sampler: Any) -> bool:
    from llmtrace._otel.providers import LLMTraceSampler

    return isinstance(sampler, (ParentBased, LLMTraceSampler))


def _enabled(tracer: SdkTracer) -> bool:
    is_enabled = getattr(tracer, "_is_enabled", None)  # the SDK's tracer configurator (newer SDKs)
    return bool(is_enabled()) if callable(is_enabled) else True

