"""Real processes for the chaos suite: the reference server, streaming clients, span accounting.

``python -m llmtrace.server`` runs as a subprocess (API server + spawned engine process), traced,
exporting OTLP to whatever endpoint the test gives it, spilling to a directory the test owns.
Clients are the official ``openai`` SDK, streaming ``/v1/completions``; each records whether
its request succeeded, when it ended, and the trace id from the ``traceresponse`` header.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import openai

from llmtrace import semconv
from llmtrace._otel.otlp_json_read import MALFORMED, decode_spans
from scripts.otel_stack.binaries import REPO_ROOT
from scripts.otel_stack.stack import ManagedProcess, OtelStack
from tests.helpers.server_process import ServerProcess

#: Spans every streamed completion makes: the SERVER span, llm.request and its four phases
#: (``llm.decode`` only after a second token: a completion that ends at its first has none).
REQUEST_SPANS = {"POST /v1/completions", semconv.SPAN_REQUEST, semconv.SPAN_TOKENIZE, semconv.SPAN_QUEUE,
                 semconv.SPAN_PREFILL, semconv.SPAN_DECODE}
T = TypeVar("T")
_SUMMARY = re.compile(r"llmtrace: spans exported (\d+), spilled (\d+) \((\d+) left on disk in .*?\), dropped (\d+)")


@dataclass(frozen=True)
class Outcome:
    """One client request."""

    started: float  # time.monotonic()
    ended: float
    ok: bool
    trace_id: str | None
    error: str = ""
    tokens: int = 0  #: completion tokens, from the stream's usage chunk

    def expected_spans(self) -> set[str]:
        return REQUEST_SPANS if self.tokens > 1 else REQUEST_SPANS - {semconv.SPAN_DECODE}

    def whole_in(self, names_by_trace: Mapping[str, set[str]]) -> bool:
        """Every span this request's trace must have is among *names_by_trace* [its trace id]."""
        return self.trace_id is not None and self.expected_spans() <= names_by_trace.get(self.trace_id, set())

    def missing_in(self, names_by_trace: Mapping[str, set[str]]) -> int:
        return len(self.expected_spans() - names_by_trace.get(self.trace_id or "", set()))


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # the process is gone
        return []
    found: list[int] = []
    for task in tasks:
        # A thread that exits between the listing and the read takes only its own children's entry with it.
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as children:
            found += [int(c) for c in children.read().split()]
    return found


def _rss_kib(pid: int) -> int:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class RefServer(ServerProcess):
    """``python -m llmtrace.server`` on a free port, exporting OTLP/gRPC to *endpoint*, spilling to
    *spill_dir*; started (``/health`` ok) on construction. The test process's own ``OTEL_*`` and
    ``LLMTRACE_*`` variables are not passed on: the server's telemetry is only what the test sets."""

    def __init__(self, service: str, endpoint: str, spill_dir: Path, log_path: Path,
                 extra_env: Mapping[str, str] | None = None) -> None:
        env = {
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "src")]),
            "LLMTRACE_SERVICE_NAME": service,
            "LLMTRACE_ENDPOINT": endpoint,
            "LLMTRACE_PROTOCOL": "grpc",
            "LLMTRACE_SPILL_DIR": str(spill_dir),
            "LLMTRACE_METRICS_INTERVAL_S": "1",
            "LLMTRACE_GPU": "off",
            **(extra_env or {}),
        }
        super().__init__(["-m", "llmtrace.server", "--port", "{port}"], log=log_path, env=env)
        self._env = {k: v for k, v in self._env.items() if k in env or not k.startswith(("OTEL_", "LLMTRACE_"))}
        self.url = self.base_url
        self.start()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_kib(self) -> int:
        """Resident memory of the API server and its engine process together."""
        return sum(_rss_kib(pid) for pid in [self.pid, *_children(self.pid)])

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def summaries(self) -> list[tuple[int, int, int, int]]:
        """(exported, spilled, left on disk, dropped) from each process's exit line, when it logged one."""
        found = []
        for match in _SUMMARY.finditer(self.log.read_text(errors="replace")):
            exported, spilled, left, dropped = map(int, match.groups())
            found.append((exported, spilled, left, dropped))
        return found


