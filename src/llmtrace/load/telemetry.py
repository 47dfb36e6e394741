"""The CLIENT span of each load request, and the ``gen_ai.client.operation.duration`` and
``gen_ai.client.token.usage`` metrics.

The span is started before the request is sent, at its intended send time (the zero of the
report's latencies), so its ``traceparent`` goes out with the request and the server's SERVER
span becomes its child: one trace from the client's send to the last token. Starting it ahead
keeps its cost out of the send; it is finished once the answer is complete, with an explicit
end time, so nothing OTel-shaped happens while chunks arrive.

Export goes through llmtrace's own setup (:func:`llmtrace.instrument` with no integrations):
a file by default, OTLP when an endpoint is configured, anything ``LLMTRACE_EXPORTER`` says.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from llmtrace import semconv as sc
from llmtrace.load.model import Outcome, RequestResult

#: Where the load tool's spans go when neither --traces nor LLMTRACE_EXPORTER/endpoint says.
DEFAULT_TRACES_FILE = "llmtrace-load-traces.jsonl"
SERVICE_NAME = "llmtrace-load"
_PROPAGATOR = TraceContextTextMapPropagator()


def start_export(traces_file: str | None, environ: Mapping[str, str] | None = None) -> Any:
    """Instrument this process for export only (no integrations, no GPU sampling); returns the
    handle, whose ``settings.export_file`` says where a file went (None: none)."""
    import llmtrace

    env = os.environ if environ is None else environ
    options: dict[str, Any] = {"integrations": "", "gpu": "off", "process_role": sc.LOAD_CLIENT_ROLE,
                               "metrics_interval_s": 5.0}
    if not (env.get("OTEL_SERVICE_NAME") or env.get("LLMTRACE_SERVICE_NAME")):
        options["service_name"] = SERVICE_NAME
    if traces_file is not None:
        # The user's other exporters (otlp) stay; the file is the one they named.
        others = [item for item in (env.get("LLMTRACE_EXPORTER") or "").split(",")
                  if item.strip() and not item.strip().startswith("file")]
        if env.get("LLMTRACE_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            others = sorted({*others, "otlp"})
        options["exporter"] = ",".join([f"file:{traces_file}", *others])
    elif not env.get("LLMTRACE_FILE_PATH"):
        options["file_path"] = DEFAULT_TRACES_FILE
    return llmtrace.instrument(**options)


@dataclass(frozen=True)
class RequestInfo:
    """What the span says about the request beyond its measurements."""

    url: str
    path: str
    operation: str  # "chat" | "text_completion"
    model: str
    max_tokens: int
    stream: bool
    profile: str
    step_label: str
    run_id: str
    offered_qps: float | None
    concurrency: int | None


class ClientSpans:
    """Makes one CLIENT span per request with the global (llmtrace-configured) provider."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._tracer = trace.get_tracer("llmtrace.load")
        self._duration: Any = None
        self._tokens: Any = None
        if enabled:
            from opentelemetry import metrics

            meter = metrics.get_meter("llmtrace.load")
            self._duration = meter.create_histogram(
                sc.METRIC_CLIENT_OPERATION_DURATION, unit="s",
                description="GenAI operation duration seen by the load client",
                explicit_bucket_boundaries_advisory=list(sc.REQUEST_DURATION_BUCKETS))
            self._tokens = meter.create_histogram(
                sc.METRIC_TOKEN_USAGE, unit="{token}", description="Tokens per request, as the server reported them",
                explicit_bucket_boundaries_advisory=list(sc.TOKEN_USAGE_BUCKETS))

    def begin(self, start_ns: int) -> tuple[Any, dict[str, str], int]:
        """(span, headers carrying it, its start) for a request due at wall-clock *start_ns*."""
        if not self.enabled:
            return None, {}, start_ns
        span = self._tracer.start_span("load", kind=SpanKind.CLIENT, start_time=start_ns)
        headers: dict[str, str] = {}
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
        return span, headers, start_ns

    def end(self, span: Any, info: RequestInfo, result: RequestResult, start_ns: int,
            end_ns: int) -> str | None:
        """Name, attributes, status and end of the span; returns its trace id (hex)."""
        if span is None:
            return None
        span.update_name(f"{info.operation} {info.model}")
        if span.is_recording():
            span.set_attributes(_attributes(info, result))
            if result.outcome not in (Outcome.OK, Outcome.CHAOS):
                span.set_status(Status(StatusCode.ERROR, result.error or result.outcome.value))
        span.end(end_time=end_ns)
        if self._duration is not None:
            attrs = {sc.GEN_AI_OPERATION_NAME: info.operation, sc.GEN_AI_REQUEST_MODEL: info.model,
                     sc.GEN_AI_PROVIDER_NAME: "openai"}
            if result.outcome is not Outcome.OK:
                attrs[sc.ERROR_TYPE] = _error_type(result)
            self._duration.record((end_ns - start_ns) / 1e9, attrs)
            if result.outcome is Outcome.OK:
                for kind, count in (("input", result.prompt_tokens), ("output", result.output_tokens)):
                    if count:
                        self._tokens.record(count, {**attrs, sc.GEN_AI_TOKEN_TYPE: kind})
        return format(span.get_span_context().trace_id, "032x")


