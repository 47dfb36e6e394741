"""The compiled Chrome trace writer (native/src/chrome/, ``_perfetto_native``) against the
Python one (``perfetto.ChromeTraceWriter``, the reference): the same spans give the same
text, byte for byte, and the same counts.

The module is built by ``.ci/run`` when a Rust toolchain is present; without one these
tests are skipped and say so.
"""

from __future__ import annotations

import enum
import gzip
import io
import json
import math
import random
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from llmtrace import semconv as sc
from llmtrace.analysis import perfetto
from llmtrace.analysis._kernels import KERNELS
from llmtrace.analysis._perfetto_native import compiled_writer, writer_name
from llmtrace.analysis.errors import AnalysisError
from llmtrace.analysis.model import EMPTY_ATTRS, Link, Span
from llmtrace.analysis.sources.files import iter_file_batches
from llmtrace.analysis.synthetic import SimConfig, simulate, write_jsonl
from tests.analysis.builders import span
from tests.analysis.test_perfetto_export import _FIXTURE, _gpu, _reversed, _two_services, _write

pytestmark = pytest.mark.skipif(
    KERNELS.chrome_trace_events() is None,
    reason="llmtrace-native with its Chrome trace writer not built (needs cargo: pip install ./native)",
)

Batches = list[list[Span]]


@pytest.fixture(autouse=True)
def _default_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMTRACE_EXPORT_WRITER", raising=False)


def _python(batches: Iterable[Iterable[Span]], args: bool) -> tuple[str, perfetto.ExportStats]:
    out = io.StringIO()
    writer = perfetto.ChromeTraceWriter(out, args=args, source="src")
    for batch in batches:
        writer.add(batch)
    stats = writer.close()
    return out.getvalue(), stats


def _compiled(batches: Iterable[Iterable[Span]], args: bool) -> tuple[str, perfetto.ExportStats]:
    out = io.StringIO()
    writer = compiled_writer(out, args=args, source="src")
    assert writer is not None
    for batch in batches:
        writer.add(batch)
    stats = writer.close()
    return out.getvalue(), stats


def _same(batches: Batches, *, args: bool = True, valid_json: bool = True) -> str:
    """Both writers' text, asserted equal (and, unless told otherwise, a JSON document); returns it."""
    want, want_stats = _python(batches, args)
    got, got_stats = _compiled(batches, args)
    if want != got:  # the first differing event, readably
        pairs = zip(want.split(",\n"), got.split(",\n"), strict=False)
        first = next(((w, g) for w, g in pairs if w != g), (len(want), len(got)))
        pytest.fail(f"the compiled writer's text differs: {first}")
    assert want_stats == got_stats
    if valid_json:
        json.loads(got)
    return got


def _read(path: Path) -> Batches:
    return [list(b) for b in iter_file_batches(str(path))]


def _docs_file(tmp_path: Path, docs: list[dict[str, Any]]) -> Path:
    path = tmp_path / "src.jsonl.gz"
    _write(path, docs)
    return path


@pytest.mark.parametrize("args", [True, False], ids=["args", "no-args"])
@pytest.mark.parametrize("order", ["as written", "reversed"])
def test_two_services_with_gpus_give_the_same_text(tmp_path: Path, args: bool, order: str) -> None:
    """Two processes, two engines, GPU counters, flows; every child before its parent when reversed."""
    docs = _two_services() if order == "as written" else _reversed(_two_services())
    text = _same(_read(_docs_file(tmp_path, docs)), args=args)
    assert '"ph":"f"' in text and '"gpu 0"' in text


@pytest.mark.parametrize("order", ["as recorded", "reversed"])
def test_a_real_server_run_with_aborts_gives_the_same_text(tmp_path: Path, order: str) -> None:
    """The reference server's recorded run: request phases clipped to, or requests drawn to, each other."""
    with gzip.open(_FIXTURE, "rt", encoding="utf-8") as fh:
        docs = [doc for line in fh if line.strip() and "resourceSpans" in (doc := json.loads(line))]
    text = _same(_read(_docs_file(tmp_path, docs if order == "as recorded" else _reversed(docs))))
    assert perfetto.CLIPPED_ARG in text or perfetto.EXTENDED_ARG in text


def test_a_saved_jaeger_response_gives_the_same_text() -> None:
    """Spans read by the generic Python reader (a saved Jaeger API v3 response), not the compiled decoder."""
    path = _FIXTURE.parent / "jaeger_v3_response.json.gz"
    assert '"ph":"X"' in _same([list(b) for b in iter_file_batches(str(path))])


