"""The HTTP side: send one OpenAI-compatible request, read its answer, measure it.

Both endpoints, streamed and not, in the wire formats OpenAI documents:

* ``/v1/completions``: stream chunks carry ``choices[0].text``;
* ``/v1/chat/completions``: stream chunks are ``chat.completion.chunk`` objects whose
  ``choices[0].delta`` carries ``content`` (the first one often only the ``role``; reasoning
  models put text in ``reasoning_content``);
* a final chunk with ``usage`` and no choices when ``stream_options.include_usage`` is honoured;
  ``data: [DONE]`` ends the stream.

The first chunk that carries text is the first token (TTFT); the gaps between text chunks are
the inter-token latencies. Every latency counts from the request's *intended* send time. The
actual send (``sent``, whence ``send_lag_s`` and the span's ``llm.client.ttft_s``) is taken
right before the request is handed to aiohttp, where ``vllm bench serve`` takes its ``st``
(its body is serialised after that point, ours before); a chunk's time is taken when its line
has been read, before its JSON is parsed (vLLM's after); the answer ends when the stream is
read to ``[DONE]`` (vLLM's at its last chunk with choices, before the usage chunk).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from llmtrace.load.model import Chaos, Outcome, PlannedRequest, RequestResult
from llmtrace.load.prompts import PromptMaker
from llmtrace.load.telemetry import ClientSpans, RequestInfo

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
#: A disconnecting chaos client hangs up after this many text chunks.
DISCONNECT_AFTER_CHUNKS = 2
#: A slow reader waits this long before each read of the stream (back-pressure on the server).
SLOW_READ_PAUSE_S = 0.05
#: Longest SSE line accepted (a chunk with logprobs or a long usage block is a few KB).
MAX_LINE_BYTES = 1 << 20


@dataclass(frozen=True)
class Target:
    """Where and how requests go."""

    base_url: str
    endpoint: str = "completions"
    model: str = ""
    stream: bool = True
    timeout_s: float = 300.0
    ignore_eos: bool = False
    api_key: str | None = None

    @property
    def path(self) -> str:
        return ENDPOINTS[self.endpoint]

    @property
    def operation(self) -> str:
        return "chat" if self.endpoint == "chat" else "text_completion"

    def body(self, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "stream": stream}
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True  # vLLM / SGLang: exactly max_tokens, for comparable runs
        return body


@dataclass(frozen=True)
class Prepared:
    """A request ready to go: its body, whether it streams, its CLIENT span and the headers
    that carry it."""

    data: bytes
    stream: bool
    span: Any
    headers: dict[str, str]
    #: The span's start: the intended send time on the wall clock.
    start_ns: int


class ProtocolError(Exception):
    """A 2xx answer that an OpenAI-compatible server would not send."""


@dataclass
class _Reading:
    """What has arrived so far (kept when the read ends early)."""

    first_s: float | None = None
    last_s: float | None = None
    chunks: int = 0
    usage_prompt: int | None = None
    usage_completion: int | None = None
    response_id: str | None = None
    response_model: str | None = None
    finish_reason: str | None = None
    pool_wait_s: float = 0.0
    queued_at: float | None = None

    def text_arrived(self, now: float, gaps: list[float]) -> None:
        if self.last_s is not None:
            gaps.append(now - self.last_s)
        if self.first_s is None:
            self.first_s = now
        self.last_s = now
        self.chunks += 1

    def about(self, obj: dict[str, Any]) -> None:
        """``id``, ``model`` (the first seen) and ``finish_reason`` (the last) of a chunk or answer."""
        if self.response_id is None and isinstance(obj.get("id"), str):
            self.response_id = obj["id"]
        if self.response_model is None and isinstance(obj.get("model"), str):
            self.response_model = obj["model"]
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            reason = choices[0].get("finish_reason")
            if isinstance(reason, str):
                self.finish_reason = reason

    def usage(self, obj: dict[str, Any]) -> None:
        self.about(obj)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                self.usage_prompt = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                self.usage_completion = usage["completion_tokens"]


def _chunk_text(obj: dict[str, Any]) -> str:
    choices = obj.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    if isinstance(choice.get("text"), str):
        return str(choice["text"])
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return str(delta.get("content") or delta.get("reasoning_content") or "")
    return ""


def _final_text(obj: dict[str, Any]) -> str:
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProtocolError("the answer has no choices: not an OpenAI completion")
    choice = choices[0]
    message = choice.get("message")
    return str(choice.get("text") or (message.get("content") if isinstance(message, dict) else "") or "")


async def _queued(_: aiohttp.ClientSession, ctx: Any, __: Any) -> None:
    ctx.trace_request_ctx.queued_at = time.monotonic()


async def _dequeued(_: aiohttp.ClientSession, ctx: Any, __: Any) -> None:
    reading = ctx.trace_request_ctx
    if reading.queued_at is not None:
        reading.pool_wait_s += time.monotonic() - reading.queued_at
        reading.queued_at = None


def _pool_tracing() -> aiohttp.TraceConfig:
    """aiohttp's signals for a request waiting for a free connection of a limited pool."""
    config = aiohttp.TraceConfig()
    config.on_connection_queued_start.append(_queued)
    config.on_connection_queued_end.append(_dequeued)
    return config


