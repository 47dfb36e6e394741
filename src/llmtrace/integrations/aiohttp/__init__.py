"""aiohttp server: the SERVER span, time to first byte, client disconnects, HTTP metrics.

What is traced
    Every ``web.Application`` created while the integration is on gets llmtrace's middleware,
    first in its list. By default (``server_spans="llmtrace"``) it makes the HTTP SERVER span
    itself, with llmtrace's cost model: the span's ids and sampling decision when the call
    arrives (the parent from an incoming ``traceparent``, through the global propagator), the
    finished span built on the span builder's thread and only for a sampled call. Requests
    opened in the handler (``start_request``, ``generate()``) are children of the SERVER span
    and end with the call. An application that already runs OpenTelemetry's aiohttp-server
    middleware (the host enabled ``AioHttpServerInstrumentor``), or a call inside another
    SERVER span, keeps that span; llmtrace adds only its server scope inside it.
    ``server_spans="otel"`` enables OpenTelemetry's instrumentor for the span instead;
    ``server_spans="off"``: no SERVER span, no HTTP metrics.

Attributes
    The stable HTTP semantic conventions, as llmtrace's ASGI SERVER span emits them:
    ``http.request.method`` (``http.request.method_original``), ``url.scheme``, ``url.path``,
    ``url.query``, ``http.route`` (the matched resource's canonical path), ``http.response.status_code``,
    ``server.address``, ``server.port``, ``client.address``, ``client.port``,
    ``network.protocol.version``, ``user_agent.original``, ``error.type``; span name
    ``{method} {route}``, or the method alone. Status ERROR on a 5xx response and on an exception
    from the handler (a raised ``web.HTTPException`` is a response: an error only when 5xx).
    ``llm.http.time_to_first_byte_s`` when the handler streams (its first
    ``StreamResponse.write``). A client that goes away (aiohttp loses the connection of a call
    it is serving, or the handler fails with a connection reset or is cancelled) ends the call's
    open requests with ``llm.request.finish_reason=abort``.

Metrics and headers
    ``http.server.request.duration`` and ``http.server.active_requests`` for every call, sampled
    or not. A traced response carries ``traceresponse`` (and ``Server-Timing`` when the handler
    returned it unsent and its phases are known), unless ``response_headers=False``. URLs
    matching ``excluded_urls``, ``OTEL_PYTHON_EXCLUDED_URLS`` or
    ``OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS`` (searched in the path and in
    ``scheme://host/path``) are neither traced nor counted.

Supported versions
    aiohttp >= 3.9; opentelemetry-instrumentation-aiohttp-server >= 0.51b0 for
    ``server_spans="otel"`` and coexistence (tested with aiohttp 3.14, 0.66b1).

Architecture
    ``middleware.py`` holds the two middlewares (the SERVER span, the scope alone) and the hooks
    on ``StreamResponse.prepare`` (trace headers on a response the handler sends itself; its
    first write timed) and ``BaseRequest._cancel`` (a lost connection); nothing runs per
    streamed chunk. ``patch.py`` puts them in place;
    ``extractors.py`` turns a request into attributes. The span itself is
    ``integrations/_server_span.py``, shared with the ASGI integrations.
"""

from __future__ import annotations

from llmtrace.integrations.aiohttp.patch import AioHttpInstrumentor

INSTRUMENTOR = AioHttpInstrumentor

__all__ = ["INSTRUMENTOR", "AioHttpInstrumentor"]
