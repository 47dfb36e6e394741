"""CUDA-event timing of ``llm.forward`` and torch's memory counters — without ever
initialising CUDA and without ever synchronising.

``ForwardTimer.begin()`` / ``end()`` run on the engine thread around a forward: each
records one CUDA event on the current stream (a few µs, asynchronous). Nothing waits for
the GPU: ``resolve_ready()``, called off the hot path (when spans are materialised),
asks each pending end event ``query()`` and returns the timings of the forwards the GPU
has finished; the rest stay pending for a later call.

Absolute GPU start/end: CUDA events measure only the time *between* events. To place a
forward on the host's clock we keep, per device, an *anchor* event recorded while the
current stream was idle (so it executed within a few µs of the host timestamp taken
with it); ``gpu_start = anchor_host_ns + anchor.elapsed_time(start)``. The anchor is
renewed every :data:`ANCHOR_REFRESH_S` seconds when the stream is seen idle, which bounds
host/GPU clock drift. Without an anchor only ``gpu_time_s`` is reported.

Everything here is a no-op (returns ``None`` / nothing) unless torch is *already
imported* and ``torch.cuda.is_initialized()`` — and while a CUDA graph is being
captured, since an event recorded then would become part of the graph.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from llmtrace.semconv import LLM_TORCH_MEMORY_ALLOCATED, LLM_TORCH_MEMORY_PEAK, LLM_TORCH_MEMORY_RESERVED

__all__ = ["ForwardTimer", "ForwardTiming", "ForwardToken", "cuda_in_use", "torch_memory_attributes"]

_log = logging.getLogger("llmtrace.gpu")

#: Forwards awaiting resolution before the oldest are dropped (resolve_ready not called).
MAX_PENDING = 4096
#: Renew the host/GPU clock anchor this often (when the stream is idle), seconds.
ANCHOR_REFRESH_S = 5.0
#: Events kept for reuse; creating one costs a driver call.
_POOL_MAX = 256


def _cuda_torch() -> Any | None:
    """torch, when it is imported and has initialised CUDA; else None. Never imports torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch if torch.cuda.is_initialized() else None
    except Exception:  # noqa: BLE001 - a half-imported or CPU-only torch
        return None


def cuda_in_use() -> bool:
    """True when this process's torch has already initialised CUDA."""
    return _cuda_torch() is not None


@dataclass(frozen=True)
class ForwardTiming:
    """A resolved forward. ``gpu_*_mono_ns`` are this process's ``time.monotonic_ns()``
    scale (convert like any other lifecycle timestamp); ``None`` without an anchor."""

    key: object
    device: int
    gpu_time_s: float
    gpu_start_mono_ns: int | None
    gpu_end_mono_ns: int | None


class _Anchor:
    __slots__ = ("event", "host_ns", "taken_s")

    def __init__(self, event: Any, host_ns: int, taken_s: float) -> None:
        self.event = event
        self.host_ns = host_ns
        self.taken_s = taken_s


class ForwardToken:
    """What ``begin()`` hands back; pass it to ``end()``."""

    __slots__ = ("anchor", "device", "end_event", "key", "start_event")

    def __init__(self, key: object, start_event: Any, device: int, anchor: _Anchor | None) -> None:
        self.key = key
        self.start_event = start_event
        self.end_event: Any = None
        self.device = device
        self.anchor = anchor


