"""A small OpenAI-compatible FastAPI server for the load tests: real HTTP, real SSE, no model.

It speaks both endpoints in OpenAI's wire formats (``text_completion`` chunks; chat as
``chat.completion.chunk`` with a role-only first ``delta``), reports ``usage`` (one prompt
token per word), and records what it received and when (``app.state.log``). Knobs on
``app.state``: ``token_delay_s`` between chunks, ``stall_at`` (the request count that starts
a stall) and ``stall_s`` (how long every request waits from then on), ``sse`` (False: a
stream request is answered with plain JSON), ``count_tokens`` (a prompt's text to the
``usage.prompt_tokens`` reported, None for no ``usage``: another tokenizer's count).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request  # module level: FastAPI resolves handler annotations here


@dataclass(frozen=True)
class Received:
    at: float  # time.monotonic() on arrival
    path: str
    prompt: str
    max_tokens: int
    traceparent: str | None


def sent_by_the_load(log: list[Received]) -> list[Received]:
    """The requests of the load itself: not the preflight's probes (the lead word alone, and the
    lead word with every prompt piece, which is all the calibration this server needs)."""
    from llmtrace.load.prompts import LEAD, pool_probe

    probes = {LEAD, pool_probe()}
    return [r for r in log if r.prompt not in probes]


def _chunk(chat: bool, text: str, first: bool) -> dict[str, Any]:
    if chat:
        delta = {"role": "assistant", "content": ""} if first else {"content": text}
        return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "null",
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    return {"id": "cmpl-1", "object": "text_completion", "model": "null",
            "choices": [{"index": 0, "text": text, "finish_reason": None}]}


def build_app() -> Any:
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI()
    app.state.log = []
    app.state.token_delay_s = 0.001
    app.state.stall_at = None
    app.state.stall_s = 0.0
    app.state.stall_until = None
    app.state.sse = True
    app.state.count_tokens = lambda prompt: len(prompt.split())

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "null", "object": "model"}]}

    async def answer(request: Request, chat: bool) -> Any:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": {"message": "invalid JSON"}}, status_code=400)
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int):
            return JSONResponse({"error": {"message": "max_tokens must be an integer"}}, status_code=400)
        prompt = body["messages"][-1]["content"] if chat else body.get("prompt", "")
        state = app.state
        state.log.append(Received(time.monotonic(), request.url.path, prompt, max_tokens,
                                  request.headers.get("traceparent")))
        if state.stall_at is not None and len(state.log) == state.stall_at:
            state.stall_until = time.monotonic() + state.stall_s
        if state.stall_until is not None and time.monotonic() < state.stall_until:
            await asyncio.sleep(state.stall_until - time.monotonic())
        counted = state.count_tokens(prompt)
        usage = None if counted is None else {"prompt_tokens": counted, "completion_tokens": max_tokens,
                                              "total_tokens": counted + max_tokens}
        if not body.get("stream") or not state.sse:
            text = "x " * max_tokens
            choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0,
                                                                                                   "text": text}
            return {"id": "cmpl-1", "object": "chat.completion" if chat else "text_completion", "model": "null",
                    "choices": [{**choice, "finish_reason": "length"}], "usage": usage}

        async def events() -> Any:
            if chat:
                yield f"data: {json.dumps(_chunk(chat, '', True))}\n\n"
            for _ in range(max_tokens):
                await asyncio.sleep(state.token_delay_s)
                yield f"data: {json.dumps(_chunk(chat, 'x ', False))}\n\n"
            if usage is not None and (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({'id': 'cmpl-1', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await answer(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await answer(request, chat=True)

    return app


def build_not_openai_app() -> Any:
    """A web server that is not an LLM API: every path under /v1 is a 404."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/")
    async def root() -> dict[str, str]:
        return {"hello": "world"}

    return app
