"""Faults inside llmtrace never reach the host: logged once, counted, the host call unchanged.

One test per wrapper: an extractor (or helper) the wrapper relies on is made to raise.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry import trace

from llmtrace import _safety


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected fault")


def _errors(site: str) -> int:
    return _safety.error_counts().get(site, 0)


def _assert_logged_once_per_process(caplog: pytest.LogCaptureFixture, site: str, errors_before: int) -> None:
    """The first error at *site* in this process is logged, later ones only counted: this test
    logged it exactly when no earlier test had an error there."""
    messages = [r.getMessage() for r in caplog.records if site in r.getMessage()]
    assert (1 if errors_before == 0 else 0) == len(messages), messages


@pytest.mark.parametrize(("target", "site"), [
    ("llmtrace.integrations.tokenizers.extractors.encode_info", "tokenize.wrapper"),
    ("llmtrace.integrations._common.record_tokenize", None),
])
def test_tokenizers_encode_fault(target: str, site: str | None, tiny_tokenizer: Any, capture_spans: Any,
                                 monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """tokenizers.Tokenizer.encode: a failing extractor leaves the encoding unchanged."""
    raw = tiny_tokenizer.backend_tokenizer
    expected = raw.encode("hello world").ids
    with capture_spans(), trace.get_tracer("t").start_as_current_span("work"):
        site = site or "tokenize.wrapper"  # record_tokenize fails inside the guarded encode hook
        monkeypatch.setattr(target, _boom)
        before = _errors(site)
        assert expected == raw.encode("hello world").ids
        assert expected == raw.encode("hello world").ids
    assert before + 2 == _errors(site)
    _assert_logged_once_per_process(caplog, site, before)


def test_tokenizers_decode_fault(tiny_tokenizer: Any, capture_spans: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """tokenizers.Tokenizer.decode: the text is unchanged."""
    raw = tiny_tokenizer.backend_tokenizer
    ids = raw.encode("hello world").ids
    with capture_spans(), trace.get_tracer("t").start_as_current_span("work"):
        monkeypatch.setattr("llmtrace.integrations.tokenizers.extractors.decode_tokens", _boom)
        before = _errors("detokenize.wrapper")
        assert "hello world" == raw.decode(ids)
    assert before + 1 == _errors("detokenize.wrapper")


def test_transformers_tokenizer_faults(tiny_tokenizer: Any, capture_spans: Any,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """PreTrainedTokenizerBase.__call__/decode: outputs unchanged when the count extractors raise."""
    with capture_spans(), trace.get_tracer("t").start_as_current_span("work"):
        expected = tiny_tokenizer("hello world")["input_ids"]
        monkeypatch.setattr("llmtrace.integrations.transformers.extractors.encoding_counts", _boom)
        monkeypatch.setattr("llmtrace.integrations.transformers.extractors.ids_count", _boom)
        before = (_errors("tokenize.wrapper"), _errors("detokenize.wrapper"))
        assert expected == tiny_tokenizer("hello world")["input_ids"]
        assert "hello world" == tiny_tokenizer.decode(expected)
    assert (before[0] + 1, before[1] + 1) == (_errors("tokenize.wrapper"), _errors("detokenize.wrapper"))


def test_forward_hook_fault(capture_spans: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing forward-span extractor: the module output is unchanged."""
    import torch

    import llmtrace

    model = torch.nn.Linear(4, 2)
    x = torch.ones(1, 4)
    expected = model(x)
    with capture_spans():
        llmtrace.instrument_model(model)
        monkeypatch.setattr("llmtrace.integrations.torch.extractors.forward_inputs", _boom)
        before = _errors("torch.forward")
        assert torch.equal(expected, model(x))
    assert before + 1 == _errors("torch.forward")