class ForwardTimer:
    """CUDA-event timing around forwards; see the module docstring."""

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self._pending: deque[ForwardToken] = deque()
        self._lock = threading.Lock()
        self._pool: list[Any] = []
        self._anchors: dict[int, _Anchor] = {}
        self._max_pending = max_pending
        self.dropped = 0

    def _event(self, torch: Any) -> Any:
        pool = self._pool
        return pool.pop() if pool else torch.cuda.Event(enable_timing=True)

    def _anchor(self, torch: Any, device: int) -> _Anchor | None:
        anchor = self._anchors.get(device)
        now = time.monotonic()
        if anchor is not None and now - anchor.taken_s < ANCHOR_REFRESH_S:
            return anchor
        if torch.cuda.current_stream().query():  # idle stream: the event runs right away
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            anchor = self._anchors[device] = _Anchor(event, time.monotonic_ns(), now)
        return anchor

    def begin(self, key: object = None) -> ForwardToken | None:
        """Record the start event (hot path). ``None`` when CUDA is not in use."""
        torch = _cuda_torch()
        if torch is None:
            return None
        try:
            if torch.cuda.is_current_stream_capturing():
                return None
            device = torch.cuda.current_device()
            anchor = self._anchor(torch, device)
            event = self._event(torch)
            event.record()
            return ForwardToken(key, event, device, anchor)
        except Exception:  # noqa: BLE001 - telemetry never raises into the forward
            _log.debug("ForwardTimer.begin failed", exc_info=True)
            return None

    def end(self, token: ForwardToken | None) -> None:
        """Record the end event (hot path) and queue the pair for :meth:`resolve_ready`."""
        if token is None:
            return
        torch = sys.modules.get("torch")
        if torch is None:
            return
        try:
            event = self._event(torch)
            event.record()
            token.end_event = event
        except Exception:  # noqa: BLE001 - telemetry never raises into the host
            _log.debug("ForwardTimer.end failed", exc_info=True)
            return
        with self._lock:
            self._pending.append(token)
            if len(self._pending) > self._max_pending:
                self._pending.popleft()
                self.dropped += 1

    @property
    def pending(self) -> int:
        return len(self._pending)

    def resolve_ready(self) -> list[ForwardTiming]:
        """Timings of the forwards whose end event has completed; polls with ``query()`` only."""
        with self._lock:
            tokens = list(self._pending)
            self._pending.clear()
        done: list[ForwardTiming] = []
        waiting: list[ForwardToken] = []
        for token in tokens:
            try:
                if not token.end_event.query():
                    waiting.append(token)
                    continue
                done.append(_timing(token))
            except Exception:  # noqa: BLE001 - an event from a context that no longer exists
                _log.debug("ForwardTimer.resolve_ready dropped a forward", exc_info=True)
                continue
            if len(self._pool) < _POOL_MAX:
                self._pool.extend((token.start_event, token.end_event))
        if waiting:
            with self._lock:
                self._pending.extendleft(reversed(waiting))
        return done


def _timing(token: ForwardToken) -> ForwardTiming:
    elapsed_ms = float(token.start_event.elapsed_time(token.end_event))
    start_ns = end_ns = None
    anchor = token.anchor
    if anchor is not None:
        try:  # an anchor on another stream may not have run yet: then no absolute times
            offset_ms = float(anchor.event.elapsed_time(token.start_event))
        except Exception:  # noqa: BLE001 - telemetry never raises into the host
            offset_ms = None
        if offset_ms is not None:
            start_ns = anchor.host_ns + int(offset_ms * 1e6)
            end_ns = start_ns + int(elapsed_ms * 1e6)
    return ForwardTiming(token.key, token.device, elapsed_ms / 1e3, start_ns, end_ns)


def torch_memory_attributes(device: int | None = None) -> dict[str, int]:
    """``llm.torch.memory.{allocated,reserved,peak}`` (bytes) for ``device`` (default: the
    current one) — only when torch already initialised CUDA; ``{}`` otherwise.

    ``peak`` is ``max_memory_allocated()`` since start or the application's last
    ``reset_peak_memory_stats()``; llmtrace never resets it.
    """
    torch = _cuda_torch()
    if torch is None:
        return {}
    try:
        cuda = torch.cuda
        dev = cuda.current_device() if device is None else device
        return {
            LLM_TORCH_MEMORY_ALLOCATED: int(cuda.memory_allocated(dev)),
            LLM_TORCH_MEMORY_RESERVED: int(cuda.memory_reserved(dev)),
            LLM_TORCH_MEMORY_PEAK: int(cuda.max_memory_allocated(dev)),
        }
    except Exception:  # noqa: BLE001 - telemetry never raises into the host
        _log.debug("torch_memory_attributes failed", exc_info=True)
        return {}
