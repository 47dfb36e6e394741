"""Reference-server throughput, traced vs untraced, as ratios measured in one run.

Three configurations, each in a fresh process (the API front end plus its
engine process), interleaved over several rounds so that machine noise hits
them alike:

* ``untraced``   — no llmtrace at all;
* ``full``       — ``llmtrace.instrument()`` with every request and every engine window traced;
* ``production`` — 10% of requests (``sample_ratio=0.1``) and 10% of engine windows.

Each run sends the same fixed set of streaming completions (concurrency C) and
reports output tokens per second. Budget: full >= 0.97, production >= 0.995 of
untraced.

    python benchmarks/bench_reference_server.py [--rounds 3] [--requests 96] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    "untraced": None,
    "full": {},
    "production": {"sample_ratio": 0.1, "engine_sample_ratio": 0.1},
}


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


def child(config: str, requests: int, concurrency: int, max_tokens: int, out: str) -> None:
    """One measurement, in this (fresh) process: prints tokens/s as JSON."""
    options = CONFIGS[config]
    if options is not None:
        import llmtrace

        llmtrace.instrument(exporter=f"file:{out}", **options)
    from llmtrace.server.app import create_app
    from llmtrace.server.runner import ServerThread

    with ServerThread(create_app({"total_blocks": 512, "max_batch": 16})) as base_url:
        asyncio.run(_load(base_url, concurrency, concurrency, 4))  # warm-up: model, sockets, caches
        start = time.perf_counter()
        tokens = asyncio.run(_load(base_url, requests, concurrency, max_tokens))
        elapsed = time.perf_counter() - start
    print(json.dumps({"config": config, "tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--child", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.requests, args.concurrency, args.max_tokens, args.out)
        return
    results: dict[str, list[float]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            for name in CONFIGS:
                out = str(Path(tmp) / f"{name}-{round_index}.jsonl")
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", name, "--out", out, "--requests", str(args.requests),
                     "--concurrency", str(args.concurrency), "--max-tokens", str(args.max_tokens)],
                    capture_output=True, text=True, check=True)
                value = json.loads(proc.stdout.strip().splitlines()[-1])["tokens_per_s"]
                results[name].append(value)
                print(f"round {round_index + 1}: {name:<10} {value:8.1f} tokens/s", file=sys.stderr)
    base = statistics.median(results["untraced"])
    print(f"\nreference server, {args.requests} streaming requests x {args.max_tokens} tokens, "
          f"concurrency {args.concurrency}, median of {args.rounds} interleaved rounds:")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"  {name:<10} {median:8.1f} tokens/s   ratio to untraced {median / base:.3f}")


if __name__ == "__main__":
    main()
