"""The ASGI middleware llmtrace puts inside OTel's ``OpenTelemetryMiddleware``.

It runs in the SERVER span's context and wraps ``receive``/``send`` to see the
first body chunk (time to first byte), the end of the response, and
``http.disconnect`` (the client went away: open requests end as ``abort``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from llmtrace._safety import guarded
from llmtrace.integrations._server import ENABLED, Exchange, run_in_exchange
from llmtrace.integrations.fastapi import extractors

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

INTEGRATION = "fastapi"


@guarded("asgi.first_byte")
def _first_byte(exchange: Exchange, start: Message | None, message: Message) -> None:
    exchange.first_byte(extractors.is_streamed(start, message))


@guarded("asgi.disconnect", default=False)
def is_disconnect(error: BaseException) -> bool:
    return extractors.is_disconnect(error)


class ScopeMiddleware:
    """ASGI middleware: one :class:`Exchange` per HTTP call."""

    def __init__(self, app: Any, integration: str = INTEGRATION) -> None:
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
                if is_disconnect(exc):
                    exchange.disconnected(exc)
                raise
            if kind == "http.response.body" and not message.get("more_body", False):
                exchange.finish()

        await run_in_exchange(exchange, lambda: self.app(scope, traced_receive, traced_send),
                              is_disconnect)
