"""Run an ASGI app under uvicorn in a background thread, on a free loopback port."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

#: Model load in the engine process plus uvicorn start-up, seconds.
START_TIMEOUT_S = 180.0


class ServerThread:
    """``with ServerThread(app) as base_url: ...`` — a real uvicorn server over loopback."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://{host}:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="llmtrace-uvicorn", daemon=True)
        self.error: BaseException | None = None

    def _serve(self) -> None:
        try:
            self.server.run(sockets=[self._sock])
        except BaseException as exc:  # noqa: BLE001 - reported to the caller by start()
            self.error = exc

    def start(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if self.error is not None or not self._thread.is_alive():
                raise RuntimeError(f"server failed to start: {self.error!r}")
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start in time")
            time.sleep(0.05)
        return self.base_url

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(60)
        self._sock.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
