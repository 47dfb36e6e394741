"""Export plumbing: the OTLP-JSON-lines file exporter and a bounded, counting span processor.

The file format is the OTLP/JSON mapping, one ``ExportTraceServiceRequest``
(``{"resourceSpans": [...]}``) or ``ExportMetricsServiceRequest``
(``{"resourceMetrics": [...]}``) per line, ids in hex — the same format the
collector's file exporter writes, so ``llmtrace analyze`` reads both.
Several processes (API server, engine) may append to one file: each batch is one
``write()`` on an ``O_APPEND`` descriptor, which Linux does not interleave.
"""

from __future__ import annotations

import base64
import collections
import functools
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from google.protobuf.json_format import MessageToDict
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext

from llmtrace import semconv
from llmtrace._otel.gil import GilYield
from llmtrace._otel.otlp_json import encode_spans
from llmtrace._otel.span_context import DIRECT_SPAN_CONTEXT
from llmtrace._safety import warn_once

log = logging.getLogger("llmtrace")

_ID_KEYS = frozenset(("traceId", "spanId", "parentSpanId"))


def _hex_ids(node: Any) -> Any:
    """OTLP/JSON wants trace and span ids in hex; protobuf's JSON mapping gives base64."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)
    return node


def _metrics_json(metrics_data: MetricsData) -> str:
    """An ``ExportMetricsServiceRequest`` in the OTLP/JSON mapping, as one line: the SDK's
    protobuf encoding, mapped to JSON (metrics are few; spans have their own encoder)."""
    document = _hex_ids(MessageToDict(encode_metrics(metrics_data), use_integers_for_enums=True))
    return json.dumps(document, separators=(",", ":"))


class _AppendFile:
    """One O_APPEND descriptor shared by the span and metric exporters of a process."""

    _announced: ClassVar[set[str]] = set()

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        if self.path not in _AppendFile._announced and os.environ.get("LLMTRACE_QUIET") != "1":
            _AppendFile._announced.add(self.path)
            log.warning("llmtrace: writing traces and metrics to %s", self.path)

    def write_line(self, text: str) -> None:
        data = (text + "\n").encode()
        with self._lock:
            if self._fd >= 0:
                os.write(self._fd, data)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class JsonLinesSpanExporter(SpanExporter):
    """Writes span batches as OTLP/JSON lines."""

    def __init__(self, sink: _AppendFile) -> None:
        self._sink = sink

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            self._sink.write_line(encode_spans(spans, GilYield().maybe))
        except OSError as exc:
            warn_once(f"file-export:{self._sink.path}", "llmtrace: cannot write %s: %s", self._sink.path, exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._sink.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class _JsonPoster:
    """POSTs OTLP/JSON documents to one OTLP/HTTP endpoint (``http/json`` in the OTLP spec).

    Retries what the OTLP spec calls retryable (connection errors, 429, 502, 503, 504) with
    exponential backoff inside the export timeout; ``shutdown()`` ends a wait at once.
    """

    RETRYABLE = frozenset((429, 502, 503, 504))

    def __init__(self, endpoint: str, headers: dict[str, str] | None, timeout_s: float) -> None:
        import requests

        self._requests = requests
        self._session = requests.Session()
        self._session.headers.update({"Content-Type": "application/json", **(headers or {})})
        self._endpoint = endpoint
        self._timeout_s = timeout_s
        self._stopped = threading.Event()

    def post(self, body: bytes) -> bool:
        deadline = time.monotonic() + self._timeout_s
        delay = 0.25
        while not self._stopped.is_set():
            try:
                response = self._session.post(self._endpoint, data=body,
                                              timeout=max(0.1, deadline - time.monotonic()))
                if 200 <= response.status_code < 300:
                    return True
                retry = response.status_code in self.RETRYABLE
            except self._requests.exceptions.RequestException:  # refused, reset, timed out
                retry = True
            if not retry or time.monotonic() + delay >= deadline or self._stopped.wait(delay):
                return False
            delay *= 2
        return False

    def shutdown(self) -> None:
        self._stopped.set()
        self._session.close()


class OtlpHttpJsonSpanExporter(SpanExporter):
    """OTLP/HTTP with JSON bodies: the file exporter's encoder (measured 4–5× cheaper per span
    than the SDK's protobuf messages, and it hands the GIL back as it goes) on the wire."""

    def __init__(self, endpoint: str, headers: dict[str, str] | None = None, timeout_s: float = 5.0) -> None:
        self._poster = _JsonPoster(endpoint, headers, timeout_s)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        body = encode_spans(spans, GilYield().maybe).encode()
        return SpanExportResult.SUCCESS if self._poster.post(body) else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._poster.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class OtlpHttpJsonMetricExporter(MetricExporter):
    """Metrics over OTLP/HTTP with JSON bodies (``resourceMetrics``, ids in hex)."""

    def __init__(self, endpoint: str, headers: dict[str, str] | None = None, timeout_s: float = 5.0) -> None:
        super().__init__()
        self._poster = _JsonPoster(endpoint, headers, timeout_s)

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        ok = self._poster.post(_metrics_json(metrics_data).encode())
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._poster.shutdown()


