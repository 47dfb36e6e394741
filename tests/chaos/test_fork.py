"""Chaos: an instrumented process forks while its collector is down.

Real processes: ``tests/chaos/fork_app.py`` (parent and forked child, both exporting OTLP/gRPC
and spilling to one directory) and the collector + Jaeger of tests/stack, started on the app's
endpoint only after the child has exited. The child must not write into or re-send the parent's
spill; the parent re-sends its own spill and adopts the exited child's; Jaeger ends up with every
span of both processes exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from scripts.otel_stack.binaries import REPO_ROOT
from scripts.otel_stack.stack import OtelStack, free_port, query_traces

pytestmark = pytest.mark.stack


def test_a_forked_child_and_its_parent_each_deliver_their_own_spans_once(tmp_path: Path) -> None:
    port, service, go_file = free_port(), f"chaos-fork-{uuid.uuid4().hex[:6]}", tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LLMTRACE_"))}
    env.update({"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "src")]),
                "LLMTRACE_SERVICE_NAME": service, "LLMTRACE_ENDPOINT": f"http://127.0.0.1:{port}",
                "LLMTRACE_SPILL_DIR": str(tmp_path / "spill")})
    app = subprocess.Popen([sys.executable, "-m", "tests.chaos.fork_app", str(go_file)], env=env, cwd=REPO_ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not Path(str(go_file) + ".child").exists() and app.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    stack = OtelStack.start(log_dir=tmp_path, ports={"c_grpc": port})
    try:
        go_file.touch()
        out, err = app.communicate(timeout=180)
        assert 0 == app.returncode, err[-3000:]
        result = json.loads(out.strip().splitlines()[-1])
        sent = set(result["parent_ids"]) | set(result["child"]["ids"])
        spans = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            spans = query_traces(stack.jaeger_query_url, service, limit=100_000)
            if len(spans) >= len(sent):
                break
            time.sleep(0.5)
    finally:
        stack.stop()
    assert 400 == len(sent)
    assert (100, 0) == (result["child"]["spilled"], result["child"]["dropped"])
    assert (400, 0) == (result["exported"], result["dropped"])
    assert sorted(sent) == sorted(s.span_id for s in spans), "every span in Jaeger, none twice"
    pids = {s.span_id: s.resource["process.pid"] for s in spans}
    assert {result["child"]["pid"]} == {pids[i] for i in result["child"]["ids"]}
    assert {result["pid"]} == {pids[i] for i in result["parent_ids"]}
