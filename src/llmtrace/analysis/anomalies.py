"""Robust outliers: requests far slower than their peers of similar input length.

Requests are bucketed by input tokens in powers of two (a 4k-token prompt is not an
outlier for having a slower first token than a 40-token one). Inside a bucket the robust
z-score is ``0.6745 * (x - median) / MAD`` (Iglewicz & Hoaglin); a request is anomalous
when it exceeds :data:`Z_THRESHOLD` on TTFT or end-to-end latency. Each anomaly names the
span that owned most of its critical path, which is where to look first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmtrace.analysis.model import RequestView
from llmtrace.analysis.stats import mad, median

#: Iglewicz & Hoaglin's recommended cut-off for the modified z-score.
Z_THRESHOLD = 3.5
#: Below this many requests a bucket's median/MAD are too noisy to call anything an outlier.
MIN_BUCKET = 8
#: A MAD of zero (identical latencies) would make every difference infinite; differences
#: smaller than this relative floor of the median are never anomalies.
MAD_FLOOR = 0.01
#: The summary lists at most this many anomalies, worst first.
MAX_ANOMALIES = 50


@dataclass(frozen=True, slots=True)
class Anomaly:
    trace_id: str
    request_id: str
    metric: str  # "ttft_s" | "e2e_s"
    value: float
    bucket: str
    median: float
    z: float
    input_tokens: int | None
    dominant_segment: str
    dominant_s: float


def bucket_of(tokens: int | None) -> str:
    if tokens is None or tokens <= 0:
        return "unknown"
    lo = 1 << (max(1, tokens).bit_length() - 1)
    return f"{lo}-{2 * lo - 1}"


def find_anomalies(
    requests: Sequence[RequestView], dominant: Mapping[tuple[str, str], tuple[str, float]]
) -> list[Anomaly]:
    """``dominant`` maps (request span id, metric) to the top critical-path segment of that
    metric's part of the request (name, seconds): for TTFT only the path before the first token."""
    buckets: dict[str, list[RequestView]] = {}
    for r in requests:
        buckets.setdefault(bucket_of(r.input_tokens), []).append(r)
    found: dict[tuple[str, str], Anomaly] = {}
    for bucket, members in buckets.items():
        if len(members) < MIN_BUCKET:
            continue
        for metric in ("ttft_s", "e2e_s"):
            values = [(r, getattr(r, metric)) for r in members]
            xs = [v for _, v in values if v is not None and not math.isnan(v)]
            if len(xs) < MIN_BUCKET:
                continue
            med = median(xs)
            spread = max(mad(xs, med), MAD_FLOOR * abs(med), 1e-9)
            for r, v in values:
                if v is None:
                    continue
                z = 0.6745 * (v - med) / spread
                if z > Z_THRESHOLD:
                    seg, seg_s = dominant.get((r.request.span_id, metric), ("?", 0.0))
                    found[(r.request.span_id, metric)] = Anomaly(
                        r.trace.trace_id,
                        r.request_id,
                        metric,
                        v,
                        bucket,
                        med,
                        round(z, 2),
                        r.input_tokens,
                        seg,
                        seg_s,
                    )
    return sorted(found.values(), key=lambda a: -a.z)[:MAX_ANOMALIES]
