"""A span whose identity is decided when it starts and which is built, finished, when it ends.

The OpenTelemetry SDK's live span takes a lock, cleans every attribute value and calls the
processors as it goes. llmtrace's own spans that run alongside a call or a request — the
SERVER span, ``llm.request`` — need only their ids while they run: children parent on them, a
``traceparent`` names them. :class:`PendingSpan` is the stand-in the context holds meanwhile;
what other code sets on it (attributes, events, a status, a name) is kept for the finished
span, which the span builder makes as the ``ReadableSpan`` processors receive
(lifecycle/emit.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from opentelemetry import trace
from opentelemetry.sdk.trace import Event
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode
from opentelemetry.util import types


class PendingSpan(trace.Span):
    """A span while it runs (see the module docstring); ended by its owner, not by ``end()``."""

    kind = SpanKind.INTERNAL

    __slots__ = ("_context", "_recording", "attributes", "events", "name", "status")

    def __init__(self, context: SpanContext, recording: bool) -> None:
        self._context = context
        self._recording = recording
        # Made when first needed: most spans are not sampled, and most sampled ones get nothing set.
        self.attributes: dict[str, Any] | None = None
        self.events: list[Event] | None = None
        self.name: str | None = None
        self.status: Status | None = None

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return self._recording

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        self.set_attributes({key: value})

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        if self._recording:
            if self.attributes is None:
                self.attributes = {}
            self.attributes.update(attributes)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        self._add_event(Event(name, attributes, timestamp))

    def _add_event(self, event: Event) -> None:
        if self._recording:
            if self.events is None:
                self.events = []
            self.events.append(event)

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        return None  # links are given when the span starts, and these spans start with none

    def update_name(self, name: str) -> None:
        self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self.status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(self, exception: BaseException, attributes: types.Attributes = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        self._add_event(exception_event(exception, attributes, timestamp))

    def end(self, end_time: int | None = None) -> None:
        return None  # its owner ends it when the call or request is over

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._context!r}, recording={self._recording})"


def exception_event(exception: BaseException, attributes: types.Attributes = None,
                    timestamp: int | None = None) -> Event:
    """The ``exception`` event the SDK's ``record_exception`` makes (without the traceback text:
    the span is built later, off the request path, where the traceback is gone)."""
    attrs: dict[str, Any] = {"exception.type": type(exception).__qualname__, "exception.message": str(exception),
                             "exception.escaped": "False"}
    if attributes:
        attrs.update(attributes)
    return Event("exception", attrs, timestamp)


class RequestSpan(PendingSpan):
    """``llm.request`` while its request runs, where the tracer is the SDK's: what other code does
    to it behaves as on the SDK's live span (a status set OK stays OK, events and links get the
    span limits, ``record_exception`` writes the traceback, a re-set attribute moves last), and
    the finished span is built at the request's end as the live span would have ended
    (lifecycle/phases.py). Its attributes start as a copy of the request's."""

    __slots__ = ("emitter", "links", "parent")

    def __init__(self, context: SpanContext, parent: SpanContext | None, attributes: dict[str, Any],
                 emitter: Any) -> None:
        super().__init__(context, True)
        self.attributes = attributes
        self.parent = parent
        #: The ``SdkFinishedSpans`` it is built with (lifecycle/emit.py).
        self.emitter = emitter
        self.links: list[trace.Link] | None = None

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        if self._recording and self.attributes is not None:
            merge_attributes(self.attributes, attributes)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        self._add_event(self.emitter.event(name, attributes, timestamp))

    def record_exception(self, exception: BaseException, attributes: types.Attributes = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        # The SDK's own method, on this span: the same event (traceback text included) in any SDK version.
        SdkSpan.record_exception(cast(Any, self), exception, attributes, timestamp, escaped)

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        if self._recording and (link := self.emitter.link(context, attributes)) is not None:
            if self.links is None:
                self.links = []
            self.links.append(link)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # The SDK's rules: OK is final, UNSET is ignored.
        if not self._recording or (self.status is not None and self.status.status_code is StatusCode.OK):
            return
        code = status.status_code if isinstance(status, Status) else status
        if code is not StatusCode.UNSET:
            self.status = status if isinstance(status, Status) else Status(status, description)


def merge_attributes(target: dict[str, Any], attributes: Mapping[str, Any]) -> None:
    """*attributes* into *target* as the SDK's attribute map takes them: a key set again moves last."""
    if target.keys().isdisjoint(attributes):
        target.update(attributes)
        return
    for key, value in attributes.items():
        target.pop(key, None)
        target[key] = value
