"""Pure helpers of the aiohttp integration: the middleware list, the request's route, its
propagation carrier and the SERVER span's attributes."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from llmtrace import semconv
from llmtrace.integrations._asgi import is_disconnect
from llmtrace.integrations._http_span import split_host
from llmtrace.integrations.aiohttp._constants import OTEL_MODULE

__all__ = ["error_type", "is_disconnect", "is_excluded", "is_http_exception", "protocol_version", "route_of",
           "server_attributes", "with_middleware"]

#: ``request.version`` (aiohttp's ``HttpVersion``, a named tuple) -> ``network.protocol.version``.
_VERSIONS = {(1, 1): "1.1", (1, 0): "1.0", (2, 0): "2", (3, 0): "3"}


def is_otel_middleware(middleware: Any) -> bool:
    """Whether *middleware* is OpenTelemetry's aiohttp-server middleware (its instrumentor adds it
    to every ``web.Application``; a host may also list it by hand)."""
    return getattr(middleware, "__module__", None) == OTEL_MODULE


def with_middleware(middlewares: Iterable[Any] | None, server_span: Any | None, scope: Any) -> list[Any]:
    """*middlewares* with llmtrace's, once: *server_span* first (outermost, so that it times the
    whole call) when given and no OpenTelemetry middleware makes the SERVER span; otherwise
    *scope* last (innermost: it runs inside whichever SERVER span there is)."""
    result = list(middlewares or ())
    if server_span in result or scope in result:
        return result
    if server_span is not None and not any(is_otel_middleware(m) for m in result):
        result.insert(0, server_span)
    else:
        result.append(scope)
    return result


#: Route -> its template, for routes of applications' routers. An unmatched path's route (aiohttp
#: makes a new one per request, with no resource) is never kept, and the whole cache is dropped
#: when it reaches :data:`_MAX_ROUTES` (a process that makes many apps does not keep them alive).
_ROUTE_NAMES: dict[Any, str | None] = {}
_MAX_ROUTES = 1024


def route_of(request: Any) -> str | None:
    """The route template aiohttp matched (``/v1/models/{model}``, with a sub-application's
    prefix), as OpenTelemetry's instrumentation names it; None when no route matched (a 404).
    Asked once per call: a route's template is looked up once."""
    try:
        route = request.match_info.route
        return _ROUTE_NAMES[route]
    except KeyError:
        pass
    except (AttributeError, TypeError):  # no match info yet, or an unhashable route
        return None
    resource = getattr(route, "resource", None)
    if resource is None:
        return None
    canonical = resource.canonical
    name = canonical if isinstance(canonical, str) and canonical else None
    if len(_ROUTE_NAMES) >= _MAX_ROUTES:
        _ROUTE_NAMES.clear()
    _ROUTE_NAMES[route] = name
    return name


def protocol_version(version: Any) -> str | None:
    """``network.protocol.version`` of aiohttp's ``HttpVersion(major, minor)``."""
    known = _VERSIONS.get(version)
    if known is not None:
        return known
    try:
        return f"{version[0]}.{version[1]}"
    except (TypeError, IndexError):
        return None


def is_http_exception(error: BaseException | None) -> bool:
    """An ``aiohttp.web.HTTPException``: a response the handler raised, not a failure of its own."""
    return getattr(error, "__http_exception__", False) is True


def error_type(status: int | None, error: BaseException | None) -> str | None:
    """``error.type`` by the HTTP conventions: the type of an exception the handler failed with,
    else a 5xx status code (a raised ``HTTPException`` is a response: only a 5xx one is an error)."""
    if error is not None and not is_http_exception(error):
        return type(error).__qualname__
    if status is not None and status >= 500:
        return str(status)
    return None


def is_excluded(pattern: re.Pattern[str], request: Any) -> bool:
    """Whether *request* matches an excluded-URL *pattern*: searched in the path (as
    OpenTelemetry's aiohttp-server instrumentation does) and in ``scheme://host/path`` (as its
    ASGI middleware and llmtrace's own ASGI SERVER span do)."""
    path = request.path
    if pattern.search(path):
        return True
    return pattern.search(f"{request.scheme}://{request.headers.get('Host') or ''}{path}") is not None


def server_attributes(request: Any, method: str) -> dict[str, Any]:
    """The request attributes of the SERVER span (built off the request path), with the names
    and values of llmtrace's ASGI SERVER span."""
    attrs: dict[str, Any] = {semconv.HTTP_REQUEST_METHOD: method, semconv.URL_SCHEME: request.scheme}
    original = str(request.method)
    if original != method:
        attrs[semconv.HTTP_REQUEST_METHOD_ORIGINAL] = original
    if path := request.path:
        attrs[semconv.URL_PATH] = path
    _, _, query = str(request.raw_path).partition("?")
    if query:
        attrs[semconv.URL_QUERY] = query
    headers: Mapping[str, str] = request.headers
    host = headers.get("Host")
    address, port = split_host(host) if host else (None, None)
    if port is None or not address:
        local = _extra(request, "sockname")
        address = address or (local[0] if local else None)
        port = port if port is not None else (local[1] if local else None)
    if address:
        attrs[semconv.SERVER_ADDRESS] = address
    if port is not None:
        attrs[semconv.SERVER_PORT] = int(port)
    # Kept on the request when it arrived (the transport may be gone by now); aiohttp's own slot.
    peer = getattr(request, "_transport_peername", None)
    if isinstance(peer, (tuple, list)) and peer:
        attrs[semconv.CLIENT_ADDRESS] = str(peer[0])
        if len(peer) > 1 and isinstance(peer[1], int):
            attrs[semconv.CLIENT_PORT] = peer[1]
    elif (remote := request.remote) is not None:
        attrs[semconv.CLIENT_ADDRESS] = remote
    if version := protocol_version(request.version):
        attrs[semconv.NETWORK_PROTOCOL_VERSION] = version
    if (agent := headers.get("User-Agent")) is not None:
        attrs[semconv.USER_AGENT_ORIGINAL] = agent
    return attrs


def _extra(request: Any, name: str) -> Any:
    transport = request.transport
    value = transport.get_extra_info(name) if transport is not None else None
    return value if isinstance(value, (tuple, list)) and len(value) >= 2 else None
