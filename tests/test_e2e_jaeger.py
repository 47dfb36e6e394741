"""End to end: an app calls ``llmtrace.instrument()``, spans go over OTLP (gRPC, HTTP protobuf and
HTTP JSON) through the shipped collector config into Jaeger, and come back through ``/api/v3/traces``.

The stack is real (scripts/otel_stack, run by tests/stack): the Jaeger v2 binary built from the Go module proxy,
running collector/otel-collector.yaml and collector/jaeger.yaml on free loopback ports.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping

import pytest

from llmtrace import semconv
from scripts.otel_stack.stack import OtelStack, by_trace
from tests.stack.run_app import run_app

pytestmark = pytest.mark.stack

PROTOCOLS = {"grpc": "otlp_grpc_endpoint", "http/protobuf": "otlp_http_endpoint",
             "http/json": "otlp_http_endpoint"}


def _app_env(stack: OtelStack, service: str, protocol: str = "grpc") -> dict[str, str]:
    return {
        "LLMTRACE_SERVICE_NAME": service,
        "LLMTRACE_EXPORTER": "otlp",
        "LLMTRACE_ENDPOINT": getattr(stack, PROTOCOLS[protocol]),
        "LLMTRACE_PROTOCOL": protocol,
        "LLMTRACE_METRICS_INTERVAL_S": "0.5",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=e2e,team=inference",
    }


def _service(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_request_trace_arrives_whole_with_structure_and_resource(otel_stack: OtelStack,
                                                                  protocol: str) -> None:
    """An llm.request with its four phase children reaches Jaeger as one trace, parent/child intact."""
    service = _service("e2e-structure")
    run = run_app("request", _app_env(otel_stack, service, protocol))

    spans = otel_stack.find_traces(service, semconv.SPAN_REQUEST)
    traces = by_trace(spans)
    assert [run.result["trace_id"]] == list(traces)
    by_name = {span.name: span for span in spans}
    expected_names = {semconv.SPAN_REQUEST, semconv.SPAN_TOKENIZE, semconv.SPAN_QUEUE, semconv.SPAN_PREFILL,
                      semconv.SPAN_DECODE}
    assert expected_names == set(by_name)
    assert len(expected_names) == len(spans)
    root = by_name[semconv.SPAN_REQUEST]
    assert "" == root.parent_span_id
    for name in expected_names - {semconv.SPAN_REQUEST}:
        assert root.span_id == by_name[name].parent_span_id, name
        assert root.start_ns <= by_name[name].start_ns <= by_name[name].end_ns <= root.end_ns, name
    phases = sorted((by_name[n] for n in expected_names - {semconv.SPAN_REQUEST}), key=lambda s: s.start_ns)
    assert [semconv.SPAN_TOKENIZE, semconv.SPAN_QUEUE, semconv.SPAN_PREFILL, semconv.SPAN_DECODE] == [
        s.name for s in phases]
    assert "tiny-test-model" == root.attributes[semconv.GEN_AI_REQUEST_MODEL]
    assert 1.5 == root.attributes[semconv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN]
    assert 16 == root.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]
    assert service == root.service_name
    assert "e2e" == root.resource["deployment.environment"]  # from OTEL_RESOURCE_ATTRIBUTES
    assert "inference" == root.resource["team"]
    assert "api-server" == root.resource[semconv.LLMTRACE_PROCESS_ROLE]
    assert 0 == run.result["dropped"]


def test_tail_sampling_keeps_errors_slow_and_high_ttft_and_drops_most_fast_traces(
        otel_stack_factory: Callable[[Mapping[str, str]], OtelStack]) -> None:
    """With a 10% baseline: the error, the slow (>1 s) and the high-TTFT (>1 s) trace are kept,
    ~10% of 100 fast traces are, and engine windows follow their own (100%) policy."""
    stack = otel_stack_factory({
        "LLMTRACE_COLLECTOR_BASELINE_PERCENT": "10",
        "LLMTRACE_COLLECTOR_ENGINE_PERCENT": "100",
        "LLMTRACE_COLLECTOR_SLOW_MS": "1000",
        "LLMTRACE_COLLECTOR_TTFT_S": "1.0",
    })
    service = _service("e2e-sampling")
    run = run_app("sampling", {**_app_env(stack, service, "http/protobuf"), "APP_FAST_TRACES": "100",
                               "APP_ENGINE_WINDOWS": "5"})
    sent = run.result

    # The special traces were sent last, so once they are decided the fast ones are too.
    stack.find_traces(service, semconv.SPAN_REQUEST, min_traces=3)
    time.sleep(1.5)  # one more decision tick + batch timeout, for stragglers
    kept = by_trace(stack.query_traces(service))

    assert {sent["error"], sent["slow"], sent["high_ttft"]} <= set(kept)
    for trace_id in (sent["error"], sent["slow"], sent["high_ttft"]):
        assert 5 == len(kept[trace_id]), "a kept trace is kept whole"
    fast_kept = len(set(sent["fast"]) & set(kept))
    # Binomial(100, 0.1): P(0) = 3e-5, P(>= 30) < 1e-6.
    assert 0 < fast_kept < 30, fast_kept
    assert set(sent["engine"]) <= set(kept)


@pytest.mark.parametrize("protocol", ["grpc", "http/json"])
def test_serving_metrics_reach_prometheus_under_dashboard_names(otel_stack: OtelStack, protocol: str) -> None:
    """Metrics recorded by llmtrace's lifecycle API come out of the collector's Prometheus exporter
    under the names the Grafana dashboard queries; span metrics (spanmetrics connector) too —
    also when they travel as OTLP/HTTP JSON (llmtrace's own exporter)."""
    service = _service("e2e-metrics")
    run_app("lifecycle", _app_env(otel_stack, service, protocol))
    otel_stack.find_traces(service, semconv.SPAN_ENGINE)
    expected = {
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "gen_ai_server_time_per_output_token_seconds_bucket",
        "gen_ai_server_request_duration_seconds_bucket",
        "llmtrace_queue_time_seconds_bucket",
        "llmtrace_batch_size_bucket",
        "llmtrace_gpu_idle_ratio",
        "llmtrace_spans_dropped_total",
        "traces_span_metrics_calls_total",
        "traces_span_metrics_duration_milliseconds_bucket",
    }
    deadline = time.monotonic() + 20
    present: set[str] = set()
    while time.monotonic() < deadline:
        present = {line.split("{", 1)[0] for line in otel_stack.prometheus_text().splitlines()
                   if not line.startswith("#") and f'job="{service}"' in line}
        if expected <= present:
            break
        time.sleep(0.5)
    assert set() == expected - present
