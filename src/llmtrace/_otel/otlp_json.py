"""OTLP/JSON text for a batch of spans, written directly.

The embedded default exporter runs inside the serving process, on a thread that
shares the GIL with the server. Building the OTLP/JSON mapping as dicts and then
``json.dumps`` costs ~55 µs a span on a 2-core VM (the protobuf route, encode then
``MessageToDict``, ~270 µs); writing the text straight from the spans, with each
attribute key's JSON prefix made once, costs a fraction of that.

The output is an ``ExportTraceServiceRequest`` in the protobuf JSON mapping as the
collector's file exporter writes it: ids in hex, 64-bit integers as strings, enums as
numbers, non-finite doubles as ``"NaN"``/``"Infinity"``/``"-Infinity"``.
``tests/core/test_otlp_json.py`` checks it against the SDK's own protobuf encoding.

Where llmtrace's compiled core is built (``native/src/otlp_json.rs``), it writes the same
text, byte for byte, several times faster (it reads an SDK span's fields in place and makes
no Python object per field); what it does not write itself it hands to the functions here.
``LLMTRACE_OTLP_ENCODER=python`` keeps it out (``tests/core/test_otlp_json_native.py``
compares both; ``benchmarks/bench_otlp_encoding.py`` times both).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring_ascii as _quote  # the C string encoder json.dumps uses
from math import isfinite as _isfinite
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from llmtrace import _native
from llmtrace._safety import record_error

if TYPE_CHECKING:
    import llmtrace_native  # the stub, native/llmtrace_native.pyi

#: Attribute keys come from a small fixed vocabulary; a host that invents keys per
#: request must not grow this without bound.
_MAX_CACHED_KEYS = 4096
_key_prefix: dict[str, str] = {}


def _key(key: str) -> str:
    prefix = _key_prefix.get(key)
    if prefix is None:
        prefix = '{"key":' + _quote(key) + ',"value":'
        if len(_key_prefix) < _MAX_CACHED_KEYS:
            _key_prefix[key] = prefix
    return prefix


def _double(value: float) -> str:
    if math.isfinite(value):
        return '{"doubleValue":' + repr(value) + "}"
    return '{"doubleValue":"' + ("NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity") + '"}'


def any_value(value: Any) -> str:
    """One ``AnyValue``."""
    kind = type(value)
    if kind is str:
        return '{"stringValue":' + _quote(value) + "}"
    if kind is int:
        return '{"intValue":"' + str(value) + '"}'
    if kind is float:
        return _double(value)
    if kind is bool:
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if kind is list or kind is tuple:  # before _other_value's ABC checks: a step's request ids, finish reasons
        return _array(value)
    return _other_value(value)


def _array(values: list[Any] | tuple[Any, ...]) -> str:
    if values:
        try:  # all strings (a step's request ids): one join, no call per item; the quoting refuses anything else
            return '{"arrayValue":{"values":[{"stringValue":' + '},{"stringValue":'.join(map(_quote, values)) + "}]}}"
        except TypeError:
            pass
    return '{"arrayValue":{"values":[' + ",".join(map(any_value, values)) + "]}}"


def _other_value(value: Any) -> str:
    """Subclasses of the four scalar types (an IntEnum, a str subclass), bytes, maps, sequences."""
    if value is None:
        return "{}"
    for scalar in (bool, int, float, str):  # bool first: it is an int
        if isinstance(value, scalar):
            return any_value(scalar(value))
    if isinstance(value, (bytes, bytearray)):
        return '{"bytesValue":"' + base64.b64encode(value).decode() + '"}'
    if isinstance(value, Mapping):
        return '{"kvlistValue":{"values":' + attributes(value) + "}}"
    if isinstance(value, Sequence):
        return '{"arrayValue":{"values":[' + ",".join(map(any_value, value)) + "]}}"
    return any_value(str(value))


def attributes(attrs: Mapping[str, Any] | None) -> str:
    """A ``KeyValue`` list."""
    if not attrs:
        return "[]"
    parts = []
    for key, value in attrs.items():  # strings, ints and doubles inline: most attributes, per span, per batch
        prefix = _key_prefix.get(key) or _key(key)
        kind = type(value)
        if kind is str:
            parts.append(prefix + '{"stringValue":' + _quote(value) + "}}")
        elif kind is int:
            parts.append(prefix + '{"intValue":"' + str(value) + '"}}')
        elif kind is float and _isfinite(value):
            parts.append(prefix + '{"doubleValue":' + repr(value) + "}}")
        else:
            parts.append(prefix + any_value(value) + "}")
    return "[" + ",".join(parts) + "]"


#: OTLP's span kind (its enum starts at UNSPECIFIED = 0) and status code, by the API's enums:
#: a dict lookup instead of two enum ``.value`` descriptors per span.
_KIND = {kind: kind.value + 1 for kind in SpanKind}
_STATUS = {code: str(code.value) for code in StatusCode}
#: Span names as JSON strings: a handful of names, quoted once each (bounded like the keys).
_MAX_CACHED_NAMES = 1024
_names: dict[str, str] = {}


def _name(name: str) -> str:
    quoted = _names.get(name)
    if quoted is None:
        quoted = _quote(name)
        if len(_names) < _MAX_CACHED_NAMES:
            _names[name] = quoted
    return quoted


class _TraceIds:
    """The hex of the last trace id seen: a batch holds a request's spans (or a window's) one after
    the other, all in one trace."""

    __slots__ = ("hex", "trace_id")

    def __init__(self) -> None:
        self.trace_id = -1
        self.hex = ""

    def __call__(self, trace_id: int) -> str:
        if trace_id != self.trace_id:
            self.trace_id, self.hex = trace_id, f"{trace_id:032x}"
        return self.hex


def _span(span: ReadableSpan, trace_hex: Callable[[int], str]) -> str:
    ctx = span.context
    trace_id, span_id = (ctx.trace_id, ctx.span_id) if ctx is not None else (0, 0)
    parent = span.parent
    status = span.status
    text = (
        '{"traceId":"' + trace_hex(trace_id) + f'","spanId":"{span_id:016x}",'
        + (f'"parentSpanId":"{parent.span_id:016x}",' if parent is not None else "")
        + f'"name":{_names.get(span.name) or _name(span.name)},"kind":{_KIND[span.kind]},'
        f'"startTimeUnixNano":"{span.start_time or 0}","endTimeUnixNano":"{span.end_time or 0}",'
        f'"attributes":{attributes(span.attributes)},"status":{{"code":{_STATUS[status.status_code]}'
        + (f',"message":{_quote(status.description)}}}' if status.description else "}")
    )
    events = span.events  # each read copies the span's list
    if events:
        text += ',"events":[' + ",".join(
            f'{{"timeUnixNano":"{e.timestamp}","name":{_quote(e.name)},"attributes":{attributes(e.attributes)}}}'
            for e in events) + "]"
    links = span.links
    if links:
        text += ',"links":[' + ",".join(map(_link, links)) + "]"
    return text + "}"


#: Encoded links: a request is linked from every step it is in (hundreds of times), each time by the
#: same link object (lifecycle/engine.py), so its text is kept by the object's id together with the
#: object, which keeps it alive (and its id unique) while cached.
_MAX_CACHED_LINKS = 8192
_link_text: dict[int, tuple[Any, str]] = {}


def _link(link: Any) -> str:
    cached = _link_text.get(id(link))
    if cached is not None and cached[0] is link:
        return cached[1]
    ctx = link.context
    text = (f'{{"traceId":"{ctx.trace_id:032x}","spanId":"{ctx.span_id:016x}","attributes":'
            + attributes(link.attributes) + "}")
    if len(_link_text) >= _MAX_CACHED_LINKS:
        _link_text.clear()  # old requests' links; the live ones come back on their next step
    _link_text[id(link)] = (link, text)
    return text


def encode_spans(spans: Sequence[ReadableSpan], pause: Callable[[], None] | None = None) -> str:
    """An ``ExportTraceServiceRequest`` for *spans*, grouped by resource and scope, as one JSON line.

    *pause*, when given, is called between spans (an export thread passes
    :meth:`llmtrace._otel.gil.GilYield.maybe`, so that a batch of hundreds of spans does not hold
    the GIL for tens of milliseconds). The compiled encoder writes it where it is in use."""
    if COMPILED is not None:
        try:
            return COMPILED.encode(spans, pause)
        except BaseException as exc:
            # A bug in the compiled code surfaces as pyo3's PanicException, a BaseException the
            # export thread would not survive: counted, and this batch written in Python.
            if type(exc).__name__ != "PanicException":
                raise
            record_error("otlp_json.compiled", exc)
    return encode_spans_python(spans, pause)


def encode_spans_python(spans: Sequence[ReadableSpan], pause: Callable[[], None] | None = None) -> str:
    """:func:`encode_spans` in Python (where the compiled encoder is not in use; the reference
    the compiled one is tested against)."""
    resources: dict[int, tuple[Any, dict[tuple[str, str | None], list[str]]]] = {}
    trace_hex = _TraceIds()
    for span in spans:
        if pause is not None:
            pause()
        resource_entry = resources.setdefault(id(span.resource), (span.resource, {}))
        scope = span.instrumentation_scope
        key = (scope.name, scope.version) if scope is not None else ("", None)
        resource_entry[1].setdefault(key, []).append(_span(span, trace_hex))
    parts = []
    for resource, scopes in resources.values():
        scope_parts = [
            '{"scope":{"name":' + _quote(name) + (',"version":' + _quote(version) if version else "") + "},"
            '"spans":[' + ",".join(items) + "]}"
            for (name, version), items in scopes.items()]
        parts.append('{"resource":{"attributes":' + attributes(resource.attributes if resource else None) + "},"
                     '"scopeSpans":[' + ",".join(scope_parts) + "]}")
    return '{"resourceSpans":[' + ",".join(parts) + "]}"


# --------------------------------------------------------------------------- the compiled encoder
def _span_alone(span: ReadableSpan) -> str:
    return _span(span, _TraceIds())


def _resource_attributes(resource: Any) -> str:
    return attributes(resource.attributes if resource else None)


def _compiled_encoder() -> llmtrace_native.OtlpJsonEncoder | None:
    """The compiled encoder, given the pieces of this one it hands work back to; ``None`` where
    it is not built or ``LLMTRACE_OTLP_ENCODER=python`` asks for this one."""
    module = _native.chosen_by("LLMTRACE_OTLP_ENCODER")
    if module is None:
        return None
    encoder: llmtrace_native.OtlpJsonEncoder = module.OtlpJsonEncoder(
        ReadableSpan, SpanContext, Status, list(_KIND.items()), [(code, int(text)) for code, text in _STATUS.items()],
        _span_alone, any_value, attributes, _resource_attributes, _quote, _link_text, _MAX_CACHED_LINKS)
    return encoder


#: The compiled encoder (``llmtrace_native.OtlpJsonEncoder``), or ``None``: this module's Python.
COMPILED: llmtrace_native.OtlpJsonEncoder | None = _compiled_encoder()
