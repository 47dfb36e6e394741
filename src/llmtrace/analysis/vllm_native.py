"""vLLM's own request spans (``llm_request``) as requests of the span model.

A vLLM server started with ``--otlp-traces-endpoint`` (no llmtrace in it) exports one
SERVER span per request, ``llm_request``, from arrival to the end of the request, with its
phases as latency attributes in seconds rather than as child spans (vllm/tracing,
``OutputProcessor.do_tracing``)::

    gen_ai.latency.time_to_first_token   arrival -> first token
    gen_ai.latency.time_in_queue         queued -> scheduled
    gen_ai.latency.time_in_model_prefill scheduled -> first token
    gen_ai.latency.time_in_model_decode  first token -> last token

The queue, prefill and decode lengths are differences of the engine core's own timestamps;
the span ends when the request's last output reached the front end. So the phases are placed
back to back ending at the span's end: decode ends there, prefill ends where decode starts,
the queue ends where prefill starts. (Anchoring at ``arrival + ttft`` instead would push the
decode past the span's end by the engine-to-front-end latency of the first output: ttft is
measured in the front end, decode in the engine.) Without a decode latency, the first token is
placed at ``arrival + ttft``. :func:`derived_phases` turns this into ``llm.queue`` /
``llm.prefill`` / ``llm.decode`` children (marked ``llmtrace.derived_from = "llm_request"``),
so every analyzer — breakdown, critical path, anomalies, compare — reads such a trace as it
reads one of llmtrace's. The time before the queue (input processing, tokenization, the
hand-off to the engine core) stays the request span's own time. TTFT stays vLLM's number.

A trace that also holds llmtrace's ``llm.request`` (llmtrace's vLLM integration next to
vLLM's tracing) is left alone: that request is already described, and better.
"""

from __future__ import annotations

from typing import Any

from llmtrace import semconv as sc
from llmtrace.analysis.model import Span, SpanKind, Trace, finite_number, seconds_to_ns

#: Marks a span this module derived (its value: the span it was derived from).
DERIVED_FROM = "llmtrace.derived_from"
_PHASE_ATTRS = (
    (sc.SPAN_QUEUE, sc.GEN_AI_LATENCY_TIME_IN_QUEUE),
    (sc.SPAN_PREFILL, sc.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL),
    (sc.SPAN_DECODE, sc.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE),
)


def _seconds(attributes: Any, key: str) -> float | None:
    value = finite_number(attributes.get(key))
    if value is None or value < 0:
        return None  # absent, not a number, NaN, infinite or negative: no phase is placed from it
    return value


def derived_phases(request: Span) -> list[Span]:
    """The queue / prefill / decode children of a vLLM ``llm_request`` span, placed from its
    latency attributes (see the module doc) and clipped to the span; none when neither the
    decode nor the first-token latency is there to anchor them."""
    attrs = request.attributes
    queue, prefill, decode = (_seconds(attrs, key) for _, key in _PHASE_ATTRS)
    if decode is not None:
        first_token = request.end_ns - seconds_to_ns(decode)
    elif (ttft := _seconds(attrs, sc.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN)) is not None:
        first_token = request.start_ns + seconds_to_ns(ttft)
    else:
        return []
    scheduled = first_token - seconds_to_ns(prefill or 0.0)
    bounds = {
        sc.SPAN_QUEUE: (scheduled - seconds_to_ns(queue), scheduled) if queue is not None else None,
        sc.SPAN_PREFILL: (scheduled, first_token) if prefill is not None else None,
        sc.SPAN_DECODE: (first_token, request.end_ns) if decode is not None else None,
    }
    out = []
    for name, _ in _PHASE_ATTRS:
        span = bounds[name]
        if span is None:
            continue
        start = min(max(span[0], request.start_ns), request.end_ns)
        end = min(max(span[1], start), request.end_ns)
        out.append(Span(request.trace_id, f"{request.span_id}.{name}", request.span_id, name, start, end,
                        SpanKind.INTERNAL, attributes={DERIVED_FROM: sc.VLLM_SPAN_REQUEST},
                        service=request.service, resource=request.resource))
    return out


def expand(trace: Trace) -> Trace | None:
    """*trace* with the derived phases of its vLLM ``llm_request`` spans added (those spans are
    then the trace's requests); None when llmtrace's ``llm.request`` is in the trace."""
    spans = trace.spans
    if any(s.name == sc.SPAN_REQUEST for s in spans):
        return None
    derived = [d for s in spans if s.name == sc.VLLM_SPAN_REQUEST for d in derived_phases(s)]
    return Trace.build(trace.trace_id, [*spans, *derived]) if derived else trace
