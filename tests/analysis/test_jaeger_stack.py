"""The Jaeger source against the real collector + Jaeger test stack (scripts/otel_stack).

Simulated llmtrace traces are exported over OTLP/HTTP into the collector, read back
from Jaeger's /api/v3/traces by :class:`JaegerSource` with a small limit (so windows are
split), and must analyse to the same numbers as the file they came from.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from typing import Any

import pytest

from llmtrace.analysis import analyze, build_traceset, to_json
from llmtrace.analysis.sources import load_spans
from llmtrace.analysis.sources.jaeger import JaegerSource
from llmtrace.analysis.synthetic import SimConfig, simulate

pytestmark = pytest.mark.stack


def _post(endpoint: str, doc: dict[str, Any]) -> None:
    req = urllib.request.Request(
        f"{endpoint}/v1/traces", data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert 200 == resp.status


def test_traces_read_back_from_real_jaeger_analyse_like_the_original(otel_stack: Any) -> None:
    """Same requests, same span count and the same critical-path shares as the exported data."""
    service = f"analysis-{uuid.uuid4().hex[:8]}"
    t0 = time.time_ns() - 20 * 1_000_000_000
    docs = list(simulate(SimConfig(duration_s=2, arrival_rate=6, service=service, t0_ns=t0, window_steps=32)))
    for doc in docs:
        _post(otel_stack.otlp_http_endpoint, doc)
    n_traces = len(docs)
    otel_stack.find_traces(service, timeout_s=60, min_traces=n_traces)

    since, until = t0 - 5_000_000_000, time.time_ns() + 60_000_000_000
    client = JaegerSource(otel_stack.jaeger_query_url, api="v3", limit=4)
    try:
        _, traces = client._fetch(service, since, until)
        assert traces <= 4  # the limit is honoured, so splitting is really exercised
    finally:
        client.close()
    loaded = load_spans(otel_stack.jaeger_query_url, services=[service], since_ns=since, until_ns=until, limit=4)
    got = to_json(analyze(build_traceset(loaded.spans)))

    expected_spans = sum(len(d["resourceSpans"][0]["scopeSpans"][0]["spans"]) for d in docs)
    from llmtrace.analysis.sources.files import ReadStats, spans_from_document
    from llmtrace.analysis.sources.otlp import Interner

    intern, stats = Interner(), ReadStats()
    original = [s for d in docs for s in spans_from_document(d, source="sim", position="-", intern=intern, stats=stats)]
    want = to_json(analyze(build_traceset(original)))
    assert expected_spans == got["source"]["spans"]
    assert want["requests"]["count"] == got["requests"]["count"]
    assert {k: round(v["share"], 6) for k, v in want["critical_path"].items()} == {
        k: round(v["share"], 6) for k, v in got["critical_path"].items()
    }
    assert round(want["gpu_idle"]["dp0"]["ratio"], 6) == round(got["gpu_idle"]["dp0"]["ratio"], 6)

    # The legacy /api/traces (Jaeger JSON model, µs resolution) reads the same traces.
    legacy = load_spans(otel_stack.jaeger_query_url, services=[service], since_ns=since, until_ns=until, api="legacy")
    legacy_summary = to_json(analyze(build_traceset(legacy.spans)))
    assert expected_spans == legacy_summary["source"]["spans"]
    assert want["requests"]["count"] == legacy_summary["requests"]["count"]
