"""OTLP/JSON ``ExportTraceServiceRequest`` documents -> :class:`~llmtrace.analysis.model.Span`.

This one decoder serves the embedded file exporter, the collector's ``file`` exporter
(one request per line), a whole-file OTLP document and Jaeger's ``/api/v3/traces``
(``{"result": {...}}``). The OTLP/JSON mapping: ids are hex (some older exporters wrote
base64 — detected by length and decoded), times are decimal strings of Unix nanoseconds,
enums are integers or their proto names (``SPAN_KIND_SERVER``).

The loop is the analyzer's hot path (docs/analysis.md, "Performance"): attribute values are
converted with a dict dispatch, and strings that repeat across spans (ids of the same
trace, span names, attribute keys, service names) are interned through one cache so that a
million spans share them.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import Any

from llmtrace import semconv as sc
from llmtrace.analysis.errors import SourceError
from llmtrace.analysis.model import EMPTY_ATTRS, Link, Span, SpanKind, StatusCode
from llmtrace.analysis.sources._json import TOO_DEEP

#: OTLP times are 64-bit nanoseconds; a value beyond is corrupt (every source checks it, so
#: no analyzer has to guard its arithmetic against astronomically large times).
TIME_LIMIT_NS = 2**64

_KIND_NAMES = {
    "SPAN_KIND_UNSPECIFIED": SpanKind.UNSPECIFIED,
    "SPAN_KIND_INTERNAL": SpanKind.INTERNAL,
    "SPAN_KIND_SERVER": SpanKind.SERVER,
    "SPAN_KIND_CLIENT": SpanKind.CLIENT,
    "SPAN_KIND_PRODUCER": SpanKind.PRODUCER,
    "SPAN_KIND_CONSUMER": SpanKind.CONSUMER,
}
_KINDS: dict[Any, SpanKind] = {**_KIND_NAMES, **{int(k): k for k in SpanKind}}
_STATUS: dict[Any, StatusCode] = {
    "STATUS_CODE_UNSET": StatusCode.UNSET,
    "STATUS_CODE_OK": StatusCode.OK,
    "STATUS_CODE_ERROR": StatusCode.ERROR,
    **{int(c): c for c in StatusCode},
}


def _array(x: Any) -> Any:
    return tuple(any_value(v) for v in (x or {}).get("values", ()))


def _kvlist(x: Any) -> Any:
    return {kv["key"]: any_value(kv.get("value") or {}) for kv in (x or {}).get("values", ())}


def _double(x: Any) -> float:
    return float(x)  # "NaN" / "Infinity" arrive as strings and float() takes them


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "stringValue": str,
    "intValue": int,
    "doubleValue": _double,
    "boolValue": bool,
    "arrayValue": _array,
    "kvlistValue": _kvlist,
    "bytesValue": str,
}


def any_value(v: Mapping[str, Any]) -> Any:
    """Convert one OTLP ``AnyValue`` object to a Python value (``None`` when empty)."""
    for k, x in v.items():
        conv = _CONVERT.get(k)
        if conv is not None:
            return conv(x)
    return None


def _hex_id(raw: Any, nbytes: int) -> str:
    """Normalise a trace/span id to lowercase hex; accepts hex or (legacy) base64."""
    if not isinstance(raw, str) or not raw:
        raise ValueError("empty id")
    if len(raw) == 2 * nbytes:
        return raw.lower()
    try:
        decoded = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        decoded = b""
    if len(decoded) == nbytes:
        return decoded.hex()
    raise ValueError(f"id {raw!r} is neither {2 * nbytes}-digit hex nor base64")


class Interner:
    """One cache for strings repeated across spans (cheaper than ``sys.intern`` per call)."""

    __slots__ = ("strings", "unknown_kinds")

    def __init__(self) -> None:
        self.strings: dict[str, str] = {}
        self.unknown_kinds: set[Any] = set()

    def __call__(self, s: str) -> str:
        return self.strings.setdefault(s, s)


def _attributes(raw: Any, intern: Interner) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not raw:
        return out
    strings = intern.strings
    for kv in raw:
        key = kv["key"]
        if key.__class__ is not str:
            raise ValueError(f"attribute key {key!r} is not a string")
        for k, x in kv["value"].items():
            if k == "stringValue":
                out[strings.setdefault(key, key)] = strings.setdefault(x, x) if len(x) < 64 else x
            elif k == "intValue":
                out[strings.setdefault(key, key)] = int(x)
            elif k == "doubleValue":
                out[strings.setdefault(key, key)] = float(x)
            else:
                conv = _CONVERT.get(k)
                if conv is None:
                    continue
                out[strings.setdefault(key, key)] = conv(x)
            break
    return out


def _resource(raw: Any, intern: Interner) -> tuple[str, Mapping[str, Any]]:
    attrs = _attributes((raw or {}).get("attributes"), intern)
    service = attrs.get(sc.SERVICE_NAME)
    return intern(str(service)) if service is not None else "", attrs or EMPTY_ATTRS


def spans_from_otlp(doc: Mapping[str, Any], *, source: str, position: str, intern: Interner) -> list[Span]:
    """The spans of one ``ExportTraceServiceRequest`` (or ``TracesData``) object.

    A span missing a required field raises :class:`SourceError` naming ``position`` and the
    JSON path of the span, e.g. ``line 12: resourceSpans[0].scopeSpans[1].spans[4]``.
    """
    out: list[Span] = []
    append = out.append
    # Where a failure is: how deep the loops are (0 resource, 1 scope, 2 span) and their
    # indexes; the path text is only built for the error.
    depth = ri = si = pi = 0
    try:
        for ri, rs in enumerate(doc.get("resourceSpans") or ()):  # noqa: B007 - ri names the failing part
            depth = 0
            service, resource = _resource(rs.get("resource"), intern)
            scopes = rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ()
            for si, ss in enumerate(scopes):  # noqa: B007 - si names the failing part
                depth = 1
                spans = ss.get("spans") or ()
                depth, pi = 2, 0
                for pi, sp in enumerate(spans):  # noqa: B007 - pi names the failing span
                    append(_span(sp, service, resource, intern))
    except (KeyError, ValueError, TypeError, AttributeError, RecursionError) as exc:
        where = f"{position}: resourceSpans[{ri}]"
        if depth >= 1:
            where += f".scopeSpans[{si}]"
        if depth == 2:
            where += f".spans[{pi}]"
        raise SourceError(source, _describe(exc, "span" if depth == 2 else "resourceSpans entry"), where) from None
    return out


def _describe(exc: Exception, what: str = "span") -> str:
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    if isinstance(exc, RecursionError):  # an attribute value nested deeper than Python's stack
        return f"bad {what}: an attribute value is {TOO_DEEP}"
    return f"bad {what}: {exc}"


def _span(sp: Mapping[str, Any], service: str, resource: Mapping[str, Any], intern: Interner) -> Span:
    # Hot path: ids are taken as-is when they have the hex length (the OTLP/JSON spec says
    # lowercase hex), anything else goes through the slow normalisation.
    strings = intern.strings
    tid = sp["traceId"]
    if len(tid) != 32:
        tid = _hex_id(tid, 16)
    tid = strings.setdefault(tid, tid)
    sid = sp["spanId"]
    if len(sid) != 16:
        sid = _hex_id(sid, 8)
    parent = sp.get("parentSpanId")
    if parent and len(parent) != 16:
        parent = _hex_id(parent, 8)
    raw_kind = sp.get("kind", 1)
    kind = _KINDS.get(raw_kind)
    if kind is None:
        intern.unknown_kinds.add(raw_kind)
        kind = SpanKind.UNSPECIFIED
    status = sp.get("status")
    code = _STATUS.get(status.get("code", 0), StatusCode.UNSET) if status else StatusCode.UNSET
    start, end = int(sp["startTimeUnixNano"]), int(sp["endTimeUnixNano"])
    if end < start:
        raise ValueError(f"ends {start - end} ns before it starts")
    if start <= -TIME_LIMIT_NS or end >= TIME_LIMIT_NS:
        raise ValueError(f"time {max(abs(start), end)} ns is beyond the 64-bit range of OTLP times")
    links = sp.get("links")
    name = sp["name"]
    if name.__class__ is not str:
        raise ValueError(f"name {name!r} is not a string")
    fields = (
        tid,
        sid,
        parent or None,
        strings.setdefault(name, name),
        start,
        end,
        kind,
        code,
        _attributes(sp.get("attributes"), intern) or EMPTY_ATTRS,
        _links(links, strings) if links else (),
        service,
        resource,
    )
    return _new_tuple(Span, fields)


_new_tuple = tuple.__new__


def _links(links: list[Mapping[str, Any]], strings: dict[str, str]) -> tuple[Link, ...]:
    # A vLLM step links every request in its batch (up to 128): this loop is hot for engine
    # traces, so the common all-hex case is one comprehension without a call per link.
    sd = strings.setdefault
    try:
        if all(len(ln["traceId"]) == 32 and len(ln["spanId"]) == 16 for ln in links):
            return tuple([_new_tuple(Link, (sd(ln["traceId"], ln["traceId"]), ln["spanId"])) for ln in links])
    except TypeError:
        pass
    return tuple(_link(ln, strings) for ln in links)


def _link(ln: Mapping[str, Any], strings: dict[str, str]) -> Link:
    tid, sid = ln["traceId"], ln["spanId"]
    if len(tid) != 32:
        tid = _hex_id(tid, 16)
    if len(sid) != 16:
        sid = _hex_id(sid, 8)
    return _new_tuple(Link, (strings.setdefault(tid, tid), sid))


def document_kind(doc: Any) -> str:
    """Classify a decoded JSON object: ``otlp``, ``jaeger_v3``, ``jaeger_legacy``, ``metrics``,
    ``logs``, ``jaeger_error`` or ``unknown``."""
    if not isinstance(doc, dict):
        return "unknown"
    for key, kind in _TOP_LEVEL_KEYS:
        if key in doc:
            return kind
    if isinstance(doc.get("result"), dict):
        return "jaeger_v3"
    if isinstance(doc.get("data"), list):
        return "jaeger_legacy"
    return "jaeger_error" if "error" in doc else "unknown"


_TOP_LEVEL_KEYS = (("resourceSpans", "otlp"), ("resourceMetrics", "metrics"), ("resourceLogs", "logs"))
