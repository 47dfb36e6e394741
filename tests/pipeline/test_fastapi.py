"""FastAPI under real uvicorn on loopback, a real HTTP client, the tiny model streaming tokens."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace

from llmtrace import semconv
from llmtrace.testing import CapturedTelemetry

pytestmark = pytest.mark.torch

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def served(tiny_model: Any, tiny_tokenizer: Any, capture_spans: Any) -> Iterator[tuple[str, CapturedTelemetry]]:
    import torch

    from tests.helpers import apps, servers

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a generate() thread spinning on both cores delays the server's event loop
    with capture_spans() as captured:
        app = apps.build_app(tiny_tokenizer, tiny_model)
        try:
            with servers.uvicorn_server(app) as url:
                yield url, captured
                with app.state.generate_lock:  # a generate() thread the client abandoned
                    pass
        finally:
            torch.set_num_threads(threads)


def _stream(client: Any, url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> float:
    """POST and read the whole streamed body; returns the client's own time to the first chunk."""
    start = time.monotonic()
    first = None
    with client.stream("POST", url, json=body, headers=headers or {}) as response:
        assert 200 == response.status_code
        for _chunk in response.iter_raw():
            if first is None:
                first = time.monotonic() - start
    assert first is not None
    return first


def _requests_by_server(captured: CapturedTelemetry, path: str, count: int = 1,
                        timeout_s: float = 20.0) -> list[tuple[Any, Any]]:
    """(SERVER span, its llm.request) per call to *path*, once *count* SERVER spans have ended:
    a SERVER span ends after its response, which can be after the span builder built llm.request."""
    deadline = time.monotonic() + timeout_s
    while True:
        captured.collect()
        servers = [s for s in captured.spans if s.kind == trace.SpanKind.SERVER and s.name.endswith(path)]
        if len(servers) >= count or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    pairs = []
    for server in servers:
        children = captured.children(server, semconv.SPAN_REQUEST)
        pairs.append((server, children[0] if children else None))
    return sorted(pairs, key=lambda pair: pair[0].start_time)


def _wait_for(captured: CapturedTelemetry, name: str, count: int, timeout_s: float = 20.0) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [s for s in captured.collect() if s.name == name]
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{count} {name} span(s) did not arrive: {[s.name for s in captured.spans]}")


def test_span_ttft_agrees_with_the_clients_ttft(served: tuple[str, CapturedTelemetry], tiny_model: Any) -> None:
    """Streaming per token: the span's TTFT and time to first byte match the client's TTFT to within half a step.

    Every forward is slowed to FORWARD_S so that the wrong answers are far from the right one:
    a TTFT taken before the prefill would sit a whole step under the client's, one taken at the
    second token a whole step over it. The streaming hops in between (streamer queue -> worker
    thread -> event loop -> socket -> client) are a few ms, and a busy shared CI host adds
    several more, so the bound is half a step, not a wall-clock figure tuned to one machine.
    """
    import httpx

    forward_s = 0.040
    slow_down = tiny_model.register_forward_pre_hook(lambda *_: time.sleep(forward_s))
    url, captured = served
    body = {"prompt": "hello world", "max_tokens": 4}
    try:
        with httpx.Client(timeout=30) as client:
            for _ in range(2):  # warm up: thread pool, first forward
                _stream(client, url + "/v1/stream", body)
            client_ttfts = [_stream(client, url + "/v1/stream", body) for _ in range(5)]
    finally:
        slow_down.remove()
    _wait_for(captured, semconv.SPAN_REQUEST, 7)
    pairs = _requests_by_server(captured, "/v1/stream", 7)[2:]
    span_ttfts = [request.attributes[semconv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] for _, request in pairs]
    first_bytes = [server.attributes[semconv.LLM_TIME_TO_FIRST_BYTE_S] for server, _ in pairs]
    assert all(s >= forward_s for s in span_ttfts), span_ttfts  # the prefill is inside the TTFT
    gaps = [c - s for c, s in zip(client_ttfts, span_ttfts, strict=True)]
    byte_gaps = [c - b for c, b in zip(client_ttfts, first_bytes, strict=True)]
    assert all(g >= -0.001 for g in gaps), (client_ttfts, span_ttfts)  # never after the client saw it
    assert statistics.median(gaps) <= forward_s / 2, (client_ttfts, span_ttfts)
    assert statistics.median(byte_gaps) <= forward_s / 2, (client_ttfts, first_bytes)
    assert all(s <= b + 0.001 for s, b in zip(span_ttfts, first_bytes, strict=True))  # token, then byte


