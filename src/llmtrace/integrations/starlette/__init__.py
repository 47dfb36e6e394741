"""Plain Starlette apps (not FastAPI): the SERVER span, time to first byte, client disconnects.

What is traced
    The same as for FastAPI (``llmtrace.integrations.fastapi``), for an app built on
    ``starlette.applications.Starlette`` directly: when the app builds its middleware
    stack (at its first request, so apps created before ``instrument()`` are covered),
    the stack is wrapped in opentelemetry-instrumentation-asgi's ``OpenTelemetryMiddleware``
    — the SERVER span, named ``METHOD /route/{template}`` with ``http.route`` from the
    app's routes — with llmtrace's server scope inside it. Requests opened in a handler
    are children of the SERVER span, a streamed response gets
    ``llm.http.time_to_first_byte_s``, and a client that disconnects ends the call's open
    requests as ``abort``.

    An app whose stack already holds an ``OpenTelemetryMiddleware`` (added by hand) keeps
    it, and only gets the scope inside it: one SERVER span per call either way. FastAPI
    apps are the ``fastapi`` integration's (FastAPI overrides the stack builder).

Supported versions
    starlette >= 0.37 (tested with starlette 1.10, opentelemetry-instrumentation-asgi 0.66b1).
"""

from __future__ import annotations

from llmtrace.integrations.starlette.patch import StarletteInstrumentor

INSTRUMENTOR = StarletteInstrumentor

__all__ = ["INSTRUMENTOR", "StarletteInstrumentor"]
