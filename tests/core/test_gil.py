"""llmtrace's threads give the GIL back to serving threads while they work."""

from __future__ import annotations

import pytest

from llmtrace._otel import gil as _gil


def test_a_yield_once_per_interval_of_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """maybe() sleeps (releasing the GIL) only when an interval has passed since the last yield."""
    clock = [0]
    sleeps: list[float] = []
    monkeypatch.setattr("llmtrace._otel.gil.time.perf_counter_ns", lambda: clock[0])
    monkeypatch.setattr("llmtrace._otel.gil.time.sleep", sleeps.append)
    pause = _gil.GilYield(interval_ns=1000)
    for now in (100, 900, 1000, 1500, 1999, 2000, 2001):
        clock[0] = now
        pause.maybe()
    assert [0, 0] == sleeps  # at 1000 and at 2000 (the interval restarts at each yield)


def test_the_file_exporters_encoder_pauses_between_spans() -> None:
    """encode_spans calls its pause hook once per span (the export thread passes GilYield.maybe)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from llmtrace._otel.otlp_json import encode_spans

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for name in ("a", "b", "c"):
        provider.get_tracer("t").start_span(name).end()
    calls: list[None] = []
    text = encode_spans(exporter.get_finished_spans(), lambda: calls.append(None))
    assert 3 == len(calls)
    assert text == encode_spans(exporter.get_finished_spans())
