"""The live progress line while a load runs (stderr, only on a terminal), redrawn every
:data:`REDRAW_S` by the driver's ticker (with ``--processes``, by the parent from the workers'
shared counts)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from llmtrace._status_line import StatusLine
from llmtrace.load.model import Outcome, RequestResult, Step

#: Redraw period, seconds: often enough to watch, rare enough to cost nothing next to the load.
REDRAW_S = 0.5


@dataclass
class Tally:
    """Counts kept as results arrive."""

    sent: int = 0
    done: int = 0
    ok: int = 0
    errors: int = 0
    chaos: int = 0
    recent_ttft: list[float] = field(default_factory=list)

    def add(self, result: RequestResult) -> None:
        self.done += 1
        if result.outcome is Outcome.OK:
            self.ok += 1
            if result.ttft_s is not None:
                self.recent_ttft.append(result.ttft_s)
                del self.recent_ttft[:-200]
        elif result.outcome is Outcome.CHAOS:
            self.chaos += 1
        elif result.outcome is not Outcome.CANCELLED:
            self.errors += 1

    def snapshot(self) -> tuple[float, ...]:
        """What a worker process shares with the parent (:data:`SNAPSHOT_FIELDS` numbers): the
        counts and the median of its recent TTFTs (0: none yet)."""
        ttfts = sorted(self.recent_ttft)
        return (self.sent, self.done, self.ok, self.errors, self.chaos, ttfts[len(ttfts) // 2] if ttfts else 0.0)

    @classmethod
    def merged(cls, snapshots: list[tuple[float, ...]]) -> Tally:
        """The workers' snapshots as one tally; its TTFTs are the workers' medians."""
        sent, done, ok, errors, chaos = (int(sum(row[i] for row in snapshots)) for i in range(5))
        return cls(sent, done, ok, errors, chaos, [row[5] for row in snapshots if row[5] > 0])


SNAPSHOT_FIELDS = 6


class LiveLine(StatusLine):
    """``step 3/7 qps=4 | sent 120, in flight 10 | ok 105, errors 2, chaos 3 | ttft p50 120 ms``"""

    def __init__(self, steps: tuple[Step, ...], *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        super().__init__(enabled=enabled, stream=stream)
        self.steps = steps

    def progress(self, start: float) -> Callable[[Tally], None]:
        """A callback for the driver: draws *tally* at the time since *start* (``time.monotonic()``)."""
        return lambda tally: self.draw(tally, time.monotonic() - start)

    def draw(self, tally: Tally, elapsed_s: float) -> None:
        if not self.enabled:
            return
        step = next((s for s in reversed(self.steps) if s.start_s <= elapsed_s), None)
        where = f"step {step.index + 1}/{len(self.steps)} {step.label}" if step and len(self.steps) > 1 else (
            step.label if step else "")
        ttfts = sorted(tally.recent_ttft)
        ttft = f" | ttft p50 {ttfts[len(ttfts) // 2] * 1000:.0f} ms" if ttfts else ""
        self.show(f"{elapsed_s:6.1f}s {where} | sent {tally.sent}, in flight {tally.sent - tally.done} | "
                  f"ok {tally.ok}, errors {tally.errors}, chaos {tally.chaos}{ttft}")
