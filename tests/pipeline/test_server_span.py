"""llmtrace's own HTTP SERVER span on FastAPI, under real uvicorn on loopback with a real client.

Covers what the span carries (the stable HTTP conventions, as OpenTelemetry's middleware emits
them), the response headers that link a response to its trace, excluded URLs, coexistence with
a host's own OpenTelemetry instrumentation, ``server_spans`` modes, and the HTTP metrics for
requests that sampling dropped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

import llmtrace
from llmtrace import semconv
from llmtrace.testing import CapturedTelemetry
from tests.helpers.waits import wait_for_spans

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
REPO = Path(__file__).resolve().parents[2]


def build_app() -> Any:
    """A FastAPI app shaped like an inference front end: a streamed and a non-streamed completion
    that report through the lifecycle API, a health check, a failing handler."""
    import asyncio

    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()

    @app.post("/v1/completions")
    async def complete(body: dict[str, Any]) -> dict[str, Any]:
        handle = llmtrace.start_request(model="tiny", max_tokens=3)
        handle.tokenized(4)
        handle.queued()
        await asyncio.sleep(0.01)
        handle.scheduled()
        for _ in range(3):
            await asyncio.sleep(0.005)
            handle.token()
        handle.finished("length")
        return {"text": "abc"}

    @app.post("/v1/stream/{model}")
    async def stream(model: str) -> StreamingResponse:
        handle = llmtrace.start_request(model=model, max_tokens=4, stream=True)

        async def events() -> Any:
            handle.queued()
            handle.scheduled()
            for index in range(4):
                await asyncio.sleep(0.005)
                handle.token()
                yield f"data: {index}\n\n"
            handle.finished("length")
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("engine exploded")

    return app


@pytest.fixture(params=["compiled send", "python send"])
def serve(request: pytest.FixtureRequest, capture_spans: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``with serve(**options) as (url, captured):`` — the app above, llmtrace on with *options*;
    each test runs with the compiled ``send`` (llmtrace-native) and with the Python one."""
    from contextlib import contextmanager

    from llmtrace.integrations import _asgi
    from tests.helpers import servers

    if request.param == "python send":
        monkeypatch.setattr(_asgi, "COMPILED_SEND", None)
    elif _asgi.COMPILED_SEND is None:
        pytest.skip("the compiled send is not in use (llmtrace-native not built, or LLMTRACE_ASGI_SEND=python)")

    @contextmanager
    def start(app: Any = None, **options: Any) -> Iterator[tuple[str, CapturedTelemetry]]:
        with capture_spans(**options) as captured, servers.uvicorn_server(app or build_app()) as url:
            yield url, captured

    yield start


def _server_spans(captured: CapturedTelemetry, count: int) -> list[Any]:
    return wait_for_spans(captured, lambda s: s.kind == trace.SpanKind.SERVER, count)


def test_server_span_is_the_callers_child_and_the_requests_parent(serve: Any) -> None:
    """An incoming traceparent: the SERVER span continues the caller's trace under its span,
    named by the route; llm.request is its child; the response names the span in traceresponse."""
    import httpx

    with serve() as (url, captured), httpx.Client(timeout=30) as client:
        response = client.post(url + "/v1/stream/tiny", json={}, headers={"traceparent": TRACEPARENT})
        assert 200 == response.status_code
        [server] = _server_spans(captured, 1)
        [request] = wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST, 1)
    assert "POST /v1/stream/{model}" == server.name
    assert TRACE_ID == f"{server.context.trace_id:032x}" == f"{request.context.trace_id:032x}"
    assert int(PARENT_ID, 16) == server.parent.span_id
    assert server.context.span_id == request.parent.span_id
    assert f"00-{TRACE_ID}-{server.context.span_id:016x}-01" == response.headers["traceresponse"]
    assert "server-timing" not in response.headers  # streamed: the phases are not known at the first byte
    assert server.attributes[semconv.LLM_TIME_TO_FIRST_BYTE_S] > 0
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
    assert trace.SpanKind.SERVER == server.kind
    assert trace.StatusCode.UNSET == server.status.status_code


