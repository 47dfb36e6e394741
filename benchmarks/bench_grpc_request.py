"""CPU per RPC in a gRPC server: untraced, OpenTelemetry's own instrumentation, llmtrace.

The gRPC counterpart of ``bench_asgi_request.py``: OpenTelemetry's gRPC server
instrumentation and llmtrace's own SERVER span (``integrations/grpc/server_span.py``) on one
RPC path: a unary-stream RPC yielding *chunks* messages (as a streamed completion does),
served through generic handlers with bytes messages (no protoc step).

A gRPC server is reached through a real channel, so the client runs in another process over
loopback and only the server process is counted. One client at a time: ``--server sync``
(``grpc.server`` with one worker thread, so the handler always runs on the same thread) or
``--server aio`` (``grpc.aio.server`` on an asyncio loop in the main thread). The client
warms up, sends a ``Mark`` RPC (the server reads its clocks), the counted RPCs, then ``Quit``.

Arms, each in a fresh server process (instrumentation is process-wide), interleaved ABCD DCBA:

* ``untraced``: the bare server;
* ``otel``: what a user gets from OpenTelemetry alone — ``GrpcInstrumentorServer`` (or
  ``GrpcAioInstrumentorServer``) with an SDK tracer provider (parent-based, 10 % of traces),
  an SDK meter provider with a reader set globally (the gRPC instrumentation records no
  metrics); no span exporter;
* ``production``: ``llmtrace.instrument(sample_ratio=0.1)`` (llmtrace's interceptor makes the
  SERVER span; OpenTelemetry's is not enabled);
* ``full``: ``llmtrace.instrument()``, every RPC traced and exported to a file.

Two measures per RPC: the serving thread's CPU (the one running the handler and the
interceptors) and the whole server process's CPU (gRPC's poll and core threads, the span
builder and exporters). Medians over the rounds.

    python benchmarks/bench_grpc_request.py [--server sync|aio] [--requests 2000] [--rounds 3] [--json]
    python benchmarks/bench_grpc_request.py --instructions [--server aio] [--requests 600 --base 200]
    python benchmarks/bench_grpc_request.py --profile production [--server aio]   # by Python function

CPU time on a shared VM moves by 2x between runs of the same arm (the host's speed changes),
so read the CPU-time table as ratios within a round; ``--instructions`` counts instead. Under
valgrind the serving thread is found by a marker: only the ``Mark`` handler calls
``getpriority``, so the thread whose callgrind profile holds that function is the one. Two
runs of the same arm agreed within ~1 % on the serving thread and ~4 % on all threads (gRPC's
own threads) on 2026-12-03; the CPU-time table moved by up to 2x between rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_aiohttp_request import compare, print_profile

ARMS = ("untraced", "otel", "production", "full")
WARMUP = 200  # RPCs before the count: channel, handlers and caches warm
SERVICE = "bench.Bench"
CLIENT_WAIT_S = 1800  # the server may start slowly under valgrind
MARKER = "getpriority"  # libc function called by nothing in the server but the Mark handler


def _instrument(arm: str, out: str) -> None:
    if arm in ("production", "full"):
        import llmtrace

        llmtrace.instrument(exporter=f"file:{out}", gpu="off",
                            **({"sample_ratio": 0.1} if arm == "production" else {}))
    elif arm == "otel":
        from opentelemetry import metrics, trace
        from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorServer, GrpcInstrumentorServer
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        tracer_provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1)))
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
        GrpcInstrumentorServer().instrument(tracer_provider=tracer_provider)
        GrpcAioInstrumentorServer().instrument(tracer_provider=tracer_provider)


class _Clocks:
    """The serving thread's and the process's CPU at Mark and at Quit (read on the serving thread)."""

    def __init__(self, arm: str, profile: Any = None) -> None:
        self.arm = arm
        self.profile = profile  # a cProfile.Profile, on for the counted RPCs
        self.marked = (0.0, 0.0)
        self.quit = (0.0, 0.0)
        self.done = threading.Event()
        self.on_stop: Any = None  # grpc.aio: wakes the loop (no polling that would count as per-RPC work)

    def mark(self) -> None:
        os.getpriority(os.PRIO_PROCESS, 0)  # the marker (see the module docstring)
        self.marked = time.thread_time(), time.process_time()
        if self.profile is not None:
            self.profile.enable()

    def stop(self) -> None:
        if self.profile is not None:
            self.profile.disable()
        if self.arm in ("production", "full"):
            import llmtrace

            llmtrace.flush()  # the builder's and exporter's work for these RPCs, in the process CPU
        self.quit = time.thread_time(), time.process_time()
        self.done.set()
        if self.on_stop is not None:
            self.on_stop()


def _handlers(grpc: Any, clocks: _Clocks, messages: list[bytes], aio: bool) -> Any:
    if aio:
        async def generate(request: bytes, context: Any) -> Any:
            for message in messages:
                yield message

        async def mark(request: bytes, context: Any) -> bytes:
            clocks.mark()
            return b""

        async def quit_(request: bytes, context: Any) -> bytes:
            clocks.stop()
            return b""
    else:
        def generate(request: bytes, context: Any) -> Any:  # type: ignore[misc]
            yield from messages

        def mark(request: bytes, context: Any) -> bytes:  # type: ignore[misc]
            clocks.mark()
            return b""

        def quit_(request: bytes, context: Any) -> bytes:  # type: ignore[misc]
            clocks.stop()
            return b""

    # No (de)serializers: the handlers see and return the messages' bytes.
    return grpc.method_handlers_generic_handler(SERVICE, {
        "Generate": grpc.unary_stream_rpc_method_handler(generate),
        "Mark": grpc.unary_unary_rpc_method_handler(mark),
        "Quit": grpc.unary_unary_rpc_method_handler(quit_),
    })


def _serve_sync(clocks: _Clocks, messages: list[bytes], port: int) -> Any:
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    server = grpc.server(ThreadPoolExecutor(max_workers=1), handlers=[_handlers(grpc, clocks, messages, aio=False)])
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    clocks.done.wait()
    return server


def _serve_aio(clocks: _Clocks, messages: list[bytes], port: int) -> None:
    import asyncio

    import grpc

    async def serve() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handlers(grpc, clocks, messages, aio=True),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        stopped = asyncio.Event()
        clocks.on_stop = stopped.set  # called on the loop, by the Quit handler
        await server.start()
        await stopped.wait()
        await server.stop(None)

    asyncio.run(serve())


def server_child(arm: str, kind: str, port: int, requests: int, chunks: int, exit_at_once: bool,
                 profile: bool = False) -> None:
    import cProfile

    messages = [f"token {index}".encode() for index in range(chunks - 1)] + [b"[DONE]"]
    with tempfile.TemporaryDirectory() as tmp:
        _instrument(arm, os.path.join(tmp, "traces.jsonl"))
        clocks = _Clocks(arm, cProfile.Profile(time.thread_time_ns, 1e-9) if profile else None)  # thread CPU
        server = _serve_sync(clocks, messages, port) if kind == "sync" else _serve_aio(clocks, messages, port)
        if clocks.profile is not None:
            print_profile(clocks.profile, requests, f"{arm} ({kind})", ("llmtrace", "opentelemetry", "wrapt", "grpc"))
        (thread_0, process_0), (thread_1, process_1) = clocks.marked, clocks.quit
        print(json.dumps({"thread_us": (thread_1 - thread_0) / requests * 1e6,
                          "process_us": (process_1 - process_0) / requests * 1e6}), flush=True)
        if exit_at_once:  # under valgrind: skip the teardown, whose instructions would not cancel out
            os._exit(0)
        if server is not None:
            server.stop(None)


def client_child(port: int, requests: int) -> None:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=CLIENT_WAIT_S)
        generate = channel.unary_stream(f"/{SERVICE}/Generate")
        for _ in range(WARMUP):
            for _message in generate(b"{}"):
                pass
        channel.unary_unary(f"/{SERVICE}/Mark")(b"")
        for _ in range(requests):
            for _message in generate(b"{}"):
                pass
        with contextlib.suppress(grpc.RpcError):  # the server may exit before its answer is out
            channel.unary_unary(f"/{SERVICE}/Quit")(b"")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _callgrind(argv: list[str]) -> tuple[int, int]:
    """Run the server *argv* under callgrind (one profile per thread): the serving thread's
    instructions (the thread holding the marker) and all threads'."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "cg.out")
        subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                        *argv], capture_output=True, text=True, check=True)
        serving, every = [], 0
        for path in Path(tmp).glob("cg.out-*"):
            text = path.read_text(errors="replace")
            total = int(re.findall(r"^summary: (\d+)", text, re.MULTILINE)[-1])
            every += total
            if re.search(rf"^c?fn=\(\d+\) {MARKER}$", text, re.MULTILINE):
                serving.append(total)
        if len(serving) != 1:
            raise SystemExit(f"the marker {MARKER} is in {len(serving)} threads' profiles, not one")
        return serving[0], every


