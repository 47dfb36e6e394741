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

On a VM whose speed drifts by more than the budgets, ``--instructions`` counts instead:

    python benchmarks/bench_reference_server.py --instructions --requests 48 --base 16 --max-tokens 16

each arm a fresh server under callgrind, both processes and every thread counted from the end
of the warm-up to the end of its shut-down, a run of --requests and one of --base requests
differenced (:func:`count_server`, :func:`print_instructions`). The engine starts each wave of
--concurrency requests as one batch (``EngineConfig.gather_batch``): every arm runs the same
steps with the same batches, however fast its front end hands requests over, so both processes'
counts are exact (free to batch as they arrive, the engine's count moved by up to ~1.6 % of the
server between runs).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

CONFIGS = {
    "untraced": None,
    "otel": None,  # OpenTelemetry's FastAPI instrumentation alone (10 % of traces), no llmtrace: see child()
    "llmtrace_0": {"sample_ratio": 0.0, "engine_sample_ratio": 0.0},
    "llmtrace_1": {"sample_ratio": 0.01, "engine_sample_ratio": 0.01},
    "production": {"sample_ratio": 0.1, "engine_sample_ratio": 0.1},
    "full": {},
}
#: llmtrace's options under callgrind, which runs the server ~50x slower: engine windows closed by
#: their step count (256 steps, as under load at full speed), not cut 50x shorter by the wall
#: clock; the periodic metric export left to the one at shutdown, which the differencing of two
#: run lengths cancels (every 10 s of wall time it would run once per handful of requests); the
#: span export interval (and with it the span builder's batching pause, a twentieth of it) 50x
#: its default, so that the exporter thread's periodic wake-up and the builder's batches serve
#: as many requests as at full speed rather than one each.
COUNTED_OPTIONS = {"engine_window_s": 3600.0, "metrics_interval_s": 3600.0, "span_export_interval_s": 50.0}
#: The engine's batch limit; a counted run's clients, each wave of them one batch, fit in it.
MAX_BATCH = 16
#: Arms whose instruction counts are mixed into the sampling ratios between them (see
#: :func:`print_instructions`): a request costs what its sampling decision makes it cost.
MIXED = {"llmtrace_1": 0.01, "production": 0.1}
#: The suffix of an arm run with ``--baseline-src``'s llmtrace.
BASELINE = "baseline"
#: The arms run by default: the original three; ``--arms`` picks others.
DEFAULT_ARMS = ("untraced", "full", "production")
#: The arms counted by default with ``--instructions``: the others are mixed from them.
COUNTED_ARMS = ("untraced", "llmtrace_0", "full")


def request_body(index: int, max_tokens: int, greedy: bool) -> dict[str, object]:
    """The *index*-th request of the load: four prompt lengths in turn, streamed; *greedy*:
    temperature 0, so every run streams the same tokens (bench_front_end.py sends the same)."""
    body: dict[str, object] = {"prompt": "benchmark the reference server " * (1 + index % 4),
                               "max_tokens": max_tokens, "stream": True}
    if greedy:
        body["temperature"] = 0.0
    return body


def mixed(off: dict[str, float], full: dict[str, float], ratio: float, names: Iterable[str]) -> dict[str, float]:
    """The expected counts at sampling ratio *ratio*, from an arm sampling nothing (*off*) and one
    sampling everything (*full*): a request costs what its sampling decision makes it cost."""
    return {name: (1 - ratio) * off[name] + ratio * full[name] for name in names}


async def _load(base_url: str, requests: int, concurrency: int, max_tokens: int, greedy: bool = False) -> int:
    """Stream *requests* completions of four prompt lengths in turn, *concurrency* at a time; the
    tokens received. *greedy*: temperature 0, so every run streams the same tokens."""
    import httpx

    limit = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(client: httpx.AsyncClient, index: int) -> None:
        nonlocal tokens
        body = request_body(index, max_tokens, greedy)
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


