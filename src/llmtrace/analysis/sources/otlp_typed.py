"""OTLP/JSON decoded straight into typed ``msgspec`` structs: the fast path of :mod:`.otlp`.

The generic reader (:func:`llmtrace.analysis.sources.otlp.spans_from_otlp`) first builds a
dict for every JSON object of the document — about 45 Python objects per span — and then
walks them. Here ``msgspec`` decodes a whole ``ExportTraceServiceRequest`` line into the
structs below in C (untracked by the cyclic GC, unknown fields skipped without building
them, integers parsed in place, id lengths checked), and each scope's spans become
:class:`Span` tuples column by column: ``map`` over the decoded structs, interning through
``dict.setdefault`` and ``tuple.__new__`` over the zipped columns all run in C, so the only
bytecode per span is for its attributes and links (docs/analysis.md, "Performance").

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

from collections.abc import Iterator
from itertools import repeat
from operator import attrgetter, gt
from typing import Annotated, Any

from llmtrace.analysis.model import EMPTY_ATTRS, Attributes, Link, Span, StatusCode
from llmtrace.analysis.sources.otlp import _KINDS, _STATUS, TIME_LIMIT_NS, Interner, _array, _kvlist

try:
    import msgspec
    from msgspec import UNSET, Meta, Struct, UnsetType

    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised by the no-msgspec test in a subprocess
    AVAILABLE = False


class _Fallback(Exception):
    """The line holds something only the generic path converts exactly."""


if AVAILABLE:
    # Hex ids have exactly these lengths; anything else (base64) is the generic path's to
    # normalise, and msgspec rejects it here without a Python-level check.
    _TraceId = Annotated[str, Meta(min_length=32, max_length=32)]
    _SpanId = Annotated[str, Meta(min_length=16, max_length=16)]

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
        traceId: _TraceId
        spanId: _SpanId

    class _Status(Struct, gc=False):
        code: Any = 0

    class _Span(Struct, gc=False):
        traceId: _TraceId
        spanId: _SpanId
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
    _DECODE_ERRORS: tuple[type[Exception], ...] = (msgspec.DecodeError, RecursionError)
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
        return _convert(rss or (), intern.strings)
    except (_Fallback, KeyError, ValueError, TypeError, AttributeError, OverflowError):
        return None


def _convert(rss: Any, strings: dict[str, str]) -> list[Span]:
    out: list[Span] = []
    sd = strings.setdefault
    for rs in rss:
        res = rs.resource
        rattrs = _attributes(res.attributes, sd) if res is not None and res.attributes else {}
        svc = rattrs.get("service.name")
        service = sd(str(svc), str(svc)) if svc is not None else ""
        resource = rattrs or EMPTY_ATTRS
        for ss in rs.scopeSpans or rs.instrumentationLibrarySpans or ():
            if ss.spans:
                out += _scope_spans(ss.spans, service, resource, sd)
    return out


_TRACE_ID = attrgetter("traceId")
_SPAN_ID = attrgetter("spanId")
_PARENT_ID = attrgetter("parentSpanId")
_NAME = attrgetter("name")
_START = attrgetter("startTimeUnixNano")
_END = attrgetter("endTimeUnixNano")
_KIND = attrgetter("kind")
_STATUS_OF = attrgetter("status")
_ATTRIBUTES = attrgetter("attributes")
_LINKS = attrgetter("links")
_new_tuple = tuple.__new__
_UNSET_STATUS = StatusCode.UNSET


def _scope_spans(spans: list[Any], service: str, resource: Attributes, sd: Any) -> Iterator[Span]:
    """The spans of one scope, built column by column (every check mirrors ``otlp._span``;
    where that function would normalise or record something, the line falls back to it)."""
    tids = list(map(_TRACE_ID, spans))
    parents = list(map(_PARENT_ID, spans))
    if "" in parents:
        parents = [p or None for p in parents]
    if not {16}.issuperset(map(len, filter(None, parents))):
        raise _Fallback
    names = list(map(_NAME, spans))
    starts = list(map(int, map(_START, spans)))
    ends = list(map(int, map(_END, spans)))
    if any(map(gt, starts, ends)) or min(starts) <= -TIME_LIMIT_NS or max(ends) >= TIME_LIMIT_NS:
        raise _Fallback
    kinds = list(map(_KINDS.__getitem__, map(_KIND, spans)))  # KeyError (unknown kind): fallback
    statuses = list(map(_STATUS_OF, spans))
    codes = (
        repeat(_UNSET_STATUS)
        if statuses.count(None) == len(statuses)
        else [_STATUS.get(st.code, _UNSET_STATUS) if st is not None else _UNSET_STATUS for st in statuses]
    )
    attrs = [_attributes(raw, sd) or EMPTY_ATTRS if raw else EMPTY_ATTRS for raw in map(_ATTRIBUTES, spans)]
    links = [_links(raw, sd) if raw else () for raw in map(_LINKS, spans)]
    columns = zip(
        map(sd, tids, tids),
        map(_SPAN_ID, spans),
        parents,
        map(sd, names, names),
        starts,
        ends,
        kinds,
        codes,
        attrs,
        links,
        repeat(service),
        repeat(resource),
    )
    return map(_new_tuple, repeat(Span), columns)


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


def _attributes(raw: list[Any], sd: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
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


def _links(raw: list[Any], sd: Any) -> tuple[Link, ...]:
    return tuple([_new_tuple(Link, (sd(ln.traceId, ln.traceId), ln.spanId)) for ln in raw])
