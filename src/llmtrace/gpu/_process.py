"""Process-level plumbing of the GPU sampler: the singleton that ``llmtrace.instrument()``
uses, and the ``os.register_at_fork`` hooks that keep every live sampler fork-safe.

Kept out of :mod:`llmtrace.gpu.sampler` so that module is only the service itself; the
sampler class is imported lazily here (it imports this module).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from llmtrace.gpu._state import SamplerState

if TYPE_CHECKING:
    from llmtrace.gpu.sampler import GpuSampler

__all__ = ["get_sampler", "register", "start_sampler", "stop_sampler"]

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def register(sampler: GpuSampler) -> None:
    """Put a sampler under the fork hooks (weakly: a dropped sampler needs no hook)."""
    _LIVE.add(sampler)


def _live() -> Iterator[GpuSampler]:
    return iter(list(_LIVE))


def _before_fork() -> None:
    for sampler in _live():
        with suppress(Exception):
            sampler._before_fork()


def _after_fork_parent() -> None:
    for sampler in _live():
        with suppress(Exception):
            sampler._after_fork_parent()


def _after_fork_child() -> None:
    global _SINGLETON_LOCK, _SINGLETON
    _SINGLETON_LOCK = threading.Lock()
    for sampler in _live():
        with suppress(Exception):
            sampler._after_fork_child()
    if _SINGLETON is not None and _SINGLETON.status().state not in (SamplerState.RUNNING, SamplerState.STARTING):
        _SINGLETON = None


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child)


_SINGLETON: GpuSampler | None = None
_SINGLETON_LOCK = threading.Lock()


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
    from llmtrace.gpu.sampler import GpuSampler

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
