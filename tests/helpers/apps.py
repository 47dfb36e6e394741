"""A small FastAPI LLM server over the tiny model: what a user's service looks like."""



import threading
from typing import Any

import llmtrace


def token_streamer_class() -> Any:
    from transformers import TextIteratorStreamer

    class TokenStreamer(TextIteratorStreamer):
        """Emits every generated token as soon as it exists (no word buffering)."""

        def put(self, value: Any) -> None:
            if len(value.shape) > 1:
                value = value[0]
            if self.skip_prompt and self.next_tokens_are_prompt:
                self.next_tokens_are_prompt = False
                return
            self.on_finalized_text(str(self.tokenizer.decode(value.tolist())) or " ")

    return TokenStreamer


def build_app(tokenizer: Any, model: Any) -> Any:
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import StreamingResponse
    from pydantic import BaseModel
    from transformers import TextIteratorStreamer

    app = FastAPI()
    token_streamer = token_streamer_class()
    lock = threading.Lock()  # one generate() at a time, as on a single device
    app.state.generate_lock = lock  # tests wait on it for generate() threads still running

    class Completion(BaseModel):
        prompt: str
        max_tokens: int = 8
        per_token: bool = True
        fail: bool = False

    @app.post("/v1/completions")
    def complete(body: Completion) -> dict[str, Any]:
        enc = tokenizer(body.prompt, return_tensors="pt")
        with lock:
            out = model.generate(**enc, max_new_tokens=body.max_tokens, min_new_tokens=body.max_tokens,
                                 do_sample=False)
        text = tokenizer.decode(out[0, enc["input_ids"].shape[-1]:])
        return {"text": text}

    @app.post("/v1/stream")
    def stream(body: Completion) -> StreamingResponse:
        enc = tokenizer(body.prompt, return_tensors="pt")
        cls = token_streamer if body.per_token else TextIteratorStreamer
        streamer = cls(tokenizer, skip_prompt=True, timeout=30)
        kwargs = dict(**enc, streamer=streamer, max_new_tokens=body.max_tokens, min_new_tokens=body.max_tokens,
                      do_sample=False)
        if body.fail:
            kwargs["max_new_tokens"] = -1  # generate() raises ValueError in the thread

        def run() -> None:
            with lock:
                try:
                    model.generate(**kwargs)
                except ValueError:
                    streamer.end()

        threading.Thread(target=run, daemon=True).start()

        def events() -> Any:
            for text in streamer:
                yield f"data: {text}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/explicit")
    async def explicit(body: Completion) -> dict[str, Any]:
        """A custom engine reporting through the lifecycle API by hand."""
        with llmtrace.start_request(model="custom", max_tokens=body.max_tokens) as handle:
            handle.tokenized(3)
            for _ in range(body.max_tokens):
                handle.token()
            if body.fail:
                raise HTTPException(status_code=500, detail="engine failed")
        return {"ok": True}

    return app
