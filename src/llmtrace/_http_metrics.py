"""The standard HTTP server metrics, for every request llmtrace's SERVER span sees, sampled or not.

* ``http.server.request.duration`` — histogram, seconds, the semantic conventions' buckets,
  attributes ``http.request.method``, ``url.scheme``, ``http.response.status_code``,
  ``http.route``, ``network.protocol.version``, ``error.type`` (the set OpenTelemetry's
  instrumentations record);
* ``http.server.active_requests`` — up-down counter by ``http.request.method`` and
  ``url.scheme``, observed from two in-process counts at collection time.

Both cost about a microsecond per request: the histogram is aggregated in-process where
llmtrace owns the MeterProvider (see :mod:`llmtrace._histogram`), and the counter is two
integer increments instead of two SDK ``add`` calls (~10 µs each here).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from llmtrace import semconv
from llmtrace._histogram import AttributeKey, HistogramRegistry, histogram

#: Methods the HTTP conventions know; any other is reported as ``_OTHER`` (with the original
#: kept on the span as ``http.request.method_original``).
KNOWN_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})
OTHER_METHOD = "_OTHER"


def normalize_method(method: str) -> str:
    if method in KNOWN_METHODS:
        return method
    upper = method.upper()
    return upper if upper in KNOWN_METHODS else OTHER_METHOD


class HttpServerMetrics:
    """The instruments of one process, shared by every server integration."""

    def __init__(self, meter: Meter, registry: HistogramRegistry | None) -> None:
        self._duration = histogram(meter, registry, semconv.METRIC_HTTP_SERVER_DURATION, "s",
                                   "Duration of HTTP server requests.", semconv.HTTP_SERVER_DURATION_BUCKETS)
        self._lock = threading.Lock()
        # (method, scheme) -> [started, ended]: the counter observed is the difference.
        self._active: dict[tuple[str, str], list[int]] = {}
        meter.create_observable_up_down_counter(
            semconv.METRIC_HTTP_SERVER_ACTIVE_REQUESTS, [self._observe_active], unit="{request}",
            description="Number of active HTTP server requests.")

    def started(self, method: str, scheme: str) -> None:
        key = (method, scheme)
        with self._lock:
            counts = self._active.get(key)
            if counts is None:
                counts = self._active[key] = [0, 0]
            counts[0] += 1

    def request_done(self, duration_s: float, method: str, scheme: str, status: int | None, route: str | None,
                     protocol_version: str | None, error_type: str | None) -> None:
        """One request ended (it is no longer active) after *duration_s*; attributes in a fixed
        order, absent ones left out."""
        with self._lock:
            counts = self._active.get((method, scheme))
            if counts is not None:
                counts[1] += 1
        key: AttributeKey = ((semconv.HTTP_REQUEST_METHOD, method), (semconv.URL_SCHEME, scheme))
        if status is not None:
            key += ((semconv.HTTP_RESPONSE_STATUS_CODE, status),)
        if route:
            key += ((semconv.HTTP_ROUTE, route),)
        if protocol_version:
            key += ((semconv.NETWORK_PROTOCOL_VERSION, protocol_version),)
        if error_type:
            key += ((semconv.ERROR_TYPE, error_type),)
        self._duration.record(duration_s, key)

    def _observe_active(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            items = [(key, started - ended) for key, (started, ended) in self._active.items()]
        return [Observation(count, _active_attributes(key)) for key, count in items]


def _active_attributes(key: tuple[str, str]) -> dict[str, Any]:
    return {semconv.HTTP_REQUEST_METHOD: key[0], semconv.URL_SCHEME: key[1]}
