"""FastAPI / Starlette: the SERVER span, time to first byte, client disconnects.

What is traced
    The SERVER span is opentelemetry-instrumentation-fastapi's (reused, not
    rewritten): each ``FastAPI`` app is instrumented when it builds its middleware
    stack, so apps created before ``instrument()`` are covered too. The per-message
    ``http send``/``http receive`` spans are excluded (one per streamed token).
    Inside the SERVER span llmtrace opens a server scope (see
    ``llmtrace.lifecycle.scope``): requests opened in the handler —
    ``start_request`` or ``generate()`` — are children of the SERVER span (also
    when a ``traceparent`` arrives), their arrival is the call's arrival, and they
    end when the response is complete.

Attributes
    ``llm.http.time_to_first_byte_s`` on the SERVER span of a streamed (SSE /
    chunked) response. A client that disconnects before the response is complete
    ends the call's open requests with ``llm.request.finish_reason=abort``.

Starlette
    A plain Starlette app is the ``starlette`` integration's
    (``llmtrace.integrations.starlette``): the same SERVER span and scope.

Supported versions
    fastapi >= 0.110, opentelemetry-instrumentation-fastapi >= 0.51b0 (tested
    with fastapi 0.136, starlette 1.10, 0.66b1).
"""

from __future__ import annotations

from llmtrace.integrations.fastapi.patch import FastAPIInstrumentor

INSTRUMENTOR = FastAPIInstrumentor

__all__ = ["INSTRUMENTOR", "FastAPIInstrumentor"]
