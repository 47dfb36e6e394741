"""transformers' continuous batching (``init_continuous_batching``) with a real random-weight
Llama on the CPU: its requests as ``llm.request`` traces and its engine loop as ``llm.step``s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace

from llmtrace import semconv
from llmtrace.testing import CapturedTelemetry
from tests.helpers.waits import wait_for_spans

pytestmark = pytest.mark.torch


def _tiny_llama() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def manager(capture_spans: Any) -> Iterator[tuple[Any, CapturedTelemetry]]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    with capture_spans(engine_window_steps=16) as captured:
        model = _tiny_llama()
        generation = GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=-1, pad_token_id=0)
        # A small paged cache: 8 pages of 16 tokens (the default sizes it from free memory, slow to
        # allocate), so that long requests run out of it and get evicted.
        paged = ContinuousBatchingConfig(page_size=16, num_blocks=8, max_batch_tokens=64)
        cb = model.init_continuous_batching(generation_config=generation, continuous_batching_config=paged)
        cb.start()
        try:
            warm_up = cb.add_request([1, 2, 3], max_new_tokens=2)  # the first batch compiles and allocates
            assert cb.get_result(warm_up, timeout=300) is not None
            yield cb, captured
        finally:
            cb.stop(block=True)




def _attr(span: Any, key: str) -> Any:
    return span.attributes[key]


def test_requests_and_steps_of_the_continuous_batching_loop(manager: tuple[Any, CapturedTelemetry]) -> None:
    """Three requests added under a caller's span run in one engine loop: each llm.request is the
    caller's child with queue/prefill/decode and its exact token counts; its first and last step
    are steps that list it; a step running all three links to all three; forwards carry the engine id."""
    from llmtrace import _runtime

    cb, captured = manager
    prompts = {f"cb-{n}": list(range(1, 4 + 5 * n)) for n in range(3)}
    with _runtime.tracer().start_as_current_span("caller") as caller:
        for n, (rid, prompt) in enumerate(prompts.items()):
            assert rid == cb.add_request(prompt, request_id=rid, max_new_tokens=5 + n)
    for n, rid in enumerate(prompts):
        result = cb.get_result(rid, timeout=120)
        assert result is not None and 5 + n == len(result.generated_tokens)
    requests = {_attr(s, semconv.LLM_REQUEST_ID): s
                for s in wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST, 4) if s.attributes}
    steps = {_attr(s, semconv.LLM_STEP_ID): s for s in captured.spans if s.name == semconv.SPAN_STEP}
    for n, (rid, prompt) in enumerate(prompts.items()):
        request = requests[rid]
        assert caller.get_span_context().span_id == request.parent.span_id
        assert (len(prompt), 5 + n) == (_attr(request, semconv.GEN_AI_USAGE_INPUT_TOKENS),
                                        _attr(request, semconv.GEN_AI_USAGE_OUTPUT_TOKENS))
        assert semconv.FINISH_LENGTH == _attr(request, semconv.LLM_REQUEST_FINISH_REASON)
        children = {s.name for s in captured.children(request)}
        assert {semconv.SPAN_QUEUE, semconv.SPAN_PREFILL, semconv.SPAN_DECODE} <= children
        first, last = _attr(request, semconv.LLM_STEP_FIRST_ID), _attr(request, semconv.LLM_STEP_LAST_ID)
        for step_id in (first, last):
            assert rid in _attr(steps[step_id], semconv.LLM_BATCH_REQUEST_IDS)
        assert last - first == _attr(request, semconv.LLM_DECODE_STEPS)
    span_ids = {requests[rid].context.span_id for rid in prompts}
    shared = [s for s in steps.values() if set(prompts) <= set(_attr(s, semconv.LLM_BATCH_REQUEST_IDS))]
    assert shared, "no step ran all three requests"
    assert span_ids <= {link.context.span_id for link in shared[0].links}
    assert all(0.0 < _attr(s, semconv.LLM_KV_CACHE_USAGE) <= 1.0 for s in shared)  # three requests hold pages
    prefill = sum(_attr(s, semconv.LLM_BATCH_PREFILL_TOKENS) for s in steps.values())
    assert prefill >= sum(map(len, prompts.values()))
    forwards = [s for s in captured.spans if s.name == semconv.SPAN_FORWARD]
    assert forwards and {_attr(f, semconv.LLM_ENGINE_ID) for f in forwards} == {
        _attr(s, semconv.LLM_ENGINE_ID) for s in steps.values()}
    assert all(str(_attr(s, semconv.LLM_ENGINE_ID)).startswith("hf-cb") for s in steps.values())


def test_prefix_sharing_reports_the_cached_prompt_tokens(manager: tuple[Any, CapturedTelemetry]) -> None:
    """Two requests with the same 40-token prompt, one after the other: the first computes it all
    (a miss: 0 cached), the second is served whole blocks of it from the paged cache, as
    transformers' own prefix match says; the step that admitted it carries the same count."""
    cb, captured = manager
    prompt = list(range(10, 50))
    for rid in ("prefix-a", "prefix-b"):
        assert rid == cb.add_request(prompt, request_id=rid, max_new_tokens=2)
        assert cb.get_result(rid, timeout=120) is not None
    requests = {_attr(s, semconv.LLM_REQUEST_ID): s
                for s in wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST
                                        and str((s.attributes or {}).get(semconv.LLM_REQUEST_ID, "")).startswith(
                                            "prefix-"), 2)}
    first, second = requests["prefix-a"], requests["prefix-b"]
    assert 0 == _attr(first, semconv.LLM_PROMPT_TOKENS_CACHED)
    assert 40 == _attr(first, semconv.LLM_PROMPT_TOKENS_COMPUTED)
    cached = _attr(second, semconv.LLM_PROMPT_TOKENS_CACHED)
    assert cached > 0 and cached % 16 == 0  # whole pages of 16 tokens
    assert 40 - cached == _attr(second, semconv.LLM_PROMPT_TOKENS_COMPUTED)
    steps = [s for s in captured.spans if s.name == semconv.SPAN_STEP
             and "prefix-b" in (s.attributes or {}).get(semconv.LLM_BATCH_REQUEST_IDS, ())]
    assert cached in [(s.attributes or {}).get(semconv.LLM_BATCH_CACHED_TOKENS) for s in steps]


