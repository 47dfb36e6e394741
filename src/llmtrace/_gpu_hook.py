"""The one door from the lifecycle core to the GPU sampler (which may be absent).

Span builders call these off the hot path; with no sampler running they return
nothing, so every code path works on a machine without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# get_sampler, imported on first use (not at import: the core must not load llmtrace.gpu
# unless asked) and kept: a per-call ``from ... import`` costs ~1 µs, a third of the
# per-span annotation budget.
_get_sampler: Callable[[], Any] | None = None


def _sampler() -> Any | None:
    global _get_sampler
    get = _get_sampler
    if get is None:
        try:
            from llmtrace.gpu.sampler import get_sampler
        except ImportError:
            return None
        _get_sampler = get = get_sampler
    return get()


def span_attributes_for(start_mono_ns: int, end_mono_ns: int) -> dict[str, Any]:
    """GPU mean/max attributes over a span's lifetime, or {} without a sampler."""
    sampler = _sampler()
    if sampler is None:
        return {}
    try:
        attrs: dict[str, Any] = sampler.span_attributes(start_mono_ns, end_mono_ns)  # a new dict per call
    except Exception:  # noqa: BLE001 - GPU trouble never costs a span
        return {}
    return attrs


def energy_j(start_mono_ns: int, end_mono_ns: int) -> float | None:
    """Energy the process's GPUs used in the interval, or None."""
    sampler = _sampler()
    if sampler is None:
        return None
    try:
        value = sampler.energy_j(start_mono_ns, end_mono_ns)
    except Exception:  # noqa: BLE001
        return None
    return None if value is None else float(value)


def energy_available() -> bool:
    """Whether a running sampler has devices (so per-step energy can be attributed).

    Called when an engine is created (start-up, not the hot path): waits briefly for a
    sampler that is still taking its first pass.
    """
    sampler = _sampler()
    if sampler is None:
        return False
    try:
        if not sampler.available and hasattr(sampler, "wait_ready"):
            sampler.wait_ready(1.0)
        return bool(sampler.available)
    except Exception:  # noqa: BLE001
        return False
