"""Tokenizer integrations: one user call is one record, routed by the scope it runs in."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace

import llmtrace
from llmtrace import semconv

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True, params=["native", "python"])
def tokenizer_methods(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with both forms of the patched methods: the compiled one
    (native/src/tokenizer_method.rs, where llmtrace-native is built) and the Python reference."""
    from llmtrace import _native

    if request.param == "native" and _native.load() is None:
        pytest.skip("llmtrace-native is not built: the compiled tokenizer methods are not in use")
    monkeypatch.setenv("LLMTRACE_NATIVE_TOKENIZER", request.param)
    return str(request.param)


def _raw(tokenizer: Any) -> Any:
    return tokenizer.backend_tokenizer


def test_tokenizers_encode_under_a_span_is_one_tokenize_span(tiny_tokenizer: Any, capture_spans: Any) -> None:
    """tokenizers.Tokenizer.encode under a current span -> one llm.tokenize child with the token count."""
    raw = _raw(tiny_tokenizer)
    with capture_spans() as captured, trace.get_tracer("test").start_as_current_span("work"):
        encoding = raw.encode("hello world, the quick brown fox")
    span = captured.one(semconv.SPAN_TOKENIZE)
    assert len(encoding.ids) == span.attributes[semconv.LLM_TOKENIZE_TOKENS]
    assert 1 == span.attributes[semconv.LLM_TOKENIZE_BATCH]
    assert [span] == captured.children(captured.one("work"))


def test_tokenizers_batch_and_decode_methods_are_traced(tiny_tokenizer: Any, capture_spans: Any) -> None:
    """encode_batch, decode and decode_batch each give one span with their counts."""
    raw = _raw(tiny_tokenizer)
    with capture_spans() as captured, trace.get_tracer("test").start_as_current_span("work"):
        batch = raw.encode_batch(["hello world", "the quick brown fox"])
        raw.decode(batch[0].ids)
        raw.decode_batch([e.ids for e in batch])
    tokenize = captured.one(semconv.SPAN_TOKENIZE)
    assert sum(len(e.ids) for e in batch) == tokenize.attributes[semconv.LLM_TOKENIZE_TOKENS]
    assert 2 == tokenize.attributes[semconv.LLM_TOKENIZE_BATCH]
    detok = sorted(s.attributes[semconv.LLM_DETOKENIZE_TOKENS] for s in captured.named(semconv.SPAN_DETOKENIZE))
    assert sorted([len(batch[0].ids), sum(len(e.ids) for e in batch)]) == detok


def test_transformers_call_is_one_span_not_two(tiny_tokenizer: Any, capture_spans: Any) -> None:
    """A transformers tokenizer call runs tokenizers.encode_batch inside: only the outer call is recorded."""
    with capture_spans() as captured, trace.get_tracer("test").start_as_current_span("work"):
        enc = tiny_tokenizer(["hello world", "the quick brown fox jumps"], padding=True)
        ids = tiny_tokenizer.encode("hello world")
        tiny_tokenizer.decode(ids)
        tiny_tokenizer.batch_decode(enc["input_ids"])
    real_tokens = sum(sum(row) for row in enc["attention_mask"])
    counts = [s.attributes[semconv.LLM_TOKENIZE_TOKENS] for s in captured.named(semconv.SPAN_TOKENIZE)]
    assert sorted([real_tokens, len(ids)]) == sorted(counts)
    assert 2 == len(captured.named(semconv.SPAN_DETOKENIZE))
    assert {"TokenizersBackend"} == {s.attributes[semconv.LLM_TOKENIZER_CLASS] for s in captured.spans
                                     if s.name in (semconv.SPAN_TOKENIZE, semconv.SPAN_DETOKENIZE)}


def test_encode_in_a_request_is_recorded_on_the_request(tiny_tokenizer: Any, capture_spans: Any) -> None:
    """With a current request the encode becomes its llm.tokenize child (built at finish), not a live span."""
    with capture_spans() as captured:
        handle = llmtrace.start_request(model="m")
        with handle.activate():
            ids = tiny_tokenizer.encode("hello world, the quick brown fox")
            tiny_tokenizer.decode(ids)
        handle.finished()
    request = captured.one(semconv.SPAN_REQUEST)
    tokenize = captured.one(semconv.SPAN_TOKENIZE)
    assert [tokenize] == captured.children(request, semconv.SPAN_TOKENIZE)
    assert len(ids) == request.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS]
    assert request.attributes[semconv.LLM_DETOKENIZE_TOTAL_S] > 0
    assert [] == captured.named(semconv.SPAN_DETOKENIZE)  # incremental detokenize is a total, not a span


