"""Hot-path timestamps and their conversion to wall time, per process.

The hot path only reads ``time.monotonic_ns()``. Spans need wall-clock (epoch)
nanoseconds; each process converts with its *own* wall-minus-monotonic offset,
so two processes' monotonic clocks are never mixed: what crosses a process boundary
is either a wall timestamp or a duration.

The offset is not a constant: NTP slews the wall clock (up to 0.5 ms a second), a VM's
clock can be corrected faster (5 ms a second measured on the CI VM), and it can be
stepped. Taken once at start-up it drifts without bound, and llmtrace's spans drift away
from the OpenTelemetry SDK's (which read the wall clock directly): a request would start
before the SERVER span that contains it. So it is re-measured — but one span tree is
converted with *one* offset, so its durations and nesting are exactly the monotonic ones:
a server call keeps the offset of its start (``ServerScope.wall_offset_ns``: the SERVER
span's start converts to the call's arrival and back exactly), a request the one of its
call or else of its start (``RequestHandle.wall_offset_ns``), an engine window the one
taken when it opened. Conversions without an explicit offset (live spans, converted
as they end) re-measure when the timestamp is more than ``REFRESH_NS`` past the last
measurement.
"""

from __future__ import annotations

import os
import time

monotonic_ns = time.monotonic_ns


def _measure_offset() -> int:
    # Bracket the wall read between two monotonic reads and take the midpoint:
    # the offset is then good to well under a microsecond.
    before = monotonic_ns()
    wall = time.time_ns()
    after = monotonic_ns()
    return wall - (before + after) // 2


#: Re-measure the offset when converting a timestamp this much newer than the last
#: measurement: the error from a slewed wall clock stays under 50 µs even at 5 ms/s.
REFRESH_NS = 10_000_000

_measured_at_ns = monotonic_ns()
_offset_ns = _measure_offset()


def offset_ns() -> int:
    """The wall-minus-monotonic offset now (measured afresh), for converting one span tree."""
    reset_offset()
    return _offset_ns


def recent_offset_ns(mono_ns: int) -> int:
    """The offset for converting *mono_ns* (re-measured first if it is ``REFRESH_NS`` past the
    last measurement): cheap, for a span converted as it ends — both ends with this one."""
    if mono_ns - _measured_at_ns > REFRESH_NS:
        reset_offset()
    return _offset_ns


def to_wall_ns(mono_ns: int, offset: int | None = None) -> int:
    """Convert a monotonic timestamp taken in *this* process to epoch nanoseconds, with
    *offset* (one span tree's, from :func:`offset_ns`) or a recent one."""
    return mono_ns + (recent_offset_ns(mono_ns) if offset is None else offset)


def to_mono_ns(wall_ns: int, offset: int | None = None) -> int:
    """Convert an epoch timestamp (read just now, e.g. an SDK span's start) to this process's
    monotonic clock, with *offset* (the span tree's it will be converted back with) or the
    current one."""
    return wall_ns - (offset_ns() if offset is None else offset)


def reset_offset() -> None:
    """Re-measure the offset (after fork, or when the wall clock may have moved)."""
    global _offset_ns, _measured_at_ns
    _offset_ns = _measure_offset()
    _measured_at_ns = monotonic_ns()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=reset_offset)
