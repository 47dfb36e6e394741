"""One status line on stderr, redrawn in place; silent when the stream is not a terminal.

Shared by the CLI's progress bar (``llmtrace analyze`` reading a large source) and the live
line of ``llmtrace load``.
"""

from __future__ import annotations

import sys
from typing import TextIO


class StatusLine:
    """Writes a line over the last one (``\\r`` + erase to the end); :meth:`close` clears it."""

    def __init__(self, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._drawn = False

    def show(self, text: str) -> None:
        if not self.enabled:
            return
        self.stream.write("\r\033[K" + text)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn = False
