"""Wiring of the ``aiohttp`` server integration.

Every ``web.Application`` created while the integration is on gets one llmtrace middleware
(``middleware.py``): by default (``server_spans="llmtrace"``) llmtrace's SERVER span, first in
the list so that it covers every other middleware. An application whose only middleware is that
one has it taken out of the list when it is frozen (``AppRunner``, ``web.run_app`` and aiohttp's
test server freeze an application before they make its server), and the server made for it
(``Application._make_handler``) gets the same function as its request handler: the same span
around the whole call, without the middleware chain that aiohttp builds per request for an
application with any middleware (~18k instructions per request; callgrind,
``benchmarks/bench_aiohttp_request.py``). An application whose middlewares already
hold OpenTelemetry's aiohttp-server middleware (the host enabled ``AioHttpServerInstrumentor``,
whose ``web.Application`` subclass adds it, or listed it by hand) keeps that SERVER span, and
llmtrace's scope middleware goes last, inside it; so does every application under
``server_spans="otel"``, where llmtrace enables ``AioHttpServerInstrumentor`` itself (unless the
host did), and ``server_spans="off"``. ``StreamResponse.prepare`` is wrapped to put the trace
headers on a response the handler sends itself (llmtrace's span) and to time its first write,
``BaseRequest._cancel`` to see a client leave — both replaced by plain functions rather than
wrapt proxies (see middleware.py); nothing is wrapped per streamed chunk.
"""

from __future__ import annotations

import functools
import inspect
import warnings
import weakref
from typing import Any

from llmtrace import _runtime
from llmtrace._safety import guarded
from llmtrace.integrations import _server
from llmtrace.integrations._base import Instrumentor
from llmtrace.integrations._http_span import excluded_urls
from llmtrace.integrations.aiohttp import _constants, extractors, middleware
from llmtrace.integrations.aiohttp.middleware import INTEGRATION, scope_middleware, server_span_middleware

__all__ = ["INTEGRATION", "AioHttpInstrumentor", "scope_middleware", "server_span_middleware"]


def _app_init_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    changed = _with_middleware(wrapped, args, kwargs)
    if changed is None:
        return wrapped(*args, **kwargs)
    return wrapped(*changed[0], **changed[1])


@guarded("aiohttp.middleware")
def _with_middleware(wrapped: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    try:
        bound = inspect.signature(wrapped).bind(*args, **kwargs)
    except TypeError:
        return None  # the host's own mistake: let aiohttp report it
    own = server_span_middleware if _runtime.settings().server_spans == "llmtrace" else None
    bound.arguments["middlewares"] = extractors.with_middleware(bound.arguments.get("middlewares"), own,
                                                                scope_middleware)
    return bound.args, bound.kwargs


#: Applications whose llmtrace middleware was taken out when they were frozen: their server's
#: request handler gets the SERVER span instead.
_handler_spans: weakref.WeakSet[Any] = weakref.WeakSet()


def _freeze_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _take_out_middleware(instance)
    return wrapped(*args, **kwargs)


def _make_handler_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    server = wrapped(*args, **kwargs)
    _wrap_request_handler(server, instance)
    return server


@guarded("aiohttp.request_handler")
def _take_out_middleware(app: Any) -> None:
    """As *app* is being frozen, take llmtrace's middleware out of its list where it is the only
    one and the list is not frozen yet (a sub-application's list is frozen when it is added, and
    keeps it: inside the outer call it passes calls through); *app*'s server will get it as its
    request handler."""
    middlewares = getattr(app, "middlewares", None)
    if (getattr(app, "frozen", True) or middlewares is None or getattr(middlewares, "frozen", True)
            or len(middlewares) != 1 or middlewares[0] is not server_span_middleware):
        return
    _handler_spans.add(app)  # first: an app that cannot be kept keeps its middleware
    middlewares.remove(server_span_middleware)


@guarded("aiohttp.request_handler")
def _wrap_request_handler(server: Any, app: Any) -> None:
    if app in _handler_spans:
        server.request_handler = functools.partial(server_span_middleware, handler=app._handle)


def _enable_otel() -> bool:
    """``server_spans="otel"``: OpenTelemetry's instrumentor, unless the host enabled it (then it
    is the host's to turn off). True when llmtrace enabled it."""
    from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor

    instrumentor = AioHttpServerInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        return False
    providers = _runtime.current().providers
    with warnings.catch_warnings():
        # OTel's instrumentor subclasses web.Application, which aiohttp discourages
        # with a DeprecationWarning; it is theirs, not the host's.
        warnings.simplefilter("ignore", DeprecationWarning)
        instrumentor.instrument(
            tracer_provider=providers.tracer_provider if providers else None,
            meter_provider=providers.meter_provider if providers else None,
        )
    return True


class AioHttpInstrumentor(Instrumentor):
    name = "aiohttp"
    trigger = _constants.MODULE
    distribution = _constants.DISTRIBUTION
    supported = _constants.SUPPORTED

    def __init__(self) -> None:
        super().__init__()
        self._otel_enabled = False

    def _patch(self) -> None:
        mode = _runtime.settings().server_spans
        self._otel_enabled = _enable_otel() if mode == "otel" else False
        middleware.configure(excluded_urls(_constants.OTEL_EXCLUDED_NAME))
        self.patches.wrap(_constants.APP_MODULE, _constants.APP_INIT, _app_init_wrapper)
        self.patches.wrap(_constants.APP_MODULE, _constants.APP_FREEZE, _freeze_wrapper)
        self.patches.wrap(_constants.APP_MODULE, _constants.APP_MAKE_HANDLER, _make_handler_wrapper)
        self.patches.replace(_constants.RESPONSE_MODULE, _constants.STREAM_PREPARE, middleware.traced_prepare)
        self.patches.replace(_constants.REQUEST_MODULE, _constants.REQUEST_CANCEL, middleware.traced_cancel)
        _server.ENABLED.add(INTEGRATION)

    def _unpatch(self) -> None:
        _server.ENABLED.discard(INTEGRATION)
        self.patches.restore()
        middleware.configure(None)
        if self._otel_enabled:
            from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor

            self._otel_enabled = False
            AioHttpServerInstrumentor().uninstrument()
