"""CPU per HTTP request in a FastAPI app: untraced, OpenTelemetry's own instrumentation, llmtrace.

OpenTelemetry's ASGI middleware costs more per streamed request than a production tracer
can (docs/performance.md), so llmtrace makes the SERVER span itself. This benchmark
measures both on the same request path, without the network, the tokenizer or the engine: an
in-process FastAPI app whose handler streams *chunks* Server-Sent Events (as a streamed
completion does), called directly through ASGI.

Arms, each in a fresh process (instrumentation is process-wide), interleaved ABC... CBA:

* ``untraced``: the bare app;
* ``otel``: what a user gets from OpenTelemetry alone — ``FastAPIInstrumentor`` with an SDK
  tracer provider (parent-based, 10 % of traces) and an SDK meter provider with a reader,
  ``exclude_spans=["send", "receive"]`` as llmtrace passes; no span exporter;
* ``llmtrace_0``, ``llmtrace_1``, ``production``, ``full``: ``llmtrace.instrument()`` with
  0 %, 1 %, 10 % and 100 % of requests sampled — llmtrace's own SERVER span, its server scope,
  the HTTP metrics for every request; sampled requests exported to a file;
* ``scope_only``: production settings with ``server_spans="off"`` — llmtrace's server scope
  alone, no SERVER span;
* ``otel_llmtrace``: the ``otel`` arm's instrumentation with llmtrace at production settings —
  a host that instruments FastAPI itself keeps OpenTelemetry's SERVER span, and llmtrace's
  server scope runs inside it.

Two measures per request: the serving thread's CPU (what the request path pays) and the
whole process's CPU (with the span builder and exporters). Medians over the rounds.

    python benchmarks/bench_asgi_request.py [--requests 3000] [--rounds 3] [--chunks 33] [--json]
    python benchmarks/bench_asgi_request.py --instructions     # callgrind: stable, ~15 minutes
    python benchmarks/bench_asgi_request.py --instructions --arms production --jobs 4
    python benchmarks/bench_asgi_request.py --instructions --requests 1400 --base 200   # GC amortised

CPU time on a shared VM moves by 2x between runs of the same arm (the host's speed changes),
so read the CPU-time table as ratios within a round; ``--instructions`` counts instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ARMS = ("untraced", "otel", "llmtrace_0", "llmtrace_1", "production", "full", "scope_only", "otel_llmtrace")
#: llmtrace's request sampling ratio per llmtrace arm ("production" is 10 %, "full" every request).
SAMPLE_RATIOS = {"llmtrace_0": 0.0, "llmtrace_1": 0.01, "production": 0.1, "full": 1.0, "scope_only": 0.1,
                 "otel_llmtrace": 0.1}
#: Arms whose SERVER span is not llmtrace's: none at all, or OpenTelemetry's middleware's (llmtrace's
#: server scope runs inside it).
SERVER_SPANS = {"scope_only": "off"}
OTEL_ARMS = ("otel", "otel_llmtrace")

_SCOPE = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
          "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
          "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                      (b"content-length", b"2")],
          "client": ("127.0.0.1", 5555), "server": ("127.0.0.1", 8000)}


def _app(arm: str, out: str, chunks: int) -> Any:
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    if arm in SAMPLE_RATIOS:
        import llmtrace

        llmtrace.instrument(exporter=f"file:{out}", gpu="off", sample_ratio=SAMPLE_RATIOS[arm],
                            server_spans=SERVER_SPANS.get(arm, "llmtrace"))
    app = FastAPI()
    if arm in OTEL_ARMS:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        FastAPIInstrumentor.instrument_app(
            app, tracer_provider=TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1))),
            meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
            exclude_spans=["send", "receive"])

    @app.post("/v1/completions")
    async def completions() -> StreamingResponse:
        async def events() -> Any:
            for index in range(chunks - 1):
                yield f"data: {index}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


async def _one(app: Any) -> None:
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.sleep(3600)  # the client stays: only a disconnect would end this
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        return None

    await app(dict(_SCOPE), receive, send)


def child(arm: str, requests: int, chunks: int, exit_at_once: bool = False) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        app = _app(arm, os.path.join(tmp, "traces.jsonl"), chunks)

        async def drive() -> tuple[float, float]:
            for _ in range(200):  # warm-up: middleware stack built, caches filled
                await _one(app)
            thread, process = time.thread_time(), time.process_time()
            for _ in range(requests):
                await _one(app)
            if arm in SAMPLE_RATIOS:
                import llmtrace

                llmtrace.flush()  # the builder's and exporter's work for these requests, in the process CPU
            return time.thread_time() - thread, time.process_time() - process

        thread_s, process_s = asyncio.run(drive())
        print(json.dumps({"thread_us": thread_s / requests * 1e6, "process_us": process_s / requests * 1e6}),
              flush=True)
        if exit_at_once:  # under valgrind: skip the teardown, whose instructions would not cancel out
            os._exit(0)


def count_instructions(chunks: int, arms: tuple[str, ...] = ARMS, jobs: int = 1, requests: int = 600,
                       base: int = 200) -> dict[str, dict[str, float]]:
    """Instructions per request, per arm: ``callgrind`` totals of runs of *requests* and *base*
    requests, differenced (start-up and warm-up cancel out) and divided by their difference —
    stable where CPU time is not on a shared VM. The serving thread alone, and all threads
    (builder, exporters). A longer difference (``--requests 1400``) amortises the garbage
    collector's full collections, which otherwise fall inside one window and not the other.

    The serving thread's count is exact. The other threads batch by wall-clock time (the span
    builder every 50 ms, the span exporter every second), which valgrind slows 50-fold: each of
    their wake-ups serves ~50x fewer requests than in real time, so their share per request is
    overstated — an upper bound."""
    from _callgrind import per_request

    # Under valgrind the process runs ~50x slower, but the periodic metric export keeps its
    # wall-clock period: it would run ~50x more often per request than in real time, and a
    # different number of times in the two runs. Exported once at the end instead (flush()).
    os.environ["LLMTRACE_METRICS_INTERVAL_S"] = "3600"
    return per_request(lambda arm, count: [sys.executable, __file__, "--child", arm, "--requests", str(count),
                                           "--chunks", str(chunks), "--exit-at-once"],
                       arms, requests, base, jobs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=None,
                        help="counted requests (3000; with --instructions the longer run's, 600)")
    parser.add_argument("--base", type=int, default=200,
                        help="--instructions: the shorter run's requests (a longer difference amortises where the "
                             "garbage collector's full collections fall)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=33, help="streamed messages per response (32 tokens + [DONE])")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per request under valgrind instead (stable on a noisy host; slow)")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"comma-separated arms to count with --instructions (untraced always; "
                             f"known: {', '.join(ARMS)})")
    parser.add_argument("--jobs", type=int, default=1,
                        help="with --instructions: valgrind runs at a time (the counts do not depend on it)")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--exit-at-once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.requests is None:
        args.requests = 600 if args.instructions else 3000
    if args.instructions and args.requests <= args.base:
        parser.error(f"--requests {args.requests} must be more than --base {args.base}")
    if args.child:
        child(args.child, args.requests, args.chunks, args.exit_at_once)
        return 0
    if args.instructions:
        chosen = [arm.strip() for arm in args.arms.split(",") if arm.strip()]
        unknown = [arm for arm in chosen if arm not in ARMS]
        if unknown:
            parser.error(f"--arms: unknown {', '.join(unknown)} (known: {', '.join(ARMS)})")
        arms = tuple(arm for arm in ARMS if arm == "untraced" or arm in chosen)
        counted = count_instructions(args.chunks, arms, args.jobs, args.requests, args.base)
        base = counted["untraced"]
        for arm in arms[1:]:
            counted[arm]["added_thread"] = counted[arm]["thread_instructions"] - base["thread_instructions"]
            counted[arm]["added_all"] = counted[arm]["all_instructions"] - base["all_instructions"]
        print(json.dumps(counted, indent=2))
        return 0
    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for index in range(args.rounds):
        for arm in ARMS if index % 2 == 0 else reversed(ARMS):
            out = subprocess.run([sys.executable, __file__, "--child", arm, "--requests", str(args.requests),
                                  "--chunks", str(args.chunks)], check=True, capture_output=True, text=True)
            results[arm].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {index + 1} {arm:<10} {results[arm][-1]['thread_us']:7.1f} µs thread, "
                  f"{results[arm][-1]['process_us']:7.1f} µs process", file=sys.stderr)
    summary = {arm: {measure: statistics.median(r[measure] for r in runs) for measure in ("thread_us", "process_us")}
               for arm, runs in results.items()}
    base = summary["untraced"]
    for arm in ARMS[1:]:
        summary[arm]["added_thread_us"] = summary[arm]["thread_us"] - base["thread_us"]
        summary[arm]["added_process_us"] = summary[arm]["process_us"] - base["process_us"]
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{args.requests} requests x {args.chunks} streamed messages, medians of {args.rounds} rounds")
    print(f"{'arm':<11} {'thread µs/req':>14} {'added':>8} {'process µs/req':>15} {'added':>8}")
    for arm, row in summary.items():
        print(f"{arm:<11} {row['thread_us']:14.1f} {row.get('added_thread_us', 0.0):8.1f} "
              f"{row['process_us']:15.1f} {row.get('added_process_us', 0.0):8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
