"""The one test double of the GPU tests: a recorded device model behind the NVML seam.

:class:`RecordedBackend` implements :class:`llmtrace.gpu.backend.NvmlBackend` by replaying
a recording (``fixtures/nvml_recording.json``, format ``llmtrace-nvml-recording/1``, the
same file ``scripts/gpu-check --record`` writes on a real GPU): the k-th call of a query
on a device returns sample ``k`` of that device, so one sampler pass reads one sample.
Queries listed under ``unsupported`` raise :class:`QueryNotSupported` like NVML's
``NOT_SUPPORTED``. Tests inject faults by adding a device index to ``lost`` (raises
:class:`DeviceGone`, like ``NVML_ERROR_GPU_IS_LOST``) or to ``failing`` (raises
:class:`QueryFailed`, like ``NVML_ERROR_UNKNOWN``), and choose ``init_error`` to play
the three "no GPU" cases.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

from llmtrace.gpu.backend import (
    DeviceGone,
    MigIds,
    NvmlUnavailable,
    QueryFailed,
    QueryNotSupported,
)

RECORDING = Path(__file__).parent / "fixtures" / "nvml_recording.json"


def load_recording() -> dict[str, Any]:
    recording: dict[str, Any] = json.loads(RECORDING.read_text())
    return recording


def inventory(uuids: list[str], mig: dict[int, list[tuple[str, int, int]]] | None = None) -> dict[str, Any]:
    """A recording of idle devices with the given UUIDs (and MIG slots), for mapping tests."""
    sample = load_recording()["devices"][0]["samples"][0]
    devices = []
    for index, uuid in enumerate(uuids):
        entry: dict[str, Any] = {"index": index, "uuid": uuid, "name": "NVIDIA H200", "samples": [sample]}
        entry["mig"] = [{"uuid": u, "gi": gi, "ci": ci} for u, gi, ci in (mig or {}).get(index, [])]
        devices.append(entry)
    return {"format": "llmtrace-nvml-recording/1", "driver_version": "test", "devices": devices}


class RecordedBackend:
    """Replays a recorded device model (see the module docstring). Handles are tuples:
    ``("gpu", index)`` or ``("mig", index, slot)``."""

    def __init__(self, recording: dict[str, Any] | None = None, init_error: NvmlUnavailable | None = None):
        self.recording: dict[str, Any] = copy.deepcopy(recording if recording is not None else load_recording())
        self.devices: list[dict[str, Any]] = self.recording["devices"]
        self.init_error = init_error
        self.calls: Counter[tuple[Any, str]] = Counter()
        self.lost: set[int] = set()
        self.failing: set[int] = set()
        self.inits = 0
        self.shutdowns = 0

    # ---------------------------------------------------------------- lifecycle
    def init(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def shutdown(self) -> None:
        self.shutdowns += 1

    def driver_version(self) -> str:
        return str(self.recording.get("driver_version", "recorded"))

    def device_count(self) -> int:
        return len(self.devices)

    def handle_by_index(self, index: int) -> object:
        if index >= len(self.devices):
            raise QueryFailed("Invalid Argument")
        return ("gpu", index)

    def handle_by_uuid(self, uuid: str) -> object:
        for d in self.devices:
            if d["uuid"] == uuid:
                return ("gpu", d["index"])
        raise QueryFailed("Not Found")

    def _entry(self, handle: Any) -> dict[str, Any]:
        dev = self.devices[handle[1]]
        entry: dict[str, Any] = dev["mig"][handle[2]] if handle[0] == "mig" else dev
        return entry

    def uuid(self, handle: object) -> str:
        return str(self._entry(handle)["uuid"])

    def name(self, handle: object) -> str:
        return str(self.devices[handle[1]]["name"])

    def mig_handles(self, handle: object) -> list[object]:
        index = handle[1]
        return [("mig", index, slot) for slot in range(len(self.devices[index].get("mig", [])))]

    def mig_ids(self, mig_handle: object) -> MigIds:
        entry = self._entry(mig_handle)
        return int(entry["gi"]), int(entry["ci"])

    # ---------------------------------------------------------------- queries
    def _value(self, handle: Any, method: str) -> Any:
        index = handle[1]
        if index in self.lost:
            raise DeviceGone("GPU is lost")
        if index in self.failing:
            raise QueryFailed("NVMLError_Unknown: Unknown Error")
        entry = self._entry(handle)
        # NVML answers only memory on a MIG handle; everything else is NOT_SUPPORTED there.
        if method in entry.get("unsupported", []) or (handle[0] == "mig" and method != "memory"):
            raise QueryNotSupported("Not Supported")
        samples = entry.get("samples") or self.devices[index]["samples"]
        k = self.calls[(handle, method)]
        self.calls[(handle, method)] += 1
        return samples[k % len(samples)][method]

    def utilization(self, handle: object) -> tuple[int, int]:
        gpu, mem = self._value(handle, "utilization")
        return int(gpu), int(mem)

    def memory(self, handle: object) -> tuple[int, int]:
        used, total = self._value(handle, "memory")
        return int(used), int(total)

    def power_mw(self, handle: object) -> int:
        return int(self._value(handle, "power_mw"))

    def energy_mj(self, handle: object) -> int:
        return int(self._value(handle, "energy_mj"))

    def temperature_c(self, handle: object) -> int:
        return int(self._value(handle, "temperature_c"))

    def clock_sm_mhz(self, handle: object) -> int:
        return int(self._value(handle, "clock_sm_mhz"))

    def clock_memory_mhz(self, handle: object) -> int:
        return int(self._value(handle, "clock_memory_mhz"))

    def pcie_tx_kbps(self, handle: object) -> int:
        return int(self._value(handle, "pcie_tx_kbps"))

    def pcie_rx_kbps(self, handle: object) -> int:
        return int(self._value(handle, "pcie_rx_kbps"))

    def throttle_reasons(self, handle: object) -> int:
        return int(self._value(handle, "throttle_reasons"))

    def ecc_uncorrected(self, handle: object) -> int:
        return int(self._value(handle, "ecc_uncorrected"))

    def performance_state(self, handle: object) -> int:
        return int(self._value(handle, "performance_state"))


class FakeClock:
    """Monotonic nanoseconds under the test's control (one pass per ``tick``)."""

    def __init__(self, start_ns: int = 1_000_000_000_000, step_ns: int = 100_000_000) -> None:
        self.now = start_ns
        self.step = step_ns

    def __call__(self) -> int:
        return self.now

    def tick(self) -> int:
        self.now += self.step
        return self.now
