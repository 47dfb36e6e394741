"""``llmtrace load`` exports its CLIENT spans like any llmtrace span: with only the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` set, they reach the real collector and Jaeger of the test stack
(scripts/otel_stack), no file written."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmtrace import semconv
from tests.helpers.servers import uvicorn_server
from tests.load.sse_app import build_app

pytestmark = pytest.mark.stack

CLIENT_KIND = 3  # OTLP's SPAN_KIND_CLIENT


@pytest.fixture
def sse_server() -> Iterator[tuple[str, Any]]:
    app = build_app()
    with uvicorn_server(app) as url:
        yield url, app


def test_client_spans_reach_jaeger_over_otlp(otel_stack: Any, sse_server: tuple[str, Any], tmp_path: Path) -> None:
    url, app = sse_server
    service = f"load-otlp-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMTRACE_", "OTEL_"))}
    env.update({"LLMTRACE_QUIET": "1", "OTEL_SERVICE_NAME": service,
                "OTEL_EXPORTER_OTLP_ENDPOINT": otel_stack.otlp_grpc_endpoint})
    out = subprocess.run([sys.executable, "-m", "llmtrace.cli", "load", url, "--qps", "4", "--duration", "1.5",
                          "--arrival", "constant", "--output-tokens", "3", "--json", "r.json", "-q"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert 0 == out.returncode, out.stderr
    sent = {r.traceparent.split("-")[1] for r in app.state.log if r.traceparent}
    assert 6 == len(sent)
    spans = otel_stack.find_traces(service, timeout_s=60, min_traces=6)
    clients = [s for s in spans if s.kind == CLIENT_KIND]
    assert sent == {s.trace_id for s in clients}
    assert all("text_completion null" == s.name and "ok" == s.attributes[semconv.LLM_LOAD_OUTCOME]
               and 0 == s.attributes[semconv.LLM_LOAD_STEP] for s in clients)
    assert "load-client" == clients[0].resource[semconv.LLMTRACE_PROCESS_ROLE]
    assert [] == [p.name for p in tmp_path.iterdir() if p.suffix == ".jsonl"]
