"""`transformers serve` — Hugging Face's own OpenAI-compatible server, as someone would run it,
with and without `--continuous-batching` — under llmtrace with no code change: a random-weight
Llama saved to a local directory with the locally trained tokenizer, real uvicorn on loopback,
a real client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from llmtrace import semconv
from llmtrace.testing import CapturedTelemetry
from tests.helpers.waits import wait_for_spans

pytestmark = pytest.mark.torch


@pytest.fixture(params=[True, False], ids=["continuous-batching", "generate"])
def served(request: pytest.FixtureRequest, capture_spans: Any, tiny_tokenizer: Any, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, CapturedTelemetry]]:
    import httpx
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.helpers import servers

    with capture_spans(engine_window_steps=16) as captured:
        from transformers.cli.serve import Serve

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=512, eos_token_id=tiny_tokenizer.eos_token_id,
                             pad_token_id=tiny_tokenizer.pad_token_id, bos_token_id=tiny_tokenizer.bos_token_id)
        model_dir = str(tmp_path / "tiny-llama")
        LlamaForCausalLM(config).save_pretrained(model_dir)
        tiny_tokenizer.save_pretrained(model_dir)
        # Serve(non_blocking=True) runs uvicorn on an event loop its thread never closes (their
        # code); keep hold of it to close it here, or it is reported unclosed in a later test.
        loops: list[asyncio.AbstractEventLoop] = []
        new_event_loop = asyncio.new_event_loop
        def kept_event_loop() -> asyncio.AbstractEventLoop:
            loops.append(new_event_loop())
            return loops[-1]

        monkeypatch.setattr(asyncio, "new_event_loop", kept_event_loop)
        port = servers.free_port()
        cb_options: dict[str, Any] = {"cb_block_size": 16, "cb_num_blocks": 32} if request.param else {}
        server = Serve(force_model=model_dir, continuous_batching=request.param, device="cpu", host="127.0.0.1",
                       port=port, non_blocking=True, **cb_options)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("transformers serve did not come up")
            time.sleep(0.1)
        try:
            yield url, model_dir, captured
        finally:
            server.kill_server()
            thread = getattr(server, "_thread", None)
            if thread is not None:
                thread.join(30)
            for loop in loops:
                loop.close()




def _is_request(span: Any) -> bool:
    return bool(span.name == semconv.SPAN_REQUEST)


def test_completions_are_traced_from_the_server_span_down(served: tuple[str, str, CapturedTelemetry]) -> None:
    """A plain and a streamed /v1/completions: each llm.request is its SERVER span's child, in the
    caller's trace, with the response's token counts and its prompt encode as llm.tokenize. With
    continuous batching the request is also the engine's — llm.request.id is the response's id, it
    queues, and the engine's steps list it; without, generate() runs on the server's inference
    thread, and the request still joins the call's trace."""
    import httpx

    url, model_dir, captured = served
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    with httpx.Client(timeout=120) as client:
        body = client.post(url + "/v1/completions", headers=headers,
                           json={"model": model_dir, "prompt": "hello world", "max_tokens": 8}).json()
        with client.stream("POST", url + "/v1/completions", headers=headers,
                           json={"model": model_dir, "prompt": "hello there", "max_tokens": 6, "stream": True}) as r:
            assert 200 == r.status_code
            chunks = [line for line in r.iter_lines() if line.startswith("data:")]
    assert chunks
    requests = wait_for_spans(captured, _is_request, 2)
    servers_by_id = {s.context.span_id: s for s in wait_for_spans(
        captured, lambda s: s.kind == trace.SpanKind.SERVER and s.name.endswith("/v1/completions"), 2)}
    assert 2 == len(requests)
    assert body["usage"]["completion_tokens"] == 8
    assert [6, 8] == sorted(r.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] for r in requests)
    for request in requests:
        assert request.parent.span_id in servers_by_id
        assert int(trace_id, 16) == request.context.trace_id
        names = {s.name for s in captured.children(request)}
        assert {semconv.SPAN_TOKENIZE, semconv.SPAN_PREFILL, semconv.SPAN_DECODE} <= names
    steps = {s.attributes[semconv.LLM_STEP_ID]: s for s in captured.spans if s.name == semconv.SPAN_STEP}
    if not steps:  # generate(): no engine loop
        assert all(semconv.LLM_STEP_FIRST_ID not in r.attributes for r in requests)
        return
    by_id = {r.attributes[semconv.LLM_REQUEST_ID]: r for r in requests}
    assert body["usage"]["prompt_tokens"] == by_id[body["id"]].attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS]
    for request in requests:
        assert semconv.SPAN_QUEUE in {s.name for s in captured.children(request)}
        first = steps[request.attributes[semconv.LLM_STEP_FIRST_ID]]
        assert request.attributes[semconv.LLM_REQUEST_ID] in first.attributes[semconv.LLM_BATCH_REQUEST_IDS]
        assert str(first.attributes[semconv.LLM_ENGINE_ID]).startswith("hf-cb")


def test_a_client_leaving_mid_stream_ends_the_request_as_abort(served: tuple[str, str, CapturedTelemetry]) -> None:
    """The client reads one chunk of a 300-token stream and disconnects: llm.request ends as abort."""
    import httpx

    url, model_dir, captured = served
    with httpx.Client(timeout=120) as client, client.stream(
            "POST", url + "/v1/completions",
            json={"model": model_dir, "prompt": "tell me more", "max_tokens": 300, "stream": True}) as response:
        next(response.iter_lines())
    [request] = wait_for_spans(captured, _is_request, 1)
    assert semconv.FINISH_ABORT == request.attributes[semconv.LLM_REQUEST_FINISH_REASON]
    assert request.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] < 300
