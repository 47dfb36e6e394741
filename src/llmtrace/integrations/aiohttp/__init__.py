"""aiohttp server: the SERVER span, time to first byte, client disconnects.

What is traced
    The SERVER span is opentelemetry-instrumentation-aiohttp-server's (reused):
    applications created after ``instrument()`` get its middleware. llmtrace adds
    a middleware of its own inside it (on every ``web.Application``) that opens the
    server scope, so requests opened in the handler (``start_request``,
    ``generate()``) are children of the SERVER span and end with the response.

Attributes
    ``llm.http.time_to_first_byte_s`` on the SERVER span when the handler streams
    (the first ``StreamResponse.write``). A client that goes away (the write fails
    with a connection reset, or the handler is cancelled) ends the call's open
    requests with ``llm.request.finish_reason=abort``.

Supported versions
    aiohttp >= 3.9, opentelemetry-instrumentation-aiohttp-server >= 0.51b0
    (tested with aiohttp 3.14, 0.66b1).
"""

from __future__ import annotations

from llmtrace.integrations.aiohttp.patch import AioHttpInstrumentor

INSTRUMENTOR = AioHttpInstrumentor

__all__ = ["INSTRUMENTOR", "AioHttpInstrumentor"]
