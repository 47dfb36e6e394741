"""Wiring of the ``aiohttp`` server integration.

Reuses opentelemetry-instrumentation-aiohttp-server for the SERVER span (its
instrumentor replaces ``web.Application`` with a subclass that adds its
middleware). llmtrace appends its own middleware (innermost, so it runs in the
SERVER span) to every ``Application`` and times the first ``StreamResponse.write``.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from llmtrace import _runtime
from llmtrace._safety import guarded
from llmtrace.integrations import _server
from llmtrace.integrations._base import Instrumentor
from llmtrace.integrations.aiohttp import _constants, extractors

INTEGRATION = "aiohttp"


async def scope_middleware(request: Any, handler: Any) -> Any:
    """One :class:`~llmtrace.integrations._server.Exchange` per request."""
    if INTEGRATION not in _server.ENABLED:
        return await handler(request)
    exchange = _server.Exchange()
    return await _server.run_in_exchange(exchange, lambda: handler(request), _is_disconnect)


scope_middleware.__middleware_version__ = 1  # type: ignore[attr-defined]  # aiohttp's new-style marker


def _app_init_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    changed = _with_scope_middleware(wrapped, args, kwargs)
    if changed is None:
        return wrapped(*args, **kwargs)
    return wrapped(*changed[0], **changed[1])


@guarded("aiohttp.middleware")
def _with_scope_middleware(wrapped: Any, args: tuple[Any, ...],
                           kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    try:
        bound = inspect.signature(wrapped).bind(*args, **kwargs)
    except TypeError:
        return None  # the host's own mistake: let aiohttp report it
    bound.arguments["middlewares"] = extractors.with_middleware(bound.arguments.get("middlewares"),
                                                                scope_middleware)
    return bound.args, bound.kwargs


@guarded("aiohttp.disconnect", default=False)
def _is_disconnect(error: BaseException) -> bool:
    return extractors.is_disconnect(error)


async def _stream_write_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    exchange = _server.current_exchange()
    if exchange is not None and exchange.scope.first_byte_ns is None:
        exchange.first_byte(True)
    try:
        return await wrapped(*args, **kwargs)
    except BaseException as exc:
        if exchange is not None and _is_disconnect(exc):
            exchange.disconnected(exc)
        raise


class AioHttpInstrumentor(Instrumentor):
    name = "aiohttp"
    trigger = _constants.MODULE
    distribution = _constants.DISTRIBUTION
    supported = _constants.SUPPORTED

    def _patch(self) -> None:
        from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor

        providers = _runtime.current().providers
        with warnings.catch_warnings():
            # OTel's instrumentor subclasses web.Application, which aiohttp discourages
            # with a DeprecationWarning; it is theirs, not the host's.
            warnings.simplefilter("ignore", DeprecationWarning)
            AioHttpServerInstrumentor().instrument(
                tracer_provider=providers.tracer_provider if providers else None,
                meter_provider=providers.meter_provider if providers else None,
            )
        self.patches.wrap(_constants.APP_MODULE, _constants.APP_INIT, _app_init_wrapper)
        self.patches.wrap(_constants.RESPONSE_MODULE, _constants.STREAM_WRITE, _stream_write_wrapper)
        _server.ENABLED.add(INTEGRATION)

    def _unpatch(self) -> None:
        from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor

        _server.ENABLED.discard(INTEGRATION)
        self.patches.restore()
        AioHttpServerInstrumentor().uninstrument()
