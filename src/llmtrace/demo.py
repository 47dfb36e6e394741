"""``llmtrace demo``: the reference server, traced, under a bounded load — then the analysis.

1. instruments this process (traces to ``--output``, and to OTLP too when an
   endpoint is configured), starts the reference server on a free loopback port
   (API front end here, engine in its own process);
2. drives a self-stopping load over loopback: a steady Poisson stream, a burst
   that overfills the KV-cache budget (so preemption happens), then long-tail
   prompt lengths; a few clients disconnect mid-stream;
3. stops the server (the engine flushes its spans), then runs ``llmtrace analyze``
   on what was recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

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


def _exporters(output: str) -> str:
    configured = os.environ.get("LLMTRACE_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return f"file:{output}" + (",otlp" if configured else "")


def run_demo(args: argparse.Namespace) -> int:
    """Entry point of ``llmtrace demo`` (see ``llmtrace demo --help``)."""
    import llmtrace
    from llmtrace.cli._progress import Progress
    from llmtrace.server.app import create_app
    from llmtrace.server.runner import ServerThread

    output = os.path.abspath(args.output or DEFAULT_OUTPUT)
    if os.path.exists(output):
        os.remove(output)  # the analysis must see this run only
    os.environ.setdefault("LLMTRACE_QUIET", "1")
    llmtrace.instrument(exporter=_exporters(output), service_name="llmtrace-demo", metrics_interval_s=5.0)
    plan = plan_load(args.duration_s, args.requests)
    print(f"llmtrace demo: {len(plan)} requests over ~{args.duration_s:.0f}s "
          f"(steady, a burst of {BURST_SIZE}, long-tail prompts); traces -> {output}", file=sys.stderr)
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
    if args.no_analysis:
        print(f"traces: {output}\nanalyse them with: llmtrace analyze {output}")
        return 0
    from llmtrace.cli import build_parser

    argv = ["analyze", output]
    for flag, value in (("--json", args.json), ("--html", args.html)):
        if value:
            argv += [flag, value]
    analyze_args = build_parser().parse_args(argv)
    code: int = analyze_args.func(analyze_args)
    print(f"\ntraces: {output}  (llmtrace analyze {output} --html report.html)")
    return code
