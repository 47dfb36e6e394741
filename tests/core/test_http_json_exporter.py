"""OTLP/HTTP with JSON bodies against a real HTTP server on loopback: what is sent, what is
retried (the OTLP spec's retryable codes) and what is not."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmtrace._otel.export import OtlpHttpJsonSpanExporter


class _Collector(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.codes: list[int] = []  # answers to give, in order (then 200)
        self.received: list[tuple[str, str, bytes]] = []  # (path, content type, body)


class _Handler(BaseHTTPRequestHandler):
    server: _Collector

    def do_POST(self) -> None:  # http.server calls it by this name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((self.path, self.headers["Content-Type"], body))
        code = self.server.codes.pop(0) if self.server.codes else 200
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[_Collector]:
    server = _Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _spans() -> list:  # type: ignore[type-arg]
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("llm.request", attributes={"llm.request.id": "r1"}):
        pass
    return list(memory.get_finished_spans())


def test_spans_arrive_as_one_otlp_json_document(collector: _Collector) -> None:
    exporter = OtlpHttpJsonSpanExporter(f"http://127.0.0.1:{collector.server_port}/v1/traces")
    assert SpanExportResult.SUCCESS == exporter.export(_spans())
    ((path, content_type, body),) = collector.received
    assert ("/v1/traces", "application/json") == (path, content_type)
    (span,) = json.loads(body)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert "llm.request" == span["name"]
    assert 32 == len(span["traceId"])  # hex, as OTLP/JSON wants
    exporter.shutdown()


def test_a_retryable_answer_is_retried_and_a_client_error_is_not(collector: _Collector) -> None:
    exporter = OtlpHttpJsonSpanExporter(f"http://127.0.0.1:{collector.server_port}/v1/traces", timeout_s=5)
    collector.codes = [503]
    assert SpanExportResult.SUCCESS == exporter.export(_spans())
    assert 2 == len(collector.received)
    collector.codes = [400]
    assert SpanExportResult.FAILURE == exporter.export(_spans())
    assert 3 == len(collector.received)
    exporter.shutdown()


@pytest.mark.parametrize(("endpoint", "expected"), [
    (None, "http://localhost:4318/v1/traces"),  # the OTLP spec's default for HTTP
    ("http://collector:4318", "http://collector:4318/v1/traces"),
    ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
])
def test_http_json_endpoints_follow_the_otlp_http_rules(endpoint: str | None, expected: str) -> None:
    from llmtrace._otel.providers import _metric_exporter, _span_exporter
    from llmtrace.config import resolve

    settings = resolve({"exporter": "otlp", "protocol": "http/json", "endpoint": endpoint, "gpu": "off"}, environ={})
    exporter, target = _span_exporter(settings, "otlp")
    assert isinstance(exporter, OtlpHttpJsonSpanExporter)
    assert expected == target
    metrics = _metric_exporter(settings, "otlp")
    assert expected.replace("/v1/traces", "/v1/metrics") == metrics._poster._endpoint  # type: ignore[attr-defined]
    exporter.shutdown()
    metrics.shutdown()
