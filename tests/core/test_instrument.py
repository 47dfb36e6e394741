"""instrument() across processes: forked workers, idempotency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
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


_TWO_PROCESSES = """
import json, os, llmtrace
from opentelemetry import trace

def spans(name):
    with trace.get_tracer("t").start_as_current_span(name):
        pass
    engine = llmtrace.EngineTracer("dp0")  # its spans go through the span builder's own emitter
    with engine.step():
        pass
    engine.flush_window()
    llmtrace.flush()

llmtrace.instrument(exporter="file:{path}", gpu="off", metrics=False)
spans("parent")
pid = os.fork()
if pid == 0:
    llmtrace.instrument(exporter="file:{path}", gpu="off", metrics=False, process_role="engine")
    spans("child")
    llmtrace.shutdown()
    os._exit(0)
os.waitpid(pid, 0)
llmtrace.shutdown()
print(json.dumps({{"parent": os.getpid(), "child": pid}}))
"""


def _identities(path: Path) -> dict[str, set[tuple[str, str]]]:
    """``{span name: {(process.pid, service.instance.id), ...}}`` read from an OTLP-JSON-lines file."""
    found: dict[str, set[tuple[str, str]]] = {}
    for line in path.read_text().splitlines():
        for resource_spans in json.loads(line).get("resourceSpans", []):
            values = {a["key"]: next(iter(a["value"].values())) for a in resource_spans["resource"]["attributes"]}
            identity = (str(values.get("process.pid")), str(values.get("service.instance.id")))
            for scope in resource_spans["scopeSpans"]:
                for span in scope["spans"]:
                    found.setdefault(span["name"], set()).add(identity)
    return found


def _run_two_processes(tmp_path: Path, env: dict[str, str]) -> tuple[dict[str, int], dict[str, set[tuple[str, str]]]]:
    script = _TWO_PROCESSES.format(path=tmp_path / "t.jsonl")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True,
                         env={**os.environ, **env})
    return json.loads(out.stdout.strip().splitlines()[-1]), _identities(tmp_path / "t.jsonl")


def test_a_forked_child_has_its_own_pid_and_instance_id(tmp_path: Path) -> None:
    """process.pid and service.instance.id (a random UUID v4 per process) tell a forked engine
    process from the API server it was forked from, on every span either process emits."""
    pids, found = _run_two_processes(tmp_path, {"OTEL_RESOURCE_ATTRIBUTES": ""})
    ((parent_pid, parent_id),) = found["parent"]
    ((child_pid, child_id),) = found["child"]
    assert (str(pids["parent"]), str(pids["child"])) == (parent_pid, child_pid)
    assert (4, 4) == (uuid.UUID(parent_id).version, uuid.UUID(child_id).version)
    assert parent_id != child_id
    assert {(parent_pid, parent_id), (child_pid, child_id)} == found["llm.step"]


def test_an_instance_id_from_otel_resource_attributes_wins(tmp_path: Path) -> None:
    """A service.instance.id set in OTEL_RESOURCE_ATTRIBUTES is kept, in a forked child too;
    process.pid stays each process's own."""
    pids, found = _run_two_processes(tmp_path, {"OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=replica-7"})
    assert {(str(pids["parent"]), "replica-7")} == found["parent"]
    assert {(str(pids["child"]), "replica-7")} == found["child"]


_CYCLES = """
import json, llmtrace
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from llmtrace import _safety

reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))  # llmtrace joins the host's
counts = [len(_safety._error_listeners)]
for _ in range(3):
    llmtrace.instrument(exporter="none", gpu="off")
    counts.append(len(_safety._error_listeners))
    llmtrace.uninstrument()
llmtrace.instrument(exporter="none", gpu="off")
_safety.record_error("test.cycles")
errors = [point.value for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
          for metric in sm.metrics if metric.name == "llmtrace.instrumentation.errors"
          for point in metric.data.data_points if point.attributes.get("site") == "test.cycles"]
llmtrace.shutdown()
counts.append(len(_safety._error_listeners))
print(json.dumps({"listeners": counts, "errors": errors}))
"""


def test_instrument_cycles_keep_one_error_listener() -> None:
    """instrument() / uninstrument() cycles keep exactly one error listener (the runtime's
    error counter), so an internal error is counted once, not once per cycle; shutdown() removes it."""
    out = subprocess.run([sys.executable, "-c", _CYCLES], capture_output=True, text=True, timeout=60, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"listeners": [0, 1, 1, 1, 0], "errors": [1]} == found


_REINSTRUMENT = """
import json, llmtrace
from llmtrace import _runtime, testing

seen = []
for cycle in range(3):
    with testing.capture() as captured:
        http = _runtime.http_metrics()
        ended = http.started("GET", "http") if cycle else None  # the first cycle serves nothing
        points = captured.metrics().get("http.server.active_requests", [])
        seen.append(sorted(point.value for point in points))
        if ended is not None:
            http.request_done(ended, 0.01, "GET", "http", 200, "/x", "1.1", None)
    llmtrace.uninstrument()
print(json.dumps({"active": seen}))
"""


def test_metrics_made_again_by_a_later_instrument_are_observed() -> None:
    """instrument() / uninstrument() / instrument() in one process (the export providers are kept):
    http.server.active_requests counts the calls of the current instrumentation. The SDK keeps
    the first instrument of a name on a meter with its callbacks, so metric objects made afresh
    per instrument() were never observed (the first cycle's were, with what they last held)."""
    out = subprocess.run([sys.executable, "-c", _REINSTRUMENT], capture_output=True, text=True, timeout=60,
                         check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"active": [[], [1], [1]]} == found
