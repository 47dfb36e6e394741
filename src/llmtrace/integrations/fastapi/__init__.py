"""FastAPI / Starlette: the SERVER span, HTTP metrics, time to first byte, client disconnects.

What is traced
    Every ``FastAPI`` app gets llmtrace's own SERVER span when it builds its middleware
    stack (at its first request, so apps created before ``instrument()`` are covered too):
    the stable HTTP semantic conventions, named ``METHOD /route/{template}``, in the caller's
    trace when a ``traceparent`` arrives, built off the request path and only for sampled
    calls (``llmtrace.integrations._server_span``). Inside it llmtrace opens a server scope
    (``llmtrace.lifecycle.scope``): requests opened in the handler — ``start_request`` or
    ``generate()`` — are children of the SERVER span, their arrival is the call's arrival,
    and they end when the response is complete. ``server_spans="otel"`` uses
    opentelemetry-instrumentation-fastapi's span instead; an app the host instrumented with
    OpenTelemetry keeps that one, and llmtrace joins it.

Attributes and metrics
    See docs/span-model.md ("The SERVER span of an ASGI app"): the HTTP attributes,
    ``llm.http.time_to_first_byte_s`` on a streamed response, ``traceresponse`` and
    ``Server-Timing`` on traced responses, ``http.server.request.duration`` and
    ``http.server.active_requests`` for every call. A client that disconnects before the
    response is complete ends the call's open requests with
    ``llm.request.finish_reason=abort``.

Starlette
    A plain Starlette app is the ``starlette`` integration's
    (``llmtrace.integrations.starlette``): the same SERVER span and scope.

Supported versions
    fastapi >= 0.110 (tested with fastapi 0.136, starlette 1.10); for ``server_spans="otel"``,
    opentelemetry-instrumentation-fastapi >= 0.51b0 (tested with 0.66b1).
"""

from __future__ import annotations

from llmtrace.integrations.fastapi.patch import FastAPIInstrumentor

INSTRUMENTOR = FastAPIInstrumentor

__all__ = ["INSTRUMENTOR", "FastAPIInstrumentor"]
