"""Mutated real traces for the readers' fuzz test (tests/analysis/test_fuzz_readers.py) and
benchmark (benchmarks/fuzz_readers.py): seeded, deterministic, one case per (seed, index).

The bases are real: OTLP/JSON lines written by the reference server, a Jaeger ``/api/v3``
response, and the same spans in Jaeger's legacy ``/api/traces`` model, cut down to a few
spans each so that a case is cheap. A case applies one to three structural mutations to the
JSON tree — a key dropped, a value of another JSON type, a huge number, a bad id, a strange
string, a structure nested thousands deep — then possibly damages the bytes (truncation,
invalid UTF-8, flipped bytes) and possibly gzips them (and may cut the gzip stream short).

:func:`outcome` reads a case the way ``llmtrace analyze`` does and classifies it: ``ok``,
``warning``, or ``error`` (an ``LLMTraceError`` with a one-line message). Anything else —
another exception, a message over several lines — escapes and fails the caller.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from llmtrace.errors import LLMTraceError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "analysis"
_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "traceID", "spanID", "parentSpanID"})
_KEEP = 6  # spans per scope (and resources, scopes) kept from the real trace: enough shape, cheap cases

_OTHER_TYPES: list[Any] = [None, True, False, 0, -1, 1.5, "", "x", "NaN", [], {}, [[]], [{}], {"": None}]
_HUGE: list[Any] = [10**40, -(10**40), 2**64, 2**63, -(2**63) - 1, 1e308, -1e308, "9" * 40, "-" + "9" * 30,
                    "1" * 5000, 0.1e-320]
_BAD_IDS: list[Any] = ["", "zz", "0" * 32, "g" * 32, "A" * 31, "a" * 33, "AAAAAAAAAAAAAAAAAAAAAA==", "////", 12345,
                       None, ["00"], "\u00e9" * 16, "0x" + "1" * 30]
_STRINGS: list[Any] = ["\ud800", "\x00", "<script>alert(1)</script>", "\u202e\u00e9" * 500, "x" * 100_000, "\n\r\t",
                       "{{DATA}}", "%s%n"]


@dataclass(frozen=True)
class Case:
    name: str  # base/mutations, for the failure message
    data: bytes


# ----------------------------------------------------------------------------- bases
def _trim_otlp(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["resourceSpans"] = doc["resourceSpans"][:2]
    for rs in doc["resourceSpans"]:
        rs["scopeSpans"] = rs["scopeSpans"][:2]
        for ss in rs["scopeSpans"]:
            ss["spans"] = ss["spans"][:_KEEP]
    return doc


def _as_legacy(doc: dict[str, Any]) -> dict[str, Any]:
    """The spans of an OTLP document in Jaeger's legacy JSON model (what ``/api/traces`` returns)."""
    traces: dict[str, dict[str, Any]] = {}
    for p, rs in enumerate(doc["resourceSpans"]):
        tags = [{"key": a["key"], "type": "string", "value": str(next(iter(a["value"].values()), ""))}
                for a in rs["resource"]["attributes"]]
        service = next((t["value"] for t in tags if t["key"] == "service.name"), "svc")
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                trace = traces.setdefault(sp["traceId"], {"traceID": sp["traceId"], "spans": [], "processes": {}})
                trace["processes"][f"p{p}"] = {"serviceName": service, "tags": tags}
                start = int(sp["startTimeUnixNano"]) // 1000
                refs = [{"refType": "CHILD_OF", "traceID": sp["traceId"], "spanID": sp["parentSpanId"]}
                        ] if sp.get("parentSpanId") else []
                trace["spans"].append({
                    "traceID": sp["traceId"], "spanID": sp["spanId"], "operationName": sp["name"],
                    "references": refs, "startTime": start,
                    "duration": int(sp["endTimeUnixNano"]) // 1000 - start, "processID": f"p{p}",
                    "tags": [{"key": a["key"], "type": "string", "value": str(next(iter(a["value"].values()), ""))}
                             for a in sp.get("attributes", [])]})
    return {"data": list(traces.values())}