def test_route_of_a_mounted_app_carries_the_mount_path(serve: Any) -> None:
    """A FastAPI app mounted under /v2: http.route is the whole template, /v2/items/{item_id};
    the mounted app's own middleware joins the one SERVER span."""
    import httpx
    from fastapi import FastAPI

    app, sub = FastAPI(), FastAPI()

    @sub.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    app.mount("/v2", sub)
    with serve(app) as (url, captured), httpx.Client(timeout=30) as client:
        assert {"id": 3} == client.get(url + "/v2/items/3").json()
        [server] = _server_spans(captured, 1)
        time.sleep(0.2)
        assert 1 == len([s for s in captured.collect() if s.kind == trace.SpanKind.SERVER])
    assert ("GET /v2/items/{item_id}", "/v2/items/{item_id}") == (server.name, server.attributes["http.route"])


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


def test_response_headers_can_be_turned_off(serve: Any) -> None:
    """response_headers=False: the response is exactly the app's."""
    import httpx

    with serve(response_headers=False) as (url, captured), httpx.Client(timeout=30) as client:
        response = client.post(url + "/v1/completions", json={})
        _server_spans(captured, 1)
    assert "traceresponse" not in response.headers
    assert "server-timing" not in response.headers


def test_handler_exception_marks_the_span_as_error(serve: Any) -> None:
    """An exception in the handler: 500 to the client, SERVER span ERROR with error.type and an
    exception event; the server keeps serving."""
    import httpx

    with serve() as (url, captured):
        # One connection each: uvicorn closes a connection whose app raised (traced or not).
        assert 500 == httpx.get(url + "/boom", timeout=30).status_code
        assert 200 == httpx.get(url + "/health", timeout=30).status_code
        spans = {s.name: s for s in _server_spans(captured, 2)}
    boom = spans["GET /boom"]
    assert trace.StatusCode.ERROR == boom.status.status_code
    assert "RuntimeError" == boom.attributes["error.type"]
    assert 500 == boom.attributes["http.response.status_code"]
    assert ["exception"] == [event.name for event in boom.events]
    assert "error.type" not in spans["GET /health"].attributes


def _duration_counts(captured: CapturedTelemetry) -> dict[Any, int]:
    """Requests in http.server.request.duration so far, by route (cumulative over the session:
    every test shares the capture's MeterProvider)."""
    points = captured.metrics().get("http.server.request.duration", [])
    return {p.attributes.get("http.route"): p.count for p in points}


