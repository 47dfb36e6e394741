"""The patch bookkeeping every integration uses (integrations/_base.py)."""

from __future__ import annotations

import json
from typing import Any

from llmtrace.integrations._base import Patches


def _wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return ("wrapped", wrapped(*args, **kwargs))


def test_wrap_all_wraps_every_target_or_none() -> None:
    """One missing target: nothing is wrapped and it is named; all present: all wrapped, and
    restore() puts back the very same originals."""
    dumps, loads = json.dumps, json.loads
    patches = Patches()
    missing = patches.wrap_all([("json", "dumps", _wrapper), ("json", "no_such_function", _wrapper)])
    assert ["json.no_such_function"] == missing
    assert json.dumps is dumps
    assert [] == patches.wrap_all([("json", "dumps", _wrapper), ("json", "loads", _wrapper)])
    try:
        assert ("wrapped", "1") == json.dumps(1)  # type: ignore[comparison-overlap]  # the wrapper's result
        assert ("wrapped", 1) == json.loads("1")
    finally:
        patches.restore()
    assert json.dumps is dumps and json.loads is loads
