"""OTLP/JSON lines back into SDK spans: how the spill is re-sent through any OTLP exporter.

The inverse of :func:`llmtrace._otel.otlp_json.encode_spans` for what it writes (ids in hex,
64-bit integers as strings, enums as numbers); each decoded span is a plain
:class:`~opentelemetry.sdk.trace.ReadableSpan`, so the gRPC, HTTP/protobuf and HTTP/JSON
exporters all take it unchanged.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

#: What :func:`decode_spans` raises on a line that is not a well-formed ``ExportTraceServiceRequest``.
MALFORMED = (ValueError, KeyError, TypeError, AttributeError)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SPECIAL_DOUBLES = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}

_VALUE_READERS: dict[str, Callable[[Any], Any]] = {
    "stringValue": str,
    "intValue": int,
    "doubleValue": lambda v: _SPECIAL_DOUBLES[v] if isinstance(v, str) else float(v),
    "boolValue": bool,
    "bytesValue": base64.b64decode,
    "arrayValue": lambda v: tuple(any_value(item) for item in v.get("values", [])),
    "kvlistValue": lambda v: attributes(v.get("values")),
}


def any_value(value: Mapping[str, Any]) -> Any:
    for key, read in _VALUE_READERS.items():
        if key in value:
            return read(value[key])
    return None


def attributes(items: list[Mapping[str, Any]] | None) -> dict[str, Any]:
    return {item["key"]: any_value(item.get("value") or {}) for item in items or []}


def _context(trace_id: str, span_id: str) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=_SAMPLED)


def _span(raw: Mapping[str, Any], resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    trace_id = raw["traceId"]
    parent_id = raw.get("parentSpanId")
    status = raw.get("status") or {}
    return ReadableSpan(
        name=raw["name"],
        context=_context(trace_id, raw["spanId"]),
        parent=_context(trace_id, parent_id) if parent_id else None,
        resource=resource,
        attributes=attributes(raw.get("attributes")),
        events=[Event(e["name"], attributes(e.get("attributes")), int(e["timeUnixNano"]))
                for e in raw.get("events", [])],
        links=[Link(_context(link["traceId"], link["spanId"]), attributes(link.get("attributes")))
               for link in raw.get("links", [])],
        kind=SpanKind(max(0, int(raw.get("kind", 1)) - 1)),  # OTLP's enum starts at UNSPECIFIED = 0
        instrumentation_scope=scope,
        status=Status(StatusCode(int(status.get("code", 0))), status.get("message")),
        start_time=int(raw["startTimeUnixNano"]),
        end_time=int(raw["endTimeUnixNano"]),
    )


def decode_spans(line: str, pause: Callable[[], None] | None = None) -> list[ReadableSpan]:
    """The spans of one ``ExportTraceServiceRequest`` line; a line of another signal gives none.

    *pause*, when given, is called between spans (the spill thread passes
    :meth:`llmtrace._gil.GilYield.maybe`, as the encoder's callers do). Raises one of
    :data:`MALFORMED` on a malformed line.
    """
    document = json.loads(line)
    spans: list[ReadableSpan] = []
    for resource_spans in document.get("resourceSpans", []):
        resource = Resource(attributes(resource_spans.get("resource", {}).get("attributes")))
        for scope_spans in resource_spans.get("scopeSpans", []):
            raw_scope = scope_spans.get("scope") or {}
            scope = InstrumentationScope(raw_scope.get("name", ""), raw_scope.get("version"))
            for raw in scope_spans.get("spans", []):
                if pause is not None:
                    pause()
                spans.append(_span(raw, resource, scope))
    return spans
