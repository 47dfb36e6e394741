"""The compiled OTLP/JSON encoder (native/src/otlp_json.rs) writes the Python encoder's text
byte for byte, or raises the error the Python encoder raises.

Both run on the same spans: SDK spans (bounded attributes, events, links), llmtrace's own
finished spans (plain dicts and tuples), seeded random attribute values of every kind the
Python encoder distinguishes, and hostile spans whose fields it declines (its contract:
what it does not write itself goes back to the Python code).
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from llmtrace import EngineTracer
from llmtrace._otel import otlp_json
from llmtrace._otel.otlp_json import COMPILED, encode_spans_python
from tests.core.conftest import InstallRuntime
from tests.core.test_otlp_json import _spans as sdk_spans

pytestmark = pytest.mark.skipif(COMPILED is None, reason="the compiled OTLP/JSON encoder is not in use "
                                "(llmtrace-native not built, or LLMTRACE_OTLP_ENCODER=python)")

_RESOURCE = Resource.create({"service.name": "api"})
_SCOPE = InstrumentationScope("llmtrace", "1.0")
_CONTEXT = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0x00F067AA0BA902B7, is_remote=False,
                       trace_flags=TraceFlags(1))


def _same(spans: list[Any]) -> str:
    """Both encoders' results: equal texts, or the same exception type and message."""
    try:
        expected: str | BaseException = encode_spans_python(spans)
    except Exception as exc:  # noqa: BLE001 - compared with what the compiled one raises
        expected = exc
    try:
        got: str | BaseException = COMPILED.encode(spans)
    except Exception as exc:  # noqa: BLE001 - as above
        got = exc
    if isinstance(expected, BaseException):
        assert isinstance(got, BaseException), f"Python raised {expected!r}, compiled wrote {got!r}"
        assert (type(expected), str(expected)) == (type(got), str(got))
        return ""
    assert expected == got
    return expected


def _span(name: Any = "llm.request", attributes: Any = None, **fields: Any) -> ReadableSpan:
    arguments: dict[str, Any] = {
        "name": name, "context": _CONTEXT, "parent": None, "resource": _RESOURCE,
        "attributes": attributes if attributes is not None else {}, "events": (), "links": (),
        "kind": SpanKind.INTERNAL, "status": Status(StatusCode.UNSET), "start_time": 1_700_000_000_000_000_000,
        "end_time": 1_700_000_000_500_000_000, "instrumentation_scope": _SCOPE,
    }
    arguments.update(fields)
    return ReadableSpan(**arguments)


class _Color(enum.IntEnum):
    RED = 3


class _Shouting(str):
    def __str__(self) -> str:
        return self.upper()


#: Strings that exercise every escape: quotes, backslashes, control characters, DEL, Latin-1,
#: the BMP, astral code points (surrogate pairs) and a lone surrogate.
_STRINGS = ["", "plain", 'q"uote', "back\\slash", "nl\n cr\r tab\t bs\b ff\f", "\x00\x01\x1f", "del\x7f",
            "é", "日本語", "emoji 😀", "lone \ud800 surrogate", "\u2028\u2029"]
_FLOATS = [0.0, -0.0, 0.1, 1.5, -2.5, 1e16, 1e15, 123456789012345678.0, 1e-4, 1e-5, 5e-324, 1.7976931348623157e308,
           2.0**-1074, 1 / 3, math.nan, math.inf, -math.inf, 1e22, 9.999999999999999e22]
