"""Reading wrapped arguments by name, resolved once per target (no ``inspect`` on the hot path)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Wrapper = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]
Getter = Callable[[tuple[Any, ...], dict[str, Any]], Any]


def binder(positions: dict[str, int], name: str) -> Getter:
    """Read argument *name* by the position the signature gave it, or by keyword (no per-call bind)."""
    index = positions[name]

    def get(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name in kwargs:
            return kwargs[name]
        return args[index] if index < len(args) else None

    return get
