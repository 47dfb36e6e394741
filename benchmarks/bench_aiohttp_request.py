"""CPU per HTTP request in an aiohttp server: untraced, OpenTelemetry's own instrumentation, llmtrace.

The aiohttp counterpart of ``bench_asgi_request.py``. llmtrace makes the SERVER span with
its own middleware — here, the app having no middleware of its own, the same function as the
server's request handler — and a hook on ``StreamResponse.prepare`` (``integrations/aiohttp/``);
this benchmark compares it with opentelemetry-instrumentation-aiohttp-server on one request path.
The handler streams *chunks* Server-Sent Events (as a streamed completion does) through a
``web.StreamResponse``.

Requests go through aiohttp's real server protocol (``RequestHandler``: HTTP parsing,
middleware chain, chunked response encoding) over an in-memory transport, so no client and
no kernel socket work is in the count: one keep-alive connection, the request bytes fed
with ``data_received``, the response taken as complete at its last chunk. No access log.

Arms, each in a fresh process (instrumentation is process-wide), interleaved ABCD DCBA:

* ``untraced``: the bare app;
* ``middleware``: the bare app with one pass-through middleware of its own — what aiohttp itself
  charges an app for having any middleware (its chain is built and its ``current_app`` middleware
  added only then), the floor under any tracer that is a middleware;
* ``otel``: what a user gets from OpenTelemetry alone — ``AioHttpServerInstrumentor`` with an
  SDK tracer provider (parent-based, 10 % of traces) and an SDK meter provider with a reader
  (global: the instrumentor takes its meters from the global provider); no span exporter;
* ``production``: ``llmtrace.instrument(sample_ratio=0.1)`` (llmtrace's own SERVER span
  middleware, its server scope and metrics);
* ``full``: ``llmtrace.instrument()``, every request traced and exported to a file.

Two measures per request: the serving (event-loop) thread's CPU and the whole process's CPU
(with the span builder and exporters). Medians over the rounds.

    python benchmarks/bench_aiohttp_request.py [--requests 3000] [--rounds 3] [--chunks 33] [--json]
    python benchmarks/bench_aiohttp_request.py --instructions [--requests 600 --base 200] [--arms production]
    python benchmarks/bench_aiohttp_request.py --instructions --no-gc   # the request path alone (see below)
    python benchmarks/bench_aiohttp_request.py --profile production    # by Python function (cProfile)

CPU time on a shared VM moves by 2x between runs of the same arm (the host's speed changes),
so read the CPU-time table as ratios within a round; ``--instructions`` counts instead. Those
counts move by up to ~45k a request with where the garbage collector's full collections fall (one
inside the 600 - 200 window in one run, none in another): ``--requests 1400`` amortises them, and
``--no-gc`` turns the collector off for the counted requests, so that two versions of the request
path compare exactly (what their allocations cost the collector is then left out).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, ClassVar

ARMS = ("untraced", "middleware", "otel", "production", "full")
WARMUP = 200  # requests before the count: middleware chain built, caches filled

_REQUEST = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\n\r\n{}")
_LAST_CHUNK = b"0\r\n\r\n"  # chunked encoding's terminator: the response is complete


def _instrument(arm: str, out: str) -> None:
    if arm in ("production", "full"):
        import llmtrace

        llmtrace.instrument(exporter=f"file:{out}", gpu="off",
                            **({"sample_ratio": 0.1} if arm == "production" else {}))
    elif arm == "otel":
        import warnings

        from opentelemetry import metrics, trace
        from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        tracer_provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1)))
        meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        with warnings.catch_warnings():  # its web.Application subclass is deprecated by aiohttp
            warnings.simplefilter("ignore", DeprecationWarning)
            AioHttpServerInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)


def _app(chunks: int, arm: str = "untraced") -> Any:
    import warnings

    from aiohttp import web

    events = [f"data: {index}\n\n".encode() for index in range(chunks - 1)] + [b"data: [DONE]\n\n"]

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(event)
        await response.write_eof()
        return response

    with warnings.catch_warnings():  # web.Application is OTel's subclass in the otel arm
        warnings.simplefilter("ignore", DeprecationWarning)
        app = web.Application(middlewares=[_pass_through] if arm == "middleware" else [])
    app.router.add_post("/v1/completions", completions)
    return app


async def _pass_through(request: Any, handler: Any) -> Any:
    return await handler(request)


_pass_through.__middleware_version__ = 1  # type: ignore[attr-defined]  # aiohttp's new-style marker


class _Transport(asyncio.Transport):
    """A connection whose writes go nowhere; it wakes the driver at each response's end."""

    _EXTRA: ClassVar[dict[str, Any]] = {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 8000)}

    def __init__(self) -> None:
        super().__init__()
        self.done: asyncio.Future[None] | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._EXTRA.get(name, default)

    def is_closing(self) -> bool:
        return False

    def write(self, data: Any) -> None:
        if bytes(data[-len(_LAST_CHUNK):]) == _LAST_CHUNK and self.done is not None:
            self.done.set_result(None)

    def writelines(self, list_of_data: Any) -> None:
        self.write(list_of_data[-1])

    def close(self) -> None:
        return None

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None


