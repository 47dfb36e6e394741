"""aiohttp and gRPC servers: the request is the SERVER span's child; first byte; client going away."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry import trace

import llmtrace
from llmtrace import semconv
from llmtrace.testing import CapturedTelemetry
from tests.helpers.servers import free_port

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def _wait_for(captured: CapturedTelemetry, name: str, count: int, timeout_s: float = 20.0) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [s for s in captured.collect() if s.name == name]
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{count} {name} span(s) did not arrive: {[s.name for s in captured.spans]}")


def _server_spans(captured: CapturedTelemetry, count: int, timeout_s: float = 20.0) -> list[Any]:
    """The SERVER spans, once *count* have ended: one ends after its response, which can be
    after the span builder built the llm.request inside it."""
    deadline = time.monotonic() + timeout_s
    while len(servers := [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{count} SERVER span(s) did not arrive: {[s.name for s in captured.spans]}")
        time.sleep(0.05)
    return servers


# ----------------------------------------------------------------------------- aiohttp
async def _stream_handler(request: Any) -> Any:
    from aiohttp import web

    tokens = int(request.query.get("tokens", "5"))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    with llmtrace.start_request(model="aiohttp-model", stream=True) as handle:
        for _ in range(tokens):
            await asyncio.sleep(0.005)
            handle.token()
            await response.write(b"data: tok\n\n")
    await response.write_eof()
    return response


@pytest.fixture
def aiohttp_url(capture_spans: Any) -> Iterator[tuple[str, CapturedTelemetry]]:
    with capture_spans() as captured:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/stream", _stream_handler)
        loop = asyncio.new_event_loop()
        port = free_port()
        runner = web.AppRunner(app)

        async def start() -> None:
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()

        loop.run_until_complete(start())
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{port}", captured
        finally:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
            loop.close()


def test_aiohttp_stream_request_is_child_of_server_span(aiohttp_url: tuple[str, CapturedTelemetry]) -> None:
    """A traceparent arrives; llm.request is the SERVER span's child; the SERVER span has the first byte time."""
    import httpx

    url, captured = aiohttp_url
    response = httpx.get(url + "/stream", headers={"traceparent": TRACEPARENT}, timeout=30)
    assert 200 == response.status_code
    [request] = _wait_for(captured, semconv.SPAN_REQUEST, 1)
    [server] = _server_spans(captured, 1)
    assert int(TRACE_ID, 16) == request.context.trace_id
    assert int(PARENT_ID, 16) == server.parent.span_id
    assert server.context.span_id == request.parent.span_id
    assert 5 == request.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]
    assert 0 < server.attributes[semconv.LLM_TIME_TO_FIRST_BYTE_S] < 5


def test_aiohttp_client_disconnect_aborts_the_request(aiohttp_url: tuple[str, CapturedTelemetry]) -> None:
    """The client leaves after the first chunk: the request ends as abort."""
    import httpx

    url, captured = aiohttp_url
    with httpx.Client(timeout=30) as client, client.stream("GET", url + "/stream?tokens=400") as response:
        next(response.iter_raw())
    [request] = _wait_for(captured, semconv.SPAN_REQUEST, 1)
    assert "abort" == request.attributes[semconv.LLM_REQUEST_FINISH_REASON]
    assert request.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] < 400


# ----------------------------------------------------------------------------- gRPC
def _identity(data: bytes) -> bytes:
    return data


def _complete(request: bytes, context: Any) -> bytes:
    with llmtrace.start_request(model="grpc-model") as handle:
        handle.tokenized(len(request))
        handle.token(3)
    return b"done"


def _stream(request: bytes, context: Any) -> Iterator[bytes]:
    count = int(request.decode())
    handle = llmtrace.start_request(model="grpc-model", stream=True)
    for _ in range(count):
        time.sleep(0.005)
        handle.token()
        yield b"tok"
    handle.finished("stop")