def test_small_limits_evict_and_orphan_the_same_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With every bounded cache small enough to fill, the same tracks are renamed, the same
    children orphaned, the same phase ends forgotten."""
    for name, value in (("RECENT_PARENTS", 8), ("PENDING_LIMIT", 8), ("TRACK_CACHE", 4)):
        monkeypatch.setattr(perfetto, name, value)
    batches = _read(_docs_file(tmp_path, _two_services()))
    text = _same(batches)
    assert _compiled(batches, True)[1].unparented > 0
    assert text.count('"thread_name"') > 10


class _Color(enum.Enum):
    RED = "red"


class _Label(str):
    pass


#: Attribute values of every kind a source or a hand-made span may hold.
_ODD_VALUES: dict[str, Any] = {
    "text": 'a "quoted"\\ line\nwith\ttabs\x00\x1f\x7f, é, \u2028 and \U0001f600',
    "int": -42,
    "big int": 2**70,
    "float": 0.1,
    "tiny": 1e-7,
    "huge": 1.2345678901234568e17,
    "nan": math.nan,
    "inf": -math.inf,
    "bools": (True, False, None),
    "nested": {"k": [1, 2.5, "x"], "d": {}},
    "enum": _Color.RED,
    "str subclass": _Label("label"),
    "list": [1, "two"],
    "bytes": b"raw",
}


def _odd_spans() -> list[Span]:
    """Spans that take every fallback of the compiled writer: odd names, ids, attribute
    values and types, times before the origin and beyond int64, mappings that are not dicts."""
    trace = "ab" * 16
    req = span(sc.SPAN_REQUEST, 0, 10, span_id="1" * 16, trace=trace, attrs={sc.LLM_REQUEST_ID: 0})
    vreq = span(sc.SPAN_REQUEST, 0, 10, span_id="2" * 16, trace=trace, attrs={sc.VLLM_REQUEST_ID: "vllm-\u00e9"})
    steps = [
        span(sc.SPAN_STEP, 1, 2, span_id="3" * 16, trace=trace,
             attrs={sc.LLM_ENGINE_ID: 7, sc.LLM_QUEUE_RUNNING: 3, sc.LLM_QUEUE_WAITING: 2**80,
                    sc.LLM_KV_CACHE_USAGE: 1e-5, **_ODD_VALUES},
             links=(Link(trace, "1" * 16), Link(trace, "not hex!"))),
        span(sc.SPAN_STEP, 2, 3, span_id="4" * 16, trace=trace,
             attrs={sc.LLM_ENGINE_ID: "dp \"0\"", sc.LLM_QUEUE_WAITING: 5.0, sc.LLM_KV_CACHE_USAGE: math.nan,
                    sc.HW_GPU_UTILIZATION: 0.5, sc.HW_GPU_ID: "  "}),
        span(sc.SPAN_STEP, 3, 4, span_id="5" * 16, trace=trace,
             attrs={sc.LLM_ENGINE_ID: None, sc.LLM_QUEUE_RUNNING: True, sc.HW_GPU_POWER: 2**1100}),
    ]
    odd = [
        span("span \u00e9 \"named\"\n\U0001f600 \udc80", -5000, -1, span_id="zz-not-hex-id", trace="\u00e9" * 9),
        span(sc.SPAN_SCHEDULE, 1, 2, parent_id="3" * 16, trace=trace, attrs={sc.LLM_STEP_ID: 1}),
        span(sc.SPAN_FORWARD, 1, 2, trace=trace, span_id="6" * 16,
             attrs={sc.LLM_ENGINE_ID: "dp1", sc.HW_GPU_MEMORY_USAGE: 3 * 2**30, sc.HW_GPU_ID: 0},
             resource={"process.pid": 12, "host.name": None, sc.LLMTRACE_PROCESS_ROLE: "engine-core"}),
        span("server", 0, 20, trace=trace, span_id="7" * 16, service="", resource={"process.pid": None}),
        span("other", 0, 20, trace=trace, span_id="8" * 16, service="\u00e9svc",
             resource={sc.LLMTRACE_PROCESS_ROLE: ""}),
    ]
    phases = [
        span(sc.SPAN_DECODE, 5, 12, parent_id="1" * 16, trace=trace),  # outlasts its request: clipped
        span(sc.SPAN_DECODE, 5, 15, parent_id="9" * 16, trace=trace),  # read before its request
        span(sc.SPAN_REQUEST, 0, 10, span_id="9" * 16, trace=trace),  # drawn to the phase's end
    ]
    proxies = [
        Span(trace, "a" * 16, None, sc.SPAN_PREFILL, 0, 1, attributes=EMPTY_ATTRS),
        Span(trace, "b" * 16, "1" * 16, sc.SPAN_QUEUE, 0, 30_000_000, attributes=EMPTY_ATTRS),
        Span(trace, "c" * 16, None, "proxy", 0, 1, attributes=MappingProxyType({"k": 1, sc.LLM_ENGINE_ID: "dp2"})),
        Span(trace, "d" * 16, None, "far", 2**63 + 5, 2**64 - 1, attributes={}),
    ]
    return [req, vreq, *steps, *odd, *phases, *proxies]


@pytest.mark.parametrize("args", [True, False], ids=["args", "no-args"])
def test_odd_names_ids_and_values_give_the_same_text(args: bool) -> None:
    """Escapes, non-ASCII text, lone surrogates, ints beyond 64 bits, non-finite and tiny
    floats, enums, str subclasses, lists, bytes, non-dict mappings, falsy request ids,
    non-hex ids, negative and far times: where the compiled writer does not write a value
    itself it asks the Python helpers, so the text is the reference's. (A non-dict mapping
    of attributes is written as msgspec writes it, its ``str``: not JSON, in both.)"""
    spans = _odd_spans()
    text = _same([spans[:4], spans[4:]], args=args, valid_json=not args)
    assert "\\udc80" in text


def test_text_utf8_cannot_hold_is_an_error_in_both() -> None:
    """An attribute key with a lone surrogate (a generic JSON reader lets ``"\\ud800"`` through)
    cannot be written as UTF-8: both writers raise msgspec's error."""
    bad = span("x", 0, 1, attrs={"key \ud800": 1})
    with pytest.raises(UnicodeEncodeError):
        _python([[bad]], True)
    with pytest.raises(UnicodeEncodeError):
        _compiled([[bad]], True)


