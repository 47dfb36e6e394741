"""Pure helpers of the aiohttp integration."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llmtrace.integrations._asgi import is_disconnect

__all__ = ["is_disconnect", "with_middleware"]


def with_middleware(middlewares: Iterable[Any] | None, middleware: Any) -> list[Any]:
    """*middlewares* with ours last (innermost: inside the SERVER span's middleware), once."""
    result = list(middlewares or ())
    if middleware not in result:
        result.append(middleware)
    return result
