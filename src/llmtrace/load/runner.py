"""Drive a load: preflight the server, send on schedule (or keep N clients busy), collect results.

Open loop: the schedule is fixed before the first send; each request is its own task, started
a little ahead of its intended time to build its body, which then waits for that time
(:func:`until`) and sends, never waiting for an answer, so a stalled server shows in every
request scheduled during the stall. Closed loop: each step
keeps ``concurrency`` clients busy for its duration.

Whatever ends a run — its end, Ctrl-C, an unexpected error — the results measured so far
are returned (requests still open count as ``cancelled``). ``processes > 1`` splits the
schedule round-robin over worker processes (:mod:`llmtrace.load.workers`).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from llmtrace.errors import LLMTraceError
from llmtrace.load.arrivals import CHAOS_CYCLE, Lengths, chaos_for
from llmtrace.load.client import Client, ProtocolError, Target, probe, probe_stream
from llmtrace.load.live import REDRAW_S, LiveLine, Tally
from llmtrace.load.model import Chaos, PlannedRequest, RequestResult, RunResult, SelfCheck, Step
from llmtrace.load.prompts import (
    CHECK_TOKENS,
    LEAD,
    PIECES,
    Calibration,
    PromptMaker,
    fit_calibration,
    piece_probes,
    pool_probe,
    uniform,
)
from llmtrace.load.replay import MOONCAKE_BLOCK_TOKENS
from llmtrace.load.telemetry import ClientSpans

#: Seconds between the preflight and the first send (worker processes start inside it).
START_DELAY_S = 0.2
#: Preflight requests must answer within this; a server that cannot is not ready for load.
PREFLIGHT_TIMEOUT_S = 60.0
#: Calibration probes in flight at once (a server batches them; one at a time would take a
#: round trip each).
PROBES_AT_ONCE = 8
#: An open-loop request's task starts this long before its send time, to build its body and
#: get its task running while there is time: at the moment itself only the send is left.
PREPARE_AHEAD_S = 0.005
#: asyncio's timers fire up to 1 ms late (epoll waits whole milliseconds, rounded up), so the
#: last stretch before a send is waited out yielding to the loop rather than sleeping. Bounded,
#: so a long gap between sends sleeps and never keeps a core busy; yielding, so answers that
#: arrive meanwhile are still read on time.
SPIN_S = 0.0012


@dataclass(frozen=True)
class LoadSpec:
    """One run: where, what schedule (or closed-loop steps and lengths), how."""

    target: Target
    profile: str
    steps: tuple[Step, ...]
    #: The open-loop or replay schedule; None for closed loop (``steps`` carry concurrency).
    planned: tuple[PlannedRequest, ...] | None = None
    lengths: Lengths | None = None
    chaos_share: float = 0.0
    chaos_kinds: tuple[Chaos, ...] = CHAOS_CYCLE
    max_connections: int = 0
    processes: int = 1
    #: After the last send, how long answers still open are waited for.
    drain_s: float = 60.0
    seed: int = 0
    calibrate: bool = True
    #: Make a CLIENT span per request.
    traces: bool = True
    #: Set up llmtrace's export in the sending process(es); False when the host process has
    #: already called llmtrace.instrument() (the demo, which serves and loads in one process).
    export: bool = True
    #: The trace file (None: llmtrace's configured exporters; see telemetry.start_export).
    traces_file: str | None = None
    run_id: str = ""
    #: Tokens per shared prefix block (``PlannedRequest.prefix_blocks``): Mooncake's 512 by default.
    prefix_block_tokens: int = MOONCAKE_BLOCK_TOKENS

    @property
    def closed_loop(self) -> bool:
        return self.planned is None


def _one_line(url: str, exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect to {url}: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, TimeoutError):
        return f"{url} did not answer a 1-token request within {PREFLIGHT_TIMEOUT_S:g}s"
    if isinstance(exc, aiohttp.InvalidURL):
        return f"{url} is not a valid URL"
    return f"{url}: {exc}"


async def preflight(target: Target, calibrate: bool) -> tuple[Target, Calibration, list[str]]:
    """Check that *target* answers like an OpenAI server, learn its model name, calibrate prompts."""
    warnings: list[str] = []
    calibration = Calibration()
    timeout = aiohttp.ClientTimeout(total=PREFLIGHT_TIMEOUT_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            if not target.model:
                target = replace(target, model=await _served_model(session, target.base_url))
            base = _prompt_tokens(await probe(session, target, LEAD))
            if calibrate:
                calibration, warning = await _calibrate(session, target, base)
                warnings += [warning] if warning else []
            if target.stream:
                await probe_stream(session, target, LEAD)
    except (aiohttp.ClientError, TimeoutError, ProtocolError, OSError) as exc:
        raise LLMTraceError(_one_line(target.base_url, exc)) from None
    return target, calibration, warnings


def _prompt_tokens(answer: dict[str, Any]) -> int | None:
    usage = answer.get("usage")
    count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return count if isinstance(count, int) else None


async def _calibrate(session: aiohttp.ClientSession, target: Target,
                     base: int | None) -> tuple[Calibration, str | None]:
    """The pieces' costs in the server's count (:mod:`llmtrace.load.prompts`), and a warning
    when prompts cannot be sized exactly."""
    uncounted = "the server reports no usable usage.prompt_tokens: prompts assume 1 token per word"
    if base is None:
        return Calibration(), uncounted
    if _prompt_tokens(await probe(session, target, pool_probe())) == base + len(PIECES):
        return uniform(base), None
    limit = asyncio.Semaphore(PROBES_AT_ONCE)

    async def count(text: str) -> int | None:
        async with limit:
            return _prompt_tokens(await probe(session, target, text))

    counts = await asyncio.gather(*(count(text) for text in piece_probes()))
    calibration = fit_calibration(base, [c if c is not None else 0 for c in counts])
    if not calibration.measured:
        return calibration, uncounted
    check = _prompt_tokens(await probe(session, target, PromptMaker(calibration).prompt(0, CHECK_TOKENS)))
    if check != CHECK_TOKENS:
        return calibration, (f"a {CHECK_TOKENS}-token prompt came to {check} tokens in the server's count: its "
                             "tokenizer does not add words up one by one, so prompt lengths are approximate")
    return calibration, None


async def _served_model(session: aiohttp.ClientSession, base_url: str) -> str:
    """The first model of ``GET /v1/models``, or "" (the request then names none)."""
    try:
        async with session.get(base_url + "/v1/models") as response:
            if response.status != 200:
                return ""
            data = (await response.json(content_type=None)).get("data") or []
            return str(data[0].get("id", "")) if data and isinstance(data[0], dict) else ""
    except (aiohttp.ClientResponseError, ValueError, AttributeError):
        return ""


@dataclass
class _Driver:
    """One process's share of a run."""

    spec: LoadSpec
    client: Client
    start: float
    share: tuple[int, int]
    tally: Tally
    results: list[RequestResult]

    def _step(self, index: int) -> Step:
        return self.spec.steps[min(index, len(self.spec.steps) - 1)]

    def _record(self, task: asyncio.Task[RequestResult]) -> None:
        if not task.cancelled() and task.exception() is None:
            result = task.result()
            self.results.append(result)
            self.tally.add(result)

    async def open_loop(self, inflight: set[asyncio.Task[RequestResult]]) -> None:
        assert self.spec.planned is not None
        k, n = self.share
        for index in range(k, len(self.spec.planned), n):
            planned = self.spec.planned[index]
            intended = self.start + planned.at_s
            delay = intended - PREPARE_AHEAD_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self._send_at(index, planned, intended))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            task.add_done_callback(self._record)

    async def _send_at(self, index: int, planned: PlannedRequest, intended: float) -> RequestResult:
        """Build the request, wait for its moment, send it: one task, so nothing is left between
        the wake-up and the send but the send."""
        prepared = self.client.prepare(index, planned, intended)
        await until(intended)
        self.tally.sent += 1
        step = self._step(planned.step)
        return await self.client.send(index, planned, intended, step.label, step.qps, prepared=prepared)

    async def closed_loop(self, inflight: set[asyncio.Task[RequestResult]]) -> None:
        assert self.spec.lengths is not None
        k, n = self.share
        counter = itertools.count()
        rng = random.Random(self.spec.seed * 1000 + k)
        for step in self.spec.steps:
            assert step.concurrency is not None
            clients = step.concurrency // n + (1 if k < step.concurrency % n else 0)
            ends = self.start + step.start_s + step.duration_s
            delay = self.start + step.start_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await asyncio.gather(*(self._client_loop(step, ends, counter, rng, inflight) for _ in range(clients)))

    async def _client_loop(self, step: Step, ends: float, counter: itertools.count[int], rng: random.Random,
                           inflight: set[asyncio.Task[RequestResult]]) -> None:
        assert self.spec.lengths is not None
        k, n = self.share
        share = self.spec.chaos_share
        while (now := time.monotonic()) < ends:
            number = next(counter)
            index = number * n + k
            chaos = chaos_for(number, share, self.spec.chaos_kinds)
            input_tokens, output_tokens = self.spec.lengths.draw(rng)
            planned = PlannedRequest(now - self.start, input_tokens, output_tokens, step.index, chaos=chaos)
            task = asyncio.create_task(self.client.send(index, planned, now, step.label, None, step.concurrency))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            task.add_done_callback(self._record)
            self.tally.sent += 1
            await asyncio.wait({task})


