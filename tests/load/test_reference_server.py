"""``llmtrace load`` against the traced reference server (``python -m llmtrace.server``): one
trace from the client's send to the last token, and ``llmtrace analyze`` joining both sides."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmtrace import semconv
from llmtrace.analysis.model import SpanKind
from llmtrace.analysis.sources import load_spans
from tests.helpers.servers import free_port

pytestmark = pytest.mark.torch


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMTRACE_", "OTEL_"))}
    return {**env, "LLMTRACE_QUIET": "1"}


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The reference server exporting to server.jsonl; two load steps on /v1/completions (CLIENT
    spans to client.jsonl), then one on /v1/chat/completions (chat.jsonl)."""
    out = tmp_path_factory.mktemp("ref-load")
    port = free_port()
    log = out / "server.log"
    with open(log, "w") as stderr:
        server = subprocess.Popen([sys.executable, "-m", "llmtrace.server", "--port", str(port)], cwd=out,
                                  env={**_env(), "LLMTRACE_EXPORTER": f"file:{out / 'server.jsonl'}"},
                                  stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "reference server did not start"
            time.sleep(0.5)
        for name, options in (("client", ["--profile", "steps", "--qps", "2,4", "--step-duration", "2",
                                          "--input-tokens", "24"]),
                              ("chat", ["--endpoint", "chat", "--qps", "3", "--duration", "2",
                                        "--input-tokens", "60"])):
            load = subprocess.run(
                [sys.executable, "-m", "llmtrace.cli", "load", f"http://127.0.0.1:{port}", *options, "--output-tokens",
                 "8", "--traces", str(out / f"{name}.jsonl"), "--json", str(out / f"{name}-load.json"), "-q"],
                cwd=out, env=_env(), capture_output=True, text=True, timeout=240, check=False)
            assert 0 == load.returncode, load.stderr
    finally:
        server.send_signal(signal.SIGINT)  # uvicorn shuts down; the engine flushes its spans
        server.wait(60)
    yield out


def test_the_client_span_is_the_parent_of_the_server_span(traced_run: Path) -> None:
    """Every request the load sent: CLIENT span -> SERVER span -> llm.request, one trace id."""
    spans = list(load_spans(str(traced_run / "client.jsonl")).spans) + list(
        load_spans(str(traced_run / "server.jsonl")).spans)
    by_id = {s.span_id: s for s in spans}
    clients = [s for s in spans if s.kind == SpanKind.CLIENT]
    summary = json.loads((traced_run / "client-load.json").read_text())
    assert summary["overall"]["requests"] == len(clients) > 4
    for client in clients:
        servers = [s for s in spans if s.parent_id == client.span_id]
        assert 1 == len(servers), client
        server = servers[0]
        assert (SpanKind.SERVER, client.trace_id) == (server.kind, server.trace_id)
        request = [s for s in spans if s.parent_id == server.span_id and s.name == semconv.SPAN_REQUEST]
        assert 1 == len(request)
        # Causal order only (the server's span may end after the client read the last byte):
        # the client sent before the server received, and the server received before the client ended.
        assert client.start_ns <= server.start_ns <= client.end_ns
        assert by_id[server.parent_id or ""] is client


def test_analyze_reports_client_minus_server_ttft_per_request_and_per_step(traced_run: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "llmtrace.cli", "analyze", str(traced_run / "client.jsonl"),
                          str(traced_run / "server.jsonl"), "--json", "-"], env=_env(), capture_output=True,
                         text=True, timeout=120, check=True)
    client = json.loads(out.stdout)["client"]
    assert client["requests"] > 4
    assert ["qps=2", "qps=4"] == [s["label"] for s in client["steps"]]
    for row in client["per_request"]:
        assert row["client_ttft_s"] >= row["server_ttft_s"] > 0
        assert row["ttft_delta_s"] == pytest.approx(row["client_ttft_s"] - row["server_ttft_s"], abs=1e-6)
    assert client["ttft_delta_s"]["p50"] > 0
    assert all(s["bottleneck"] is not None and s["breakdown"]["decode"] > 0 for s in client["steps"])


def _joined(traced_run: Path, client_file: str) -> list[tuple[Any, Any]]:
    """(CLIENT span, the llm.request span of the server request it caused) for every request."""
    spans = list(load_spans(str(traced_run / client_file)).spans) + list(
        load_spans(str(traced_run / "server.jsonl")).spans)
    server_of = {s.parent_id: s for s in spans if s.kind == SpanKind.SERVER}
    request_of = {s.parent_id: s for s in spans if s.name == semconv.SPAN_REQUEST}
    return [(c, request_of[server_of[c.span_id].span_id]) for c in spans if c.kind == SpanKind.CLIENT]


@pytest.mark.parametrize(("client_file", "operation"), [("client.jsonl", "text_completion"), ("chat.jsonl", "chat")])
def test_both_endpoints_streams_are_read_as_the_server_sent_them(traced_run: Path, client_file: str,
                                                                 operation: str) -> None:
    """The reference server speaks the wire format of the official ``openai`` SDK's types
    (tests/server/test_openai_api.py): on both endpoints the client's token counts are the ones
    the server's llm.request recorded, and its TTFT and TPOT were measured from the stream."""
    pairs = _joined(traced_run, client_file)
    assert len(pairs) > 3
    for client, request in pairs:
        a = client.attributes
        assert (operation, "ok", 200) == (a[semconv.GEN_AI_OPERATION_NAME], a[semconv.LLM_LOAD_OUTCOME],
                                          a[semconv.HTTP_RESPONSE_STATUS_CODE])
        for key in (semconv.GEN_AI_USAGE_INPUT_TOKENS, semconv.GEN_AI_USAGE_OUTPUT_TOKENS,
                    semconv.GEN_AI_RESPONSE_FINISH_REASONS):
            assert request.attributes[key] == a[key]
        assert "llmtrace-tiny-gpt2" == a[semconv.GEN_AI_RESPONSE_MODEL]
        assert a[semconv.GEN_AI_RESPONSE_ID].endswith(request.attributes[semconv.GEN_AI_RESPONSE_ID])
        # The span starts at the intended send time: it holds the send lag, then TTFT from the send.
        duration_s = (client.end_ns - client.start_ns) / 1e9
        assert 0 < a[semconv.LLM_CLIENT_TTFT_S] + a[semconv.LLM_LOAD_SEND_LAG_S] <= duration_s
        # The server sends no chunk for a token that ends inside a UTF-8 character (the tiny model's
        # random bytes often do): only more than one text chunk leaves a time between them.
        if semconv.LLM_CLIENT_ITL_MAX_S in a:
            assert a[semconv.LLM_CLIENT_TPOT_S] > 0


@pytest.mark.parametrize("client_file", ["client.jsonl", "chat.jsonl"])
def test_prompts_are_calibrated_to_the_servers_own_prompt_token_count(traced_run: Path, client_file: str) -> None:
    """Synthetic prompts sized from the server's own usage.prompt_tokens for each prompt piece
    (chat template included): the server counts exactly the length asked for, every request."""
    pairs = _joined(traced_run, client_file)
    asked = [(c.attributes[semconv.LLM_LOAD_REQUESTED_INPUT_TOKENS], c.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS])
             for c, _ in pairs]
    assert len(asked) > 3
    assert [a for a, _ in asked] == [counted for _, counted in asked]
