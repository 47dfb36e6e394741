"""The reference server speaks the OpenAI API: the official ``openai`` SDK (sync and async) as the
client, against the real server process over loopback, streamed and not, both endpoints; bad input
gets a 400 naming the field and the server serves the next request; a request that raises fails
alone.

One server process serves the module (tests/server/openai_server.py): the real front end and
engine, with two faults injected at clean seams for the isolation tests (a tokenizer wrapper in
the front end, ``EngineConfig.fail_on_token_id`` in the engine).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmtrace import semconv
from llmtrace.analysis.model import StatusCode
from llmtrace.analysis.sources import load_spans
from llmtrace.server.app import MODEL_NAME
from tests.helpers.server_process import ServerProcess
from tests.server.openai_server import ENGINE_FAULT_TOKEN, FRONT_END_FAULT

pytestmark = pytest.mark.torch

SERVER = Path(__file__).with_name("openai_server.py")
#: Only the fault-injected requests ask for this many tokens: their spans are found by it.
FAULT_MAX_TOKENS = 7


class Served:
    def __init__(self, server: ServerProcess, traces: Path) -> None:
        self.server = server
        self.traces = traces
        self.client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)

    def async_client(self) -> openai.AsyncOpenAI:
        """A new one per event loop (``async with`` it): its connections belong to that loop."""
        return openai.AsyncOpenAI(base_url=self.server.base_url + "/v1", api_key="unused", max_retries=0)

    def still_serves(self) -> None:
        """A plain request right after: the server is up and the engine was never restarted."""
        assert "length" == self.client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2,
                                                          temperature=0).choices[0].finish_reason
        health = self.server.health()
        assert ("ok", 0) == (health["status"], health["engine"]["restarts"])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    out = tmp_path_factory.mktemp("openai")
    with ServerProcess([str(SERVER), "{port}", str(out / "traces.jsonl")], log=out / "server.log") as server:
        served = Served(server, out / "traces.jsonl")
        with served.client:  # its pooled connections closed, not left to the garbage collector
            yield served


# ----------------------------------------------------------------------------- the wire format
def test_a_completion_has_openais_shape(served: Served) -> None:
    """Not streamed: a text_completion with one choice and usage that adds up."""
    completion = served.client.completions.create(model=MODEL_NAME, prompt="The scheduler", max_tokens=5,
                                                  temperature=0)
    assert "text_completion" == completion.object
    assert completion.id.startswith("cmpl-") and completion.created > 0 and MODEL_NAME == completion.model
    assert 1 == len(completion.choices) and completion.choices[0].finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # The prefix cache's hit: a prompt shorter than one KV block has nothing cached.
    assert usage.prompt_tokens_details is not None and 0 == usage.prompt_tokens_details.cached_tokens


def test_a_streamed_chat_sends_role_then_content_then_finish_then_usage(served: Served) -> None:
    """chat.completion.chunk with a delta: the assistant's role first, content, an empty delta with the
    finish reason, then (include_usage) a chunk with no choices and the usage; id/created/model on all."""
    stream = served.client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=4, temperature=0, stream=True,
                                                   stream_options={"include_usage": True})
    chunks = list(stream)
    assert {"chat.completion.chunk"} == {c.object for c in chunks}
    assert 1 == len({(c.id, c.created, c.model) for c in chunks}) and chunks[0].id.startswith("chatcmpl-")
    assert "assistant" == chunks[0].choices[0].delta.role
    content = chunks[1:-2]
    assert all(c.choices[0].delta.content is not None and c.choices[0].finish_reason is None for c in content)
    finish = chunks[-2].choices[0]
    assert finish.finish_reason in ("stop", "length") and finish.delta.content is None
    assert [] == chunks[-1].choices and chunks[-1].usage is not None
    assert len(content) <= chunks[-1].usage.completion_tokens <= 4
    assert all(c.usage is None for c in chunks[:-1])


def test_a_streamed_completion_has_text_chunks(served: Served) -> None:
    """text_completion chunks with text, the last one with the finish reason; no usage unless asked."""
    chunks = list(served.client.completions.create(model=MODEL_NAME, prompt="hello", max_tokens=4, temperature=0,
                                                   stream=True))
    assert {"text_completion"} == {c.object for c in chunks}
    assert "length" == chunks[-1].choices[0].finish_reason or "stop" == chunks[-1].choices[0].finish_reason
    assert all(c.usage is None for c in chunks)


def test_a_chat_completion_and_the_stream_of_it_say_the_same(served: Served) -> None:
    """Greedy decoding: the streamed deltas join into the non-streamed message."""
    messages: Any = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [
        {"type": "text", "text": "tell me about batches"}]}]
    whole = served.client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=6, temperature=0)
    streamed = served.client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=6,
                                                     temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert "assistant" == whole.choices[0].message.role
    assert whole.choices[0].message.content == text


def test_the_async_client_streams_and_collects_both_endpoints_at_once(served: Served) -> None:
    """AsyncOpenAI, four concurrent calls (completions and chat, streamed and not) all succeed."""
    async def stream_text(create: Any, **kwargs: Any) -> str:
        pieces = []
        async for chunk in await create(stream=True, **kwargs):
            if chunk.choices:
                pieces.append(getattr(chunk.choices[0], "text", None) or
                              getattr(getattr(chunk.choices[0], "delta", None), "content", None) or "")
        return "".join(pieces)

    async def run() -> list[Any]:
        chat: dict[str, Any] = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}],
                                "max_tokens": 5, "temperature": 0}
        text: dict[str, Any] = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 5, "temperature": 0}
        async with served.async_client() as client:
            return list(await asyncio.gather(client.chat.completions.create(**chat), client.completions.create(**text),
                                        stream_text(client.chat.completions.create, **chat),
                                        stream_text(client.completions.create, **text)))

    chat, completion, chat_stream, completion_stream = asyncio.run(run())
    assert chat.choices[0].message.content == chat_stream
    assert completion.choices[0].text == completion_stream


def test_stop_cuts_the_text_before_the_stop_sequence(served: Served) -> None:
    """A stop sequence taken from the greedy answer ends it there, streamed and not, finish_reason stop."""
    full = served.client.completions.create(model=MODEL_NAME, prompt="the quick", max_tokens=12, temperature=0)
    text = full.choices[0].text
    assert len(text) >= 4, f"the greedy answer is too short to cut: {text!r}"
    stop = text[len(text) // 2:len(text) // 2 + 2]
    cut = served.client.completions.create(model=MODEL_NAME, prompt="the quick", max_tokens=12, temperature=0,
                                           stop=[stop, "\u2603never"])
    assert (text[:text.index(stop)], "stop") == (cut.choices[0].text, cut.choices[0].finish_reason)
    chunks = list(served.client.completions.create(model=MODEL_NAME, prompt="the quick", max_tokens=12,
                                                   temperature=0, stop=stop, stream=True))
    assert text[:text.index(stop)] == "".join(c.choices[0].text for c in chunks)
    assert "stop" == chunks[-1].choices[0].finish_reason


def test_the_same_seed_samples_the_same_tokens(served: Served) -> None:
    """Temperature 1 with a seed is repeatable; different seeds give different answers."""
    def sample(seed: int) -> str:
        return served.client.completions.create(model=MODEL_NAME, prompt="hello", max_tokens=12, temperature=1.0,
                                                seed=seed).choices[0].text

    assert sample(42) == sample(42)
    assert len({sample(seed) for seed in range(4)}) > 1


def test_n_above_one_is_refused(served: Served) -> None:
    """One choice per request: n=2 is a 400 naming n; n=1 is served."""
    with pytest.raises(openai.BadRequestError) as refused:
        served.client.completions.create(model=MODEL_NAME, prompt="hi", n=2)
    assert ("n", "unsupported_value") == (refused.value.body["param"], refused.value.body["code"])
    assert 1 == len(served.client.completions.create(model=MODEL_NAME, prompt="hi", n=1, max_tokens=2).choices)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("fields", "param", "code"), [
    ({"temperature": "hot"}, "temperature", "invalid_type"),
    ({"temperature": -3}, "temperature", "decimal_below_min_value"),
    ({"temperature": True}, "temperature", "invalid_type"),
    ({"top_p": 7}, "top_p", "decimal_above_max_value"),
    ({"max_tokens": -1}, "max_tokens", "integer_below_min_value"),
    ({"max_tokens": 2.5}, "max_tokens", "invalid_type"),
    ({"max_tokens": 100000}, "prompt", "context_length_exceeded"),
    ({"prompt": "token " * 600}, "prompt", "context_length_exceeded"),
    ({"prompt": [100000]}, "prompt", "invalid_value"),
    ({"prompt": ""}, "prompt", "empty_array"),
    ({"seed": 2**70}, "seed", "integer_above_max_value"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "array_above_max_length"),
    ({"stop": 5}, "stop", "invalid_type"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
    ({"logprobs": 2}, "logprobs", "unsupported_value"),
    ({"presence_penalty": 3}, "presence_penalty", "decimal_above_max_value"),
])
def test_a_bad_completion_field_is_a_400_naming_it(served: Served, fields: dict[str, Any], param: str,
                                                   code: str) -> None:
    """The SDK sends what it is given; the server answers 400 with OpenAI's error body, then serves on."""
    with pytest.raises(openai.BadRequestError) as refused:
        served.client.completions.create(**{"model": MODEL_NAME, "prompt": "hi", **fields})
    error = refused.value.body
    assert isinstance(error, dict) and "invalid_request_error" == error["type"]
    assert (param, code) == (error["param"], error["code"])
    assert param in error["message"] or "context length" in error["message"]
    served.still_serves()


