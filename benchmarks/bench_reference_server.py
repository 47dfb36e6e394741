"""Reference-server throughput, traced vs untraced, as ratios measured in one run.

Three configurations, each in a fresh server process (the API front end plus its
engine process), interleaved over several rounds so that machine noise hits
them alike:

* ``untraced``   — no llmtrace at all;
* ``full``       — ``llmtrace.instrument()`` with every request and every engine window traced;
* ``production`` — 10% of requests (``sample_ratio=0.1``) and 10% of engine windows.

The load generator (this process) sends the same fixed set of streaming
completions (concurrency C) to each. Two measures per run:

* **tokens per second** of wall time — the throughput a client sees; on a quiet
  host this is the number, on a shared one it swings with the neighbours;
* **tokens per CPU-second of the server** (front end + engine process, all
  threads, export included) — what tracing costs the server; the load
  generator is not in it. On a CPU-bound server (this one: the "GPU" is the
  CPU) the two agree on a quiet host;
* **llmtrace's own threads' share** of that CPU (span builder + exporters in
  both processes, from the server's ``/stats``, i.e. ``llmtrace.overhead_cpu_s()``)
  — measured by the threads themselves, so it holds on a busy host too. What it
  leaves out runs on the server's threads and is measured per call by
  ``bench_lifecycle.py`` and ``bench_engine_step.py``.

Budget: full >= 0.97, production >= 0.995 of untraced.

    python benchmarks/bench_reference_server.py [--rounds 3] [--requests 96] [--concurrency 16]
    python benchmarks/bench_reference_server.py --parallel --rounds 8   # paired: all arms at once

With ``--parallel`` the three servers run side by side and are loaded at the same time,
so a noisy neighbour or a CPU-frequency change hits every arm alike: each round gives
a paired ratio of tokens per server CPU-second, and the median of those is reported.
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
from pathlib import Path

CONFIGS = {
    "untraced": None,
    "otel": None,  # OpenTelemetry's FastAPI instrumentation alone (10 % of traces), no llmtrace: see child()
    "llmtrace_0": {"sample_ratio": 0.0, "engine_sample_ratio": 0.0},
    "llmtrace_1": {"sample_ratio": 0.01, "engine_sample_ratio": 0.01},
    "production": {"sample_ratio": 0.1, "engine_sample_ratio": 0.1},
    "full": {},
}
#: The suffix of an arm run with ``--baseline-src``'s llmtrace.
BASELINE = "baseline"
#: The arms run by default: the original three; ``--arms`` picks others.
DEFAULT_ARMS = ("untraced", "full", "production")


async def _load(base_url: str, requests: int, concurrency: int, max_tokens: int) -> int:
    import httpx

    limit = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(client: httpx.AsyncClient, index: int) -> None:
        nonlocal tokens
        body = {"prompt": "benchmark the reference server " * (1 + index % 4), "max_tokens": max_tokens,
                "stream": True}
        async with limit, client.stream("POST", base_url + "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                tokens += line.startswith("data:") and line != "data: [DONE]"

    async with httpx.AsyncClient(timeout=300) as client:
        await asyncio.gather(*(one(client, i) for i in range(requests)))
    return tokens


def _cpu_s(pid: int) -> float:
    """User + system CPU of a live process, all threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_cpu_s() -> float:
    """This process and its children (the engine process): the whole server."""
    me = os.getpid()
    total = _cpu_s(me)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                total += _cpu_s(int(entry.name))
    return total


