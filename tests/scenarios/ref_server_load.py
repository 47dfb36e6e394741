"""A scenario run in its own process: the traced reference server under concurrent streaming clients.

Prints one JSON line with the client outcomes and the engine's stats after the
load (open requests, free KV blocks), so tests can check that aborted requests
freed their slots. Usage: ``python ref_server_load.py OUT.jsonl [options]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import httpx


async def _client(base_url: str, index: int, max_tokens: int, disconnect: bool,
                  shared_prefix: str = "") -> dict[str, object]:
    body = {"prompt": shared_prefix + "the scheduler batches requests " * (2 + index % 5), "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    started = time.monotonic()
    first: float | None = None
    chunks = 0
    usage: object = None
    async with httpx.AsyncClient(timeout=120) as client, client.stream(
        "POST", base_url + "/v1/completions", json=body, headers={"x-client": str(index)}
    ) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            if (chunk := json.loads(line[len("data:"):])).get("usage") is not None:
                usage = chunk["usage"]
                continue
            chunks += 1
            if first is None:
                first = time.monotonic() - started
            if disconnect and chunks >= 2:
                return {"index": index, "outcome": "disconnected", "chunks": chunks}
    return {"index": index, "outcome": "ok", "chunks": chunks, "client_ttft_s": first, "usage": usage}


async def _wait_idle(base_url: str, timeout_s: float = 30.0) -> dict[str, object]:
    async with httpx.AsyncClient(timeout=10) as client:
        deadline = time.monotonic() + timeout_s
        while True:
            stats: dict[str, object] = (await client.get(base_url + "/stats")).json()
            if stats["open_requests"] == 0 or time.monotonic() > deadline:
                return stats
            await asyncio.sleep(0.1)


async def _load(base_url: str, clients: int, max_tokens: int, disconnects: int, sequential: bool = False,
                shared_prefix: str = "") -> dict[str, object]:
    calls = [_client(base_url, i, max_tokens, i < disconnects, shared_prefix) for i in range(clients)]
    results = [await call for call in calls] if sequential else await asyncio.gather(*calls)
    return {"clients": results, "stats_after": await _wait_idle(base_url)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--disconnects", type=int, default=1)
    parser.add_argument("--sequential", action="store_true", help="one client after another")
    parser.add_argument("--shared-prefix", default="", help="text every prompt starts with (a system prompt)")
    parser.add_argument("--engine", default="{}", help="EngineConfig overrides as JSON")
    parser.add_argument("--exporter", default=None, help="llmtrace exporter (default file:OUT)")
    parser.add_argument("--engine-clock-skew-ns", type=int, default=0,
                        help="shift the engine process's monotonic clock (the API server's stays true)")
    args = parser.parse_args()

    import llmtrace

    if args.engine_clock_skew_ns:
        # This process has started (its clock stays true); the engine process, spawned later
        # with this environment, runs skewed_clock/sitecustomize.py first.
        site = str(Path(__file__).with_name("skewed_clock"))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))
        os.environ["SKEWED_CLOCK_NS"] = str(args.engine_clock_skew_ns)
        os.environ["SKEWED_CLOCK_REPORT"] = skew_report = f"{args.out}.skewed-pids"

    llmtrace.instrument(exporter=args.exporter or f"file:{args.out}", service_name="ref-server-test")
    from llmtrace.server.app import create_app
    from llmtrace.server.runner import ServerThread

    with ServerThread(create_app(json.loads(args.engine))) as base_url:
        result = asyncio.run(_load(base_url, args.clients, args.max_tokens, args.disconnects, args.sequential,
                                   args.shared_prefix))
    llmtrace.shutdown(timeout_s=10)
    if args.engine_clock_skew_ns:
        result["skewed_pids"] = [int(pid) for pid in Path(skew_report).read_text().split()]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
