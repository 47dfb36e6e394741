"""A server in its own process on a loopback port: started, waited for, stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.helpers.servers import free_port

#: Tokenizer, model load in the engine process and uvicorn start-up on a loaded two-core machine.
START_TIMEOUT_S = 240.0


class ServerProcess:
    """``with ServerProcess([...args], log=path) as server: server.base_url`` — the command gets the
    port as ``{port}`` in its arguments; ready once ``/health`` answers 200."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._args = [a.format(port=self.port) for a in args]
        self._env = {**os.environ, **(env or {})}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([sys.executable, *self._args], stdout=log, stderr=subprocess.STDOUT,
                                         env=self._env)
        self.wait_healthy(START_TIMEOUT_S)
        return self

    def health(self) -> dict[str, Any]:
        try:
            return dict(httpx.get(self.base_url + "/health", timeout=5).json())
        except httpx.HTTPError as exc:
            return {"status": f"unreachable: {exc!r}"}

    def wait_healthy(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc is not None and self.proc.poll() is None, f"server exited:\n{self.log.read_text()[-3000:]}"
            health = self.health()
            if health.get("status") == "ok":
                return health
            assert time.monotonic() < deadline, f"server not healthy in {timeout_s} s: {health}"
            time.sleep(0.2)

    def rss_bytes(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (uvicorn shuts down, the engine and the front end flush their telemetry); the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(10)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
