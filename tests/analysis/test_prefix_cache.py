"""Prefix-cache provenance in the analysis: the hit ratio, the TTFT-vs-cached-share view and
the "prefill dominated by prefix-cache misses" verdict, from llm.request attributes."""

from __future__ import annotations

from llmtrace import semconv as sc
from llmtrace.analysis.bottleneck import Bottleneck
from llmtrace.analysis.build import build_traceset
from llmtrace.analysis.summary import analyze, to_json
from tests.analysis.builders import request_trace


def _provenance(prompt: int, cached: int) -> dict[str, int]:
    return {sc.LLM_PROMPT_TOKENS_CACHED: cached, sc.LLM_PROMPT_TOKENS_COMPUTED: prompt - cached,
            sc.LLM_PROMPT_TOKENS_TRANSFERRED: 0, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: cached}


def _requests(cached_of: list[int], prefill_ms: float = 80.0) -> list:  # type: ignore[type-arg]
    spans = []
    for i, cached in enumerate(cached_of):
        # A hit's prefill computes only the uncached part of a 512-token prompt.
        prefill = prefill_ms * (512 - cached) / 512 + 1.0
        spans += request_trace(f"{i:032x}", i * 200.0, 1.0, 2.0, prefill, 10.0, input_tokens=512,
                               attrs=_provenance(512, cached))
    return spans


def test_hit_ratio_and_ttft_of_hits_and_misses() -> None:
    a = analyze(build_traceset(_requests([0, 0, 0, 384, 384, 448])))
    summary = to_json(a, include_views=True)["prefix_cache"]
    assert 6 == summary["requests"] and 3 == summary["hit_requests"]
    assert {"computed": 3 * 512 + 128 + 128 + 64, "cached": 384 + 384 + 448, "transferred": 0} == summary["tokens"]
    assert abs(summary["hit_ratio"] - 1216 / 3072) < 1e-9
    assert summary["ttft_p50_s"]["hit"] < summary["ttft_p50_s"]["miss"]
    view = to_json(a, include_views=True)["views"]["ttft_vs_cached"]
    assert 6 == len(view) and [0.0, 0.75] == sorted({share for share, _ in view})[:2]


def test_prefill_dominated_by_misses_is_named_with_its_evidence() -> None:
    """Most of the latency is prefill and most prompt tokens were computed, while some requests
    did hit: the verdict is prefix-cache misses, and the advice is about routing and eviction."""
    a = analyze(build_traceset(_requests([0] * 9 + [448], prefill_ms=400.0)))
    assert Bottleneck.PREFIX_MISS == a.diagnosis.cls
    assert a.diagnosis.evidence["prompt_tokens_computed_share"] > 0.9
    assert "prefix-aware routing" in a.diagnosis.recommendation


def test_without_provenance_there_is_no_prefix_cache_result_and_no_such_score() -> None:
    """Unmeasured is not zero: no summary key, no view, and the class is not scored at all."""
    spans = []
    for i in range(4):
        spans += request_trace(f"{i:032x}", i * 200.0, 1.0, 2.0, 400.0, 10.0)
    out = to_json(analyze(build_traceset(spans)), include_views=True)
    assert "prefix_cache" not in out and "ttft_vs_cached" not in out["views"]
    assert Bottleneck.PREFIX_MISS.value not in out["bottleneck"]["scores"]
