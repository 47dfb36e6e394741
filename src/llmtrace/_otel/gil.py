"""Giving the GIL back to the serving threads while llmtrace's own threads work.

The span builder and the export thread run long stretches of pure Python (a 256-step
engine window, a 512-span export batch: tens of milliseconds here). A serving thread that
wants the GIL meanwhile waits for CPython's switch interval (5 ms) each time, and an
engine loop sees that as stalls between its steps — GPU idle that tracing caused. These
threads call :meth:`GilYield.maybe` between items; every ``interval_ns`` of their work it
sleeps for zero seconds, which releases the GIL: a thread already waiting for it usually
takes it then (not always — whichever thread the OS wakes first wins; measured, the engine
loop's p99.9 stall fell from 14 to ~3.5 ms: docs/performance.md, "GIL stalls").
"""

from __future__ import annotations

import time

#: How long llmtrace's threads hold on to the GIL at most between two yields.
YIELD_INTERVAL_NS = 500_000


class GilYield:
    """Call :meth:`maybe` between work items; it yields the GIL once per interval."""

    __slots__ = ("_due_ns", "_interval_ns")

    def __init__(self, interval_ns: int = YIELD_INTERVAL_NS) -> None:
        self._interval_ns = interval_ns
        self._due_ns = time.perf_counter_ns() + interval_ns

    def maybe(self) -> None:
        now = time.perf_counter_ns()
        if now >= self._due_ns:
            time.sleep(0)  # releases the GIL: a thread waiting for it gets its chance now
            self._due_ns = time.perf_counter_ns() + self._interval_ns
