"""The GPU sampler service: one named daemon thread, one NVML pass per interval.

Everything that wants GPU state — span annotation, energy per step, metric callbacks —
reads what this thread stored; nothing else in llmtrace calls NVML, and the serving hot
path calls nothing here at all (spans are annotated when they are materialised).

Failure behaviour (each said once, through the ``llmtrace.gpu`` logger):

* no nvidia-ml-py / no ``libnvidia-ml.so`` / no driver or no GPU / every GPU hidden by
  ``CUDA_VISIBLE_DEVICES``: the sampler does not start, says which case it is, and
  ``available`` is False (metric ``llmtrace.gpu.available`` = 0);
* a query a device does not support: dropped for that device after the first try;
* a device that is lost (or fails :data:`LOST_AFTER_FAILED_PASSES` passes in a row):
  logged, no longer read, its attributes omitted from spans. No exception leaves the
  thread or :meth:`GpuSampler.span_attributes` / :meth:`GpuSampler.energy_j`.

Fork safety: before ``os.fork()`` the sampler releases its NVML reference (holding the
pass lock, so no call is in flight); the parent re-initialises on its next pass, the
child starts with no NVML state of ours — stopped, or freshly restarted when
``restart_in_child=True``. It never uses a handle the parent opened.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from math import isfinite
from types import TracebackType
from typing import Any

from llmtrace._os_thread import name_os_thread
from llmtrace.gpu import _process
from llmtrace.gpu._queries import QUERIES, SPAN_KEYS
from llmtrace.gpu._state import (
    STALE_PERIODS,
    Attrs,
    DeviceReading,
    DeviceState,
    SamplerState,
    SamplerStatus,
    Snapshot,
    announce,
    energy_between,
    group_values,
    ids,
    split_energy_by_tokens,
    subset,
    update_energy,
)
from llmtrace.gpu._window import Series
from llmtrace.gpu.backend import (
    DeviceGone,
    NvmlBackend,
    NvmlUnavailable,
    PynvmlBackend,
    QueryNotSupported,
    Unavailable,
)
from llmtrace.gpu.devices import GpuDevice, resolve_devices
from llmtrace.semconv import HW_GPU_MEMORY_LIMIT, HW_GPU_POWER

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_INTERVAL_S",
    "DeviceReading",
    "GpuSampler",
    "SamplerState",
    "SamplerStatus",
    "Snapshot",
    "get_sampler",
    "split_energy_by_tokens",
    "start_sampler",
    "stop_sampler",
]

_log = logging.getLogger("llmtrace.gpu")

DEFAULT_INTERVAL_S = 0.1
#: Samples kept per device: 2048 x 0.1 s ~ 3.4 min. A longer span is aggregated over the
#: retained part. Memory: at most 1.25 x capacity samples of ~1.5 KB of tuples (six span
#: quantities) per device series, ~4 MB (see _window).
DEFAULT_CAPACITY = 2048
#: Consecutive passes in which every query of a device failed before it is declared lost
#: (a single failure can be a driver hiccup; three in 0.3 s is a dead device).
LOST_AFTER_FAILED_PASSES = 3
#: Snapshots kept as objects for ``snapshots()`` (debugging, gpu-check); aggregates use Series.
HISTORY = 64
#: How long a fork waits for an in-flight NVML pass before giving up on releasing NVML.
FORK_LOCK_TIMEOUT_S = 1.0


class GpuSampler:
    """Samples NVML for this process's GPUs in a background thread; see the module docstring."""

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        devices: str | Sequence[int | str] = "visible",
        *,
        backend: NvmlBackend | None = None,
        capacity: int = DEFAULT_CAPACITY,
        restart_in_child: bool = False,
        unavailable_log_level: int = logging.INFO,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        slow_every: int = 10,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = float(interval_s)
        self._period_ns = int(interval_s * 1e9)
        self._stale_ns = STALE_PERIODS * self._period_ns
        self.selection = devices  # as given: 'visible', 'all' or ordinals/ids
        self._backend: NvmlBackend = backend if backend is not None else PynvmlBackend()
        self._capacity = capacity
        self.restart_in_child = restart_in_child
        self._log_level = unavailable_log_level
        self._environ = environ
        self._clock = clock
        self._slow_every = max(1, slow_every)
        self._init_runtime_state()
        _process.register(self)

    def _init_runtime_state(self) -> None:
        """Everything a forked child must not inherit."""
        self._lock = threading.Lock()  # serialises writers and the slow readers (status, device subsets)
        self._nvml_lock = threading.Lock()  # held for a whole NVML pass; taken by the fork hook
        self._stop_event = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._state = SamplerState.NOT_STARTED
        self._unavailable: Unavailable | None = None
        self._detail = ""
        self._nvml_ready = False
        self._reinit_needed = False
        self._fork_locked = False
        self._devices: list[DeviceState] = []
        self._group: Series | None = None
        # What span_attributes()/energy_j() read without device_indices, lock-free: the
        # series and the ids of the devices in it, swapped together by one store.
        self._view: tuple[Series, str] | None = None
        self._group_energy: float | None = None
        self._history: deque[Snapshot] = deque(maxlen=HISTORY)
        self._passes = 0
        self._thread_cpu_s = 0.0

    # ------------------------------------------------------------------ service
    @property
    def available(self) -> bool:
        """True while sampling at least one live device."""
        return self._state is SamplerState.RUNNING and any(not d.lost for d in self._devices)

    def status(self) -> SamplerStatus:
        with self._lock:
            states = list(self._devices)
        return SamplerStatus(
            state=self._state,
            unavailable=self._unavailable,
            detail=self._detail,
            interval_s=self.interval_s,
            devices=tuple(d.device.device_id for d in states),
            lost_devices=tuple(d.device.device_id for d in states if d.lost),
            unsupported={d.device.device_id: tuple(sorted(d.unsupported)) for d in states},
            energy_source={d.device.device_id: d.energy_source for d in states if d.energy_source},
            passes=self._passes,
            thread_cpu_s=self._thread_cpu_s,
        )

    def devices(self) -> list[GpuDevice]:
        return [d.device for d in self._devices]

    def open(self) -> bool:
        """Initialise NVML and map the devices, synchronously. True when there is something to sample."""
        with self._nvml_lock:
            return self._open_locked()

    def _open_locked(self) -> bool:
        try:
            self._backend.init()
        except NvmlUnavailable as exc:
            return self._set_unavailable(exc.reason, exc.detail)
        except Exception as exc:  # noqa: BLE001 - a broken backend means no GPU telemetry, not a crash
            return self._set_unavailable(Unavailable.NO_GPU, f"NVML init failed: {exc!r}")
        self._nvml_ready = True
        try:
            count = self._backend.device_count()
            found = resolve_devices(self._backend, self.selection, self._environ) if count else []
        except Exception as exc:  # noqa: BLE001 - telemetry never raises into the host
            self._release_nvml()
            return self._set_unavailable(Unavailable.NO_GPU, f"listing devices failed: {exc!r}")
        if count == 0:
            self._release_nvml()
            return self._set_unavailable(Unavailable.NO_GPU, "the NVIDIA driver reports no GPU")
        if not found:
            env = os.environ if self._environ is None else self._environ
            visible = env.get("CUDA_VISIBLE_DEVICES")
            self._release_nvml()
            return self._set_unavailable(
                Unavailable.NO_VISIBLE_DEVICE,
                f"CUDA_VISIBLE_DEVICES={visible!r} leaves none of the {count} GPU(s) to this process",
            )
        with self._lock:
            self._devices = [DeviceState(d, self._capacity) for d in found]
            self._group = Series(self._capacity) if len(found) > 1 else None
            default = self._group if self._group is not None else self._devices[0].series
            self._view = (default, ids(self._devices))
        return True

    def _set_unavailable(self, reason: Unavailable, detail: str) -> bool:
        self._state = SamplerState.UNAVAILABLE
        self._unavailable = reason
        self._detail = detail
        announce(reason, detail, self._log_level)
        return False

    def _release_nvml(self) -> None:
        if self._nvml_ready:
            self._nvml_ready = False
            self._backend.shutdown()

    def start(self) -> GpuSampler:
        """Start the thread (idempotent). NVML init happens in the thread; see :meth:`wait_ready`."""
        if self._thread is not None and self._thread.is_alive():
            return self
        if self._state is SamplerState.UNAVAILABLE:
            return self
        self._stop_event.clear()
        self._state = SamplerState.STARTING
        self._thread = threading.Thread(target=self._run, name="llmtrace-gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until NVML init finished (successfully or not); returns :attr:`available`."""
        self._ready.wait(timeout)
        return self.available

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread, wait for it to exit, release NVML. Idempotent."""
        self._stop_event.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                _log.warning("llmtrace GPU sampler thread did not stop within %.1fs (stuck in NVML?)", timeout)
        self._thread = None
        if self._state is not SamplerState.UNAVAILABLE:
            self._state = SamplerState.STOPPED
        if self._nvml_lock.acquire(timeout=timeout):
            try:
                self._release_nvml()
            finally:
                self._nvml_lock.release()

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self) -> None:
        name_os_thread("llmtrace-gpu")
        try:
            if not self._nvml_ready and not self.open():
                return
            if self._stop_event.is_set():
                return
            self._state = SamplerState.RUNNING
            self._ready.set()
            next_t = time.monotonic()
            while not self._stop_event.is_set():
                self.sample_once()
                self._thread_cpu_s = time.thread_time()
                next_t += self.interval_s
                delay = next_t - time.monotonic()
                if delay < 0:  # fell behind (suspended, slow NVML): skip, don't burst
                    next_t = time.monotonic()
                    delay = 0.0
                self._stop_event.wait(delay)
        except Exception:  # noqa: BLE001 - telemetry never kills the host: log and stop sampling
            _log.exception("llmtrace GPU sampler stopped after an unexpected error")
            self._state = SamplerState.STOPPED
        finally:
            self._ready.set()

    # ------------------------------------------------------------------ one pass
    def sample_once(self) -> Snapshot | None:
        """Run one NVML pass now (the thread's body; tests drive it directly)."""
        with self._nvml_lock:
            if self._reinit_needed and not self._reinit_locked():
                return None
            if not self._nvml_ready:
                return None
            t_ns = self._clock()
            slow = self._passes % self._slow_every == 0
            readings = [self._read_device(d, slow) for d in self._devices if not d.lost]
        snapshot = Snapshot(t_ns, tuple(r for r in readings if r is not None))
        with self._lock:
            self._store(snapshot)
        return snapshot

    def _read_device(self, state: DeviceState, slow: bool) -> DeviceReading | None:
        values: dict[str, float] = {}
        attempted = failed = 0
        handle = state.device.handle
        for query in QUERIES:
            if query.name in state.unsupported or (query.slow and not slow):
                continue
            attempted += 1
            try:
                values.update(query.read(self._backend, handle))
            except QueryNotSupported:
                state.unsupported.add(query.name)
                _log.debug("GPU %s: %s not supported; not asked again", state.device.device_id, query.name)
            except DeviceGone as exc:
                self._mark_lost(state, f"device lost ({exc})")
                return None
            except Exception as exc:  # noqa: BLE001 - any NVML error must stay in this thread
                failed += 1
                self._log_once(state, f"{query.name}:{type(exc).__name__}", f"{query.name} failed: {exc}")
        if attempted and failed == attempted:
            state.failures += 1
            if state.failures >= LOST_AFTER_FAILED_PASSES:
                self._mark_lost(state, f"{state.failures} passes in a row without an answer")
            return None
        state.failures = 0
        return DeviceReading(state.device, values)

    def _mark_lost(self, state: DeviceState, why: str) -> None:
        state.lost = True
        live = [d for d in self._devices if not d.lost]
        view = self._view
        self._view = (view[0], ids(live)) if view is not None and live else None
        _log.warning(
            "llmtrace GPU %s (%s) %s; its hw.gpu.* attributes are omitted from now on",
            state.device.device_id, state.device.uuid, why,
        )  # fmt: skip

    def _log_once(self, state: DeviceState, key: str, message: str) -> None:
        if key not in state.logged:
            state.logged.add(key)
            _log.warning("llmtrace GPU %s: %s (logged once)", state.device.device_id, message)

    def _store(self, snapshot: Snapshot) -> None:
        """Append one pass to every series (under the data lock; no NVML here)."""
        t_ns = snapshot.t_ns
        by_device = {r.device.device_id: r for r in snapshot.readings}
        live: list[DeviceState] = []
        energy_delta: float | None = None
        for state in self._devices:
            reading = by_device.get(state.device.device_id)
            if reading is None:
                continue
            # A NaN or infinite reading is no reading: the last good value stands.
            state.values.update((k, v) for k, v in reading.values.items() if isfinite(v))
            energy = update_energy(state, reading.values, t_ns)
            if energy is not None:
                if state.prev_energy_j is not None:
                    energy_delta = (energy_delta or 0.0) + energy - state.prev_energy_j
                state.prev_energy_j = energy
            means = {k: state.values[k] for k in SPAN_KEYS if k in state.values}
            series = state.series
            series.append(t_ns, means, None, energy)
            series.limit = state.values.get(HW_GPU_MEMORY_LIMIT, series.limit)
            series.last_power_w = state.values.get(HW_GPU_POWER, series.last_power_w)
            live.append(state)
        if self._group is not None and live:
            self._store_group(t_ns, live, energy_delta)
        self._history.append(snapshot)
        self._passes += 1

    def _store_group(self, t_ns: int, live: list[DeviceState], energy_delta: float | None) -> None:
        """The group's own series: per-pass combined values, and its energy as the running
        sum of the live devices' increments (so a lost device never makes it go backwards)."""
        group = self._group
        assert group is not None
        means, maxes = group_values(live)
        if energy_delta is not None or self._group_energy is not None:
            self._group_energy = (self._group_energy or 0.0) + (energy_delta or 0.0)
        group.append(t_ns, means, maxes, self._group_energy)
        limits = [s.series.limit for s in live if s.series.limit is not None]
        group.limit = sum(limits) if limits else None
        powers = [s.series.last_power_w for s in live if s.series.last_power_w is not None]
        group.last_power_w = sum(powers) if powers else None

    def _reinit_locked(self) -> bool:
        """Re-open NVML after a fork in the parent; the devices keep their history."""
        self._reinit_needed = False
        try:
            self._backend.init()
            self._nvml_ready = True
            fresh = {d.uuid: d for d in resolve_devices(self._backend, self.selection, self._environ)}
        except Exception as exc:  # noqa: BLE001 - telemetry never raises into the host
            _log.warning("llmtrace GPU sampler could not re-open NVML after fork: %r", exc)
            self._state = SamplerState.STOPPED
            return False
        for state in self._devices:
            new = fresh.get(state.device.uuid)
            if new is None:
                self._mark_lost(state, "vanished after fork")
                state.lost = True
            else:
                state.device = dataclasses.replace(state.device, handle=new.handle)
        return True

    # ------------------------------------------------------------------ readers
    def latest(self) -> Snapshot | None:
        """The newest pass (metric callbacks read this; it never calls NVML)."""
        history = self._history
        return history[-1] if history else None

    def snapshots(self) -> list[Snapshot]:
        """The last :data:`HISTORY` passes, oldest first."""
        with self._lock:
            return list(self._history)

    def span_attributes(
        self, start_mono_ns: int, end_mono_ns: int, device_indices: Sequence[int] | None = None
    ) -> Attrs:
        """GPU attributes for a span over ``[start, end]`` (``time.monotonic_ns()`` values).

        ``hw.gpu.id`` (comma-separated) and, for a span longer than one sample period,
        ``<key>.mean``/``<key>.max`` over the samples inside it; otherwise (or when none
        fall inside) the plain ``<key>`` of the nearest sample, unless that is stale.
        ``device_indices`` are CUDA ordinals (``cuda:N``); default: every sampled device.
        Empty dict when there is nothing trustworthy to say. Never raises.
        """
        if device_indices is None:
            view = self._view  # one load: the series and its ids always match
            if view is None:
                return {}
            try:
                out = view[0].attributes(start_mono_ns, end_mono_ns, self._period_ns, self._stale_ns, view[1])
            except Exception:  # noqa: BLE001 - annotation must never break span export
                _log.debug("span_attributes failed", exc_info=True)
                return {}
            return {} if out is None else out
        try:
            with self._lock:
                return subset(self._devices, start_mono_ns, end_mono_ns, self._period_ns, indices=device_indices)
        except Exception:  # noqa: BLE001 - annotation must never break span export
            _log.debug("span_attributes failed", exc_info=True)
            return {}

    def energy_j(
        self, start_mono_ns: int, end_mono_ns: int, device_indices: Sequence[int] | None = None
    ) -> float | None:
        """Joules the devices used between two ``time.monotonic_ns()`` instants.

        From the NVML energy counter, interpolated linearly between samples (and
        extrapolated with the last power reading up to two periods past the newest one);
        power integrated over the samples where a device has no counter. ``None`` when no
        device covers the interval.
        """
        try:
            view = self._view
            if device_indices is None and view is not None:
                return view[0].energy_between(start_mono_ns, end_mono_ns, self._stale_ns)
            with self._lock:  # a subset, or every device lost: their histories still hold past steps
                return energy_between(self._devices, start_mono_ns, end_mono_ns, self._stale_ns, device_indices)
        except Exception:  # noqa: BLE001 - telemetry never raises into the host
            _log.debug("energy_j failed", exc_info=True)
            return None

    # ------------------------------------------------------------------ fork
    def _before_fork(self) -> None:
        self._fork_locked = self._nvml_lock.acquire(timeout=FORK_LOCK_TIMEOUT_S)
        if self._fork_locked and self._nvml_ready:
            self._release_nvml()
            self._reinit_needed = True

    def _after_fork_parent(self) -> None:
        if self._fork_locked:
            self._fork_locked = False
            self._nvml_lock.release()

    def _after_fork_child(self) -> None:
        was_active = self._state in (SamplerState.RUNNING, SamplerState.STARTING)
        clean = self._fork_locked or not self._nvml_ready
        self._init_runtime_state()  # new locks, no thread, no parent data, no NVML state
        if was_active and self.restart_in_child and clean:
            self.start()
        else:
            self._state = SamplerState.STOPPED
            self._detail = "stopped in a forked child" if was_active else ""


# --------------------------------------------------------------------------- the process sampler
# The one sampler ``llmtrace.instrument()`` starts. Its fork hook is registered after
# _process's (imported above), so in a forked child every sampler has already handled the
# fork when the singleton is checked.

_SINGLETON: GpuSampler | None = None
_SINGLETON_LOCK = threading.Lock()


def _forget_singleton_in_child() -> None:
    global _SINGLETON_LOCK, _SINGLETON
    _SINGLETON_LOCK = threading.Lock()
    if _SINGLETON is not None and _SINGLETON.status().state not in (SamplerState.RUNNING, SamplerState.STARTING):
        _SINGLETON = None


os.register_at_fork(after_in_child=_forget_singleton_in_child)


def get_sampler() -> GpuSampler | None:
    """The process's sampler started by :func:`start_sampler` (``None`` if none, or in a
    forked child that did not restart it)."""
    return _SINGLETON


def start_sampler(
    interval_s: float = 0.1,
    devices: str | Sequence[int | str] = "visible",
    *,
    required: bool = False,
    **options: Any,
) -> GpuSampler:
    """Start (or return the running) process sampler. Options go to :class:`GpuSampler`.

    ``required=True`` (``instrument(gpu="on")``) logs a missing GPU as a warning instead
    of at INFO level. Never raises because of the GPU: without one the sampler is
    returned in state ``UNAVAILABLE`` after saying why once.
    """
    global _SINGLETON
    with _SINGLETON_LOCK:
        current = _SINGLETON
        if current is not None:
            same = current.interval_s == float(interval_s) and current.selection == devices
            if same and current.status().state in (SamplerState.RUNNING, SamplerState.STARTING):
                return current
            current.stop()
        options.setdefault("unavailable_log_level", logging.WARNING if required else logging.INFO)
        sampler = GpuSampler(interval_s, devices, **options)
        _SINGLETON = sampler
        return sampler.start()


def stop_sampler() -> None:
    """Stop and forget the process sampler (idempotent)."""
    global _SINGLETON
    with _SINGLETON_LOCK:
        sampler, _SINGLETON = _SINGLETON, None
    if sampler is not None:
        sampler.stop()