class Client:
    """Sends requests for one run; one aiohttp session, one connection pool."""

    def __init__(self, target: Target, prompts: PromptMaker, spans: ClientSpans, *, max_connections: int = 0,
                 run_id: str = "", profile: str = "") -> None:
        self.target = target
        self.prompts = prompts
        self.spans = spans
        self.run_id = run_id
        self.profile = profile
        self._max_connections = max_connections
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        connector = aiohttp.TCPConnector(limit=self._max_connections, force_close=False)
        headers = {"Authorization": f"Bearer {self.target.api_key}"} if self.target.api_key else None
        # Only a limited pool can make a request wait; unlimited, no tracing signals are paid for.
        traces = [_pool_tracing()] if self._max_connections else None
        self.session = aiohttp.ClientSession(connector=connector, headers=headers, read_bufsize=1 << 16,
                                             trace_configs=traces,
                                             max_line_size=MAX_LINE_BYTES, max_field_size=MAX_LINE_BYTES,
                                             timeout=aiohttp.ClientTimeout(total=self.target.timeout_s))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()

    def prepare(self, index: int, planned: PlannedRequest, intended: float) -> Prepared:
        """Everything before the send, done ahead of it: the body (a long prompt takes a while)
        and the CLIENT span, started at the intended send time — the zero of every latency the
        report gives (``llm.load.send_lag_s`` says how much later the request went out)."""
        stream = self.target.stream or planned.chaos in (Chaos.DISCONNECT, Chaos.SLOW_READER)
        prompt = self.prompts.prompt(index, planned.input_tokens, planned.prefix_blocks)
        span, headers, start_ns = self.spans.begin(time.time_ns() + int((intended - time.monotonic()) * 1e9))
        headers["Content-Type"] = "application/json"
        return Prepared(self._payload(prompt, planned, stream), stream, span, headers, start_ns)

    async def send(self, index: int, planned: PlannedRequest, intended: float, step_label: str = "",
                   offered_qps: float | None = None, concurrency: int | None = None,
                   prepared: Prepared | None = None) -> RequestResult:
        """Send *planned* (intended at ``intended``, a ``time.monotonic()`` time, the driver's clock) and measure it."""
        assert self.session is not None, "use the client as an async context manager"
        if prepared is None:
            prepared = self.prepare(index, planned, intended)
        data, stream, headers = prepared.data, prepared.stream, prepared.headers
        reading = _Reading()
        gaps: list[float] = []
        status: int | None = None
        outcome, error = Outcome.OK, None
        sent = time.monotonic()
        try:
            async with self.session.post(self.target.base_url + self.target.path, data=data, headers=headers,
                                         trace_request_ctx=reading) as response:
                status = response.status
                if status >= 400:
                    text = (await response.text())[:200]
                    outcome, error = Outcome.HTTP_ERROR, f"HTTP {status}: {' '.join(text.split())}"
                elif stream:
                    await self._read_stream(response, reading, gaps, planned.chaos)
                else:
                    await self._read_body(response, reading)
        except ProtocolError as exc:
            outcome, error = Outcome.PROTOCOL_ERROR, str(exc)
        except TimeoutError:
            outcome, error = Outcome.TIMEOUT, f"no complete answer within {self.target.timeout_s:g}s"
        except asyncio.CancelledError:
            outcome, error = Outcome.CANCELLED, "the run ended first"
        except (aiohttp.ClientError, OSError) as exc:
            outcome, error = Outcome.CONNECTION_ERROR, f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - whatever else broke the exchange is this request's result
            outcome, error = Outcome.PROTOCOL_ERROR, f"{type(exc).__name__}: {exc}"
        ended = time.monotonic()
        if planned.chaos is not None and outcome is not Outcome.CANCELLED:
            outcome = Outcome.CHAOS  # whatever the server did, this was the chaos client's doing
        result = self._result(index, planned, intended, sent, ended, reading, gaps, outcome, error, status)
        trace_id = self.spans.end(prepared.span, self._info(planned, step_label, offered_qps, concurrency, stream),
                                  result, prepared.start_ns, prepared.start_ns + int((ended - intended) * 1e9))
        return result if trace_id is None else _with_trace(result, trace_id)

    def _payload(self, prompt: str, planned: PlannedRequest, stream: bool) -> bytes:
        if planned.chaos is Chaos.MALFORMED:
            # Truncated JSON with a wrong type before the cut: the server must answer 400, not fall over.
            return json.dumps({"model": self.target.model, "max_tokens": "many", "prompt": prompt})[:-7].encode()
        return json.dumps(self.target.body(prompt, planned.output_tokens, stream)).encode()

    async def _read_stream(self, response: aiohttp.ClientResponse, reading: _Reading, gaps: list[float],
                           chaos: Chaos | None) -> None:
        kind = response.headers.get("Content-Type", "")
        if not kind.startswith("text/event-stream"):
            raise ProtocolError(f"a stream request was answered with Content-Type {kind or 'none'!r}, "
                                "not text/event-stream (does the server support stream=true?)")
        done = False
        async for raw in response.content:
            if chaos is Chaos.SLOW_READER:
                await asyncio.sleep(SLOW_READ_PAUSE_S)
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, ": keep-alive" comments, "event:" lines
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            now = time.monotonic()
            try:
                obj = json.loads(payload)
            except ValueError:
                raise ProtocolError(f"a stream chunk is not JSON: {payload[:80]!r}") from None
            if not isinstance(obj, dict):
                raise ProtocolError(f"a stream chunk is not a JSON object: {payload[:80]!r}")
            if "error" in obj and "choices" not in obj:
                raise ProtocolError(f"the stream carried an error: {str(obj['error'])[:160]}")
            reading.usage(obj)
            if _chunk_text(obj):
                reading.text_arrived(now, gaps)
                if chaos is Chaos.DISCONNECT and reading.chunks >= DISCONNECT_AFTER_CHUNKS:
                    response.close()  # hang up mid-stream
                    return
        if not done and reading.chunks == 0:
            raise ProtocolError("the stream ended without data: [DONE] and without any text")

    async def _read_body(self, response: aiohttp.ClientResponse, reading: _Reading) -> None:
        raw = await response.read()
        try:
            obj = json.loads(raw)
        except ValueError:
            raise ProtocolError(f"the answer is not JSON: {raw[:80]!r}") from None
        if not isinstance(obj, dict):
            raise ProtocolError("the answer is not a JSON object: not an OpenAI completion")
        text = _final_text(obj)
        reading.usage(obj)
        now = time.monotonic()
        reading.first_s = reading.last_s = now
        reading.chunks = 1 if text else 0

    def _result(self, index: int, planned: PlannedRequest, intended: float, sent: float, ended: float,
                reading: _Reading, gaps: list[float], outcome: Outcome, error: str | None,
                status: int | None) -> RequestResult:
        output = reading.usage_completion if reading.usage_completion is not None else reading.chunks
        streamed = self.target.stream or planned.chaos is not None
        ttft = reading.first_s - intended if streamed and reading.first_s is not None else None
        tpot = None
        if streamed and reading.first_s is not None and reading.last_s is not None and output > 1:
            tpot = (reading.last_s - reading.first_s) / (output - 1)
        return RequestResult(
            index=index, step=planned.step, scheduled_s=planned.at_s, send_lag_s=sent - intended, outcome=outcome,
            input_tokens=planned.input_tokens, output_tokens=output, prompt_tokens=reading.usage_prompt,
            ttft_s=ttft, e2e_s=ended - intended, tpot_s=tpot, itl_s=tuple(gaps), status=status, error=error,
            chaos=planned.chaos, response_id=reading.response_id, response_model=reading.response_model,
            finish_reason=reading.finish_reason, pool_wait_s=reading.pool_wait_s)

    def _info(self, planned: PlannedRequest, step_label: str, offered_qps: float | None, concurrency: int | None,
              stream: bool) -> RequestInfo:
        return RequestInfo(url=self.target.base_url, path=self.target.path, operation=self.target.operation,
                           model=self.target.model or "unknown", max_tokens=planned.output_tokens, stream=stream,
                           profile=self.profile, step_label=step_label, run_id=self.run_id,
                           offered_qps=offered_qps, concurrency=concurrency)


