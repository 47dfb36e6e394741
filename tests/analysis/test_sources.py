"""Sources: OTLP JSON lines, whole documents, Jaeger v3 and legacy responses, gzip, bad input."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from llmtrace.analysis.errors import EmptySourceError, SourceError
from llmtrace.analysis.model import SpanKind, StatusCode
from llmtrace.analysis.sources import ReadStats, iter_file_spans, load_spans

TID = "0af7651916cd43dd8448eb211c80319c"
SID = "b7ad6b7169203331"
PID = "00f067aa0ba902b7"


def otlp_span(**over: Any) -> dict[str, Any]:
    sp = {
        "traceId": TID,
        "spanId": SID,
        "parentSpanId": PID,
        "name": "llm.request",
        "kind": 1,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000250000000",
        "attributes": [
            {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "42"}},
            {"key": "gen_ai.latency.e2e", "value": {"doubleValue": 0.25}},
            {"key": "llm.request.id", "value": {"stringValue": "cmpl-1"}},
            {"key": "llm.stream", "value": {"boolValue": True}},
            {
                "key": "gen_ai.response.finish_reasons",
                "value": {"arrayValue": {"values": [{"stringValue": "stop"}]}},
            },
        ],
        "status": {"code": 2, "message": "boom"},
        "links": [{"traceId": TID, "spanId": PID}],
    }
    sp.update(over)
    return sp


def doc(*spans: dict[str, Any], service: str = "api") -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
                "scopeSpans": [{"scope": {"name": "llmtrace"}, "spans": list(spans)}],
            }
        ]
    }


def write_lines(path: Path, docs: list[Any], *, gz: bool = False) -> str:
    text = "".join(json.dumps(d) + "\n" for d in docs)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return str(path)


def test_otlp_json_lines_are_normalised(tmp_path: Path) -> None:
    """Hex ids, string nanoseconds, typed attribute values, status, links and the service name."""
    [s] = load_spans(write_lines(tmp_path / "t.jsonl", [doc(otlp_span())])).spans
    assert (TID, SID, PID, "llm.request") == (s.trace_id, s.span_id, s.parent_id, s.name)
    assert (1700000000000000000, 250_000_000) == (s.start_ns, s.duration_ns)
    assert dict(s.attributes) == {
        "gen_ai.usage.input_tokens": 42,
        "gen_ai.latency.e2e": 0.25,
        "llm.request.id": "cmpl-1",
        "llm.stream": True,
        "gen_ai.response.finish_reasons": ("stop",),
    }
    assert (s.kind, s.status, s.service) == (SpanKind.INTERNAL, StatusCode.ERROR, "api")
    assert PID == s.links[0].span_id


def test_enum_names_and_base64_ids_are_accepted(tmp_path: Path) -> None:
    """Proto enum names (SPAN_KIND_SERVER) and legacy base64 ids decode to the same model."""
    b64_trace = base64.b64encode(bytes.fromhex(TID)).decode()
    b64_span = base64.b64encode(bytes.fromhex(SID)).decode()
    sp = otlp_span(kind="SPAN_KIND_SERVER", status={"code": "STATUS_CODE_OK"}, traceId=b64_trace, spanId=b64_span)
    [s] = load_spans(write_lines(tmp_path / "t.jsonl", [doc(sp)])).spans
    assert (s.trace_id, s.span_id, s.kind, s.status) == (TID, SID, SpanKind.SERVER, StatusCode.OK)


def test_metrics_lines_are_expected_and_skipped_quietly(tmp_path: Path) -> None:
    """llmtrace writes its metrics into the trace file: a resourceMetrics line is skipped and
    counted, without a warning."""
    metrics: dict[str, Any] = {"resourceMetrics": [{"resource": {}, "scopeMetrics": []}]}
    path = write_lines(tmp_path / "t.jsonl", [metrics, doc(otlp_span()), metrics])
    loaded = load_spans(path)
    stats = ReadStats()
    list(iter_file_spans(path, stats=stats))
    assert (1, [], {"metrics": 2}) == (len(loaded.spans), loaded.warnings, stats.skipped)


def test_logs_lines_are_skipped_with_a_warning(tmp_path: Path) -> None:
    """A resourceLogs line (a collector file exporter shared with a logs pipeline) is skipped,
    not an error, and the warning counts it."""
    logs: dict[str, Any] = {"resourceLogs": [{"resource": {}, "scopeLogs": []}]}
    loaded = load_spans(write_lines(tmp_path / "t.jsonl", [logs, doc(otlp_span())]))
    assert 1 == len(loaded.spans)
    assert ["skipped 1 logs document(s)"] == [w.split(": ", 1)[1] for w in loaded.warnings]


def test_whole_file_pretty_printed_document(tmp_path: Path) -> None:
    """A single OTLP document spread over many lines is read whole."""
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc(otlp_span(), otlp_span(spanId="1" * 16)), indent=2))
    assert 2 == len(load_spans(str(path)).spans)


def test_gzip_is_detected_by_content(tmp_path: Path) -> None:
    """Gzip is recognised by its magic bytes, whatever the file name."""
    path = write_lines(tmp_path / "t.data", [doc(otlp_span())], gz=True)
    assert 1 == len(load_spans(path).spans)


@pytest.mark.parametrize("layout", ["lines", "pretty", "gzip"])
def test_a_utf8_byte_order_mark_is_skipped(tmp_path: Path, layout: str) -> None:
    """Files saved by Windows tools (PowerShell's Out-File, Notepad) start with a UTF-8 BOM."""
    body = json.dumps(doc(otlp_span()), indent=2) if layout == "pretty" else json.dumps(doc(otlp_span())) + "\r\n"
    data = b"\xef\xbb\xbf" + body.encode()
    path = tmp_path / "saved.json"
    path.write_bytes(gzip.compress(data) if layout == "gzip" else data)
    [span] = load_spans(str(path)).spans
    assert (TID, SID) == (span.trace_id, span.span_id)


def test_saved_jaeger_v3_stream_of_result_objects(tmp_path: Path) -> None:
    """A /api/v3/traces response streams several {"result": ...} objects back to back."""
    chunks = [{"result": doc(otlp_span())}, {"result": doc(otlp_span(spanId="2" * 16))}]
    path = tmp_path / "v3.json"
    path.write_text(json.dumps(chunks[0], indent=1) + json.dumps(chunks[1], indent=1))
    assert {SID, "2" * 16} == {s.span_id for s in load_spans(str(path)).spans}


def test_legacy_jaeger_json_model(tmp_path: Path) -> None:
    """Legacy /api/traces: µs times, CHILD_OF parent, FOLLOWS_FROM link, span.kind and error tags."""
    legacy = {
        "data": [
            {
                "traceID": TID,
                "spans": [
                    {
                        "traceID": TID,
                        "spanID": SID,
                        "operationName": "POST /v1/completions",
                        "references": [
                            {"refType": "CHILD_OF", "traceID": TID, "spanID": PID},
                            {"refType": "FOLLOWS_FROM", "traceID": TID, "spanID": "3" * 16},
                        ],
                        "startTime": 1700000000000000,
                        "duration": 1500,
                        "tags": [
                            {"key": "span.kind", "type": "string", "value": "server"},
                            {"key": "otel.status_code", "type": "string", "value": "ERROR"},
                            {"key": "gen_ai.usage.input_tokens", "type": "int64", "value": 7},
                        ],
                        "processID": "p1",
                    }
                ],
                "processes": {"p1": {"serviceName": "api", "tags": []}},
            }
        ],
        "errors": None,
    }
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps(legacy))
    [s] = load_spans(str(path)).spans
    assert (
        s.parent_id,
        s.duration_ns,
        s.kind,
        s.status,
    ) == (PID, 1_500_000, SpanKind.SERVER, StatusCode.ERROR)
    assert (
        s.links[0].span_id,
        s.service,
        dict(s.attributes),
    ) == ("3" * 16, "api", {"gen_ai.usage.input_tokens": 7})


