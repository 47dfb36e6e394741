"""``llmtrace demo``: the reference server, traced, under a bounded load — then the analysis.

1. instruments this process (spans where ``LLMTRACE_EXPORTER`` sends them when it is
   set, else to the ``--output`` file and to OTLP too when an endpoint is configured:
   :func:`demo_export`), starts the reference server on a free loopback port (API front
   end here, engine in its own process, which exports to the same places);
2. drives a self-stopping load over loopback: a steady Poisson stream, a burst
   that overfills the KV-cache budget (so preemption happens), then long-tail
   prompt lengths; a few clients disconnect mid-stream;
3. stops the server (the engine flushes its spans), then runs ``llmtrace analyze``
   on the file this run wrote, or says where the spans went when no file has them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmtrace.config import resolve

#: Requests per second of the steady and long-tail phases; the 2-core reference engine
#: serves ~5-10/s, so the burst on top of it builds a queue.
ARRIVAL_RATE_PER_S = 4.0
BURST_SIZE = 24
#: Share of streaming clients that hang up after a few chunks (shows ``abort``).
DISCONNECT_SHARE = 0.03
DEFAULT_OUTPUT = "llmtrace-demo-traces.jsonl"
#: KV budget of the demo engine: 48 blocks of 16 tokens is less than 16 running requests
#: need at their longest, so a burst forces preemption.
DEMO_ENGINE = {"total_blocks": 48, "block_size": 16, "max_batch": 16}
_WORDS = ("the model", "a request", "tokens", "batch", "queue", "prefill", "decode", "GPU", "latency",
          "stream", "server", "kernel", "cache", "scheduler", "trace", "span", "window", "step")


@dataclass(frozen=True)
class PlannedRequest:
    at_s: float
    prompt_words: int
    max_tokens: int
    stream: bool
    chat: bool
    disconnect_after: int | None
    phase: str


def plan_load(duration_s: float, max_requests: int | None, seed: int = 0) -> list[PlannedRequest]:
    """The arrival schedule: steady, burst at the midpoint, then long-tail prompt lengths."""
    rng = random.Random(seed)
    plan: list[PlannedRequest] = []
    t = 0.0
    half = duration_s / 2
    while t < duration_s:
        t += rng.expovariate(ARRIVAL_RATE_PER_S)
        long_tail = t >= half
        words = int(min(220, rng.lognormvariate(3.0, 0.9))) if long_tail else rng.randint(5, 30)
        plan.append(_request(rng, t, max(1, words), "long-tail" if long_tail else "steady"))
    plan.extend(_request(rng, half, rng.randint(10, 40), "burst") for _ in range(BURST_SIZE))
    plan.sort(key=lambda r: r.at_s)
    return plan[:max_requests] if max_requests else plan


def _request(rng: random.Random, at_s: float, words: int, phase: str) -> PlannedRequest:
    stream = rng.random() < 0.8
    disconnect = rng.randint(2, 5) if stream and rng.random() < DISCONNECT_SHARE else None
    return PlannedRequest(at_s, words, rng.randint(8, 48), stream, rng.random() < 0.3, disconnect, phase)


async def _send(client: Any, base_url: str, req: PlannedRequest, rng: random.Random) -> str:
    prompt = " ".join(rng.choice(_WORDS) for _ in range(req.prompt_words))
    body: dict[str, Any] = {"max_tokens": req.max_tokens, "stream": req.stream, "temperature": 0.8, "top_p": 0.95}
    if req.chat:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
    else:
        path, body["prompt"] = "/v1/completions", prompt
    if not req.stream:
        response = await client.post(base_url + path, json=body)
        return "ok" if response.status_code == 200 else f"http {response.status_code}"
    chunks = 0
    async with client.stream("POST", base_url + path, json=body) as response:
        if response.status_code != 200:
            return f"http {response.status_code}"
        async for line in response.aiter_lines():
            chunks += line.startswith("data:")
            if req.disconnect_after is not None and chunks >= req.disconnect_after:
                return "disconnected"
    return "ok"


async def drive_load(base_url: str, plan: list[PlannedRequest], concurrency: int,
                     progress: Any | None = None) -> dict[str, int]:
    """Send the planned requests on time (at most *concurrency* in flight); count outcomes."""
    import httpx

    outcomes: dict[str, int] = {}
    limit = asyncio.Semaphore(concurrency)
    rng = random.Random(1)
    start = time.monotonic()
    done = 0

    async def one(client: httpx.AsyncClient, req: PlannedRequest) -> None:
        nonlocal done
        await asyncio.sleep(max(0.0, req.at_s - (time.monotonic() - start)))
        async with limit:
            try:
                outcome = await _send(client, base_url, req, rng)
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        done += 1
        if progress is not None:
            progress(done, len(plan))

    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
        await asyncio.gather(*(one(client, req) for req in plan))
    return outcomes


@dataclass(frozen=True)
class DemoExport:
    """Where the demo's spans go: the ``exporter`` option of both processes, the file the
    analysis reads (None: none has them) and whether the demo owns that file."""

    exporter: str
    file: str | None
    #: The demo's own file is replaced; a file the user named in LLMTRACE_EXPORTER is appended
    #: to (it may hold a service's traces), and only this run's traces in it are analysed.
    replace: bool
    endpoint: str | None = None

    def describe(self) -> str:
        """Where the spans go, in words: ``file /abs/x.jsonl and OTLP http://collector:4317``."""
        places = [self._place(item) for item in self.exporter.split(",") if item != "none"]
        return " and ".join(places) or "nowhere (LLMTRACE_EXPORTER=none)"

    def _place(self, item: str) -> str:
        if item.startswith("file:"):
            return f"file {item[5:]}"
        if item == "otlp":
            return f"OTLP {self.endpoint or '(the default endpoint)'}"
        return item


