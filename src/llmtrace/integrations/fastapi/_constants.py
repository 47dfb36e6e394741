"""Targets of the ``fastapi`` integration."""

from __future__ import annotations

from typing import Final

MODULE: Final = "fastapi"
DISTRIBUTION: Final = "fastapi"
SUPPORTED: Final = ">=0.110"
BUILD_MIDDLEWARE_STACK: Final = "FastAPI.build_middleware_stack"
ASGI_MODULE: Final = "opentelemetry.instrumentation.asgi"
ASGI_MIDDLEWARE_INIT: Final = "OpenTelemetryMiddleware.__init__"
#: The ASGI instrumentation's per-message "http send"/"http receive" spans: one per
#: streamed chunk (per token) is noise and costs ~30 µs each; the SERVER span keeps
#: what matters (and llmtrace adds the time to first byte).
EXCLUDE_SPANS: Final = ("receive", "send")