def test_unknown_span_kind_is_read_as_unspecified_with_a_warning(tmp_path: Path) -> None:
    """An unknown kind does not fail the read; it is reported once."""
    loaded = load_spans(write_lines(tmp_path / "t.jsonl", [doc(otlp_span(kind=42))]))
    assert loaded.spans[0].kind == SpanKind.UNSPECIFIED
    assert any("unknown span kind(s) 42" in w for w in loaded.warnings)


@pytest.mark.parametrize(
    ("content", "position", "message"),
    [
        ('{"resourceSpans": []}\n{"resourceSpans": [\n', "line 2", "malformed JSON"),
        ('{"resourceSpans": []}\n{"resourceSpans": [', "line 2", "truncated line"),
        ("[1, 2", "line 1", "malformed JSON"),
        ('{"hello": "world"}\n', "line 1", "not an OTLP or Jaeger trace document"),
    ],
)
def test_malformed_input_names_source_and_position(tmp_path: Path, content: str, position: str, message: str) -> None:
    """Malformed JSON, a cut-off last line, a non-trace document: SourceError naming file and line."""
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(SourceError) as err:
        load_spans(str(path))
    assert str(err.value).startswith(f"{path}:{position}")
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("document", "where", "message"),
    [
        ({"resourceSpans": [{"resource": True, "scopeSpans": []}]}, r"resourceSpans\[0\]", "bad resourceSpans entry"),
        ({"resourceSpans": ["x"]}, r"resourceSpans\[0\]", "bad resourceSpans entry"),
        ({"resourceSpans": 5}, r"resourceSpans\[0\]", "bad resourceSpans entry"),
        ({"resourceSpans": [{"scopeSpans": "abc"}]}, r"resourceSpans\[0\]\.scopeSpans\[0\]", "bad"),
        (
            {"resourceSpans": [{"resource": {"attributes": [{"value": {}}]}}]},
            r"resourceSpans\[0\]",
            "missing field 'key'",
        ),
        (
            {"resourceSpans": [{"scopeSpans": [{"spans": 1.5}]}]},
            r"resourceSpans\[0\]\.scopeSpans\[0\]\.spans\[0\]",
            "bad span",
        ),
        ({"data": [{"processes": {"p1": "x"}, "spans": []}]}, r"data\[0\]\.processes", "bad process"),
        ({"data": [{"processes": "x", "spans": []}]}, r"data\[0\]\.processes", "bad process"),
        (doc(otlp_span(name=5)), r"resourceSpans\[0\]\.scopeSpans\[0\]\.spans\[0\]", "name 5 is not a string"),
        (doc(otlp_span(attributes=[{"key": 1, "value": {}}])), r"resourceSpans.*spans\[0\]", "key 1 is not a string"),
        (doc(otlp_span(endTimeUnixNano=str(2**64))), r"resourceSpans.*spans\[0\]", "beyond the 64-bit range"),
        (
            {"data": [{"spans": [{"traceID": TID, "spanID": SID, "operationName": 7, "startTime": 1, "duration": 1}]}]},
            r"data\[0\]\.spans\[0\]",
            "operationName 7 is not a string",
        ),
        (
            {
                "data": [
                    {
                        "spans": [
                            {"traceID": TID, "spanID": SID, "operationName": "x", "startTime": 2**60, "duration": 1}
                        ]
                    }
                ]
            },
            r"data\[0\]\.spans\[0\]",
            "beyond the 64-bit range",
        ),
    ],
)
def test_ill_typed_structure_outside_spans_is_a_source_error(
    tmp_path: Path, document: Any, where: str, message: str
) -> None:
    """Found by fuzzing `llmtrace analyze`: a resource, scope or Jaeger process of the wrong
    JSON type, a name or attribute key that is not a string, a time beyond 64 bits escaped
    as internal errors (or broke the reports); each is a SourceError with its position."""
    path = write_lines(tmp_path / "t.jsonl", [document])
    with pytest.raises(SourceError, match=rf"line 1: {where}.*{message}"):
        load_spans(path)


