"""Chaos: a collector that accepts connections and never answers (back-pressure).

The traced reference server exports OTLP/gRPC to a TCP listener that accepts and stays silent,
so every export runs into its timeout. The serving path must not notice: requests keep
succeeding at their usual latency, memory stays bounded, and every span ends up in the spill
(readable in place by ``llmtrace analyze``) or counted as dropped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from scripts.otel_stack.binaries import REPO_ROOT
from tests.chaos.harness import Load, RefServer, RssSampler, black_hole, spill_spans

pytestmark = [pytest.mark.stack, pytest.mark.torch]

LOAD_S = 8.0
#: One gRPC export against the silent endpoint waits this long (the exporter's timeout); a
#: serving path that waited on the exporter would show requests at least this slow.
EXPORT_TIMEOUT_S = 5.0
RSS_GROWTH_LIMIT_KIB = 100 * 1024


def test_a_silent_collector_costs_the_serving_path_nothing(tmp_path: Path) -> None:
    """No request fails or waits for an export; every span of the run is in the spill (the
    processes' exit lines: exported 0, dropped 0), each request's trace whole."""
    spill = tmp_path / "spill"
    with black_hole() as endpoint:
        server = RefServer(f"chaos-slow-{uuid.uuid4().hex[:6]}", endpoint, spill, tmp_path / "server.log")
        try:
            rss = RssSampler(server)
            with Load(server.url) as load:
                time.sleep(2.0)
                warm = time.monotonic()
                time.sleep(LOAD_S)
            rss.stop()
        finally:
            server.stop()
    assert [] == load.failed()
    slowest = max(o.ended - o.started for o in load.outcomes)
    assert slowest < EXPORT_TIMEOUT_S, slowest
    summaries = server.summaries()
    assert 2 == len(summaries), server.log_tail()  # the API server and the engine process
    exported, spilled, _, dropped = (sum(column) for column in zip(*summaries, strict=True))
    on_disk = spill_spans(spill)
    assert (0, 0) == (exported, dropped)
    assert spilled == len(on_disk)
    by_trace: dict[str, set[str]] = {}
    for (trace_id, _), name in on_disk.items():
        by_trace.setdefault(trace_id, set()).add(name)
    assert [] == [o for o in load.outcomes if not o.whole_in(by_trace)]
    assert rss.growth_kib(warm) < RSS_GROWTH_LIMIT_KIB, rss.samples
    report = subprocess.run([sys.executable, "-m", "llmtrace.cli", "analyze", *map(str, sorted(spill.glob("*.jsonl"))),
                             "--json", "-"], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}, check=False)
    assert 0 == report.returncode, report.stderr[-2000:]
    assert len(load.outcomes) <= json.loads(report.stdout)["requests"]["count"]
