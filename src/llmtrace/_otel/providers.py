"""OpenTelemetry providers: build ours, or join the host's.

If the host already set a global SDK TracerProvider / MeterProvider (vLLM and
SGLang do), llmtrace uses it instead of replacing it; an exporter that the user
configured *explicitly* for llmtrace is then added to the host's provider.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import PROCESS_PID, SERVICE_INSTANCE_ID, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)

from llmtrace import semconv
from llmtrace._os_thread import name_sdk_threads
from llmtrace._otel.export import (
    BoundedSpanProcessor,
    ExportStats,
    JsonLinesMetricExporter,
    JsonLinesSpanExporter,
    OtlpHttpJsonMetricExporter,
    OtlpHttpJsonSpanExporter,
    open_sink,
)
from llmtrace._otel.histogram import HistogramRegistry, MergingMetricExporter, prefers_cumulative
from llmtrace._otel.ids import PrivateRandomIdGenerator
from llmtrace._otel.spill_export import Spiller, log_summary, with_spill
from llmtrace._version import __version__
from llmtrace.config import Settings

log = logging.getLogger("llmtrace")


class LLMTraceSampler(Sampler):
    """Parent-based request sampling; ``llm.engine`` window roots always pass.

    Engine windows are sampled by llmtrace itself (``engine_sample_ratio``)
    before any span exists, so a window is either recorded whole or costs nothing.
    """

    def __init__(self, ratio: float) -> None:
        root = TraceIdRatioBased(ratio)
        self._requests = ParentBased(root)
        self._ratio = ratio
        #: A trace with no parent is sampled when ``trace_id & TRACE_ID_LIMIT < root_bound``: the
        #: decision :meth:`should_sample` makes, read directly by llmtrace's own SERVER span
        #: (lifecycle/emit.py) without building its result objects, once per HTTP call.
        self.root_bound = root.bound

    def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                      attributes: Any = None, links: Any = None, trace_state: Any = None) -> SamplingResult:
        if name == semconv.SPAN_ENGINE:
            return ALWAYS_ON.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)
        return self._requests.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"LLMTraceSampler(requests={self._ratio})"


@dataclass
class Providers:
    """What :func:`setup` built or joined; ``owned`` ones are shut down by llmtrace."""

    tracer_provider: Any
    meter_provider: Any
    owns_tracer_provider: bool
    owns_meter_provider: bool
    drops: ExportStats
    processors: list[SpanProcessor] = field(default_factory=list)
    readers: list[MetricReader] = field(default_factory=list)
    #: llmtrace's in-process histograms, merged into each export of an owned MeterProvider
    #: (None: the host's provider, or a delta exporter — histograms go through the SDK).
    histograms: HistogramRegistry | None = None


def _host_provider(current: Any, sdk_type: type) -> Any | None:
    return current if isinstance(current, sdk_type) else None


_DEFAULT_HTTP_ENDPOINT = "http://localhost:4318"


def _otlp_endpoint(settings: Settings, signal: str) -> str | None:
    endpoint = settings.endpoint
    if endpoint is None:
        return None
    if settings.protocol.startswith("http/"):
        # The base URL gets the signal's path; a URL already naming one signal's path (a user
        # pasting their traces URL) is rebased, so metrics do not go to ".../v1/traces/v1/metrics".
        base = endpoint.rstrip("/")
        for known in ("/v1/traces", "/v1/metrics"):
            base = base.removesuffix(known)
        return base + f"/v1/{signal}"
    return endpoint


def _span_exporter(settings: Settings, kind: str) -> tuple[SpanExporter, str]:
    if kind == "console":
        return ConsoleSpanExporter(out=sys.stderr), "console"
    if kind.startswith("file:"):
        return JsonLinesSpanExporter(open_sink(kind[5:])), kind[5:]
    endpoint = _otlp_endpoint(settings, "traces")
    headers = settings.headers or None
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        insecure = endpoint is not None and endpoint.startswith("http://")
        return Grpc(endpoint=endpoint, headers=headers, insecure=insecure or None, timeout=5), endpoint or "otlp"
    if settings.protocol == "http/json":
        endpoint = endpoint or _DEFAULT_HTTP_ENDPOINT + "/v1/traces"  # the OTLP spec's default
        return OtlpHttpJsonSpanExporter(endpoint, headers, timeout_s=5), endpoint
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http(endpoint=endpoint, headers=headers, timeout=5), endpoint or "otlp"


def _metric_exporter(settings: Settings, kind: str) -> MetricExporter:
    if kind == "console":
        return ConsoleMetricExporter(out=sys.stderr)
    if kind.startswith("file:"):
        return JsonLinesMetricExporter(open_sink(kind[5:]))
    endpoint = _otlp_endpoint(settings, "metrics")
    headers = settings.headers or None
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as Grpc

        insecure = endpoint is not None and endpoint.startswith("http://")
        return Grpc(endpoint=endpoint, headers=headers, insecure=insecure or None, timeout=5)
    if settings.protocol == "http/json":
        return OtlpHttpJsonMetricExporter(endpoint or _DEFAULT_HTTP_ENDPOINT + "/v1/metrics", headers, timeout_s=5)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as Http

    return Http(endpoint=endpoint, headers=headers, timeout=5)


#: (pid, service.instance.id) of the process that drew the id: a fork draws a new one.
_instance_id: tuple[int, str] = (0, "")


def _process_identity() -> dict[str, Any]:
    """``process.pid`` and ``service.instance.id`` of this process, which tell apart the API
    server and engine processes of one service. The instance id is a random UUID v4 per
    process, as the OTel resource conventions recommend; a value set in
    ``OTEL_RESOURCE_ATTRIBUTES`` wins over either."""
    global _instance_id
    pid = os.getpid()
    if _instance_id[0] != pid:
        _instance_id = (pid, str(uuid.uuid4()))
    user = OTELResourceDetector().detect().attributes
    return {key: user.get(key, value) for key, value in ((PROCESS_PID, pid), (SERVICE_INSTANCE_ID, _instance_id[1]))}


def resource_for(settings: Settings) -> Resource:
    # Resource.create merges OTEL_RESOURCE_ATTRIBUTES; our explicit keys win (the process
    # identity carries the user's values itself).
    return Resource.create({
        **_process_identity(),
        "service.name": settings.service_name,
        semconv.LLMTRACE_VERSION_ATTR: __version__,
        semconv.LLMTRACE_PROCESS_ROLE: settings.process_role,
        "telemetry.distro.name": "llmtrace",
    })


def _resource_of(provider: Any) -> Resource | None:
    if isinstance(provider, TracerProvider):
        return provider.resource
    config = getattr(provider, "_sdk_config", None)  # MeterProvider has no public accessor
    return getattr(config, "resource", None)


def _renew_identity_after_fork(*providers: Any) -> None:
    """Give a forked child (an engine forked from the API server) its own ``process.pid`` and
    ``service.instance.id`` on the resources of *providers*.

    The child keeps the parent's providers (``instrument()`` there reuses them), and tracers,
    the meter state and the span builder's emitters each hold the resource object itself, so
    the objects are rewritten in place: the ones built here and the ones the providers hold
    now. Registered once the providers exist, so that it runs after the SDK's own fork hooks,
    which in recent SDKs merge a fresh ``service.instance.id`` over the user's.
    """
    if not hasattr(os, "register_at_fork"):
        return
    owned = [weakref.ref(provider) for provider in providers]
    built = [weakref.ref(resource) for provider in providers if (resource := _resource_of(provider)) is not None]

    def after_in_child() -> None:
        try:
            identity = _process_identity()
            now = [_resource_of(provider) for ref in owned if (provider := ref()) is not None]
            resources = {id(r): r for r in (*now, *(ref() for ref in built)) if r is not None}
            for resource in resources.values():
                # Resource is immutable through its API; its one attribute map is replaced.
                resource._attributes = Resource({**resource.attributes, **identity})._attributes
        except Exception as exc:  # noqa: BLE001 - a fork hook must never break the child
            log.warning("llmtrace: could not renew the resource's process identity after fork: %r", exc)

    os.register_at_fork(after_in_child=after_in_child)


class _FirstOnly(logging.Filter):
    """Lets an OTel exporter logger's first warning through and counts the repeats.

    Against an unreachable collector the OTLP exporters log every retry; llmtrace
    already says once that spans are being dropped (and counts them).
    """

    def __init__(self) -> None:
        super().__init__()
        self.suppressed = 0
        self._seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and not self._seen:
            self._seen = True
            return True
        if record.levelno < logging.WARNING:
            return True
        if self._seen:
            self.suppressed += 1
            return False
        self._seen = True
        return True


_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.sdk._shared_internal",
)


def _quiet_exporter_retries() -> None:
    for name in _EXPORTER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _FirstOnly) for f in logger.filters):
            logger.addFilter(_FirstOnly())


def setup(settings: Settings, explicit_exporter: bool) -> Providers:
    """Build (or join) the tracer and meter providers for *settings*."""
    threads_before = threading.enumerate()
    drops = ExportStats()
    _quiet_exporter_retries()
    host_tp = _host_provider(trace.get_tracer_provider(), TracerProvider)
    host_mp = _host_provider(metrics.get_meter_provider(), MeterProvider)
    processors: list[SpanProcessor] = []
    if host_tp is None or explicit_exporter:
        for kind in settings.exporters:
            exporter, name = _span_exporter(settings, kind)
            processor: SpanProcessor
            if kind == "console":
                processor = SimpleSpanProcessor(exporter)
            elif kind == "otlp" and (spilling := with_spill(exporter, settings, drops)) is not None:
                breaker, spiller = spilling
                processor = BoundedSpanProcessor(breaker, drops, settings.max_queue_size, name,
                                                 settings.max_queue_bytes, spiller, settings.span_export_interval_s)
            else:
                processor = BoundedSpanProcessor(exporter, drops, settings.max_queue_size, name,
                                                 settings.max_queue_bytes, interval_s=settings.span_export_interval_s)
            processors.append(processor)
    if host_tp is None:
        sampler = LLMTraceSampler(settings.sample_ratio)
        tracer_provider: Any = TracerProvider(resource=resource_for(settings), sampler=sampler,
                                              id_generator=PrivateRandomIdGenerator())
        trace.set_tracer_provider(tracer_provider)
    else:
        tracer_provider = host_tp
        log.info("llmtrace: joining the host application's TracerProvider")
    for processor in processors:
        tracer_provider.add_span_processor(processor)

    readers: list[MetricReader] = []
    meter_provider: Any = host_mp
    histograms: HistogramRegistry | None = None
    if host_mp is None:
        resource = resource_for(settings)
        exporters = [_metric_exporter(settings, kind) for kind in (settings.exporters if settings.metrics else [])]
        if all(prefers_cumulative(exporter) for exporter in exporters):
            histograms = HistogramRegistry(resource)
            exporters = [MergingMetricExporter(exporter, histograms) for exporter in exporters]
        interval_ms = settings.metrics_interval_s * 1000
        readers = [PeriodicExportingMetricReader(exporter, export_interval_millis=interval_ms)
                   for exporter in exporters]
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(meter_provider)
    _renew_identity_after_fork(*([tracer_provider] if host_tp is None else []),
                               *([meter_provider] if host_mp is None else []))
    name_sdk_threads(threads_before)  # the exporters' threads, as `top -H` and /proc show them
    return Providers(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        owns_tracer_provider=host_tp is None,
        owns_meter_provider=host_mp is None,
        drops=drops,
        processors=processors,
        readers=readers,
        histograms=histograms,
    )


def _bounded(work: Any, timeout_s: float) -> bool:
    """Run *work* on a helper thread and wait at most *timeout_s*: OTel's flushes retry past
    their own timeouts against a dead collector, and the host's shutdown must not wait for that."""
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(bool(work())), name="llmtrace-flush", daemon=True)
    worker.start()
    worker.join(max(0.0, timeout_s))
    return bool(result and result[0])


