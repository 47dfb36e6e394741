"""Histograms llmtrace aggregates itself, merged into the metric export of the providers it owns.

Recording one measurement through the OpenTelemetry SDK costs ~13 µs of Python here
(a ``Measurement`` object, the exemplar filter, a copy and a hash of the attributes, two
locks) — a tenth of a whole streamed HTTP request's budget for *one* histogram. A metric
that every request records, sampled or not, cannot pay that. :class:`AggregatedHistogram`
folds a measurement into its buckets under one lock (~1 µs), and :class:`MergingMetricExporter`
— which wraps each metric exporter of a MeterProvider llmtrace built — adds the histograms
to every batch the SDK's reader exports, as ordinary cumulative ``Histogram`` points with
the same name, unit, buckets and attributes the SDK instrument would have produced.

Where llmtrace does not own the MeterProvider (the host set one), or an exporter asks for
delta temporality, there is nothing to merge into: :func:`histogram` then returns a plain
SDK instrument behind the same ``record((value, key))`` interface.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Hashable, Mapping, Sequence, Sized
from typing import Any, Protocol

from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from llmtrace._safety import record_error
from llmtrace._version import __version__

#: A measurement's attributes as the recorder keeps them: any hashable value (a flat tuple is
#: cheapest to build per request), turned into attributes only at export.
AttributeKey = Hashable
KeyAttributes = Callable[[Hashable], Mapping[str, Any]]


class HistogramRecorder(Protocol):
    @property
    def record(self) -> Callable[[tuple[float, AttributeKey]], None]:
        """Record one ``(value, key)`` pair. Deliberately one argument: for an aggregated histogram
        this is ``list.append`` itself — no Python frame on the request path."""

    @property
    def pending(self) -> Sized:
        """Measurements recorded and not folded yet (empty where records go straight to the SDK)."""

    def fold(self) -> None: ...


class _Point:
    __slots__ = ("count", "counts", "max", "min", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets
        self.count = 0
        self.sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")


#: Pending measurements an aggregated histogram folds on the recording thread once there are
#: this many (otherwise at each collection). Small, so that a pending ``(value, key)`` pair dies
#: young: with 4,096, the pairs of every request outlived the garbage collector's youngest
#: generation and set off its collections, full ones included (aiohttp streamed request: ~2.8
#: net allocations and ~13k instructions per request, against ~1k for folding on the spot).
MAX_PENDING = 64


class AggregatedHistogram:
    """A cumulative explicit-bucket histogram, aggregated in-process (OTel's bucket rule:
    bucket *i* holds ``bounds[i-1] < value <= bounds[i]``).

    ``record((value, key))`` appends to a list (atomic under the GIL, no lock, no frame); the
    pending pairs are folded into the buckets when the exporter collects, or by the recording
    thread when :data:`MAX_PENDING` of them wait.
    """

    def __init__(self, name: str, unit: str, description: str, bounds: Sequence[float],
                 attributes_of: KeyAttributes) -> None:
        self.name = name
        self.attributes_of = attributes_of
        self.unit = unit
        self.description = description
        self.bounds = tuple(float(b) for b in bounds)
        self.start_ns = time.time_ns()
        self._points: dict[AttributeKey, _Point] = {}
        self._lock = threading.Lock()
        self.pending: list[tuple[float, AttributeKey]] = []
        self.record = self.pending.append

    def fold(self) -> None:
        """Move the pending measurements into the buckets (any thread)."""
        with self._lock:
            # Recorders only ever append: the first n items are exactly the ones copied here, and
            # each of the two steps is one operation under the GIL, so no measurement is lost.
            count = len(self.pending)
            pending = self.pending[:count]
            del self.pending[:count]
            points, bounds, buckets = self._points, self.bounds, len(self.bounds) + 1
            for value, key in pending:
                if not value >= 0.0:  # negative or NaN: the SDK drops these too
                    continue
                point = points.get(key)
                if point is None:
                    point = points[key] = _Point(buckets)
                point.counts[bisect_left(bounds, value)] += 1
                point.count += 1
                point.sum += value
                # Comparisons, not min()/max(): two calls per measurement saved.
                if value < point.min:  # noqa: PLR1730
                    point.min = value
                if value > point.max:  # noqa: PLR1730
                    point.max = value

    def metric(self, now_ns: int) -> Metric | None:
        """The cumulative points so far, as the SDK would export them; None before any record."""
        self.fold()
        with self._lock:
            points = [HistogramDataPoint(attributes=dict(self.attributes_of(key)), start_time_unix_nano=self.start_ns,
                                         time_unix_nano=now_ns, count=p.count, sum=p.sum,
                                         bucket_counts=tuple(p.counts), explicit_bounds=self.bounds,
                                         min=p.min, max=p.max)
                      for key, p in self._points.items()]
        if not points:
            return None
        return Metric(name=self.name, description=self.description, unit=self.unit,
                      data=Histogram(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE))


class _SdkHistogram:
    """The fallback: the same interface over an SDK (or any API) histogram instrument."""

    def __init__(self, instrument: Any, attributes_of: KeyAttributes) -> None:
        self._instrument = instrument
        self._attributes_of = attributes_of

    def record(self, measurement: tuple[float, AttributeKey]) -> None:
        self._instrument.record(measurement[0], dict(self._attributes_of(measurement[1])))

    pending: Sized = ()

    def fold(self) -> None:
        return None


class HistogramRegistry:
    """The aggregated histograms of one MeterProvider that llmtrace owns; its exporters read them."""

    def __init__(self, resource: Resource) -> None:
        self.resource = resource
        self.scope = InstrumentationScope("llmtrace", __version__)
        self._histograms: list[AggregatedHistogram] = []
        self._lock = threading.Lock()

    def add(self, histogram: AggregatedHistogram) -> AggregatedHistogram:
        with self._lock:
            existing = [h for h in self._histograms if h.name == histogram.name]
            if existing:  # instrument() again after uninstrument(): keep counting in the same stream
                return existing[0]
            self._histograms.append(histogram)
        return histogram

    def metrics(self) -> list[Metric]:
        now = time.time_ns()
        with self._lock:
            histograms = list(self._histograms)
        return [m for h in histograms if (m := h.metric(now)) is not None]


def histogram(meter: Meter, registry: HistogramRegistry | None, name: str, unit: str, description: str,
              bounds: Sequence[float], attributes_of: KeyAttributes) -> HistogramRecorder:
    """An aggregated histogram when *registry* (llmtrace's own, cumulative export) is given,
    else an SDK instrument with the same buckets as advice. Records take a key;
    *attributes_of* turns a key into its attributes."""
    if registry is not None:
        return registry.add(AggregatedHistogram(name, unit, description, bounds, attributes_of))
    try:
        instrument = meter.create_histogram(name, unit=unit, description=description,
                                            explicit_bucket_boundaries_advisory=list(bounds))
    except TypeError:  # an OTel API older than the bucket advice
        instrument = meter.create_histogram(name, unit=unit, description=description)
    return _SdkHistogram(instrument, attributes_of)


def prefers_cumulative(exporter: MetricExporter) -> bool:
    preferred: Mapping[type, AggregationTemporality] = getattr(exporter, "_preferred_temporality", None) or {}
    return preferred.get(SdkHistogram, AggregationTemporality.CUMULATIVE) is AggregationTemporality.CUMULATIVE


class MergingMetricExporter(MetricExporter):
    """Exports what the SDK collected plus the registry's aggregated histograms."""

    def __init__(self, inner: MetricExporter, registry: HistogramRegistry) -> None:
        super().__init__(preferred_temporality=getattr(inner, "_preferred_temporality", None),
                         preferred_aggregation=getattr(inner, "_preferred_aggregation", None))
        self._inner = inner
        self._registry = registry

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        try:
            merged = self._merged(metrics_data)
        except Exception as exc:  # noqa: BLE001 - llmtrace's histograms must never cost the SDK's metrics
            record_error("metrics.merge", exc)
            merged = metrics_data
        return self._inner.export(merged, timeout_millis=timeout_millis, **kwargs)

    def _merged(self, metrics_data: MetricsData) -> MetricsData:
        ours = self._registry.metrics()
        if not ours:
            return metrics_data
        scope = self._registry.scope
        resource_metrics = list(metrics_data.resource_metrics)
        if resource_metrics:
            first = resource_metrics[0]
            # Into llmtrace's own scope when the SDK exported one: one scope, one entry.
            scopes = [ScopeMetrics(scope=s.scope, metrics=[*s.metrics, *ours], schema_url=s.schema_url)
                      if _same_scope(s.scope, scope) else s for s in first.scope_metrics]
            if not any(_same_scope(s.scope, scope) for s in first.scope_metrics):
                scopes.append(ScopeMetrics(scope=scope, metrics=ours, schema_url=""))
            resource_metrics[0] = ResourceMetrics(resource=first.resource, scope_metrics=scopes,
                                                  schema_url=first.schema_url)
        else:
            scope_metrics = ScopeMetrics(scope=scope, metrics=ours, schema_url="")
            resource_metrics = [ResourceMetrics(resource=self._registry.resource, scope_metrics=[scope_metrics],
                                                schema_url="")]
        return MetricsData(resource_metrics=resource_metrics)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _same_scope(a: InstrumentationScope, b: InstrumentationScope) -> bool:
    return a.name == b.name and a.version == b.version
