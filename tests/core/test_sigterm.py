"""SIGTERM: a process with no handler of its own flushes its spans, then still dies of SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

_APP = """
import os, signal, sys, time, llmtrace
from opentelemetry import trace
llmtrace.instrument(exporter="file:" + sys.argv[1], metrics=False, gpu="off")
tracer = trace.get_tracer("t")
for i in range(50):
    tracer.start_span("llm.request", attributes={"i": i}).end()
print("ready", flush=True)
time.sleep(60)
"""


def test_spans_queued_at_sigterm_are_written_and_the_exit_status_is_sigterms(tmp_path: Path) -> None:
    """The batch processor holds the spans (its delay is 1 s); SIGTERM arrives first; they are in
    the file afterwards, and the process ended by SIGTERM as it would have without llmtrace."""
    path = tmp_path / "t.jsonl"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LLMTRACE_"))},
           "LLMTRACE_QUIET": "1"}
    with subprocess.Popen([sys.executable, "-c", _APP, str(path)], env=env, stdout=subprocess.PIPE,
                          text=True) as proc:
        assert proc.stdout is not None and "ready" == proc.stdout.readline().strip()
        proc.send_signal(signal.SIGTERM)
        assert -signal.SIGTERM == proc.wait(30)
    spans = [span for line in path.read_text().splitlines() for rs in json.loads(line)["resourceSpans"]
             for ss in rs["scopeSpans"] for span in ss["spans"]]
    assert 50 == len(spans)