@pytest.mark.parametrize(("fields", "param"), [
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content.type"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
])
def test_a_bad_chat_field_is_a_400_naming_it(served: Served, fields: dict[str, Any], param: str) -> None:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], **fields}
    response = httpx.post(served.server.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert (400, param) == (response.status_code, response.json()["error"]["param"])
    served.still_serves()


@pytest.mark.parametrize(("content", "status"), [
    (b"not json", 400), (b'{"prompt": "hi",', 400), (b"[1, 2]", 400), (b"\xff\xfe{", 400),
    (b"[" * 100_000, 400), (b'{"prompt": "' + b"x" * (2 << 20) + b'"}', 413),
])
def test_a_body_that_is_not_a_json_object_is_refused(served: Served, content: bytes, status: int) -> None:
    response = httpx.post(served.server.base_url + "/v1/completions", content=content,
                          headers={"content-type": "application/json"}, timeout=30)
    assert status == response.status_code
    assert {"message", "type", "param", "code"} == set(response.json()["error"])
    served.still_serves()


# ----------------------------------------------------------------------------- failure isolation
async def _stream_alongside(served: Served, prompt: Any) -> tuple[BaseException | None, list[str]]:
    """Three healthy streams and one call with *prompt* at the same time."""
    async with served.async_client() as client:
        async def healthy() -> str:
            stream = await client.completions.create(model=MODEL_NAME, prompt="a long answer", max_tokens=30,
                                                     temperature=0, stream=True)
            return [c async for c in stream][-1].choices[0].finish_reason or ""

        failing = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=FAULT_MAX_TOKENS)
        results = await asyncio.gather(failing, *(healthy() for _ in range(3)), return_exceptions=True)
    error = results[0] if isinstance(results[0], BaseException) else None
    return error, [str(r) for r in results[1:]]


