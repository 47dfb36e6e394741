"""llmtrace's threads give the GIL back to serving threads while they work."""

from __future__ import annotations

from typing import Any

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


def _finished_spans(count: int) -> list[Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for index in range(count):
        provider.get_tracer("t").start_span(f"s{index}").end()
    return list(exporter.get_finished_spans())


def test_the_python_encoder_pauses_between_spans() -> None:
    """encode_spans_python calls its pause hook once per span (the export thread passes GilYield.maybe)."""
    from llmtrace._otel.otlp_json import encode_spans_python

    spans = _finished_spans(3)
    calls: list[None] = []
    text = encode_spans_python(spans, lambda: calls.append(None))
    assert 3 == len(calls)
    assert text == encode_spans_python(spans)


def test_the_compiled_encoder_pauses_every_few_spans() -> None:
    """The compiled encoder writes a span in ~2 µs: it calls the pause hook every 32 spans, so
    that a 512-span batch still gives the GIL back within the yield interval."""
    from llmtrace._otel.otlp_json import COMPILED, encode_spans_python

    if COMPILED is None:
        pytest.skip("the compiled OTLP/JSON encoder is not in use (llmtrace-native not built: pip install ./native)")
    spans = _finished_spans(100)
    calls: list[None] = []
    text = COMPILED.encode(spans, lambda: calls.append(None))
    assert 3 == len(calls)  # after spans 32, 64 and 96
    assert text == encode_spans_python(spans)
