"""The compiled decoder (native/, ``_kernels.NativeKernels.decode_line``) against the
generic Python reader.

It must give the very same spans, warnings and errors as the generic dict path, and
decline (return ``None``) every line it cannot convert exactly; declined lines go to the
generic path. The module is built by ``.ci/run`` when a Rust toolchain is present; without
one these tests are skipped and say so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from llmtrace.analysis._kernels import KERNELS, NativeKernels
from llmtrace.analysis.errors import SourceError
from llmtrace.analysis.sources import load_spans
from llmtrace.analysis.sources.otlp import Interner, spans_from_otlp
from llmtrace.analysis.synthetic import SimConfig, write_jsonl
from tests.analysis.test_line_reading import FIXTURES, both, edge_lines, errors_by_decoder, same
from tests.analysis.test_sources import TID, doc, otlp_span, write_lines

pytestmark = pytest.mark.skipif(
    not isinstance(KERNELS, NativeKernels), reason="llmtrace-native not built (needs cargo: pip install ./native)"
)


def _native(line: bytes, intern: Interner) -> list[Any] | None:
    return KERNELS.decode_line(line, intern.strings, None)


def _generic(line: bytes) -> list[Any]:
    return spans_from_otlp(json.loads(line), source="t", position="line 1", intern=Interner())


def _attrs(**values: Any) -> list[dict[str, Any]]:
    return [{"key": k, "value": v} for k, v in values.items()]


# Lines the native decoder must convert, each exactly as the generic path does.
TAKEN = {
    "kind and status names": doc(otlp_span(kind="SPAN_KIND_CLIENT", status={"code": "STATUS_CODE_ERROR"})),
    "unknown status code": doc(otlp_span(status={"code": 7, "message": "x"})),
    "unknown status name": doc(otlp_span(status={"code": "WHATEVER"})),
    "integer times": doc(otlp_span(startTimeUnixNano=1700000000000000000, endTimeUnixNano=1700000000000000001)),
    "signed time strings": doc(otlp_span(startTimeUnixNano="+1700000000000000000")),
    "empty parent": doc(otlp_span(parentSpanId="")),
    "null parent, attributes, links": doc(otlp_span(parentSpanId=None, attributes=None, links=None, status=None)),
    "scalar attributes": doc(
        otlp_span(
            attributes=_attrs(
                s={"stringValue": "v"},
                i={"intValue": "-42"},
                j={"intValue": 9007199254740993},
                d={"doubleValue": 0.1},
                dint={"doubleValue": 3},
                big={"doubleValue": 1e308},
                t={"boolValue": True},
                f={"boolValue": False},
                empty={},
                unknown={"fooValue": 1},
                long={"stringValue": "é" * 63},
                longer={"stringValue": "x" * 64},
            )
        )
    ),
    "duplicate attribute keys": doc(otlp_span(attributes=_attrs(a={"intValue": 1}) + _attrs(a={"stringValue": "2"}))),
    "arrays": doc(
        otlp_span(
            attributes=_attrs(
                a={"arrayValue": {"values": [{"stringValue": "x"}, {"intValue": "1"}, {"doubleValue": 2.5}]}},
                b={"arrayValue": {"values": [{"boolValue": True}, {}]}},
                c={"arrayValue": {}},
            )
        )
    ),
    "escapes and non-ASCII": doc(
        otlp_span(name='say "hi"\n\u00e9\U0001f600', attributes=_attrs(k={"stringValue": "\\"}))
    ),
    "links": doc(otlp_span(links=[{"traceId": TID, "spanId": "1111111111111111", "attributes": []}] * 3)),
    "unknown fields": {
        "resourceSpans": [{"x": 1, "scopeSpans": [{"scope": {"n": 1}, "spans": [otlp_span(extra=[1])]}]}]
    },
    "no resourceSpans content": {"resourceSpans": None},
    "empty scopeSpans, library spans": {
        "resourceSpans": [{"scopeSpans": [], "instrumentationLibrarySpans": [{"spans": [otlp_span()]}]}]
    },
    "resource without service": {
        "resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [otlp_span()]}]}]
    },
    "service": doc(otlp_span(), service="engine-7"),
}

# Lines it must decline (the Python paths convert, warn about or reject them).
DECLINED = {
    "base64 trace id": doc(otlp_span(traceId="AAECAwQFBgcICQoLDA0ODw==")),
    "short span id": doc(otlp_span(spanId="abc")),
    "short parent id": doc(otlp_span(parentSpanId="abc")),
    "unknown kind": doc(otlp_span(kind=9)),
    "unknown kind name": doc(otlp_span(kind="SERVER")),
    "ends before it starts": doc(otlp_span(endTimeUnixNano="1")),
    "time with spaces": doc(otlp_span(startTimeUnixNano=" 1700000000000000000")),
    "time beyond int64": doc(otlp_span(endTimeUnixNano="99999999999999999999")),
    "string double": doc(otlp_span(attributes=_attrs(d={"doubleValue": "NaN"}))),
    "kvlist": doc(otlp_span(attributes=_attrs(k={"kvlistValue": {"values": []}}))),
    "bytes": doc(otlp_span(attributes=_attrs(b={"bytesValue": "AAE="}))),
    "nested array": doc(otlp_span(attributes=_attrs(a={"arrayValue": {"values": [{"arrayValue": {}}]}}))),
    "several keys in one value": doc(otlp_span(attributes=_attrs(a={"intValue": "3", "stringValue": "s"}))),
    "null string value": doc(otlp_span(attributes=_attrs(s={"stringValue": None}))),
    "numeric service name": {
        "resourceSpans": [
            {
                "resource": {"attributes": _attrs(**{"service.name": {"intValue": "5"}})},
                "scopeSpans": [{"spans": [otlp_span()]}],
            }
        ]
    },
    "missing name": doc({k: v for k, v in otlp_span().items() if k != "name"}),
    "array for resourceSpans[0]": {"resourceSpans": [[]]},
    "array for a scope": {"resourceSpans": [{"scopeSpans": [[]]}]},
    "array for a span": doc([]),  # type: ignore[arg-type]
    "array for a value": doc(otlp_span(attributes=[{"key": "k", "value": []}])),
    "array for a status": doc(otlp_span(status=[1])),
    "metrics document": {"resourceMetrics": []},
    "not an object": [1, 2],
}


@pytest.mark.parametrize("case", list(TAKEN))
def test_takes_plain_otlp_and_converts_it_exactly(case: str) -> None:
    line = json.dumps(TAKEN[case]).encode()
    native = _native(line, Interner())
    assert native is not None, f"declined: {case}"
    generic = _generic(line)
    assert repr(native) == repr(generic)
    for x, y in zip(native, generic, strict=True):
        assert (type(x), type(x.kind), type(x.status)) == (type(y), type(y.kind), type(y.status))
        assert [(k, type(v)) for k, v in x.attributes.items()] == [(k, type(v)) for k, v in y.attributes.items()]
        assert [type(ln) for ln in x.links] == [type(ln) for ln in y.links]


@pytest.mark.parametrize("case", list(DECLINED))
def test_declines_what_only_the_python_paths_convert_exactly(case: str) -> None:
    assert _native(json.dumps(DECLINED[case]).encode(), Interner()) is None


@pytest.mark.parametrize(
    "line",
    [b"", b"\n", b"{not json", b'{"resourceSpans": [', b"\xff\xfe{}", b'{"resourceSpans": [], "resourceSpans": []}'],
)
def test_declines_malformed_lines(line: bytes) -> None:
    assert _native(line, Interner()) is None


def test_interns_what_the_python_paths_intern() -> None:
    intern = Interner()
    line = json.dumps(doc(otlp_span(attributes=_attrs(k={"stringValue": "short"})))).encode()
    a = _native(line, intern)
    b = _native(line, intern)
    assert a is not None and b is not None
    assert a[0].trace_id is b[0].trace_id and a[0].name is b[0].name
    assert a[0].attributes["k"] is b[0].attributes["k"]
    assert a[0].trace_id in intern.strings and "k" in intern.strings


def test_edge_file_reads_as_the_generic_path_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    declined = list(DECLINED.values())
    lines = edge_lines() + list(TAKEN.values()) + [d for d in declined if "resourceSpans" in d]
    path = write_lines(tmp_path / "edge.jsonl", [d for d in lines if _generic_ok(d)])
    native, generic = both(path, monkeypatch, fast="native")
    same(native, generic)
    assert len(native.spans) > 30


def _generic_ok(d: Any) -> bool:
    try:
        _generic(json.dumps(d).encode())
    except (SourceError, AttributeError, TypeError, ValueError):
        return False
    return True


@pytest.mark.parametrize("name", ["sim_small.jsonl.gz", "reference_server.jsonl.gz", "jaeger_v3_response.json.gz"])
def test_fixtures_read_thesame(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    native, generic = both(str(FIXTURES / name), monkeypatch, fast="native")
    same(native, generic)


def test_simulated_server_output_is_taken_whole_and_matches_the_generic_path(tmp_path: Path) -> None:
    path = tmp_path / "sim.jsonl"
    write_jsonl(str(path), SimConfig(duration_s=3, arrival_rate=20, seed=5))
    intern = Interner()
    for line in path.read_bytes().splitlines(keepends=True):
        native = _native(line, intern)
        assert native is not None
        assert repr(native) == repr(_generic(line))


def test_errors_are_the_generic_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(doc(otlp_span())) + "\n" + json.dumps(doc(otlp_span(endTimeUnixNano="1"))) + "\n")
    errors = errors_by_decoder(path, ("native", "generic"), monkeypatch)
    assert errors[0] == errors[1] and "line 2" in errors[0]


def test_an_unknown_decoder_choice_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_lines(tmp_path / "t.jsonl", [doc(otlp_span())])
    monkeypatch.setenv("LLMTRACE_ANALYSIS_DECODER", "fastest")
    with pytest.raises(SourceError, match="use native or generic"):
        load_spans(path)


def test_double_values_are_correctly_rounded() -> None:
    """JSON number literals written by hand (not by json.dumps) decode to the same float."""
    texts = [
        "0.1",
        "2.2250738585072014e-308",
        "1.7976931348623157e308",
        "5e-324",
        "0.30000000000000004",
        "123456789012345678",
    ]
    body = ",".join(f'{{"key": "k{i}", "value": {{"doubleValue": {t}}}}}' for i, t in enumerate(texts))
    line = json.dumps(doc(otlp_span(attributes="@@"))).replace('"@@"', f"[{body}]").encode()
    spans = _native(line, Interner())
    assert spans is not None
    got = [spans[0].attributes[f"k{i}"] for i in range(len(texts))]
    assert got == [float(t) for t in texts] and not any(math.isnan(x) for x in got)


# Values a mutation puts anywhere in a document: every JSON type, edge numbers and strings
# the Python paths treat specially, ids, enum names and AnyValue shapes.
_MUTANTS: list[Any] = [
    None, True, False, 0, 1, -1, 2**63, 2**64, 1.5, -0.0, 1e308, "", "x", "1", "+1", " 1", "1_0", "NaN", "é",
    TID, "b7ad6b7169203331", "ÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏ", [], {}, [1], {"a": 1}, "SPAN_KIND_SERVER", "STATUS_CODE_ERROR",
    {"stringValue": "s"}, {"intValue": "3"}, {"doubleValue": 2}, {"boolValue": True},
    {"arrayValue": {"values": [{"intValue": 1}]}}, {"kvlistValue": {}}, "99999999999999999999",
]  # fmt: skip


def _paths(x: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every node of a JSON value, the root's first."""
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    return [path] + [p for k, v in items for p in _paths(v, (*path, k))]


