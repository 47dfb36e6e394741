"""Telemetry never breaks the host: every llmtrace hook runs behind :func:`guarded`.

An exception inside llmtrace code is logged once per call site, counted (the
``llmtrace.instrumentation.errors`` counter) and swallowed; the host's own call
proceeds unchanged. The host's own exceptions are never caught here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

log = logging.getLogger("llmtrace")

P = ParamSpec("P")
R = TypeVar("R")

_lock = threading.Lock()
_errors: Counter[str] = Counter()
_warned: set[str] = set()
_error_listeners: list[Callable[[str], None]] = []


def record_error(site: str, exc: BaseException | None = None) -> None:
    """Count an internal error at *site*; log it the first time only."""
    with _lock:
        _errors[site] += 1
        first = _errors[site] == 1
    if first:
        log.warning("llmtrace: internal error in %s (further ones are counted, not logged)", site,
                    exc_info=exc)
    for listener in list(_error_listeners):
        with contextlib.suppress(Exception):  # a broken metrics pipeline must not loop back here
            listener(site)


def warn_once(key: str, message: str, *args: Any) -> None:
    """Log *message* as a warning the first time *key* is seen."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(message, *args)


def error_counts() -> dict[str, int]:
    """Internal errors so far, by call site (for tests and ``llmtrace doctor``)."""
    with _lock:
        return dict(_errors)


def add_error_listener(listener: Callable[[str], None]) -> None:
    _error_listeners.append(listener)


def remove_error_listener(listener: Callable[[str], None]) -> None:
    with contextlib.suppress(ValueError):  # already removed
        _error_listeners.remove(listener)


def guarded(site: str, default: Any = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate an llmtrace-internal function so that its exceptions are recorded and swallowed."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return func(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - this is the one place that swallows
                record_error(site, exc)
                return default  # type: ignore[no-any-return]

        return wrapper

    return decorate
