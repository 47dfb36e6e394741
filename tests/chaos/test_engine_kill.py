"""Chaos: the reference server's engine process SIGKILLed, twice, under a load of streaming clients.

Real processes throughout: ``python -m llmtrace.server`` (front end + engine process, traced
to an OTLP-JSON-lines file), clients on the official ``openai`` SDK in threads, and a
``kill -9`` of the engine's pid from outside, as an OOM killer or an operator would.

What must hold: a stream in flight when its engine dies fails at once with an error that says
so (no hang, no timeout); requests while the engine is down get a 503 naming the restart;
the supervisor restarts the engine without anyone's help, and requests succeed again; each
restart is counted in ``llm.engine.restarts`` (``/health`` and the exported metric); the front
end's memory stays bounded across the restarts.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest

from llmtrace import semconv
from tests.helpers.server_process import ServerProcess

pytestmark = pytest.mark.torch

CLIENTS = 3
KILLS = 2
#: A stream in flight when the engine dies must fail within this many seconds: the death is an
#: end-of-file on the engine's pipe, seen at once; the bound only absorbs a loaded machine.
FAIL_FAST_S = 5.0
#: The restart is a new interpreter loading torch and the model on two busy cores.
RECOVERY_TIMEOUT_S = 180.0
#: Front-end RSS growth allowed over both restarts (new pipes, a new reader thread, the
#: allocator's high-water mark under load); a leak per restart of a whole engine's state is more.
RSS_GROWTH_BOUND = 64 << 20


@dataclass
class Outcome:
    kind: str  # ok | stream_error | refused | other
    ended_at: float
    detail: str = ""


@dataclass
class Load:
    """Streaming chat clients in threads, each starting its next request when one ends."""

    base_url: str
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run_client(self) -> None:
        client = openai.OpenAI(base_url=self.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
        while not self.stop.is_set():
            outcome = self._one(client)
            with self.lock:
                self.outcomes.append(outcome)
            if outcome.kind != "ok":
                time.sleep(0.2)  # a client backing off, not a tight loop that starves the restart
        client.close()

    @staticmethod
    def _one(client: openai.OpenAI) -> Outcome:
        try:
            stream = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "go on"}],
                                                    max_tokens=48, stream=True)
            chunks = list(stream)
            reason = next((c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason),
                          None)
            return Outcome("ok" if reason in ("stop", "length") else "other", time.monotonic(), str(reason))
        except openai.InternalServerError as exc:  # 503 while the engine is down
            return Outcome("refused", time.monotonic(), f"{exc.status_code} {exc.message}")
        except openai.APIStatusError as exc:
            return Outcome("other", time.monotonic(), f"{exc.status_code} {exc.message}")
        except openai.APIError as exc:  # the error event of a stream whose engine died
            kind = "stream_error" if type(exc) is openai.APIError else "other"
            return Outcome(kind, time.monotonic(), f"{type(exc).__name__}: {exc.message}")

    def since(self, t: float) -> list[Outcome]:
        with self.lock:
            return [o for o in self.outcomes if o.ended_at >= t]

    def wait_for(self, kind: str, count: int, after: float, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while sum(o.kind == kind for o in self.since(after)) < count:
            assert time.monotonic() < deadline, f"no {count} {kind} outcomes in {timeout_s} s: {self.since(after)}"
            time.sleep(0.1)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    env = {"LLMTRACE_EXPORTER": f"file:{tmp_path / 'traces.jsonl'}", "OTEL_SERVICE_NAME": "engine-kill"}
    with ServerProcess(["-m", "llmtrace.server", "--port", "{port}"], log=tmp_path / "server.log", env=env) as s:
        yield s


def _exported_restarts(path: Path) -> int:
    """The last cumulative value of llm.engine.restarts in the trace file's metrics lines."""
    value = 0
    for line in path.read_text().splitlines():
        for resource in json.loads(line).get("resourceMetrics", []):
            for scope in resource["scopeMetrics"]:
                for metric in scope["metrics"]:
                    if semconv.METRIC_ENGINE_RESTARTS == metric["name"]:
                        value = max(int(p["asInt"]) for p in metric["sum"]["dataPoints"])
    return value


def test_the_engine_killed_under_load_fails_streams_fast_and_comes_back(server: ServerProcess,
                                                                        tmp_path: Path) -> None:
    load = Load(server.base_url)
    threads = [threading.Thread(target=load.run_client, name=f"client-{i}") for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    figures: dict[str, list[float]] = {"stream_failed_after_s": [], "recovered_after_s": []}
    try:
        load.wait_for("ok", 6, 0.0, RECOVERY_TIMEOUT_S)
        rss_before = server.rss_bytes()
        for kill in range(1, KILLS + 1):
            pid = server.health()["engine"]["pid"]
            killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            load.wait_for("stream_error", 1, killed_at, FAIL_FAST_S)
            failed = min(o.ended_at for o in load.since(killed_at) if o.kind == "stream_error")
            health = server.wait_healthy(RECOVERY_TIMEOUT_S)
            figures["stream_failed_after_s"].append(round(failed - killed_at, 3))
            figures["recovered_after_s"].append(round(time.monotonic() - killed_at, 1))
            assert (kill, True) == (health["engine"]["restarts"], health["engine"]["pid"] != pid)
            assert f"(pid {pid}) was killed by SIGKILL" in health["engine"]["last_exit"]
            load.wait_for("ok", 3, time.monotonic(), RECOVERY_TIMEOUT_S)  # served again after the restart
        rss_growth = server.rss_bytes() - rss_before
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(120)
    assert not any(t.is_alive() for t in threads), "a client hung"
    by_kind: dict[str, list[Outcome]] = {}
    for outcome in load.outcomes:
        by_kind.setdefault(outcome.kind, []).append(outcome)
    assert [] == by_kind.get("other", []), "only clear engine errors and 503s are allowed"
    assert all("was killed by SIGKILL" in o.detail for o in by_kind["stream_error"])
    assert all(o.detail.startswith("503 ") and "restarting" in o.detail for o in by_kind.get("refused", []))
    assert rss_growth < RSS_GROWTH_BOUND, f"front-end RSS grew {rss_growth >> 20} MiB over {KILLS} restarts"
    # The figures docs/reliability-server.md quotes (shown with pytest -s).
    print(json.dumps({**figures, "rss_growth_mib": round(rss_growth / 2**20, 1),
                      **{kind: len(outcomes) for kind, outcomes in by_kind.items()}}))
    server.stop()
    assert KILLS == _exported_restarts(tmp_path / "traces.jsonl")
