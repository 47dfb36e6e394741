"""The reference server's API front end: OpenAI-compatible completions on FastAPI.

The front end checks the request (:mod:`~llmtrace.server.protocol`), tokenizes, opens the
request's ``llm.request`` span (a child of the HTTP SERVER span), sends the request with its
W3C carrier to the engine process, and returns the answer whole or as Server-Sent Events in
OpenAI's shapes (:mod:`~llmtrace.server.wire`). A client that disconnects ends its request as
``abort`` and frees its engine slot.

Every failure is one request's: a bad request is a 400 (413 for a body over
``MAX_BODY_BYTES``) with OpenAI's error body naming the field; an exception while serving a
request is a 500 for it (its span ERROR); an engine that is restarting is a 503. Nothing a
client sends reaches the engine unchecked.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any

from starlette.requests import Request  # module level: FastAPI resolves handler annotations here

from llmtrace.lifecycle.clock import monotonic_ns
from llmtrace.server.client import EngineClient, EngineUnavailable, RestartPolicy
from llmtrace.server.engine import EngineConfig
from llmtrace.server.protocol import (
    DEFAULT_MAX_TOKENS,
    CompletionRequest,
    InvalidRequest,
    context_length_exceeded,
    error_body,
    parse_chat,
    parse_completion,
)
from llmtrace.server.wire import DONE, ResponseWriter, StopText, sse

log = logging.getLogger("llmtrace.server")

MODEL_NAME = "llmtrace-tiny-gpt2"
#: Where the locally trained tokenizer is cached between runs.
TOKENIZER_CACHE = os.path.join(os.environ.get("LLMTRACE_CACHE", os.path.expanduser("~/.cache/llmtrace")), "tiny")
#: The largest request body read: a prompt that fits the context is far smaller, and a body is
#: held in memory whole before it is parsed.
MAX_BODY_BYTES = 1 << 20
#: Seconds a client is told to wait before retrying while the engine restarts.
RETRY_AFTER_S = 2
_RETRY_AFTER = {"retry-after": str(RETRY_AFTER_S)}
_NOT_JSON = ("We could not parse the JSON body of your request. The API expects a JSON payload (an object), "
             "but what was sent was not valid JSON.")


class EngineFailure(Exception):
    """The engine ended this request with an error (HTTP *status*: 500, or 503 when the engine died)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status == 400 else "server_error"
        return error_body(str(self), kind, code="engine_unavailable" if self.status == 503 else None)


def _instrument_options() -> dict[str, Any] | None:
    """The API server's llmtrace settings, for the engine process (None when not instrumented)."""
    from llmtrace._instrument import current

    handle = current()
    if handle is None:
        return None
    return {f.name: getattr(handle.settings, f.name) for f in dataclasses.fields(handle.settings)}


def _flush_telemetry() -> None:
    from llmtrace._instrument import current, flush

    if current() is not None:
        flush(timeout_s=10.0)


class Generation:
    """One request's output as text: detokenized, cut at a stop sequence, its ``llm.request`` ended."""

    def __init__(self, handle: Any, outputs: Any, client: EngineClient, tokenizer: Any, request_id: str,
                 stop: StopText) -> None:
        self.handle, self.outputs, self.client, self.tokenizer = handle, outputs, client, tokenizer
        self.request_id = request_id
        self.stop = stop
        self.finish_reason: str | None = None
        self.completion_tokens = 0
        #: Prompt tokens the engine's prefix cache served (None until it reports).
        self.cached_tokens: int | None = None

    async def pieces(self) -> AsyncGenerator[str, None]:
        """Text as the engine produces tokens; raises :class:`EngineFailure` if the engine fails it."""
        ended = False
        try:
            while True:
                message = await self.outputs.get()
                if message[0] == "token":
                    text = self._token(message[2])
                    if text:
                        yield text
                    continue
                ended = True
                _, _, reason, summary = message
                if reason == "error" and self.finish_reason is None:
                    error = EngineFailure(summary.get("error", "engine error"), summary.get("status", 500))
                    self.handle.aborted(error)
                    raise error
                if reason != "error":
                    self.handle.engine_summary(summary)
                    self.cached_tokens = summary.get("cached_tokens")
                if self.finish_reason is None:
                    self.finish_reason = reason
                    if tail := self.stop.flush():
                        yield tail
                self.handle.finished(self.finish_reason, output_tokens=self.completion_tokens)
                return
        finally:
            self.client.release(self.request_id, abort=not ended)
            if not ended:
                self.handle.aborted(reason="abort")

    def _token(self, token_id: int) -> str:
        if self.finish_reason is not None:
            return ""  # tokens of the step that was running when a stop sequence ended the request
        self.handle.token()
        self.completion_tokens += 1
        # incremental: timed by the tokenizer integration; the end-of-text token is no text
        text, stopped = self.stop.feed(self.tokenizer.decode([token_id], skip_special_tokens=True))
        if stopped:
            self.finish_reason = "stop"
            self.client.finish(self.request_id, "stop")  # the engine frees it and sends its timings
        return text


