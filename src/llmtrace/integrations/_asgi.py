"""ASGI, shared by the FastAPI and Starlette integrations: llmtrace's scope middleware, which
runs inside a SERVER span someone else made (OTel's ``OpenTelemetryMiddleware``, when the host
or ``server_spans="otel"`` chose it), the hook that puts it there, and pure helpers over ASGI
messages. llmtrace's own SERVER span is ``_asgi_server``.

The middleware runs in the SERVER span's context and wraps ``receive``/``send`` to see the
first body chunk (time to first byte), the end of the response, and ``http.disconnect``
(the client went away: open requests end as ``abort``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any, Final

from llmtrace._safety import guarded
from llmtrace.integrations._server import ENABLED, Exchange, run_in_exchange

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ASGI_MODULE: Final = "opentelemetry.instrumentation.asgi"
ASGI_MIDDLEWARE_INIT: Final = "OpenTelemetryMiddleware.__init__"
#: The ASGI instrumentation's per-message "http send"/"http receive" spans: one per
#: streamed chunk (per token) is noise and costs ~30 µs each; the SERVER span keeps
#: what matters (and llmtrace adds the time to first byte).
EXCLUDE_SPANS: Final = ("receive", "send")

#: Exception types that mean "the client went away", by name (no starlette import here).
DISCONNECT_ERRORS = ("ClientDisconnect", "ClientDisconnected", "CancelledError", "ConnectionResetError",
                     "ClientConnectionResetError", "BrokenPipeError")


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def is_streamed(start: Mapping[str, Any] | None, first_body: Mapping[str, Any]) -> bool:
    """A streamed (SSE / chunked) response: more body follows the first chunk, or no length was declared."""
    if first_body.get("more_body", False):
        return True
    headers = (start or {}).get("headers") or ()
    content_type = header(headers, b"content-type") or b""
    return content_type.startswith(b"text/event-stream") or header(headers, b"content-length") is None


def is_disconnect(error: BaseException) -> bool:
    return any(cls.__name__ in DISCONNECT_ERRORS for cls in type(error).__mro__)


@guarded("asgi.first_byte")
def _first_byte(exchange: Exchange, start: Message | None, message: Message) -> None:
    exchange.first_byte(is_streamed(start, message))


@guarded("asgi.disconnect", default=False)
def _is_disconnect(error: BaseException) -> bool:
    return is_disconnect(error)


class ScopeMiddleware:
    """ASGI middleware: one :class:`Exchange` per HTTP call."""

    def __init__(self, app: Any, integration: str) -> None:
        self.app = app
        self._integration = integration  # the integration that added it: off when that one is
        self._llmtrace_scope_middleware = True

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or self._integration not in ENABLED:
            await self.app(scope, receive, send)
            return
        exchange = Exchange()
        start: list[Message] = []

        async def traced_receive() -> Message:
            message = await receive()
            if message.get("type") == "http.disconnect":
                exchange.disconnected()
            return message

        async def traced_send(message: Message) -> None:
            kind = message.get("type")
            if kind == "http.response.start":
                start.append(message)
            elif kind == "http.response.body" and exchange.scope.first_byte_ns is None and message.get("body"):
                _first_byte(exchange, start[0] if start else None, message)
            try:
                await send(message)
            except BaseException as exc:
                if _is_disconnect(exc):
                    exchange.disconnected(exc)
                raise
            if kind == "http.response.body" and not message.get("more_body", False):
                exchange.finish()

        await run_in_exchange(exchange, lambda: self.app(scope, traced_receive, traced_send),
                              _is_disconnect)


def has_otel_middleware(stack: Any) -> bool:
    """Whether a built middleware stack holds OpenTelemetry's ASGI middleware (the host added it)."""
    try:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    except ImportError:
        return False
    node, seen = stack, 0
    while node is not None and seen < 64:  # middleware chain through ``.app``; bounded against cycles
        if isinstance(node, OpenTelemetryMiddleware):
            return True
        node, seen = getattr(node, "app", None), seen + 1
    return False


def otel_middleware_init_wrapper(integration: str) -> Any:
    """A wrapper for ``OpenTelemetryMiddleware.__init__`` that puts llmtrace's scope middleware
    (on while *integration* is) between it and the app it wraps, unless one is there already."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        changed = _with_scope_middleware(wrapped, args, kwargs, integration)
        if changed is None:
            return wrapped(*args, **kwargs)
        return wrapped(*changed[0], **changed[1])

    return wrapper


@guarded("asgi.middleware")
def _with_scope_middleware(wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                           integration: str) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    try:
        bound = inspect.signature(wrapped).bind(*args, **kwargs)
    except TypeError:
        return None  # the host's own mistake: let the library report it
    app = bound.arguments.get("app")
    if app is not None and not getattr(app, "_llmtrace_scope_middleware", False):
        bound.arguments["app"] = ScopeMiddleware(app, integration)
    return bound.args, bound.kwargs
