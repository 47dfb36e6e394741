"""Where a request's serving metrics are recorded: an unsampled request's where it ends (when the
histograms are llmtrace's aggregated ones), a sampled one's by the span builder with its spans."""

from __future__ import annotations

import threading

import pytest
from opentelemetry.sdk.resources import Resource

from llmtrace import semconv, start_request
from llmtrace._otel.histogram import HistogramRegistry
from llmtrace.lifecycle.builder import BUILDER
from tests.core.conftest import InstallRuntime

MS = 1_000_000


def _counts(registry: HistogramRegistry, name: str) -> dict[tuple[tuple[str, object], ...], int]:
    return {tuple(sorted(p.attributes.items())): p.count
            for metric in registry.metrics() if metric.name == name for p in metric.data.data_points}


def test_unsampled_requests_ended_on_many_threads_are_all_counted_at_once(runtime_with: InstallRuntime,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads end 300 unsampled requests each, with prefix-cache hits: every duration, token
    count and cached prompt token is there as soon as the requests ended — nothing went to the span
    builder — and none is lost to the threads' concurrent appends and folds."""
    registry = HistogramRegistry(Resource.create({}))
    captured = runtime_with(registry, sample_ratio=0.0)
    threads, per_thread = 8, 300
    BUILDER.flush(10)
    submitted: list[object] = []
    monkeypatch.setattr(BUILDER, "submit", submitted.append)
    start = threading.Barrier(threads)

    def serve(index: int) -> None:
        start.wait()
        for n in range(per_thread):
            handle = start_request(f"t{index}-{n}", model="tiny", prompt_tokens=10, arrival_ns=0)
            assert not handle.recording
            handle.prompt_cached(4)
            handle.token(at_ns=MS)
            handle.token(at_ns=2 * MS)
            handle.finished(at_ns=3 * MS)

    workers = [threading.Thread(target=serve, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    total = threads * per_thread
    assert [] == submitted
    duration = _counts(registry, semconv.METRIC_REQUEST_DURATION)  # read before any flush()
    assert [total] == list(duration.values())
    assert {"input": total, "output": total} == {dict(k)[semconv.GEN_AI_TOKEN_TYPE]: v
                                                 for k, v in _counts(registry, semconv.METRIC_TOKEN_USAGE).items()}
    assert [total] == list(_counts(registry, semconv.METRIC_TPOT).values())
    points = captured.metrics()[semconv.METRIC_PROMPT_TOKENS].data.data_points
    assert {"computed": 6 * total, "cached": 4 * total} == {p.attributes[semconv.LLM_PROMPT_TOKEN_SOURCE]: p.value
                                                           for p in points}


def test_a_sampled_requests_metrics_come_with_its_spans(runtime_with: InstallRuntime) -> None:
    """A sampled request is recorded by the span builder, from the record its spans are built from."""
    registry = HistogramRegistry(Resource.create({}))
    captured = runtime_with(registry, sample_ratio=1.0)
    handle = start_request("s1", prompt_tokens=3, arrival_ns=0)
    assert handle.recording
    handle.token(at_ns=50 * MS)
    handle.finished(at_ns=61 * MS)
    assert 1 == len(captured.named(semconv.SPAN_REQUEST))  # flushes the builder
    assert [1] == list(_counts(registry, semconv.METRIC_TTFT).values())


def test_sdk_instruments_are_recorded_off_the_request_path(runtime_with: InstallRuntime) -> None:
    """Where the host owns the MeterProvider (SDK instruments: ~13 µs a measurement), even an
    unsampled request's metrics are the span builder's work."""
    captured = runtime_with(sample_ratio=0.0)
    from llmtrace import _runtime

    metrics = _runtime.serving_metrics()
    assert metrics is not None and not metrics.records_inline
    handle = start_request("u1", prompt_tokens=3, arrival_ns=0)
    handle.finished(at_ns=MS)
    assert 1 == captured.metrics()[semconv.METRIC_REQUEST_DURATION].data.data_points[0].count
