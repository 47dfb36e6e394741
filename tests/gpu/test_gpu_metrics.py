"""GPU metrics read the sampler's newest snapshot, through the real OTel SDK
(``InMemoryMetricReader``). Device values come from the one test double,
``RecordedBackend`` (gpu_recorded.py), replayed through the NVML seam.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from llmtrace.gpu.metrics import GAUGES, register_gpu_metrics
from llmtrace.gpu.sampler import GpuSampler, SamplerState
from llmtrace.semconv import (
    HW_GPU_ENERGY,
    HW_GPU_ID,
    HW_GPU_NAME,
    HW_GPU_POWER,
    HW_GPU_UTILIZATION,
    HW_GPU_UUID,
    METRIC_GPU_AVAILABLE,
)
from tests.gpu.gpu_recorded import RecordedBackend, inventory


def _collect(sampler: GpuSampler | None) -> dict[str, list[tuple[dict[str, Any], float]]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    register_gpu_metrics(provider.get_meter("test"), sampler)
    data = reader.get_metrics_data()
    out: dict[str, list[tuple[dict[str, Any], float]]] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points: list[Any] = list(metric.data.data_points)
                out[metric.name] = [(dict(p.attributes or {}), p.value) for p in points]
    provider.shutdown()
    return out


class _CountingBackend(RecordedBackend):
    def __init__(self) -> None:
        super().__init__()
        self.query_calls = 0

    def _value(self, handle: Any, method: str) -> Any:
        self.query_calls += 1
        return super()._value(handle, method)


def _running(backend: RecordedBackend, visible: str = "0,1") -> GpuSampler:
    sampler = GpuSampler(0.1, backend=backend, environ={"CUDA_VISIBLE_DEVICES": visible}, clock=time.monotonic_ns)
    assert sampler.open()
    sampler._state = SamplerState.RUNNING  # passes driven by the test
    sampler.sample_once()
    return sampler


def test_every_instrument_reads_the_one_snapshot_without_calling_nvml() -> None:
    """A collection reports each hw.gpu.* value of the latest pass per device, and makes no NVML call."""
    backend = _CountingBackend()
    sampler = _running(backend)
    calls = backend.query_calls
    metrics = _collect(sampler)
    assert calls == backend.query_calls
    latest = sampler.latest()
    assert latest is not None
    for reading in latest.readings:
        labels = {
            HW_GPU_ID: reading.device.device_id,
            HW_GPU_UUID: reading.device.uuid,
            HW_GPU_NAME: "NVIDIA H200",
        }
        for name in (HW_GPU_UTILIZATION, HW_GPU_POWER, HW_GPU_ENERGY):
            assert (labels, reading.values[name]) in metrics[name]
    assert [({}, 1)] == metrics[METRIC_GPU_AVAILABLE]
    assert {name for name, _u, _d in GAUGES} <= set(metrics)


def test_lost_device_drops_out_of_metrics() -> None:
    """After a device is lost, only the live one is observed; available stays 1."""
    backend = RecordedBackend()
    sampler = _running(backend)
    backend.lost.add(1)
    sampler.sample_once()
    metrics = _collect(sampler)
    assert ["0"] == [attrs[HW_GPU_ID] for attrs, _v in metrics[HW_GPU_POWER]]
    assert [({}, 1)] == metrics[METRIC_GPU_AVAILABLE]


def test_no_sampler_or_unavailable_reports_available_zero_only() -> None:
    """GPU off (None) or no device: llmtrace.gpu.available = 0 and no hw.gpu.* points."""
    for sampler in (None, GpuSampler(backend=RecordedBackend(inventory([])))):
        if sampler is not None:
            sampler.open()
        metrics = _collect(sampler)
        assert [({}, 0)] == metrics[METRIC_GPU_AVAILABLE]
        assert all(not points for name, points in metrics.items() if name != METRIC_GPU_AVAILABLE)


def test_stopped_sampler_reports_nothing_stale() -> None:
    """Once stopped, the old snapshot is not exported and available = 0."""
    sampler = _running(RecordedBackend())
    sampler.stop()
    metrics = _collect(sampler)
    assert [({}, 0)] == metrics[METRIC_GPU_AVAILABLE]
    assert [] == metrics.get(HW_GPU_POWER, [])


def test_registering_again_on_the_same_meter_reads_the_new_sampler() -> None:
    """A re-instrument registers the GPU metrics again on the same meter: the SDK would ignore new
    instruments of the same names, so the first registration's now read the new sampler (the
    first sampler is gone: availability and devices are the second's)."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("test")
    first = register_gpu_metrics(meter, None)
    again = register_gpu_metrics(meter, _running(RecordedBackend()))
    data = reader.get_metrics_data()
    found = {metric.name: list(metric.data.data_points) for rm in data.resource_metrics if data
             for sm in rm.scope_metrics for metric in sm.metrics}
    provider.shutdown()
    assert first is again
    assert [1] == [point.value for point in found[METRIC_GPU_AVAILABLE]]
    assert 2 == len(found[HW_GPU_UTILIZATION])
