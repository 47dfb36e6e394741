"""OTLP/JSON decoded straight into typed ``msgspec`` structs: the fast path of :mod:`.otlp`.

The generic reader (:func:`llmtrace.analysis.sources.otlp.spans_from_otlp`) first builds a
dict for every JSON object of the document — about 45 Python objects per span — and then
walks them. Here ``msgspec`` decodes a whole ``ExportTraceServiceRequest`` line into the
structs below in C (untracked by the cyclic GC, unknown fields skipped without building
them, integers parsed in place), and one loop turns them into :class:`Span` objects with no
Python call per span or per attribute. That is most of the analyzer's parse time
(docs/analysis.md, "Performance").

Exactness: this path only accepts what it converts exactly as the generic one would —
lowercase-hex-length ids, known numeric or named span kinds, well-typed fields, ``end >=
start``. Anything else (base64 ids, an unknown kind, a missing field, a malformed line,
metrics or Jaeger documents) makes :func:`spans_from_line` return ``None``, and the caller
reads that line through the generic path, which produces the same spans, warnings and
errors as before. The one difference is a malformed ``AnyValue`` carrying several of its
``oneof`` keys at once: the generic path takes the first in document order, this one the
first of string, int, double, bool, array, kvlist, bytes.

``msgspec`` is optional (the ``analysis`` extra); without it :data:`AVAILABLE` is false and
every line goes through the generic path.
"""

from __future__ import annotations

from typing import Any

from llmtrace.analysis.model import EMPTY_ATTRS, Link, Span, SpanBuilder, StatusCode
from llmtrace.analysis.sources.otlp import _KINDS, _STATUS, Interner, _array, _kvlist

try:
    import msgspec
    from msgspec import UNSET, Struct, UnsetType

    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised by the no-msgspec test in a subprocess
    AVAILABLE = False


class _Fallback(Exception):
    """The line holds something only the generic path converts exactly."""


if AVAILABLE:

    class _Value(Struct, gc=False):
        """OTLP ``AnyValue``: at most one key is set."""

        stringValue: str | UnsetType = UNSET
        intValue: int | str | UnsetType = UNSET
        doubleValue: float | str | UnsetType = UNSET
        boolValue: Any = UNSET
        arrayValue: Any = UNSET
        kvlistValue: Any = UNSET
        bytesValue: Any = UNSET

    class _KeyValue(Struct, gc=False):
        key: str
        value: _Value

    class _Link(Struct, gc=False):
        traceId: str
        spanId: str

    class _Status(Struct, gc=False):
        code: Any = 0

    class _Span(Struct, gc=False):
        traceId: str
        spanId: str
        name: str
        startTimeUnixNano: int | str
        endTimeUnixNano: int | str
        parentSpanId: str | None = None
        kind: int | str = 1
        status: _Status | None = None
        attributes: list[_KeyValue] | None = None
        links: list[_Link] | None = None

    class _ScopeSpans(Struct, gc=False):
        spans: list[_Span] | None = None

    class _Resource(Struct, gc=False):
        attributes: list[_KeyValue] | None = None

    class _ResourceSpans(Struct, gc=False):
        resource: _Resource | None = None
        scopeSpans: list[_ScopeSpans] | None = None
        instrumentationLibrarySpans: list[_ScopeSpans] | None = None

    class _Export(Struct, gc=False):
        """``ExportTraceServiceRequest`` / ``TracesData``; UNSET: not an OTLP traces document."""

        resourceSpans: list[_ResourceSpans] | UnsetType | None = UNSET

    _decode = msgspec.json.Decoder(_Export).decode
    _DECODE_ERRORS: tuple[type[Exception], ...] = (msgspec.DecodeError,)
else:  # pragma: no cover
    _DECODE_ERRORS = ()


def spans_from_line(data: bytes, intern: Interner) -> list[Span] | None:
    """The spans of one OTLP/JSON traces document, or ``None`` when the generic path must
    read it (not OTLP traces, malformed, or holding a value only it converts exactly)."""
    try:
        doc = _decode(data)
    except _DECODE_ERRORS:
        return None
    rss = doc.resourceSpans
    if rss is UNSET:
        return None
    try:
        return _convert(rss or (), intern)
    except (_Fallback, KeyError, ValueError, TypeError, AttributeError, OverflowError):
        return None


