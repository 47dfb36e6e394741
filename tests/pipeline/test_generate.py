"""transformers generate() -> llm.request with prefill/decode, TTFT, TPOT and ITL from per-step timestamps."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from opentelemetry import trace

import llmtrace
from llmtrace import semconv

pytestmark = pytest.mark.torch


def _generate(model: Any, tokenizer: Any, prompts: Any, **kwargs: Any) -> Any:
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    return enc, model.generate(**enc, **kwargs)


def test_greedy_generate_is_one_request_with_phases(tiny_model: Any, tiny_tokenizer: Any,
                                                    capture_spans: Any) -> None:
    """Greedy: input/output tokens, finish reason, prefill ends where decode starts, TTFT = prefill end."""
    with capture_spans() as captured:
        enc, _ = _generate(tiny_model, tiny_tokenizer, "hello world", max_new_tokens=6, min_new_tokens=6,
                           do_sample=False)
    request = captured.one(semconv.SPAN_REQUEST)
    attrs = request.attributes
    assert enc["input_ids"].shape[-1] == attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS]
    assert 6 == attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]
    assert ("length",) == tuple(attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS])
    assert 0.0 == attrs[semconv.GEN_AI_REQUEST_TEMPERATURE]
    assert 6 == attrs[semconv.GEN_AI_REQUEST_MAX_TOKENS]
    prefill = captured.one(semconv.SPAN_PREFILL)
    decode = captured.one(semconv.SPAN_DECODE)
    assert prefill.end_time == decode.start_time
    ttft = (prefill.end_time - request.start_time) / 1e9
    assert ttft == pytest.approx(attrs[semconv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN], abs=2e-6)
    tpot = (decode.end_time - decode.start_time) / 1e9 / 5
    assert tpot == pytest.approx(attrs[semconv.LLM_TPOT_S], rel=1e-3)
    for key in (semconv.LLM_ITL_MEAN_S, semconv.LLM_ITL_P50_S, semconv.LLM_ITL_P99_S, semconv.LLM_ITL_MAX_S):
        assert attrs[key] > 0
    assert attrs[semconv.LLM_ITL_MAX_S] >= attrs[semconv.LLM_ITL_P99_S] >= attrs[semconv.LLM_ITL_P50_S]
    assert [] == captured.named(semconv.SPAN_FORWARD)  # steps are timestamps, not spans


def test_sampling_parameters_are_recorded(tiny_model: Any, tiny_tokenizer: Any, capture_spans: Any) -> None:
    """do_sample with temperature/top_p: the request carries them."""
    with capture_spans() as captured:
        _generate(tiny_model, tiny_tokenizer, "hello", max_new_tokens=4, min_new_tokens=4, do_sample=True,
                  temperature=0.7, top_p=0.9)
    attrs = captured.one(semconv.SPAN_REQUEST).attributes
    assert 0.7 == pytest.approx(attrs[semconv.GEN_AI_REQUEST_TEMPERATURE])
    assert 0.9 == pytest.approx(attrs[semconv.GEN_AI_REQUEST_TOP_P])
    assert 4 == attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]


def test_batched_generate_counts_real_tokens_per_sequence(tiny_model: Any, tiny_tokenizer: Any,
                                                          capture_spans: Any) -> None:
    """A padded batch: input tokens exclude padding; one finish reason and length per sequence."""
    prompts = ["hello", "the quick brown fox jumps over the lazy dog"]
    with capture_spans() as captured:
        enc, _ = _generate(tiny_model, tiny_tokenizer, prompts, max_new_tokens=5, min_new_tokens=5,
                           do_sample=False)
    attrs = captured.one(semconv.SPAN_REQUEST).attributes
    per_sequence = [int(n) for n in enc["attention_mask"].sum(-1)]
    assert per_sequence[0] < per_sequence[1]
    assert per_sequence == list(attrs[semconv.LLM_BATCH_INPUT_TOKENS])
    assert sum(per_sequence) == attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS]
    assert [5, 5] == list(attrs[semconv.LLM_BATCH_OUTPUT_TOKENS])
    assert 10 == attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]
    assert ["length", "length"] == list(attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS])
    assert 2 == attrs[semconv.LLM_BATCH_SIZE]


def test_eos_ends_a_sequence_early(tiny_tokenizer: Any, capture_spans: Any) -> None:
    """A sequence that emits eos is counted up to it and finishes with 'stop'."""
    import torch

    from tests.helpers import tiny_models

    model = tiny_models.fresh_model()
    eos = tiny_tokenizer.eos_token_id
    with torch.no_grad():  # make eos the certain next token: greedy stops after one token
        model.lm_head.weight.zero_()
        model.lm_head.weight[eos].fill_(1.0)
        model.transformer.ln_f.bias.fill_(1.0)
        model.transformer.ln_f.weight.zero_()
    with capture_spans() as captured:
        _generate(model, tiny_tokenizer, "hello world", max_new_tokens=5, do_sample=False)
    attrs = captured.one(semconv.SPAN_REQUEST).attributes
    assert 1 == attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]
    assert ["stop"] == list(attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS])


def test_text_iterator_streamer_in_a_thread_joins_the_callers_trace(tiny_model: Any, tiny_tokenizer: Any,
                                                                    capture_spans: Any) -> None:
    """generate() in a plain Thread with a TextIteratorStreamer: the request is a child of the caller's span."""
    from transformers import TextIteratorStreamer

    with capture_spans() as captured, trace.get_tracer("test").start_as_current_span("handler"):
        enc = tiny_tokenizer("hello world", return_tensors="pt")
        streamer = TextIteratorStreamer(tiny_tokenizer, skip_prompt=True, timeout=30)
        thread = threading.Thread(target=tiny_model.generate,
                                  kwargs=dict(**enc, streamer=streamer, max_new_tokens=6, min_new_tokens=6,
                                              do_sample=False))
        thread.start()
        text = "".join(streamer)
        thread.join()
    handler = captured.one("handler")
    request = captured.one(semconv.SPAN_REQUEST)
    assert [request] == captured.children(handler, semconv.SPAN_REQUEST)
    assert request.attributes[semconv.LLM_STREAM] is True
    assert 6 == request.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]
    assert request.attributes[semconv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] > 0
    assert request.attributes[semconv.LLM_DETOKENIZE_TOTAL_S] > 0  # the streamer's incremental decodes
    assert isinstance(text, str)