def _with_trace(result: RequestResult, trace_id: str) -> RequestResult:
    from dataclasses import replace

    return replace(result, trace_id=trace_id)


async def probe(session: aiohttp.ClientSession, target: Target, prompt: str) -> dict[str, Any]:
    """One small non-streamed request; the parsed answer, or a :class:`ProtocolError` /
    aiohttp error that says why the server is not usable."""
    async with session.post(target.base_url + target.path, json=target.body(prompt, 1, False)) as response:
        raw = await response.read()
        if response.status == 404:
            raise ProtocolError(f"{target.base_url}{target.path} answered 404: not an OpenAI-compatible "
                                f"server (or try --endpoint {'completions' if target.endpoint == 'chat' else 'chat'})")
        if response.status >= 400:
            raise ProtocolError(f"{target.base_url}{target.path} answered HTTP {response.status}: "
                                f"{' '.join(raw[:200].decode('utf-8', 'replace').split())}")
        try:
            obj = json.loads(raw)
        except ValueError:
            raise ProtocolError(f"{target.base_url}{target.path} answered with something that is not JSON: "
                                f"{raw[:60]!r} (not an OpenAI-compatible server)") from None
        if not isinstance(obj, dict):
            raise ProtocolError(f"{target.base_url}{target.path} did not answer with a JSON object")
        _final_text(obj)
        return obj


async def probe_stream(session: aiohttp.ClientSession, target: Target, prompt: str) -> None:
    """One small streamed request: a :class:`ProtocolError` when the answer is not SSE."""
    async with session.post(target.base_url + target.path, json=target.body(prompt, 2, True)) as response:
        kind = response.headers.get("Content-Type", "")
        if response.status < 400 and not kind.startswith("text/event-stream"):
            raise ProtocolError(f"{target.base_url}{target.path} answered a stream=true request with Content-Type "
                                f"{kind or 'none'!r}, not text/event-stream (use --no-stream for this server)")
        await response.read()
