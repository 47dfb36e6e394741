"""instrument() across processes: forked workers, idempotency."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_instrument_runs_again_in_a_forked_child(tmp_path: Path) -> None:
    """A worker forked after instrument() gets a fresh handle from instrument() (not the parent's),
    and its spans still reach the inherited exporter."""
    script = f"""
import os, json, llmtrace
from opentelemetry import trace
parent = llmtrace.instrument(exporter="file:{tmp_path}/t.jsonl", gpu="off", metrics=False)
pid = os.fork()
if pid == 0:
    child = llmtrace.instrument(exporter="file:{tmp_path}/t.jsonl", gpu="off", metrics=False)
    with trace.get_tracer("t").start_as_current_span("from-child"):
        pass
    llmtrace.shutdown()
    os._exit(0 if child is not parent else 3)
_, status = os.waitpid(pid, 0)
llmtrace.shutdown()
print(os.waitstatus_to_exitcode(status))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert "0" == out.stdout.strip().splitlines()[-1]
    assert "from-child" in (tmp_path / "t.jsonl").read_text()


def test_instrument_is_idempotent_and_warns_on_new_options(tmp_path: Path) -> None:
    """A second instrument() returns the same handle; different options are ignored with a warning."""
    script = f"""
import llmtrace
a = llmtrace.instrument(exporter="file:{tmp_path}/t.jsonl", gpu="off")
b = llmtrace.instrument(exporter="file:{tmp_path}/t.jsonl", gpu="off")
c = llmtrace.instrument(exporter="none")
print(a is b, a is c)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert "True True" == out.stdout.strip()
    assert 1 == out.stderr.count("already instrumented; new options ignored")
