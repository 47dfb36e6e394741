"""An OTLP exporter that spills to disk while its endpoint fails and re-sends when it is back.

Three parts, none of them on the serving path:

* a circuit breaker around the OTLP exporter: after a failed export the endpoint is
  *down*; the export thread then hands every batch to the spill at once instead of waiting
  out the exporter's retries, and one probe per :data:`PROBE_INTERVAL_S` tries the endpoint;
* the overflow: a span that finds the in-memory queue full is appended to a small bounded
  deque (no I/O, no lock) that the spill thread writes to disk;
* the spill thread (``llmtrace-spill``): writes the overflow, and while the endpoint is up
  re-sends the spill oldest first, one line (one original export batch) per export call; while
  it is down, its re-send attempts are the probes.

Every span ends up exported, on disk, or dropped and counted with a reason
(:class:`llmtrace._otel.export.ExportStats`).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from llmtrace import semconv
from llmtrace._os_thread import name_os_thread
from llmtrace._otel.export import ExportStats, estimated_bytes
from llmtrace._otel.spill import SpillStore, usable_directory
from llmtrace._safety import record_error
from llmtrace.config import Settings

log = logging.getLogger("llmtrace")

#: While the endpoint is down, how often one export is let through to see whether it is back.
#: Recovery is seen within this (plus one export); each probe against a dead endpoint costs
#: the spill thread one exporter timeout.
PROBE_INTERVAL_S = 2.0
#: How often the spill thread looks for work when nothing wakes it.
IDLE_WAKE_S = 1.0
#: After re-sending one line the spill thread rests this many times as long as the line took:
#: re-sending a long outage's spill competes with the server for the CPU (and the GIL), so it
#: runs at a third of the spill thread's time at most; recovery takes longer, serving does not slow.
RESEND_PAUSE_RATIO = 2.0
#: How often the spill thread looks for segments left by processes that have exited.
ORPHAN_SCAN_S = 5.0
#: Spans per line the spill thread writes from the overflow (the export batch size).
OVERFLOW_BATCH = 512


class CircuitBreaker(SpanExporter):
    """Wraps an OTLP exporter: fails fast while the endpoint is known to be down.

    Exports are serialised (the export thread's live batches and the spill thread's
    re-sends share the exporter)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self.down = False
        self._probe_at = 0.0
        #: Set by the spill thread while it holds spans to re-send: it probes, the export thread does not.
        self.spill_probes = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ok = self.attempt(spans, probe=not self.spill_probes)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def attempt(self, spans: Sequence[ReadableSpan], probe: bool, wait: bool = True) -> bool | None:
        """Export *spans* unless the endpoint is down and no probe is due (or *probe* is False).

        With *wait* False, an export already running (the export thread's, which may take the
        exporter's whole timeout against a silent endpoint) is not waited for: None, nothing tried."""
        if self.down:
            now = time.monotonic()
            if not probe or now < self._probe_at:
                return False
            self._probe_at = now + PROBE_INTERVAL_S
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            try:
                ok = self.inner.export(spans) is SpanExportResult.SUCCESS
            except Exception as exc:  # noqa: BLE001 - an exporter bug is a failed export, not a dead thread
                record_error("otlp-export", exc)
                ok = False
        finally:
            self._lock.release()
        if ok:
            self.down = False
        elif not self.down:
            self.down = True
            self._probe_at = time.monotonic() + PROBE_INTERVAL_S
        return ok

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()


