"""Where a request's prompt KV came from, and what speculative decoding kept, on its span,
in the summary an engine in another process sends back, and in the metrics."""

from __future__ import annotations

import pytest

from llmtrace import semconv, start_request
from tests.core.conftest import Captured

MS = 1_000_000


def test_prompt_cache_splits_the_prompt_three_ways(captured: Captured) -> None:
    handle = start_request("p1", prompt_tokens=100, arrival_ns=0)
    handle.prompt_cached(64, 16)
    handle.prompt_cached(0, 0)  # a recompute after preemption does not overwrite the first admission
    handle.token(at_ns=5 * MS)
    handle.finished(at_ns=6 * MS)
    attrs = captured.named(semconv.SPAN_REQUEST)[0].attributes or {}
    assert 80 == attrs[semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS]
    assert (20, 64, 16) == (attrs[semconv.LLM_PROMPT_TOKENS_COMPUTED], attrs[semconv.LLM_PROMPT_TOKENS_CACHED],
                            attrs[semconv.LLM_PROMPT_TOKENS_TRANSFERRED])


def test_no_provenance_attributes_when_no_engine_said(captured: Captured) -> None:
    handle = start_request("p2", prompt_tokens=10, arrival_ns=0)
    handle.finished(at_ns=MS)
    attrs = captured.named(semconv.SPAN_REQUEST)[0].attributes or {}
    assert not {semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, semconv.LLM_PROMPT_TOKENS_CACHED,
                semconv.LLM_SPEC_DRAFT_TOKENS} & set(attrs)


def test_an_engine_in_another_process_sends_provenance_in_its_summary(captured: Captured) -> None:
    """The engine's record -> summary (durations and counts only) -> the API side's llm.request."""
    engine = start_request("e1", prompt_tokens=40, arrival_ns=0)
    engine.prompt_cached(32)
    engine.speculated(4, 3)
    engine.speculated(4, 1)
    summary = engine.summary()
    engine.finished(at_ns=MS)
    assert {"cached_tokens": 32, "transferred_tokens": 0, "draft_tokens": 8, "accepted_tokens": 4}.items() \
        <= summary.items()
    api = start_request("a1", prompt_tokens=40, arrival_ns=0)
    api.engine_summary(summary)
    api.finished(at_ns=2 * MS)
    attrs = next(s.attributes for s in captured.named(semconv.SPAN_REQUEST)
                 if (s.attributes or {}).get(semconv.LLM_REQUEST_ID) == "a1") or {}
    assert (32, 8) == (attrs[semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS], attrs[semconv.LLM_PROMPT_TOKENS_COMPUTED])
    assert (8, 4) == (attrs[semconv.LLM_SPEC_DRAFT_TOKENS], attrs[semconv.LLM_SPEC_ACCEPTED_TOKENS])
    assert 0.5 == pytest.approx(attrs[semconv.LLM_SPEC_ACCEPTANCE_RATE])


def test_prompt_tokens_are_counted_by_source(captured: Captured) -> None:
    for i, (cached, transferred) in enumerate(((0, 0), (48, 0), (32, 8))):
        handle = start_request(f"m{i}", prompt_tokens=64, arrival_ns=0)
        handle.prompt_cached(cached, transferred)
        handle.finished(at_ns=MS)
    points = captured.metrics()[semconv.METRIC_PROMPT_TOKENS].data.data_points
    by_source = {p.attributes[semconv.LLM_PROMPT_TOKEN_SOURCE]: p.value for p in points}
    assert {"computed": 64 + 16 + 24, "cached": 48 + 32, "transferred": 8} == by_source
