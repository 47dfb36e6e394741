"""Run at start-up by a Python whose PYTHONPATH holds this folder (ref_server_load.py's
``--engine-clock-skew-ns``): shifts the process's ``time.monotonic_ns`` by ``SKEWED_CLOCK_NS``
before anything reads it, so that its monotonic clock, llmtrace's included (bound at import),
differs from its peers' by a constant — what the production clock module must cope with.
Appends the process id to the file ``SKEWED_CLOCK_REPORT`` names, so a test can check whose
clock was skewed."""

from __future__ import annotations

import os
import time

_SKEW_NS = int(os.environ.get("SKEWED_CLOCK_NS", "0") or 0)

if _SKEW_NS:
    _true_monotonic_ns = time.monotonic_ns

    def _skewed_monotonic_ns() -> int:
        return _true_monotonic_ns() + _SKEW_NS

    time.monotonic_ns = _skewed_monotonic_ns
    if report := os.environ.get("SKEWED_CLOCK_REPORT"):
        with open(report, "a", encoding="utf-8") as out:
            out.write(f"{os.getpid()}\n")
