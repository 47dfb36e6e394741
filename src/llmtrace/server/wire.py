"""What the server sends back: OpenAI response bodies, stream chunks and stop-sequence cutting.

A streamed chat completion is ``chat.completion.chunk`` objects whose ``delta`` carries the
role first, then the content, then an empty delta with the ``finish_reason``; a streamed
completion is ``text_completion`` objects with ``text``. Every chunk has ``id``, ``object``,
``created`` and ``model``. With ``stream_options.include_usage`` every chunk carries
``"usage": null`` and one last chunk with no choices carries the usage. The stream ends
with ``data: [DONE]``; an error after the response has started is sent as
``data: {"error": {...}}`` (the SDK raises it as ``APIError``).
"""

from __future__ import annotations

import json
import time
from typing import Any


def sse(payload: dict[str, Any] | str) -> bytes:
    """One Server-Sent Event."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens`` when the engine reported its
    prefix-cache hit."""
    body: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


class ResponseWriter:
    """The OpenAI shapes of one response (chat or completion), streamed or whole."""

    def __init__(self, response_id: str, model: str, chat: bool, include_usage: bool = False) -> None:
        self.id = response_id
        self.model = model
        self.chat = chat
        self.include_usage = include_usage
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk = self._envelope("chat.completion.chunk" if self.chat else "text_completion", choices)
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _choice(self, text: str | None, finish_reason: str | None, role: bool = False) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def first_chunk(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant's role (and empty content), as OpenAI's do."""
        return self._chunk([self._choice("", None, role=True)]) if self.chat else None

    def text_chunk(self, text: str) -> dict[str, Any]:
        return self._chunk([self._choice(text, None)])

    def finish_chunk(self, finish_reason: str) -> dict[str, Any]:
        return self._chunk([self._choice(None if self.chat else "", finish_reason)])

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int,
                    cached_tokens: int | None = None) -> dict[str, Any]:
        return {**self._chunk([]), "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}

    def body(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int,
             cached_tokens: int | None = None) -> dict[str, Any]:
        """The whole (not streamed) response."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        body = self._envelope("chat.completion" if self.chat else "text_completion", [choice])
        body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
        return body


class StopText:
    """Cuts generated text before the first stop sequence.

    Text is released as it arrives except for a tail as long as the longest stop sequence
    minus one, which could be the start of a stop sequence that the next token completes.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to send, whether a stop sequence was reached)."""
        self._pending += text
        hits = [i for stop in self.stops if (i := self._pending.find(stop)) >= 0]
        if hits:
            out, self._pending = self._pending[:min(hits)], ""
            return out, True
        cut = len(self._pending) - self._hold
        if cut <= 0:
            return "", False
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out, False

    def flush(self) -> str:
        """What is still held back, once generation has ended without a stop sequence."""
        out, self._pending = self._pending, ""
        return out
