"""Latency statistics computed once, when a request ends (never per token)."""

from __future__ import annotations

import operator
from typing import NamedTuple

NS = 1e-9


def percentile(sorted_values: list[int], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of an already sorted list."""
    if not sorted_values:
        return 0.0
    position = (len(sorted_values) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


class TokenTiming(NamedTuple):
    """TTFT, TPOT and inter-token-latency statistics of one request, in seconds (a named tuple:
    made once per sampled request by the span builder, where a frozen dataclass's ``__init__``
    cost a third of this module's time)."""

    ttft_s: float | None
    tpot_s: float | None
    itl_mean_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    itl_max_s: float | None


def tpot_s(token_times_ns: list[int]) -> float | None:
    """Time per output token, as vLLM defines it: (last token - first token) / (tokens - 1)."""
    if len(token_times_ns) < 2:
        return None
    return (token_times_ns[-1] - token_times_ns[0]) * NS / (len(token_times_ns) - 1)


def token_timing(start_ns: int, token_times_ns: list[int]) -> TokenTiming:
    """Statistics from the arrival time and the time each output token (or chunk) appeared.

    TPOT follows vLLM: (last token - first token) / (tokens - 1); the
    inter-token latencies are the gaps between consecutive token times.
    """
    if not token_times_ns:
        return TokenTiming(None, None, None, None, None, None)
    ttft = (token_times_ns[0] - start_ns) * NS
    if len(token_times_ns) < 2:
        return TokenTiming(ttft, None, None, None, None, None)
    gaps = sorted(map(operator.sub, token_times_ns[1:], token_times_ns))  # consecutive gaps, no frame per gap
    return TokenTiming(
        ttft_s=ttft,
        tpot_s=tpot_s(token_times_ns),
        itl_mean_s=sum(gaps) * NS / len(gaps),
        itl_p50_s=percentile(gaps, 50) * NS,
        itl_p99_s=percentile(gaps, 99) * NS,
        itl_max_s=gaps[-1] * NS,
    )
