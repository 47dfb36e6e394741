"""The reference server as its own process, traced to an OTLP-JSON-lines file, with two faults
injected for the failure-isolation tests: the front end's tokenizer raises on a prompt holding
``FRONT_END_FAULT``, and the engine's forward pass raises on a prompt holding token
``ENGINE_FAULT_TOKEN`` (``EngineConfig.fail_on_token_id``). Every other request is served as usual.

Usage: ``python tests/server/openai_server.py PORT OUT.jsonl`` (SIGTERM stops it and flushes).
"""

from __future__ import annotations

import sys
from typing import Any

FRONT_END_FAULT = "<raise in the front end>"
ENGINE_FAULT_TOKEN = 7


class FaultyTokenizer:
    """The server's tokenizer, except that encoding FRONT_END_FAULT raises (a bug in one request's path)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def encode(self, text: str, *args: Any, **kwargs: Any) -> Any:
        if FRONT_END_FAULT in text:
            raise RuntimeError("injected fault in the front end")
        return self._inner.encode(text, *args, **kwargs)

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def main() -> None:
    port, out = int(sys.argv[1]), sys.argv[2]
    import uvicorn

    import llmtrace

    llmtrace.instrument(exporter=f"file:{out}", service_name="openai-api-test")
    from llmtrace.server.app import create_app

    app = create_app({"fail_on_token_id": ENGINE_FAULT_TOKEN})
    app.state.service.tokenizer = FaultyTokenizer(app.state.service.tokenizer)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
