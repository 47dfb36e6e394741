"""Pure helpers of the gRPC integration."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple


class Behavior(NamedTuple):
    """Which behavior of an RPC method handler runs, and its shape."""

    attribute: str
    request_streaming: bool
    response_streaming: bool


def behavior_of(handler: Any) -> Behavior:
    request_streaming = bool(handler.request_streaming)
    response_streaming = bool(handler.response_streaming)
    prefix = ("stream" if request_streaming else "unary") + "_" + ("stream" if response_streaming else "unary")
    return Behavior(prefix, request_streaming, response_streaming)


def with_interceptor(interceptors: Iterable[Any] | None, interceptor: Any) -> list[Any]:
    """*interceptors* with ours last: innermost, so it runs inside the SERVER span."""
    result = list(interceptors or ())
    if not any(type(i) is type(interceptor) for i in result):
        result.append(interceptor)
    return result
