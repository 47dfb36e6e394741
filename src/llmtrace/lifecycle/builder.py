"""The span builder: turns finished records into OTel spans on a background thread.

Creating an OTel span costs tens of microseconds in Python; the hot path only
hands a finished record to this service and moves on. :func:`flush` drains it
(``llmtrace.shutdown()`` and tests call it before reading spans).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from llmtrace._safety import record_error, warn_once

log = logging.getLogger("llmtrace")

#: Work items waiting to be materialised; beyond this, records are dropped and
#: counted rather than letting a stalled exporter grow the host's memory.
MAX_PENDING = 100_000


class SpanBuilder:
    """A named daemon thread running span-building jobs in order."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None] | threading.Event | None] = queue.SimpleQueue()
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
        if self._queue.qsize() >= MAX_PENDING:
            self.dropped += 1
            warn_once("builder-full", "llmtrace: span builder is %d jobs behind; dropping records", MAX_PENDING)
            return
        self._ensure_started()
        self._queue.put(job)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            cpu_start = time.thread_time()
            try:
                item()
            except Exception as exc:  # noqa: BLE001 - one bad record must not stop the service
                record_error("span-builder", exc)
            self.cpu_s += time.thread_time() - cpu_start
            # Give a serving thread that waits for the GIL its chance now rather than after
            # CPython's 5 ms switch interval: jobs run back to back when records pile up.
            time.sleep(0)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every job submitted so far has run."""
        if self._thread is None or not self._thread.is_alive():
            return True
        if threading.current_thread() is self._thread:
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        self.flush(timeout_s)
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._queue.put(None)
            thread.join(timeout_s)
        self._thread = None

    def _after_fork(self) -> None:
        # The parent's thread does not exist in the child; start afresh on first use.
        self._queue = queue.SimpleQueue()
        self._thread = None
        self.cpu_s = 0.0  # a per-process figure


BUILDER = SpanBuilder()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=BUILDER._after_fork)
