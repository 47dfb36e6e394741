"""The engine supervisor's bounds: the backoff doubles to its cap, and an engine that dies once the
restart budget is spent is not restarted — the server stays up, says so, and refuses requests."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from llmtrace.server.client import RestartPolicy


def test_the_backoff_doubles_up_to_its_cap() -> None:
    policy = RestartPolicy(backoff_s=0.5, max_backoff_s=10.0)
    assert [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0] == [policy.delay_s(n) for n in range(7)]


@pytest.mark.torch
def test_an_engine_that_dies_past_the_budget_is_not_restarted() -> None:
    """A budget of no restarts: the engine SIGKILLed, /health turns to 503 "failed" (not
    "restarting"), requests get 503 naming the engine's end, and no new engine is started."""
    from llmtrace.server.app import create_app
    from llmtrace.server.runner import ServerThread

    app = create_app(restart_policy=RestartPolicy(max_restarts=0))
    with ServerThread(app) as base_url, httpx.Client(base_url=base_url, timeout=30) as client:
        assert 200 == client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code
        pid = client.get("/health").json()["engine"]["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while client.get("/health").json()["status"] != "failed":
            assert time.monotonic() < deadline, client.get("/health").json()
            time.sleep(0.05)
        health = client.get("/health")
        assert (503, 0, pid) == (health.status_code, health.json()["engine"]["restarts"],
                                 health.json()["engine"]["pid"])
        refused = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert 503 == refused.status_code
        assert "failed" in refused.json()["error"]["message"] and "SIGKILL" in refused.json()["error"]["message"]
