"""What a collector outage costs the traced reference server, and what it loses, per phase.

Real processes: the collector + Jaeger of tests/stack (``collector/otel-collector.yaml`` in the
Jaeger v2 binary, every trace kept, ``decision_wait`` 2 s: the test stack's sampling),
``python -m llmtrace.server`` with llmtrace's default settings (OTLP/gRPC to the collector; the
spill in the default state directory, here under a temporary ``XDG_STATE_HOME``; metrics every
1 s instead of 10 s so the span counters settle sooner), and streaming clients on the official
``openai`` SDK. Three phases: *before*, *during* (the collector SIGKILLed, or Jaeger with
``--fail jaeger``) and *after* (restarted on the same ports). Jaeger stores in memory, so with
``--fail jaeger`` its traces are read just before the kill and counted with the new Jaeger's
(spans it stored between that read and the kill die with it). Reported:

* requests and failed requests per phase, latency p50/p99 per phase;
* request traces (SERVER span, ``llm.request`` and its four phases) whole in Jaeger, and the
  spans missing from them, per phase (a request's phase is when it ended);
* the export path's counters summed over both server processes (exported, spilled, dropped)
  against the unique spans in Jaeger: the difference is what the killed collector held;
* the server's RSS (API server + engine process): at the failure, the highest during and after;
* recovery: from the restart until the spill is empty (every spilled span re-sent);
* the loss window: how long before the failure the earliest request ended whose trace is not
  whole in Jaeger (what the killed collector held).

    python benchmarks/bench_collector_outage.py [--before 10] [--outage 25] [--after 10] [--clients 4]
    python benchmarks/bench_collector_outage.py --fail jaeger
    python benchmarks/bench_collector_outage.py --no-spill      # the spill off: what it saves
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from scripts.otel_stack.stack import OtelStack, query_traces
    from tests.chaos.harness import (
        Load,
        RefServer,
        RssSampler,
        prometheus_counters,
        restart,
        settle,
        spill_spans,
    )

    work = Path(tempfile.mkdtemp(prefix="llmtrace-outage-"))
    os.environ["XDG_STATE_HOME"] = str(work / "state")  # the server inherits it: the default spill path
    spill = work / "state" / "llmtrace" / "spill"
    service = f"outage-{uuid.uuid4().hex[:6]}"
    stack = OtelStack.start(log_dir=work)
    victim = 1 if args.fail == "collector" else 0
    try:
        server = RefServer(service, stack.otlp_grpc_endpoint, spill, work / "server.log",
                           {"LLMTRACE_SPILL_MAX_BYTES": "0"} if args.no_spill else None)
    except BaseException:
        stack.stop()
        raise
    try:
        rss = RssSampler(server)
        spill_size: list[tuple[float, int]] = []  # (when, bytes in the spill's segments)

        def spill_bytes() -> int:
            total = 0
            for path in spill.glob("*.jsonl") if spill.exists() else ():
                with contextlib.suppress(FileNotFoundError):  # re-sent and removed since the listing
                    total += path.stat().st_size
            return total

        def sample_for(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                spill_size.append((time.monotonic(), spill_bytes()))
                time.sleep(0.5)

        with Load(server.url, clients=args.clients) as load:
            time.sleep(args.before)
            # Jaeger keeps traces in memory: what it held dies with it, so take them first.
            stored = query_traces(stack.jaeger_query_url, service, limit=100_000) if args.fail == "jaeger" else []
            process = stack.processes[victim]
            process.proc.kill()
            failed_at = time.monotonic()
            sample_for(args.outage)
            stack.processes[victim] = restart(process)
            restarted_at = time.monotonic()
            sample_for(args.after)
        deadline = time.monotonic() + 120
        while spill_size[-1][1] and time.monotonic() < deadline:
            time.sleep(0.5)
            spill_size.append((time.monotonic(), spill_bytes()))
        rss.stop()
        counters = settle(lambda: prometheus_counters(stack, service), timeout_s=60)
        spans = settle(lambda: query_traces(stack.jaeger_query_url, service, limit=100_000), timeout_s=60,
                       stable_s=5)
    finally:
        server.stop()
        stack.stop()
    seen = {(span.trace_id, span.span_id) for span in spans}
    spans += [span for span in stored if (span.trace_id, span.span_id) not in seen]
    measured = Run(load.outcomes, spans, counters, rss.samples, spill_size, failed_at, restarted_at,
              len(spill_spans(spill)))
    return summarise(args, measured)


@dataclass
class Run:
    outcomes: list[Any]
    spans: list[Any]
    counters: dict[str, int]
    rss: list[tuple[float, int]]
    spill_size: list[tuple[float, int]]
    failed_at: float
    restarted_at: float
    left_in_spill: int


def summarise(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    traces: dict[str, set[str]] = {}
    for span in run.spans:
        traces.setdefault(span.trace_id, set()).add(span.name)
    failed_at, restarted_at = run.failed_at, run.restarted_at
    phases = {"before": (0.0, failed_at), "during": (failed_at, restarted_at), "after": (restarted_at, 1e18)}
    result: dict[str, Any] = {"fail": args.fail, "spill": not args.no_spill, "clients": args.clients,
                              "phases_s": [args.before, args.outage, args.after]}
    for phase, (start, end) in phases.items():
        outcomes = [o for o in run.outcomes if start <= o.ended < end]
        whole = [o for o in outcomes if o.whole_in(traces)]
        missing_spans = sum(o.missing_in(traces) for o in outcomes)
        latencies = [o.ended - o.started for o in outcomes if o.ok]
        result[phase] = {
            "requests": len(outcomes), "failed": sum(not o.ok for o in outcomes),
            "traces_whole_in_jaeger": len(whole), "request_spans_missing": missing_spans,
            "latency_p50_s": round(statistics.median(latencies), 4) if latencies else None,
            "latency_p99_s": round(_percentile(latencies, 0.99), 4) if latencies else None,
        }
    lost = [o for o in run.outcomes if o.ended < failed_at and not o.whole_in(traces)]
    result["lost_window_s"] = round(failed_at - min(o.ended for o in lost), 2) if lost else 0.0
    at_failure = [kib for t, kib in run.rss if t <= failed_at][-1]
    during = [kib for t, kib in run.rss if failed_at < t <= restarted_at]
    after = [kib for t, kib in run.rss if t > restarted_at]
    empty_at = next((t for t, n in run.spill_size if t > restarted_at and n == 0), None)
    unique = len({(s.trace_id, s.span_id) for s in run.spans})
    counters = run.counters
    result.update({
        "counters": counters, "spans_in_jaeger": unique,
        "spans_exported_not_in_jaeger": counters["exported"] - unique,
        "rss_mib": {"at_failure": round(at_failure / 1024, 1), "max_during": round(max(during) / 1024, 1),
                    "max_after": round(max(after) / 1024, 1)},
        "spill_max_mib": round(max(n for _, n in run.spill_size) / 2**20, 1),
        "spans_left_in_spill": run.left_in_spill,
        "recovery_s": round(empty_at - restarted_at, 1) if empty_at is not None else None,
    })
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=float, default=10.0, help="seconds of load before the failure")
    parser.add_argument("--outage", type=float, default=25.0, help="seconds the killed process stays down")
    parser.add_argument("--after", type=float, default=10.0, help="seconds of load after the restart")
    parser.add_argument("--clients", type=int, default=4, help="concurrent streaming clients")
    parser.add_argument("--fail", choices=("collector", "jaeger"), default="collector",
                        help="which process to SIGKILL and restart")
    parser.add_argument("--no-spill", action="store_true", help="LLMTRACE_SPILL_MAX_BYTES=0: the comparison arm")
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args()
    result = run(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
