"""Plain Starlette apps (not FastAPI): the SERVER span, HTTP metrics, first byte, disconnects.

What is traced
    The same as for FastAPI (``llmtrace.integrations.fastapi``), for an app built on
    ``starlette.applications.Starlette`` directly: when the app builds its middleware
    stack (at its first request, so apps created before ``instrument()`` are covered),
    the stack is wrapped in llmtrace's SERVER span middleware — named
    ``METHOD /route/{template}`` with ``http.route`` from the route Starlette matched — with
    llmtrace's server scope inside it. Requests opened in a handler are children of the
    SERVER span, a streamed response gets ``llm.http.time_to_first_byte_s``, and a client
    that disconnects ends the call's open requests as ``abort``.

    An app whose stack already holds an ``OpenTelemetryMiddleware`` (added by hand) keeps
    it, and only gets the scope inside it: one SERVER span per call either way.
    ``server_spans="otel"`` wraps the stack in opentelemetry-instrumentation-asgi's
    middleware instead. FastAPI apps are the ``fastapi`` integration's (FastAPI overrides the
    stack builder).

Supported versions
    starlette >= 0.37 (tested with starlette 1.10; the route is read from the scope where
    Starlette >= 0.48 leaves it, else matched against the app's routes).
"""

from __future__ import annotations

from llmtrace.integrations.starlette.patch import StarletteInstrumentor

INSTRUMENTOR = StarletteInstrumentor

__all__ = ["INSTRUMENTOR", "StarletteInstrumentor"]
