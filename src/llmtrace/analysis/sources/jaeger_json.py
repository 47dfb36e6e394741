"""Jaeger's legacy JSON model (``/api/traces`` responses) -> :class:`Span`.

Shape: ``{"data": [{"traceID", "spans": [{"traceID", "spanID", "operationName",
"references": [{"refType", "traceID", "spanID"}], "startTime" (µs), "duration" (µs),
"tags": [{"key", "type", "value"}], "processID"}], "processes": {"p1": {"serviceName",
"tags"}}}]}``. ``CHILD_OF`` becomes the parent, ``FOLLOWS_FROM`` becomes a link (that is how
Jaeger translates OTLP links). Span kind and status come from the ``span.kind`` and
``otel.status_code``/``error`` tags, which Jaeger derives from OTLP; those tags are removed
from the attributes so both sources produce the same spans.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmtrace.analysis.errors import SourceError
from llmtrace.analysis.model import EMPTY_ATTRS, Link, Span, SpanKind, StatusCode
from llmtrace.analysis.sources.otlp import TIME_LIMIT_NS, Interner

_KIND_TAG = {
    "server": SpanKind.SERVER,
    "client": SpanKind.CLIENT,
    "producer": SpanKind.PRODUCER,
    "consumer": SpanKind.CONSUMER,
    "internal": SpanKind.INTERNAL,
}
_SPECIAL_TAGS = ("span.kind", "otel.status_code", "otel.status_description", "error")
_US = 1000


def _tags(raw: Any, intern: Interner) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in raw or ():
        value = t.get("value")
        if t.get("type") == "int64" and isinstance(value, str):
            value = int(value)
        key = t["key"]
        if key.__class__ is not str:
            raise ValueError(f"tag key {key!r} is not a string")
        out[intern(key)] = value
    return out


def spans_from_jaeger_legacy(doc: Mapping[str, Any], *, source: str, position: str, intern: Interner) -> list[Span]:
    """The spans of every trace in a ``{"data": [...]}`` response."""
    out: list[Span] = []
    ti = 0
    si: int | None = None  # the failing span's index; None while reading the processes
    try:
        for ti, trace in enumerate(doc.get("data") or ()):  # noqa: B007 - ti names the failing trace
            si = None
            processes: dict[str, tuple[str, Mapping[str, Any]]] = {}
            for pid, proc in (trace.get("processes") or {}).items():
                attrs = _tags(proc.get("tags"), intern)
                service = intern(str(proc.get("serviceName", "")))
                attrs.setdefault("service.name", service)
                processes[pid] = (service, attrs or EMPTY_ATTRS)
            for si, sp in enumerate(trace.get("spans") or ()):  # noqa: B007 - si names the failing span
                out.append(_span(sp, processes, intern))
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        what = "span" if si is not None else "process"
        msg = f"missing field {exc.args[0]!r}" if isinstance(exc, KeyError) else f"bad {what}: {exc}"
        where = f"{position}: data[{ti}]" + (f".spans[{si}]" if si is not None else ".processes")
        raise SourceError(source, msg, where) from None
    return out


def _span(sp: Mapping[str, Any], processes: Mapping[str, tuple[str, Mapping[str, Any]]], intern: Interner) -> Span:
    parent: str | None = None
    links: list[Link] = []
    for ref in sp.get("references") or ():
        if ref.get("refType") == "CHILD_OF" and parent is None:
            parent = ref["spanID"].lower()
        else:
            links.append(Link(intern(ref["traceID"].lower()), ref["spanID"].lower()))
    if parent is None and sp.get("parentSpanID"):
        parent = str(sp["parentSpanID"]).lower()
    attrs = _tags(sp.get("tags"), intern)
    kind = _KIND_TAG.get(str(attrs.get("span.kind", "internal")).lower(), SpanKind.UNSPECIFIED)
    status_tag = str(attrs.get("otel.status_code", "")).upper()
    if status_tag == "ERROR" or attrs.get("error") in (True, "true"):
        status = StatusCode.ERROR
    elif status_tag == "OK":
        status = StatusCode.OK
    else:
        status = StatusCode.UNSET
    for k in _SPECIAL_TAGS:
        attrs.pop(k, None)
    service, resource = processes.get(sp.get("processID", ""), ("", EMPTY_ATTRS))
    start = int(sp["startTime"]) * _US
    duration = int(sp["duration"]) * _US
    if duration < 0:
        raise ValueError("negative duration")
    if start <= -TIME_LIMIT_NS or start + duration >= TIME_LIMIT_NS:
        raise ValueError(f"time {start + duration} ns is beyond the 64-bit range of span times")
    trace_id = str(sp["traceID"]).lower().rjust(32, "0")
    name = sp["operationName"]
    if name.__class__ is not str:
        raise ValueError(f"operationName {name!r} is not a string")
    return Span(
        intern(trace_id),
        str(sp["spanID"]).lower().rjust(16, "0"),
        parent.rjust(16, "0") if parent else None,
        intern(name),
        start,
        start + duration,
        kind,
        status,
        attrs or EMPTY_ATTRS,
        tuple(links),
        service,
        resource,
    )
