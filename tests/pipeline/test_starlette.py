"""A plain Starlette app (no FastAPI) under real uvicorn on loopback: the shape of a serving
front end someone wrote on Starlette directly, reporting through the lifecycle API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace

import llmtrace
from llmtrace import semconv
from llmtrace.testing import CapturedTelemetry
from tests.helpers.waits import wait_for_spans

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _app(with_otel_middleware: bool = False) -> Any:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def generate(request: Request) -> StreamingResponse:
        body = await request.json()
        tokens = int(body.get("max_tokens", 8))
        handle = llmtrace.start_request(model="starlette-engine", max_tokens=tokens, stream=True)
        handle.tokenized(5)
        handle.queued()
        handle.scheduled()

        async def chunks() -> Any:
            for index in range(tokens):
                await asyncio.sleep(0.01)
                handle.token()
                yield f"data: {index}\n\n"
            handle.finished("length")

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    middleware = []
    if with_otel_middleware:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

        middleware.append(Middleware(OpenTelemetryMiddleware))
    return Starlette(routes=[Route("/v1/generate/{model}", generate, methods=["POST"]),
                             Route("/health", health)], middleware=middleware)


@pytest.fixture
def served(capture_spans: Any) -> Iterator[tuple[str, CapturedTelemetry]]:
    from tests.helpers import servers

    with capture_spans() as captured, servers.uvicorn_server(_app()) as url:
        yield url, captured




def _server_spans(captured: CapturedTelemetry, count: int) -> list[Any]:
    return wait_for_spans(captured, lambda s: s.kind == trace.SpanKind.SERVER, count)


def test_plain_starlette_app_gets_a_named_server_span_with_the_request_under_it(
        served: tuple[str, CapturedTelemetry]) -> None:
    """SERVER span named by the route template, in the caller's trace; llm.request its child with
    its phases; the streamed response's time to first byte on the SERVER span."""
    import httpx

    url, captured = served
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", url + "/v1/generate/tiny", json={"max_tokens": 6}, headers={"traceparent": TRACEPARENT}) as r:
        assert 200 == r.status_code
        r.read()
    [request] = wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST, 1)
    [server] = _server_spans(captured, 1)
    assert "POST /v1/generate/{model}" == server.name
    assert "/v1/generate/{model}" == server.attributes["http.route"]
    assert TRACE_ID == f"{server.context.trace_id:032x}" == f"{request.context.trace_id:032x}"
    assert server.context.span_id == request.parent.span_id
    assert 6 == request.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]
    assert "length" == request.attributes[semconv.LLM_REQUEST_FINISH_REASON]
    assert server.attributes[semconv.LLM_TIME_TO_FIRST_BYTE_S] > 0
    children = {s.name for s in captured.children(request)}
    assert {semconv.SPAN_TOKENIZE, semconv.SPAN_QUEUE, semconv.SPAN_PREFILL, semconv.SPAN_DECODE} <= children


def test_client_disconnect_ends_the_request_as_abort(served: tuple[str, CapturedTelemetry]) -> None:
    """The client leaves after the first chunk: the handler never finishes the request, the scope does."""
    import httpx

    url, captured = served
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", url + "/v1/generate/tiny", json={"max_tokens": 200}) as response:
        next(response.iter_raw())
    [request] = wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST, 1)
    assert "abort" == request.attributes[semconv.LLM_REQUEST_FINISH_REASON]
    assert trace.StatusCode.ERROR == request.status.status_code


def test_unmatched_path_is_named_by_method_only(served: tuple[str, CapturedTelemetry]) -> None:
    """A 404 has no route: the span is named by the method (no raw path in span names)."""
    import httpx

    url, captured = served
    with httpx.Client(timeout=30) as client:
        assert 404 == client.get(url + "/nope/123").status_code
        assert 200 == client.get(url + "/health").status_code
    names = sorted(s.name for s in _server_spans(captured, 2))
    assert ["GET", "GET /health"] == names


def test_app_with_its_own_otel_middleware_gets_one_server_span(capture_spans: Any) -> None:
    """A host that added OpenTelemetryMiddleware itself: no second SERVER span; the scope is
    still inside its middleware, so llm.request is the SERVER span's child."""
    import httpx

    from tests.helpers import servers

    with capture_spans() as captured, servers.uvicorn_server(_app(with_otel_middleware=True)) as url:
        with httpx.Client(timeout=30) as client:
            client.post(url + "/v1/generate/tiny", json={"max_tokens": 2}).read()
        [request] = wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST, 1)
        _server_spans(captured, 1)
        time.sleep(0.3)  # a second SERVER span, if any, would have ended with the first by now
        servers_seen = [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
    assert 1 == len(servers_seen)
    assert servers_seen[0].context.span_id == request.parent.span_id


def test_disabled_integration_leaves_the_app_alone(capture_spans: Any) -> None:
    """integrations without starlette: no SERVER span, and the app still serves."""
    import httpx

    from tests.helpers import servers

    with capture_spans(integrations="tokenizers") as captured, servers.uvicorn_server(_app()) as url:
        with httpx.Client(timeout=30) as client:
            client.post(url + "/v1/generate/tiny", json={"max_tokens": 2}).read()
        wait_for_spans(captured, lambda s: s.name == semconv.SPAN_REQUEST, 1)
        assert [] == [s for s in captured.collect() if s.kind == trace.SpanKind.SERVER]
