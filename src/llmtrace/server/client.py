"""The API server's side of the engine: a process, two queues and a reader thread.

Outputs from the engine are dispatched to per-request asyncio queues on the
server's event loop. If the engine process dies, every open request ends with
an error and the server says so once — it does not hang.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from llmtrace.server.engine import EngineConfig, run_engine

log = logging.getLogger("llmtrace.server")

#: Seconds to wait for the engine process to load its model.
ENGINE_START_TIMEOUT_S = 120.0


@dataclass
class _Pending:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[tuple[Any, ...]]


class EngineClient:
    """Starts the engine process and routes its outputs to waiting requests."""

    def __init__(self, config: EngineConfig) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter, like vLLM's EngineCore
        self._in: Any = ctx.Queue()
        self._out: Any = ctx.Queue()
        self.process = ctx.Process(target=run_engine, args=(config, self._in, self._out), name="llmtrace-engine",
                                   daemon=True)
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._stats: asyncio.Queue[dict[str, Any]] | None = None
        self._reader: threading.Thread | None = None
        self.dead: str | None = None
        self._stopped = threading.Event()

    def start(self) -> dict[str, Any]:
        self.process.start()
        deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
        while True:
            try:
                kind, payload = self._out.get(timeout=0.5)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise RuntimeError(
                        f"reference engine exited during start-up (code {self.process.exitcode})") from None
                if time.monotonic() > deadline:
                    raise RuntimeError("reference engine did not start in time") from None
        if kind != "ready":
            raise RuntimeError(f"reference engine did not start: {payload}")
        self._reader = threading.Thread(target=self._read, name="llmtrace-engine-reader", daemon=True)
        self._reader.start()
        return dict(payload)

    def _read(self) -> None:
        while True:
            try:
                message = self._out.get(timeout=0.5)
            except Exception:  # noqa: BLE001 - queue.Empty, or EOF when the engine died
                if not self.process.is_alive():
                    self._engine_died()
                    return
                continue
            kind = message[0]
            if kind == "stopped":
                self._stopped.set()
                return
            if kind == "stats":
                if self._stats_waiter is not None:
                    loop, fut = self._stats_waiter
                    loop.call_soon_threadsafe(fut.set_result, message[1])
                continue
            if kind == "error":
                log.error("reference engine: %s", message[1])
                continue
            if kind == "outputs":
                self._dispatch(message[1], message[2])

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

    _stats_waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[dict[str, Any]]] | None = None

    def _engine_died(self) -> None:
        self.dead = f"engine process exited with code {self.process.exitcode}"
        log.error("llmtrace reference server: the %s; failing %d open requests", self.dead, len(self._pending))
        with self._lock:
            pending = list(self._pending.items())
        for request_id, item in pending:
            item.loop.call_soon_threadsafe(item.queue.put_nowait, ("finished", request_id, "error",
                                                                   {"error": self.dead}))

    def submit(self, payload: dict[str, Any]) -> asyncio.Queue[tuple[Any, ...]]:
        """Send a request to the engine; its outputs arrive on the returned queue."""
        if self.dead:
            raise RuntimeError(self.dead)
        request_id = payload.setdefault("request_id", uuid.uuid4().hex)
        out: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        with self._lock:
            self._pending[request_id] = _Pending(asyncio.get_running_loop(), out)
        self._in.put(("add", payload))
        return out

    def release(self, request_id: str, abort: bool) -> None:
        with self._lock:
            self._pending.pop(request_id, None)
        if abort and not self.dead:
            self._in.put(("abort", request_id))

    async def stats(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._stats_waiter = (loop, fut)
        self._in.put(("stats", None))
        return await asyncio.wait_for(fut, timeout=10)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the engine to flush its telemetry and exit; kill it if it does not."""
        if self.process.is_alive():
            self._in.put(("shutdown", None))
            self._stopped.wait(timeout_s)
            self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
