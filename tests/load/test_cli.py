"""``llmtrace load`` as a user runs it (a fresh interpreter each time): the report files, the
CLIENT spans, bad input as one error line, and Ctrl-C keeping what was measured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmtrace import semconv
from llmtrace.analysis.sources import load_spans
from tests.helpers.servers import free_port, uvicorn_server
from tests.load.sse_app import build_app, build_not_openai_app


@pytest.fixture
def sse_server() -> Iterator[tuple[str, Any]]:
    app = build_app()
    with uvicorn_server(app) as url:
        yield url, app


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMTRACE_", "OTEL_"))}
    return {**env, "LLMTRACE_QUIET": "1"}


def _load(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtrace.cli", "load", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_a_run_writes_the_reports_and_one_client_span_per_request(sse_server: tuple[str, Any], tmp_path: Path) -> None:
    """Steps 5 -> 10 req/s: JSON and HTML reports, and a CLIENT span per request carrying its step,
    whose trace id is the one the server received in traceparent."""
    url, app = sse_server
    out = _load(url, "--profile", "steps", "--qps", "5,10", "--step-duration", "1", "--input-tokens", "16",
                "--output-tokens", "4", "--slo", "ttft=1s,e2e=2s", "--json", "r.json", "--html", "r.html",
                "--traces", "t.jsonl", "--endpoint", "chat", cwd=tmp_path)
    assert 0 == out.returncode, out.stderr
    summary = json.loads((tmp_path / "r.json").read_text())
    assert ["qps=5", "qps=10"] == [s["label"] for s in summary["steps"]]
    count = summary["overall"]["requests"]
    assert count == summary["overall"]["ok"] > 5
    assert "qps=10" == summary["capacity"]["label"]
    assert "<svg" in (tmp_path / "r.html").read_text()
    assert "capacity: qps=10" in out.stdout
    spans = [s for s in load_spans(str(tmp_path / "t.jsonl")).spans if s.kind.name == "CLIENT"]
    assert count == len(spans)
    assert {"chat null"} == {s.name for s in spans}
    assert {0, 1} == {s.attributes[semconv.LLM_LOAD_STEP] for s in spans}
    sent = {r.traceparent.split("-")[1] for r in app.state.log if r.traceparent}
    assert {s.trace_id for s in spans} == sent


@pytest.mark.parametrize(("server", "message"), [
    ("unreachable", "llmtrace: error: cannot connect to http://127.0.0.1:{port}"),
    ("not-openai", "answered 404: not an OpenAI-compatible server"),
    ("no-sse", "answered a stream=true request with Content-Type 'application/json', not text/event-stream"),
])
def test_an_unusable_server_is_one_error_line(server: str, message: str, tmp_path: Path) -> None:
    if server == "unreachable":
        port = free_port()
        out = _load(f"http://127.0.0.1:{port}", "--qps", "1", "--duration", "1", cwd=tmp_path)
        message = message.format(port=port)
    else:
        app = build_not_openai_app() if server == "not-openai" else build_app()
        app.state.sse = False
        with uvicorn_server(app) as url:
            out = _load(url, "--qps", "1", "--duration", "1", cwd=tmp_path)
    assert 2 == out.returncode
    assert 1 == len(out.stderr.strip().splitlines()[-1:])
    assert message in out.stderr.strip().splitlines()[-1], out.stderr
    assert "Traceback" not in out.stderr


def test_a_malformed_replay_file_is_one_error_line(tmp_path: Path) -> None:
    (tmp_path / "trace.jsonl").write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"time\n')
    out = _load("http://127.0.0.1:1", "--replay", "trace.jsonl", cwd=tmp_path)
    assert 2 == out.returncode
    assert "llmtrace: error: trace.jsonl:2: not JSON" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("processes", [1, 2])
def test_ctrl_c_ends_the_run_with_the_report_of_what_was_measured(sse_server: tuple[str, Any], tmp_path: Path,
                                                                  processes: int) -> None:
    """SIGINT to the terminal's process group (what Ctrl-C sends) a few requests into a 60 s run,
    also with worker processes: exit 130, and the JSON report holds the requests so far."""
    url, app = sse_server
    proc = subprocess.Popen([sys.executable, "-m", "llmtrace.cli", "load", url, "--qps", "5", "--duration", "60",
                             "--output-tokens", "4", "--json", "r.json", "--no-traces", "--processes",
                             str(processes)], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(app.state.log) < 10 and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert 130 == proc.returncode, stderr
    summary = json.loads((tmp_path / "r.json").read_text())
    assert "interrupted (Ctrl-C)" == summary["interrupted"]
    assert 5 <= summary["overall"]["requests"] < 100
    assert "ended early: interrupted (Ctrl-C)" in stdout


def test_a_server_that_goes_away_mid_run_leaves_a_report_of_every_request(tmp_path: Path) -> None:
    """The server stops a second into a 3 s run: the requests sent after it are connection
    errors, named in the report; nothing measured before is lost and the run still ends with
    its report (exit 0)."""
    app = build_app()
    with uvicorn_server(app) as url:
        proc = subprocess.Popen([sys.executable, "-m", "llmtrace.cli", "load", url, "--qps", "10", "--duration", "3",
                                 "--arrival", "constant", "--output-tokens", "2", "--json", "r.json", "--no-traces",
                                 "-q"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        deadline = time.monotonic() + 60
        while len(app.state.log) < 3 + 8 and time.monotonic() < deadline:  # the preflight's 3, then 8 of ours
            time.sleep(0.05)
    _, stderr = proc.communicate(timeout=120)
    assert 0 == proc.returncode, stderr
    summary = json.loads((tmp_path / "r.json").read_text())
    outcomes = summary["overall"]["outcomes"]
    assert 30 == summary["overall"]["requests"] == sum(outcomes.values())
    assert outcomes["ok"] >= 8 and outcomes["connection_error"] >= 5, outcomes
    assert summary["overall"]["error_ratio"] > 0
    assert summary["errors"] and "Client" in summary["errors"][0]["error"]
