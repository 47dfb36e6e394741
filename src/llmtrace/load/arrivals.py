"""Load profiles: when each request is sent and how long its prompt and answer are.

Open loop (``--qps``): the whole schedule is drawn before the first send, so how fast the
server answers never changes when the next request goes out (no coordinated omission).
Closed loop (``--concurrency``): each client sends its next request when the last one ended;
only the lengths are drawn here (:class:`Lengths`).

Profiles::

    steady     one rate (or one concurrency) for --duration
    steps      one step per level (--qps 1:64 doubles 1 -> 64), --step-duration each
    burst      a steady rate plus --burst-size requests at once every --burst-every seconds
    long-tail  steady arrivals, prompt/answer lengths log-normal with a heavy tail
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from llmtrace.errors import LLMTraceError
from llmtrace.load.model import Chaos, PlannedRequest, Step

PROFILES = ("steady", "steps", "burst", "long-tail")
ARRIVALS = ("poisson", "constant")
#: Spread of the long-tail length distribution (sigma of the log): with 1.0 the p99 is ~10x the
#: median, the shape of chat prompt lengths in public traces (Azure, Mooncake).
LONG_TAIL_SIGMA = 1.0
#: Spread of the default lengths: +-25% uniform around the requested value, so that requests
#: do not all finish in lock-step.
UNIFORM_SPREAD = 0.25
#: Chaos kinds in the order chaos clients take them.
CHAOS_CYCLE = (Chaos.DISCONNECT, Chaos.MALFORMED, Chaos.SLOW_READER)


def parse_levels(text: str, *, integer: bool) -> list[float]:
    """``"4"`` -> [4]; ``"1,2,8"`` -> [1, 2, 8]; ``"1:64"`` -> 1, 2, 4, ..., 64 (doubling)."""
    try:
        if ":" in text:
            low_text, high_text = text.split(":", 1)
            low, high = float(low_text), float(high_text)
            if not 0 < low <= high:
                raise ValueError
            levels = []
            value = low
            while value <= high * (1 + 1e-9):
                levels.append(value)
                value *= 2
        else:
            levels = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise LLMTraceError(f"{text!r} is not a level list: use 4, 1,2,8 or 1:64 (doubling)") from None
    if not levels or any(not math.isfinite(v) or v <= 0 for v in levels):
        raise LLMTraceError(f"{text!r}: every level must be a positive number")
    if integer and any(v != int(v) for v in levels):
        raise LLMTraceError(f"{text!r}: concurrency levels must be whole numbers")
    return levels


@dataclass(frozen=True)
class Lengths:
    """Prompt and answer lengths in tokens: ``uniform`` (+-25%), ``fixed`` or ``long-tail``."""

    input_tokens: int
    output_tokens: int
    distribution: str = "uniform"
    max_input_tokens: int = 32768
    max_output_tokens: int = 8192

    def draw(self, rng: random.Random) -> tuple[int, int]:
        return (self._one(rng, self.input_tokens, self.max_input_tokens),
                self._one(rng, self.output_tokens, self.max_output_tokens))

    def _one(self, rng: random.Random, median: int, cap: int) -> int:
        if self.distribution == "fixed":
            value = float(median)
        elif self.distribution == "long-tail":
            value = rng.lognormvariate(math.log(median), LONG_TAIL_SIGMA)
        else:
            value = median * rng.uniform(1 - UNIFORM_SPREAD, 1 + UNIFORM_SPREAD)
        return max(1, min(cap, round(value)))


def arrival_times(rate: float, start_s: float, duration_s: float, rng: random.Random, arrival: str) -> list[float]:
    """Send times in ``[start_s, start_s + duration_s)`` at *rate* per second."""
    times: list[float] = []
    if arrival == "constant":
        count = int(rate * duration_s + 1e-9)
        return [start_s + i / rate for i in range(count)]
    t = start_s
    while True:
        t += rng.expovariate(rate)
        if t >= start_s + duration_s:
            return times
        times.append(t)


def make_steps(levels: list[float], step_duration_s: float, *, closed_loop: bool) -> tuple[Step, ...]:
    return tuple(
        Step(index=i, start_s=i * step_duration_s, duration_s=step_duration_s,
             qps=None if closed_loop else level, concurrency=int(level) if closed_loop else None)
        for i, level in enumerate(levels)
    )


@dataclass(frozen=True)
class Burst:
    size: int
    every_s: float


def plan_open_loop(steps: tuple[Step, ...], lengths: Lengths, *, rng: random.Random, arrival: str = "poisson",
                   burst: Burst | None = None, chaos_share: float = 0.0,
                   chaos_kinds: tuple[Chaos, ...] = CHAOS_CYCLE) -> list[PlannedRequest]:
    """The whole open-loop schedule, sorted by send time."""
    plan: list[PlannedRequest] = []
    for step in steps:
        assert step.qps is not None, "open-loop steps carry a rate"
        times = arrival_times(step.qps, step.start_s, step.duration_s, rng, arrival)
        if burst is not None:
            at = step.start_s + burst.every_s / 2
            while at < step.start_s + step.duration_s:
                times.extend([at] * burst.size)
                at += burst.every_s
        for at in sorted(times):
            input_tokens, output_tokens = lengths.draw(rng)
            plan.append(PlannedRequest(at_s=at, input_tokens=input_tokens, output_tokens=output_tokens,
                                       step=step.index))
    return assign_chaos(plan, chaos_share, chaos_kinds)


def parse_chaos_kinds(text: str) -> tuple[Chaos, ...]:
    """``"disconnect,slow-reader"`` -> the kinds, in that order."""
    try:
        kinds = tuple(Chaos(part.strip()) for part in text.split(",") if part.strip())
    except ValueError:
        raise LLMTraceError(f"--chaos-kinds {text!r}: each must be one of "
                            f"{', '.join(c.value for c in Chaos)}") from None
    if not kinds:
        raise LLMTraceError("--chaos-kinds: name at least one kind")
    return kinds


def chaos_for(number: int, share: float, kinds: tuple[Chaos, ...] = CHAOS_CYCLE) -> Chaos | None:
    """What the *number*-th request (from 0) does when a *share* of them are chaos clients: every
    (1/share)-th is one, kinds taken in turn — evenly spread and reproducible."""
    if share <= 0:
        return None
    before, after = int(number * share + 1e-9), int((number + 1) * share + 1e-9)
    return kinds[before % len(kinds)] if after > before else None


def assign_chaos(plan: list[PlannedRequest], share: float,
                 kinds: tuple[Chaos, ...] = CHAOS_CYCLE) -> list[PlannedRequest]:
    """The schedule with :func:`chaos_for` applied to each request."""
    return [replace(r, chaos=chaos) if (chaos := chaos_for(i, share, kinds)) else r for i, r in enumerate(plan)]