class CompletionService:
    """Tokenize, open the request, hand it to the engine, stream or collect the answer."""

    def __init__(self, tokenizer: Any, client: EngineClient, context_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.client = client
        #: The longest prompt + completion the engine can hold (its context and its KV budget).
        self.context_tokens = context_tokens

    async def run(self, request: CompletionRequest) -> Any:
        from fastapi.responses import JSONResponse, StreamingResponse

        import llmtrace

        sampling = request.sampling
        request_id = f"{'chatcmpl' if request.chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        handle = llmtrace.start_request(request_id, model=request.model or MODEL_NAME,
                                        max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                                        top_p=sampling.top_p, stream=sampling.stream,
                                        operation="chat" if request.chat else "text_completion",
                                        prompt=request.prompt.text)
        try:
            prompt_ids = self._prompt_ids(handle, request)
            outputs = self.client.submit({
                "request_id": request_id, "prompt_ids": prompt_ids, "max_tokens": self._max_tokens(request, prompt_ids),
                "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed,
                "carrier": handle.carrier()})
        except BaseException as exc:
            handle.aborted(exc)
            raise
        handle.handed_to_engine()
        generation = Generation(handle, outputs, self.client, self.tokenizer, request_id, StopText(sampling.stop))
        writer = ResponseWriter(request_id, MODEL_NAME, request.chat, sampling.include_usage)
        if sampling.stream:
            return StreamingResponse(_stream(writer, generation, len(prompt_ids)), media_type="text/event-stream")
        async with aclosing(generation.pieces()) as pieces:
            text = "".join([piece async for piece in pieces])
        return JSONResponse(writer.body(text, generation.finish_reason or "stop", len(prompt_ids),
                                        generation.completion_tokens, generation.cached_tokens))

    def _prompt_ids(self, handle: Any, request: CompletionRequest) -> list[int]:
        if request.prompt.token_ids is not None:
            vocab = len(self.tokenizer)
            if bad := [t for t in request.prompt.token_ids if not 0 <= t < vocab]:
                raise InvalidRequest(f"Invalid 'prompt': token id {bad[0]} is outside this model's vocabulary "
                                     f"[0, {vocab}).", "prompt", "invalid_value")
            return list(request.prompt.token_ids)
        with handle.activate():  # the tokenizer integration records the encode on this request
            start = monotonic_ns()
            prompt_ids: list[int] = self.tokenizer.encode(request.prompt.text)
            if not handle.tokenize:  # the tokenizers integration is off: record it ourselves
                handle.tokenized(len(prompt_ids), start, monotonic_ns())
        if not prompt_ids:
            raise InvalidRequest(f"Invalid '{request.prompt_param}': it encodes to no tokens.", request.prompt_param,
                                 "invalid_value")
        return prompt_ids

    def _max_tokens(self, request: CompletionRequest, prompt_ids: list[int]) -> int:
        """The client's max_tokens, or the default clipped to the context; raises when it does not fit."""
        wanted = request.sampling.max_tokens
        if wanted is None:
            wanted = min(DEFAULT_MAX_TOKENS, max(1, self.context_tokens - len(prompt_ids)))
        if len(prompt_ids) + wanted > self.context_tokens:
            raise context_length_exceeded(request, len(prompt_ids), wanted, self.context_tokens)
        return wanted


async def _stream(writer: ResponseWriter, generation: Generation, prompt_tokens: int) -> AsyncIterator[bytes]:
    """The SSE body: OpenAI's chunks, an error event if the request fails once started, ``[DONE]``."""
    first = writer.first_chunk()
    if first is not None:
        yield sse(first)
    try:
        async with aclosing(generation.pieces()) as pieces:
            async for text in pieces:
                yield sse(writer.text_chunk(text))
        yield sse(writer.finish_chunk(generation.finish_reason or "stop"))
        if writer.include_usage:
            yield sse(writer.usage_chunk(prompt_tokens, generation.completion_tokens, generation.cached_tokens))
    except EngineFailure as exc:
        yield sse(exc.body())
    except Exception:
        log.exception("llmtrace reference server: streaming %s failed", writer.id)
        yield sse(_internal_error())
    yield DONE