_INTS = [0, 1, -1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64, 2**200, -(2**200)]


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    """One attribute value: every type the Python encoder tells apart, nested up to depth 2."""
    scalars: list[Callable[[], Any]] = [
        lambda: rng.choice(_STRINGS) + str(rng.randrange(100)),
        lambda: rng.choice(_INTS) + rng.randrange(-2, 3),
        lambda: rng.choice(_FLOATS) if rng.random() < 0.5 else rng.uniform(-1e6, 1e6) * 10.0 ** rng.randrange(-30, 30),
        lambda: rng.random() < 0.5,
        lambda: None,
        lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(5))),
        lambda: _Color.RED,
        lambda: _Shouting(rng.choice(_STRINGS)),
        lambda: [rng.choice(_STRINGS) for _ in range(rng.randrange(4))],
        lambda: tuple(_Shouting(s) for s in rng.sample(_STRINGS, 2)),
        lambda: range(rng.randrange(3)),  # a Sequence that is neither list nor tuple
    ]
    nested: list[Callable[[], Any]] = [
        lambda: [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))],
        lambda: tuple(_random_value(rng, depth + 1) for _ in range(rng.randrange(4))),
        lambda: {rng.choice(_STRINGS): _random_value(rng, depth + 1) for _ in range(rng.randrange(3))},
    ]
    return rng.choice(scalars + nested if depth < 2 else scalars)()


def test_sdk_spans_match() -> None:
    assert '"resourceSpans"' in _same(sdk_spans())


def test_llmtrace_engine_spans_match(runtime_with: InstallRuntime) -> None:
    """The spans an engine window emits (a step's links and request ids), built by llmtrace's
    span builder under a test-local runtime."""
    captured = runtime_with(engine_window_steps=8, engine_window_s=3600)
    engine = EngineTracer("enc")
    ids = [f"r{i}" for i in range(8)]
    for rid in ids:
        engine.tracker.add(rid)
    for _ in range(8):
        step = engine.begin_step()
        step.mark("schedule")
        step.batch(ids, decode_tokens=len(ids))
        step.mark("forward")
        step.tokens()
        engine.end_step(step)
    engine.flush_window()
    spans = captured.spans()
    assert len(spans) >= 17
    assert '"links"' in _same(spans)


@pytest.mark.parametrize("seed", range(25))
def test_random_attribute_values_match(seed: int) -> None:
    rng = random.Random(seed)
    spans = []
    for index in range(20):
        attributes = {f"k{index}.{n}": _random_value(rng) for n in range(rng.randrange(12))}
        events = tuple(Event(rng.choice(_STRINGS), {"v": _random_value(rng)}, timestamp=index) for _ in range(
            rng.randrange(3)))
        link = Link(SpanContext(rng.getrandbits(128), rng.getrandbits(64), is_remote=True), {"n": index})
        parent = SpanContext(_CONTEXT.trace_id, rng.getrandbits(64), is_remote=False) if index % 2 else None
        status = Status(rng.choice(list(StatusCode)), rng.choice(_STRINGS) if rng.random() < 0.3 else None)
        spans.append(_span(rng.choice(_STRINGS), attributes, events=events, links=(link,) * rng.randrange(3),
                           parent=parent, kind=rng.choice(list(SpanKind)), status=status))
    _same(spans)


def test_resources_and_scopes_group_in_first_seen_order() -> None:
    other = Resource.create({"service.name": "engine"})
    scopes = [_SCOPE, InstrumentationScope("other"), None, InstrumentationScope("", None),
              InstrumentationScope("llmtrace", "1.0")]  # the last equals the first: one group
    spans = [_span(f"s{i}", resource=(_RESOURCE, other)[i % 2], instrumentation_scope=scopes[i % len(scopes)])
             for i in range(20)]
    text = _same(spans)
    assert 2 == text.count('"resource":')


class _Grows:
    """A value whose ``str()`` adds a key to the attributes it sits in (the Python code a value is
    handed to may let another thread change the dict)."""

    def __init__(self, attributes: dict[str, Any]) -> None:
        self.attributes = attributes

    def __str__(self) -> str:
        self.attributes[f"added{len(self.attributes)}"] = 1
        return "grown"


def _growing_span() -> ReadableSpan:
    attributes: dict[str, Any] = {"a": 1}
    attributes["b"] = _Grows(attributes)
    attributes["c"] = "after"
    return _span(attributes=attributes)