def _mutate(d: Any, rng: Any) -> Any:
    d = json.loads(json.dumps(d))
    for _ in range(rng.randint(1, 3)):
        paths = _paths(d)
        if len(paths) < 2:
            break
        path = rng.choice(paths[1:])
        parent = d
        for p in path[:-1]:
            parent = parent[p]
        if rng.random() < 0.7:
            parent[path[-1]] = json.loads(json.dumps(rng.choice(_MUTANTS)))
        elif isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.append(parent[path[-1]])
    return d


def test_differential_fuzz_against_the_generic_path() -> None:
    """Random structural mutations of a two-span document: whatever the compiled decoder
    accepts, the generic path reads to the same spans (and does not reject)."""
    import random

    rng = random.Random(20261203)
    base = doc(
        otlp_span(links=[{"traceId": TID, "spanId": "1111111111111111"}], status={"code": 2}),
        otlp_span(spanId="2222222222222222", attributes=_attrs(a={"arrayValue": {"values": [{"boolValue": True}]}})),
    )
    taken = 0
    for _ in range(1500):
        line = json.dumps(_mutate(base, rng), ensure_ascii=rng.random() < 0.5).encode()
        native = _native(line, Interner())
        if native is None:
            continue
        taken += 1
        try:
            generic = _generic(line)
        except (SourceError, AttributeError, TypeError, ValueError, KeyError) as exc:
            raise AssertionError(f"compiled decoder accepted what the generic path rejects ({exc}): {line!r}") from None
        assert repr(native) == repr(generic), line
        for x, y in zip(native, generic, strict=True):
            assert [type(v) for v in x.attributes.values()] == [type(v) for v in y.attributes.values()], line
    assert taken > 150  # enough mutated documents stay valid to compare