def test_random_doubles_are_written_as_msgspec_and_repr_write_them() -> None:
    """Doubles from every exponent range, as attributes (msgspec's digits) and as queue and
    KV counts (Python's repr): the same shortest digits and notation."""
    rng = random.Random(7)
    values = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(3000)]
    values += [rng.uniform(-1, 1) * 10.0 ** rng.randint(-20, 20) for _ in range(3000)]
    values += [float(10**e) for e in range(-8, 25)] + [k / 1000 for k in range(-50, 50)]
    values = [v for v in values if math.isfinite(v)]
    spans = [
        span(sc.SPAN_STEP, i, i + 1, span_id=f"{i + 1:016x}",
             attrs={sc.LLM_ENGINE_ID: "dp0", sc.LLM_QUEUE_RUNNING: v, sc.LLM_QUEUE_WAITING: -v,
                    sc.LLM_KV_CACHE_USAGE: v / 3, sc.HW_GPU_UTILIZATION: v, "x": v, "y": (v, v * 7)})
        for i, v in enumerate(values)
    ]
    _same([spans])


def test_input_batches_may_be_any_iterable(tmp_path: Path) -> None:
    """A batch that is not a list (a generator) is written the same."""
    spans = _odd_spans()

    def gen() -> Iterator[Span]:
        yield from spans

    assert _python([spans], True)[0] == _compiled([gen()], True)[0]


def test_a_span_of_the_wrong_shape_is_a_clear_error() -> None:
    """A span whose name is not a str, or a time no source makes (beyond ±2**126 ns), raises naming the field."""
    bad = span(sc.SPAN_STEP, 0, 1)._replace(name=5)  # type: ignore[arg-type]  # the wrong type, on purpose
    with pytest.raises(TypeError, match="name must be a str"):
        _compiled([[bad]], True)
    far = span("x", 0, 1)._replace(end_ns=2**126)
    with pytest.raises(ValueError, match=r"not an integer within ±2\*\*126 ns"):
        _compiled([[far]], True)


def test_the_writer_is_chosen_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``LLMTRACE_EXPORT_WRITER`` picks the writer; an unknown value is an error."""
    assert "native" == writer_name()
    monkeypatch.setenv("LLMTRACE_EXPORT_WRITER", "python")
    assert ("python", None) == (writer_name(), compiled_writer(io.StringIO()))
    monkeypatch.setenv("LLMTRACE_EXPORT_WRITER", "fast")
    with pytest.raises(AnalysisError, match="use native or python"):
        writer_name()


def _peak_state(tmp_path: Path, duration_s: float) -> tuple[int, int]:
    """(spans, the most bytes of state the compiled writer held between batches)."""
    path = tmp_path / f"sim{duration_s}.jsonl"
    spans = write_jsonl(str(path), SimConfig(duration_s=duration_s, arrival_rate=20, seed=1))
    writer = compiled_writer(io.StringIO())
    assert writer is not None
    peak = 0
    for batch in iter_file_batches(str(path)):
        writer.add(batch)
        peak = max(peak, writer.nbytes())
    writer.close()
    return spans, peak


def test_state_held_does_not_grow_with_the_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled writer's own state (out of tracemalloc's sight) is bounded by the same
    limits: with them small, four times the spans hold no more state."""
    monkeypatch.setattr(perfetto, "RECENT_PARENTS", 256)
    monkeypatch.setattr(perfetto, "PENDING_LIMIT", 256)
    monkeypatch.setattr(perfetto, "TRACK_CACHE", 64)
    small_spans, small_peak = _peak_state(tmp_path, 5)
    large_spans, large_peak = _peak_state(tmp_path, 20)
    assert large_spans > 3 * small_spans
    assert large_peak < 1.25 * small_peak


def test_gpu_attributes_from_a_real_decode_give_the_same_counters(tmp_path: Path) -> None:
    """GPU attributes as the sampler writes them, read by the compiled decoder."""
    docs = [_gpu(d, "1") for d in simulate(SimConfig(duration_s=1, arrival_rate=10, seed=3))]
    assert '"gpu 1"' in _same(_read(_docs_file(tmp_path, docs)))
