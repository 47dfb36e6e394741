"""The file exporter's OTLP/JSON text is the protobuf JSON mapping of what the SDK's OTLP exporter sends."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from llmtrace._otel.otlp_json import encode_spans

_ID_KEYS = {"traceId", "spanId", "parentSpanId"}


def _spans() -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    for service in ("api", "engine"):  # two resources, two scopes in one batch
        provider = TracerProvider(resource=Resource.create({"service.name": service, "n": 3}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        for scope, version in (("llmtrace", "1.2.3"), ("other", None)):
            tracer = provider.get_tracer(scope, version)
            linked = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1))
            with tracer.start_as_current_span("llm.request", kind=SpanKind.SERVER, attributes={
                "s": 'quote " backslash \\ newline \n unicode é 日本', "i": -(2**62), "f": 0.1, "tiny": 1e-300,
                "b": True, "strs": ["a", "b"], "ints": [1, 2], "floats": [1.5, -0.0], "bools": [False],
                "nan": math.nan, "inf": math.inf, "-inf": -math.inf,
            }, links=[Link(linked, {"llm.step.id": 7})]) as span:
                span.add_event("first_token", {"n": 1})
                with tracer.start_as_current_span("llm.tokenize") as child:
                    child.set_status(Status(StatusCode.ERROR, "bad input"))
                    child.set_attribute("bytes", b"\x00\xff")
    return list(exporter.get_finished_spans())


def _canonical(node: Any) -> Any:
    """Protobuf's JSON mapping leaves out default values and we do not write ``flags``
    (W3C trace flags, optional in OTLP): compare what is left."""
    if isinstance(node, dict):
        out = {}
        for key, raw in node.items():
            if key == "flags":
                continue
            value = _canonical(raw)
            if key in _ID_KEYS and isinstance(value, str) and len(value) in (12, 24):  # protobuf's base64
                value = base64.b64decode(value).hex()
            if value in (0, "", [], {}, None, "0") and key not in ("stringValue", "intValue", "doubleValue",
                                                                     "boolValue"):
                continue
            out[key] = value
        return out
    if isinstance(node, list):
        return [_canonical(item) for item in node]
    if isinstance(node, float) and math.isnan(node):
        return "NaN"
    return node


def test_encoding_matches_the_sdks_protobuf_encoding() -> None:
    spans = _spans()
    ours = json.loads(encode_spans(spans))
    sdk = MessageToDict(sdk_encode_spans(spans), use_integers_for_enums=True)
    assert _canonical(sdk) == _canonical(ours)
    assert 8 == sum(len(ss["spans"]) for rs in ours["resourceSpans"] for ss in rs["scopeSpans"])


def test_one_batch_is_one_line() -> None:
    assert "\n" not in encode_spans(_spans())


class PanicException(BaseException):  # named as pyo3's: the guard recognises it by name
    """Stands in for pyo3's ``PanicException`` (a compiled-code bug cannot be provoked on purpose)."""


class _PanickingEncoder:
    """A test double at the compiled encoder's seam: its ``encode`` panics."""

    def encode(self, spans: Any, pause: Any = None) -> str:
        raise PanicException("index out of bounds")


def test_a_panic_in_the_compiled_encoder_is_counted_and_the_batch_written_in_python(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from llmtrace._otel import otlp_json
    from llmtrace._safety import error_counts

    monkeypatch.setattr(otlp_json, "COMPILED", _PanickingEncoder())
    before = error_counts().get("otlp_json.compiled", 0)
    spans = _spans()
    assert otlp_json.encode_spans_python(spans) == encode_spans(spans)
    assert before + 1 == error_counts().get("otlp_json.compiled", 0)


def test_other_errors_of_the_compiled_encoder_propagate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a panic is caught: an error the Python encoder would raise too (a bad span) is raised."""
    from llmtrace._otel import otlp_json

    class _Raising:
        def encode(self, spans: Any, pause: Any = None) -> str:
            raise TypeError("first argument must be a string, not int")

    monkeypatch.setattr(otlp_json, "COMPILED", _Raising())
    with pytest.raises(TypeError):
        encode_spans(_spans())