@pytest.mark.parametrize(("target", "site"), [
    ("llmtrace.integrations.transformers.extractors.generate_params", "transformers.generate.begin"),
    ("llmtrace.integrations.transformers.extractors.sequence_outcomes", "transformers.generate.finish"),
])
def test_generate_fault(target: str, site: str, tiny_model: Any, tiny_tokenizer: Any, capture_spans: Any,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """generate(): the same tokens whether or not the wrapper's helpers fail."""
    import torch

    enc = tiny_tokenizer("hello world", return_tensors="pt")
    with capture_spans():
        expected = tiny_model.generate(**enc, max_new_tokens=4, do_sample=False)
        monkeypatch.setattr(target, _boom)
        before = _errors(site)
        assert torch.equal(expected, tiny_model.generate(**enc, max_new_tokens=4, do_sample=False))
    assert before + 1 == _errors(site)


def test_streamer_context_fault(tiny_tokenizer: Any, capture_spans: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """TextStreamer.__init__: the streamer is built even when remembering the context fails."""
    from transformers import TextIteratorStreamer

    with capture_spans(), trace.get_tracer("t").start_as_current_span("work"):
        monkeypatch.setattr("llmtrace.integrations.transformers.generate.contextvars.copy_context", _boom)
        before = _errors("transformers.streamer")
        streamer = TextIteratorStreamer(tiny_tokenizer)
    assert streamer.tokenizer is tiny_tokenizer
    assert before + 1 == _errors("transformers.streamer")


def test_asgi_fault(tiny_model: Any, tiny_tokenizer: Any, capture_spans: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """ASGI middleware: the streamed response is delivered whole when the first-byte extractor raises."""
    import httpx

    from tests.helpers import apps, servers

    body = {"prompt": "hello", "max_tokens": 3}
    with capture_spans(), servers.uvicorn_server(apps.build_app(tiny_tokenizer, tiny_model)) as url:
        expected = httpx.post(url + "/v1/stream", json=body, timeout=30)
        monkeypatch.setattr("llmtrace.integrations._asgi.is_streamed", _boom)
        before = _errors("asgi.first_byte")
        response = httpx.post(url + "/v1/stream", json=body, timeout=30)
    assert (200, expected.text) == (response.status_code, response.text)
    assert _errors("asgi.first_byte") > before  # counted for each body chunk it failed on


def test_aiohttp_fault(capture_spans: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp Application(): built normally when adding llmtrace's middleware fails."""
    with capture_spans():
        from aiohttp import web

        monkeypatch.setattr("llmtrace.integrations.aiohttp.extractors.with_middleware", _boom)
        before = _errors("aiohttp.middleware")
        app = web.Application(middlewares=[])
    assert isinstance(app, web.Application)
    assert before + 1 == _errors("aiohttp.middleware")


def test_grpc_fault(capture_spans: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """grpc.server(): created and serving when adding llmtrace's interceptor fails."""
    from concurrent import futures

    with capture_spans():
        import grpc

        monkeypatch.setattr("llmtrace.integrations.grpc.extractors.with_interceptor", _boom)
        before = _errors("grpc.interceptor")
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        server.add_insecure_port("127.0.0.1:0")
        server.start()
        server.stop(None).wait(5)
    assert before + 1 == _errors("grpc.interceptor")


def test_host_exception_is_untouched_by_a_failing_wrapper(tiny_tokenizer: Any, capture_spans: Any,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The host's own exception is the one the caller sees, even when llmtrace fails on the error path
    (the tokenize span of the failed call cannot be made: counted and logged, not raised)."""
    raw = tiny_tokenizer.backend_tokenizer
    with pytest.raises(TypeError) as untraced:
        raw.encode(12345)
    with capture_spans(), trace.get_tracer("t").start_as_current_span("work"):
        monkeypatch.setattr("llmtrace.integrations._common.live_span", _boom)
        before = _errors("tokenize.wrapper")
        with caplog.at_level(logging.WARNING, logger="llmtrace"), pytest.raises(TypeError) as traced:
            raw.encode(12345)
    assert str(untraced.value) == str(traced.value)
    assert before + 1 == _errors("tokenize.wrapper")
    _assert_logged_once_per_process(caplog, "tokenize.wrapper", before)
