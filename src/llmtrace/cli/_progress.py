"""A tiny stderr progress bar: silent when stderr is not a terminal or with --quiet."""

from __future__ import annotations

import time
from typing import TextIO

from llmtrace._status_line import StatusLine

#: Redraw at most this often; a bar that repaints per line would cost more than parsing.
_MIN_INTERVAL_S = 0.1
_WIDTH = 30


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"  # pragma: no cover


class Progress(StatusLine):
    """Callable ``(done, total)``; ``total == 0`` means unknown (a spinner-like byte count)."""

    def __init__(
        self, label: str, *, enabled: bool | None = None, stream: TextIO | None = None, unit: str = "bytes"
    ) -> None:
        super().__init__(enabled=enabled, stream=stream)
        self.label = label
        self.unit = unit
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < _MIN_INTERVAL_S and done < total:
            return
        self._last = now
        if total > 0:
            frac = min(1.0, done / total)
            filled = int(frac * _WIDTH)
            bar = "#" * filled + "-" * (_WIDTH - filled)
            tail = f"{frac:4.0%}" + (f" {_human(done)}/{_human(total)}" if self.unit == "bytes" else "")
            self.show(f"{self.label} [{bar}] {tail}")
        else:
            self.show(f"{self.label} {_human(done) if self.unit == 'bytes' else done}")
