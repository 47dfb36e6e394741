"""llmtrace's in-process histograms export exactly what the OpenTelemetry SDK's would."""

from __future__ import annotations

import math
import random
import threading
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.resources import Resource

from llmtrace._otel.histogram import (
    MAX_PENDING,
    AggregatedHistogram,
    HistogramRegistry,
    MergingMetricExporter,
    prefers_cumulative,
)

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
NAMES = ("route", "status")


def _attributes(key: Any) -> dict[str, Any]:
    return dict(zip(NAMES, key, strict=True))


def _points(data: MetricsData | None, name: str) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    assert data is not None
    found = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for p in metric.data.data_points:
                        found[tuple(sorted(p.attributes.items()))] = (
                            p.count, round(p.sum, 9), tuple(p.bucket_counts), tuple(p.explicit_bounds), p.min, p.max)
    return found


def test_aggregated_histogram_equals_the_sdk_histogram() -> None:
    """The same measurements — values on bucket bounds included, two attribute sets, negative
    and NaN values (dropped by both) — give the same exported points both ways."""
    rng = random.Random(7)
    values = [*BOUNDS, 0.0, 11.0, -1.0, float("nan"), *(rng.expovariate(3.0) for _ in range(500))]
    keys = [("/v1/completions", 200), ("/health", 503)]
    reader = InMemoryMetricReader()
    sdk = MeterProvider(metric_readers=[reader]).get_meter("t").create_histogram(
        "d", unit="s", explicit_bucket_boundaries_advisory=list(BOUNDS))
    ours = AggregatedHistogram("d", "s", "", BOUNDS, _attributes)
    for index, value in enumerate(values):
        key = keys[index % 2]
        if not math.isnan(value) and value >= 0:  # the SDK logs a warning for the others
            sdk.record(value, _attributes(key))
        ours.record((value, key))
    metric = ours.metric(now_ns=1)
    assert metric is not None
    assert _points(reader.get_metrics_data(), "d") == _points(
        MetricsData(resource_metrics=[_resource_metrics(metric)]), "d")


def _resource_metrics(metric: Any) -> Any:
    from opentelemetry.sdk.metrics.export import ResourceMetrics, ScopeMetrics
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    return ResourceMetrics(resource=Resource.create({}), scope_metrics=[
        ScopeMetrics(scope=InstrumentationScope("t"), metrics=[metric], schema_url="")], schema_url="")


def test_no_measurement_is_lost_to_concurrent_folds() -> None:
    """Four threads record while a fifth keeps folding (as the export thread does): every
    measurement is counted once."""
    ours = AggregatedHistogram("d", "s", "", BOUNDS, _attributes)
    stop = threading.Event()

    def fold() -> None:
        while not stop.is_set():
            ours.fold()

    def record() -> None:
        for _ in range(20_000):
            ours.record((0.02, ("/x", 200)))

    folder = threading.Thread(target=fold)
    folder.start()
    writers = [threading.Thread(target=record) for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    stop.set()
    folder.join()
    metric = ours.metric(now_ns=1)
    assert metric is not None
    assert [80_000] == [p.count for p in metric.data.data_points]
    assert MAX_PENDING > len(ours.pending)


class _Capture(MetricExporter):
    def __init__(self, temporality: AggregationTemporality = AggregationTemporality.CUMULATIVE) -> None:
        from opentelemetry.sdk.metrics import Histogram

        super().__init__(preferred_temporality={Histogram: temporality})
        self.batches: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def test_merging_exporter_adds_the_histogram_to_the_sdks_own_scope() -> None:
    """The SDK's metrics pass through untouched; the aggregated histogram joins llmtrace's scope
    (one scope entry: some encoders key scopes by name)."""
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    registry = HistogramRegistry(Resource.create({"service.name": "s"}))
    ours = registry.add(AggregatedHistogram("http.server.request.duration", "s", "", BOUNDS, _attributes))
    ours.record((0.3, ("/v1/completions", 200)))
    inner = _Capture()
    reader = PeriodicExportingMetricReader(MergingMetricExporter(inner, registry), export_interval_millis=3_600_000)
    provider = MeterProvider(resource=registry.resource, metric_readers=[reader])
    provider.get_meter("llmtrace", registry.scope.version).create_counter("llmtrace.spans.dropped").add(2)
    reader.collect()
    provider.shutdown()
    [scope] = [s for b in inner.batches[:1] for r in b.resource_metrics for s in r.scope_metrics]
    assert ["llmtrace.spans.dropped", "http.server.request.duration"] == [m.name for m in scope.metrics]
    assert {(("route", "/v1/completions"), ("status", 200)): (1, 0.3, (0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0),
                                                              BOUNDS, 0.3, 0.3)} == _points(inner.batches[0],
                                                                                            "http.server.request.duration")


def test_a_delta_exporter_gets_the_sdk_instrument_instead() -> None:
    """Aggregated histograms are cumulative: an exporter that prefers delta is not merged into."""
    assert prefers_cumulative(_Capture())
    assert not prefers_cumulative(_Capture(AggregationTemporality.DELTA))


def test_a_failing_histogram_never_costs_the_sdks_metrics() -> None:
    """A histogram whose attributes cannot be built (a bad key) is left out of the export, counted
    as an internal error; the SDK's own metrics are exported as collected."""
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    registry = HistogramRegistry(Resource.create({}))
    broken = registry.add(AggregatedHistogram("broken", "s", "", BOUNDS, _attributes))
    broken.record((0.1, ("only-one-value",)))  # _attributes needs two
    inner = _Capture()
    reader = PeriodicExportingMetricReader(MergingMetricExporter(inner, registry), export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("app").create_counter("requests").add(1)
    reader.collect()
    provider.shutdown()
    names = [m.name for r in inner.batches[0].resource_metrics for s in r.scope_metrics for m in s.metrics]
    assert ["requests"] == names
