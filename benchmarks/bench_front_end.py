"""Instructions per request in the reference server's front end, with the engine answered in-process.

``bench_reference_server.py --instructions`` counts the whole server (front end and engine
processes) and is the measure of record, but one run takes over twenty minutes. At production
sampling llmtrace's cost is almost all in the front end, so this benchmark counts that alone, in
one process and to the instruction: the reference server's own request path — the FastAPI
route, body parsing, :class:`~llmtrace.server.app.CompletionService` (the trained tokenizer's
encode, ``llm.request``, the carrier for the engine, the detokenizing stream of OpenAI chunks)
— called through ASGI, with the engine replaced at its client (``submit`` returns the
request's outputs already queued: *tokens* tokens, then the finish with an engine summary).
The engine process, its pipe and uvicorn's socket handling are not in it; they are the same in
every arm.

Arms, each a fresh process under callgrind, a run of ``--requests`` and one of ``--base``
differenced: ``untraced``, ``llmtrace_0`` (``instrument()``, no request sampled) and ``full``
(every request sampled, exported to a file); 1 % and 10 % are mixed from those two (a request
costs what its sampling decision makes it cost; a few hundred requests hold too few sampled
ones at 10 % to count directly). Serving metrics are on, exported once at the end.

    python benchmarks/bench_front_end.py                   # ~3 minutes
    python benchmarks/bench_front_end.py --arms untraced,llmtrace_0 --jobs 2

Printed per arm: the serving thread's instructions per request, all threads' (the span builder
materialising the request's metrics and spans, the exporter), and the addition over untraced as
a share of the whole untraced server's per-request count (``--server-instructions``, from the
measure of record), which is what the budgets are written against.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from typing import Any

from starlette.requests import Request  # module level: FastAPI resolves the route's annotations here

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ARMS = ("untraced", "llmtrace_0", "full")
SAMPLE_RATIOS = {"llmtrace_0": 0.0, "full": 1.0}
MIXED = {"1 % (mixed)": 0.01, "10 % production (mixed)": 0.1}
#: The whole untraced reference server's instructions per 16-token streamed request (front end
#: and engine, docs/performance.md "The reference server counted whole").
SERVER_INSTRUCTIONS = 49.245e6
#: What the engine reports back with a request's end (the keys of ``RequestHandle.summary()``).
_SUMMARY = {"queue_s": 0.0012, "preemptions": 0, "decode_stall_s": 0.0, "prefill_s": 0.004, "decode_s": 0.05,
            "first_step": 10, "last_step": 25, "decode_steps": 15, "cached_tokens": 0}


class InstantEngine:
    """The engine client's interface, answered in-process: every request gets *tokens* tokens and a
    finish at once (what the reference engine would send for it, without its process)."""

    def __init__(self, tokens: int, token_ids: list[int]) -> None:
        self.tokens = tokens
        self.token_ids = token_ids

    def submit(self, payload: dict[str, Any]) -> asyncio.Queue[tuple[Any, ...]]:
        request_id = payload["request_id"]
        out: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        for index in range(min(self.tokens, payload["max_tokens"])):
            out.put_nowait(("token", request_id, self.token_ids[index % len(self.token_ids)]))
        out.put_nowait(("finished", request_id, "length", dict(_SUMMARY)))
        return out

    def finish(self, request_id: str, reason: str) -> None:
        return None

    def release(self, request_id: str, abort: bool) -> None:
        return None


def _app(arm: str, out: str, tokens: int) -> Any:
    from fastapi import FastAPI

    if arm in SAMPLE_RATIOS:
        import llmtrace

        ratio = SAMPLE_RATIOS[arm]
        from bench_reference_server import COUNTED_OPTIONS

        # llmtrace's clocks at valgrind's pace, as in the whole-server count: metrics exported once at
        # the end (flush(), which the differencing cancels), the span exporter and builder woken as
        # often per request as at full speed.
        llmtrace.instrument(exporter=f"file:{out}", gpu="off", sample_ratio=ratio, engine_sample_ratio=ratio,
                            **COUNTED_OPTIONS)
    from llmtrace.server.app import TOKENIZER_CACHE, CompletionService, _answer
    from llmtrace.server.protocol import parse_completion
    from llmtrace.server.tiny_model import train_tokenizer

    tokenizer = train_tokenizer(cache_dir=TOKENIZER_CACHE)
    # Words of the tokenizer's own vocabulary, so that the stream decodes to text as a model's would.
    token_ids = tokenizer.encode(" the reference server streams these words back one token at a time")
    service = CompletionService(tokenizer, InstantEngine(tokens, token_ids), context_tokens=1024)
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:  # the reference server's route (server/app.py)
        return await _answer(request, service, parse_completion)

    return app


def _body(index: int, tokens: int) -> bytes:
    """bench_reference_server.py's requests: four prompt lengths in turn, streamed, greedy."""
    from bench_reference_server import request_body

    return json.dumps(request_body(index, tokens, greedy=True)).encode()


