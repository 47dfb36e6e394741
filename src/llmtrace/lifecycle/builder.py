"""The span builder: turns finished records into OTel spans on a background thread.

Creating an OTel span costs tens of microseconds in Python; the hot path only
hands a finished record to this service and moves on. :func:`flush` drains it
(``llmtrace.shutdown()`` and tests call it before reading spans).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable

from llmtrace import _runtime
from llmtrace._os_thread import name_os_thread
from llmtrace._otel.gil import GilYield
from llmtrace._safety import record_error, warn_once
from llmtrace.config import Settings

log = logging.getLogger("llmtrace")

#: Work items waiting to be materialised; beyond this, records are dropped and
#: counted rather than letting a stalled exporter grow the host's memory.
MAX_PENDING = 100_000


#: How long the builder lets records pile up after the first one wakes it, as a share of the span
#: export interval (``span_export_interval_s``): one wake-up (and one GIL hand-off) per batch
#: instead of per record. A finished span waits in the export queue for up to that interval
#: anyway; this adds a twentieth to it at most. ``flush()`` skips the wait.
BATCH_SHARE = 0.05
#: The batching pause at the default export interval.
BATCH_S = BATCH_SHARE * Settings.span_export_interval_s


def _batch_s() -> float:
    return _runtime.settings().span_export_interval_s * BATCH_SHARE


class SpanBuilder:
    """A named daemon thread running span-building jobs in order.

    Submitting appends to a deque (atomic under the GIL: no lock, no futex) and wakes the
    thread only when it sleeps; awake, the thread runs what arrived every :data:`BATCH_S` (at the
    default export interval) and sleeps again after a round with nothing to do. On the traced
    reference server the per-record wake-up (``SimpleQueue.put``) was the serving threads'
    largest single llmtrace line in a sampling profile (docs/performance.md, "Where the
    server's CPU goes").
    """

    def __init__(self) -> None:
        self._pending: collections.deque[Callable[[], None] | threading.Event | None] = collections.deque()
        self._wake = threading.Event()
        self._hurry = threading.Event()  # flush()/stop() wait: cut the batching pause short
        self._awake = False  # the thread is batching or running jobs: a submit need not wake it
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0
        #: CPU seconds spent building (this thread only writes it): llmtrace's own overhead.
        self.cpu_s = 0.0

    def _ensure_started(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="llmtrace-span-builder", daemon=True)
                self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            warn_once("builder-full", "llmtrace: span builder is %d jobs behind; dropping records", MAX_PENDING)
            return
        self._put(job)

    def _put(self, item: Callable[[], None] | threading.Event | None, urgent: bool = False) -> None:
        if urgent or not self._awake:
            # Only when the thread is to be woken: while it is awake it is alive, and most
            # records arrive then (one is_alive() per batch, not per record).
            self._ensure_started()
        self._pending.append(item)
        if urgent:
            self._hurry.set()
        if urgent or not self._awake:
            self._awake = True
            self._wake.set()

    def _run(self) -> None:
        name_os_thread("llmtrace-build")
        while True:
            self._wake.wait()
            # Awake: a batch every BATCH_S for as long as records keep coming. Under steady load
            # no serving thread ever wakes the thread (an Event.set, a futex wake and a GIL
            # hand-off per batch were the largest single llmtrace line of a vLLM API server's
            # profile); one empty round puts it back to sleep.
            while True:
                self._hurry.wait(_batch_s())  # let a busy moment's records arrive: one round for all
                self._hurry.clear()
                if self._pending:
                    if not self._drain():
                        return
                    continue
                # Idle. The event is cleared before the flag goes down, and the queue read again
                # after: a record appended from here on is either seen below or finds the flag
                # down and sets the event again.
                self._wake.clear()
                self._awake = False
                if not self._pending:
                    break
                self._awake = True

    def _drain(self) -> bool:
        """Run every pending job; False when the stop marker came."""
        pending = self._pending
        pause = GilYield()
        # CPU time is read once per batch, not per job: two clock reads (system calls) per
        # record were a measurable part of building an unsampled request's metrics.
        cpu_start = time.thread_time()
        try:
            while pending:
                item = pending.popleft()
                if item is None:
                    return False
                if isinstance(item, threading.Event):
                    now = time.thread_time()  # counted before the flush() waiting on it returns
                    self.cpu_s += now - cpu_start
                    cpu_start = now
                    item.set()
                    continue
                try:
                    item()
                except Exception as exc:  # noqa: BLE001 - one bad record must not stop the service
                    record_error("span-builder", exc)
                # Give a serving thread that waits for the GIL its chance every 0.5 ms of
                # building rather than after CPython's 5 ms switch interval.
                pause.maybe()
        finally:
            self.cpu_s += time.thread_time() - cpu_start
        return True

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every job submitted so far has run."""
        if self._thread is None or not self._thread.is_alive():
            return True
        if threading.current_thread() is self._thread:
            return True
        done = threading.Event()
        self._put(done, urgent=True)
        return done.wait(timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        self.flush(timeout_s)
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._put(None, urgent=True)
            thread.join(timeout_s)
        self._thread = None

    def _after_fork(self) -> None:
        # The parent's thread does not exist in the child; start afresh on first use.
        self._pending = collections.deque()
        self._wake = threading.Event()
        self._hurry = threading.Event()
        self._awake = False
        self._thread = None
        self.cpu_s = 0.0  # a per-process figure


BUILDER = SpanBuilder()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=BUILDER._after_fork)
