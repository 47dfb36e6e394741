"""The NVML seam: everything the sampler asks of a GPU goes through :class:`NvmlBackend`.

:class:`PynvmlBackend` is the real implementation (``pynvml`` from the ``nvidia-ml-py``
package, imported lazily). Tests replay recorded device values through the same
Protocol (``tests/gpu/recorded.py``), so the sampler's logic never needs a GPU.

Errors are translated at this boundary into three exceptions the sampler understands,
so nothing above this module depends on pynvml's error classes:

* :class:`QueryNotSupported` — the device will never answer this query (not supported,
  missing symbol in an old driver, no permission). The sampler stops asking.
* :class:`DeviceGone` — the device fell off the bus / needs a reset (GPU lost, Xid 79).
* :class:`QueryFailed` — anything else; transient until it repeats.

:class:`NvmlUnavailable` is raised by :meth:`NvmlBackend.init` and says which of the
three "no GPU here" cases applies (:class:`Unavailable`).
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = [
    "DeviceGone",
    "MigIds",
    "NvmlBackend",
    "NvmlUnavailable",
    "PynvmlBackend",
    "QueryFailed",
    "QueryNotSupported",
    "Unavailable",
]

_T = TypeVar("_T")

#: (GPU instance id, compute instance id) of a MIG device.
MigIds = tuple[int, int]


class Unavailable(enum.Enum):
    """Why there is no GPU telemetry in this process — the three cases the sampler reports."""

    NO_NVML_LIBRARY = "no_nvml_library"  # nvidia-ml-py missing or libnvidia-ml.so not found
    NO_GPU = "no_gpu"  # driver not loaded, or the driver sees zero GPUs
    NO_VISIBLE_DEVICE = "no_visible_device"  # GPUs exist but CUDA_VISIBLE_DEVICES hides them all


class NvmlUnavailable(Exception):
    """NVML cannot be used in this process; ``reason`` says which of the three cases."""

    def __init__(self, reason: Unavailable, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


class QueryNotSupported(Exception):
    """The device does not support this query; asking again will not help."""


class DeviceGone(Exception):
    """The device is lost (fell off the bus, Xid, reset required)."""


class QueryFailed(Exception):
    """Any other NVML error on a query."""


@runtime_checkable
class NvmlBackend(Protocol):
    """What the sampler, the device mapper and the doctor need from NVML.

    Handles are opaque objects. Units are NVML's own (percent, bytes, milliwatts,
    millijoules, degrees C, MHz, KB/s); the sampler converts them.
    """

    def init(self) -> None:
        """Initialise NVML; raise :class:`NvmlUnavailable` saying why it cannot be."""

    def shutdown(self) -> None:
        """Release this backend's NVML reference; never raises."""

    def driver_version(self) -> str: ...

    def device_count(self) -> int: ...

    def handle_by_index(self, index: int) -> object: ...

    def handle_by_uuid(self, uuid: str) -> object: ...

    def uuid(self, handle: object) -> str: ...

    def name(self, handle: object) -> str: ...

    def mig_handles(self, handle: object) -> list[object]:
        """The MIG devices configured on a physical GPU; ``[]`` when MIG is off/unsupported."""

    def mig_ids(self, mig_handle: object) -> MigIds: ...

    # ---- per-pass queries
    def utilization(self, handle: object) -> tuple[int, int]:
        """(GPU busy %, memory-controller busy %) over the driver's last sample period."""

    def memory(self, handle: object) -> tuple[int, int]:
        """(used bytes, total bytes)."""

    def power_mw(self, handle: object) -> int: ...

    def energy_mj(self, handle: object) -> int:
        """Total energy since the driver loaded, millijoules (Volta and newer)."""

    def temperature_c(self, handle: object) -> int: ...

    def clock_sm_mhz(self, handle: object) -> int: ...

    def clock_memory_mhz(self, handle: object) -> int: ...

    def pcie_tx_kbps(self, handle: object) -> int: ...

    def pcie_rx_kbps(self, handle: object) -> int: ...

    def throttle_reasons(self, handle: object) -> int: ...

    def ecc_uncorrected(self, handle: object) -> int:
        """Volatile (since last reboot) uncorrected ECC error count."""

    def performance_state(self, handle: object) -> int:
        """P-state, 0 (max performance) .. 15."""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PynvmlBackend:
    """:class:`NvmlBackend` over ``pynvml`` (package ``nvidia-ml-py``)."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._initialised = False

    # ------------------------------------------------------------------ lifecycle
    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable(
                Unavailable.NO_NVML_LIBRARY, f"the nvidia-ml-py package is not installed ({exc})"
            ) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            raise NvmlUnavailable(
                Unavailable.NO_NVML_LIBRARY, "libnvidia-ml.so.1 not found (no NVIDIA driver user-space)"
            ) from None
        except pynvml.NVMLError_DriverNotLoaded:
            raise NvmlUnavailable(Unavailable.NO_GPU, "the NVIDIA kernel driver is not loaded") from None
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(Unavailable.NO_GPU, f"nvmlInit failed: {exc}") from None
        self._nvml = pynvml
        self._initialised = True

    def shutdown(self) -> None:
        if not self._initialised:
            return
        self._initialised = False
        with contextlib.suppress(Exception):  # shutdown is best effort by contract
            self._nvml.nvmlShutdown()

    # ------------------------------------------------------------------ plumbing
    def _call(self, fn: Callable[..., _T], *args: object) -> _T:
        nvml = self._nvml
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            raise _translate(nvml, exc) from None

    # ------------------------------------------------------------------ inventory
    def driver_version(self) -> str:
        return _text(self._call(self._nvml.nvmlSystemGetDriverVersion))

    def device_count(self) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetCount))

    def handle_by_index(self, index: int) -> object:
        return self._call(self._nvml.nvmlDeviceGetHandleByIndex, index)

    def handle_by_uuid(self, uuid: str) -> object:
        return self._call(self._nvml.nvmlDeviceGetHandleByUUID, uuid.encode())

    def uuid(self, handle: object) -> str:
        return _text(self._call(self._nvml.nvmlDeviceGetUUID, handle))

    def name(self, handle: object) -> str:
        return _text(self._call(self._nvml.nvmlDeviceGetName, handle))

    def mig_handles(self, handle: object) -> list[object]:
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
            if current != nvml.NVML_DEVICE_MIG_ENABLE:
                return []
            slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
        except nvml.NVMLError:
            return []
        found: list[object] = []
        for slot in range(slots):
            try:
                found.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
            except nvml.NVMLError:
                continue  # an unconfigured slot answers NOT_FOUND
        return found

    def mig_ids(self, mig_handle: object) -> MigIds:
        gi = int(self._call(self._nvml.nvmlDeviceGetGpuInstanceId, mig_handle))
        ci = int(self._call(self._nvml.nvmlDeviceGetComputeInstanceId, mig_handle))
        return gi, ci

    # ------------------------------------------------------------------ queries
    def utilization(self, handle: object) -> tuple[int, int]:
        rates = self._call(self._nvml.nvmlDeviceGetUtilizationRates, handle)
        return int(rates.gpu), int(rates.memory)

    def memory(self, handle: object) -> tuple[int, int]:
        info = self._call(self._nvml.nvmlDeviceGetMemoryInfo, handle)
        return int(info.used), int(info.total)

    def power_mw(self, handle: object) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetPowerUsage, handle))

    def energy_mj(self, handle: object) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetTotalEnergyConsumption, handle))

    def temperature_c(self, handle: object) -> int:
        nvml = self._nvml
        return int(self._call(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU))

    def clock_sm_mhz(self, handle: object) -> int:
        nvml = self._nvml
        return int(self._call(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM))

    def clock_memory_mhz(self, handle: object) -> int:
        nvml = self._nvml
        return int(self._call(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM))

    def pcie_tx_kbps(self, handle: object) -> int:
        nvml = self._nvml
        return int(self._call(nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_TX_BYTES))

    def pcie_rx_kbps(self, handle: object) -> int:
        nvml = self._nvml
        return int(self._call(nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_RX_BYTES))

    def throttle_reasons(self, handle: object) -> int:
        nvml = self._nvml
        fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is None:  # nvidia-ml-py older than 12.535
            fn = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(self._call(fn, handle))

    def ecc_uncorrected(self, handle: object) -> int:
        nvml = self._nvml
        return int(
            self._call(
                nvml.nvmlDeviceGetTotalEccErrors,
                handle,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            )
        )

    def performance_state(self, handle: object) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetPerformanceState, handle))


def _translate(nvml: Any, exc: Exception) -> Exception:
    """Map a pynvml error to the seam's exception vocabulary."""
    value = getattr(exc, "value", None)
    if value in (
        nvml.NVML_ERROR_NOT_SUPPORTED,
        nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        nvml.NVML_ERROR_NO_PERMISSION,
    ):
        return QueryNotSupported(str(exc))
    if value in (nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_RESET_REQUIRED):
        return DeviceGone(str(exc))
    return QueryFailed(f"{type(exc).__name__}: {exc}")
