"""llmtrace's own gRPC SERVER span (``grpc.server`` and ``grpc.aio.server``, over loopback).

Its name, kind and RPC attributes; its parent from the metadata; the request as its child;
the status of aborted and failed RPCs; ``rpc.server.call.duration`` for unsampled RPCs; a host's
own OpenTelemetry gRPC instrumentation (one SERVER span, the host's); ``server_spans=otel``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
from opentelemetry import trace

import llmtrace
from llmtrace import semconv
from llmtrace.testing import CapturedTelemetry

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
SERVICE = "llm.Generate"
OTEL_SCOPE = "opentelemetry.instrumentation.grpc"


def _identity(data: bytes) -> bytes:
    return data


# ----------------------------------------------------------------------------- servicers
def _complete(request: bytes, context: Any) -> bytes:
    with llmtrace.start_request(model="grpc-model") as handle:
        handle.tokenized(len(request))
        handle.token(3)
    return b"done"


def _stream(request: bytes, context: Any) -> Iterator[bytes]:
    # Not a with-block: an RPC that goes away ends the request through llmtrace's server scope.
    handle = llmtrace.start_request(model="grpc-model", stream=True)
    for _ in range(int(request.decode())):
        time.sleep(0.002)
        handle.token()
        yield b"tok"
    handle.finished("stop")


def _fail(request: bytes, context: Any) -> bytes:
    import grpc

    context.abort(grpc.StatusCode.INTERNAL if request == b"internal" else grpc.StatusCode.NOT_FOUND, "no luck")
    return b""


def _boom(request: bytes, context: Any) -> bytes:
    raise RuntimeError("handler bug")


async def _aio_complete(request: bytes, context: Any) -> bytes:
    with llmtrace.start_request(model="grpc-model") as handle:
        handle.tokenized(len(request))
        await asyncio.sleep(0.001)
        handle.token(3)
    return b"done"


async def _aio_stream(request: bytes, context: Any) -> Any:
    handle = llmtrace.start_request(model="grpc-model", stream=True)
    for _ in range(int(request.decode())):
        await asyncio.sleep(0.002)
        handle.token()
        yield b"tok"
    handle.finished("stop")


async def _aio_fail(request: bytes, context: Any) -> bytes:
    import grpc

    await context.abort(grpc.StatusCode.INTERNAL if request == b"internal" else grpc.StatusCode.NOT_FOUND, "no luck")
    return b""


async def _aio_boom(request: bytes, context: Any) -> bytes:
    raise RuntimeError("handler bug")


def _handlers(grpc: Any, aio: bool) -> Any:
    unary, stream = grpc.unary_unary_rpc_method_handler, grpc.unary_stream_rpc_method_handler
    handlers = {
        "Complete": unary(_aio_complete if aio else _complete, _identity, _identity),
        "Stream": stream(_aio_stream if aio else _stream, _identity, _identity),
        "Fail": unary(_aio_fail if aio else _fail, _identity, _identity),
        "Boom": unary(_aio_boom if aio else _boom, _identity, _identity),
    }
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


# ----------------------------------------------------------------------------- servers
@contextmanager
def _sync_server() -> Iterator[str]:
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((_handlers(grpc, aio=False),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait(10)


@contextmanager
def _aio_server() -> Iterator[str]:
    """A ``grpc.aio`` server on its own event loop in a thread."""
    import grpc

    loop = asyncio.new_event_loop()
    ready: list[Any] = []

    async def start() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handlers(grpc, aio=True),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.append((server, port))

    thread = threading.Thread(target=loop.run_forever, name="grpc-aio-span-test", daemon=True)
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


Serve = Callable[..., AbstractContextManager[tuple[str, CapturedTelemetry]]]


def _server(kind: str) -> AbstractContextManager[str]:
    return _sync_server() if kind == "sync" else _aio_server()


@pytest.fixture(params=["sync", "aio"])
def kind(request: pytest.FixtureRequest) -> str:
    """``grpc.server`` (a thread pool) or ``grpc.aio.server`` (coroutines)."""
    return str(request.param)


@pytest.fixture
def serve(kind: str, capture_spans: Any) -> Iterator[Serve]:
    """``with serve(**options) as (target, captured)``: llmtrace with *options*, then a server
    of *kind* created after it."""

    @contextmanager
    def start(**options: Any) -> Iterator[tuple[str, CapturedTelemetry]]:
        with capture_spans(**options) as captured, _server(kind) as target:
            yield target, captured

    yield start


def _call(target: str, method: str, request: bytes, metadata: tuple[tuple[str, str], ...] = ()) -> Any:
    """One RPC; returns its response (a list for Stream) or the RpcError it ended with."""
    import grpc

    with grpc.insecure_channel(target) as channel:
        try:
            if method == "Stream":
                return list(channel.unary_stream(f"/{SERVICE}/{method}", _identity, _identity)(
                    request, metadata=metadata, timeout=10))
            return channel.unary_unary(f"/{SERVICE}/{method}", _identity, _identity)(
                request, metadata=metadata, timeout=10)
        except grpc.RpcError as error:
            return error


def _server_spans(captured: CapturedTelemetry, count: int, settle_s: float = 0.0) -> list[Any]:
    """The SERVER spans once *count* have ended (and *settle_s* more, for one that should not come)."""
    deadline = time.monotonic() + 20
    while len(found := [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{count} SERVER span(s) did not arrive: {[s.name for s in captured.spans]}")
        time.sleep(0.05)
    if settle_s:
        time.sleep(settle_s)
        found = [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
    return found


def _requests(captured: CapturedTelemetry, count: int) -> list[Any]:
    deadline = time.monotonic() + 20
    while len(found := [s for s in captured.collect() if s.name == semconv.SPAN_REQUEST]) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{count} llm.request span(s) did not arrive")
        time.sleep(0.05)
    return found


# ----------------------------------------------------------------------------- the span
def test_span_name_kind_and_rpc_attributes(serve: Serve) -> None:
    """A unary RPC: one SERVER span of llmtrace's named package.Service/Method, with the RPC
    attributes OpenTelemetry's gRPC instrumentation sets (the peer as client.address/port)."""
    with serve() as (target, captured):
        assert b"done" == _call(target, "Complete", b"prompt")
        [server] = _server_spans(captured, 1)
    assert "llm.Generate/Complete" == server.name
    assert trace.SpanKind.SERVER == server.kind
    assert "llmtrace" == server.instrumentation_scope.name
    assert trace.StatusCode.UNSET == server.status.status_code
    attributes = dict(server.attributes)
    assert {"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": "Complete", "rpc.grpc.status_code": 0,
            "client.address": "127.0.0.1"} == {k: v for k, v in attributes.items() if k != "client.port"}
    assert isinstance(attributes["client.port"], int)


