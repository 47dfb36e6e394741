"""llmtrace's own HTTP SERVER span on an aiohttp server, on loopback with a real client.

The aiohttp counterpart of test_server_span.py: what the span carries (the stable HTTP
conventions, as llmtrace's ASGI SERVER span and OpenTelemetry's aiohttp-server middleware emit
them), the response headers that link a response to its trace, errors, excluded URLs, the HTTP
metrics, coexistence with a host's own OpenTelemetry instrumentation, and ``server_spans`` modes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

import llmtrace
from llmtrace import semconv
from llmtrace.testing import CapturedTelemetry
from tests.helpers.servers import free_port
from tests.helpers.waits import wait_for_spans

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
UNSAMPLED = f"00-{TRACE_ID}-{PARENT_ID}-00"
REPO = Path(__file__).resolve().parents[2]
OTEL_SCOPE = "opentelemetry.instrumentation.aiohttp_server"


def build_app() -> Any:
    """An aiohttp app shaped like an inference front end: a streamed and a non-streamed
    completion that report through the lifecycle API, a health check, failing handlers, and a
    sub-application."""
    from aiohttp import web

    async def complete(request: web.Request) -> web.Response:
        handle = llmtrace.start_request(model="tiny", max_tokens=3)
        handle.tokenized(4)
        handle.queued()
        await asyncio.sleep(0.01)
        handle.scheduled()
        for _ in range(3):
            await asyncio.sleep(0.005)
            handle.token()
        handle.finished("length")
        return web.json_response({"text": "abc"})

    async def stream(request: web.Request) -> web.StreamResponse:
        handle = llmtrace.start_request(model=request.match_info["model"], max_tokens=4, stream=True)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        handle.queued()
        handle.scheduled()
        for index in range(4):
            await asyncio.sleep(0.005)
            handle.token()
            await response.write(f"data: {index}\n\n".encode())
        handle.finished("length")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def boom(request: web.Request) -> web.Response:
        raise RuntimeError("engine exploded")

    async def busy(request: web.Request) -> web.Response:
        raise web.HTTPServiceUnavailable()

    async def refused(request: web.Request) -> web.Response:
        raise web.HTTPForbidden()

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/stream/{model}", stream)
    app.router.add_get("/health", health)
    app.router.add_get("/boom", boom)
    app.router.add_get("/busy", busy)
    app.router.add_get("/refused", refused)
    admin = web.Application()
    admin.router.add_get("/status/{part}", health)
    app.add_subapp("/admin", admin)
    return app


@contextmanager
def aiohttp_server(app: Any) -> Iterator[str]:
    """Serve *app* with aiohttp's runner on 127.0.0.1, its event loop in a thread; yields the base URL."""
    from aiohttp import web

    loop = asyncio.new_event_loop()
    port = free_port()
    runner = web.AppRunner(app, access_log=None)

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    loop.run_until_complete(start())
    thread = threading.Thread(target=loop.run_forever, name="aiohttp-test", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def serve(capture_spans: Any) -> Iterator[Any]:
    """``with serve(**options) as (url, captured):`` — the app above, made and served with llmtrace on."""

    @contextmanager
    def start(**options: Any) -> Iterator[tuple[str, CapturedTelemetry]]:
        with capture_spans(**options) as captured, aiohttp_server(build_app()) as url:
            yield url, captured

    yield start


def _server_spans(captured: CapturedTelemetry, count: int) -> list[Any]:
    return wait_for_spans(captured, lambda s: s.kind == trace.SpanKind.SERVER, count)


def _requests(captured: CapturedTelemetry, count: int) -> list[Any]:
    return wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST, count)


def test_server_span_is_the_callers_child_and_the_requests_parent(serve: Any) -> None:
    """An incoming traceparent: the SERVER span continues the caller's trace under its span,
    named by the route; llm.request is its child; the streamed response names the span in
    traceresponse and carries no Server-Timing; the span has the time to the first byte."""
    import httpx

    with serve() as (url, captured), httpx.Client(timeout=30) as client:
        response = client.post(url + "/v1/stream/tiny", json={}, headers={"traceparent": TRACEPARENT})
        assert 200 == response.status_code
        [request] = _requests(captured, 1)
        [server] = _server_spans(captured, 1)
    assert "POST /v1/stream/{model}" == server.name
    assert "llmtrace" == server.instrumentation_scope.name
    assert TRACE_ID == f"{server.context.trace_id:032x}" == f"{request.context.trace_id:032x}"
    assert int(PARENT_ID, 16) == server.parent.span_id
    assert server.context.span_id == request.parent.span_id
    assert f"00-{TRACE_ID}-{server.context.span_id:016x}-01" == response.headers["traceresponse"]
    assert "traceresponse" == response.headers["access-control-expose-headers"]
    assert "server-timing" not in response.headers
    assert 0 < server.attributes[semconv.LLM_TIME_TO_FIRST_BYTE_S] < 5
    assert server.start_time <= request.start_time and request.end_time <= server.end_time


