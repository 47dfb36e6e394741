"""The RPC server duration, for every RPC llmtrace's gRPC SERVER span sees, sampled or not.

``rpc.server.call.duration`` — histogram, seconds, attributes ``rpc.system``, ``rpc.service``,
``rpc.method``, ``rpc.grpc.status_code``. Recorded like ``http.server.request.duration``
(:mod:`llmtrace._http_metrics`): a list append per RPC where llmtrace owns the MeterProvider,
the attributes made from the recorded key only at export.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, cast

from opentelemetry.metrics import Meter

from llmtrace import semconv
from llmtrace._otel.histogram import MAX_PENDING, HistogramRegistry, histogram


class RpcServerMetrics:
    """The RPC instruments of one process, shared by the gRPC servers in it."""

    def __init__(self, meter: Meter, registry: HistogramRegistry | None) -> None:
        self.duration = histogram(meter, registry, semconv.METRIC_RPC_SERVER_DURATION, "s",
                                  "Measures the duration of an incoming Remote Procedure Call (RPC).",
                                  semconv.RPC_SERVER_DURATION_BUCKETS, _duration_attributes)

    def rpc_done(self, duration_s: float, system: str, method: str, status_code: int) -> None:
        """One RPC is over after *duration_s*; *method* is the full ``/package.Service/Method``."""
        duration = self.duration
        duration.record((duration_s, (system, method, status_code)))
        if len(duration.pending) >= MAX_PENDING:
            duration.fold()


def split_method(full_method: str) -> tuple[str, str]:
    """``/package.Service/Method`` -> (``package.Service``, ``Method``)."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service, method


def _duration_attributes(key: Hashable) -> dict[str, Any]:
    system, full_method, status_code = cast(tuple[str, str, int], key)  # what rpc_done records
    service, method = split_method(full_method)
    attributes: dict[str, Any] = {semconv.RPC_SYSTEM: system, semconv.RPC_GRPC_STATUS_CODE: status_code}
    if service:
        attributes[semconv.RPC_SERVICE] = service
    if method:
        attributes[semconv.RPC_METHOD] = method
    return attributes
