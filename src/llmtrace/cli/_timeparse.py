"""``--since``/``--until`` values: ``15m``/``2h``/``1d`` ago, RFC 3339, or Unix seconds."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

_REL = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_time(value: str, *, now_ns: int | None = None) -> int:
    """Unix nanoseconds for ``value``; raises ``ValueError`` with the accepted forms."""
    now = time.time_ns() if now_ns is None else now_ns
    v = value.strip()
    m = _REL.match(v)
    if m:
        return now - int(float(m.group(1)) * _UNIT_S[m.group(2)] * 1e9)
    try:
        return int(float(v) * 1e9)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"cannot read time {value!r}: use a duration ago (30s, 15m, 2h, 1d), RFC 3339 "
            "(2026-01-31T12:00:00Z) or Unix seconds"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1e9)