def test_request_is_a_child_of_the_server_span_with_traceparent(served: tuple[str, CapturedTelemetry]) -> None:
    """An incoming traceparent: SERVER is the caller's child, llm.request the SERVER's child (never a sibling)."""
    import httpx

    url, captured = served
    with httpx.Client(timeout=30) as client:
        _stream(client, url + "/v1/stream", {"prompt": "hello", "max_tokens": 3}, {"traceparent": TRACEPARENT})
        response = client.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3},
                               headers={"traceparent": TRACEPARENT})
        assert 200 == response.status_code
    _wait_for(captured, semconv.SPAN_REQUEST, 2)
    for path in ("/v1/stream", "/v1/completions"):
        [(server, request)] = _requests_by_server(captured, path)
        assert int(TRACE_ID, 16) == server.context.trace_id == request.context.trace_id
        assert int(PARENT_ID, 16) == server.parent.span_id
        assert server.context.span_id == request.parent.span_id
        assert server.start_time <= request.start_time and request.end_time <= server.end_time + 1_000_000
        tokenize = captured.children(request, semconv.SPAN_TOKENIZE)
        assert 1 == len(tokenize)  # the handler's encode, adopted by the request generate() opened
    [(_, request)] = _requests_by_server(captured, "/v1/completions")
    assert 1 == len(captured.children(request, semconv.SPAN_DETOKENIZE))  # the final decode after generate()
    [(server, _)] = _requests_by_server(captured, "/v1/completions")
    assert semconv.LLM_TIME_TO_FIRST_BYTE_S not in server.attributes  # not a streamed response


def test_client_disconnect_mid_stream_ends_the_request_as_abort(served: tuple[str, CapturedTelemetry]) -> None:
    """The client goes away after the first chunk: llm.request ends with finish reason abort, status ERROR."""
    import httpx

    url, captured = served
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", url + "/v1/stream", json={"prompt": "hello", "max_tokens": 60}) as response:
        next(response.iter_raw())
    [request] = _wait_for(captured, semconv.SPAN_REQUEST, 1)
    assert "abort" == request.attributes[semconv.LLM_REQUEST_FINISH_REASON]
    assert trace.StatusCode.ERROR == request.status.status_code
    assert request.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] < 60


def test_generate_failing_in_the_stream_thread_ends_the_request_as_error(
        served: tuple[str, CapturedTelemetry]) -> None:
    """generate() raises in its thread: the request ends as error although the response itself completes."""
    import httpx

    url, captured = served
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", url + "/v1/stream", json={"prompt": "hello", "fail": True}) as response:
        response.read()
    [request] = _wait_for(captured, semconv.SPAN_REQUEST, 1)
    assert "error" == request.attributes[semconv.LLM_REQUEST_FINISH_REASON]
    assert "ValueError" == request.status.description


def test_explicit_request_in_a_handler_that_fails(served: tuple[str, CapturedTelemetry]) -> None:
    """start_request() in an async handler: child of SERVER; the handler's exception ends it as error."""
    import httpx

    url, captured = served
    with httpx.Client(timeout=30) as client:
        assert 200 == client.post(url + "/v1/explicit", json={"prompt": "x", "max_tokens": 4}).status_code
        assert 500 == client.post(url + "/v1/explicit", json={"prompt": "x", "fail": True}).status_code
    _wait_for(captured, semconv.SPAN_REQUEST, 2)
    (_, ok), (_, failed) = _requests_by_server(captured, "/v1/explicit", 2)
    assert "stop" == ok.attributes[semconv.LLM_REQUEST_FINISH_REASON]
    assert 4 == ok.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]
    assert "error" == failed.attributes[semconv.LLM_REQUEST_FINISH_REASON]
    assert "HTTPException" == failed.status.description


def test_serving_metrics_are_exported(served: tuple[str, CapturedTelemetry]) -> None:
    """TTFT, TPOT, request duration and token usage histograms reach the metric reader."""
    import httpx

    url, captured = served
    with httpx.Client(timeout=30) as client:
        _stream(client, url + "/v1/stream", {"prompt": "hello", "max_tokens": 4})
    _wait_for(captured, semconv.SPAN_REQUEST, 1)
    points = captured.metrics()
    for name in (semconv.METRIC_TTFT, semconv.METRIC_TPOT, semconv.METRIC_REQUEST_DURATION,
                 semconv.METRIC_TOKEN_USAGE):
        assert sum(point.count for point in points[name]) >= 1, name
    ttft = points[semconv.METRIC_TTFT][0]
    assert list(semconv.TTFT_BUCKETS) == list(ttft.explicit_bounds)
