"""OS names of llmtrace's threads (Linux ``/proc/<pid>/task/<tid>/comm``): how ``top -H`` and
``benchmarks/bench_vllm_serve.py`` tell llmtrace's CPU time from the host's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from llmtrace._os_thread import name_os_thread

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")


def _comm(native_id: int | None, pid: str = "self") -> str:
    return Path(f"/proc/{pid}/task/{native_id}/comm").read_text().strip()


def test_a_thread_takes_its_name_cut_to_the_kernels_fifteen_bytes() -> None:
    """The named thread alone changes (the caller keeps its own); a name longer than 15 bytes is
    cut, not refused; a thread not yet started has no OS thread to name."""
    named = threading.Event()
    done = threading.Event()

    def run() -> None:
        name_os_thread("llmtrace-a-name-too-long")
        named.set()
        done.wait(10)

    worker = threading.Thread(target=run)
    assert not name_os_thread("llmtrace-x", worker)
    mine = _comm(threading.get_native_id())
    worker.start()
    try:
        assert named.wait(10)
        assert "llmtrace-a-name" == _comm(worker.native_id)
        assert mine == _comm(threading.get_native_id())
        assert name_os_thread("llmtrace-other", worker) and "llmtrace-other" == _comm(worker.native_id)
    finally:
        done.set()
        worker.join(10)


_PROCESS = """
import json, os, sys, threading, time, llmtrace
from pathlib import Path
from opentelemetry import trace
threading.Thread(target=time.sleep, args=(30,), name="OtelBatchSpanRecordProcessor", daemon=True).start()
llmtrace.instrument(exporter="file:" + sys.argv[1], gpu="off")
with llmtrace.start_request("r1", model="m") as request:
    request.token()
llmtrace.flush()
names = sorted(Path(f"/proc/self/task/{t.native_id}/comm").read_text().strip() for t in threading.enumerate())
print(json.dumps(names))
"""


def test_llmtraces_background_threads_carry_its_names(tmp_path: Path) -> None:
    """After instrument() and one request: the span builder, the span exporter and the metric reader
    llmtrace started run as ``llmtrace-*`` threads; the main thread keeps the process's name, and an
    SDK-named thread that was running before (a host's) keeps its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LLMTRACE_"))}
    done = subprocess.run([sys.executable, "-c", _PROCESS, str(tmp_path / "t.jsonl")], env=env, text=True,
                          capture_output=True, timeout=120, check=False)
    assert 0 == done.returncode, done.stderr[-3000:]
    names = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"llmtrace-build", "llmtrace-export", "llmtrace-metric"} <= set(names)
    assert 1 == names.count("llmtrace-export")  # the host's thread of the same SDK name is left alone
    assert sum(not name.startswith("llmtrace-") for name in names) >= 2  # the main thread and the host's
