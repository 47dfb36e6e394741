"""A traced "application" run in a subprocess by the end-to-end tests.

``python -m tests.stack.app SCENARIO`` calls ``llmtrace.instrument()`` (options from
the environment: LLMTRACE_ENDPOINT, LLMTRACE_PROTOCOL, OTEL_RESOURCE_ATTRIBUTES, ...),
emits the scenario's spans with the plain OpenTelemetry API (or the lifecycle API),
calls ``llmtrace.shutdown()`` and prints one JSON line describing what it sent.

Scenarios:
  request   one llm.request trace with tokenize/queue/prefill/decode children
  sampling  N fast request traces + one error, one slow, one high-TTFT + engine windows
  lifecycle requests and engine steps through llmtrace's lifecycle API (real metrics)
  dead      a request loop against a dead endpoint: counts, RSS samples, drops
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

import llmtrace
from llmtrace import semconv

MS = 1_000_000


def _request_trace(tracer: trace.Tracer, start_ns: int, *, total_ms: float, ttft_s: float,
                   error: bool = False, tag: str = "") -> str:
    """An llm.request root with its sequential phase children, at explicit timestamps."""
    end_ns = start_ns + int(total_ms * MS)
    root = tracer.start_span(semconv.SPAN_REQUEST, kind=SpanKind.INTERNAL, start_time=start_ns, attributes={
        semconv.GEN_AI_OPERATION_NAME: "text_completion",
        semconv.GEN_AI_REQUEST_MODEL: "tiny-test-model",
        semconv.GEN_AI_REQUEST_MAX_TOKENS: 16,
        semconv.GEN_AI_USAGE_INPUT_TOKENS: 7,
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 16,
        semconv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: ttft_s,
        semconv.GEN_AI_LATENCY_E2E: total_ms / 1000,
        semconv.LLM_REQUEST_ID: tag or f"req-{start_ns}",
        semconv.LLM_REQUEST_FINISH_REASON: semconv.FINISH_ERROR if error else semconv.FINISH_STOP,
    })
    ctx = trace.set_span_in_context(root)
    # tokenize 5% | queue 15% | prefill 20% | decode 60% of the request.
    bounds = [0.0, 0.05, 0.20, 0.40, 1.0]
    names = [semconv.SPAN_TOKENIZE, semconv.SPAN_QUEUE, semconv.SPAN_PREFILL, semconv.SPAN_DECODE]
    for name, lo, hi in zip(names, bounds, bounds[1:], strict=False):
        child = tracer.start_span(name, context=ctx, start_time=start_ns + int(lo * total_ms * MS))
        child.end(end_time=start_ns + int(hi * total_ms * MS))
    if error:
        root.set_status(Status(StatusCode.ERROR, "RuntimeError"))
    root.end(end_time=end_ns)
    return format(root.get_span_context().trace_id, "032x")


def _engine_window(tracer: trace.Tracer, start_ns: int, steps: int = 3) -> str:
    root = tracer.start_span(semconv.SPAN_ENGINE, start_time=start_ns,
                             attributes={semconv.LLM_ENGINE_ID: "dp0"})
    ctx = trace.set_span_in_context(root)
    for i in range(steps):
        s0 = start_ns + i * 10 * MS
        step = tracer.start_span(semconv.SPAN_STEP, context=ctx, start_time=s0, attributes={
            semconv.LLM_ENGINE_ID: "dp0", semconv.LLM_STEP_ID: i, semconv.LLM_BATCH_SIZE: 4})
        fwd = tracer.start_span(semconv.SPAN_FORWARD, context=trace.set_span_in_context(step),
                                start_time=s0 + MS)
        fwd.end(end_time=s0 + 8 * MS)
        step.end(end_time=s0 + 9 * MS)
    root.end(end_time=start_ns + steps * 10 * MS)
    return format(root.get_span_context().trace_id, "032x")


def scenario_request(tracer: trace.Tracer) -> dict[str, Any]:
    return {"trace_id": _request_trace(tracer, time.time_ns(), total_ms=200, ttft_s=1.5, tag="structure")}


def scenario_sampling(tracer: trace.Tracer) -> dict[str, Any]:
    n_fast = int(os.environ.get("APP_FAST_TRACES", "100"))
    now = time.time_ns()
    fast = [_request_trace(tracer, now, total_ms=20, ttft_s=0.01, tag=f"fast-{i}") for i in range(n_fast)]
    engine = [_engine_window(tracer, now) for _ in range(int(os.environ.get("APP_ENGINE_WINDOWS", "5")))]
    return {
        "fast": fast,
        "engine": engine,
        "error": _request_trace(tracer, now, total_ms=20, ttft_s=0.01, error=True, tag="error"),
        "slow": _request_trace(tracer, now, total_ms=3000, ttft_s=0.01, tag="slow"),
        "high_ttft": _request_trace(tracer, now, total_ms=50, ttft_s=2.5, tag="high-ttft"),
    }


def scenario_lifecycle(tracer: trace.Tracer) -> dict[str, Any]:
    """An engine the way an integration drives it: tracker, steps, tokens (real serving metrics)."""
    engine = llmtrace.EngineTracer("dp0")
    ids = [f"life-{i}" for i in range(3)]
    for request_id in ids:
        engine.tracker.add(request_id, model="tiny-test-model", prompt_tokens=5, max_tokens=4)
    for _ in range(4):
        with engine.step() as step:
            step.batch(ids, decode_tokens=len(ids), waiting=0, running=len(ids))
            with step.phase("forward"):
                time.sleep(0.002)
            step.tokens(ids)
    for request_id in ids:
        engine.tracker.finished(request_id, output_tokens=4)
    return {"requests": ids}


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def scenario_dead(tracer: trace.Tracer) -> dict[str, Any]:
    """Serve "requests" (each: a request trace) for a few seconds; the endpoint is dead.

    ``exports_on_request_thread`` counts exporter ``export`` calls entered on the serving
    thread (a profile hook on this thread only): the request path must hand spans off,
    never export, whatever the exporter is doing."""
    duration_s = float(os.environ.get("APP_DURATION_S", "6"))
    served, rss, exports = 0, [], [0]

    def on_call(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "export" \
                and isinstance(frame.f_locals.get("self"), SpanExporter):
            exports[0] += 1

    started = time.monotonic()
    next_sample = started
    sys.setprofile(on_call)
    try:
        while time.monotonic() - started < duration_s:
            _request_trace(tracer, time.time_ns(), total_ms=5, ttft_s=0.001)
            served += 1
            if time.monotonic() >= next_sample:
                rss.append(_rss_kib())
                next_sample += 0.5
            time.sleep(0.0005)
    finally:
        sys.setprofile(None)
    return {"served": served, "rss_kib": rss, "exports_on_request_thread": exports[0]}


SCENARIOS = {"request": scenario_request, "sampling": scenario_sampling, "lifecycle": scenario_lifecycle,
             "dead": scenario_dead}


def main() -> None:
    handle = llmtrace.instrument(gpu="off")
    tracer = trace.get_tracer("tests.stack.app")
    result = SCENARIOS[sys.argv[1]](tracer)
    result["dropped_before_shutdown"] = handle.providers.drops.dropped
    t0 = time.monotonic()
    result["shutdown_ok"] = llmtrace.shutdown(timeout_s=float(os.environ.get("APP_SHUTDOWN_S", "10")))
    result["shutdown_s"] = time.monotonic() - t0
    result["dropped"] = handle.providers.drops.dropped
    print(json.dumps(result))


if __name__ == "__main__":
    main()