@contextmanager
def _sync_server() -> Iterator[str]:
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handlers = {
        "Complete": grpc.unary_unary_rpc_method_handler(_complete, _identity, _identity),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream, _identity, _identity),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("llm.Generate", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait(10)


@pytest.fixture(params=["sync", "aio"])
def grpc_target(request: pytest.FixtureRequest, capture_spans: Any) -> Iterator[tuple[str, CapturedTelemetry]]:
    """The same servicer on a ``grpc.server`` (thread pool) and on a ``grpc.aio`` server (coroutines)."""
    with capture_spans() as captured, (_sync_server() if request.param == "sync" else _aio_server()) as target:
        yield target, captured


def test_grpc_unary_and_streaming_requests_are_children_of_server_spans(
        grpc_target: tuple[str, CapturedTelemetry]) -> None:
    """Unary and server-streaming RPCs with a traceparent: llm.request under the SERVER span, same trace."""
    import grpc

    target, captured = grpc_target
    metadata = (("traceparent", TRACEPARENT),)
    with grpc.insecure_channel(target) as channel:
        complete = channel.unary_unary("/llm.Generate/Complete", _identity, _identity)
        assert b"done" == complete(b"prompt", metadata=metadata, timeout=10)
        stream = channel.unary_stream("/llm.Generate/Stream", _identity, _identity)
        assert 4 == len(list(stream(b"4", metadata=metadata, timeout=10)))
    requests = _wait_for(captured, semconv.SPAN_REQUEST, 2)
    servers = {s.context.span_id: s for s in _server_spans(captured, 2)}
    assert 2 == len(servers)
    for request in requests:
        server = servers[request.parent.span_id]
        assert int(TRACE_ID, 16) == request.context.trace_id == server.context.trace_id
        assert int(PARENT_ID, 16) == server.parent.span_id
    streamed = [s for s in servers.values() if s.name.endswith("Stream")]
    assert streamed[0].attributes[semconv.LLM_TIME_TO_FIRST_BYTE_S] > 0


def test_grpc_cancelled_stream_aborts_the_request(grpc_target: tuple[str, CapturedTelemetry]) -> None:
    """The client cancels a streaming RPC after the first message: the request ends as abort."""
    import grpc

    target, captured = grpc_target
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_stream("/llm.Generate/Stream", _identity, _identity)(b"400", timeout=30)
        next(call)
        call.cancel()
    [request] = _wait_for(captured, semconv.SPAN_REQUEST, 1)
    assert "abort" == request.attributes[semconv.LLM_REQUEST_FINISH_REASON]
    assert request.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] < 400


# ----------------------------------------------------------------------------- grpc.aio
async def _aio_complete(request: bytes, context: Any) -> bytes:
    with llmtrace.start_request(model="grpc-aio-model") as handle:
        handle.tokenized(len(request))
        await asyncio.sleep(0.001)
        handle.token(3)
    return b"done"


async def _aio_stream(request: bytes, context: Any) -> Any:
    count = int(request.decode())
    handle = llmtrace.start_request(model="grpc-aio-model", stream=True)
    for _ in range(count):
        await asyncio.sleep(0.005)
        handle.token()
        yield b"tok"
    handle.finished("stop")


@contextmanager
def _aio_server() -> Iterator[str]:
    """A ``grpc.aio`` server on its own event loop in a thread (as an asyncio serving process runs it)."""
    import grpc

    loop = asyncio.new_event_loop()
    ready: list[Any] = []

    async def start() -> None:
        server = grpc.aio.server()
        handlers = {
            "Complete": grpc.unary_unary_rpc_method_handler(_aio_complete, _identity, _identity),
            "Stream": grpc.unary_stream_rpc_method_handler(_aio_stream, _identity, _identity),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("llm.Generate", handlers),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.append((server, port))

    thread = threading.Thread(target=loop.run_forever, name="grpc-aio-test", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(20)
    server, port = ready[0]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