def test_parent_from_traceparent_and_request_as_child(serve: Serve) -> None:
    """A streamed RPC carrying a traceparent: the SERVER span continues that trace under the
    caller's span, the llm.request opened in the handler is its child, and the time to the
    first response message is on it."""
    with serve() as (target, captured):
        assert 3 == len(_call(target, "Stream", b"3", (("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01"),)))
        [request] = _requests(captured, 1)
        [server] = _server_spans(captured, 1)
    assert (int(TRACE_ID, 16), int(PARENT_ID, 16)) == (server.context.trace_id, server.parent.span_id)
    assert (server.context.trace_id, server.context.span_id) == (request.context.trace_id, request.parent.span_id)
    assert 0 < server.attributes[semconv.LLM_TIME_TO_FIRST_BYTE_S] < server.end_time - server.start_time


@pytest.mark.parametrize(("request_body", "code", "status"), [(b"internal", 13, trace.StatusCode.ERROR),
                                                              (b"missing", 5, trace.StatusCode.UNSET)])
def test_aborted_rpc_status(serve: Serve, request_body: bytes, code: int, status: trace.StatusCode) -> None:
    """A handler that aborts: its code on the span; ERROR only for a server-error code (INTERNAL),
    not for a client's (NOT_FOUND); no exception event for the abort itself."""
    import grpc

    with serve() as (target, captured):
        error = _call(target, "Fail", request_body)
        [server] = _server_spans(captured, 1)
    assert isinstance(error, grpc.RpcError)
    assert code == error.code().value[0] == server.attributes["rpc.grpc.status_code"]
    assert status == server.status.status_code
    assert [] == list(server.events)
    if status is trace.StatusCode.ERROR:
        assert "StatusCode.INTERNAL:no luck" == server.status.description


def test_failed_handler_is_unknown_and_error(serve: Serve) -> None:
    """A handler that raises: UNKNOWN (2), ERROR, error.type and the exception event."""
    with serve() as (target, captured):
        _call(target, "Boom", b"")
        [server] = _server_spans(captured, 1)
    assert 2 == server.attributes["rpc.grpc.status_code"]
    assert trace.StatusCode.ERROR == server.status.status_code
    assert "RuntimeError" == server.attributes["error.type"]
    assert ["exception"] == [event.name for event in server.events]


def test_cancelled_and_late_rpcs(serve: Serve) -> None:
    """A streamed RPC the client cancels: CANCELLED (1), not an error; one its deadline ends:
    DEADLINE_EXCEEDED (4), an error. The requests of both end as abort."""
    import grpc

    with serve() as (target, captured):
        with grpc.insecure_channel(target) as channel:
            stream = channel.unary_stream(f"/{SERVICE}/Stream", _identity, _identity)
            call = stream(b"400", timeout=30)
            next(call)
            call.cancel()
            with pytest.raises(grpc.RpcError):
                list(stream(b"400", timeout=0.2))
        requests = _requests(captured, 2)
        servers = _server_spans(captured, 2)
    assert {1: trace.StatusCode.UNSET, 4: trace.StatusCode.ERROR} == {
        s.attributes["rpc.grpc.status_code"]: s.status.status_code for s in servers}
    assert ["abort", "abort"] == [r.attributes[semconv.LLM_REQUEST_FINISH_REASON] for r in requests]