def test_a_failed_decode_in_a_request_is_a_detokenize_error_span(tiny_tokenizer: Any, capture_spans: Any) -> None:
    """A decode that raises inside a sampled request: the exception reaches the caller, the call's
    time goes on the request, and the failure is an ERROR ``llm.detokenize`` child of it."""
    raw = _raw(tiny_tokenizer)
    with capture_spans() as captured:
        handle = llmtrace.start_request(model="m")
        with handle.activate(), pytest.raises(TypeError):
            raw.decode("not token ids")
        handle.finished()
    request = captured.one(semconv.SPAN_REQUEST)
    failed = captured.one(semconv.SPAN_DETOKENIZE)
    assert [failed] == captured.children(request, semconv.SPAN_DETOKENIZE)
    assert trace.StatusCode.ERROR == failed.status.status_code
    assert "TypeError" == failed.events[0].attributes["exception.type"]
    assert request.attributes[semconv.LLM_DETOKENIZE_TOTAL_S] > 0


def test_decode_for_an_unsampled_request_is_not_timed(tiny_tokenizer: Any, capture_spans: Any) -> None:
    """Sampling dropped the request: its decodes pass straight through (a decode's time only goes on
    spans), while its encode still counts the prompt (metrics need it)."""
    with capture_spans() as captured:
        handle = llmtrace.start_request(model="m", owns_span=False)  # no sampled parent: not recording
        assert not handle.recording
        with handle.activate():
            ids = tiny_tokenizer.encode("hello world, the quick brown fox")
            assert "hello world" in tiny_tokenizer.decode(ids)
        handle.finished()
    assert 0 == handle.detokenize_ns
    assert len(ids) == handle.prompt_tokens
    assert [] == captured.named(semconv.SPAN_DETOKENIZE)


def test_tokenizer_outside_traced_work_records_nothing(tiny_tokenizer: Any, capture_spans: Any) -> None:
    """No request, no server call, no current span: no root spans for start-up tokenization."""
    with capture_spans() as captured:
        tiny_tokenizer("hello world")
        tiny_tokenizer.decode([5, 6, 7])
    assert [] == captured.spans


def test_tokenizer_error_propagates_and_marks_the_span(tiny_tokenizer: Any, capture_spans: Any) -> None:
    """The library's own exception reaches the caller untouched; the span says ERROR."""
    raw = _raw(tiny_tokenizer)
    with capture_spans() as captured, trace.get_tracer("test").start_as_current_span("work"), \
            pytest.raises(TypeError):
        raw.encode(12345)
    span = captured.one(semconv.SPAN_TOKENIZE)
    assert trace.StatusCode.ERROR == span.status.status_code


def test_slow_python_tokenizer_is_traced_once_per_call(capture_spans: Any) -> None:
    """A slow (PythonBackend) tokenizer — ByT5, which needs no vocabulary file — gives one span per call."""
    from transformers import ByT5Tokenizer
    from transformers.tokenization_python import PythonBackend

    tokenizer = ByT5Tokenizer()
    assert isinstance(tokenizer, PythonBackend)
    with capture_spans() as captured, trace.get_tracer("test").start_as_current_span("work"):
        ids = tokenizer("hello")["input_ids"]
        tokenizer.decode(ids)
    assert [len(ids)] == [s.attributes[semconv.LLM_TOKENIZE_TOKENS] for s in captured.named(semconv.SPAN_TOKENIZE)]
    assert [len(ids)] == [s.attributes[semconv.LLM_DETOKENIZE_TOKENS]
                          for s in captured.named(semconv.SPAN_DETOKENIZE)]
    assert "ByT5Tokenizer" == captured.one(semconv.SPAN_TOKENIZE).attributes[semconv.LLM_TOKENIZER_CLASS]


def test_encoding_counts_of_every_shape_an_encode_returns() -> None:
    """Real tokens and sequences of what transformers' encode methods return: ids (the list fast
    path), a batch of them, a ``BatchEncoding`` whose attention mask leaves padding out, tensors."""
    import torch
    from transformers import BatchEncoding

    from llmtrace.integrations.transformers.extractors import encoding_counts

    padded = BatchEncoding({"input_ids": [[5, 6, 7], [8, 0, 0]], "attention_mask": [[1, 1, 1], [1, 0, 0]]})
    cases = [([5, 6, 7], (3, 1)), ([], (0, 1)), ([[5, 6], [7]], (3, 2)), (padded, (4, 2)),
             (BatchEncoding({"input_ids": [5, 6]}), (2, 1)), (torch.tensor([[5, 6, 7]]), (3, 1)),
             (BatchEncoding({"input_ids": torch.tensor([[5, 6], [7, 8]]),
                             "attention_mask": torch.tensor([[1, 1], [1, 0]])}), (3, 2))]
    assert [expected for _, expected in cases] == [encoding_counts(result) for result, _ in cases]