def demo_export(output: str | None, environ: Mapping[str, str]) -> DemoExport:
    """``--output`` names the file (the user's other exporters, e.g. ``otlp``, are kept); without
    it, ``LLMTRACE_EXPORTER`` is honoured as it stands; with neither, the demo's own file, and
    OTLP too when an endpoint is configured. Paths are made absolute for the engine process."""
    settings = resolve({}, environ)  # an invalid variable stops the demo here, before it starts
    if output is None and environ.get("LLMTRACE_EXPORTER"):
        exporters = [f"file:{os.path.abspath(item[5:])}" if item.startswith("file:") else item
                     for item in settings.exporters]
        path = os.path.abspath(settings.export_file) if settings.export_file else None
        return DemoExport(",".join(exporters) or "none", path, replace=False, endpoint=settings.endpoint)
    path = os.path.abspath(output or DEFAULT_OUTPUT)
    others = [item for item in settings.exporters if not item.startswith("file:")]
    return DemoExport(",".join([f"file:{path}", *others]), path, replace=True, endpoint=settings.endpoint)


def run_demo(args: argparse.Namespace) -> int:
    """Entry point of ``llmtrace demo`` (see ``llmtrace demo --help``)."""
    import llmtrace
    from llmtrace.cli._progress import Progress
    from llmtrace.server.app import create_app
    from llmtrace.server.runner import ServerThread

    export = demo_export(args.output, os.environ)
    if export.replace and export.file is not None and os.path.exists(export.file):
        os.remove(export.file)  # the analysis must see this run only
    started_ns = time.time_ns()
    os.environ.setdefault("LLMTRACE_QUIET", "1")
    llmtrace.instrument(exporter=export.exporter, service_name="llmtrace-demo", metrics_interval_s=5.0)
    plan = plan_load(args.duration_s, args.requests)
    print(f"llmtrace demo: {len(plan)} requests over ~{args.duration_s:.0f}s "
          f"(steady, a burst of {BURST_SIZE}, long-tail prompts); traces -> {export.describe()}", file=sys.stderr)
    print("starting the reference server (API front end + engine process)...", file=sys.stderr)
    server = ServerThread(create_app(DEMO_ENGINE))
    base_url = server.start()
    bar = Progress("requests", unit="requests", enabled=None)
    started = time.monotonic()
    try:
        outcomes = asyncio.run(drive_load(base_url, plan, args.concurrency, bar))
    finally:
        bar.close()
        server.stop()  # the engine process flushes its spans before it exits
        llmtrace.flush(timeout_s=10.0)
    elapsed = time.monotonic() - started
    print(f"load done in {elapsed:.1f}s: {json.dumps(outcomes, sort_keys=True)}", file=sys.stderr)
    llmtrace.shutdown(timeout_s=10.0)
    return _analyse(export, args, started_ns)


def _analyse(export: DemoExport, args: argparse.Namespace, started_ns: int) -> int:
    """``llmtrace analyze`` on this run's traces in the file, or where they went instead."""
    if export.file is None:
        print(f"traces: sent to {export.describe()}; no file holds them, so there is nothing to analyse here "
              "(a Jaeger behind the collector: llmtrace analyze http://JAEGER:16686 --service llmtrace-demo; "
              "or add a file: --output demo.jsonl)")
        return 0
    # A file that also holds earlier traces: this run's start on.
    since = [] if export.replace else ["--since", f"{started_ns / 1e9:.6f}"]
    command = " ".join(["llmtrace analyze", export.file, *since])
    if args.no_analysis:
        print(f"traces: {export.file}\nanalyse them with: {command}")
        return 0
    from llmtrace.cli import build_parser

    argv = ["analyze", export.file, *since]
    for flag, value in (("--json", args.json), ("--html", args.html)):
        if value:
            argv += [flag, value]
    analyze_args = build_parser().parse_args(argv)
    code: int = analyze_args.func(analyze_args)
    print(f"\ntraces: {export.file}  ({command} --html report.html)")
    return code
