"""gRPC servers (``grpc.server`` and ``grpc.aio.server``): the SERVER span, first streamed
message, cancellation.

What is traced
    The SERVER span is opentelemetry-instrumentation-grpc's (reused): servers
    created after ``instrument()`` get its interceptor. llmtrace appends an
    interceptor of its own (innermost) that opens the server scope per RPC —
    unary and streaming responses — so requests opened in the servicer
    (``start_request``, ``generate()``) are children of the SERVER span. In
    ``grpc.aio``, coroutine handlers and async-generator streaming handlers are
    covered; a streaming handler that writes through ``context.write()`` gets the
    SERVER span only.

Attributes
    ``llm.http.time_to_first_byte_s`` on the SERVER span of a response-streaming
    RPC: the time to its first response message. An RPC that terminates before
    the servicer finished (client cancel, deadline, disconnect) ends its open
    requests with ``llm.request.finish_reason=abort``.

Supported versions
    grpcio >= 1.60, opentelemetry-instrumentation-grpc >= 0.51b0 (tested with
    grpcio 1.85, 0.66b1).
"""

from __future__ import annotations

from llmtrace.integrations.grpc.patch import GrpcInstrumentor

INSTRUMENTOR = GrpcInstrumentor

__all__ = ["INSTRUMENTOR", "GrpcInstrumentor"]
