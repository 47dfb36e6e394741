"""The reference server's traces, shipped over OTLP through the real collector into the real Jaeger."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmtrace import semconv
from scripts.otel_stack.stack import OtelStack, by_trace
from tests.server.spans import run_scenario

pytestmark = [pytest.mark.torch, pytest.mark.stack]


def test_request_and_engine_traces_arrive_in_jaeger(otel_stack: OtelStack, tmp_path: Path) -> None:
    """Both processes export to the collector; Jaeger holds each request's full phase chain
    (API server and engine spans in one trace) and the engine windows."""
    result = run_scenario("ref_server_load.py", tmp_path / "unused.jsonl", "--clients", "4", "--disconnects", "0",
                          "--exporter", "otlp",
                          env={"OTEL_EXPORTER_OTLP_ENDPOINT": otel_stack.otlp_grpc_endpoint,
                               "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert 4 == sum(c["outcome"] == "ok" for c in result["clients"])
    spans = otel_stack.find_traces("ref-server-test", semconv.SPAN_REQUEST, min_traces=4, timeout_s=60)
    requests = [s for s in spans if s.name == semconv.SPAN_REQUEST]
    assert 4 == len(requests)
    traces = by_trace(spans)
    for request in requests:
        children = {s.name: s for s in traces[request.trace_id] if s.parent_span_id == request.span_id}
        assert {semconv.SPAN_TOKENIZE, semconv.SPAN_QUEUE, semconv.SPAN_PREFILL, semconv.SPAN_DECODE} <= set(children)
        assert "engine" == children[semconv.SPAN_PREFILL].resource[semconv.LLMTRACE_PROCESS_ROLE]
    windows = otel_stack.find_traces("ref-server-test", semconv.SPAN_ENGINE, timeout_s=30)
    steps = [s for s in windows if s.name == semconv.SPAN_STEP]
    assert steps and all(s.attributes[semconv.LLM_ENGINE_ID] == "dp0" for s in steps)