@cache
def bases() -> tuple[tuple[str, Any], ...]:
    """(format, JSON tree): ``lines`` is a list of OTLP documents written one per line."""
    lines = [json.loads(line) for line in gzip.decompress((FIXTURES / "reference_server.jsonl.gz").read_bytes())
             .decode().splitlines()]
    otlp = [_trim_otlp(d) for d in lines if "resourceSpans" in d][:3]
    v3 = json.loads(gzip.decompress((FIXTURES / "jaeger_v3_response.json.gz").read_bytes()))
    v3_trimmed = {"result": _trim_otlp(v3["result"])}
    return (("lines", otlp), ("otlp", otlp[0]), ("jaeger_v3", v3_trimmed), ("jaeger_legacy", _as_legacy(otlp[1])))


# ----------------------------------------------------------------------------- tree mutations
def _slots(tree: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, Any, tuple[Any, ...]]]:
    """Every (container, key) in the tree, with its path."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, value in items:
        yield tree, key, (*path, key)
        yield from _slots(value, (*path, key))


def _nested(rng: random.Random) -> str:
    """JSON text nested *depth* deep (built as text: json.dumps itself would recurse)."""
    depth = rng.choice([64, 300, 340, 600, 1100, 5000, 20_000])
    kind = rng.randrange(3)
    if kind == 0:
        return "[" * depth + "]" * depth
    if kind == 1:
        return '{"a":' * depth + "1" + "}" * depth
    return '{"arrayValue":{"values":[' * depth + '{"intValue":"1"}' + "]}}" * depth


class _Tree:
    """One case's JSON tree and the raw-text splices (deep nesting) to make when it is written."""

    def __init__(self, tree: Any) -> None:
        self.tree = tree
        self.splices: dict[str, str] = {}

    def mutate(self, rng: random.Random) -> str:
        slots = list(_slots(self.tree))
        if not slots:
            return "nothing"
        op = rng.choice(["drop", "type", "huge", "id", "string", "nest", "dup"])
        if op == "id":
            slots = [s for s in slots if s[1] in _ID_KEYS] or slots
        container, key, _ = rng.choice(slots)
        if op == "drop":
            del container[key]
        elif op == "dup" and isinstance(container[key], list) and container[key]:
            container[key] = container[key] * rng.choice([2, 50])
        else:
            container[key] = self._value(op, rng)
        return f"{op}@{key}"

    def _value(self, op: str, rng: random.Random) -> Any:
        if op == "nest":
            marker = f"__nest_{len(self.splices)}__"
            self.splices[f'"{marker}"'] = _nested(rng)
            return marker
        pool = {"type": _OTHER_TYPES, "huge": _HUGE, "id": _BAD_IDS, "string": _STRINGS}.get(op, _OTHER_TYPES)
        return copy.deepcopy(rng.choice(pool))

    def text(self, lines: bool) -> str:
        docs = self.tree if lines and isinstance(self.tree, list) else [self.tree]
        text = "\n".join(json.dumps(d) for d in docs) if lines else json.dumps(self.tree)
        for marker, raw in self.splices.items():
            text = text.replace(marker, raw)
        return text


# ----------------------------------------------------------------------------- byte damage
def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[:rng.randrange(len(data) + 1)]


