"""Scenario: the engine process dies while requests stream. Prints what the clients and /health saw
right after, and whether the server served again once its supervisor had restarted the engine."""

from __future__ import annotations

import asyncio
import json
import sys

import httpx


async def _stream(base_url: str, on_first_chunk: asyncio.Event) -> list[str]:
    """Finish reasons and errors (as ``error:<code>``) the stream carried."""
    finishes: list[str] = []
    body = {"prompt": "a long answer please", "max_tokens": 400, "stream": True, "temperature": 0}
    async with httpx.AsyncClient(timeout=60) as client, client.stream(
        "POST", base_url + "/v1/completions", json=body
    ) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                on_first_chunk.set()
                event = json.loads(line[6:])
                if "error" in event:
                    finishes.append(f"error:{event['error']['code']}")
                elif reason := event["choices"][0]["finish_reason"]:
                    finishes.append(reason)
    return finishes


async def _served_again(client: httpx.AsyncClient, base_url: str, timeout_s: float = 180) -> int:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (await client.get(base_url + "/health")).status_code != 200 and loop.time() < deadline:
        await asyncio.sleep(0.2)
    response = await client.post(base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    return response.status_code


async def _run(base_url: str, engine: object) -> dict[str, object]:
    first = asyncio.Event()
    streams = [asyncio.create_task(_stream(base_url, first)) for _ in range(3)]
    await asyncio.wait_for(first.wait(), 60)
    engine.process.kill()  # type: ignore[attr-defined]
    finishes = await asyncio.wait_for(asyncio.gather(*streams), 60)
    async with httpx.AsyncClient(timeout=10) as client:
        health = await client.get(base_url + "/health")
        after = await client.post(base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        restarted_status = await _served_again(client, base_url)
        restarts = (await client.get(base_url + "/health")).json()["engine"]["restarts"]
    return {"finishes": finishes, "health": health.status_code, "after_status": after.status_code,
            "restarted_status": restarted_status, "restarts": restarts}


def main() -> None:
    import llmtrace

    llmtrace.instrument(exporter=f"file:{sys.argv[1]}", service_name="engine-dies")
    from llmtrace.server.app import create_app
    from llmtrace.server.runner import ServerThread

    app = create_app({"forward_delay_s": 0.01})
    with ServerThread(app) as base_url:
        result = asyncio.run(_run(base_url, app.state.engine))
    llmtrace.shutdown(timeout_s=10)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
