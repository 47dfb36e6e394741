"""The compiled ``send`` of llmtrace's ASGI middlewares (native/src/asgi_send.rs) sends what the
Python one sends.

Both paths run the same scripted responses through ``ServerSpanMiddleware`` (llmtrace's SERVER
span) and ``ScopeMiddleware`` (llmtrace's scope inside someone else's), called over ASGI
directly: the server's ``send`` records what reaches it (a real socket adds nothing the
comparison needs; tests/pipeline/test_server_span.py runs both paths under real uvicorn).
Compared: every message the server gets, in order and by identity, what the app's ``send``
raised, and for the SERVER span its time to first byte and status. Scripts cover the usual
streamed response, empty chunks before the first bytes, ``more_body`` values that are not
booleans, messages that are dict subclasses or other mappings, and a ``more_body`` whose truth
raises mid-stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from types import MappingProxyType
from typing import Any

import pytest
from opentelemetry import trace

from llmtrace import semconv
from llmtrace.integrations import _asgi, _asgi_server
from llmtrace.integrations._asgi import ScopeMiddleware
from llmtrace.integrations._asgi_server import ServerSpanMiddleware
from llmtrace.integrations._server import ENABLED
from tests.helpers.waits import wait_for_spans

COMPILED = _asgi.COMPILED_SEND
pytestmark = pytest.mark.skipif(COMPILED is None, reason="the compiled send is not in use "
                                "(llmtrace-native not built, or LLMTRACE_ASGI_SEND=python)")

_SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
          "method": "GET", "scheme": "http", "path": "/stream", "raw_path": b"/stream", "query_string": b"",
          "root_path": "", "headers": [(b"host", b"test")], "client": ("127.0.0.1", 5), "server": ("test", 80)}


class _Dict(dict[str, Any]):
    """A message that is a dict, but not an exact one (the compiled path leaves it to Python)."""


class _Truthless:
    def __bool__(self) -> bool:
        raise ValueError("no truth value")


def _start(kind: Callable[..., Mapping[str, Any]] = dict) -> Mapping[str, Any]:
    return kind(type="http.response.start", status=200, headers=[(b"content-type", b"text/event-stream")])


def _body(body: bytes, more: Any = True, kind: Callable[..., Mapping[str, Any]] = dict) -> Mapping[str, Any]:
    return kind(type="http.response.body", body=body, more_body=more)


def _streamed(kind: Callable[..., Mapping[str, Any]] = dict) -> list[Mapping[str, Any]]:
    return [_start(kind), *(_body(f"data: {i}\n\n".encode(), kind=kind) for i in range(5)), _body(b"", False, kind)]


SCRIPTS: dict[str, Callable[[], list[Mapping[str, Any]]]] = {
    "streamed": _streamed,
    "empty chunks first": lambda: [_start(), _body(b""), _body(b""), _body(b"a"), _body(b"b"), _body(b"", False)],
    "more_body not a bool": lambda: [_start(), _body(b"a", 1), _body(b"b", "yes"), _body(b"c", 0), _body(b"d", [])],
    "not one body": lambda: [_start(), _body(b"all of it", False)],
    "dict subclasses": lambda: _streamed(_Dict),
    "read-only mappings": lambda: _streamed(lambda **fields: MappingProxyType(fields)),
    "truth that raises": lambda: [_start(), _body(b"a"), _body(b"b"), _body(b"c", _Truthless()), _body(b"", False)],
}


def _run(script: list[Mapping[str, Any]], middleware: Any = ServerSpanMiddleware) -> tuple[list[int], list[str]]:
    """The script through the middleware: the positions in it of the messages the server got (the
    start message by its type: a traced call's is a copy with the trace headers), and each
    ``send``'s outcome."""
    received: list[Mapping[str, Any]] = []
    outcomes: list[str] = []

    async def server_send(message: Mapping[str, Any]) -> None:
        received.append(message)

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        for message in script:
            try:
                await send(message)
                outcomes.append("sent")
            except ValueError as exc:
                outcomes.append(f"ValueError: {exc}")

    asyncio.run(middleware(app, "fastapi")(dict(_SCOPE), receive, server_send))
    positions = [next(i for i, m in enumerate(script) if m is message or (
        m.get("type") == "http.response.start" == message.get("type"))) for message in received]
    return positions, outcomes


@pytest.fixture
def fastapi_enabled(capture_spans: Any) -> Iterator[Any]:
    with capture_spans() as captured:
        ENABLED.add("fastapi")  # as instrument() does where FastAPI is importable
        yield captured


@pytest.mark.parametrize("name", list(SCRIPTS))
@pytest.mark.parametrize("middleware", [ServerSpanMiddleware, ScopeMiddleware])
def test_compiled_send_sends_what_the_python_send_sends(name: str, middleware: Any, fastapi_enabled: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The same script, compiled ``send`` then Python ``send``: the same messages reach the server,
    the app sees the same outcomes, and the SERVER spans agree."""
    compiled = _run(SCRIPTS[name](), middleware)
    monkeypatch.setattr(_asgi, "COMPILED_SEND", None)
    python = _run(SCRIPTS[name](), middleware)
    assert python == compiled
    positions, outcomes = compiled
    failed = [i for i, outcome in enumerate(outcomes) if outcome != "sent"]
    assert positions == [i for i in range(len(SCRIPTS[name]())) if i not in failed]  # all but what raised
    if middleware is ScopeMiddleware:
        return
    spans = wait_for_spans(fastapi_enabled, lambda s: s.kind == trace.SpanKind.SERVER, 2)
    first_bytes = [semconv.LLM_TIME_TO_FIRST_BYTE_S in s.attributes for s in spans]
    assert first_bytes[0] == first_bytes[1], first_bytes  # timed alike (only streamed responses are)
    assert [200, 200] == [s.attributes[semconv.HTTP_RESPONSE_STATUS_CODE] for s in spans]


def test_the_truth_that_raises_reaches_the_app_on_both_paths(fastapi_enabled: Any) -> None:
    """The error a message's own ``more_body`` raises is the app's, as without llmtrace."""
    _, outcomes = _run(SCRIPTS["truth that raises"]())
    assert ["sent", "sent", "sent", "ValueError: no truth value", "sent"] == outcomes


@pytest.mark.parametrize(("middleware", "call"), [(ServerSpanMiddleware, _asgi_server._Call),
                                                   (ScopeMiddleware, _asgi.ObservedCall)])
def test_compiled_send_goes_straight_to_the_server_mid_stream(middleware: Any, call: Any, fastapi_enabled: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of it: after the first bytes, a chunk with more to follow never reaches the
    Python observer; everything else does."""
    observed: list[Any] = []
    original = call.send

    def observe(self: Any, message: Any) -> Any:
        observed.append(message.get("body"))
        return original(self, message)

    monkeypatch.setattr(call, "send", observe)
    _run(_streamed(), middleware)
    assert [None, b"data: 0\n\n", b""] == observed


def test_a_cycle_through_the_compiled_send_is_collected() -> None:
    """An app that keeps its ``send`` where the observer's call reaches it (the ASGI scope)
    makes a reference cycle through the compiled function; the cycle collector must see
    through it, or every such HTTP call would leak its call, scope and span."""
    import gc
    import weakref

    class Call:
        def __init__(self) -> None:
            self.scope: dict[str, Any] = {}

        def send(self, message: Any) -> None:
            return None

    async def server_send(message: Any) -> None:
        return None

    assert COMPILED is not None
    call = Call()
    call.scope["send"] = COMPILED(server_send, call.send)  # call -> scope -> send -> call.send -> call
    alive = weakref.ref(call)
    del call
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize(("value", "compiled", "warns"), [("", True, False), ("native", True, False),
                                                          ("python", False, False), ("rust", True, True)])
def test_the_send_is_chosen_by_the_environment(value: str, compiled: bool, warns: bool,
                                               monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """``LLMTRACE_ASGI_SEND``: python keeps the Python ``send``; native or unset the compiled one;
    anything else warns, naming the variable, and keeps the default."""
    monkeypatch.setenv("LLMTRACE_ASGI_SEND", value)
    with caplog.at_level("WARNING", logger="llmtrace._native"):
        chosen = _asgi._compiled_send()
    assert (chosen is not None) == compiled
    assert warns == any("LLMTRACE_ASGI_SEND='rust'" in r.getMessage() for r in caplog.records)


def test_the_compiled_send_takes_what_the_python_send_takes() -> None:
    """``send(message=...)`` reaches the observer as the Python ``send`` would take it; a wrong
    call gets Python's own ``TypeError`` for it, naming the observer's parameters."""
    seen: list[Any] = []

    def observe(message: Any) -> str:
        seen.append(message)
        return "observed"

    make: Any = COMPILED  # called here as no ASGI app would
    send = make(lambda message: "downstream", observe)
    message = {"type": "http.response.start", "status": 200}
    assert "observed" == send(message=message)
    assert [message] == seen
    with pytest.raises(TypeError, match="observe"):
        send(message, message)
    with pytest.raises(TypeError, match="observe"):
        send()


@pytest.mark.parametrize("middleware", [ServerSpanMiddleware, ScopeMiddleware])
def test_a_send_that_cannot_be_made_leaves_the_python_one(middleware: Any, fastapi_enabled: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Making the compiled ``send`` fails (out of memory, a broken build): the error is counted
    and the call is served with the Python ``send``, every message delivered."""
    from llmtrace import _safety

    def broken(server_send: Any, observe: Any) -> Any:
        raise RuntimeError("no send today")

    monkeypatch.setattr(_asgi, "COMPILED_SEND", broken)
    before = _safety.error_counts().get("asgi.send", 0)
    positions, outcomes = _run(_streamed(), middleware)
    assert list(range(len(_streamed()))) == positions
    assert all(outcome == "sent" for outcome in outcomes)
    assert before + 1 == _safety.error_counts().get("asgi.send", 0)
