"""Start ``vllm serve`` in a subprocess, send a burst of concurrent streaming requests, stop it.

Stdlib only (urllib + threads): shared by the CPU test (fake executor) and
``scripts/vllm-gpu-check`` (a real dummy-weight model on a GPU).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: max_tokens of a request whose client disconnects: long enough that it is still decoding when
#: the client goes away (else it may finish first and there is nothing to abort).
ABORT_MAX_TOKENS = 100
#: How long vLLM gets to start (model load + torch import on a small machine).
START_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start(model: str, *, env: dict[str, str], log_path: Path, extra_args: list[str] | None = None,
          timeout_s: float = START_TIMEOUT_S) -> Server:
    """``vllm serve MODEL`` on a free port; returns once ``/health`` answers (raises on failure)."""
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, "--port", str(port),
               "--host", "127.0.0.1", "--served-model-name", "tiny", *(extra_args or [])]
    return start_command(command, port, env=env, log_path=log_path, timeout_s=timeout_s, what="vllm serve")


def start_command(command: list[str], port: int, *, env: dict[str, str], log_path: Path,
                  timeout_s: float = START_TIMEOUT_S, what: str = "the server") -> Server:
    """Run *command* (a server listening on *port*); returns once ``/health`` answers (raises on failure)."""
    with log_path.open("wb") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(process, port, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.base + "/health", timeout=2) as response:
                if response.status == 200:
                    return server
        except urllib.error.HTTPError as exc:
            exc.close()  # not ready yet; its connection closed now, not by the garbage collector
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    stop(server)
    raise RuntimeError(f"{what} did not become healthy in {timeout_s:.0f}s:\n{server.log_tail()}")


def stop(server: Server, timeout_s: float = 60.0) -> int:
    """SIGINT (vLLM's clean shutdown: atexit handlers flush llmtrace), then SIGKILL if it hangs."""
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGINT)
        try:
            server.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(10)
    return server.process.returncode


@dataclass
class Burst:
    requests: int
    completed: int = 0
    tokens: int = 0
    errors: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


def _stream_one(base: str, body: dict[str, Any], burst: Burst, lock: threading.Lock, abort_after: int) -> None:
    request = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    start = time.monotonic()
    chunks = 0
    usage_tokens: int | None = None
    first: float | None = None
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                payload = json.loads(line[5:])
                if payload.get("usage"):  # the last chunk, with stream_options.include_usage
                    usage_tokens = int(payload["usage"].get("completion_tokens") or 0)
                if payload.get("choices") and payload["choices"][0].get("text") is not None:
                    chunks += 1
                    first = first if first is not None else time.monotonic() - start
                if abort_after and chunks >= abort_after:
                    break  # closing the stream early: the server aborts the request
    except Exception as exc:  # noqa: BLE001 - reported as a failed request
        if isinstance(exc, urllib.error.HTTPError):
            exc.close()
        with lock:
            burst.errors.append(f"{type(exc).__name__}: {exc}")
        return
    with lock:
        burst.completed += 1
        # Chunks undercount when the server coalesces tokens; the usage record does not.
        burst.tokens += usage_tokens if usage_tokens is not None else chunks
        if first is not None:
            burst.ttft_s.append(first)


def burst(server: Server, *, requests: int, max_tokens: int, prompt: str = "hello world the quick brown fox",
          abort_first: int = 0, concurrency: int | None = None) -> Burst:
    """*requests* concurrent streaming completions; the first *abort_first* disconnect after 2 chunks."""
    result = Burst(requests)
    lock = threading.Lock()
    semaphore = threading.Semaphore(concurrency or requests)

    def run(index: int) -> None:
        aborting = index < abort_first
        body = {"model": "tiny", "prompt": f"{prompt} {index}", "stream": True,
                "max_tokens": max(max_tokens, ABORT_MAX_TOKENS) if aborting else max_tokens,
                "stream_options": {"include_usage": True}, "temperature": 0.0, "ignore_eos": True}
        with semaphore:
            _stream_one(server.base, body, result, lock, 2 if aborting else 0)

    threads = [threading.Thread(target=run, args=(i,), name=f"burst-{i}") for i in range(requests)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.elapsed_s = time.monotonic() - start
    return result
