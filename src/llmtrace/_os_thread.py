"""Operating-system names for llmtrace's threads, so that ``top -H``, ``ps -L``, py-spy and
``/proc/<pid>/task/*/comm`` tell them apart from the host's.

CPython before 3.14 leaves a thread's OS name that of its process, so every thread of a vLLM
EngineCore reads ``VLLM::EngineCore``. llmtrace's background threads (the span builder, the span
and metric exporters, the GPU sampler, the spill writer) take ``llmtrace-*`` names instead: an
operator sees what they cost, exactly (the kernel's per-thread CPU time), and
``benchmarks/bench_vllm_serve.py`` measures them so. Linux only (``/proc/self/task/<tid>/comm``,
15 bytes); elsewhere, or where ``/proc`` is read-only, nothing happens. llmtrace's own threads
name themselves as they start (after ``fork()`` too); the SDK's exporter threads are named once,
when ``instrument()`` builds the providers, and those the SDK restarts in a forked child keep the
process's name.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

#: The kernel keeps 15 bytes of a thread's name.
MAX_NAME = 15
#: OpenTelemetry SDK threads that llmtrace's own providers start, by their Python names.
SDK_THREADS = {
    "OtelBatchSpanRecordProcessor": "llmtrace-export",
    "OtelPeriodicExportingMetricReader": "llmtrace-metric",
}


def name_os_thread(name: str, thread: threading.Thread | None = None) -> bool:
    """Give *thread* (default: the calling thread) the OS name *name* (cut to 15 bytes); whether
    the name was set."""
    native_id = (thread or threading.current_thread()).native_id
    if native_id is None:  # not started
        return False
    try:
        with open(f"/proc/self/task/{native_id}/comm", "w") as comm:
            comm.write(name[:MAX_NAME])
    except OSError:
        return False
    return True


def name_sdk_threads(started_after: Iterable[threading.Thread]) -> None:
    """Name the OpenTelemetry SDK threads started since *started_after* was taken (those of the
    providers llmtrace just built, not the host's)."""
    before = set(started_after)
    for thread in threading.enumerate():
        if thread not in before and (name := SDK_THREADS.get(thread.name)) is not None:
            name_os_thread(name, thread)
