"""Per-request phase breakdown: network, tokenize, queue, prefill, decode, detokenize, other.

Phase times come from the phase spans (``llm.queue`` summed over preemptions); where a phase
span is missing the vLLM-compatible latency attribute on ``llm.request`` stands in. Network
is the HTTP server span's time outside ``llm.request`` (parsing, response streaming after
the last token); "other" is whatever of the client-visible latency no phase explains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmtrace import semconv as sc
from llmtrace.analysis.model import RequestView
from llmtrace.analysis.stats import pcts

PHASES = ("network", "tokenize", "queue", "prefill", "decode", "detokenize", "other")

_FALLBACK_ATTR = {
    sc.SPAN_QUEUE: sc.GEN_AI_LATENCY_TIME_IN_QUEUE,
    sc.SPAN_PREFILL: sc.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL,
    sc.SPAN_DECODE: sc.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE,
}
_SPAN_OF = {
    "tokenize": sc.SPAN_TOKENIZE,
    "queue": sc.SPAN_QUEUE,
    "prefill": sc.SPAN_PREFILL,
    "decode": sc.SPAN_DECODE,
    "detokenize": sc.SPAN_DETOKENIZE,
}


#: (phase span name, its fallback attribute or None) for the five phases with spans, in
#: the order their seconds are summed for "other".
_LOOKUPS = tuple(
    (_SPAN_OF[p], _FALLBACK_ATTR.get(_SPAN_OF[p])) for p in ("tokenize", "queue", "prefill", "decode", "detokenize")
)


def request_phases(r: RequestView) -> dict[str, float]:
    """Seconds per phase for one request; the values sum to its client-visible latency
    (unless phases overlap, in which case "other" is 0)."""
    phases = r.phases
    values = []
    for span_name, attr in _LOOKUPS:
        spans = phases.get(span_name)
        if spans is not None:  # summed: llm.queue recurs after a preemption
            if len(spans) == 1:  # RequestView.phase_s's answer without the call (the usual case)
                s = spans[0]
                values.append((s.end_ns - s.start_ns) / 1e9)
            else:
                values.append(r.phase_s(span_name))
        else:
            value = r.num(attr) if attr else None
            values.append(value if value is not None and value >= 0 else 0.0)
    server, request = r.server, r.request
    network = 0.0
    if server is not None:
        network = max(0.0, ((server.end_ns - server.start_ns) - (request.end_ns - request.start_ns)) / 1e9)
    values.append(network)
    other = max(0.0, r.e2e_s - sum(values))
    tokenize, queue, prefill, decode, detokenize, _ = values
    return {
        "network": network,
        "tokenize": tokenize,
        "queue": queue,
        "prefill": prefill,
        "decode": decode,
        "detokenize": detokenize,
        "other": other,
    }


@dataclass(frozen=True, slots=True)
class PhaseStats:
    phase: str
    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    share: float  # of the summed client-visible latency of all requests


def phase_breakdown(per_request: Sequence[dict[str, float]], e2e: Sequence[float]) -> list[PhaseStats]:
    """Aggregate :func:`request_phases` results over requests."""
    total = sum(e2e)
    out = []
    for phase in PHASES:
        values = [p[phase] for p in per_request]
        if not values:
            continue
        q = pcts(values, (50, 90, 99))
        s = sum(values)
        out.append(PhaseStats(phase, s / len(values), q["p50"], q["p90"], q["p99"], s / total if total else 0.0))
    return out
