"""gRPC servers (``grpc.server`` and ``grpc.aio.server``): the SERVER span of each RPC, the RPC
duration metric, the first streamed message, cancellation.

What is traced
    Servers created after ``instrument()`` get llmtrace's interceptor. With
    ``server_spans="llmtrace"`` (the default) it is first in the chain and makes one SERVER
    span per RPC itself; OpenTelemetry's gRPC instrumentation is not enabled. Requests opened
    in the servicer (``start_request``, ``generate()``) are children of the SERVER span. In
    ``grpc.aio``, coroutine handlers and async-generator streaming handlers are covered; a
    streaming handler that writes through ``context.write()`` gets the SERVER span without
    the first-message time; a sync handler on a ``grpc.aio`` server is not traced.

    A server that holds OpenTelemetry's gRPC interceptor (the host enabled
    ``GrpcInstrumentorServer``/``GrpcAioInstrumentorServer`` itself, before or after
    ``instrument()``) keeps that SERVER span: llmtrace's interceptor goes after it and opens
    only its server scope inside it — never two SERVER spans. ``server_spans="otel"`` enables
    OpenTelemetry's instrumentors to make it (as that package emits it); ``"off"`` makes none.

Span
    Name ``package.Service/Method``, kind SERVER, parent from the invocation metadata
    (``traceparent``, ``tracestate``, ``baggage`` — the global propagator). Attributes
    ``rpc.system=grpc``, ``rpc.service``, ``rpc.method``, ``rpc.grpc.status_code`` (the names
    opentelemetry-instrumentation-grpc emits), ``client.address`` / ``client.port`` (the peer;
    that instrumentation's deprecated ``net.peer.ip`` / ``net.peer.port``), and
    ``llm.http.time_to_first_byte_s`` on a response-streaming RPC: the time to its first
    response message. Status code 0 (OK), the code the handler set or aborted with, 2
    (UNKNOWN) for a handler that raised (with the ``exception`` event and ``error.type``), 1
    (CANCELLED) when the client cancelled, 4 (DEADLINE_EXCEEDED) when the deadline ended it.
    The span is ERROR for the server-error codes of the RPC conventions: UNKNOWN,
    DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS.

Metric
    ``rpc.server.call.duration`` (seconds; the conventions' successor of ``rpc.server.duration``
    in ms) for every RPC, sampled or not, by ``rpc.system``, ``rpc.service``, ``rpc.method``,
    ``rpc.grpc.status_code``.

Cancellation
    An RPC that terminates before the servicer finished (client cancel, deadline, disconnect)
    ends its open requests with ``llm.request.finish_reason=abort``.

Architecture
    ``patch.py`` wraps ``grpc.server`` / ``grpc.aio.server`` to add the interceptor, which
    wraps each method handler once (cached per handler). ``server_span.py`` runs per RPC on
    the handler's thread or task: ids and the sampling decision at arrival
    (``integrations/_server_span.py``), the call's context attached and the server scope
    entered around the handler, the status read from the servicer context at the end, the
    metric recorded in-process, and — only for a sampled RPC — the finished span built on the
    span builder's thread. After the first message of a streamed response nothing runs per
    message.

Supported versions
    grpcio >= 1.60, opentelemetry-instrumentation-grpc >= 0.51b0 for ``server_spans="otel"``
    (tested with grpcio 1.85, 0.66b1).
"""

from __future__ import annotations

from llmtrace.integrations.grpc.patch import GrpcInstrumentor

INSTRUMENTOR = GrpcInstrumentor

__all__ = ["INSTRUMENTOR", "GrpcInstrumentor"]