def test_missing_field_names_the_span(tmp_path: Path) -> None:
    """A span without spanId: the error names the line and the JSON path of the span."""
    sp = otlp_span()
    del sp["spanId"]
    with pytest.raises(
        SourceError, match=r"line 1: resourceSpans\[0\]\.scopeSpans\[0\]\.spans\[0\]: missing field 'spanId'"
    ):
        load_spans(write_lines(tmp_path / "t.jsonl", [doc(sp)]))


def test_truncated_gzip_is_a_source_error(tmp_path: Path) -> None:
    """A gzip file cut short raises SourceError, not EOFError."""
    data = gzip.compress(("".join(json.dumps(doc(otlp_span())) + "\n" for _ in range(200))).encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceError, match=r"cut\.jsonl\.gz"):
        load_spans(str(path))


def test_empty_file_and_missing_file(tmp_path: Path) -> None:
    """An empty file is EmptySourceError; a missing one is SourceError with the OS reason."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(EmptySourceError, match="no spans found"):
        load_spans(str(empty))
    with pytest.raises(SourceError, match="No such file"):
        load_spans(str(tmp_path / "nope.jsonl"))


def test_service_and_time_filters_keep_whole_traces(tmp_path: Path) -> None:
    """--service keeps every span of a trace that touches the service; --since filters by trace start."""
    other = otlp_span(spanId="4" * 16, name="llm.step")
    path = write_lines(tmp_path / "t.jsonl", [doc(otlp_span(), service="api"), doc(other, service="engine")])
    assert 2 == len(load_spans(path, services=["api"]).spans)
    with pytest.raises(EmptySourceError):
        load_spans(path, since_ns=1800000000000000000)