def test_excluded_urls_get_no_span_and_still_work(serve: Any) -> None:
    """excluded_urls: the health check is served but neither traced nor counted; the other
    request is both, and nothing is left counted as active."""
    import httpx

    with serve(excluded_urls="/health$") as (url, captured), httpx.Client(timeout=30) as client:
        before = _duration_counts(captured)
        assert {"ok": True} == client.get(url + "/health").json()
        assert 200 == client.post(url + "/v1/completions", json={}).status_code
        _server_spans(captured, 1)
        time.sleep(0.2)
        names = [s.name for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
        after = _duration_counts(captured)
        active = [p.value for p in captured.metrics()["http.server.active_requests"]]
    assert ["POST /v1/completions"] == names
    added = {route: count - before.get(route, 0) for route, count in after.items()}
    assert {"/v1/completions": 1} == {route: n for route, n in added.items() if n}
    assert all(0 == value for value in active)


def test_host_instrumented_app_keeps_its_one_server_span(serve: Any) -> None:
    """The host ran OpenTelemetry's FastAPIInstrumentor on its app: exactly one SERVER span (the
    host's), and llmtrace's request joins it as its child."""
    import httpx
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    app = build_app()
    FastAPIInstrumentor.instrument_app(app, exclude_spans=["send", "receive"])
    try:
        with serve(app) as (url, captured), httpx.Client(timeout=30) as client:
            assert 200 == client.post(url + "/v1/stream/tiny", json={}).status_code
            [request] = wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST, 1)
            _server_spans(captured, 1)
            time.sleep(0.3)  # a second SERVER span, if any, would have ended by now
            servers_seen = [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
    finally:
        FastAPIInstrumentor.uninstrument_app(app)
    assert 1 == len(servers_seen)
    assert "opentelemetry.instrumentation.fastapi" == servers_seen[0].instrumentation_scope.name
    assert servers_seen[0].context.span_id == request.parent.span_id


def test_app_wrapped_in_opentelemetrys_middleware_by_hand_gets_one_server_span(serve: Any) -> None:
    """The host wrapped the whole ASGI app in OpenTelemetry's middleware (outside FastAPI's own
    stack): a call already inside that SERVER span gets no second one; the request is its child."""
    import httpx
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    with serve(OpenTelemetryMiddleware(build_app(), exclude_spans=["send", "receive"])) as (url, captured), \
            httpx.Client(timeout=30) as client:
        response = client.post(url + "/v1/stream/tiny", json={})
        assert 200 == response.status_code
        [request] = wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST, 1)
        _server_spans(captured, 1)
        time.sleep(0.3)  # a second SERVER span, if any, would have ended by now
        servers_seen = [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
    assert 1 == len(servers_seen)
    assert "opentelemetry.instrumentation.asgi" == servers_seen[0].instrumentation_scope.name
    assert servers_seen[0].context.span_id == request.parent.span_id
    assert "traceresponse" not in response.headers  # llmtrace's headers come with llmtrace's span only


@pytest.mark.parametrize(("mode", "scope_name"), [("otel", "opentelemetry.instrumentation.fastapi"),
                                                  ("llmtrace", "llmtrace")])
def test_server_spans_option_chooses_who_makes_the_span(serve: Any, mode: str, scope_name: str) -> None:
    """server_spans=otel: OpenTelemetry's middleware makes the one SERVER span; llmtrace: its own."""
    import httpx

    with serve(server_spans=mode) as (url, captured), httpx.Client(timeout=30) as client:
        assert 200 == client.post(url + "/v1/stream/tiny", json={}).status_code
        [request] = wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST, 1)
        [server] = _server_spans(captured, 1)
    assert scope_name == server.instrumentation_scope.name
    assert server.context.span_id == request.parent.span_id


def test_server_spans_off_leaves_requests_as_roots(serve: Any) -> None:
    """server_spans=off: no SERVER span; the request is still traced, and a disconnect still ends it."""
    import httpx

    with serve(server_spans="off") as (url, captured), httpx.Client(timeout=30) as client:
        assert 200 == client.post(url + "/v1/stream/tiny", json={}).status_code
        [request] = wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST, 1)
        assert [] == [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
    assert request.parent is None


def _run_script(script: str, env: dict[str, str]) -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                            timeout=120, cwd=REPO, env={**os.environ, **env})
    assert 0 == result.returncode, result.stderr
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


COMPARE_SCRIPT = """
import json, httpx, llmtrace
from llmtrace import testing
from opentelemetry import trace
from tests.helpers import servers
from tests.pipeline.test_server_span import build_app

found = {}
for mode in ("llmtrace", "otel"):
    with testing.capture(server_spans=mode) as captured, servers.uvicorn_server(build_app()) as url:
        with httpx.Client(timeout=30) as client:
            client.post(url + "/v1/stream/tiny?x=1", json={}, headers={"user-agent": "cmp/1"}).read()
            client.get(url + "/nope").read()
        import time; time.sleep(0.3)
        spans = [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
    found[mode] = {s.name: dict(s.attributes) for s in spans}
    llmtrace.uninstrument()
print(json.dumps(found))
"""


def test_attributes_match_opentelemetrys_middleware_on_the_same_app() -> None:
    """The same app, once with llmtrace's SERVER span and once with OpenTelemetry's middleware
    (OTEL_SEMCONV_STABILITY_OPT_IN=http): the same span names and attributes, except that
    server.address is the host alone where OpenTelemetry keeps the port in it (the conventions
    define it as the host; the port is server.port). Run in a fresh process: OpenTelemetry reads
    the opt-in once per process."""
    found = _run_script(COMPARE_SCRIPT, {"OTEL_SEMCONV_STABILITY_OPT_IN": "http"})
    ours, theirs = found["llmtrace"], found["otel"]
    assert sorted(theirs) == sorted(ours) == ["GET", "POST /v1/stream/{model}"]
    for name in theirs:
        # Each mode ran its own server: the ports differ; llm.* is llmtrace's own in both modes.
        mine, other = ({k: v for k, v in attrs.items() if not k.startswith("llm.") and not k.endswith(".port")}
                       for attrs in (ours[name], theirs[name]))
        host, _, port = str(other.pop("server.address")).partition(":")
        assert (host, int(port)) == (mine.pop("server.address"), theirs[name]["server.port"])
        assert other == mine
        assert sorted(theirs[name]) == sorted(k for k in ours[name] if k in theirs[name] or not k.startswith("llm."))