@dataclass
class Load:
    """*clients* threads, each streaming completions back to back until :meth:`stop`."""

    url: str
    clients: int = 4
    max_tokens: int = 8
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.clients)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _client(self, index: int) -> None:
        with openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=30) as client:
            self._requests(index, client)

    def _requests(self, index: int, client: openai.OpenAI) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            started = time.monotonic()
            trace_id, chunks, tokens = None, 0, 0
            try:
                with client.completions.with_streaming_response.create(
                        model="llmtrace-tiny-gpt2", prompt=f"client {index} request {n}",
                        max_tokens=self.max_tokens, stream=True, stream_options={"include_usage": True}) as response:
                    trace_id = _trace_id(response.headers.get("traceresponse"))
                    for chunk in response.parse():
                        chunks += 1
                        tokens = chunk.usage.completion_tokens if chunk.usage else tokens
                ok, error = chunks > 0, "" if chunks else "no chunks"
            except Exception as exc:  # noqa: BLE001 - a failed request is what the test counts
                ok, error = False, repr(exc)
            self.outcomes.append(Outcome(started, time.monotonic(), ok, trace_id, error, tokens))

    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    def between(self, start: float, end: float) -> list[Outcome]:
        return [o for o in self.outcomes if start <= o.ended < end]


def _trace_id(traceresponse: str | None) -> str | None:
    parts = (traceresponse or "").split("-")
    return parts[1] if len(parts) == 4 else None


class RssSampler:
    """The server's RSS every 0.5 s while the test runs."""

    def __init__(self, server: RefServer) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server,), daemon=True)
        self._thread.start()

    def _run(self, server: RefServer) -> None:
        while not self._stop.wait(0.5):
            self.samples.append((time.monotonic(), server.rss_kib()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def growth_kib(self, after: float) -> int:
        """Highest RSS minus the first sample at or after *after* (the warmed-up baseline)."""
        later = [kib for t, kib in self.samples if t >= after]
        return max(later) - later[0] if later else 0


# ----------------------------------------------------------------------------- span accounting


def spill_spans(directory: Path) -> dict[tuple[str, str], str]:
    """(trace id, span id) -> span name of every span in the spill files."""
    found: dict[tuple[str, str], str] = {}
    for path in sorted(directory.glob("*.jsonl")):
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:  # re-sent and removed between the listing and the read: nothing left in it
            continue
        for line in text.splitlines():
            with contextlib.suppress(*MALFORMED):
                for span in decode_spans(line):
                    found[(format(span.context.trace_id, "032x"), format(span.context.span_id, "016x"))] = span.name
    return found


def jaeger_spans(stack: OtelStack, service: str) -> dict[tuple[str, str], str]:
    return {(s.trace_id, s.span_id): s.name for s in stack.query_traces(service)}


def prometheus_counters(stack: OtelStack, service: str) -> dict[str, int]:
    """llmtrace's span counters of *service*, summed over its processes (``dropped`` over reasons)."""
    totals = {"exported": 0, "spilled": 0, "dropped": 0}
    pattern = re.compile(r"^llmtrace_spans_(exported|spilled|dropped)_total\{([^}]*)\} (\S+)$")
    for line in stack.prometheus_text().splitlines():
        match = pattern.match(line)
        if match and f'job="{service}"' in match.group(2):
            totals[match.group(1)] += int(float(match.group(3)))
    return totals


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll *condition* every 0.5 s for up to *timeout_s*; whether it came true."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def settle(probe: Callable[[], T], timeout_s: float = 60.0, stable_s: float = 3.0) -> T:
    """Poll *probe* until its value has not changed for *stable_s*; the last value."""
    deadline = time.monotonic() + timeout_s
    last, since = probe(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        value = probe()
        if value != last:
            last, since = value, time.monotonic()
        elif time.monotonic() - since >= stable_s:
            break
    return last


def restart(process: ManagedProcess) -> ManagedProcess:
    """The same binary, config and ports again, after *process* died; waits until it is ready."""
    process.stop()
    again = ManagedProcess(process.name + "-restarted", process.argv, process.env, process.ready,
                           process.log_path.parent)
    again.wait_healthy()
    return again


@contextlib.contextmanager
def black_hole() -> Iterator[str]:
    """A TCP endpoint that accepts connections and never answers: a collector stuck on its side."""
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        for conn in accepted:
            conn.close()
        listener.close()


def dump(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=1, default=str))
