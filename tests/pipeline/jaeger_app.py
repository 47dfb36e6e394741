"""A FastAPI + tiny GPT-2 server exporting over OTLP; run in a fresh interpreter by test_jaeger.py.

``python -m tests.pipeline.jaeger_app``: instruments from LLMTRACE_* variables, serves the
streaming endpoint under uvicorn, makes one streamed call with a traceparent, flushes and
prints ``{"trace_id": ..., "client_ttft_s": ...}``.
"""

from __future__ import annotations

import json
import time

import llmtrace

TRACE_ID = "5b8efff798038103d269b633813fc60c"
TRACEPARENT = f"00-{TRACE_ID}-eee19b7ec3c1b174-01"


def main() -> None:
    llmtrace.instrument(gpu="off")
    import httpx
    import torch

    from tests.helpers import apps, servers, tiny_models

    torch.set_num_threads(1)
    app = apps.build_app(tiny_models.tokenizer(), tiny_models.model())
    with servers.uvicorn_server(app) as url, httpx.Client(timeout=30) as client:
        start = time.monotonic()
        first = None
        with client.stream("POST", url + "/v1/stream", json={"prompt": "hello world", "max_tokens": 6},
                           headers={"traceparent": TRACEPARENT}) as response:
            for _ in response.iter_raw():
                first = first or time.monotonic() - start
        time.sleep(0.2)
    assert llmtrace.shutdown(10)
    print(json.dumps({"trace_id": TRACE_ID, "client_ttft_s": first}))


if __name__ == "__main__":
    main()
