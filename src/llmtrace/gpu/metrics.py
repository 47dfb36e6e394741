"""GPU metrics: observable instruments named after OTel's ``hw.gpu.*`` conventions.

Every callback reads the sampler's newest :class:`~llmtrace.gpu.sampler.Snapshot` — one
NVML pass feeds every instrument, and no callback ever calls NVML. Each observation
carries ``hw.gpu.id`` (physical index, ``<gpu>:mig<n>`` for MIG), ``hw.gpu.uuid`` and
``hw.gpu.name``. A snapshot older than :data:`STALE_PERIODS` sample periods (sampler
stopped or stuck) is not reported. ``llmtrace.gpu.available`` is 1 while the sampler
reads at least one live device, else 0 — also when there is no sampler at all.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from llmtrace.gpu.devices import GpuDevice
from llmtrace.gpu.sampler import GpuSampler
from llmtrace.semconv import (
    HW_GPU_CLOCK_MEMORY,
    HW_GPU_CLOCK_SM,
    HW_GPU_ECC_UNCORRECTED,
    HW_GPU_ENERGY,
    HW_GPU_ID,
    HW_GPU_MEMORY_LIMIT,
    HW_GPU_MEMORY_USAGE,
    HW_GPU_MEMORY_UTILIZATION,
    HW_GPU_NAME,
    HW_GPU_PCIE_RX,
    HW_GPU_PCIE_TX,
    HW_GPU_PERFORMANCE_STATE,
    HW_GPU_POWER,
    HW_GPU_TEMPERATURE,
    HW_GPU_THROTTLE_REASONS,
    HW_GPU_UTILIZATION,
    HW_GPU_UUID,
    METRIC_GPU_AVAILABLE,
)

__all__ = ["GAUGES", "register_gpu_metrics"]

#: A snapshot older than this many sample periods is not exported (min 2 s).
STALE_PERIODS = 10

#: (name, unit, description) of each observable gauge; the name is also the snapshot key.
GAUGES: tuple[tuple[str, str, str], ...] = (
    (HW_GPU_UTILIZATION, "1", "Fraction of time a kernel was running on the GPU"),
    (HW_GPU_MEMORY_UTILIZATION, "1", "Fraction of time device memory was being read or written"),
    (HW_GPU_MEMORY_USAGE, "By", "Device memory in use"),
    (HW_GPU_MEMORY_LIMIT, "By", "Device memory total"),
    (HW_GPU_POWER, "W", "Power draw"),
    (HW_GPU_TEMPERATURE, "Cel", "GPU die temperature"),
    (HW_GPU_CLOCK_SM, "MHz", "SM clock"),
    (HW_GPU_CLOCK_MEMORY, "MHz", "Memory clock"),
    (HW_GPU_PCIE_TX, "By/s", "PCIe transmit throughput"),
    (HW_GPU_PCIE_RX, "By/s", "PCIe receive throughput"),
    (HW_GPU_THROTTLE_REASONS, "1", "NVML clocks-event (throttle) reason bitmask"),
    (HW_GPU_ECC_UNCORRECTED, "{error}", "Uncorrected ECC errors since the last driver load"),
    (HW_GPU_PERFORMANCE_STATE, "1", "Performance state (0 = maximum)"),
)


class _SnapshotReader:
    """Turns the sampler's newest snapshot into observations for one key."""

    def __init__(self, sampler: GpuSampler | None) -> None:
        self._sampler = sampler
        self._attrs: dict[str, dict[str, str]] = {}

    def use(self, sampler: GpuSampler | None) -> None:
        """Read *sampler* from now on (the devices' labels are read afresh)."""
        self._sampler = sampler
        self._attrs = {}

    def _labels(self, device: GpuDevice) -> dict[str, str]:
        labels = self._attrs.get(device.uuid)
        if labels is None:
            labels = {HW_GPU_ID: device.device_id, HW_GPU_UUID: device.uuid, HW_GPU_NAME: device.name}
            self._attrs[device.uuid] = labels
        return labels

    def observe(self, key: str) -> list[Observation]:
        sampler = self._sampler
        snapshot = sampler.latest() if sampler is not None and sampler.available else None
        if sampler is None or snapshot is None:
            return []
        max_age_ns = max(2.0, STALE_PERIODS * sampler.interval_s) * 1e9
        if time.monotonic_ns() - snapshot.t_ns > max_age_ns:
            return []
        return [Observation(r.values[key], self._labels(r.device)) for r in snapshot.readings if key in r.values]

    def callback(self, key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def _callback(_options: CallbackOptions) -> Iterable[Observation]:
            try:
                return self.observe(key)
            except Exception:  # noqa: BLE001 - a metric export never fails because of the GPU
                return []

        return _callback

    def available(self, _options: CallbackOptions) -> Iterable[Observation]:
        sampler = self._sampler
        return [Observation(1 if sampler is not None and sampler.available else 0)]


def register_gpu_metrics(meter: Meter, sampler: GpuSampler | None) -> list[Any]:
    """Create the ``hw.gpu.*`` instruments and ``llmtrace.gpu.available`` on ``meter``.

    ``sampler`` may be ``None`` (GPU off) or unavailable: then only
    ``llmtrace.gpu.available`` = 0 is reported. ``hw.gpu.energy`` is an observable
    *counter* (the NVML total-energy counter, joules since driver load, is monotonic).
    Returns the instruments. Registered again on the same meter (``uninstrument()`` then
    ``instrument()`` keep the export providers), the instruments are the first registration's,
    now reading *sampler*: the SDK keeps the first instrument of a name on a meter with its
    callbacks, and would ignore new ones.
    """
    found = _registered.get(meter)
    if found is not None:
        found[0].use(sampler)
        return found[1]
    reader = _SnapshotReader(sampler)
    instruments: list[Any] = [
        meter.create_observable_gauge(
            METRIC_GPU_AVAILABLE, [reader.available], "1", "1 while GPU telemetry reads at least one device"
        )
    ]
    for name, unit, description in GAUGES:
        instruments.append(meter.create_observable_gauge(name, [reader.callback(name)], unit, description))
    instruments.append(
        meter.create_observable_counter(
            HW_GPU_ENERGY, [reader.callback(HW_GPU_ENERGY)], "J", "Energy consumed since the driver loaded"
        )
    )
    _registered[meter] = (reader, instruments)
    return instruments


#: The reader and instruments registered on each meter (see :func:`register_gpu_metrics`).
_registered: weakref.WeakKeyDictionary[Meter, tuple[_SnapshotReader, list[Any]]] = weakref.WeakKeyDictionary()