class JsonLinesMetricExporter(MetricExporter):
    """Writes metric batches as OTLP/JSON lines (``resourceMetrics``)."""

    def __init__(self, sink: _AppendFile) -> None:
        super().__init__()
        self._sink = sink

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        try:
            self._sink.write_line(_metrics_json(metrics_data))
        except OSError:
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._sink.close()


def open_sink(path: str) -> _AppendFile:
    return _AppendFile(path)


def _reset_in_child(stats: weakref.ref[ExportStats]) -> None:
    if (alive := stats()) is not None:
        alive._reset()


class ExportStats:
    """Where the spans given to llmtrace's export path went: exported, spilled to disk, or dropped
    (``llmtrace.spans.dropped``, by reason); and the CPU its export threads spent
    (``llmtrace.overhead.cpu_time``, worker ``exporter``)."""

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):  # per-process figures: a forked child counts from zero
            os.register_at_fork(after_in_child=functools.partial(_reset_in_child, weakref.ref(self)))

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self.dropped_by_reason: dict[str, int] = {}
        self.exported = 0
        self.spilled = 0
        self.cpu_s = 0.0

    @property
    def dropped(self) -> int:
        return sum(self.dropped_by_reason.values())

    def add(self, count: int, reason: str) -> None:
        with self._lock:
            self.dropped_by_reason[reason] = self.dropped_by_reason.get(reason, 0) + count

    def add_exported(self, count: int) -> None:
        with self._lock:
            self.exported += count

    def add_spilled(self, count: int) -> None:
        with self._lock:
            self.spilled += count

    def add_cpu(self, seconds: float) -> None:
        with self._lock:
            self.cpu_s += seconds


#: The queue's byte bound counts an estimate, taken where a span ends without reading its
#: attributes (that would cost more than the rest of the enqueue): a fixed part plus one
#: per attribute, event and link. Measured on the reference server's spans in export batches,
#: it is 1.13x their OTLP/JSON bytes (an ``llm.request`` of 27 attributes: 2128 estimated).
SPAN_BYTES = 400
ITEM_BYTES = 64


def estimated_bytes(span: ReadableSpan) -> int:
    if type(span) is ReadableSpan:  # its fields, without the mapping proxy and the two tuple copies its properties make
        return SPAN_BYTES + ITEM_BYTES * (len(span._attributes or ()) + len(span._events or ())
                                          + len(span._links or ()))
    return SPAN_BYTES + ITEM_BYTES * (len(span.attributes or ()) + len(span.events) + len(span.links))


class _Spill(Protocol):
    """What the processor needs of the spill (:class:`llmtrace._otel.spill_export.Spiller`)."""

    def offer(self, span: ReadableSpan, size: int) -> bool: ...

    def write(self, spans: Sequence[ReadableSpan]) -> bool: ...

    def stop(self, timeout_s: float) -> None: ...


class _CountingExporter(SpanExporter):
    """Counts what the inner exporter delivered; what it could not goes to the spill, or is
    dropped and counted, and said once."""

    def __init__(self, inner: SpanExporter, drops: ExportStats, pending: list[int], name: str,
                 spill: _Spill | None) -> None:
        self._inner, self._drops, self._pending, self._name, self._spill = inner, drops, pending, name, spill
        #: Set when llmtrace shuts down past its flush deadline: what is left is spilled, or dropped and counted.
        self.closing = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._pending[0] -= len(spans)
        self._pending[1] -= sum(map(estimated_bytes, spans))
        if self.closing:
            return self._undelivered(spans, semconv.DROP_SHUTDOWN)
        cpu_start = time.thread_time()
        try:
            result = self._inner.export(spans)
        except Exception as exc:  # noqa: BLE001 - an exporter bug must not kill the export thread
            warn_once(f"export-exc:{self._name}", "llmtrace: exporter %s failed: %r", self._name, exc)
            result = SpanExportResult.FAILURE
        finally:
            self._drops.add_cpu(time.thread_time() - cpu_start)
        if result is SpanExportResult.SUCCESS:
            self._drops.add_exported(len(spans))
            return result
        return self._undelivered(spans, semconv.DROP_EXPORT_FAILED)

    def _undelivered(self, spans: Sequence[ReadableSpan], reason: str) -> SpanExportResult:
        if self._spill is not None and self._spill.write(spans):
            return SpanExportResult.FAILURE
        self._drops.add(len(spans), reason)
        warn_once(f"export-fail:{self._name}",
                  "llmtrace: exporting to %s failed; spans are being dropped and counted "
                  "(metric llmtrace.spans.dropped). The application is unaffected.", self._name)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


