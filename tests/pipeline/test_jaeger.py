"""The FastAPI + generate() request trace, checked in the real Jaeger (collector -> Jaeger, scripts/otel_stack)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from llmtrace import semconv
from scripts.otel_stack.stack import OtelStack

pytestmark = [pytest.mark.stack, pytest.mark.torch]

ROOT = Path(__file__).resolve().parents[2]
SERVER_KIND = 2  # OTLP SPAN_KIND_SERVER


def test_streamed_generate_request_trace_in_jaeger(otel_stack: OtelStack) -> None:
    """Caller -> SERVER -> llm.request -> tokenize/prefill/decode arrive in Jaeger as one trace."""
    service = f"pipeline-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LLMTRACE_"))}
    env.update({"LLMTRACE_SERVICE_NAME": service, "LLMTRACE_EXPORTER": "otlp",
                "LLMTRACE_ENDPOINT": otel_stack.otlp_grpc_endpoint, "LLMTRACE_METRICS": "false",
                "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])})
    proc = subprocess.run([sys.executable, "-m", "tests.pipeline.jaeger_app"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=240, check=False)
    assert 0 == proc.returncode, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    spans = otel_stack.find_traces(service, semconv.SPAN_REQUEST)
    assert {result["trace_id"]} == {span.trace_id for span in spans}
    by_name = {span.name: span for span in spans}
    [server] = [span for span in spans if span.kind == SERVER_KIND]
    request = by_name[semconv.SPAN_REQUEST]
    assert server.span_id == request.parent_span_id
    for name in (semconv.SPAN_TOKENIZE, semconv.SPAN_PREFILL, semconv.SPAN_DECODE):
        assert request.span_id == by_name[name].parent_span_id, name
    assert 6 == request.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]
    ttft = request.attributes[semconv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN]
    assert 0 < ttft <= result["client_ttft_s"] + 0.001
    assert 0 < server.attributes[semconv.LLM_TIME_TO_FIRST_BYTE_S] <= result["client_ttft_s"] + 0.001