def _bad_utf8(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x00"]) + data[at:]


def _flip(data: bytes, rng: random.Random) -> bytes:
    raw = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if raw:
            raw[rng.randrange(len(raw))] = rng.randrange(256)
    return bytes(raw)


_BYTE_DAMAGE: list[Callable[[bytes, random.Random], bytes]] = [_truncate, _bad_utf8, _flip]


def case(seed: int) -> Case:
    """The case for *seed* (the same bytes on every run and machine)."""
    rng = random.Random(seed)
    fmt, base = rng.choice(bases())
    tree = _Tree(copy.deepcopy(base))
    steps = [tree.mutate(rng) for _ in range(rng.randint(1, 3))]
    data = tree.text(lines=fmt == "lines").encode("utf-8", "surrogatepass")
    if rng.random() < 0.3:
        damage = rng.choice(_BYTE_DAMAGE)
        data = damage(data, rng)
        steps.append(damage.__name__.strip("_"))
    if rng.random() < 0.15:
        data = gzip.compress(data, mtime=0)
        steps.append("gzip")
        if rng.random() < 0.5:
            data = _truncate(data, rng)
            steps.append("truncate")
    return Case(f"seed {seed}: {fmt} " + " ".join(steps), data)


# ----------------------------------------------------------------------------- reading
def outcome(read: Callable[[], Any]) -> str:
    """``ok``, ``warning`` (the read returned warnings) or ``error`` (a one-line LLMTraceError);
    any other exception propagates."""
    try:
        loaded = read()
    except LLMTraceError as exc:
        message = str(exc)
        if not message or "\n" in message:
            raise AssertionError(f"the error is not one line: {message!r}") from exc
        return "error"
    return "warning" if getattr(loaded, "warnings", None) else "ok"


# ----------------------------------------------------------------------------- the Jaeger API
def jaeger_transport(the_case: Case) -> Any:
    """A Jaeger query service (``httpx.MockTransport``: the seam where the real one cannot be
    made to send damaged bytes) whose trace search answers with the case's bytes. Legacy-model
    cases are served by a legacy-only Jaeger (``/api/v3`` answers 404); some cases damage the
    services list too."""
    import httpx

    legacy = " jaeger_legacy " in the_case.name
    rng = random.Random(the_case.name)
    services = _Tree({"services": ["svc", "jaeger-all-in-one"]} if not legacy else {"data": ["svc"]})
    if rng.random() < 0.3:
        services.mutate(rng)
    services_body = services.text(lines=False).encode("utf-8", "surrogatepass")

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.startswith("/api/v3/") and legacy:
            return httpx.Response(404, text="not found")
        if path in ("/api/v3/services", "/api/services"):
            return httpx.Response(200, content=services_body)
        return httpx.Response(200, content=the_case.data)

    return httpx.MockTransport(handle)


# ----------------------------------------------------------------------------- carriers
_CARRIER = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "congo=t61rcWkgMzE"}
_NOT_MAPPINGS: list[Any] = [["traceparent", _CARRIER["traceparent"]], 17, 1.5, b"00-0af7", {"traceparent"},
                            object(), ("a", "b"), True]


def carrier_case(seed: int) -> tuple[str, Callable[[], None]]:
    """A damaged W3C carrier, and the check that reading it neither raises nor breaks the request
    that carries it: ``extract`` gives a context, ``RequestTracker.add`` a request."""
    from opentelemetry.context import Context

    from llmtrace.lifecycle.propagation import extract
    from llmtrace.lifecycle.tracker import RequestTracker

    rng = random.Random(seed)
    carrier: Any
    if rng.random() < 0.15:
        carrier = rng.choice(_NOT_MAPPINGS)
        name = f"carrier seed {seed}: {type(carrier).__name__}"
    else:
        tree = _Tree(copy.deepcopy(_CARRIER))
        steps = [tree.mutate(rng) for _ in range(rng.randint(1, 3))]
        carrier = tree.tree
        if rng.random() < 0.4 and isinstance(carrier.get("traceparent"), str):
            carrier["traceparent"] = _truncate(carrier["traceparent"].encode("utf-8", "surrogatepass"),
                                               rng).decode("utf-8", "replace")
            steps.append("truncate")
        if rng.random() < 0.2:
            carrier = carrier.get("traceparent")  # engines that carry the bare header value
            steps.append("bare")
        name = f"carrier seed {seed}: " + " ".join(steps)

    def check() -> None:
        if not isinstance(extract(carrier), Context):
            raise AssertionError("extract did not return a Context")
        tracker = RequestTracker()
        tracker.add(f"fuzz-{seed}", carrier=carrier)
        tracker.aborted(f"fuzz-{seed}")

    return name, check
