"""Hot-path timestamps and their conversion to wall time, per process.

The hot path only reads ``time.monotonic_ns()``. Spans need wall-clock (epoch)
nanoseconds; each process converts with its *own* wall-minus-monotonic offset,
taken once, so two processes' monotonic clocks are never mixed: what crosses a
process boundary is either a wall timestamp or a duration.

``LLMTRACE_TEST_CLOCK_SKEW_NS`` shifts this process's monotonic readings by a
constant; it exists only so that tests can prove the above (a process whose
monotonic clock differs from its peer's must still produce aligned spans).
"""

from __future__ import annotations

import os
import time

_SKEW_NS = int(os.environ.get("LLMTRACE_TEST_CLOCK_SKEW_NS", "0") or 0)

if _SKEW_NS:

    def monotonic_ns() -> int:
        return time.monotonic_ns() + _SKEW_NS

else:
    monotonic_ns = time.monotonic_ns


def _measure_offset() -> int:
    # Bracket the wall read between two monotonic reads and take the midpoint:
    # the offset is then good to well under a microsecond.
    before = monotonic_ns()
    wall = time.time_ns()
    after = monotonic_ns()
    return wall - (before + after) // 2


_offset_ns = _measure_offset()


def to_wall_ns(mono_ns: int) -> int:
    """Convert a monotonic timestamp taken in *this* process to epoch nanoseconds."""
    return mono_ns + _offset_ns


def to_mono_ns(wall_ns: int) -> int:
    """Convert an epoch timestamp to this process's monotonic clock."""
    return wall_ns - _offset_ns


def reset_offset() -> None:
    """Re-measure the offset (after fork, or when NTP stepped the wall clock)."""
    global _offset_ns
    _offset_ns = _measure_offset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=reset_offset)