def _internal_error() -> dict[str, Any]:
    return error_body("The server had an error while processing your request.", "server_error")


def _json_response(status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse(dict(body), status_code=status, headers=dict(headers or {}))


async def _json_body(request: Request) -> Mapping[str, Any]:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise InvalidRequest(f"The request body is {declared} bytes; this server reads at most {MAX_BODY_BYTES}.",
                             None, "request_too_large", status=413)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise InvalidRequest(f"The request body is over {MAX_BODY_BYTES} bytes, the most this server reads.",
                                 None, "request_too_large", status=413)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, a number too long, nesting too deep
        raise InvalidRequest(_NOT_JSON) from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object, not {type(body).__name__}.", None,
                             "invalid_type")
    return body


async def _answer(request: Request, service: CompletionService,
                  parse: Callable[[Mapping[str, Any]], CompletionRequest]) -> Any:
    """One API call: every failure becomes this request's own error response."""
    try:
        return await service.run(parse(await _json_body(request)))
    except InvalidRequest as exc:
        return _json_response(exc.status, exc.body())
    except EngineUnavailable as exc:
        return _json_response(503, error_body(f"The engine is unavailable: {exc}. Retry shortly.", "server_error",
                                              code="engine_unavailable"), _RETRY_AFTER)
    except EngineFailure as exc:  # 503 when its engine died: it restarts, and so may the request
        return _json_response(exc.status, exc.body(), _RETRY_AFTER if exc.status == 503 else None)
    except Exception:
        log.exception("llmtrace reference server: %s %s failed", request.method, request.url.path)
        return _json_response(500, _internal_error())


def create_app(engine_overrides: dict[str, Any] | None = None, restart_policy: RestartPolicy | None = None) -> Any:
    """Build the FastAPI app; the engine process starts with the app and stops with it, and is
    restarted under *restart_policy* (default :class:`RestartPolicy`) when it dies."""
    from fastapi import FastAPI
    from starlette.exceptions import HTTPException

    from llmtrace.server.tiny_model import train_tokenizer

    tokenizer = train_tokenizer(cache_dir=TOKENIZER_CACHE)
    config = EngineConfig(vocab_size=len(tokenizer), eos_token_id=int(tokenizer.eos_token_id),
                          instrument_options=_instrument_options(), **(engine_overrides or {}))
    client = EngineClient(config, restart_policy)
    service = CompletionService(tokenizer, client, min(config.max_model_len, config.total_blocks * config.block_size))

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        import asyncio

        await asyncio.to_thread(client.start)
        yield
        await asyncio.to_thread(client.stop)
        # uvicorn re-raises the SIGTERM it shut down for, so atexit hooks never run: export now.
        await asyncio.to_thread(_flush_telemetry)

    app = FastAPI(title="llmtrace reference server", lifespan=lifespan)
    app.state.engine = client
    app.state.service = service

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Any:
        """Unknown paths and methods answer in OpenAI's error shape too."""
        return _json_response(exc.status_code, error_body(str(exc.detail), "invalid_request_error"), exc.headers)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await _answer(request, service, parse_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await _answer(request, service, parse_chat)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "created": 0,
                                            "owned_by": "llmtrace"}]}

    @app.get("/health")
    async def health() -> Any:
        """200 while the engine serves; 503 while it starts, restarts, or after the supervisor gave up."""
        engine = client.health()
        ready = engine["state"] == "ready"
        return _json_response(200 if ready else 503, {"status": "ok" if ready else engine["state"], "engine": engine})

    @app.get("/stats")
    async def stats() -> Any:
        """The engine's scheduler numbers, and llmtrace's own CPU in each process."""
        import llmtrace

        try:
            engine = await client.stats()
        except EngineUnavailable as exc:
            return _json_response(503, error_body(str(exc), "server_error", code="engine_unavailable"))
        return {**engine, "restarts": client.restarts,
                "llmtrace_cpu_s": {"api": llmtrace.overhead_cpu_s(), "engine": engine.get("llmtrace_cpu_s", {})}}

    return app
