"""``--processes N``: one schedule, N sending processes, one start instant.

Each worker (a spawned interpreter) takes every N-th request of the schedule (closed loop:
its share of each step's clients), sets up its own export and connection pool, says it is
ready, and waits. Only when every worker is ready does the parent fix the start instant,
so a slow interpreter start never eats into the schedule. ``time.monotonic()`` is
CLOCK_MONOTONIC, one clock for every process on the machine.

Ctrl-C reaches every process of the group: each worker stops itself and sends back what
it measured; the parent ignores the signal and waits for them.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import signal
import time
from collections.abc import Callable
from typing import Any

from llmtrace.load.live import REDRAW_S, SNAPSHOT_FIELDS, LiveLine, Tally
from llmtrace.load.model import RequestResult
from llmtrace.load.prompts import Calibration
from llmtrace.load.runner import LoadSpec, drive, start_export, stop_export

#: From the last worker's "ready" to the first send.
START_DELAY_S = 0.3
#: A worker that is not ready in this long (interpreter start, imports) has failed.
READY_TIMEOUT_S = 120.0


def _worker(spec: LoadSpec, calibration: Calibration, share: tuple[int, int], ready: Any, go: Any, start: Any,
            results: Any, shared: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until the loop takes it over in drive()
    cpu = time.process_time()
    export = start_export(spec)
    try:
        asyncio.run(_warm_up(spec))
        ready.put(share[0])
        go.wait()
        part, interrupted = asyncio.run(drive(spec, calibration, share, start.value, _sharer(shared, share[0])))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which keeps the other workers' results
        part, interrupted = [], f"worker {share[0]} failed: {type(exc).__name__}: {exc}"
    finally:
        stop_export(export)
    results.put((share[0], part, interrupted, time.process_time() - cpu))


def _sharer(shared: Any, worker: int) -> Callable[[Tally], None]:
    """The worker's progress callback: its tally into its slot of the shared array."""
    def share(tally: Tally) -> None:
        shared[worker * SNAPSHOT_FIELDS:(worker + 1) * SNAPSHOT_FIELDS] = tally.snapshot()
    return share


async def _warm_up(spec: LoadSpec) -> None:
    """What the parent's preflight did for the single-process case: the first request of an
    interpreter pays for lazy imports and set-up (resolver, connector, codecs), which must not
    land on the schedule's first sends. A ``GET /v1/models`` is harmless to any server."""
    import aiohttp

    try:
        async with aiohttp.ClientSession() as session, session.get(spec.target.base_url + "/v1/models") as response:
            await response.read()
    except (aiohttp.ClientError, OSError):
        pass  # the parent's preflight already vouched for the server


def run_processes(spec: LoadSpec, calibration: Calibration,
                  live: LiveLine | None = None) -> tuple[list[RequestResult], str | None, float]:
    """Run *spec* over ``spec.processes`` workers; (results, why it ended early, their CPU seconds).
    *live* shows the workers' summed progress."""
    ctx = multiprocessing.get_context("spawn")
    n = spec.processes
    ready, results, go, start = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    shared = ctx.Array("d", n * SNAPSHOT_FIELDS, lock=False)  # one writer per slot
    procs = [ctx.Process(target=_worker, args=(spec, calibration, (k, n), ready, go, start, results, shared),
                         name=f"llmtrace-load-{k}", daemon=True) for k in range(n)]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the workers stop themselves and report
    try:
        for proc in procs:
            proc.start()
        _wait_ready(ready, procs)
        start.value = time.monotonic() + START_DELAY_S
        go.set()
        draw = _drawer(live.progress(start.value), shared, n) if live is not None and live.enabled else None
        return _collect(results, procs, draw)
    finally:
        signal.signal(signal.SIGINT, previous)
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()


def _drawer(progress: Callable[[Tally], None], shared: Any, n: int) -> Callable[[], None]:
    """The parent's redraw: the *n* workers' snapshots summed into one tally."""
    def draw() -> None:
        progress(Tally.merged([tuple(shared[k * SNAPSHOT_FIELDS:(k + 1) * SNAPSHOT_FIELDS]) for k in range(n)]))
    return draw


def _wait_ready(ready: Any, procs: list[Any]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    waiting = len(procs)
    while waiting:
        try:
            ready.get(timeout=0.5)
            waiting -= 1
        except queue.Empty:
            dead = [p.name for p in procs if p.exitcode is not None]
            if dead or time.monotonic() > deadline:
                from llmtrace.errors import LLMTraceError

                raise LLMTraceError(f"load worker process(es) {', '.join(dead) or 'did not start'}: "
                                    "could not start (see the messages above)") from None


def _collect(results: Any, procs: list[Any],
             draw: Callable[[], None] | None) -> tuple[list[RequestResult], str | None, float]:
    out: list[RequestResult] = []
    interrupted: str | None = None
    cpu = 0.0
    pending = len(procs)
    while pending:
        if draw is not None:
            draw()
        try:
            _, part, stopped, part_cpu = results.get(timeout=REDRAW_S)
        except queue.Empty:
            if all(p.exitcode is not None for p in procs) and results.empty():
                interrupted = interrupted or "a worker process died before reporting its results"
                break
            continue
        pending -= 1
        out.extend(part)
        cpu += part_cpu
        interrupted = interrupted or stopped
    out.sort(key=lambda r: r.index)
    return out, interrupted, cpu
