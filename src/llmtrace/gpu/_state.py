"""The sampler's data: what it stores per device, and the pure logic that reads it.

Kept apart from :mod:`llmtrace.gpu.sampler` (thread, NVML, fork) so that every
function here is plain computation over :class:`DeviceState` / :class:`Series`.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmtrace.gpu._queries import SPAN_ADDITIVE, SPAN_KEYS
from llmtrace.gpu._window import Series
from llmtrace.gpu.backend import Unavailable
from llmtrace.gpu.devices import GpuDevice
from llmtrace.semconv import HW_GPU_ENERGY, HW_GPU_ID, HW_GPU_MEMORY_LIMIT, HW_GPU_POWER

_log = logging.getLogger("llmtrace.gpu")

#: A nearest snapshot further than this many periods from a short span is stale (sampler
#: stalled, device lost) and is not attached.
STALE_PERIODS = 2

Attrs = dict[str, float | int | str]


class SamplerState(enum.Enum):
    NOT_STARTED = "not_started"
    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class DeviceReading:
    """One device's values in one pass, keyed by ``hw.gpu.*`` name, in OTel units."""

    device: GpuDevice
    values: Mapping[str, float]


@dataclass(frozen=True)
class Snapshot:
    """One NVML pass over the devices; ``t_ns`` is ``time.monotonic_ns()`` at its start."""

    t_ns: int
    readings: tuple[DeviceReading, ...]


@dataclass(frozen=True)
class SamplerStatus:
    state: SamplerState
    unavailable: Unavailable | None
    detail: str
    interval_s: float
    devices: tuple[str, ...]
    lost_devices: tuple[str, ...]
    unsupported: Mapping[str, tuple[str, ...]]
    energy_source: Mapping[str, str]
    passes: int
    thread_cpu_s: float


_ANNOUNCED: set[Unavailable] = set()
_ANNOUNCE_LOCK = threading.Lock()


def announce(reason: Unavailable, detail: str, level: int) -> None:
    """Say once per process why there is no GPU telemetry."""
    with _ANNOUNCE_LOCK:
        if reason in _ANNOUNCED:
            return
        _ANNOUNCED.add(reason)
    _log.log(level, "llmtrace GPU telemetry off (%s): %s; llmtrace.gpu.available=0", reason.value, detail)


class DeviceState:
    __slots__ = (
        "device", "energy_base", "energy_j", "energy_source", "failures", "last_t_ns", "logged", "lost",
        "prev_energy_j", "series", "unsupported", "values",
    )  # fmt: skip

    def __init__(self, device: GpuDevice, capacity: int) -> None:
        self.device = device
        self.unsupported: set[str] = set()
        self.logged: set[str] = set()
        self.lost = False
        self.failures = 0
        self.values: dict[str, float] = {}
        self.series = Series(capacity)
        self.energy_source = ""
        self.energy_base: float | None = None
        self.energy_j = 0.0
        self.prev_energy_j: float | None = None  # at the previous stored pass (group energy deltas)
        self.last_t_ns = 0


def update_energy(state: DeviceState, values: Mapping[str, float], t_ns: int) -> float | None:
    """Cumulative joules at this pass: the counter, else power integrated (trapezoid).

    Joules are counted from the device's first pass; a pass missing the counter is
    bridged with power so the series stays aligned and the counter rebases nothing.
    """
    counter = values.get(HW_GPU_ENERGY)
    power = values.get(HW_GPU_POWER)
    prev_t, state.last_t_ns = state.last_t_ns, t_ns
    prev_power = state.series.last_power_w
    if counter is not None:
        if state.energy_base is None:
            state.energy_base = counter - state.energy_j
        state.energy_source = "counter"
        state.energy_j = counter - state.energy_base
        return state.energy_j
    if power is not None:
        if prev_t and state.energy_source:
            p0 = prev_power if prev_power is not None else power
            state.energy_j += (p0 + power) / 2 * (t_ns - prev_t) / 1e9
        state.energy_source = state.energy_source or "power_integration"
        return state.energy_j
    return state.energy_j if state.energy_source else None


def group_values(live: Sequence[DeviceState]) -> tuple[dict[str, float], dict[str, float]]:
    """One pass of a device group: (values for ``.mean``, values for ``.max``).

    Memory held and power drawn add up across devices; utilisation, temperature and
    clocks are averaged for the mean column, and the hottest device goes in the max column.
    """
    means: dict[str, float] = {}
    maxes: dict[str, float] = {}
    for key in SPAN_KEYS:
        vals = [s.values[key] for s in live if key in s.values]
        if not vals:
            continue
        if key in SPAN_ADDITIVE:
            means[key] = maxes[key] = sum(vals)
        else:
            means[key], maxes[key] = sum(vals) / len(vals), max(vals)
    return means, maxes


def ids(states: Sequence[DeviceState]) -> str:
    return ",".join(s.device.device_id for s in states)


def subset(states: Sequence[DeviceState], start: int, end: int, period: int, *, indices: Sequence[int]) -> Attrs:
    """Combine per-device answers: sums for memory/power, mean and max otherwise.

    A group's ``.max`` of an additive quantity is the sum of per-device maxima here
    (an upper bound); the default device set uses the exact per-pass group series.
    """
    out: Attrs = {}
    parts: list[tuple[DeviceState, Attrs]] = []
    stale = STALE_PERIODS * period
    for state in states:
        if state.device.visible_index in indices:
            part = state.series.attributes(start, end, period, stale, state.device.device_id)
            if part is not None:
                parts.append((state, part))
    if not parts:
        return out
    if len(parts) == 1:
        out.update(parts[0][1])
    else:
        keys = {k for _s, p in parts for k in p if k != HW_GPU_ID}
        for key in keys:
            vals = [float(p[key]) for _s, p in parts if key in p]
            base = key.rsplit(".", 1)[0] if key.endswith((".mean", ".max")) else key
            if base in SPAN_ADDITIVE or key == HW_GPU_MEMORY_LIMIT:
                out[key] = sum(vals)
            else:
                out[key] = max(vals) if key.endswith(".max") else sum(vals) / len(vals)
    out[HW_GPU_ID] = ids([s for s, _p in parts])
    return out


def energy_between(
    states: Sequence[DeviceState], start: int, end: int, slack_ns: int, indices: Sequence[int] | None
) -> float | None:
    """Sum over devices of the cumulative-energy difference; ``None`` if no device covers it."""
    total = 0.0
    found = False
    for state in states:
        if indices is not None and state.device.visible_index not in indices:
            continue
        energy = state.series.energy_between(start, end, slack_ns)
        if energy is not None:
            total += energy
            found = True
    return total if found else None


def split_energy_by_tokens(energy_j: float, tokens_by_request: Mapping[str, int]) -> dict[str, float]:
    """Share a step's energy among its requests in proportion to the tokens each had in
    the step; equal shares when no request had any. Shares sum to ``energy_j``."""
    if not tokens_by_request:
        return {}
    total = sum(max(0, t) for t in tokens_by_request.values())
    if total <= 0:
        share = energy_j / len(tokens_by_request)
        return dict.fromkeys(tokens_by_request, share)
    return {rid: energy_j * max(0, t) / total for rid, t in tokens_by_request.items()}