def test_generate_inside_a_request_reports_on_it(tiny_model: Any, tiny_tokenizer: Any, capture_spans: Any) -> None:
    """With a request already current, generate() adds its tokens to it instead of opening another."""
    with capture_spans() as captured:
        handle = llmtrace.start_request(model="served-model")
        with handle.activate():
            _generate(tiny_model, tiny_tokenizer, "hello", max_new_tokens=3, min_new_tokens=3, do_sample=False)
        handle.finished("stop")
    request = captured.one(semconv.SPAN_REQUEST)
    assert "served-model" == request.attributes[semconv.GEN_AI_REQUEST_MODEL]
    assert 3 == request.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]


def test_generate_that_raises_ends_the_request_as_error(tiny_model: Any, tiny_tokenizer: Any,
                                                       capture_spans: Any) -> None:
    """The host's exception propagates; llm.request ends with finish reason error and status ERROR."""
    enc = tiny_tokenizer("hello", return_tensors="pt")
    with capture_spans() as captured, pytest.raises(ValueError):
        tiny_model.generate(**enc, max_new_tokens=-1)
    request = captured.one(semconv.SPAN_REQUEST)
    assert "error" == request.attributes[semconv.LLM_REQUEST_FINISH_REASON]
    assert trace.StatusCode.ERROR == request.status.status_code
    assert "ValueError" == request.status.description


def test_content_capture_is_off_by_default_and_truncated_when_on(tiny_model: Any, tiny_tokenizer: Any,
                                                                 capture_spans: Any) -> None:
    """No prompt text unless capture_content=True; then prompt and completion, cut to the limit."""
    from transformers import TextStreamer

    prompt = "the quick brown fox jumps over the lazy dog"
    with capture_spans() as captured, trace.get_tracer("test").start_as_current_span("handler"):
        _generate(tiny_model, tiny_tokenizer, prompt, max_new_tokens=3, do_sample=False)
    assert semconv.GEN_AI_PROMPT not in captured.one(semconv.SPAN_REQUEST).attributes

    with capture_spans(capture_content=True, capture_content_max_chars=9) as captured:
        handle = llmtrace.start_request(model="m")
        with handle.activate():
            ids = tiny_tokenizer(prompt, return_tensors="pt")
        handle.finished("stop", completion="a long completion text")
        streamer = TextStreamer(tiny_tokenizer, skip_prompt=True)
        tiny_model.generate(**ids, max_new_tokens=3, min_new_tokens=3, do_sample=False, streamer=streamer)
    first, second = captured.named(semconv.SPAN_REQUEST)
    assert prompt[:9] == first.attributes[semconv.GEN_AI_PROMPT]
    assert "a long co" == first.attributes[semconv.GEN_AI_COMPLETION]
    assert len(second.attributes[semconv.GEN_AI_COMPLETION]) <= 9


def test_request_scope_survives_asyncio_to_thread_and_executors(tiny_model: Any, tiny_tokenizer: Any,
                                                                capture_spans: Any) -> None:
    """asyncio.to_thread copies the context; an executor gets it with contextvars.copy_context().run."""
    import asyncio
    import contextvars
    from concurrent.futures import ThreadPoolExecutor

    enc = tiny_tokenizer("hello", return_tensors="pt")
    kwargs = dict(**enc, max_new_tokens=2, min_new_tokens=2, do_sample=False)

    async def handler() -> None:
        with trace.get_tracer("test").start_as_current_span("async-handler"):
            await asyncio.to_thread(tiny_model.generate, **kwargs)

    with capture_spans() as captured:
        asyncio.run(handler())
        with trace.get_tracer("test").start_as_current_span("pool-handler"), ThreadPoolExecutor(1) as pool:
            ctx = contextvars.copy_context()
            pool.submit(lambda: ctx.run(tiny_model.generate, **kwargs)).result()
    for parent in ("async-handler", "pool-handler"):
        assert 1 == len(captured.children(captured.one(parent), semconv.SPAN_REQUEST)), parent