def test_server_span_attributes_follow_the_stable_http_conventions(serve: Any) -> None:
    """The attributes a user's dashboards key on, with the values of this very call."""
    import httpx

    with serve() as (url, captured), httpx.Client(timeout=30) as client:
        assert 200 == client.post(url + "/v1/completions?user=7", json={},
                                  headers={"user-agent": "bench/1.0"}).status_code
        [server] = _server_spans(captured, 1)
    port = int(url.rsplit(":", 1)[1])
    expected = {"http.request.method": "POST", "url.scheme": "http", "url.path": "/v1/completions",
                "url.query": "user=7", "http.route": "/v1/completions", "http.response.status_code": 200,
                "server.address": "127.0.0.1", "server.port": port, "client.address": "127.0.0.1",
                "network.protocol.version": "1.1", "user_agent.original": "bench/1.0"}
    assert expected == {key: server.attributes.get(key) for key in expected}
    assert isinstance(server.attributes["client.port"], int)
    assert "POST /v1/completions" == server.name
    assert trace.StatusCode.UNSET == server.status.status_code


def test_sub_application_call_has_one_span_with_the_prefixed_route(serve: Any) -> None:
    """A route of a sub-application (which gets llmtrace's middleware too): one SERVER span,
    named by the route with the sub-application's prefix; an unmatched path is named by its method."""
    import httpx

    with serve() as (url, captured), httpx.Client(timeout=30) as client:
        assert 200 == client.get(url + "/admin/status/engine").status_code
        assert 404 == client.get(url + "/nope").status_code
        _server_spans(captured, 2)
        time.sleep(0.2)  # a third SERVER span, if any, would have ended by now
        spans = sorted((s for s in captured.collect() if s.kind == trace.SpanKind.SERVER), key=lambda s: s.name)
    assert ["GET", "GET /admin/status/{part}"] == [s.name for s in spans]
    assert 404 == spans[0].attributes["http.response.status_code"]
    assert "http.route" not in spans[0].attributes
    assert trace.StatusCode.UNSET == spans[0].status.status_code


def test_first_byte_is_the_first_written_body_byte(capture_spans: Any) -> None:
    """A streamed response prepared at once, an empty write, then its first bytes 0.3 s later:
    llm.time_to_first_byte_s is the first non-empty write's (not the headers'), and every chunk
    after it reaches the client whole (they go to aiohttp's own writer)."""
    import httpx
    from aiohttp import web

    async def late(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"")
        await asyncio.sleep(0.3)
        for index in range(5):
            await response.write(f"data: {index}\n\n".encode())
        await response.write_eof()
        return response

    with capture_spans() as captured:
        app = web.Application()
        app.router.add_get("/late", late)
        with aiohttp_server(app) as url, httpx.Client(timeout=30) as client:
            response = client.get(url + "/late")
            [server] = _server_spans(captured, 1)
    assert "".join(f"data: {index}\n\n" for index in range(5)) == response.text
    duration_s = (server.end_time - server.start_time) * 1e-9
    assert 0.3 <= server.attributes[semconv.LLM_TIME_TO_FIRST_BYTE_S] <= duration_s