# --- The hand-written fast path (native/src/scan.rs) against serde ------------------------


def _render(x: Any, rng: Any) -> str:
    """``x`` as JSON text spelled at random: whitespace between tokens, escaped or raw
    characters, numbers with fractions or exponents (which changes what some fields accept:
    both readers must still agree)."""

    def ws() -> str:
        return str(rng.choice(["", "", "", " ", "\n", "\t", "\r\n  "]))

    if isinstance(x, dict):
        members = [f"{ws()}{_render(k, rng)}{ws()}:{ws()}{_render(v, rng)}{ws()}" for k, v in x.items()]
        return "{" + ",".join(members) + ws() + "}"
    if isinstance(x, list):
        return "[" + ",".join(f"{ws()}{_render(v, rng)}{ws()}" for v in x) + ws() + "]"
    if isinstance(x, str):
        text = json.dumps(x, ensure_ascii=rng.random() < 0.2)
        if x and rng.random() < 0.02:  # one character as a \u escape
            i = rng.randrange(len(x))
            text = json.dumps(x[:i])[:-1] + f"\\u{ord(x[i]) & 0xFFFF:04x}" + json.dumps(x[i + 1 :])[1:]
        return text
    if isinstance(x, bool) or x is None:
        return json.dumps(x)
    if isinstance(x, int):
        odd = [f"{x}.0", f"{x}e0", f"{x}E+00", f"-{x}" if x == 0 else f"0{x}"]
        return str(x) if rng.random() < 0.9 else str(rng.choice(odd))
    return str(rng.choice([repr(x), f"{x:.17g}", f"{x:e}", f"{x:.3E}"]))


