"""Pure functions over ASGI messages."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

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