def test_websocket_and_file_responses_are_served_whole_and_traced(capture_spans: Any) -> None:
    """Responses that write around the payload writer llmtrace stands in front of: a WebSocket
    (frames go through its own writer) and a file (sendfile): both delivered whole, each call
    one SERVER span with its status, no telemetry error counted."""
    from aiohttp import ClientSession, web

    from llmtrace._safety import error_counts

    async def echo(request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        async for message in socket:
            await socket.send_str("echo:" + message.data)
            if message.data == "bye":
                await socket.close()
        return socket

    async def source(request: web.Request) -> web.FileResponse:
        return web.FileResponse(__file__)

    async def talk(url: str) -> tuple[list[str], bytes]:
        async with ClientSession() as session:
            async with session.ws_connect(url + "/ws") as socket:
                replies = []
                for text in ("a", "bye"):
                    await socket.send_str(text)
                    replies.append((await socket.receive()).data)
            async with session.get(url + "/file") as response:
                return replies, await response.read()

    with capture_spans() as captured:
        errors_before = sum(error_counts().values())
        app = web.Application()
        app.router.add_get("/ws", echo)
        app.router.add_get("/file", source)
        with aiohttp_server(app) as url:
            replies, body = asyncio.run(talk(url))
            spans = _server_spans(captured, 2)
        assert errors_before == sum(error_counts().values())
    assert ["echo:a", "echo:bye"] == replies
    assert Path(__file__).read_bytes() == body
    assert {("GET /ws", 101), ("GET /file", 200)} == {(s.name, s.attributes["http.response.status_code"])
                                                      for s in spans}


def test_app_with_no_middleware_of_its_own_gets_the_span_as_its_request_handler(capture_spans: Any) -> None:
    """An app whose only middleware is llmtrace's has it taken out when the app is frozen, and its
    server's request handler makes the SERVER span (no middleware chain per request); an app with
    a middleware of its own keeps llmtrace's, first. Both: one SERVER span per call."""
    import httpx
    from aiohttp import web

    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    @web.middleware
    async def own(request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        response.headers["X-Own"] = "1"
        return response

    with capture_spans() as captured:
        plain, with_own = web.Application(), web.Application(middlewares=[own])
        for app in (plain, with_own):
            app.router.add_get("/hello/{name}", hello)
        with aiohttp_server(plain) as plain_url, aiohttp_server(with_own) as own_url, \
                httpx.Client(timeout=30) as client:
            assert 200 == client.get(plain_url + "/hello/a").status_code
            assert "1" == client.get(own_url + "/hello/b").headers["X-Own"]
            spans = _server_spans(captured, 2)
            time.sleep(0.2)  # a third SERVER span, if any, would have ended by now
            assert 2 == len([s for s in captured.collect() if s.kind == trace.SpanKind.SERVER])
    from llmtrace.integrations.aiohttp.middleware import server_span_middleware

    assert [] == list(plain.middlewares)
    assert [server_span_middleware, own] == list(with_own.middlewares)
    assert ["GET /hello/{name}"] * 2 == [s.name for s in spans]
    assert {"/hello/a", "/hello/b"} == {s.attributes["url.path"] for s in spans}


def test_non_streamed_response_carries_server_timing(serve: Any) -> None:
    """A non-streamed traced response: Server-Timing with the request's queue, prefill and TTFT."""
    import httpx

    with serve() as (url, _captured), httpx.Client(timeout=30) as client:
        response = client.post(url + "/v1/completions", json={})
    timing = dict(item.strip().split(";dur=") for item in response.headers["server-timing"].split(","))
    assert {"queue", "prefill", "decode", "ttft"} == set(timing)
    assert float(timing["queue"]) >= 5.0  # the handler waited 10 ms between queued and scheduled
    assert float(timing["ttft"]) >= float(timing["queue"])
    assert "traceresponse" in response.headers


def test_unsampled_response_has_no_trace_headers_and_is_still_counted(serve: Any) -> None:
    """A caller's unsampled traceparent: no span, the response exactly as the app made it, and
    the request in http.server.request.duration all the same."""
    import httpx

    with serve() as (url, captured), httpx.Client(timeout=30) as client:
        before = _duration_counts(captured).get("/v1/completions", 0)
        response = client.post(url + "/v1/completions", json={}, headers={"traceparent": UNSAMPLED})
        streamed = client.post(url + "/v1/stream/tiny", json={}, headers={"traceparent": UNSAMPLED})
        time.sleep(0.3)
        spans = [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
        after = _duration_counts(captured).get("/v1/completions", 0)
    assert (200, 200) == (response.status_code, streamed.status_code)
    assert [] == spans
    for headers in (response.headers, streamed.headers):
        assert {"traceresponse", "server-timing", "access-control-expose-headers"}.isdisjoint(headers)
    assert 1 == after - before


def test_response_headers_can_be_turned_off(serve: Any) -> None:
    """response_headers=False: the response is exactly the app's."""
    import httpx

    with serve(response_headers=False) as (url, captured), httpx.Client(timeout=30) as client:
        response = client.post(url + "/v1/completions", json={})
        streamed = client.post(url + "/v1/stream/tiny", json={})
        _server_spans(captured, 2)
    for headers in (response.headers, streamed.headers):
        assert "traceresponse" not in headers
        assert "server-timing" not in headers


def test_handler_exception_marks_the_span_as_error(serve: Any) -> None:
    """An exception in the handler: 500 to the client, SERVER span ERROR with error.type and an
    exception event; the server keeps serving."""
    import httpx

    with serve() as (url, captured), httpx.Client(timeout=30) as client:
        assert 500 == client.get(url + "/boom").status_code
        assert 200 == client.get(url + "/health").status_code
        spans = {s.name: s for s in _server_spans(captured, 2)}
    boom = spans["GET /boom"]
    assert trace.StatusCode.ERROR == boom.status.status_code
    assert "RuntimeError" == boom.attributes["error.type"]
    assert 500 == boom.attributes["http.response.status_code"]
    assert ["exception"] == [event.name for event in boom.events]
    assert "error.type" not in spans["GET /health"].attributes


def test_raised_http_exception_is_a_response(serve: Any) -> None:
    """An aiohttp HTTPException raised by the handler is its response: a 403 is no error; a 503
    is (error.type the status code); both carry the status code and traceresponse."""
    import httpx

    with serve() as (url, captured), httpx.Client(timeout=30) as client:
        refused, busy = client.get(url + "/refused"), client.get(url + "/busy")
        spans = {s.name: s for s in _server_spans(captured, 2)}
    assert (403, 503) == (refused.status_code, busy.status_code)
    assert "traceresponse" in refused.headers and "traceresponse" in busy.headers
    assert 403 == spans["GET /refused"].attributes["http.response.status_code"]
    assert trace.StatusCode.UNSET == spans["GET /refused"].status.status_code
    assert "error.type" not in spans["GET /refused"].attributes
    assert trace.StatusCode.ERROR == spans["GET /busy"].status.status_code
    assert "503" == spans["GET /busy"].attributes["error.type"]


def _duration_counts(captured: CapturedTelemetry) -> dict[Any, int]:
    """Requests in http.server.request.duration so far, by route (cumulative over the session:
    every test shares the capture's MeterProvider)."""
    points = captured.metrics().get("http.server.request.duration", [])
    counts: dict[Any, int] = {}
    for point in points:
        route = point.attributes.get("http.route")
        counts[route] = counts.get(route, 0) + point.count
    return counts


def test_duration_histogram_counts_every_request(serve: Any) -> None:
    """http.server.request.duration: each request under its route and status (a 404 without a
    route); active requests back to zero."""
    import httpx

    with serve() as (url, captured), httpx.Client(timeout=30) as client:
        before = _duration_counts(captured)
        for _ in range(3):
            assert 200 == client.get(url + "/health").status_code
        assert 200 == client.post(url + "/v1/stream/tiny", json={}).status_code
        assert 404 == client.get(url + "/nope").status_code
        _server_spans(captured, 5)
        after = _duration_counts(captured)
        points = captured.metrics()["http.server.request.duration"]
        active = [p.value for p in captured.metrics()["http.server.active_requests"]]
    added = {route: count - before.get(route, 0) for route, count in after.items()}
    assert {"/health": 3, "/v1/stream/{model}": 1, None: 1} == {route: n for route, n in added.items() if n}
    stream = next(p for p in points if p.attributes.get("http.route") == "/v1/stream/{model}")
    assert {"http.request.method": "POST", "url.scheme": "http", "http.response.status_code": 200,
            "http.route": "/v1/stream/{model}", "network.protocol.version": "1.1"} == dict(stream.attributes)
    assert stream.sum > 0.02  # the handler slept 4 x 5 ms
    assert all(0 == value for value in active)


@pytest.mark.parametrize("source", ["option", "otel-variable"])
def test_excluded_urls_get_no_span_and_still_work(serve: Any, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    """excluded_urls, or OpenTelemetry's OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS (whose patterns
    that instrumentation matches against the path, hence the anchored one): the health check is
    served but neither traced nor counted; the other request is both."""
    import httpx

    options: dict[str, Any] = {}
    if source == "option":
        options["excluded_urls"] = "/health$"
    else:
        monkeypatch.setenv("OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS", "^/health")
    with serve(**options) as (url, captured), httpx.Client(timeout=30) as client:
        before = _duration_counts(captured)
        response = client.get(url + "/health")
        assert 200 == client.post(url + "/v1/completions", json={}).status_code
        _server_spans(captured, 1)
        time.sleep(0.2)
        names = [s.name for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
        after = _duration_counts(captured)
    assert {"ok": True} == response.json()
    assert "traceresponse" not in response.headers
    assert ["POST /v1/completions"] == names
    added = {route: count - before.get(route, 0) for route, count in after.items()}
    assert {"/v1/completions": 1} == {route: n for route, n in added.items() if n}


@contextmanager
def _host_instrumented() -> Iterator[None]:
    """The host enabled OpenTelemetry's aiohttp-server instrumentation itself (global providers)."""
    from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor

    with warnings.catch_warnings():  # its web.Application subclass is deprecated by aiohttp
        warnings.simplefilter("ignore", DeprecationWarning)
        AioHttpServerInstrumentor().instrument()
    try:
        yield
    finally:
        AioHttpServerInstrumentor().uninstrument()


@pytest.mark.parametrize("order", ["before-llmtrace", "after-llmtrace"])
def test_host_instrumented_app_keeps_its_one_server_span(capture_spans: Any, order: str) -> None:
    """The host enabled OpenTelemetry's aiohttp-server instrumentation, before or after llmtrace's
    instrument(): exactly one SERVER span (the host's), llm.request its child with the first byte
    timed on it, and the host's instrumentation still on after llmtrace's uninstrument()."""
    import httpx
    from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor

    @contextmanager
    def setup() -> Iterator[CapturedTelemetry]:
        if order == "before-llmtrace":
            with _host_instrumented(), capture_spans() as captured:
                yield captured
                llmtrace.uninstrument()
                assert AioHttpServerInstrumentor().is_instrumented_by_opentelemetry
        else:
            with capture_spans() as captured, _host_instrumented():
                yield captured

    with setup() as captured:
        app = build_app()
        with aiohttp_server(app) as url, httpx.Client(timeout=30) as client:
            assert 200 == client.post(url + "/v1/stream/tiny", json={}).status_code
            [request] = _requests(captured, 1)
            _server_spans(captured, 1)
            time.sleep(0.3)  # a second SERVER span, if any, would have ended by now
            servers_seen = [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
    assert 1 == len(servers_seen)
    assert OTEL_SCOPE == servers_seen[0].instrumentation_scope.name
    assert servers_seen[0].context.span_id == request.parent.span_id
    assert servers_seen[0].attributes[semconv.LLM_TIME_TO_FIRST_BYTE_S] > 0


def test_call_inside_another_server_span_joins_it(capture_spans: Any) -> None:
    """A host middleware put before llmtrace's opens a SERVER span of its own: llmtrace joins it
    (one SERVER span, the request its child) instead of making a second."""
    import httpx
    from aiohttp import web

    @web.middleware
    async def host_span(request: web.Request, handler: Any) -> web.StreamResponse:
        tracer = trace.get_tracer("host")
        with tracer.start_as_current_span("host " + request.path, kind=trace.SpanKind.SERVER):
            response: web.StreamResponse = await handler(request)
            return response

    with capture_spans() as captured:
        app = build_app()
        app.middlewares.insert(0, host_span)
        with aiohttp_server(app) as url, httpx.Client(timeout=30) as client:
            assert 200 == client.post(url + "/v1/stream/tiny", json={}).status_code
            [request] = _requests(captured, 1)
            _server_spans(captured, 1)
            time.sleep(0.3)  # a second SERVER span, if any, would have ended by now
            servers_seen = [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
    assert ["host /v1/stream/tiny"] == [s.name for s in servers_seen]
    assert servers_seen[0].context.span_id == request.parent.span_id


@pytest.mark.parametrize(("mode", "scope_name"), [("otel", OTEL_SCOPE), ("llmtrace", "llmtrace")])
def test_server_spans_option_chooses_who_makes_the_span(serve: Any, mode: str, scope_name: str) -> None:
    """server_spans=otel: OpenTelemetry's middleware makes the one SERVER span; llmtrace: its own."""
    import httpx

    with serve(server_spans=mode) as (url, captured), httpx.Client(timeout=30) as client:
        assert 200 == client.post(url + "/v1/stream/tiny", json={}).status_code
        [request] = _requests(captured, 1)
        [server] = _server_spans(captured, 1)
    assert scope_name == server.instrumentation_scope.name
    assert server.context.span_id == request.parent.span_id


def test_server_spans_off_leaves_requests_as_roots(serve: Any) -> None:
    """server_spans=off: no SERVER span; the request is still traced."""
    import httpx

    with serve(server_spans="off") as (url, captured), httpx.Client(timeout=30) as client:
        assert 200 == client.post(url + "/v1/stream/tiny", json={}).status_code
        [request] = _requests(captured, 1)
        assert [] == [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
    assert request.parent is None


def test_uninstrument_leaves_a_live_app_serving_untraced(capture_spans: Any) -> None:
    """An app made while llmtrace was on keeps its middleware after uninstrument(): the calls
    pass straight through, untraced and unchanged."""
    import httpx

    with capture_spans():
        app = build_app()
    with aiohttp_server(app) as url, capture_spans(instrument=False) as captured, \
            httpx.Client(timeout=30) as client:
        response = client.post(url + "/v1/completions", json={}, headers={"traceparent": TRACEPARENT})
        streamed = client.post(url + "/v1/stream/tiny", json={})
        time.sleep(0.3)
        spans = captured.collect()
    assert (200, 200) == (response.status_code, streamed.status_code)
    assert "traceresponse" not in response.headers and "traceresponse" not in streamed.headers
    assert [] == [s for s in spans if s.kind == trace.SpanKind.SERVER]


COMPARE_SCRIPT = """
import json, time, httpx, llmtrace
from llmtrace import testing
from opentelemetry import trace
from tests.pipeline.test_aiohttp_server_span import aiohttp_server, build_app

found = {}
for mode in ("llmtrace", "otel"):
    with testing.capture(server_spans=mode) as captured, aiohttp_server(build_app()) as url:
        with httpx.Client(timeout=30) as client:
            client.post(url + "/v1/stream/tiny?x=1", json={}, headers={"user-agent": "cmp/1"}).read()
            client.get(url + "/nope").read()
            client.get(url + "/busy").read()
            client.get(url + "/boom").read()
        time.sleep(0.3)
        spans = [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
    found[mode] = {s.name: {"attributes": dict(s.attributes), "status": s.status.status_code.name}
                   for s in spans}
    llmtrace.uninstrument()
print(json.dumps(found))
"""


def test_attributes_match_opentelemetrys_aiohttp_middleware_on_the_same_app() -> None:
    """The same app, once with llmtrace's SERVER span and once with OpenTelemetry's aiohttp-server
    middleware (OTEL_SEMCONV_STABILITY_OPT_IN=http): the same span names, statuses and attribute
    values, except what OpenTelemetry's does not emit — client.address and client.port, the 500
    that aiohttp answers a handler's exception with, and http.route on an unmatched path, where
    it sets an empty string. Run in a fresh process: OpenTelemetry reads the opt-in once per
    process."""
    result = subprocess.run([sys.executable, "-c", COMPARE_SCRIPT], check=False, capture_output=True, text=True,
                            timeout=120, cwd=REPO, env={**os.environ, "OTEL_SEMCONV_STABILITY_OPT_IN": "http"})
    assert 0 == result.returncode, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    ours, theirs = found["llmtrace"], found["otel"]
    assert sorted(theirs) == sorted(ours) == ["GET", "GET /boom", "GET /busy", "POST /v1/stream/{model}"]
    assert "" == theirs["GET"]["attributes"].pop("http.route")
    assert 500 == ours["GET /boom"]["attributes"].pop("http.response.status_code")
    for name in theirs:
        # Each mode ran its own server: the ports differ; llm.* is llmtrace's own in both modes.
        mine, other = ({k: v for k, v in span["attributes"].items()
                        if not k.startswith("llm.") and not k.endswith(".port") and not k.startswith("client.")}
                       for span in (ours[name], theirs[name]))
        assert other == mine, name
        assert theirs[name]["status"] == ours[name]["status"], name
        assert "server.port" in ours[name]["attributes"] and "server.port" in theirs[name]["attributes"]