def _decodeboth(line: bytes) -> tuple[Any, Any]:
    """The line read by the fast path (when it takes it) and by serde alone, each with an
    engine table: (spans, table spans) both ways."""
    out = []
    for scan in (True, False):
        assert isinstance(KERNELS, NativeKernels)
        table = KERNELS.new_engine_table()
        assert table is not None
        spans = KERNELS.decoder.spans_from_line(line, Interner().strings, table.native, scan)
        out.append((repr(spans), repr(table.merged_with([])),
                    None if spans is None else [[type(v) for v in s.attributes.values()] for s in spans]))
    return out[0], out[1]


def test_the_fast_path_reads_every_line_exactly_as_serde_does() -> None:
    """scan.rs is a fast path in front of serde_json: on every line it takes, the spans and
    the engine table must be those serde's reading gives (and where it gives up, serde reads
    the line). Lines: the simulator's output, every TAKEN/DECLINED case, the structural
    mutations of the fuzz test above, and the same documents spelled at random (whitespace,
    escapes, number forms, nulls, duplicate keys, trailing text). The fast path must also
    actually take the plain ones (else this test would compare serde with itself)."""
    import random

    from llmtrace.analysis._native import native

    rng = random.Random(20261204)
    sim = Path(__file__).with_name("_sim.jsonl")
    lines: list[bytes] = []
    try:
        write_jsonl(str(sim), SimConfig(duration_s=1.0, arrival_rate=20, seed=3))
        lines += sim.read_bytes().splitlines()
    finally:
        sim.unlink(missing_ok=True)
    assert lines and all(native.scans(line) for line in lines)  # the plain output: all taken
    docs = [*TAKEN.values(), *DECLINED.values()]
    base = doc(
        otlp_span(links=[{"traceId": TID, "spanId": "1111111111111111"}], status={"code": 2}, kind=2),
        otlp_span(spanId="2222222222222222", attributes=_attrs(a={"arrayValue": {"values": [{"boolValue": True}]}},
                                                               d={"doubleValue": 0.25}, i={"intValue": 7})),
    )
    docs += [_mutate(base, rng) for _ in range(600)]
    texts = [json.dumps(d) for d in docs] + [_render(d, rng) for d in docs for _ in range(3)]
    texts += ['{"resourceSpans": []} x', '{"resourceSpans": [] }  \n', '{"resourceSpans":[{"scopeSpans":[{"spans":'
              '[{"traceId":"' + TID + '","spanId":"1111111111111111","name":"n","startTimeUnixNano":"1",'
              '"endTimeUnixNano":"2","name":"m"}]}]}]}', '{"resourceSpans": [], "resourceSpans": []}',
              '{"resourceSpans": [], "x": [1, {"y": -0.5e-3}, "z\\u00e9", null, true]}']
    lines += [t.encode() for t in texts]
    decoded = taken = 0
    for line in lines:
        fast, slow = _decodeboth(line)
        assert fast == slow, line
        decoded += slow[0] != "None"
        taken += native.scans(line) and slow[0] != "None"
    print(f"{len(lines)} lines, {decoded} decoded, {taken} of them by the fast path")
    assert taken > decoded // 3, (decoded, taken)