def _children(pid: int) -> list[int]:
    """The processes whose parent is *pid* (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _server_cpu_s() -> float:
    """This process and its children (the engine process): the whole server."""
    me = os.getpid()
    return _cpu_s(me) + sum(_cpu_s(child) for child in _children(me))


def child(config: str, out: str, counted: bool = False, gather: int = 0) -> None:
    """One server, in this (fresh) process: prints its URL, then its CPU time whenever asked.
    *counted*: run under callgrind (:func:`count_server`), with the clocks that valgrind's
    slowdown would distort taken off (see there); *gather*: the engine's ``gather_batch``."""
    options = CONFIGS[config]
    if options is not None:
        import llmtrace

        if counted:
            options = {**options, **COUNTED_OPTIONS}
        llmtrace.instrument(exporter=f"file:{out}", **options)
    from llmtrace.server.app import create_app
    from llmtrace.server.runner import ServerThread

    app = create_app({"total_blocks": 512, "max_batch": MAX_BATCH, "gather_batch": gather})
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


def count_server(arm: str, requests: int, concurrency: int, max_tokens: int) -> tuple[dict[str, int], int]:
    """({"front end": n, "engine": n, "front end thread 3": n, ...}, tokens): the instructions of
    every thread of the server's two processes, from the end of its warm-up until it has served
    *requests* and shut down (its last spans and metrics exported); a fresh server under callgrind."""
    import _callgrind

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp, "stderr.log")
        command = [*_callgrind.process_tree_command(Path(tmp)), sys.executable, __file__, "--child", arm,
                   "--counted", "--gather", str(concurrency), "--out", str(Path(tmp, "telemetry.jsonl"))]
        with log.open("w") as errors, subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                       stderr=errors, text=True) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                proc.wait()
                raise SystemExit(f"{arm}: the server did not start under valgrind:\n{log.read_text()[-3000:]}")
            url = json.loads(line)["url"]
            asyncio.run(_load(url, concurrency, concurrency, 4))  # warm-up, uncounted
            time.sleep(1.5)
            _callgrind.count_from_now([proc.pid, *_children(proc.pid)])  # the resource tracker is not valgrind's
            # Greedy: sampled, the arms would stream different numbers of tokens (a random model
            # meets its end-of-text token by chance), and a request's count follows its tokens.
            tokens = asyncio.run(_load(url, requests, concurrency, max_tokens, greedy=True))
            proc.stdin.close()  # the server shuts down: the engine and the front end flush their telemetry
            proc.wait(900)
        if proc.returncode != 0:
            raise SystemExit(f"{arm}: the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        _check_exported(arm, Path(tmp, "telemetry.jsonl"), concurrency + requests)
        threads = _callgrind.totals_by_thread(Path(tmp))
    totals: dict[int, int] = {}
    for (pid, _), count in threads.items():
        totals[pid] = totals.get(pid, 0) + count
    front_end = totals.pop(proc.pid)
    totals = {pid: count for pid, count in totals.items() if count}  # a helper started after counting began
    if len(totals) != 1:
        # callgrind writes a process's counts when it exits: an engine killed because it did not stop
        # in time (ENGINE_STOP_TIMEOUT_S, on a machine too busy for valgrind) leaves none.
        raise SystemExit(f"{arm}: expected the counts of one engine process, found {len(totals)} (was it killed "
                         f"at shutdown? run on a machine not otherwise busy, or with fewer --jobs)")
    (engine,) = totals
    by_thread = {f"{'front end' if pid == proc.pid else 'engine'} thread {number}": count
                 for (pid, number), count in sorted(threads.items()) if pid in (proc.pid, engine)}
    return {"front end": front_end, "engine": totals[engine], **by_thread}, tokens


#: Spans every request of a fully traced counted run must have left in its file: the API server's
#: SERVER span and ``llm.request``, the engine's ``llm.decode``.
EXPORTED_PER_REQUEST = ("POST /v1/completions", "llm.request", "llm.decode")


def _check_exported(arm: str, path: Path, served: int) -> None:
    """The counted run's telemetry holds what it should: every span of the *served* requests when
    fully traced, none at 0 %. A count that left spans unexported at shut-down would be too low."""
    if arm not in ("full", "llmtrace_0"):
        return
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines() if path.exists() else ():
        for resource in json.loads(line).get("resourceSpans", ()):
            for scope in resource.get("scopeSpans", ()):
                for span in scope.get("spans", ()):
                    counts[span["name"]] = counts.get(span["name"], 0) + 1
    expected = {name: served if arm == "full" else 0 for name in EXPORTED_PER_REQUEST}
    found = {name: counts.get(name, 0) for name in EXPORTED_PER_REQUEST}
    if found != expected:
        raise SystemExit(f"{arm}: the counted run exported {found} spans, not {expected}: its count is not "
                         f"the whole cost")


def instructions(arms: list[str], requests: int, base: int, concurrency: int, max_tokens: int,
                 jobs: int) -> dict[str, dict[str, float]]:
    """Instructions per request of each arm, by process: the counts of a *requests* run and a *base*
    run differenced (start-up, warm-up and shut-down cancel) and divided by their difference;
    *jobs* servers at once (each its own processes: running side by side changes no count, only
    how the engine's batches fill — which moves the engine's count between any two runs)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = {(arm, n): pool.submit(count_server, arm, n, concurrency, max_tokens)
                for arm in arms for n in (requests, base)}
    result: dict[str, dict[str, float]] = {}
    tokens_per_request: dict[str, float] = {}
    for arm in arms:
        (high, tokens_high), (low, tokens_low) = runs[arm, requests].result(), runs[arm, base].result()
        result[arm] = {name: (high.get(name, 0) - low.get(name, 0)) / (requests - base)
                       for name in sorted(high.keys() | low.keys())}
        result[arm]["server"] = result[arm]["front end"] + result[arm]["engine"]
        tokens_per_request[arm] = (tokens_high - tokens_low) / (requests - base)
        print(f"{arm:<12} {result[arm]['server'] / 1e6:8.3f}M instructions per request "
              f"({tokens_per_request[arm]:.1f} tokens); by thread: "
              + ", ".join(f"{name.replace(' thread ', ' #')} {count / 1e3:.0f}k" for name, count in result[arm].items()
                          if " thread " in name and abs(count) >= 1000), file=sys.stderr)
    if len(set(tokens_per_request.values())) > 1:
        print(f"warning: the arms streamed different numbers of tokens per request ({tokens_per_request}); "
              "their counts do not compare", file=sys.stderr)
    return result


def print_instructions(counted: dict[str, dict[str, float]], requests: int, base: int, concurrency: int,
                       max_tokens: int) -> None:
    """The table of :func:`instructions`, with each arm's ratio of the server's total to untraced's.
    Arms of :data:`MIXED` not measured are mixed from ``llmtrace_0`` and ``full`` when both were:
    at sampling ratio r a request (and an engine window) costs what an unsampled one does with
    probability 1 - r and what a traced one does with probability r, so the expected count is
    the mix; measured directly, a few hundred requests would hold too few sampled ones to say."""
    rows = dict(counted)
    if "llmtrace_0" in counted and "full" in counted:
        for arm, ratio in MIXED.items():
            if arm not in counted:
                rows[f"{arm} (mixed)"] = mixed(counted["llmtrace_0"], counted["full"], ratio,
                                               ("front end", "engine", "server"))
    untraced = counted["untraced"]["server"] if "untraced" in counted else None
    print(f"\nreference server under callgrind: instructions per request (runs of {requests} and {base} "
          f"streamed requests x {max_tokens} tokens, concurrency {concurrency}, differenced), all threads")
    print(f"  {'arm':<22} {'front end':>10} {'engine':>10} {'server':>10} {'ratio':>7}")
    for arm, count in rows.items():
        shown = f"{count['server'] / untraced:.4f}" if untraced else "-"
        print(f"  {arm:<22} {count['front end'] / 1e6:9.3f}M {count['engine'] / 1e6:9.3f}M "
              f"{count['server'] / 1e6:9.3f}M {shown:>7}")


def _arms(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The arms *args* name, checked (a usage error names what is wrong)."""
    default_arms = COUNTED_ARMS if args.instructions else DEFAULT_ARMS
    arms = [arm.strip() for arm in (args.arms or ",".join(default_arms)).split(",") if arm.strip()]
    if args.instructions and args.baseline_src:
        parser.error("--baseline-src compares timings; with --instructions run each tree on its own")
    if args.instructions and args.requests <= args.base:
        parser.error(f"--requests ({args.requests}) must be more than --base ({args.base})")
    if args.instructions and (args.concurrency > MAX_BATCH or args.requests % args.concurrency
                              or args.base % args.concurrency):
        parser.error(f"--instructions: the engine starts each wave of --concurrency requests as one batch, so "
                     f"--concurrency ({args.concurrency}) must be at most {MAX_BATCH} and divide --requests "
                     f"({args.requests}) and --base ({args.base})")
    if args.baseline_src and not Path(args.baseline_src, "src", "llmtrace", "__init__.py").is_file():
        parser.error(f"--baseline-src {args.baseline_src}: no src/llmtrace/__init__.py there (give the checkout's "
                     f"root, not its src/)")
    if args.baseline_src:
        arms += [f"{arm}@{BASELINE}" for arm in arms if arm in CONFIGS and arm != "untraced"]
    unknown = [arm for arm in arms if arm.partition("@")[0] not in CONFIGS]
    if unknown or ("untraced" not in arms and not args.instructions):  # counts compare across runs
        parser.error(f"--arms: {', '.join(unknown) or 'untraced missing'} (known: {', '.join(CONFIGS)}; "
                     "untraced is the baseline and must be one of them)")
    return arms


def timed_rounds(args: argparse.Namespace, arms: list[str]) -> dict[str, dict[str, float]]:
    """Interleaved rounds of every arm, timed in wall and server CPU; the table of their medians."""
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
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--parallel", action="store_true",
                        help="load all three servers at once in each round (paired ratios: the same noise hits "
                             "every arm); tokens/s is then shared between them and only the CPU ratio compares")
    parser.add_argument("--arms", help=f"comma-separated arms, untraced first (of {', '.join(CONFIGS)}; default "
                                       f"{','.join(DEFAULT_ARMS)}, with --instructions {','.join(COUNTED_ARMS)})")
    parser.add_argument("--baseline-src", metavar="DIR",
                        help=f"another checkout (e.g. a `git worktree` of main): each traced arm also runs as "
                             f"ARM@{BASELINE} with that checkout's llmtrace, interleaved in the same rounds")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per request under valgrind's callgrind instead of timing: every "
                             "thread of both processes, a run of --requests and one of --base differenced; "
                             "10 %% and 1 %% sampling mixed from the 0 %% and full arms (slow: minutes per arm)")
    parser.add_argument("--base", type=int, default=32,
                        help="with --instructions: requests in the shorter run (default 32)")
    parser.add_argument("--jobs", type=int, default=2, help="with --instructions: servers counted at once (default 2)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object at the end")
    parser.add_argument("--child", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gather", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.out, args.counted, args.gather)
        return
    arms = _arms(parser, args)
    if args.instructions:
        summary = instructions(arms, args.requests, args.base, args.concurrency, args.max_tokens, args.jobs)
        print_instructions(summary, args.requests, args.base, args.concurrency, args.max_tokens)
    else:
        summary = timed_rounds(args, arms)
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
