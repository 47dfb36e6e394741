"""Wiring of the ``starlette`` integration (see the package docstring)."""

from __future__ import annotations

from typing import Any, Final

from llmtrace import _runtime
from llmtrace._safety import guarded
from llmtrace.integrations import _asgi_server, _server
from llmtrace.integrations._asgi import (
    ASGI_MIDDLEWARE_INIT,
    ASGI_MODULE,
    EXCLUDE_SPANS,
    ScopeMiddleware,
    has_otel_middleware,
    otel_middleware_init_wrapper,
)
from llmtrace.integrations._base import Instrumentor

INTEGRATION: Final = "starlette"
MODULE: Final = "starlette.applications"
BUILD_MIDDLEWARE_STACK: Final = "Starlette.build_middleware_stack"


def _is_fastapi(app: Any) -> bool:
    return any(cls.__module__.split(".", 1)[0] == "fastapi" for cls in type(app).__mro__)


def route_template(app: Any, scope: dict[str, Any]) -> str | None:
    """The path template of the route that serves *scope* (``/items/{id}``), as the SERVER span's
    ``http.route``; None when no route matches (a 404)."""
    from starlette.routing import Match

    partial = None
    for route in getattr(app, "routes", ()):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return getattr(route, "path", None) or scope.get("path")
        if match == Match.PARTIAL and partial is None:  # right path, other method: a 405
            partial = getattr(route, "path", None)
    return partial


def _route_of(app: Any) -> Any:
    """The route of a call: from the scope where Starlette left it (>= 0.48), else matched
    against *app*'s routes (older Starlette)."""

    def route_of(scope: dict[str, Any]) -> str | None:
        if "route" in scope:
            return _asgi_server.scope_route(scope)
        return route_template(app, scope)

    return route_of


def _span_details(app: Any) -> Any:
    from opentelemetry.semconv.attributes.http_attributes import HTTP_ROUTE
    from opentelemetry.util.http import sanitize_method

    def details(scope: dict[str, Any]) -> tuple[str, dict[str, str]]:
        method = sanitize_method(str(scope.get("method", "")).strip())
        if method == "_OTHER":
            method = "HTTP"
        route = route_template(app, scope)
        if route is None:
            return method or "HTTP", {}
        return (f"{method} {route}" if method else route), {HTTP_ROUTE: route}

    return details


@guarded("starlette.wrap_stack")
def _traced_stack(app: Any, stack: Any) -> Any:
    if _runtime.settings().server_spans != "otel" or has_otel_middleware(stack):
        return _asgi_server.traced_stack(stack, INTEGRATION, _route_of(app))
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    providers = _runtime.current().providers
    return OpenTelemetryMiddleware(
        ScopeMiddleware(stack, INTEGRATION),
        default_span_details=_span_details(app),
        tracer_provider=providers.tracer_provider if providers else None,
        meter_provider=providers.meter_provider if providers else None,
        exclude_spans=list(EXCLUDE_SPANS),
    )


def _build_middleware_stack_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...],
                                    kwargs: dict[str, Any]) -> Any:
    stack = wrapped(*args, **kwargs)
    if _is_fastapi(instance) or INTEGRATION not in _server.ENABLED:
        return stack
    return _traced_stack(instance, stack) or stack


class StarletteInstrumentor(Instrumentor):
    name = INTEGRATION
    trigger = MODULE
    distribution = "starlette"
    supported = ">=0.37"

    def _patch(self) -> None:
        # A hand-added OpenTelemetryMiddleware is built inside build_middleware_stack: its
        # constructor hook puts the scope in (a no-op when the fastapi integration's did).
        self.patches.wrap(ASGI_MODULE, ASGI_MIDDLEWARE_INIT, otel_middleware_init_wrapper(INTEGRATION))
        self.patches.wrap(MODULE, BUILD_MIDDLEWARE_STACK, _build_middleware_stack_wrapper)
        _server.ENABLED.add(INTEGRATION)

    def _unpatch(self) -> None:
        _server.ENABLED.discard(INTEGRATION)
