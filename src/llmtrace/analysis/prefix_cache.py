"""Prefix-cache provenance: how much of the prompts the engine served from its prefix cache,
and what that did to time to first token.

Read from the ``llm.prompt_tokens.*`` attributes of ``llm.request`` (docs/span-model.md);
requests without them (an engine that does not report, a front end traced alone) are left
out, and with none at all there is no result (``None``): unmeasured, not zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmtrace import semconv as sc
from llmtrace.analysis.model import RequestView
from llmtrace.analysis.stats import percentile

#: A request counts as a hit when at least this share of its prompt came from the cache; a
#: shared system prompt is typically a third to most of a chat prompt.
HIT_SHARE = 0.25
#: Points kept for the TTFT-vs-cached-share view.
MAX_POINTS = 4000


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    requests: int  # requests that reported provenance
    computed_tokens: int
    cached_tokens: int
    transferred_tokens: int
    #: cached / (computed + cached + transferred): vLLM's prefix-cache hit rate, per token.
    hit_ratio: float
    hit_requests: int  # requests with at least HIT_SHARE of the prompt cached
    ttft_hit_p50_s: float | None
    ttft_miss_p50_s: float | None
    #: (cached share of the prompt, TTFT s) per request, for the view.
    points: tuple[tuple[float, float], ...]

    @property
    def miss_share(self) -> float:
        """Share of the prompt tokens the engine had to compute."""
        total = self.computed_tokens + self.cached_tokens + self.transferred_tokens
        return self.computed_tokens / total if total else 0.0


def prompt_split(r: RequestView) -> tuple[float, float, float] | None:
    """(computed, cached, transferred) prompt tokens of a request that reports them."""
    n_cached = r.num(sc.LLM_PROMPT_TOKENS_CACHED)
    if n_cached is None:
        return None
    return r.num(sc.LLM_PROMPT_TOKENS_COMPUTED) or 0.0, n_cached, r.num(sc.LLM_PROMPT_TOKENS_TRANSFERRED) or 0.0


def cached_share(r: RequestView) -> float | None:
    """Share of the request's prompt served from the prefix cache; None when unreported.

    From the ``llm.prompt_tokens.*`` split where the request has it (the hit share of
    :func:`prefix_cache_stats`); else, for an emitter that has only the GenAI convention's
    key, ``gen_ai.usage.cache_read.input_tokens`` over the input tokens (that key also
    counts KV received by transfer: the prompt share the engine did not compute)."""
    split = prompt_split(r)
    if split is not None:
        prompt = sum(split)
        return split[1] / prompt if prompt else None
    read = r.num(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS)
    if read is None or not r.input_tokens:
        return None
    return min(1.0, read / r.input_tokens)


def prefix_cache_stats(requests: Sequence[RequestView]) -> PrefixCacheStats | None:
    computed = cached = transferred = hits = 0
    reporting = 0
    hit_ttft: list[float] = []
    miss_ttft: list[float] = []
    points: list[tuple[float, float]] = []
    for r in requests:
        split = prompt_split(r)
        if split is None:
            continue
        n_computed, n_cached, n_transferred = split
        reporting += 1
        computed += int(n_computed)
        cached += int(n_cached)
        transferred += int(n_transferred)
        prompt = n_computed + n_cached + n_transferred
        share = n_cached / prompt if prompt else 0.0
        hit = share >= HIT_SHARE
        hits += hit
        if r.ttft_s is not None:
            (hit_ttft if hit else miss_ttft).append(r.ttft_s)
            if len(points) < MAX_POINTS:
                points.append((round(share, 4), r.ttft_s))
    if not reporting:
        return None
    total = computed + cached + transferred
    return PrefixCacheStats(
        requests=reporting,
        computed_tokens=computed,
        cached_tokens=cached,
        transferred_tokens=transferred,
        hit_ratio=cached / total if total else 0.0,
        hit_requests=hits,
        ttft_hit_p50_s=percentile(hit_ttft, 50) if hit_ttft else None,
        ttft_miss_p50_s=percentile(miss_ttft, 50) if miss_ttft else None,
        points=tuple(points),
    )