@pytest.mark.parametrize("where", ["front end", "engine"])
def test_an_exception_while_serving_fails_that_request_alone(served: Served, where: str) -> None:
    """A request whose handling raises (in the front end, or in the engine's forward pass) gets a 500;
    the streams next to it finish normally and the engine is not restarted."""
    prompt: Any = FRONT_END_FAULT if where == "front end" else [ENGINE_FAULT_TOKEN, 11, 12]
    error, others = asyncio.run(_stream_alongside(served, prompt))
    assert isinstance(error, openai.InternalServerError), error
    assert all(reason in ("stop", "length") for reason in others), others
    served.still_serves()


def test_health_reports_the_engine(served: Served) -> None:
    health = served.server.health()
    assert "ready" == health["engine"]["state"] and health["engine"]["pid"] > 0


def test_zz_failed_requests_end_their_spans_as_errors(served: Served) -> None:
    """(Runs last: stops the server to flush its spans.) The two fault-injected requests' llm.request
    spans are ERROR with finish reason error; every other finished request's span is not."""
    assert served.server.stop() in (0, -15)  # uvicorn re-raises the SIGTERM after its graceful shutdown
    requests = [s for s in load_spans(str(served.traces)).spans if s.name == semconv.SPAN_REQUEST]
    faulted = [s for s in requests if s.attr(semconv.GEN_AI_REQUEST_MAX_TOKENS) == FAULT_MAX_TOKENS]
    assert [(StatusCode.ERROR, "error")] * 2 == [(s.status, s.attr(semconv.LLM_REQUEST_FINISH_REASON))
                                                 for s in faulted]
    served_ok = [s for s in requests if s.attr(semconv.LLM_REQUEST_FINISH_REASON) in ("stop", "length")]
    assert served_ok and all(StatusCode.ERROR != s.status for s in served_ok)