async def drive(spec: LoadSpec, calibration: Calibration, share: tuple[int, int], start: float,
                progress: Callable[[Tally], None] | None = None) -> tuple[list[RequestResult], str | None]:
    """Send this process's share; returns its results and why it stopped early (None: it did not).
    *progress* is called with the running tally every :data:`~llmtrace.load.live.REDRAW_S`, also
    while nothing is sent (a stalled server, the drain at the end), and once more at the end."""
    results: list[RequestResult] = []
    tally = Tally()
    interrupted: str | None = None
    inflight: set[asyncio.Task[RequestResult]] = set()
    prompts = PromptMaker(calibration, seed=spec.seed, block_tokens=spec.prefix_block_tokens)
    loop = asyncio.get_running_loop()
    ticker = asyncio.create_task(_tick(progress, tally)) if progress is not None else None
    async with Client(spec.target, prompts, ClientSpans(spec.traces), max_connections=spec.max_connections,
                      run_id=spec.run_id, profile=spec.profile) as client:
        driver = _Driver(spec, client, start, share, tally, results)
        main = asyncio.create_task(driver.closed_loop(inflight) if spec.closed_loop else driver.open_loop(inflight))

        def on_interrupt() -> None:
            nonlocal interrupted
            interrupted = "interrupted (Ctrl-C)"
            main.cancel()
            for task in list(inflight):
                task.cancel()

        handles_sigint = _on_sigint(loop, on_interrupt)
        try:
            await main
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - the results so far are reported, with the reason
            interrupted = f"stopped by {type(exc).__name__}: {exc}"
        finally:
            if handles_sigint:
                loop.remove_signal_handler(signal.SIGINT)
        if inflight:
            _, late = await asyncio.wait(set(inflight), timeout=spec.drain_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
    if ticker is not None and progress is not None:
        ticker.cancel()
        progress(tally)
    results.sort(key=lambda r: r.index)
    return results, interrupted


async def until(when: float) -> None:
    """Return at ``time.monotonic()`` *when*, to within a loop iteration (not a timer's millisecond)."""
    loop = asyncio.get_running_loop()
    delay = when - SPIN_S - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)
    while loop.time() < when:
        await asyncio.sleep(0)