def run_arm(arm: str, kind: str, requests: int, chunks: int, valgrind: bool = False, profile: bool = False) -> Any:
    """One server process with its client: the server's output (its last line: JSON), or under
    *valgrind* its (serving thread, all threads) instructions."""
    port = _free_port()
    client = subprocess.Popen([sys.executable, __file__, "--client", str(port), "--requests", str(requests)],
                              env={**os.environ, "GRPC_VERBOSITY": "NONE"})  # not its log of the server leaving
    server = [sys.executable, __file__, "--child", arm, "--server", kind, "--port", str(port),
              "--requests", str(requests), "--chunks", str(chunks), *(["--profile", arm] if profile else [])]
    try:
        if valgrind:
            return _callgrind([*server, "--exit-at-once"])
        return subprocess.run(server, check=True, capture_output=True, text=True).stdout
    finally:
        if client.wait(timeout=60) != 0:
            raise SystemExit(f"the client of the {arm} arm failed")


def count_instructions(kind: str, chunks: int, requests: int, base: int) -> dict[str, dict[str, float]]:
    """Instructions per RPC, per arm: ``callgrind`` totals of runs of *requests* and *base* RPCs,
    differenced (start-up and warm-up cancel out) and divided by their difference."""
    result: dict[str, dict[str, float]] = {}
    for arm in ARMS:
        (thread_hi, all_hi) = run_arm(arm, kind, requests, chunks, valgrind=True)
        (thread_lo, all_lo) = run_arm(arm, kind, base, chunks, valgrind=True)
        result[arm] = {"thread_instructions": (thread_hi - thread_lo) / (requests - base),
                       "all_instructions": (all_hi - all_lo) / (requests - base)}
        print(f"{arm:<11} {result[arm]['thread_instructions'] / 1000:8.1f}k instructions per RPC on the "
              f"serving thread, {result[arm]['all_instructions'] / 1000:8.1f}k in all threads", file=sys.stderr)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=("sync", "aio"), default="sync")
    parser.add_argument("--requests", type=int, default=None, help="counted RPCs (2000; 600 with --instructions)")
    parser.add_argument("--base", type=int, default=200, help="--instructions: the shorter run's RPCs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=33, help="streamed messages per RPC (32 tokens + [DONE])")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per RPC under valgrind instead (stable on a noisy host; slow)")
    parser.add_argument("--profile", choices=ARMS, help="profile this arm's serving thread by Python function instead")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--client", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--exit-at-once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    requests = args.requests or (600 if args.instructions else 2000)
    if args.client:
        client_child(args.client, requests)
        return 0
    if args.child:
        server_child(args.child, args.server, args.port, requests, args.chunks, args.exit_at_once,
                     args.profile is not None)
        return 0
    if args.profile:
        print(run_arm(args.profile, args.server, requests, args.chunks, profile=True), end="")
        return 0
    if args.instructions:
        counted = count_instructions(args.server, args.chunks, requests, args.base)
        compare(counted, ("thread_instructions", "all_instructions"))
        print(json.dumps(counted, indent=2))
        return 0
    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for index in range(args.rounds):
        for arm in ARMS if index % 2 == 0 else reversed(ARMS):
            results[arm].append(json.loads(run_arm(arm, args.server, requests, args.chunks).splitlines()[-1]))
            print(f"round {index + 1} {arm:<10} {results[arm][-1]['thread_us']:7.1f} µs thread, "
                  f"{results[arm][-1]['process_us']:7.1f} µs process", file=sys.stderr)
    summary = {arm: {measure: statistics.median(r[measure] for r in runs) for measure in ("thread_us", "process_us")}
               for arm, runs in results.items()}
    compare(summary, ("thread_us", "process_us"))
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"grpc {args.server} server: {requests} RPCs x {args.chunks} streamed messages, "
          f"medians of {args.rounds} rounds")
    print(f"{'arm':<11} {'thread µs/RPC':>14} {'added':>8} {'ratio':>6} "
          f"{'process µs/RPC':>15} {'added':>8} {'ratio':>6}")
    for arm, row in summary.items():
        print(f"{arm:<11} {row['thread_us']:14.1f} {row.get('added_thread_us', 0.0):8.1f} "
              f"{row.get('ratio_thread_us', 1.0):6.2f} {row['process_us']:15.1f} "
              f"{row.get('added_process_us', 0.0):8.1f} {row.get('ratio_process_us', 1.0):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