def _sdk_batch_queue(batch: BatchSpanProcessor) -> Any | None:
    """The SDK batch processor's inner queue owner, when it has the shape this module fills
    directly (None: any other shape; spans then go through its ``on_end`` one by one).

    Its ``emit`` appends one span to a deque and wakes the export thread at a full batch; a
    request's five spans or an engine step's took five passes through it, a fifth of what the
    span builder spent per request. The bounds that ``emit`` would check are this module's,
    tighter: the queue never reaches its length here."""
    inner = getattr(batch, "_batch_processor", None)
    queue = getattr(inner, "_queue", None)
    if (type(queue) is collections.deque and queue.maxlen is not None
            and isinstance(getattr(inner, "_worker_awaken", None), threading.Event)
            and type(getattr(inner, "_max_export_batch_size", None)) is int
            and type(getattr(inner, "_shutdown", None)) is bool and type(getattr(inner, "_pid", None)) is int):
        return inner
    return None


class BoundedSpanProcessor(SpanProcessor):
    """A BatchSpanProcessor whose queue is bounded in spans and (estimated) bytes, and whose
    every span is accounted for in :class:`ExportStats`.

    The SDK's batch processor also bounds its queue, but drops silently. Here a span that
    finds the queue full goes to the *spill*'s overflow when there is one (written to disk
    by the spill's own thread: nothing here blocks), else it is dropped and counted.
    """

    def __init__(self, exporter: SpanExporter, drops: ExportStats, max_queue_size: int, name: str,
                 max_queue_bytes: int = 1 << 62, spill: _Spill | None = None, interval_s: float = 1.0) -> None:
        # [spans, bytes] pending; a list so the exporter wrapper can decrement it; GIL-atomic enough for a bound
        self._pending = [0, 0]
        if hasattr(os, "register_at_fork"):  # a forked child's batch processor starts with an empty queue
            pending = self._pending
            os.register_at_fork(after_in_child=lambda: pending.__setitem__(slice(None), [0, 0]))
        self._max = max_queue_size
        self._max_bytes = max_queue_bytes
        self._drops = drops
        #: Where spans the endpoint refuses go (None: they are dropped and counted).
        self.spill = spill
        self._counting = _CountingExporter(exporter, drops, self._pending, name, spill)
        self._batch = BatchSpanProcessor(
            self._counting,
            max_queue_size=max_queue_size,
            max_export_batch_size=min(512, max_queue_size),
            schedule_delay_millis=interval_s * 1000,  # the SDK worker's wake-up period (span_export_interval_s)
            export_timeout_millis=5000,
        )
        self._sdk_queue = _sdk_batch_queue(self._batch)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if self._admit(span):
            self._batch.on_end(span)

    def _admit(self, span: ReadableSpan) -> bool:
        """Whether *span* goes to the queue: sampled, and within the bounds (else it is spilled,
        or dropped and counted)."""
        # An SDK span's context read without its property frame, and its flag without two more.
        context = span._context if type(span) is ReadableSpan else span.context
        if context is None:
            return False
        if type(context) is SpanContext and DIRECT_SPAN_CONTEXT:
            if not context[3] & 1:
                return False
        elif not context.trace_flags.sampled:
            return False
        size = estimated_bytes(span)
        pending = self._pending
        if pending[0] >= self._max or pending[1] + size > self._max_bytes:
            if self.spill is not None and self.spill.offer(span, size):
                return False
            self._drops.add(1, semconv.DROP_QUEUE_FULL)
            warn_once("export-queue-full", "llmtrace: export queue full (%d spans or %d bytes); dropping and "
                      "counting", self._max, self._max_bytes)
            return False
        pending[0] += 1
        pending[1] += size
        return True

    def on_end_many(self, spans: Sequence[ReadableSpan]) -> None:
        """:meth:`on_end` for each of *spans*, in one call from the span builder instead of one per
        span through the provider's processors; each keeps the span and byte bounds and the spill.
        The admitted spans join the SDK batch processor's queue together (see :func:`_sdk_batch_queue`)."""
        inner = self._sdk_queue
        if inner is None or inner._shutdown or inner._pid != os.getpid():
            for span in spans:
                self.on_end(span)
            return
        admit = self._admit
        if not (admitted := [span for span in spans if admit(span)]):
            return
        queue = inner._queue
        queue.extendleft(admitted)  # what appendleft one by one does, the order included
        if len(queue) >= inner._max_export_batch_size and not inner._worker_awaken.is_set():
            inner._worker_awaken.set()

    def shutdown(self) -> None:
        self.close(30_000)

    def close(self, timeout_millis: int) -> None:
        """Stop within *timeout_millis*: whatever could not be exported by then is dropped and counted."""
        deadline = time.monotonic() + timeout_millis / 1000
        self._counting.closing = True
        # BatchSpanProcessor.shutdown() takes no timeout; its inner processor does.
        self._batch._batch_processor.shutdown(timeout_millis=max(1, timeout_millis))
        if self.spill is not None:
            self.spill.stop(deadline - time.monotonic())

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what is queued, giving up after *timeout_millis*.

        The SDK's own flush ignores its timeout and retries each batch against a dead
        collector; here it runs on a helper thread and the caller stops waiting on time.
        """
        result: list[bool] = []
        worker = threading.Thread(target=lambda: result.append(self._batch.force_flush(timeout_millis)),
                                  name="llmtrace-flush", daemon=True)
        worker.start()
        worker.join(timeout_millis / 1000)
        return bool(result and result[0])
