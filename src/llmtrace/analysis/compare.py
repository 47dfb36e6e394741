"""Regression check between two analysis summaries — the CI gate behind ``llmtrace compare``.

A latency metric regresses when the current value is worse than the baseline by more than
``threshold`` (relative) *and* the per-request samples say the shift is real: a one-sided
Mann-Whitney U test (current slower than base) with p < ``alpha``. The test needs no
normality, which latency never has; it compares whole distributions, so a p99 that moved
while the bulk did not is flagged by the threshold alone ("untested") only when too few
samples exist — see docs/analysis.md. GPU idle ratio compares in absolute points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmtrace.analysis.errors import SummaryError
from llmtrace.analysis.model import finite_number
from llmtrace.analysis.stats import mann_whitney_greater
from llmtrace.analysis.summary import SCHEMA, SCHEMA_VERSION

#: Relative worsening that counts as a regression (10%: below run-to-run noise of most
#: GPU benchmarks is ~3-5%, so 10% is a real change, not jitter).
DEFAULT_THRESHOLD = 0.10
DEFAULT_ALPHA = 0.05
#: Absolute worsening of the GPU idle ratio that counts (5 points of GPU time).
IDLE_POINTS = 0.05
#: Fewer samples than this per side and the test is skipped (threshold only, "untested").
MIN_SAMPLES = 8

# (metric path, samples key or None, higher_is_better)
_METRICS: tuple[tuple[str, str | None, bool], ...] = (
    ("requests.ttft_s.p50", "ttft_s", False),
    ("requests.ttft_s.p90", "ttft_s", False),
    ("requests.ttft_s.p99", "ttft_s", False),
    ("requests.e2e_s.p50", "e2e_s", False),
    ("requests.e2e_s.p90", "e2e_s", False),
    ("requests.e2e_s.p99", "e2e_s", False),
    ("requests.tpot_s.p50", "tpot_s", False),
    ("requests.tpot_s.p99", "tpot_s", False),
    ("breakdown.queue.p99_s", "queue_s", False),
    ("requests.throughput_rps", None, True),
)


@dataclass(frozen=True, slots=True)
class Delta:
    metric: str
    base: float
    current: float
    change: float  # relative (or absolute points for ratios)
    p_value: float | None
    regression: bool
    note: str = ""


def _get(doc: Mapping[str, Any], path: str) -> float | None:
    cur: Any = doc
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return finite_number(cur)


def _samples(doc: Mapping[str, Any]) -> dict[str, list[float]]:
    """The summary's per-request samples, numbers only: a hand-edited or damaged summary
    makes a test run on fewer samples (or none), never a crash."""
    raw = doc.get("samples")
    if not isinstance(raw, Mapping):
        return {}
    return {k: [f for x in v if (f := finite_number(x)) is not None] for k, v in raw.items() if isinstance(v, list)}


def check_summary(doc: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA:
        raise SummaryError(f'{name}: not an llmtrace analysis summary (no "schema": "{SCHEMA}")')
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise SummaryError(
            f"{name}: summary schema_version {doc.get('schema_version')} (this llmtrace reads {SCHEMA_VERSION})"
        )
    return doc


def compare(
    base: Mapping[str, Any],
    current: Mapping[str, Any],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
) -> list[Delta]:
    """Per-metric deltas of ``current`` against ``base``; ``regression`` marks the failures."""
    out = []
    bs, cs = _samples(base), _samples(current)
    for path, sample_key, higher_better in _METRICS:
        b, c = _get(base, path), _get(current, path)
        if b is None or c is None:
            continue
        change = (c - b) / b if b else (0.0 if c == b else float("inf"))
        worse = -change if higher_better else change
        p: float | None = None
        note = ""
        if sample_key is not None:
            xb: Sequence[float] = bs.get(sample_key) or ()
            xc: Sequence[float] = cs.get(sample_key) or ()
            if len(xb) >= MIN_SAMPLES and len(xc) >= MIN_SAMPLES:
                p = mann_whitney_greater(xb, xc)
            else:
                note = "untested: too few samples"
        regression = worse > threshold and (p is None or p < alpha)
        out.append(Delta(path, b, c, change, p, regression, note))
    bg, cg = base.get("gpu_idle"), current.get("gpu_idle")
    if not isinstance(bg, Mapping) or not isinstance(cg, Mapping):
        return out
    for eid in sorted(set(bg) & set(cg)):
        path = f"gpu_idle.{eid}.ratio"  # engine ids may contain dots: index directly
        b, c = _get(bg[eid], "ratio"), _get(cg[eid], "ratio")
        if b is None or c is None:
            continue
        out.append(Delta(path, b, c, c - b, None, c - b > IDLE_POINTS, "absolute points"))
    return out