async def _serve(arm: str, requests: int, chunks: int, profile: Any = None,
                 no_gc: bool = False) -> tuple[float, float]:
    from aiohttp import web

    runner = web.AppRunner(_app(chunks, arm), access_log=None)
    await runner.setup()
    assert runner.server is not None
    protocol = runner.server()
    transport = _Transport()
    protocol.connection_made(transport)
    loop = asyncio.get_running_loop()

    async def one() -> None:
        transport.done = loop.create_future()
        protocol.data_received(_REQUEST)
        await transport.done

    for _ in range(WARMUP):
        await one()
    if no_gc:
        gc.collect()
        gc.disable()
    thread, process = time.thread_time(), time.process_time()
    if profile is not None:
        profile.enable()
    for _ in range(requests):
        await one()
    if profile is not None:
        profile.disable()
    if arm in ("production", "full"):
        import llmtrace

        llmtrace.flush()  # the builder's and exporter's work for these requests, in the process CPU
    return time.thread_time() - thread, time.process_time() - process


def child(arm: str, requests: int, chunks: int, exit_at_once: bool = False, no_gc: bool = False) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _instrument(arm, os.path.join(tmp, "traces.jsonl"))
        thread_s, process_s = asyncio.run(_serve(arm, requests, chunks, no_gc=no_gc))
        print(json.dumps({"thread_us": thread_s / requests * 1e6, "process_us": process_s / requests * 1e6}),
              flush=True)
        if exit_at_once:  # under valgrind: skip the teardown, whose instructions would not cancel out
            os._exit(0)


def profile_report(arm: str, requests: int, chunks: int) -> None:
    """Where the serving thread's time goes in *arm*, by Python function (cProfile)."""
    import cProfile

    profile = cProfile.Profile(time.thread_time_ns, 1e-9)  # the thread's CPU, as the table measures
    with tempfile.TemporaryDirectory() as tmp:
        _instrument(arm, os.path.join(tmp, "traces.jsonl"))
        asyncio.run(_serve(arm, requests, chunks, profile))
    print_profile(profile, requests, arm, ("llmtrace", "opentelemetry", "wrapt", "aiohttp"))


def print_profile(profile: Any, requests: int, label: str, packages: tuple[str, ...], top: int = 25) -> None:
    """Per request: each of *packages*' own time (the rest as ``other``), then the functions of
    the first three (the instrumentation's) by own time. cProfile inflates times several-fold (thread CPU as its clock);
    the calls per request are exact."""
    import pstats

    rows = pstats.Stats(profile).stats  # type: ignore[attr-defined]  # (file, line, name) -> (cc, nc, tt, ct, callers)
    shares = dict.fromkeys((*packages, "other"), 0.0)
    mine = []
    for (file, line, name), (_cc, calls, own, cum, _callers) in rows.items():
        where = file.split("site-packages/")[-1].split("/src/")[-1]  # llmtrace: an editable install
        package = where.split("/")[0] if where != file else "other"
        shares[package if package in packages else "other"] += own
        if package in packages[:3]:
            mine.append((own, cum, calls, f"{where}:{line}({name})"))
    print(f"{label}: µs of own time per request (cProfile-inflated), by package: "
          + ", ".join(f"{package} {own / requests * 1e6:.1f}" for package, own in shares.items()))
    print(f"{'own µs':>8} {'cum µs':>8} {'calls':>6}  function (per request)")
    for own, cum, calls, where in sorted(mine, reverse=True)[:top]:
        print(f"{own / requests * 1e6:8.2f} {cum / requests * 1e6:8.2f} {calls / requests:6.1f}  {where}")


