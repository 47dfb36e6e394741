"""Wiring of the ``fastapi`` integration.

Every ``FastAPI`` app gets its HTTP SERVER span when it builds its middleware stack (at
its first request), whether it was created before or after ``instrument()``: by default
llmtrace's own (``_asgi_server.ServerSpanMiddleware`` around the stack); with
``server_spans="otel"`` opentelemetry-instrumentation-fastapi's ``instrument_app``. An app
the host instrumented with OpenTelemetry keeps that span: every ``OpenTelemetryMiddleware``
(FastAPI's, or one added by hand) gets llmtrace's scope middleware inside it instead.
"""

from __future__ import annotations

import weakref
from typing import Any

from llmtrace import _runtime
from llmtrace._safety import guarded
from llmtrace.integrations import _asgi_server, _server
from llmtrace.integrations._asgi import ASGI_MIDDLEWARE_INIT, ASGI_MODULE, EXCLUDE_SPANS, otel_middleware_init_wrapper
from llmtrace.integrations._base import Instrumentor
from llmtrace.integrations.fastapi import _constants

INTEGRATION = "fastapi"

_apps: weakref.WeakSet[Any] = weakref.WeakSet()


@guarded("fastapi.instrument_app")
def _instrument_app(app: Any) -> bool:
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    providers = _runtime.current().providers
    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=providers.tracer_provider if providers else None,
        meter_provider=providers.meter_provider if providers else None,
        exclude_spans=list(EXCLUDE_SPANS),
    )
    _apps.add(app)
    return True


def _build_middleware_stack_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...],
                                    kwargs: dict[str, Any]) -> Any:
    if getattr(instance, "_is_instrumented_by_opentelemetry", False) or INTEGRATION not in _server.ENABLED:
        return wrapped(*args, **kwargs)  # the host's OpenTelemetry instrumentation makes the span
    if _runtime.settings().server_spans == "otel":
        if _instrument_app(instance) and getattr(instance, "_is_instrumented_by_opentelemetry", False):
            return instance.build_middleware_stack()
        return wrapped(*args, **kwargs)
    stack = wrapped(*args, **kwargs)
    return _asgi_server.traced_stack(stack, INTEGRATION) or stack


class FastAPIInstrumentor(Instrumentor):
    name = "fastapi"
    trigger = _constants.MODULE
    distribution = _constants.DISTRIBUTION
    supported = _constants.SUPPORTED

    def _patch(self) -> None:
        self.patches.wrap(ASGI_MODULE, ASGI_MIDDLEWARE_INIT, otel_middleware_init_wrapper(INTEGRATION))
        self.patches.wrap(_constants.MODULE, _constants.BUILD_MIDDLEWARE_STACK, _build_middleware_stack_wrapper)
        _server.ENABLED.add(INTEGRATION)

    def _unpatch(self) -> None:
        _server.ENABLED.discard(INTEGRATION)
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor as OTelFastAPI

        for app in list(_apps):
            try:
                OTelFastAPI.uninstrument_app(app)
            except Exception:  # noqa: BLE001 - an app in a strange state keeps its middleware
                continue
        _apps.clear()