def _millis_left(timeout_s: float) -> Any:
    """A function giving the milliseconds left until *timeout_s* from now (at least 1)."""
    deadline = time.monotonic() + timeout_s
    return lambda: max(1, int((deadline - time.monotonic()) * 1000))


def flush(providers: Providers, timeout_s: float) -> bool:
    left_ms = _millis_left(timeout_s)
    ok = True
    for processor in providers.processors:
        ok = processor.force_flush(left_ms()) and ok
    if providers.owns_meter_provider:
        ok = _bounded(lambda: providers.meter_provider.force_flush(left_ms()), left_ms() / 1000) and ok
    return ok


def shutdown(providers: Providers, timeout_s: float) -> bool:
    """Flush for most of *timeout_s*, then close with what is left; late spans are dropped and counted."""
    left_ms = _millis_left(timeout_s)
    ok = flush(providers, timeout_s * 0.8)
    for processor in providers.processors:
        if isinstance(processor, BoundedSpanProcessor):
            processor.close(left_ms())
        else:
            processor.shutdown()
    if providers.owns_meter_provider:
        _bounded(lambda: providers.meter_provider.shutdown(timeout_millis=left_ms()) or True, left_ms() / 1000)
    log_summary(providers.drops, [p.spill for p in providers.processors
                                  if isinstance(p, BoundedSpanProcessor) and isinstance(p.spill, Spiller)])
    return ok