MERGED_SCRIPT = """
import json, httpx, llmtrace
from tests.helpers import servers
from tests.pipeline.test_server_span import build_app

llmtrace.instrument(exporter="file:" + PATH, gpu="off", sample_ratio=0.0)
with servers.uvicorn_server(build_app()) as url, httpx.Client(timeout=30) as client:
    headers = [dict(client.post(url + "/v1/stream/tiny", json={}).headers) for _ in range(7)]
llmtrace.shutdown()
last = {"traceresponse": [h.get("traceresponse") for h in headers], "spans": []}
for line in open(PATH):
    for rs in json.loads(line).get("resourceSpans", []):
        last["spans"] += [s["name"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    for rm in json.loads(line).get("resourceMetrics", []):
        for sm in rm["scopeMetrics"]:
            for m in sm["metrics"]:
                if m["name"].startswith("http.server"):
                    last[m["name"]] = m
print(json.dumps(last))
"""


def test_unsampled_requests_are_in_the_exported_duration_histogram(tmp_path: Path) -> None:
    """sample_ratio=0 with llmtrace's own providers and the file exporter: no span and no
    traceresponse, yet every request is in http.server.request.duration — which llmtrace
    aggregates itself and merges into each export — with the conventions' buckets, and the
    active-requests counter is back to zero."""
    out = tmp_path / "traces.jsonl"
    found = _run_script(MERGED_SCRIPT.replace("PATH", repr(str(out))), {})
    assert [] == found["spans"]
    assert [None] * 7 == found["traceresponse"]
    duration = found["http.server.request.duration"]
    [point] = duration["histogram"]["dataPoints"]
    assert "7" == point["count"]
    assert list(semconv.HTTP_SERVER_DURATION_BUCKETS) == point["explicitBounds"]
    assert 7 == sum(int(c) for c in point["bucketCounts"])
    assert "s" == duration["unit"]
    attributes = {a["key"]: next(iter(a["value"].values())) for a in point["attributes"]}
    assert "/v1/stream/{model}" == attributes["http.route"]
    active = found["http.server.active_requests"]["sum"]["dataPoints"]
    assert ["0"] == [p.get("asInt") for p in active]


def test_client_gone_at_the_last_message_ends_deferred_requests_as_abort(capture_spans: Any) -> None:
    """A request whose end waits for the response (as generate()'s does) and a client that is
    found gone only when the last message is sent: the request ends as abort, not stop. Driven
    through ASGI directly with a send that fails like a server's on a closed connection (the
    timing a real socket would need cannot be forced over loopback)."""
    import asyncio

    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    from llmtrace.lifecycle.scope import DeferredFinish, current_scope

    app = FastAPI()

    @app.get("/v1/stream")
    async def stream() -> StreamingResponse:
        handle = llmtrace.start_request("deferred", model="tiny")
        scope = current_scope()
        assert scope is not None and scope.defer_finish(handle, DeferredFinish("stop", 2, None))

        async def events() -> Any:
            yield "data: 1\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": "/v1/stream", "raw_path": b"/v1/stream", "query_string": b"",
             "root_path": "", "headers": [(b"host", b"test")], "client": ("127.0.0.1", 5), "server": ("test", 80)}

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            raise ConnectionResetError("the client is gone")

    async def call() -> None:
        try:
            await app(scope, receive, send)
        except Exception as exc:  # noqa: BLE001 - Starlette reports the lost client; its type varies by version
            assert "ClientDisconnect" in type(exc).__name__ or isinstance(exc, ConnectionResetError)

    with capture_spans() as captured:
        asyncio.run(call())
        [request] = wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST, 1)
    assert semconv.FINISH_ABORT == request.attributes[semconv.LLM_REQUEST_FINISH_REASON]