def _error_type(result: RequestResult) -> str:
    return str(result.status) if result.outcome is Outcome.HTTP_ERROR and result.status else result.outcome.value


def _attributes(info: RequestInfo, r: RequestResult) -> dict[str, Any]:
    host, _, port = info.url.split("://", 1)[-1].split("/", 1)[0].partition(":")
    attrs: dict[str, Any] = {
        sc.HTTP_REQUEST_METHOD: "POST", sc.URL_FULL: info.url + info.path, sc.SERVER_ADDRESS: host,
        sc.GEN_AI_OPERATION_NAME: info.operation, sc.GEN_AI_PROVIDER_NAME: "openai",
        sc.GEN_AI_REQUEST_MODEL: info.model, sc.GEN_AI_REQUEST_MAX_TOKENS: info.max_tokens, sc.LLM_STREAM: info.stream,
        sc.LLM_LOAD_RUN_ID: info.run_id, sc.LLM_LOAD_PROFILE: info.profile, sc.LLM_LOAD_STEP: r.step,
        sc.LLM_LOAD_STEP_LABEL: info.step_label, sc.LLM_LOAD_SEND_LAG_S: r.send_lag_s,
        sc.LLM_LOAD_OUTCOME: r.outcome.value, sc.LLM_LOAD_REQUESTED_INPUT_TOKENS: r.input_tokens,
    }
    if port.isdigit():
        attrs[sc.SERVER_PORT] = int(port)
    optional: dict[str, Any] = {
        sc.LLM_LOAD_OFFERED_QPS: info.offered_qps, sc.LLM_LOAD_CONCURRENCY: info.concurrency,
        sc.HTTP_RESPONSE_STATUS_CODE: r.status, sc.GEN_AI_USAGE_INPUT_TOKENS: r.prompt_tokens,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: r.output_tokens if r.outcome is Outcome.OK else None,
        sc.LLM_CLIENT_TPOT_S: r.tpot_s, sc.LLM_LOAD_CHAOS: r.chaos.value if r.chaos else None,
        sc.LLM_LOAD_POOL_WAIT_S: r.pool_wait_s or None,
        sc.GEN_AI_RESPONSE_ID: r.response_id, sc.GEN_AI_RESPONSE_MODEL: r.response_model,
        sc.GEN_AI_RESPONSE_FINISH_REASONS: [r.finish_reason] if r.finish_reason else None,
    }
    if r.ttft_s is not None:
        optional[sc.LLM_CLIENT_TTFT_S] = r.ttft_s - r.send_lag_s  # from the actual send
    if r.itl_s:
        gaps = sorted(r.itl_s)
        optional.update({sc.LLM_CLIENT_ITL_MEAN_S: sum(gaps) / len(gaps), sc.LLM_CLIENT_ITL_P50_S: gaps[len(gaps) // 2],
                         sc.LLM_CLIENT_ITL_P99_S: gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))],
                         sc.LLM_CLIENT_ITL_MAX_S: gaps[-1]})
    if r.outcome not in (Outcome.OK, Outcome.CHAOS):
        optional[sc.ERROR_TYPE] = _error_type(r)
    attrs.update({key: value for key, value in optional.items() if value is not None})
    return attrs