class _Duck:
    """A span object that is not the SDK's ReadableSpan: read through its public properties."""

    def __init__(self, span: ReadableSpan) -> None:
        self._span = span

    def __getattr__(self, name: str) -> Any:
        return getattr(self._span, name)


class _Sub(ReadableSpan):
    """A ReadableSpan subclass (the compiled encoder reads only the exact type in place)."""


def _hostile() -> list[tuple[str, Callable[[], list[Any]]]]:
    return [
        ("duck-typed span", lambda: [_Duck(_span())]),
        ("subclass", lambda: [_Sub(name="sub", context=_CONTEXT, resource=_RESOURCE)]),
        ("no context", lambda: [_span(context=None)]),
        ("no times", lambda: [_span(start_time=None, end_time=None)]),
        ("float time", lambda: [_span(start_time=1.5)]),
        ("bool time", lambda: [_span(end_time=True)]),
        ("huge time", lambda: [_span(end_time=2**70)]),
        ("name not a str", lambda: [_span(name=42)]),
        ("name a str subclass", lambda: [_span(name=_Shouting("mixed Case"))]),
        ("unknown kind", lambda: [_span(kind="server")]),
        ("status with a message", lambda: [_span(status=Status(StatusCode.ERROR, 'boom "x"'))]),
        ("status not a Status", lambda: [_span(status=None)]),
        ("trace id beyond 128 bits", lambda: [_span(context=SpanContext(2**130, 1, is_remote=False))]),
        ("negative span id", lambda: [_span(context=SpanContext(1, -5, is_remote=False))]),
        ("span id beyond 64 bits", lambda: [_span(parent=SpanContext(1, 2**64 + 1, is_remote=False))]),
        ("key not a str", lambda: [_span(attributes={1: "x"})]),
        ("attributes not a mapping", lambda: [_span(attributes=[("k", "v")])]),
        ("attributes None", lambda: [_span(attributes=None, events=(), links=())]),
        ("event without a time", lambda: [_span(events=(Event("e", {}, timestamp=None),))]),
        ("event name not a str", lambda: [_span(events=(Event(7, {}, timestamp=5),))]),  # type: ignore[arg-type]
        ("events None", lambda: [_span(events=None)]),
        ("link with a bad context", lambda: [_span(links=(Link(None),))]),  # type: ignore[arg-type]
        ("not a span", lambda: [object()]),
        ("attributes changed while written", lambda: [_growing_span()]),
        ("empty batch", lambda: []),
    ]


@pytest.mark.parametrize(("case", "make"), _hostile(), ids=[case for case, _ in _hostile()])
def test_hostile_spans_are_written_alike_or_raise_alike(case: str, make: Callable[[], list[Any]]) -> None:
    spans = make()
    _same(spans)
    _same([*spans, _span("after")])  # a declined span does not disturb the ones around it


def test_a_link_object_is_written_once_and_reused() -> None:
    """Both encoders keep a link's text by the link object, in one cache, with the same text."""
    link = Link(SpanContext(7, 8, is_remote=True), {"llm.request.id": "r1"})
    otlp_json._link_text.clear()
    compiled = COMPILED.encode([_span("step", links=(link,))])
    cached_link, text = otlp_json._link_text[id(link)]
    assert cached_link is link and '"links":[' + text + "]}" in compiled
    otlp_json._link_text.clear()
    assert compiled == encode_spans_python([_span("step", links=(link,))])
    assert (link, text) == otlp_json._link_text[id(link)]
    assert compiled == COMPILED.encode([_span("step", links=(link,))])  # from the cache


def test_the_link_cache_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    otlp_json._link_text.clear()
    links = [Link(SpanContext(1, index + 1, is_remote=True)) for index in range(otlp_json._MAX_CACHED_LINKS + 5)]
    COMPILED.encode([_span("step", links=tuple(links))])
    assert len(otlp_json._link_text) <= otlp_json._MAX_CACHED_LINKS
    assert len(otlp_json._link_text) >= 5
