"""The reference server's API front end: OpenAI-compatible completions on FastAPI.

The front end tokenizes, opens the request's ``llm.request`` span (a child of
the HTTP SERVER span), sends the request with its W3C carrier to the engine
process, and streams tokens back as Server-Sent Events. A client that
disconnects ends its request as ``abort`` and frees its engine slot.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.requests import Request  # module level: FastAPI resolves handler annotations here

from llmtrace.lifecycle.clock import monotonic_ns
from llmtrace.server.client import EngineClient
from llmtrace.server.engine import EngineConfig

MODEL_NAME = "llmtrace-tiny-gpt2"
#: Where the locally trained tokenizer is cached between runs.
TOKENIZER_CACHE = os.path.join(os.environ.get("LLMTRACE_CACHE", os.path.expanduser("~/.cache/llmtrace")), "tiny")


def _instrument_options() -> dict[str, Any] | None:
    """The API server's llmtrace settings, for the engine process (None when not instrumented)."""
    from llmtrace._instrument import current

    handle = current()
    if handle is None:
        return None
    return {f.name: getattr(handle.settings, f.name) for f in dataclasses.fields(handle.settings)}


def _chat_prompt(messages: list[dict[str, Any]]) -> str:
    return "".join(f"{m.get('role', 'user')}: {m.get('content', '')}\n" for m in messages) + "assistant:"


class CompletionService:
    """Tokenize, open the request, hand it to the engine, stream or collect the answer."""

    def __init__(self, tokenizer: Any, client: EngineClient) -> None:
        self.tokenizer = tokenizer
        self.client = client

    async def run(self, body: dict[str, Any], prompt: Any, chat: bool) -> Any:
        from fastapi import HTTPException
        from fastapi.responses import JSONResponse, StreamingResponse

        import llmtrace

        if not isinstance(prompt, str) or not prompt:
            raise HTTPException(400, "prompt must be a non-empty string")
        max_tokens = int(body.get("max_tokens") or 16)
        stream = bool(body.get("stream", False))
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        handle = llmtrace.start_request(request_id, model=body.get("model") or MODEL_NAME, max_tokens=max_tokens,
                                        temperature=body.get("temperature"), top_p=body.get("top_p"),
                                        stream=stream, operation="chat" if chat else "text_completion",
                                        prompt=prompt)
        with handle.activate():  # the tokenizer integration records the encode on this request
            start = monotonic_ns()
            prompt_ids = self.tokenizer.encode(prompt)
            if not handle.tokenize:  # the tokenizers integration is off: record it ourselves
                handle.tokenized(len(prompt_ids), start, monotonic_ns())
        try:
            outputs = self.client.submit({"request_id": request_id, "prompt_ids": prompt_ids,
                                          "max_tokens": max_tokens, "temperature": body.get("temperature"),
                                          "top_p": body.get("top_p"), "carrier": handle.carrier()})
        except RuntimeError as exc:
            handle.aborted(exc)
            raise HTTPException(503, str(exc)) from exc
        handle.handed_to_engine()
        events = _events(handle, outputs, self.client, self.tokenizer, request_id)
        if stream:
            return StreamingResponse(_sse(events), media_type="text/event-stream")
        text, reason, count = "", "stop", 0
        async for piece, finish in events:
            text += piece
            count += 1 if piece else 0
            reason = finish or reason
        if reason == "error":
            raise HTTPException(500, "engine error")
        return JSONResponse(_completion_body(request_id, text, reason, len(prompt_ids), count, chat))


def create_app(engine_overrides: dict[str, Any] | None = None) -> Any:
    """Build the FastAPI app; the engine process starts with the app and stops with it."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse

    from llmtrace.server.tiny_model import train_tokenizer

    tokenizer = train_tokenizer(cache_dir=TOKENIZER_CACHE)
    config = EngineConfig(vocab_size=len(tokenizer), eos_token_id=int(tokenizer.eos_token_id),
                          instrument_options=_instrument_options(), **(engine_overrides or {}))
    client = EngineClient(config)
    service = CompletionService(tokenizer, client)

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        import asyncio

        await asyncio.to_thread(client.start)
        yield
        await asyncio.to_thread(client.stop)

    app = FastAPI(title="llmtrace reference server", lifespan=lifespan)
    app.state.engine = client

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        return await service.run(body, prompt, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = await request.json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPException(400, "messages must be a non-empty list")
        return await service.run(body, _chat_prompt(messages), chat=True)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "llmtrace"}]}

    @app.get("/health")
    async def health() -> Any:
        if client.dead:
            return JSONResponse({"status": "engine dead", "detail": client.dead}, status_code=503)
        return {"status": "ok"}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        """The engine's scheduler numbers, and llmtrace's own CPU in each process."""
        import llmtrace

        engine = await client.stats()
        return {**engine, "llmtrace_cpu_s": {"api": llmtrace.overhead_cpu_s(),
                                             "engine": engine.get("llmtrace_cpu_s", {})}}

    return app


async def _events(handle: Any, outputs: Any, client: EngineClient, tokenizer: Any,
                  request_id: str) -> AsyncIterator[tuple[str, str | None]]:
    """(text piece, finish reason or None) as the engine produces tokens; ends the request span."""
    finished = False
    count = 0
    try:
        while True:
            message = await outputs.get()
            if message[0] == "token":
                handle.token()
                count += 1
                piece = tokenizer.decode([message[2]])  # incremental: timed by the tokenizer integration
                yield piece, None
                continue
            _, _, reason, summary = message
            finished = True
            if reason == "error":
                handle.aborted(RuntimeError(summary.get("error", "engine error")))
            else:
                handle.engine_summary(summary)
                handle.finished(reason, output_tokens=count)
            yield "", reason
            return
    finally:
        client.release(request_id, abort=not finished)
        if not finished:
            handle.aborted(reason="abort")


async def _sse(events: AsyncIterator[tuple[str, str | None]]) -> AsyncIterator[bytes]:
    async for piece, finish in events:
        chunk = {"object": "text_completion", "choices": [{"index": 0, "text": piece, "finish_reason": finish}]}
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"


def _completion_body(request_id: str, text: str, reason: str, prompt_tokens: int, completion_tokens: int,
                     chat: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": request_id, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": MODEL_NAME, "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}
