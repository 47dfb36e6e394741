"""Chaos: the collector or Jaeger fails while the traced reference server is under load.

Real processes throughout: ``python -m llmtrace.server`` (API server + engine process) exporting
OTLP/gRPC to the collector of tests/stack (``collector/otel-collector.yaml`` in the Jaeger v2
binary) in front of Jaeger, four streaming clients on the official ``openai`` SDK. Each test
asserts: no client request fails, the server's memory stays bounded, and every span is
accounted for (in Jaeger, on disk in the spill, or counted as dropped) except what a killed
collector held for its tail-sampling decision, which is bounded in time (docs/collector.md).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts.otel_stack.stack import OtelStack, StackSpan, query_traces
from tests.chaos.harness import (
    Load,
    Outcome,
    RefServer,
    RssSampler,
    dump,
    prometheus_counters,
    restart,
    settle,
    spill_spans,
    wait_until,
)

pytestmark = [pytest.mark.stack, pytest.mark.torch]

#: Longer than COLLECTOR_LOSS_WINDOW_S with room to spare: the requests of the first seconds are
#: the ones checked in Jaeger's snapshot before the kill.
BEFORE_S = 8.0
OUTAGE_S = 6.0
AFTER_S = 4.0
#: RSS of both server processes may grow this much under load through the outage (measured:
#: docs/reliability.md); an unbounded queue at ~600 spans/s would pass it within the outage.
RSS_GROWTH_LIMIT_KIB = 100 * 1024
#: A request whose spans reached the collector less than this before it was killed may be lost
#: with it: the SDK's batch delay (1 s) + the test stack's decision_wait (2 s) + batch timeout
#: (0.2 s), with a second of margin.
COLLECTOR_LOSS_WINDOW_S = 4.5
#: The spill's re-send is paced (a third of the spill thread's time): a 25 s outage's spill took
#: 27 s to re-send on the 2-core CI host (docs/reliability.md); this test's is shorter.
RESEND_TIMEOUT_S = 150.0


def _service(name: str) -> str:
    return f"chaos-{name}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[OtelStack]:
    """A stack of this test's own: its processes get killed."""
    started = OtelStack.start(log_dir=tmp_path)
    try:
        yield started
    finally:
        for process in started.processes:
            process.stop()


def _jaeger(stack: OtelStack, service: str) -> dict[str, list[StackSpan]]:
    traces: dict[str, list[StackSpan]] = {}
    for span in query_traces(stack.jaeger_query_url, service, limit=100_000):
        traces.setdefault(span.trace_id, []).append(span)
    return traces


def _complete(outcome: Outcome, traces: dict[str, list[StackSpan]]) -> bool:
    """Jaeger holds every span the request's trace must have."""
    return outcome.whole_in({outcome.trace_id or "": {s.name for s in traces.get(outcome.trace_id or "", [])}})


def _unique_spans(traces: dict[str, list[StackSpan]]) -> int:
    return len({(s.trace_id, s.span_id) for spans in traces.values() for s in spans})


@dataclass
class Outage:
    load: Load
    rss: RssSampler
    warm: float  #: the RSS baseline's time: load running, before the failure
    failed: float  #: when the process was killed
    snapshot: dict[str, list[StackSpan]]  #: Jaeger's traces just before the kill
    snapshot_at: float  #: when that query was sent (on a loaded host it can take seconds)


def _outage(stack: OtelStack, server: RefServer, victim: int, service: str) -> Outage:
    """Load the server; SIGKILL ``stack.processes[victim]`` for OUTAGE_S; restart it; load on."""
    rss = RssSampler(server)
    with Load(server.url) as load:
        time.sleep(BEFORE_S)
        warm = snapshot_at = time.monotonic()
        snapshot = _jaeger(stack, service)
        process = stack.processes[victim]
        process.proc.kill()
        failed = time.monotonic()
        time.sleep(OUTAGE_S)
        stack.processes[victim] = restart(process)
        time.sleep(AFTER_S)
    rss.stop()
    return Outage(load, rss, warm, failed, snapshot, snapshot_at)


def test_collector_sigkill_and_restart_under_load(stack: OtelStack, tmp_path: Path) -> None:
    """SIGKILL the collector for OUTAGE_S under load, restart it: no request fails; the outage's spans
    go to the spill and are re-sent; only traces the collector held for its tail-sampling decision
    at the kill are missing from Jaeger; nothing is dropped."""
    service, spill = _service("collector-kill"), tmp_path / "spill"
    server = RefServer(service, stack.otlp_grpc_endpoint, spill, tmp_path / "server.log")
    try:
        outage = _outage(stack, server, 1, service)
        assert [] == outage.load.failed()
        wait_until(lambda: not spill_spans(spill), timeout_s=RESEND_TIMEOUT_S)
        on_disk = len(spill_spans(spill))
        counters = settle(lambda: prometheus_counters(stack, service), timeout_s=30)
        traces = settle(lambda: _jaeger(stack, service), timeout_s=30)
    finally:
        server.stop()
    dump(tmp_path / "result.json", {"counters": counters, "on_disk": on_disk,
                                    "requests": len(outage.load.outcomes)})
    assert 0 == on_disk
    assert counters["spilled"] > 0, counters
    assert 0 == counters["dropped"], counters
    assert counters["exported"] >= _unique_spans(traces)
    missing = [o for o in outage.load.outcomes if not _complete(o, traces)]
    outside = [o for o in missing if not outage.failed - COLLECTOR_LOSS_WINDOW_S <= o.ended <= outage.failed]
    assert [] == outside, f"{len(outside)} of {len(missing)} incomplete traces ended outside the loss window"
    assert outage.rss.growth_kib(outage.warm) < RSS_GROWTH_LIMIT_KIB, outage.rss.samples


def test_jaeger_down_behind_a_live_collector(stack: OtelStack, tmp_path: Path) -> None:
    """SIGKILL Jaeger for OUTAGE_S under load, restart it: the collector queues and retries, so the SDK
    neither spills nor drops, no request fails, and every request that ended after the kill is
    whole in the new Jaeger (its storage is in memory: what the old one stored died with it, so
    the requests before are checked in a snapshot taken just before the kill)."""
    service, spill = _service("jaeger-down"), tmp_path / "spill"
    server = RefServer(service, stack.otlp_grpc_endpoint, spill, tmp_path / "server.log")
    try:
        outage = _outage(stack, server, 0, service)
        assert [] == outage.load.failed()
        after = settle(lambda: _jaeger(stack, service), timeout_s=60)
        counters = settle(lambda: prometheus_counters(stack, service), timeout_s=30)
    finally:
        server.stop()
    assert {"spilled": 0, "dropped": 0} == {k: counters[k] for k in ("spilled", "dropped")}, counters
    assert [] == list(spill.glob("*.jsonl"))
    since_kill = [o for o in outage.load.outcomes if o.ended > outage.failed]
    assert since_kill and [] == [o for o in since_kill if not _complete(o, after)]
    # Before the kill: a request's trace leaves the collector ~3 s after it ends (SDK batch delay +
    # decision_wait), so only those that ended that much before the snapshot's query are in it.
    settled = [o for o in outage.load.outcomes if o.ended < outage.snapshot_at - COLLECTOR_LOSS_WINDOW_S]
    not_stored = [round(outage.snapshot_at - o.ended, 2) for o in settled if not _complete(o, outage.snapshot)]
    assert settled and [] == not_stored, f"{len(not_stored)} of {len(settled)} (seconds before the snapshot)"
    assert outage.rss.growth_kib(outage.warm) < RSS_GROWTH_LIMIT_KIB, outage.rss.samples
