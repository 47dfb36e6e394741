"""Fault: the collector is unreachable. The app keeps serving, memory stays bounded, drops are counted.

Each protocol's app runs once (module fixture); the tests below read different facts off that run.
"""

from __future__ import annotations

import pytest

from scripts.otel_stack.stack import free_port
from tests.stack.run_app import AppRun, run_app

pytestmark = pytest.mark.stack

RSS_GROWTH_LIMIT_KIB = 20 * 1024  # the bounded queue holds 2048 small spans: a few MB at most
SHUTDOWN_TIMEOUT_S = 3.0


@pytest.fixture(scope="module", params=["grpc", "http/protobuf", "http/json"])
def dead_run(request: pytest.FixtureRequest) -> AppRun:
    """Five seconds of requests against a port nobody listens on, then shutdown(timeout_s=3)."""
    return run_app("dead", {
        "LLMTRACE_SERVICE_NAME": "dead-collector",
        "LLMTRACE_EXPORTER": "otlp",
        "LLMTRACE_ENDPOINT": f"http://127.0.0.1:{free_port()}",
        "LLMTRACE_PROTOCOL": request.param,
        "LLMTRACE_MAX_QUEUE_SIZE": "2048",
        "LLMTRACE_METRICS_INTERVAL_S": "1",
        "APP_DURATION_S": "5",
        "APP_SHUTDOWN_S": str(SHUTDOWN_TIMEOUT_S),
    })


def test_requests_keep_succeeding_and_never_export(dead_run: AppRun) -> None:
    """The request loop keeps serving, and never runs an export itself (it only hands spans
    to the export thread), so the failing exporter cannot block it. What the hand-off costs
    per request is measured in benchmarks/, not asserted here."""
    assert dead_run.result["served"] > 200, dead_run.result["served"]
    assert 0 == dead_run.result["exports_on_request_thread"]


def test_memory_stays_flat_once_the_queue_is_full(dead_run: AppRun) -> None:
    """RSS sampled every 0.5 s: after the first two seconds it must not grow."""
    steady = dead_run.result["rss_kib"][4:]
    assert max(steady) - steady[0] < RSS_GROWTH_LIMIT_KIB, dead_run.result["rss_kib"]


def test_drops_are_counted_and_warned_about_once(dead_run: AppRun) -> None:
    """The drop counter behind the ``llmtrace.spans.dropped`` metric is > 0; llmtrace warns once."""
    assert dead_run.result["dropped_before_shutdown"] > 0
    assert 1 == dead_run.stderr.count("spans are being dropped and counted")


def test_shutdown_returns_within_its_timeout(dead_run: AppRun) -> None:
    """``llmtrace.shutdown(timeout_s=3)`` is bounded even with nowhere to flush to."""
    assert dead_run.result["shutdown_s"] < SHUTDOWN_TIMEOUT_S + 2.0, dead_run.result["shutdown_s"]
