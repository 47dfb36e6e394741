"""The API server's side of the engine: the engine process, its two channels, and its supervisor.

Outputs from the engine are dispatched to per-request asyncio queues on the server's
event loop by one thread, which is also the engine's supervisor. The engine holds the
only write end of its output pipe, so its death — a crash, an OOM kill, a SIGKILL — is an
end-of-file here at once: every open request fails on the spot (none waits for a timeout),
and the supervisor starts a new engine process after a backoff. Restarts are bounded
(:class:`RestartPolicy`); each is logged and counted in ``llm.engine.restarts``. While the
engine is down, new requests are refused with :class:`EngineUnavailable` (a 503), never
queued towards a process that is not there.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from llmtrace import semconv
from llmtrace.server.engine import EngineConfig, run_engine

log = logging.getLogger("llmtrace.server")

#: Seconds to wait for the engine process to load its model.
ENGINE_START_TIMEOUT_S = 120.0
#: Seconds a shut-down engine gets to flush its telemetry before it is killed.
ENGINE_STOP_TIMEOUT_S = 30.0

#: Engine states, as ``/health`` reports them.
STARTING, READY, RESTARTING, FAILED, STOPPED = "starting", "ready", "restarting", "failed", "stopped"


class EngineUnavailable(RuntimeError):
    """The engine process is not serving (restarting, given up, or stopped)."""


@dataclass(frozen=True)
class RestartPolicy:
    """How the supervisor restarts a dead engine: at most *max_restarts* within *window_s*
    (an engine that keeps dying is a bug or a broken machine, not something to retry
    forever), each after a backoff that doubles from *backoff_s* up to *max_backoff_s*."""

    max_restarts: int = 5
    window_s: float = 300.0
    backoff_s: float = 0.5
    max_backoff_s: float = 10.0

    def delay_s(self, recent_restarts: int) -> float:
        return float(min(self.max_backoff_s, self.backoff_s * 2**recent_restarts))


@dataclass
class _Pending:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[tuple[Any, ...]]


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class _EngineProcess:
    """One engine process: its inbox (a queue, so that sending never blocks the event loop) and
    its outbox (a pipe whose only write end is in the engine)."""

    def __init__(self, config: EngineConfig) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter, like vLLM's EngineCore
        self.inbox: Any = ctx.Queue()
        self.outbox, writer = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=run_engine, args=(config, self.inbox, writer), name="llmtrace-engine",
                                   daemon=True)
        self.process.start()
        writer.close()  # the engine's copy is the only one left: its death reads as end-of-file

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while not self.outbox.poll(0.5):
            if not self.process.is_alive():
                raise RuntimeError(f"reference engine {_exit_reason(self.process.exitcode)} during start-up")
            if time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError("reference engine did not start in time")
        try:
            kind, payload = self.outbox.recv()
        except EOFError:
            self.process.join(5)
            raise RuntimeError(f"reference engine {_exit_reason(self.process.exitcode)} during start-up") from None
        if kind != "ready":
            raise RuntimeError(f"reference engine did not start: {payload}")
        return dict(payload)

    def exit_reason(self) -> str:
        self.process.join(5)
        if self.process.is_alive():  # it closed its pipe yet lives on: it serves no one, so it goes
            self.process.kill()
            self.process.join(5)
        return _exit_reason(self.process.exitcode)

    def close(self) -> None:
        self.outbox.close()
        self.inbox.cancel_join_thread()  # a dead reader must not make this process wait at exit
        self.inbox.close()


class EngineClient:
    """Starts the engine process, routes its outputs to waiting requests, restarts it when it dies."""

    def __init__(self, config: EngineConfig, policy: RestartPolicy | None = None) -> None:
        from opentelemetry import metrics

        self.config = config
        self.policy = policy or RestartPolicy()
        self.state = STARTING
        self.restarts = 0
        self.last_exit: str | None = None
        self._engine: _EngineProcess | None = None
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._stats_waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[dict[str, Any]]] | None = None
        self._supervisor: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._restart_times: list[float] = []
        # The OTel API's meter: it binds to whatever MeterProvider the process has (llmtrace's, the host's).
        self._restart_counter = metrics.get_meter("llmtrace.server").create_counter(
            semconv.METRIC_ENGINE_RESTARTS, unit="{restart}",
            description="Engine processes started again after one died")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> dict[str, Any]:
        """Start the engine and wait until its model is loaded; raises if it cannot start."""
        self._engine = _EngineProcess(self.config)
        ready = self._engine.wait_ready(ENGINE_START_TIMEOUT_S)
        self.state = READY
        self._supervisor = threading.Thread(target=self._supervise, name="llmtrace-engine-supervisor", daemon=True)
        self._supervisor.start()
        return ready

    def stop(self, timeout_s: float = ENGINE_STOP_TIMEOUT_S) -> None:
        """Ask the engine to flush its telemetry and exit; kill it if it does not."""
        self._stopping.set()
        engine = self._engine
        if engine is not None and engine.process.is_alive():
            engine.inbox.put(("shutdown", None))
            self._stopped.wait(timeout_s)
            engine.process.join(timeout_s)
            if engine.process.is_alive():
                engine.process.kill()
                engine.process.join(5)
        self.state = STOPPED
        if self._supervisor is not None:
            self._supervisor.join(timeout_s)

    @property
    def process(self) -> Any:
        """The current engine process (``multiprocessing.Process``)."""
        return self._engine.process if self._engine is not None else None

    def health(self) -> dict[str, Any]:
        engine = self._engine
        return {"state": self.state, "pid": engine.process.pid if engine is not None else None,
                "restarts": self.restarts, "last_exit": self.last_exit}

    # ------------------------------------------------------------------ supervisor
    def _supervise(self) -> None:
        while self._engine is not None:
            engine = self._engine
            if self._read(engine):
                return  # shut down on request
            if self._stopping.is_set():  # it died while shutting down: nothing more will come
                self._stopped.set()
                return
            self._engine_died(engine)
            if not self._restart():
                return

    def _read(self, engine: _EngineProcess) -> bool:
        """Dispatch the engine's outputs until it stops (True) or dies (False)."""
        while True:
            try:
                message = engine.outbox.recv()
            except (EOFError, OSError):
                return False
            kind = message[0]
            if kind == "outputs":
                self._dispatch(message[1], message[2])
            elif kind == "stats":
                waiter, self._stats_waiter = self._stats_waiter, None
                if waiter is not None:
                    waiter[0].call_soon_threadsafe(_resolve, waiter[1], message[1], None)
            elif kind == "error":
                log.error("reference engine: %s", message[1])
            elif kind == "stopped":
                self._stopped.set()
                return True

    def _dispatch(self, tokens: list[tuple[str, int]], finished: list[tuple[str, str, dict[str, Any]]]) -> None:
        """Route one step's outputs to the waiting requests (one event-loop wake-up per request)."""
        per_request: dict[str, list[tuple[Any, ...]]] = {}
        for request_id, token in tokens:
            per_request.setdefault(request_id, []).append(("token", request_id, token))
        for request_id, reason, summary in finished:
            per_request.setdefault(request_id, []).append(("finished", request_id, reason, summary))
        with self._lock:
            targets = [(self._pending.get(rid), items) for rid, items in per_request.items()]
        for pending, items in targets:
            if pending is not None:
                for item in items:
                    pending.loop.call_soon_threadsafe(pending.queue.put_nowait, item)

    def _engine_died(self, engine: _EngineProcess) -> None:
        """Fail every open request now, and refuse new ones until an engine is back."""
        with self._lock:  # first: no request may be sent to the closed inbox below
            self.state = RESTARTING
            pending, self._pending = self._pending, {}
        self.last_exit = f"engine process (pid {engine.process.pid}) {engine.exit_reason()}"
        engine.close()
        log.error("llmtrace reference server: the %s; failing %d open requests", self.last_exit, len(pending))
        failure = {"error": f"the {self.last_exit}; the server is restarting it", "status": 503}
        for request_id, item in pending.items():
            item.loop.call_soon_threadsafe(item.queue.put_nowait, ("finished", request_id, "error", failure))
        waiter, self._stats_waiter = self._stats_waiter, None
        if waiter is not None:
            waiter[0].call_soon_threadsafe(_resolve, waiter[1], None, EngineUnavailable(self.last_exit))

    def _restart(self) -> bool:
        """Start engines until one is ready (True), the policy's budget is spent, or the server stops."""
        while not self._stopping.is_set():
            now = time.monotonic()
            self._restart_times = [t for t in self._restart_times if now - t < self.policy.window_s]
            if len(self._restart_times) >= self.policy.max_restarts:
                self.state = FAILED
                log.error("llmtrace reference server: the engine died %d times in %.0f s; not restarting it again "
                          "(the server answers 503 until it is restarted)", len(self._restart_times),
                          self.policy.window_s)
                return False
            if self._stopping.wait(self.policy.delay_s(len(self._restart_times))):
                return False
            self._restart_times.append(time.monotonic())
            self.restarts += 1
            self._restart_counter.add(1, {semconv.LLM_ENGINE_ID: self.config.engine_id})
            try:
                engine = _EngineProcess(self.config)
                ready = engine.wait_ready(ENGINE_START_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - a failed start is logged and counts against the budget
                log.error("llmtrace reference server: engine restart %d failed: %s", self.restarts, exc)
                continue
            if self._stopping.is_set():  # the server stopped while this engine loaded
                engine.process.kill()
                return False
            with self._lock:
                self._engine = engine
                self.state = READY
            log.warning("llmtrace reference server: engine restarted (restart %d, pid %s)", self.restarts,
                        ready.get("pid"))
            return True
        return False

    # ------------------------------------------------------------------ requests
    def submit(self, payload: dict[str, Any]) -> asyncio.Queue[tuple[Any, ...]]:
        """Send a request to the engine; its outputs arrive on the returned queue."""
        request_id = payload.setdefault("request_id", uuid.uuid4().hex)
        out: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        with self._lock:  # one lock with _engine_died: a request is either refused or failed, never lost
            if self.state != READY or self._engine is None:
                raise EngineUnavailable(f"the engine is {self.state}" + (f": the {self.last_exit}"
                                                                         if self.last_exit else ""))
            self._pending[request_id] = _Pending(asyncio.get_running_loop(), out)
            self._engine.inbox.put(("add", payload))
        return out

    def finish(self, request_id: str, reason: str) -> None:
        """The front end ended the request (a stop sequence in the text): the engine frees it and reports back."""
        self._send(("finish", (request_id, reason)))

    def release(self, request_id: str, abort: bool) -> None:
        with self._lock:
            self._pending.pop(request_id, None)
        if abort:
            self._send(("abort", request_id))

    def _send(self, message: tuple[str, Any]) -> None:
        with self._lock:
            if self.state == READY and self._engine is not None:
                self._engine.inbox.put(message)

    async def stats(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        with self._lock:
            if self.state != READY or self._engine is None:
                raise EngineUnavailable(f"the engine is {self.state}")
            self._stats_waiter = (loop, fut)
            self._engine.inbox.put(("stats", None))
        return await asyncio.wait_for(fut, timeout=10)


def _resolve(fut: asyncio.Future[dict[str, Any]], result: dict[str, Any] | None,
             error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result or {})
