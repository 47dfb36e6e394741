"""Garbage-collector control for bulk object construction."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while building millions of long-lived objects.

    Every span, attribute dict and link tuple is a tracked container that survives; each
    full collection re-walks all of them, which made reading 1M spans ~8x slower. Nothing
    built here is cyclic garbage, so pausing is safe; the previous state is restored.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            _promote_young()
            gc.enable()


def _promote_young() -> None:
    """Move everything allocated during the pause straight to the oldest generation.

    Re-enabled as is, the collector's first young collection would walk every object built
    in the pause (a million spans: ~0.1 µs each, up to 10% of a run) only to find them all
    alive. ``freeze()`` + ``unfreeze()`` splices the generation lists instead (O(1)); the
    objects are still collected normally by the next full collection. Skipped when the
    process has frozen objects itself (``unfreeze`` would thaw them)."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
