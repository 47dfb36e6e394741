"""Waiting for spans that other threads (the span builder, a server's threads) are still making."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from llmtrace.testing import CapturedTelemetry


def wait_for_spans(captured: CapturedTelemetry, predicate: Callable[[Any], bool], count: int,
                   timeout_s: float = 30.0) -> list[Any]:
    """The finished spans matching *predicate*, once there are *count* of them (or the timeout passed:
    the caller's assertion then says what is missing)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [s for s in captured.collect() if predicate(s)]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)