async def _one(app: Any, body: bytes) -> int:
    """One HTTP call through ASGI; the SSE messages the client got (a check that it streamed)."""
    delivered = False
    messages = 0

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)  # the client stays: only a disconnect would end this
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal messages
        if message["type"] == "http.response.body":
            messages += message.get("body", b"").count(b"data:")

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode()), (b"user-agent", b"bench/1")],
             "client": ("127.0.0.1", 5555), "server": ("127.0.0.1", 8000)}
    await app(scope, receive, send)
    return messages


def child(arm: str, requests: int, tokens: int) -> None:
    from _callgrind import ready

    with tempfile.TemporaryDirectory() as tmp:
        app = _app(arm, os.path.join(tmp, "traces.jsonl"), tokens)
        bodies = [_body(index, tokens) for index in range(4)]

        async def drive(count: int) -> None:
            for index in range(count):
                messages = await _one(app, bodies[index % 4])
                if messages != tokens + 2:  # the tokens, the finish chunk, [DONE]
                    raise SystemExit(f"{arm}: a response streamed {messages} messages, not {tokens + 2}")

        asyncio.run(drive(100))  # warm-up: middleware stack built, caches filled
        ready()
        asyncio.run(drive(requests))
        if arm in SAMPLE_RATIOS:
            import llmtrace

            llmtrace.flush()  # the builder's and exporters' work for these requests
        os._exit(0)  # skip the teardown, whose instructions would not cancel out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400, help="the longer run's requests (default 400)")
    parser.add_argument("--base", type=int, default=100, help="the shorter run's requests (default 100)")
    parser.add_argument("--tokens", type=int, default=16, help="streamed tokens per request (default 16)")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"comma-separated, untraced always (known: {', '.join(ARMS)})")
    parser.add_argument("--jobs", type=int, default=2, help="valgrind runs at a time (the counts do not depend on it)")
    parser.add_argument("--server-instructions", type=float, default=SERVER_INSTRUCTIONS,
                        help="the untraced whole server's instructions per request, the budgets' denominator")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON too")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.requests, args.tokens)
        return 0
    if args.requests <= args.base:
        parser.error(f"--requests {args.requests} must be more than --base {args.base}")
    chosen = {arm.strip() for arm in args.arms.split(",") if arm.strip()}
    if unknown := chosen - set(ARMS):
        parser.error(f"--arms: unknown {', '.join(sorted(unknown))} (known: {', '.join(ARMS)})")
    arms = [arm for arm in ARMS if arm == "untraced" or arm in chosen]
    from _callgrind import per_request

    counted = per_request(lambda arm, count: [sys.executable, __file__, "--child", arm, "--requests", str(count),
                                              "--tokens", str(args.tokens)],
                          arms, args.requests, args.base, args.jobs, from_ready=True)
    rows = dict(counted)
    if "llmtrace_0" in counted and "full" in counted:
        from bench_reference_server import mixed

        for name, ratio in MIXED.items():
            rows[name] = mixed(counted["llmtrace_0"], counted["full"], ratio, counted["full"])
    base = counted["untraced"]
    print(f"\n{'arm':<26} {'serving thread':>15} {'all threads':>12} {'added':>9} {'of server':>10}")
    for name, row in rows.items():
        added = row["all_instructions"] - base["all_instructions"]
        share = "" if name == "untraced" else f"{added / args.server_instructions:10.2%}"
        print(f"{name:<26} {row['thread_instructions'] / 1e3:14.1f}k {row['all_instructions'] / 1e3:11.1f}k "
              f"{'' if name == 'untraced' else f'{added / 1e3:8.1f}k':>9} {share}")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
