"""Fork safety, with a real ``os.fork()`` in a fresh subprocess.

The sampler reads the one test double, ``RecordedBackend`` (gpu_recorded.py), whose
init/shutdown counters show who holds NVML: the parent must release its reference
before the fork and re-open after it; the child must never use the parent's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, threading, time
    sys.path.insert(0, {here!r})
    from gpu_recorded import RecordedBackend
    from llmtrace.gpu.sampler import get_sampler, start_sampler

    def wait_passes(sampler, n):
        deadline = time.monotonic() + 10
        while sampler.status().passes < n and time.monotonic() < deadline:
            time.sleep(0.005)
        return sampler.status().passes

    backend = RecordedBackend()
    sampler = start_sampler(0.01, backend=backend, environ={{"CUDA_VISIBLE_DEVICES": "0"}},
                            restart_in_child={restart})
    sampler.wait_ready(5)
    wait_passes(sampler, 5)
    before = dict(inits=backend.inits, shutdowns=backend.shutdowns)
    r, w = os.pipe()
    fork_ns = time.monotonic_ns()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        child_sampler = get_sampler()
        out = dict(
            same_object=child_sampler is sampler,
            state=sampler.status().state.value,
            threads=[t.name for t in threading.enumerate()],
            inherited_passes=sampler.status().passes,
            inits_before_fork=before["inits"],
            shutdowns_at_fork=backend.shutdowns,
        )
        if {restart}:
            out["passes_after"] = wait_passes(sampler, 3)
            out["all_after_fork"] = all(s.t_ns > fork_ns for s in sampler.snapshots())
            out["inits_after"] = backend.inits
            sampler.stop()
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    child = json.loads(os.read(r, 65536))
    os.waitpid(pid, 0)
    passes_at_fork = sampler.status().passes
    passes_after = wait_passes(sampler, passes_at_fork + 5)
    parent = dict(before=before, shutdowns=backend.shutdowns, passes_after=passes_after,
                  inits=backend.inits, state=sampler.status().state.value)
    sampler.stop()
    print(json.dumps(dict(child=child, parent=parent)))
    """
)


def _run(restart: bool) -> dict[str, Any]:
    code = SCRIPT.format(here=str(HERE), restart=restart)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert 0 == proc.returncode, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_fork_child_stops_and_parent_reopens_nvml() -> None:
    """Default: the child has a stopped sampler with no thread, no parent data and no
    singleton; the parent released NVML for the fork, re-opened it and keeps sampling."""
    result = _run(restart=False)
    child, parent = result["child"], result["parent"]
    assert "stopped" == child["state"]
    assert not child["same_object"]  # get_sampler() is None in the child
    assert "llmtrace-gpu-sampler" not in child["threads"]
    assert 0 == child["inherited_passes"]
    assert parent["before"]["shutdowns"] + 1 == parent["shutdowns"]
    assert parent["before"]["inits"] + 1 == parent["inits"]
    assert "running" == parent["state"]


def test_fork_child_restarts_with_its_own_nvml_when_asked() -> None:
    """restart_in_child=True: the child initialises NVML itself and samples on its own thread."""
    child = _run(restart=True)["child"]
    assert child["same_object"]
    assert child["all_after_fork"]  # none of the parent's samples
    assert child["passes_after"] >= 3
    assert child["inits_before_fork"] + 1 == child["inits_after"]  # one init of its own
    assert "llmtrace-gpu-sampler" in child["threads"]
