"""What one NVML pass reads per device, and the OTel names and units each value gets.

Each query is one backend call (two values for utilisation and memory). ``slow``
queries run every ``slow_every``-th pass only (1 Hz by default): ``nvmlDeviceGetPcieThroughput``
samples the bus for ~20 ms inside the call; temperature moves on a scale of seconds; the
memory clock, P-state and ECC counters change rarely. Between slow passes their last value
stands (spans still aggregate them). Per pass and device: 6 NVML calls, 12 on a slow pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmtrace.gpu.backend import NvmlBackend
from llmtrace.semconv import (
    HW_GPU_CLOCK_MEMORY,
    HW_GPU_CLOCK_SM,
    HW_GPU_ECC_UNCORRECTED,
    HW_GPU_ENERGY,
    HW_GPU_MEMORY_LIMIT,
    HW_GPU_MEMORY_USAGE,
    HW_GPU_MEMORY_UTILIZATION,
    HW_GPU_PCIE_RX,
    HW_GPU_PCIE_TX,
    HW_GPU_PERFORMANCE_STATE,
    HW_GPU_POWER,
    HW_GPU_TEMPERATURE,
    HW_GPU_THROTTLE_REASONS,
    HW_GPU_UTILIZATION,
)

__all__ = ["QUERIES", "SPAN_ADDITIVE", "SPAN_KEYS", "Query"]

#: NVML reports PCIe throughput in KB/s (1 KB = 1024 B in NVML's headers).
_KIB = 1024


@dataclass(frozen=True)
class Query:
    name: str  # stable name used in logs, status and the doctor
    keys: tuple[str, ...]  # the hw.gpu.* values it yields
    read: Callable[[NvmlBackend, object], dict[str, float]]
    slow: bool = False


def _utilization(b: NvmlBackend, h: object) -> dict[str, float]:
    gpu, mem = b.utilization(h)
    return {HW_GPU_UTILIZATION: gpu / 100.0, HW_GPU_MEMORY_UTILIZATION: mem / 100.0}


def _memory(b: NvmlBackend, h: object) -> dict[str, float]:
    used, total = b.memory(h)
    return {HW_GPU_MEMORY_USAGE: float(used), HW_GPU_MEMORY_LIMIT: float(total)}


QUERIES: tuple[Query, ...] = (
    Query("utilization", (HW_GPU_UTILIZATION, HW_GPU_MEMORY_UTILIZATION), _utilization),
    Query("memory", (HW_GPU_MEMORY_USAGE, HW_GPU_MEMORY_LIMIT), _memory),
    Query("power", (HW_GPU_POWER,), lambda b, h: {HW_GPU_POWER: b.power_mw(h) / 1000.0}),
    Query("energy", (HW_GPU_ENERGY,), lambda b, h: {HW_GPU_ENERGY: b.energy_mj(h) / 1000.0}),
    Query(
        "temperature",
        (HW_GPU_TEMPERATURE,),
        lambda b, h: {HW_GPU_TEMPERATURE: float(b.temperature_c(h))},
        True,
    ),
    Query("clock_sm", (HW_GPU_CLOCK_SM,), lambda b, h: {HW_GPU_CLOCK_SM: float(b.clock_sm_mhz(h))}),
    Query(
        "clock_memory",
        (HW_GPU_CLOCK_MEMORY,),
        lambda b, h: {HW_GPU_CLOCK_MEMORY: float(b.clock_memory_mhz(h))},
        True,
    ),
    Query(
        "throttle_reasons",
        (HW_GPU_THROTTLE_REASONS,),
        lambda b, h: {HW_GPU_THROTTLE_REASONS: float(b.throttle_reasons(h))},
    ),
    Query("pcie_tx", (HW_GPU_PCIE_TX,), lambda b, h: {HW_GPU_PCIE_TX: float(b.pcie_tx_kbps(h) * _KIB)}, True),
    Query("pcie_rx", (HW_GPU_PCIE_RX,), lambda b, h: {HW_GPU_PCIE_RX: float(b.pcie_rx_kbps(h) * _KIB)}, True),
    Query(
        "ecc_uncorrected",
        (HW_GPU_ECC_UNCORRECTED,),
        lambda b, h: {HW_GPU_ECC_UNCORRECTED: float(b.ecc_uncorrected(h))},
        True,
    ),
    Query(
        "performance_state",
        (HW_GPU_PERFORMANCE_STATE,),
        lambda b, h: {HW_GPU_PERFORMANCE_STATE: float(b.performance_state(h))},
        True,
    ),
)

#: Quantities aggregated onto spans (``.mean``/``.max`` or the plain nearest value).
SPAN_KEYS: tuple[str, ...] = (
    HW_GPU_UTILIZATION,
    HW_GPU_MEMORY_UTILIZATION,
    HW_GPU_MEMORY_USAGE,
    HW_GPU_POWER,
    HW_GPU_TEMPERATURE,
    HW_GPU_CLOCK_SM,
)
#: Of those, the ones a device group sums (bytes held, watts drawn) instead of averaging.
SPAN_ADDITIVE: frozenset[str] = frozenset({HW_GPU_MEMORY_USAGE, HW_GPU_POWER})
