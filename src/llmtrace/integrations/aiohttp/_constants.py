"""Targets of the ``aiohttp`` (server) integration."""

from __future__ import annotations

from typing import Final

MODULE: Final = "aiohttp.web"
APP_MODULE: Final = "aiohttp.web_app"
APP_INIT: Final = "Application.__init__"
#: What ``AppRunner`` (``run_app``, the test server) calls on an application before it makes its
#: server, and what makes the server (its request handler).
APP_FREEZE: Final = "Application.freeze"
APP_MAKE_HANDLER: Final = "Application._make_handler"
RESPONSE_MODULE: Final = "aiohttp.web_response"
REQUEST_MODULE: Final = "aiohttp.web_request"
#: What a connection calls on the request it is serving when it is lost (aiohttp >= 3.8).
REQUEST_CANCEL: Final = "BaseRequest._cancel"
STREAM_PREPARE: Final = "StreamResponse.prepare"
DISTRIBUTION: Final = "aiohttp"
SUPPORTED: Final = ">=3.9"
#: The module whose middleware is OpenTelemetry's aiohttp-server instrumentation (the host's,
#: or ``server_spans="otel"``); recognised by name, without importing it.
OTEL_MODULE: Final = "opentelemetry.instrumentation.aiohttp_server"
#: The name in OpenTelemetry's ``OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS``, honoured as theirs is.
OTEL_EXCLUDED_NAME: Final = "aiohttp_server"
