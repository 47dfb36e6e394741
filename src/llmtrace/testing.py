"""In-memory capture of llmtrace's spans and metrics, for your own tests.

::

    import llmtrace.testing

    def test_my_server():
        with llmtrace.testing.capture() as captured:
            call_my_handler()
        request = captured.one("llm.request")
        assert request.attributes["gen_ai.usage.output_tokens"] == 8

or, with pytest, ``pytest_plugins = ["llmtrace.testing"]`` and the
``llmtrace_capture`` fixture.

OpenTelemetry allows one global TracerProvider per process, so the first capture
installs an SDK provider (or joins the one already set) with a switchable
in-memory exporter and an ``InMemoryMetricReader``; every capture after that
reuses them. Spans are collected only while a capture is open.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ["CapturedTelemetry", "capture", "llmtrace_capture", "metric_points"]


class _Switch(SpanProcessor):
    """Forwards ended spans to the in-memory exporter only while a capture is open."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter
        self.inner = SimpleSpanProcessor(exporter)
        self.active = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.active:
            self.inner.on_end(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class _Shared:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.switch = _Switch(self.exporter)
        self.reader: InMemoryMetricReader | None = None


_lock = threading.Lock()
_shared: _Shared | None = None


def _install() -> _Shared:
    global _shared
    with _lock:
        if _shared is not None:
            return _shared
        shared = _Shared()
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(shared.switch)
        meter_provider = metrics.get_meter_provider()
        if not isinstance(meter_provider, MeterProvider):
            shared.reader = InMemoryMetricReader()
            metrics.set_meter_provider(MeterProvider(metric_readers=[shared.reader]))
        _shared = shared
        return shared


class CapturedTelemetry:
    """What a :func:`capture` collected; :attr:`spans` is filled when the block exits."""

    def __init__(self, shared: _Shared) -> None:
        self._shared = shared
        self.spans: list[ReadableSpan] = []

    def collect(self) -> list[ReadableSpan]:
        """Flush llmtrace and return every span ended so far in this capture."""
        import llmtrace

        llmtrace.flush()
        self.spans = list(self._shared.exporter.get_finished_spans())
        return self.spans

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans if span.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        if len(found) != 1:
            raise AssertionError(f"expected one {name!r} span, found {len(found)}: {[s.name for s in self.spans]}")
        return found[0]

    def children(self, parent: ReadableSpan, name: str | None = None) -> list[ReadableSpan]:
        parent_id = parent.context.span_id if parent.context is not None else None
        return [span for span in self.spans
                if span.parent is not None and span.parent.span_id == parent_id and (name is None or span.name == name)]

    def metrics(self) -> dict[str, list[Any]]:
        """Metric name -> data points (only when this module installed the MeterProvider)."""
        import llmtrace

        llmtrace.flush()
        return metric_points(self._shared.reader)


def metric_points(reader: InMemoryMetricReader | None) -> dict[str, list[Any]]:
    if reader is None:
        return {}
    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    if data is None:
        return points
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    return points


@contextmanager
def capture(*, instrument: bool = True, **options: Any) -> Iterator[CapturedTelemetry]:
    """Instrument with *options* (exporter ``none``), collect spans in memory, then uninstrument.

    If llmtrace was already instrumented, it is left as it was and *options* are ignored.
    ``instrument=False`` only collects (to check that something is *not* traced).
    """
    import llmtrace
    from llmtrace import _instrument

    shared = _install()
    owned = instrument and _instrument.current() is None
    if owned:
        llmtrace.instrument(exporter="none", gpu=options.pop("gpu", "off"), **options)
    llmtrace.flush()
    shared.exporter.clear()
    shared.switch.active = True
    captured = CapturedTelemetry(shared)
    try:
        yield captured
    finally:
        captured.collect()
        shared.switch.active = False
        shared.exporter.clear()
        if owned:
            llmtrace.uninstrument()


try:  # the pytest fixture, when pytest is there
    import pytest

    @pytest.fixture
    def llmtrace_capture() -> Iterator[CapturedTelemetry]:
        """llmtrace instrumented for one test, its spans captured in memory."""
        with capture() as captured:
            yield captured

except ImportError:  # pragma: no cover - pytest is optional
    pass