def count_instructions(chunks: int, requests: int, base: int, arms: tuple[str, ...] = ARMS, jobs: int = 1,
                       no_gc: bool = False) -> dict[str, dict[str, float]]:
    """Instructions per request, per arm: ``callgrind`` totals of runs of *requests* and *base*
    requests, differenced (start-up and warm-up cancel out) and divided by their difference.
    The serving (event-loop, main) thread alone, and all threads (builder, exporters: an upper
    bound, as in ``bench_asgi_request.py``)."""
    from _callgrind import per_request

    os.environ["LLMTRACE_METRICS_INTERVAL_S"] = "3600"  # exported once, at flush (see bench_asgi_request.py)
    return per_request(lambda arm, count: [sys.executable, __file__, "--child", arm, "--requests", str(count),
                                           "--chunks", str(chunks), "--exit-at-once",
                                           *(["--no-gc"] if no_gc else [])],
                       arms, requests, base, jobs)


def compare(rows: dict[str, dict[str, float]], measures: tuple[str, str]) -> None:
    """Add what each arm costs beyond ``untraced``, absolute and as a ratio."""
    base = rows["untraced"]
    for arm in [arm for arm in rows if arm != "untraced"]:
        for measure in measures:
            rows[arm][f"added_{measure}"] = rows[arm][measure] - base[measure]
            rows[arm][f"ratio_{measure}"] = rows[arm][measure] / base[measure]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=None, help="counted requests (3000; 600 with --instructions)")
    parser.add_argument("--base", type=int, default=200, help="--instructions: the shorter run's requests")
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
    parser.add_argument("--no-gc", action="store_true",
                        help="with --instructions: the garbage collector off for the counted requests")
    parser.add_argument("--profile", choices=ARMS, help="profile this arm's serving thread by Python function instead")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--exit-at-once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    requests = args.requests or (600 if args.instructions else 3000)
    if args.child:
        child(args.child, requests, args.chunks, args.exit_at_once, args.no_gc)
        return 0
    if args.profile:
        profile_report(args.profile, requests, args.chunks)
        return 0
    if args.instructions:
        chosen = [arm.strip() for arm in args.arms.split(",") if arm.strip()]
        unknown = [arm for arm in chosen if arm not in ARMS]
        if unknown:
            parser.error(f"--arms: unknown {', '.join(unknown)} (known: {', '.join(ARMS)})")
        arms = tuple(arm for arm in ARMS if arm == "untraced" or arm in chosen)
        counted = count_instructions(args.chunks, requests, args.base, arms, args.jobs, args.no_gc)
        compare(counted, ("thread_instructions", "all_instructions"))
        print(json.dumps(counted, indent=2))
        return 0
    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for index in range(args.rounds):
        for arm in ARMS if index % 2 == 0 else reversed(ARMS):
            out = subprocess.run([sys.executable, __file__, "--child", arm, "--requests", str(requests),
                                  "--chunks", str(args.chunks)], check=True, capture_output=True, text=True)
            results[arm].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {index + 1} {arm:<10} {results[arm][-1]['thread_us']:7.1f} µs thread, "
                  f"{results[arm][-1]['process_us']:7.1f} µs process", file=sys.stderr)
    summary = {arm: {measure: statistics.median(r[measure] for r in runs) for measure in ("thread_us", "process_us")}
               for arm, runs in results.items()}
    compare(summary, ("thread_us", "process_us"))
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{requests} requests x {args.chunks} streamed messages, medians of {args.rounds} rounds")
    print(f"{'arm':<11} {'thread µs/req':>14} {'added':>8} {'ratio':>6} "
          f"{'process µs/req':>15} {'added':>8} {'ratio':>6}")
    for arm, row in summary.items():
        print(f"{arm:<11} {row['thread_us']:14.1f} {row.get('added_thread_us', 0.0):8.1f} "
              f"{row.get('ratio_thread_us', 1.0):6.2f} {row['process_us']:15.1f} "
              f"{row.get('added_process_us', 0.0):8.1f} {row.get('ratio_process_us', 1.0):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
