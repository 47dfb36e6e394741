"""vLLM's *own* tracing, no llmtrace in the server: the real vLLM ``LLM`` (EngineCore process,
Scheduler, OutputProcessor; the fake executor stands in for the GPU) exports its
``llm_request`` spans over OTLP/gRPC into the real collector and Jaeger of the test stack, and
``llmtrace analyze``'s Jaeger source reads them back as requests of the span model, their
queue / prefill / decode placed from vLLM's latency attributes (llmtrace/analysis/vllm_native.py)."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from llmtrace import semconv as sc
from llmtrace.analysis import analyze, build_traceset, to_json
from llmtrace.analysis.breakdown import request_phases
from llmtrace.analysis.sources import load_spans
from tests.vllm.conftest import PYTHON, REPO, driven, requires_vllm, subprocess_env

pytestmark = [pytest.mark.vllm, pytest.mark.stack, requires_vllm]

REQUESTS = 6
TOKENS = 12


@pytest.fixture(scope="module")
def native_run(tiny_model: Path, otel_stack: Any) -> tuple[list[Any], Any]:
    service = f"vllm-native-{uuid.uuid4().hex[:8]}"
    since = time.time_ns() - 5_000_000_000
    done = subprocess.run(
        [PYTHON, "-m", "tests.vllm.scenario", str(tiny_model), "--requests", str(REQUESTS), "--max-tokens",
         str(TOKENS), "--otlp-traces-endpoint", otel_stack.otlp_grpc_endpoint],
        cwd=REPO, env=subprocess_env(OTEL_SERVICE_NAME=service), capture_output=True, text=True, timeout=400,
        check=False)
    assert 0 == done.returncode, done.stderr[-6000:]
    otel_stack.find_traces(service, span_name=sc.VLLM_SPAN_REQUEST, timeout_s=60, min_traces=REQUESTS)
    driven("LLM.generate with vLLM's own --otlp-traces-endpoint -> collector -> Jaeger -> llmtrace's Jaeger source")
    loaded = load_spans(otel_stack.jaeger_query_url, services=[service], since_ns=since,
                        until_ns=time.time_ns() + 60_000_000_000)
    return loaded.spans, build_traceset(loaded.spans)


def test_each_vllm_request_span_is_one_request_with_its_phases(native_run: tuple[list[Any], Any]) -> None:
    spans, ts = native_run
    natives = [s for s in spans if s.name == sc.VLLM_SPAN_REQUEST]
    assert REQUESTS == len(natives) == len(ts.requests)
    assert sorted(str(i) for i in range(REQUESTS)) == sorted(r.request_id for r in ts.requests)
    for r in ts.requests:
        assert TOKENS == r.output_tokens and (r.input_tokens or 0) > 0
        attrs = r.request.attributes
        phases = request_phases(r)
        # The derived spans carry vLLM's own numbers (to the nanosecond rounding), unless clipped.
        for phase, key in (("queue", sc.GEN_AI_LATENCY_TIME_IN_QUEUE),
                           ("prefill", sc.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL),
                           ("decode", sc.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE)):
            assert phases[phase] == pytest.approx(attrs[key], abs=2e-9), (phase, dict(attrs))
        assert r.ttft_s == attrs[sc.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN]
        assert {sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE} == set(r.phases)


def test_the_report_names_decode_on_the_critical_path(native_run: tuple[list[Any], Any]) -> None:
    _, ts = native_run
    summary = to_json(analyze(ts))
    assert REQUESTS == summary["requests"]["count"]
    shares = {name: v["share"] for name, v in summary["critical_path"].items()}
    assert max(shares, key=lambda name: shares[name]) == sc.SPAN_DECODE, shares
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-6)
    assert summary["breakdown"]["decode"]["p50_s"] > 0
