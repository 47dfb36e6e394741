"""A tiny stderr progress bar: silent when stderr is not a terminal or with --quiet."""

from __future__ import annotations

import sys
import time
from typing import TextIO

#: Redraw at most this often; a bar that repaints per line would cost more than parsing.
_MIN_INTERVAL_S = 0.1
_WIDTH = 30


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"  # pragma: no cover


class Progress:
    """Callable ``(done, total)``; ``total == 0`` means unknown (a spinner-like byte count)."""

    def __init__(
        self, label: str, *, enabled: bool | None = None, stream: TextIO | None = None, unit: str = "bytes"
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.unit = unit
        self._last = 0.0
        self._drawn = False

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
            self.stream.write(f"\r{self.label} [{bar}] {tail}")
        else:
            self.stream.write(f"\r{self.label} {_human(done) if self.unit == 'bytes' else done}")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn = False