def child(config: str, out: str) -> None:
    """One server, in this (fresh) process: prints its URL, then its CPU time whenever asked."""
    options = CONFIGS[config]
    if options is not None:
        import llmtrace

        llmtrace.instrument(exporter=f"file:{out}", **options)
    from llmtrace.server.app import create_app
    from llmtrace.server.runner import ServerThread

    app = create_app({"total_blocks": 512, "max_batch": 16})
    if config == "otel":  # what a user gets from OpenTelemetry alone: the HTTP layer, 10 % of traces
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        FastAPIInstrumentor.instrument_app(
            app, tracer_provider=TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1))),
            meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]), exclude_spans=["send", "receive"])
    with ServerThread(app) as base_url:
        print(json.dumps({"url": base_url}), flush=True)
        for line in sys.stdin:
            if line.strip() != "cpu":
                break
            print(json.dumps({"cpu_s": _server_cpu_s()}), flush=True)


class Server:
    """One server for *config* in a fresh process (front end + engine process), asked over a pipe
    for its CPU time and over HTTP for llmtrace's own threads' share of it."""

    def __init__(self, arm: str, out: str, baseline_src: str | None = None) -> None:
        self.arm = arm
        config, _, tree = arm.partition("@")
        env = dict(os.environ)
        if tree == BASELINE and baseline_src:  # the same arm, another checkout's llmtrace
            env["PYTHONPATH"] = os.pathsep.join(p for p in (f"{baseline_src}/src", env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", config, "--out", out],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.url: str = json.loads(self.stdout.readline())["url"]

    def cpu(self) -> tuple[float, dict[str, float]]:
        """(server CPU, llmtrace's own threads by ``process.worker``), seconds so far."""
        import httpx

        stats = httpx.get(self.url + "/stats", timeout=30).json()
        ours = {f"{process}.{worker}": seconds for process, by_worker in stats.get("llmtrace_cpu_s", {}).items()
                for worker, seconds in by_worker.items()}
        self.stdin.write("cpu\n")
        self.stdin.flush()
        return float(json.loads(self.stdout.readline())["cpu_s"]), ours

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(120)


def _result(tokens: int, elapsed: float, before: tuple[float, dict[str, float]],
            after: tuple[float, dict[str, float]], requests: int) -> dict[str, float]:
    cpu = after[0] - before[0]
    # Each llmtrace thread's share on its own (e.g. ``share.engine.span_builder``): where the cost is.
    shares = {f"share.{name}": (seconds - before[1].get(name, 0.0)) / cpu for name, seconds in after[1].items()}
    return {"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed, "tokens_per_cpu_s": tokens / cpu,
            "cpu_ms_per_request": cpu / requests * 1000, "llmtrace_thread_share": sum(shares.values()), **shares}


def _shares(run: dict[str, float]) -> str:
    return ", ".join(f"{name.removeprefix('share.')} {value:.2%}" for name, value in run.items()
                     if name.startswith("share."))


def measure(configs: list[str], tmp: str, tag: str, requests: int, concurrency: int,
            max_tokens: int, baseline_src: str | None = None) -> dict[str, dict[str, float]]:
    """Start a server per config, warm them up, then load them *at the same time* and time each
    in wall and server CPU. With one config this is a plain sequential measurement; with
    several, every arm sees the same machine noise, so their ratios are paired."""
    servers = [Server(config, str(Path(tmp) / f"{config}-{tag}.jsonl"), baseline_src) for config in configs]
    try:

        async def load_all(n: int, tokens: int) -> list[tuple[int, float]]:
            async def timed(server: Server) -> tuple[int, float]:
                start = time.perf_counter()
                count = await _load(server.url, n, concurrency, tokens)
                return count, time.perf_counter() - start

            return list(await asyncio.gather(*(timed(server) for server in servers)))

        asyncio.run(load_all(concurrency, 4))  # warm-up: model, sockets, caches
        time.sleep(1.5)  # let warm-up windows close and export
        before = [server.cpu() for server in servers]
        loads = asyncio.run(load_all(requests, max_tokens))
        time.sleep(1.5)  # the last engine windows close (1 s) and their spans are exported, on the server's CPU
        after = [server.cpu() for server in servers]
    finally:
        for server in servers:
            server.close()
    return {server.arm: _result(tokens, elapsed, b, a, requests)
            for server, (tokens, elapsed), b, a in zip(servers, loads, before, after, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--parallel", action="store_true",
                        help="load all three servers at once in each round (paired ratios: the same noise hits "
                             "every arm); tokens/s is then shared between them and only the CPU ratio compares")
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                        help=f"comma-separated arms, untraced first (of {', '.join(CONFIGS)}; "
                             f"default {','.join(DEFAULT_ARMS)})")
    parser.add_argument("--baseline-src", metavar="DIR",
                        help=f"another checkout (e.g. a `git worktree` of main): each traced arm also runs as "
                             f"ARM@{BASELINE} with that checkout's llmtrace, interleaved in the same rounds")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object at the end")
    parser.add_argument("--child", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.out)
        return
    arms = [arm.strip() for arm in args.arms.split(",") if arm.strip()]
    if args.baseline_src and not Path(args.baseline_src, "src", "llmtrace", "__init__.py").is_file():
        parser.error(f"--baseline-src {args.baseline_src}: no src/llmtrace/__init__.py there (give the checkout's "
                     f"root, not its src/)")
    if args.baseline_src:
        arms += [f"{arm}@{BASELINE}" for arm in arms if arm in CONFIGS and arm != "untraced"]
    unknown = [arm for arm in arms if arm.partition("@")[0] not in CONFIGS]
    if unknown or "untraced" not in arms:
        parser.error(f"--arms: {', '.join(unknown) or 'untraced missing'} (known: {', '.join(CONFIGS)}; "
                     "untraced is the baseline and must be one of them)")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            order = list(arms) if round_index % 2 == 0 else list(reversed(arms))  # ABC, CBA, ...
            batches = [order] if args.parallel else [[name] for name in order]
            for batch in batches:
                for name, run in measure(batch, tmp, str(round_index), args.requests, args.concurrency,
                                         args.max_tokens, args.baseline_src).items():
                    results[name].append(run)
                    print(f"round {round_index + 1}: {name:<10} {run['tokens_per_s']:8.1f} tokens/s  "
                          f"{run['tokens_per_cpu_s']:8.1f} tokens/server-CPU-s  "
                          f"llmtrace threads {run['llmtrace_thread_share']:.2%} of server CPU "
                          f"({_shares(run)})", file=sys.stderr)
    if args.parallel:  # paired: each round's ratio, then the median and range of those
        for name in arms:
            ratios = sorted(r["tokens_per_cpu_s"] / u["tokens_per_cpu_s"]
                            for r, u in zip(results[name], results["untraced"], strict=True))
            print(f"paired CPU ratio {name:<10} median {statistics.median(ratios):.3f} "
                  f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})", file=sys.stderr)
    keys = ("tokens_per_s", "tokens_per_cpu_s", "cpu_ms_per_request", "llmtrace_thread_share")
    summary = {name: {key: statistics.median(r[key] for r in runs) for key in keys} for name, runs in results.items()}
    base = summary["untraced"]
    print(f"\nreference server, {args.requests} streaming requests x {args.max_tokens} tokens, "
          f"concurrency {args.concurrency}, median of {args.rounds} interleaved rounds:")
    print(f"  {'':<10} {'tokens/s':>9} {'ratio':>6}   {'tokens/server-CPU-s':>19} {'ratio':>6}"
          f"   {'CPU ms/request':>14}   {'llmtrace threads':>16}")
    for name, values in summary.items():
        values["wall_ratio"] = values["tokens_per_s"] / base["tokens_per_s"]
        values["cpu_ratio"] = values["tokens_per_cpu_s"] / base["tokens_per_cpu_s"]
        print(f"  {name:<10} {values['tokens_per_s']:9.1f} {values['wall_ratio']:6.3f}   "
              f"{values['tokens_per_cpu_s']:19.1f} {values['cpu_ratio']:6.3f}   "
              f"{values['cpu_ms_per_request']:14.2f}   {values['llmtrace_thread_share']:15.2%}")
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