async def _tick(progress: Callable[[Tally], None], tally: Tally) -> None:
    while True:
        progress(tally)
        await asyncio.sleep(REDRAW_S)


def _on_sigint(loop: asyncio.AbstractEventLoop, handler: Callable[[], None]) -> bool:
    """Ctrl-C ends the run with its results; only the main thread can take the signal."""
    try:
        loop.add_signal_handler(signal.SIGINT, handler)
    except (RuntimeError, ValueError, NotImplementedError):
        return False
    return True


def start_export(spec: LoadSpec) -> bool:
    if not (spec.traces and spec.export):
        return False
    from llmtrace.load.telemetry import start_export

    start_export(spec.traces_file)
    return True


def stop_export(export: bool) -> None:
    if export:
        import llmtrace

        llmtrace.shutdown(timeout_s=10.0)


def run_load(spec: LoadSpec, *, live: bool | None = None,
             on_preflight: Callable[[Target, Calibration], None] | None = None,
             calibration: Calibration | None = None, own_process: bool = False) -> RunResult:
    """Run *spec* to its end (or Ctrl-C) and return every result measured.

    With a *calibration* given (the caller knows the server's tokenizer) no preflight request
    is sent: ``spec.target`` must then name its model. *own_process* sends from a worker
    process even when ``spec.processes`` is 1 (the caller's process is busy serving)."""
    spec = replace(spec, run_id=spec.run_id or uuid.uuid4().hex[:12])
    if calibration is None:
        target, calibration, warnings = asyncio.run(preflight(spec.target, spec.calibrate))
    else:
        target, warnings = spec.target, []
    spec = replace(spec, target=target)
    if on_preflight is not None:
        on_preflight(target, calibration)
    cpu0, wall0 = time.process_time(), time.monotonic()
    line = LiveLine(spec.steps, enabled=live)
    if spec.processes == 1 and not own_process:
        export = start_export(spec)
        start = time.monotonic() + START_DELAY_S
        try:
            results, interrupted = asyncio.run(drive(spec, calibration, (0, 1), start,
                                                     line.progress(start) if line.enabled else None))
        finally:
            line.close()
            stop_export(export)
        worker_cpu = 0.0
    else:
        from llmtrace.load.workers import run_processes

        try:
            results, interrupted, worker_cpu = run_processes(spec, calibration, line)
        finally:
            line.close()
    wall = time.monotonic() - wall0
    cpu = time.process_time() - cpu0 + worker_cpu
    return RunResult(url=target.base_url, endpoint=target.path, profile=spec.profile, steps=spec.steps,
                     results=tuple(results), wall_s=wall, self_check=_self_check(results, cpu, wall, spec.processes),
                     interrupted=interrupted, tokens_per_word=calibration.tokens_per_word if calibration.measured
                     else None, warnings=tuple(warnings))


def _self_check(results: list[RequestResult], cpu_s: float, wall_s: float, processes: int) -> SelfCheck:
    lags = sorted(r.send_lag_s for r in results)
    if not lags:
        return SelfCheck(0.0, 0.0, 0.0, cpu_s, wall_s, processes)
    p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
    return SelfCheck(send_lag_p50_s=lags[len(lags) // 2], send_lag_p99_s=p99, send_lag_max_s=lags[-1], cpu_s=cpu_s,
                     wall_s=wall_s, processes=processes)
