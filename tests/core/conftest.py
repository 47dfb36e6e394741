"""Fixtures for the core: a private TracerProvider with an in-memory exporter per test.

The lifecycle code reads its tracer from ``llmtrace._runtime``; installing a runtime
whose provider is local to the test keeps tests independent of OTel's process-global
provider (which can be set only once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmtrace import _runtime
from llmtrace._otel.export import ExportStats
from llmtrace._otel.histogram import HistogramRegistry
from llmtrace._otel.providers import LLMTraceSampler, Providers
from llmtrace.config import resolve
from llmtrace.lifecycle.builder import BUILDER
from llmtrace.lifecycle.metrics import ServingMetrics


@dataclass
class Captured:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self) -> list[ReadableSpan]:
        BUILDER.flush(10)
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def metrics(self) -> dict[str, Any]:
        BUILDER.flush(10)
        data = self.reader.get_metrics_data()
        found: dict[str, Any] = {}
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    found[metric.name] = metric
        return found


def install_runtime(registry: HistogramRegistry | None = None, **options: Any) -> Captured:
    """*registry*: the serving histograms are llmtrace's aggregated ones, as where ``instrument()``
    owns the MeterProvider (read them from the registry); else SDK instruments on the reader."""
    exporter = InMemorySpanExporter()
    settings = resolve({"exporter": "none", "gpu": "off", **options}, environ={})
    provider = TracerProvider(sampler=LLMTraceSampler(settings.sample_ratio))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    providers = Providers(tracer_provider=provider, meter_provider=meter_provider, owns_tracer_provider=False,
                          owns_meter_provider=False, drops=ExportStats())
    metrics = ServingMetrics(meter_provider.get_meter("test"), providers.drops, registry)
    _runtime.install(_runtime.Runtime(settings=settings, providers=providers, metrics=metrics))
    return Captured(exporter, reader)


@pytest.fixture
def captured() -> Iterator[Captured]:
    yield install_runtime()
    BUILDER.flush(10)
    _runtime.reset()


#: ``runtime_with(**options)`` installs a runtime resolved from *options* (the fixture below).
InstallRuntime = Callable[..., Captured]


@pytest.fixture
def runtime_with() -> Iterator[InstallRuntime]:
    yield install_runtime
    BUILDER.flush(10)
    _runtime.reset()