class Spiller:
    """The overflow deque, the spill store and the thread that writes and re-sends them."""

    def __init__(self, store: SpillStore, breaker: CircuitBreaker, stats: ExportStats,
                 max_spans: int, max_bytes: int) -> None:
        self.store = store
        self._breaker = breaker
        self._stats = stats
        self._overflow: collections.deque[ReadableSpan] = collections.deque()
        self._overflow_bytes = [0]
        self._max_spans, self._max_bytes = max_spans, max_bytes
        self._wake = threading.Event()
        self._halt = threading.Event()  # set by stop(): ends a re-send pause at once
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        #: Spans still on disk when :meth:`stop` closed the spill (for the exit summary).
        self.left_on_disk = 0
        _register_fork_hook(self)

    # ------------------------------------------------------------------ any thread, never blocks

    def offer(self, span: ReadableSpan, size: int) -> bool:
        """Take a span the in-memory queue had no room for; False when the overflow is full too."""
        if len(self._overflow) >= self._max_spans or self._overflow_bytes[0] + size > self._max_bytes:
            return False
        self._overflow.append(span)
        self._overflow_bytes[0] += size
        if len(self._overflow) in (1, OVERFLOW_BATCH):  # the thread wakes each second anyway
            self._ensure_started()
            self._wake.set()
        return True

    def write(self, spans: Sequence[ReadableSpan]) -> bool:
        """Spill a batch the endpoint did not take (the export thread calls this); counted here."""
        if not self.store.write(spans):
            return False
        self._stats.add_spilled(len(spans))
        self._breaker.spill_probes = True
        self._ensure_started()
        return True

    # ------------------------------------------------------------------ the spill thread

    def _ensure_started(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._start_lock:
            if (self._thread is None or not self._thread.is_alive()) and not self._stopping:
                self._thread = threading.Thread(target=self._run, name="llmtrace-spill", daemon=True)
                self._thread.start()

    def start(self) -> None:
        """Start now: spans spilled by an earlier process are re-sent without waiting for a failure."""
        self._ensure_started()

    def _run(self) -> None:
        name_os_thread("llmtrace-spill")
        next_scan = 0.0
        while not self._stopping:
            try:
                if time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + ORPHAN_SCAN_S
                    if self.store.adopt_orphans():
                        self._breaker.spill_probes = True
                self._drain_overflow()
                self._resend()
            except Exception as exc:  # noqa: BLE001 - the spill thread must outlive one bad batch
                record_error("spill", exc)
            self._wake.wait(IDLE_WAKE_S)
            self._wake.clear()

    def _drain_overflow(self) -> None:
        while self._overflow:
            batch: list[ReadableSpan] = []
            while self._overflow and len(batch) < OVERFLOW_BATCH:
                span = self._overflow.popleft()
                self._overflow_bytes[0] -= estimated_bytes(span)
                batch.append(span)
            if not self.write(batch):
                self._stats.add(len(batch), semconv.DROP_QUEUE_FULL)

    def _resend(self) -> None:
        """Re-send the spill oldest first while the endpoint takes it; a failure pauses until the next probe."""
        while self.store.pending and not self._stopping:
            lines = self.store.oldest_lines()
            try:
                started = time.monotonic()
                for segment, spans in lines:  # each line is decoded as it is reached
                    # Never queue behind the export thread's export: while it waits on the endpoint,
                    # this thread is what writes the overflow to disk.
                    if spans and not self._breaker.attempt(spans, probe=True, wait=False):
                        return
                    self.store.sent(segment, len(spans))
                    self._stats.add_exported(len(spans))
                    if self._overflow:
                        self._drain_overflow()
                    if self._halt.wait((time.monotonic() - started) * RESEND_PAUSE_RATIO):
                        return
                    started = time.monotonic()
            finally:
                lines.close()
        self._breaker.spill_probes = False

    def stop(self, timeout_s: float) -> None:
        """Write what the overflow holds and stop; the spill stays on disk."""
        self._stopping = True
        self._halt.set()
        self._wake.set()
        self._drain_overflow()
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(max(0.0, timeout_s))  # it may be inside one export; it stops after that
        self.left_on_disk = self.store.spans_on_disk
        self.store.close()

    def after_fork_in_child(self) -> None:
        self._overflow = collections.deque()
        self._overflow_bytes = [0]
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._start_lock = threading.Lock()
        self._thread = None
        self.store.after_fork_in_child()
        self._breaker.after_fork_in_child()


_SPILLERS: weakref.WeakSet[Spiller] = weakref.WeakSet()
_fork_hook = [False]


def _after_fork_in_child() -> None:
    for spiller in list(_SPILLERS):
        spiller.after_fork_in_child()


def _register_fork_hook(spiller: Spiller) -> None:
    if not _fork_hook[0] and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_hook[0] = True
    _SPILLERS.add(spiller)


def log_summary(stats: ExportStats, spillers: Sequence[Spiller]) -> None:
    """One line at shutdown when the export path spilled or dropped anything: where every span went."""
    if not stats.spilled and not stats.dropped:
        return
    left = sum(spiller.left_on_disk for spiller in spillers)
    where = ", ".join(sorted({spiller.store.directory for spiller in spillers})) or "-"
    reasons = ", ".join(f"{reason}={count}" for reason, count in sorted(stats.dropped_by_reason.items()))
    log.warning("llmtrace: spans exported %d, spilled %d (%d left on disk in %s, re-sent by the next process "
                "that uses it), dropped %d%s", stats.exported, stats.spilled, left, where, stats.dropped,
                f" ({reasons})" if reasons else "")


def with_spill(exporter: SpanExporter, settings: Settings, stats: ExportStats) -> tuple[CircuitBreaker, Spiller] | None:
    """*exporter* behind a circuit breaker, and the spiller that backs it; None when the spill is
    off (``spill_max_bytes=0``) or no directory is writable. The overflow holds a quarter of the
    in-memory queue's bounds."""
    if settings.spill_max_bytes == 0 or (directory := usable_directory(settings.spill_dir)) is None:
        return None
    breaker = CircuitBreaker(exporter)
    store = SpillStore(directory, settings.spill_max_bytes, settings.service_name,
                       lambda count: stats.add(count, semconv.DROP_SPILL_FULL))
    spiller = Spiller(store, breaker, stats, max(1, settings.max_queue_size // 4),
                      max(1, settings.max_queue_bytes // 4))
    if store.has_orphans():
        spiller.start()  # an earlier process left spans to re-send
    return breaker, spiller
