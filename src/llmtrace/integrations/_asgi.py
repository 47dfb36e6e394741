"""ASGI, shared by the FastAPI and Starlette integrations: llmtrace's scope middleware, which
runs inside a SERVER span someone else made (OTel's ``OpenTelemetryMiddleware``, when the host
or ``server_spans="otel"`` chose it), the hook that puts it there, and pure helpers over ASGI
messages. llmtrace's own SERVER span is ``_asgi_server``.

The middleware runs in the SERVER span's context and wraps ``receive``/``send`` to see the
first body chunk (time to first byte), the end of the response, and ``http.disconnect``
(the client went away: open requests end as ``abort``). Both middlewares give the app the same
kind of ``send``: a plain function that returns the server's own awaitable (a coroutine of
llmtrace's only for the last body), compiled where llmtrace-native is built
(``llmtrace_native.asgi_send``, :data:`COMPILED_SEND`) so that a chunk in the middle of a
streamed body runs no Python frame of llmtrace's; ``LLMTRACE_ASGI_SEND=python`` keeps the
Python one, which sends the same messages.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any, Final

from llmtrace import _native
from llmtrace._safety import guarded, record_error
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


def _compiled_send() -> Callable[[Send, Callable[[Message], Any]], Send] | None:
    module = _native.chosen_by("LLMTRACE_ASGI_SEND")
    return None if module is None else module.asgi_send


#: ``COMPILED_SEND(server_send, observe)``: the app's compiled ``send``, which calls *observe* for
#: every message but a chunk mid-stream after the first body bytes; ``None``: the app gets
#: *observe* itself.
COMPILED_SEND: Callable[[Send, Callable[[Message], Any]], Send] | None = _compiled_send()


def app_send(server_send: Send, observe: Callable[[Message], Any]) -> Send:
    """The ``send`` to give the app: the compiled one around *observe* where it is in use, else
    *observe* itself (also if making the compiled one fails: the call is served all the same)."""
    compiled = COMPILED_SEND
    if compiled is None:
        return observe
    try:
        return compiled(server_send, observe)
    except Exception as exc:  # noqa: BLE001 - telemetry never breaks the call (no guard frame per call)
        record_error("asgi.send", exc)
        return observe


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
        call = ObservedCall(Exchange(), receive, send)
        sender = app_send(send, call.send)
        await run_in_exchange(call.exchange, lambda: self.app(scope, call.receive, sender), _is_disconnect)


class ObservedCall:
    """One HTTP call as llmtrace's ASGI middlewares see it: the app's ``send`` and ``receive``.

    :meth:`send` is the Python ``send`` (the compiled one calls it for every message but the
    chunks after the first body bytes); it returns the server's own awaitable, and a coroutine
    of its own only for the last body. The scope middleware uses this class as it is; llmtrace's
    SERVER span (``_asgi_server._Call``) overrides the three notes: the response's start, its
    first body bytes, its last body sent.
    """

    __slots__ = ("_downstream", "_first_byte_pending", "_upstream", "exchange", "response_start")

    def __init__(self, exchange: Exchange, receive: Receive, send: Send) -> None:
        self.exchange = exchange
        self._upstream = receive
        self._downstream = send
        self.response_start: Message | None = None
        self._first_byte_pending = True

    def send(self, message: Message) -> Any:
        """The app's ``send``: returns the server's own awaitable (no coroutine of ours per chunk)."""
        if message.get("more_body") and not self._first_byte_pending:
            return self._downstream(message)  # a chunk in the middle of a streamed body: nothing to note
        kind = message.get("type")
        if kind == "http.response.body":
            if self._first_byte_pending and message.get("body"):
                self._first_byte_pending = False
                self._first_bytes(message)
            if not message.get("more_body", False):
                return self._last_body(message)
        elif kind == "http.response.start":
            message = self._started(message)
        return self._downstream(message)

    async def _last_body(self, message: Message) -> None:
        """The response's last message: the call's requests end once it is sent — as ``abort`` when
        sending it finds the client gone (a request can finish generating before the server
        notices the disconnect). One coroutine per call, not per chunk."""
        try:
            await self._downstream(message)
        except BaseException as exc:
            if is_disconnect(exc):
                self.exchange.disconnected(exc)
            raise
        self._sent_last()

    async def receive(self) -> Message:
        """The app's ``receive``: a disconnect ends the call's open requests as ``abort``."""
        message = await self._upstream()
        # Servers also say ``http.disconnect`` after a complete response (uvicorn does, to the
        # disconnect listener of every streamed one): nothing to end then, and no frames spent.
        if message.get("type") == "http.disconnect" and not self.exchange.complete:
            self.exchange.disconnected()
        return message

    def _started(self, message: Message) -> Message:
        """The response's start message: noted; returns the message to send in its place."""
        self.response_start = message
        return message

    def _first_bytes(self, message: Message) -> None:
        """The first body message with bytes in it, about to be sent: the time to first byte."""
        _first_byte(self.exchange, self.response_start, message)

    def _sent_last(self) -> None:
        """The last body message was sent: the response is complete."""
        self.exchange.finish()


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