def _duration_counts(captured: CapturedTelemetry) -> dict[Any, int]:
    """RPCs in rpc.server.call.duration so far, by (method, code) (cumulative over the session)."""
    points = captured.metrics().get(semconv.METRIC_RPC_SERVER_DURATION, [])
    return {(p.attributes.get("rpc.method"), p.attributes.get("rpc.grpc.status_code")): p.count for p in points}


def test_unsampled_rpcs_are_counted_in_the_duration_metric(serve: Serve) -> None:
    """RPCs under an unsampled caller make no SERVER span, yet each is in rpc.server.call.duration."""
    with serve() as (target, captured):
        before = _duration_counts(captured)
        for _ in range(3):
            assert b"done" == _call(target, "Complete", b"x", (("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-00"),))
        _call(target, "Fail", b"missing", (("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-00"),))
        time.sleep(0.2)
        servers = [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
        after = _duration_counts(captured)
        [point] = [p for p in captured.metrics()[semconv.METRIC_RPC_SERVER_DURATION]
                   if p.attributes.get("rpc.method") == "Complete"]
    assert [] == servers
    assert {("Complete", 0): 3, ("Fail", 5): 1} == {k: n - before.get(k, 0) for k, n in after.items()
                                                     if n != before.get(k, 0)}
    assert {"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": "Complete",
            "rpc.grpc.status_code": 0} == dict(point.attributes)


# ----------------------------------------------------------------------------- who makes it
@contextmanager
def _otel_instrumented() -> Iterator[None]:
    from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorServer, GrpcInstrumentorServer

    GrpcInstrumentorServer().instrument()
    GrpcAioInstrumentorServer().instrument()
    try:
        yield
    finally:
        GrpcInstrumentorServer().uninstrument()
        GrpcAioInstrumentorServer().uninstrument()


@pytest.mark.parametrize("order", ["after", "before"])
def test_host_enabled_opentelemetry_keeps_its_one_server_span(kind: str, capture_spans: Any, order: str) -> None:
    """The host enabled OpenTelemetry's gRPC server instrumentation itself (after or before
    llmtrace.instrument()): exactly one SERVER span, OpenTelemetry's, the request its child."""
    if order == "before":
        with _otel_instrumented(), capture_spans() as captured, _server(kind) as target:
            assert 2 == len(_call(target, "Stream", b"2"))
            [request] = _requests(captured, 1)
            servers = _server_spans(captured, 1, settle_s=0.3)
    else:  # OpenTelemetry uninstrumented before llmtrace: the patches unwind in order
        with capture_spans() as captured, _otel_instrumented(), _server(kind) as target:
            assert 2 == len(_call(target, "Stream", b"2"))
            [request] = _requests(captured, 1)
            servers = _server_spans(captured, 1, settle_s=0.3)
    assert 1 == len(servers)
    assert OTEL_SCOPE == servers[0].instrumentation_scope.name
    assert servers[0].context.span_id == request.parent.span_id


@pytest.mark.parametrize(("mode", "scope_name"), [("otel", OTEL_SCOPE), ("llmtrace", "llmtrace")])
def test_server_spans_option_chooses_who_makes_the_span(serve: Serve, mode: str, scope_name: str) -> None:
    """server_spans=otel: OpenTelemetry's interceptor makes the one SERVER span; llmtrace: its own."""
    with serve(server_spans=mode) as (target, captured):
        assert 2 == len(_call(target, "Stream", b"2"))
        [request] = _requests(captured, 1)
        servers = _server_spans(captured, 1, settle_s=0.3)
    assert [scope_name] == [s.instrumentation_scope.name for s in servers]
    assert servers[0].context.span_id == request.parent.span_id


def test_server_spans_off_leaves_requests_as_roots(serve: Serve) -> None:
    """server_spans=off: no SERVER span; the request is still traced, as a root."""
    with serve(server_spans="off") as (target, captured):
        assert b"done" == _call(target, "Complete", b"x")
        [request] = _requests(captured, 1)
        time.sleep(0.2)
        assert [] == [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
    assert request.parent is None


def test_rpc_is_served_when_its_server_span_fails(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    """llmtrace failing to open an RPC's SERVER span: the RPC is served untraced, the failure counted."""
    from llmtrace import _safety
    from llmtrace.integrations.grpc import server_span

    def _boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("llmtrace bug")

    with serve() as (target, _):
        monkeypatch.setattr(server_span.Rpc, "__init__", _boom)
        before = _safety.error_counts().get("grpc.server_span", 0)
        assert b"done" == _call(target, "Complete", b"x")
        assert 3 == len(_call(target, "Stream", b"3"))
        assert before + 2 == _safety.error_counts().get("grpc.server_span", 0)
