"""Service-level objectives: one definition for ``--slo``, the load report and the Prometheus alerts.

``ttft=500ms,tpot=50ms,e2e=10s`` (units ``ms``/``s``, a bare number is seconds). The same
text feeds ``llmtrace load --slo`` (goodput, capacity) and ``llmtrace load --slo … --alerts PATH``
(deploy/prometheus/alerts.yml), so what the benchmark calls "meets the SLO" is what the
alert fires on in production: the p99 of TTFT / TPOT / request duration over the SLO.
"""

from __future__ import annotations

import math

from llmtrace.errors import LLMTraceError
from llmtrace.load.model import Slo

_KEYS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}


def parse_duration(text: str) -> float:
    value = text.strip().lower()
    scale = 1.0
    if value.endswith("ms"):
        value, scale = value[:-2], 1e-3
    elif value.endswith("s"):
        value = value[:-1]
    try:
        seconds = float(value) * scale
    except ValueError:
        raise LLMTraceError(f"{text!r} is not a duration (e.g. 500ms, 2s, 0.05)") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise LLMTraceError(f"{text!r}: a duration must be positive")
    return seconds


def parse_slo(text: str) -> Slo:
    """``"ttft=500ms,tpot=50ms,e2e=10s"`` -> :class:`Slo`; any subset of the three keys."""
    values: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in _KEYS:
            raise LLMTraceError(f"--slo: {part.strip()!r} is not KEY=DURATION with KEY one of ttft, tpot, e2e "
                                "(e.g. ttft=500ms,tpot=50ms,e2e=10s)")
        values[_KEYS[key]] = parse_duration(value)
    if not values:
        raise LLMTraceError("--slo: no objective given (e.g. ttft=500ms,tpot=50ms)")
    return Slo(**values)


def describe(slo: Slo) -> str:
    parts = [f"{name}<={_fmt(value)}" for name, value in
             (("ttft", slo.ttft_s), ("tpot", slo.tpot_s), ("e2e", slo.e2e_s)) if value is not None]
    return ", ".join(parts) or "none"


def _fmt(seconds: float) -> str:
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"
