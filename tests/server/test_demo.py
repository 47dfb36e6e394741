"""``llmtrace demo``: where its spans go (``--output``, ``LLMTRACE_EXPORTER``, an endpoint) and
what its report says, down to one real run of the reference server."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmtrace.errors import ConfigError
from llmtrace.server.demo import DemoExport, demo_export

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "analysis" / "reference_server.jsonl.gz"


@pytest.mark.parametrize(("output", "env", "expected"), [
    (None, {}, DemoExport("file:{d}/llmtrace-demo-traces.jsonl", "{d}/llmtrace-demo-traces.jsonl", True)),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
     DemoExport("file:{d}/llmtrace-demo-traces.jsonl,otlp", "{d}/llmtrace-demo-traces.jsonl", True, "http://c:4317")),
    (None, {"LLMTRACE_EXPORTER": "otlp", "LLMTRACE_ENDPOINT": "http://c:4317"},
     DemoExport("otlp", None, False, "http://c:4317")),
    (None, {"LLMTRACE_EXPORTER": "file:run.jsonl,otlp"}, DemoExport("file:{d}/run.jsonl,otlp", "{d}/run.jsonl", False)),
    (None, {"LLMTRACE_EXPORTER": "file", "LLMTRACE_FILE_PATH": "svc.jsonl"},
     DemoExport("file:{d}/svc.jsonl", "{d}/svc.jsonl", False)),
    ("out.jsonl", {"LLMTRACE_EXPORTER": "file:run.jsonl,otlp"},
     DemoExport("file:{d}/out.jsonl,otlp", "{d}/out.jsonl", True)),
])
def test_the_demo_exports_where_the_user_configured(output: str | None, env: dict[str, str], expected: DemoExport,
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --output, LLMTRACE_EXPORTER is honoured as it stands (its file appended to, not
    replaced); --output names the file and keeps the user's other exporters; with neither, the
    demo's own file, plus OTLP when an endpoint is set."""
    monkeypatch.chdir(tmp_path)
    d = str(tmp_path)
    want = DemoExport(expected.exporter.format(d=d), expected.file and expected.file.format(d=d),
                      expected.replace, expected.endpoint)
    assert want == demo_export(output, env)


def test_the_demo_says_where_spans_go_that_no_file_holds() -> None:
    """With only OTLP there is no file to analyse: the demo names the endpoint instead."""
    export = demo_export(None, {"LLMTRACE_EXPORTER": "otlp", "LLMTRACE_ENDPOINT": "http://collector:4317"})
    assert "OTLP http://collector:4317" == export.describe()


def test_an_invalid_llmtrace_exporter_stops_the_demo_before_it_starts() -> None:
    """The same ConfigError as instrument() would raise, naming the variable."""
    with pytest.raises(ConfigError, match="LLMTRACE_EXPORTER: 'kafka' is not one of"):
        demo_export(None, {"LLMTRACE_EXPORTER": "kafka"})


def _roles(path: Path) -> set[str]:
    roles = set()
    for line in path.read_text().splitlines():
        for resource_spans in json.loads(line).get("resourceSpans", []):
            for attribute in resource_spans["resource"]["attributes"]:
                if "llmtrace.process.role" == attribute["key"]:
                    roles.add(attribute["value"]["stringValue"])
    return roles


@pytest.mark.torch
@pytest.mark.slow
def test_a_demo_run_writes_to_the_llmtrace_exporter_file_and_analyses_this_run(tmp_path: Path) -> None:
    """LLMTRACE_EXPORTER=file:run.jsonl holding an earlier run: both demo processes append to it,
    the report covers this run's requests only, and it does not warn about the metrics lines
    llmtrace writes into the same file."""
    run = tmp_path / "run.jsonl"
    run.write_bytes(gzip.decompress(FIXTURE.read_bytes()))  # an earlier run (its own metrics lines too)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMTRACE_", "OTEL_"))}
    out = subprocess.run(
        [sys.executable, "-m", "llmtrace.cli", "demo", "--duration-s", "2", "--requests", "6",
         "--concurrency", "3", "--json", "summary.json"],
        cwd=tmp_path, env={**env, "LLMTRACE_EXPORTER": f"file:{run}"},
        capture_output=True, text=True, timeout=240, check=True,
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert 6 == summary["requests"]["count"]
    assert [] == summary["source"]["warnings"]
    assert "skipped" not in out.stdout + out.stderr
    assert {"api-server", "engine"} <= _roles(run)
    assert not (tmp_path / "llmtrace-demo-traces.jsonl").exists()
    # Requests opening with the same system prompt: the engine's prefix cache served some.
    assert summary["prefix_cache"]["tokens"]["cached"] > 0


def test_most_demo_requests_open_with_one_of_a_few_system_prompts() -> None:
    """The demo's plan gives about SYSTEM_PROMPT_SHARE of its requests one shared prefix block,
    drawn from SYSTEM_PROMPTS of them, and leaves the rest without (the misses)."""
    from llmtrace.server.demo import SYSTEM_PROMPT_SHARE, SYSTEM_PROMPTS, plan_demo

    _, planned = plan_demo(60.0, None)
    shared = [p.prefix_blocks for p in planned if p.prefix_blocks]
    assert {(b,) for b in range(SYSTEM_PROMPTS)} == set(shared)
    assert abs(len(shared) / len(planned) - SYSTEM_PROMPT_SHARE) < 0.1