def _rare_value(v: Any) -> Any:
    """bool / array / kvlist / bytes values, converted as the generic path does; UNSET when
    the value has no known key (the attribute is then left out, as there)."""
    if v.boolValue is not UNSET:
        return bool(v.boolValue)
    if v.arrayValue is not UNSET:
        return _array(v.arrayValue)
    if v.kvlistValue is not UNSET:
        return _kvlist(v.kvlistValue)
    if v.bytesValue is not UNSET:
        return str(v.bytesValue)
    return UNSET


def _attributes(raw: list[Any], strings: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    sd = strings.setdefault
    for kv in raw:
        v = kv.value
        x = v.stringValue
        if x is not UNSET:
            if len(x) < 64:
                x = sd(x, x)
        else:
            x = v.intValue
            if x is not UNSET:
                x = int(x)
            else:
                x = v.doubleValue
                if x is not UNSET:
                    x = float(x)
                else:
                    x = _rare_value(v)
                    if x is UNSET:
                        continue
        key = kv.key
        out[sd(key, key)] = x
    return out


_new_tuple = tuple.__new__
_UNSET_STATUS = StatusCode.UNSET


def _convert(rss: Any, intern: Interner) -> list[Span]:  # noqa: PLR0912, PLR0915 - one loop on purpose
    # One loop, no call per span or attribute: this is the hot path. Every check mirrors
    # otlp._span; where that function would normalise (base64 ids) or record something
    # (unknown kinds), _Fallback hands the whole line to it instead.
    strings = intern.strings
    sd = strings.setdefault
    twin = SpanBuilder
    out: list[Span] = []
    append = out.append
    for rs in rss:
        res = rs.resource
        rattrs = _attributes(res.attributes, strings) if res is not None and res.attributes else {}
        svc = rattrs.get("service.name")
        service = sd(str(svc), str(svc)) if svc is not None else ""
        resource = rattrs or EMPTY_ATTRS
        for ss in rs.scopeSpans or rs.instrumentationLibrarySpans or ():
            for sp in ss.spans or ():
                tid = sp.traceId
                sid = sp.spanId
                parent = sp.parentSpanId
                if len(tid) != 32 or len(sid) != 16 or (parent and len(parent) != 16):
                    raise _Fallback
                kind = _KINDS.get(sp.kind)
                if kind is None:
                    raise _Fallback
                st = sp.status
                code = _STATUS.get(st.code, _UNSET_STATUS) if st is not None else _UNSET_STATUS
                start = int(sp.startTimeUnixNano)
                end = int(sp.endTimeUnixNano)
                if end < start:
                    raise _Fallback
                raw = sp.attributes
                if raw:
                    attrs: dict[str, Any] = {}
                    for kv in raw:
                        v = kv.value
                        x = v.stringValue
                        if x is not UNSET:
                            if len(x) < 64:
                                x = sd(x, x)
                        else:
                            x = v.intValue
                            if x is not UNSET:
                                x = int(x)
                            else:
                                x = v.doubleValue
                                if x is not UNSET:
                                    x = float(x)
                                else:
                                    x = _rare_value(v)
                                    if x is UNSET:
                                        continue
                        key = kv.key
                        attrs[sd(key, key)] = x
                else:
                    attrs = {}
                lks = sp.links
                if lks:
                    links = []
                    for ln in lks:
                        lt = ln.traceId
                        ls = ln.spanId
                        if len(lt) != 32 or len(ls) != 16:
                            raise _Fallback
                        links.append(_new_tuple(Link, (sd(lt, lt), ls)))
                    span_links: tuple[Link, ...] = tuple(links)
                else:
                    span_links = ()
                name = sp.name
                span = twin(
                    sd(tid, tid),
                    sid,
                    parent or None,
                    sd(name, name),
                    start,
                    end,
                    kind,
                    code,
                    attrs,
                    span_links,
                    service,
                    resource,
                )
                span.__class__ = Span  # model.builder_class: now an ordinary frozen Span
                append(span)
    return out
