"""Chaos: the two-tier layout's tier 1 is SIGKILLed while every tier-2 collector is down.

Real processes: Jaeger, the gateway of scripts/otel_stack (tier 1 is ``tools/collector`` running
``collector/gateway/tier1-loadbalancer.yaml``, its queue on disk with ``file_storage``; tier 2 is
two Jaeger v2 binaries running ``collector/otel-collector.yaml``) and an instrumented app
(tests/stack/app.py) exporting OTLP/gRPC to tier 1. Tier 1 takes the app's spans while it can
forward them nowhere, is killed and restarted on the same queue directory, and delivers them
once tier 2 is back: every trace is whole in Jaeger, and the SDK never saw the outage.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from llmtrace import semconv
from scripts.otel_stack.stack import GatewayStack, OtelStack, by_trace
from tests.chaos.harness import restart
from tests.stack.run_app import run_app

pytestmark = pytest.mark.stack

#: Tier 1 retries a failed batch with backoff up to 30 s apart (the exporter's default
#: max_interval), then tier 2 holds each trace for decision_wait (2 s in the test stack).
DELIVERY_TIMEOUT_S = 120.0
TIER1 = 2  #: GatewayStack.processes: tier-2 collectors first, then tier 1


def test_tier1_keeps_its_queue_through_a_crash_while_tier2_is_down(tmp_path: Path) -> None:
    backend = OtelStack.start(log_dir=tmp_path)
    try:
        gateway = GatewayStack.start(backend)
        try:
            for tier2 in gateway.processes[:TIER1]:
                tier2.proc.kill()
                tier2.proc.wait()
            service = f"chaos-gateway-{uuid.uuid4().hex[:6]}"
            run = run_app("sampling", {
                "LLMTRACE_SERVICE_NAME": service, "LLMTRACE_EXPORTER": "otlp",
                "LLMTRACE_ENDPOINT": gateway.otlp_grpc_endpoint, "APP_FAST_TRACES": "40",
                "APP_ENGINE_WINDOWS": "0",
            })
            time.sleep(1.0)  # tier 1 has taken the batch; let it try tier 2 once
            gateway.processes[TIER1].proc.kill()
            gateway.processes[TIER1] = restart(gateway.processes[TIER1])
            for index in range(TIER1):
                gateway.processes[index] = restart(gateway.processes[index])
            result = run.result
            sent = set(result["fast"]) | {result["error"], result["slow"], result["high_ttft"]}
            backend.find_traces(service, semconv.SPAN_REQUEST, min_traces=len(sent), timeout_s=DELIVERY_TIMEOUT_S)
            time.sleep(1.0)
            kept = by_trace(backend.query_traces(service))
        finally:
            gateway.stop()
    finally:
        backend.stop()
    assert (0, 0) == (result["spilled"], result["dropped"])
    assert sent == set(kept)
    assert {5} == {len(spans) for spans in kept.values()}, "every trace whole"
