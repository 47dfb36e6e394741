"""``vllm serve`` — the OpenAI API server, AsyncLLM, the EngineCore process — on the CPU with the
fake executor: concurrent streaming requests, one client disconnect, traced through the plugin."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.vllm import serve_driver, trace_checks
from tests.vllm.conftest import driven, requires_vllm, subprocess_env

pytestmark = [pytest.mark.vllm, requires_vllm]

SERVE_ARGS = ["--load-format", "dummy", "--max-model-len", "128", "--enforce-eager", "--block-size", "16",
              "--max-num-seqs", "8", "--distributed-executor-backend", "tests.vllm.fake_executor.FakeExecutor"]
#: The engine exports within ~1 s of going idle (window flush + batch delay); vLLM's shutdown kills
#: the EngineCore process at once, so the test waits for the export before stopping the server.
EXPORT_WAIT_S = 3.0


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[serve_driver.Burst, list[Any]]:
    directory = tmp_path_factory.mktemp("serve")
    traces = directory / "traces.jsonl"
    env = subprocess_env(LLMTRACE_VLLM="1", LLMTRACE_EXPORTER=f"file:{traces}")
    server = serve_driver.start(str(tiny_model), env=env, log_path=directory / "serve.log", extra_args=SERVE_ARGS)
    try:
        burst = serve_driver.burst(server, requests=6, max_tokens=8, abort_first=1)
        time.sleep(EXPORT_WAIT_S)
    finally:
        serve_driver.stop(server)
    driven("vllm serve (OpenAI completions, streaming, renderer, AsyncLLM, EngineCore process) with a "
           "client disconnect")
    return burst, trace_checks.load(traces)


def test_streaming_burst_is_fully_traced(served: tuple[serve_driver.Burst, list[Any]]) -> None:
    """Every streamed request: llm.request under the HTTP span, tokenize, engine phases, linked steps."""
    burst, spans = served
    assert [] == burst.errors
    assert [] == trace_checks.check(spans, expected_requests=6).problems


def test_client_disconnect_is_an_aborted_request(served: tuple[serve_driver.Burst, list[Any]]) -> None:
    """The request whose client went away ends as ``abort`` with status ERROR; the others ``length``."""
    _burst, spans = served
    reasons = sorted(s.attributes["llm.request.finish_reason"] for s in spans if s.name == "llm.request")
    assert ["abort", "length", "length", "length", "length", "length"] == reasons
    aborted = [s for s in spans if s.name == "llm.request" and s.attributes["llm.request.finish_reason"] == "abort"]
    assert "STATUS_CODE_ERROR" in aborted[0].status or aborted[0].status == "2"


def test_streamed_requests_are_marked_stream(served: tuple[serve_driver.Burst, list[Any]]) -> None:
    """``llm.stream`` and the served model name come from vLLM's own request objects."""
    _burst, spans = served
    requests = [s for s in spans if s.name == "llm.request"]
    assert {True} == {r.attributes.get("llm.stream") for r in requests}
    assert {"tiny"} == {r.attributes.get("gen_ai.request.model") for r in requests}