def test_a_cancelled_request_ends_as_abort(manager: tuple[Any, CapturedTelemetry]) -> None:
    """cancel_request() while the request streams: its llm.request ends as abort, with the tokens so far."""
    cb, captured = manager
    rid = cb.add_request(list(range(1, 9)), request_id="cb-cancel", max_new_tokens=400, streaming=True)
    outputs = cb.request_id_iter(rid)
    next(outputs)
    cb.cancel_request(rid)
    [request] = wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST
                      and s.attributes.get(semconv.LLM_REQUEST_ID) == "cb-cancel", 1)
    assert semconv.FINISH_ABORT == _attr(request, semconv.LLM_REQUEST_FINISH_REASON)
    assert trace.StatusCode.ERROR == request.status.status_code
    assert 1 <= _attr(request, semconv.GEN_AI_USAGE_OUTPUT_TOKENS) < 400


def test_an_evicted_request_queues_again_and_keeps_its_token_count(manager: tuple[Any, CapturedTelemetry]) -> None:
    """Four 40-token requests do not fit the 128-token cache together: the engine evicts (soft-resets)
    some; each such request gets a second llm.queue and llm.preemptions, and still counts all 40
    output tokens (its restarted state counts only those after the eviction)."""
    cb, captured = manager
    rids = [cb.add_request(list(range(1, 9 + n)), request_id=f"cb-long-{n}", max_new_tokens=40) for n in range(4)]
    requests = wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST
                     and str(s.attributes.get(semconv.LLM_REQUEST_ID, "")).startswith("cb-long-"), len(rids))
    assert len(rids) == len(requests)
    assert all(40 == _attr(r, semconv.GEN_AI_USAGE_OUTPUT_TOKENS) for r in requests)
    evicted = [r for r in requests if _attr(r, semconv.LLM_PREEMPTIONS) >= 1]
    assert evicted, "no request was evicted: the cache was large enough"
    for request in evicted:
        queues = [s for s in captured.children(request) if s.name == semconv.SPAN_QUEUE]
        assert 1 + _attr(request, semconv.LLM_PREEMPTIONS) == len(queues)
