"""The standard HTTP server metrics, for every request llmtrace's SERVER span sees, sampled or not.

* ``http.server.request.duration`` — histogram, seconds, the semantic conventions' buckets,
  attributes ``http.request.method``, ``url.scheme``, ``http.response.status_code``,
  ``http.route``, ``network.protocol.version``, ``error.type`` (the set OpenTelemetry's
  instrumentations record);
* ``http.server.active_requests`` — up-down counter by ``http.request.method`` and
  ``url.scheme``, observed from two in-process counts at collection time.

Both cost next to nothing per request: the histogram is aggregated in-process where
llmtrace owns the MeterProvider (see :mod:`llmtrace._otel.histogram`: a list append per request),
and the counter is two ``next()`` calls on C counters instead of two SDK ``add`` calls
(~10 µs each here).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable
from typing import Any, cast

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from llmtrace import semconv
from llmtrace._otel.histogram import MAX_PENDING, HistogramRegistry, histogram

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
    """The instruments of one process, shared by every server integration.

    A server integration calls :meth:`started` when a call arrives and keeps what it returns;
    when the call ends it passes that to :meth:`request_done`. Active calls are two counters per
    ``(method, scheme)`` — ``itertools.count`` objects, whose ``next()`` is one atomic C call —
    observed as their difference.
    """

    def __init__(self, meter: Meter, registry: HistogramRegistry | None) -> None:
        self.duration = histogram(meter, registry, semconv.METRIC_HTTP_SERVER_DURATION, "s",
                                  "Duration of HTTP server requests.", semconv.HTTP_SERVER_DURATION_BUCKETS,
                                  _duration_attributes)
        # (method, scheme) -> (started, ended) counters, both from 0.
        self._active: dict[tuple[str, str], tuple[itertools.count[int], itertools.count[int]]] = {}
        meter.create_observable_up_down_counter(
            semconv.METRIC_HTTP_SERVER_ACTIVE_REQUESTS, [self._observe_active], unit="{request}",
            description="Number of active HTTP server requests.")

    def started(self, method: str, scheme: str) -> itertools.count[int]:
        """A call arrived; returns its ``ended`` counter, for :meth:`request_done`."""
        counters = self._active.get((method, scheme))
        if counters is None:
            # setdefault: two threads creating the same key agree on one pair.
            counters = self._active.setdefault((method, scheme), (itertools.count(), itertools.count()))
        next(counters[0])
        return counters[1]

    def request_done(self, ended: itertools.count[int], duration_s: float, method: str, scheme: str,
                     status: int | None, route: str | None, protocol_version: str | None,
                     error_type: str | None) -> None:
        """The call that :meth:`started` returned *ended* for is over, after *duration_s*."""
        next(ended)
        duration = self.duration
        duration.record((duration_s, (method, scheme, status, route, protocol_version, error_type)))
        if len(duration.pending) >= MAX_PENDING:
            duration.fold()

    def _observe_active(self, options: CallbackOptions) -> Iterable[Observation]:
        # Reading a counter advances it: both counters of a pair advance once per observation, so
        # their difference stays started - ended. ``ended`` is read first: a call that starts and
        # ends between the two reads can only make one observation one too high, never negative.
        observations = []
        for key, (started, ended) in list(self._active.items()):
            done = next(ended)
            observations.append(Observation(next(started) - done, _active_attributes(key)))
        return observations


def _active_attributes(key: tuple[str, str]) -> dict[str, Any]:
    return {semconv.HTTP_REQUEST_METHOD: key[0], semconv.URL_SCHEME: key[1]}


#: The attributes of http.server.request.duration, in the order of its keys (OpenTelemetry's set).
_DURATION_ATTRIBUTES = (semconv.HTTP_REQUEST_METHOD, semconv.URL_SCHEME, semconv.HTTP_RESPONSE_STATUS_CODE,
                        semconv.HTTP_ROUTE, semconv.NETWORK_PROTOCOL_VERSION, semconv.ERROR_TYPE)


def _duration_attributes(key: Hashable) -> dict[str, Any]:
    """A recorded key's attributes, absent ones left out (built at export, not per request)."""
    values = cast(tuple[Any, ...], key)  # what request_done records
    return {name: value for name, value in zip(_DURATION_ATTRIBUTES, values, strict=True)
            if value is not None and value != ""}