def _decoder_named(engine_spans: list[str]) -> Any:
    import llmtrace_native

    from llmtrace import semconv as sc
    from llmtrace.analysis._kernels import STEP_KEYS
    from llmtrace.analysis.model import EMPTY_ATTRS, Link, Span, SpanKind, StatusCode

    kinds, statuses = [SpanKind(i) for i in range(6)], [StatusCode(i) for i in range(3)]
    return llmtrace_native.Decoder(Span, Link, kinds, statuses, EMPTY_ATTRS, engine_spans, sc.SERVICE_NAME, STEP_KEYS)


def test_the_engine_span_names_are_the_callers_not_the_modules() -> None:
    """The table takes the spans named as the decoder was built with (``_kernels`` passes
    semconv's): built with other names, an ``llm.step`` span stays a Python object and the
    span with the renamed name goes into the table."""
    import llmtrace_native

    from llmtrace.analysis._kernels import ENGINE_SPANS

    decoder = _decoder_named([f"x.{name}" for name in ENGINE_SPANS])
    table = llmtrace_native.EngineTable(decoder)
    ours = decoder.spans_from_line(json.dumps(doc(otlp_span(name="llm.step"))).encode(), {}, table)
    assert ours is not None and ["llm.step"] == [s.name for s in ours] and 0 == len(table)
    renamed = decoder.spans_from_line(json.dumps(doc(otlp_span(name="x.llm.step"))).encode(), {}, table)
    assert [] == renamed and 1 == len(table)


def test_a_decoder_with_the_wrong_number_of_names_is_refused() -> None:
    from llmtrace.analysis._kernels import ENGINE_SPANS

    with pytest.raises(TypeError, match="need 7 engine span names and 8 step attribute keys"):
        _decoder_named(ENGINE_SPANS[:-1])
