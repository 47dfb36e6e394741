"""Reading OTLP lines: what the decoder comparisons share (test_native_decoder.py uses
them), and the line reader's own behaviours (the paused collector, the line splitting)."""

from __future__ import annotations

import base64
import gc
from pathlib import Path
from typing import Any

import pytest

from llmtrace.analysis._gc import paused_gc
from llmtrace.analysis.errors import SourceError
from llmtrace.analysis.sources import load_spans
from tests.analysis.test_sources import PID, TID, doc, otlp_span

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "analysis"


def both(path: str, monkeypatch: pytest.MonkeyPatch, fast: str = "native") -> tuple[Any, Any]:
    """The spans read by the ``fast`` decoder (lines it declines: the generic path) and by
    the generic path alone."""
    monkeypatch.setenv("LLMTRACE_ANALYSIS_DECODER", fast)
    fast_read = load_spans(path)
    monkeypatch.setenv("LLMTRACE_ANALYSIS_DECODER", "generic")
    generic = load_spans(path)
    monkeypatch.delenv("LLMTRACE_ANALYSIS_DECODER")
    return fast_read, generic


def errors_by_decoder(path: Path, decoders: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SourceError each decoder raises on ``path``."""
    errors = []
    for decoder in decoders:
        monkeypatch.setenv("LLMTRACE_ANALYSIS_DECODER", decoder)
        with pytest.raises(SourceError) as exc:
            load_spans(str(path))
        errors.append(str(exc.value))
    monkeypatch.delenv("LLMTRACE_ANALYSIS_DECODER")
    return errors


def same(a: Any, b: Any) -> None:
    assert a.warnings == b.warnings
    assert repr(a.spans) == repr(b.spans)  # repr: NaN attribute values compare unequal
    for x, y in zip(a.spans, b.spans, strict=True):
        assert (type(x.kind), type(x.status), type(x.resource)) == (type(y.kind), type(y.status), type(y.resource))
        assert [(k, type(v)) for k, v in x.attributes.items()] == [(k, type(v)) for k, v in y.attributes.items()]


def edge_lines() -> list[Any]:
    b64 = base64.b64encode(bytes.fromhex(TID)).decode()
    kv = {"values": [{"key": "a", "value": {"intValue": 1}}]}
    return [
        doc(otlp_span(spanId="1111111111111111")),  # line 1 is always read by the generic path
        doc(otlp_span(spanId="2222222222222222", kind="SPAN_KIND_SERVER", status={"code": "STATUS_CODE_OK"})),
        doc(otlp_span(spanId="3333333333333333", traceId=b64)),  # base64 id: generic path
        doc(otlp_span(spanId="4444444444444444", kind=9)),  # unknown kind: generic path, warning
        doc(
            otlp_span(
                spanId="5555555555555555",
                parentSpanId="",
                status={},
                links=[],
                startTimeUnixNano=1700000000000000000,
                attributes=[
                    {"key": "n", "value": {"intValue": 7}},
                    {"key": "nan", "value": {"doubleValue": "NaN"}},
                    {"key": "inf", "value": {"doubleValue": "-Infinity"}},
                    {"key": "d", "value": {"doubleValue": 3}},
                    {"key": "b", "value": {"boolValue": False}},
                    {"key": "bytes", "value": {"bytesValue": "AAE="}},
                    {"key": "kv", "value": {"kvlistValue": kv}},
                    {"key": "empty", "value": {}},
                    {"key": "long", "value": {"stringValue": "x" * 100}},
                    {"key": "unknown", "value": {"fooValue": 1, "intValue": "3"}},
                ],
            )
        ),
        {"resourceMetrics": []},
        {"resourceSpans": [{"resource": {}, "instrumentationLibrarySpans": [{"spans": [otlp_span(spanId=PID)]}]}]},
        {"resourceSpans": None},
        doc(otlp_span(spanId="6666666666666666", attributes=None, links=None, status=None)),
        doc(otlp_span(spanId="7777777777777777"), service="engine"),
    ]


def test_paused_gc_restores_the_collector_and_leaves_frozen_objects_alone() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        keep = [[i] for i in range(1000)]
    assert gc.isenabled() and len(keep) == 1000
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with paused_gc():
            keep.append([0])
        assert gc.get_freeze_count() == frozen  # not thawed
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("block", [1, 2, 3, 7, 1 << 22])
def test_plain_files_are_cut_into_the_same_lines_as_readline(block: int) -> None:
    import io
    import random

    from llmtrace.analysis.sources.files import _split_lines

    rng = random.Random(block)
    # Lines shorter and longer than a block, several to a block, and a newline at a block edge.
    generated = [b"".join(rng.choice([b"a", b"b", b"\n"]) for _ in range(rng.randint(0, 40))) for _ in range(200)]
    for data in (b"", b"a", b"a\n", b"a\nb", b"\n\n", b"ab\ncd\n\nef", b"x" * 10 + b"\n" + b"y" * 7, b"a\r\nb\x0cc\n",
                 *generated):
        assert list(_split_lines(io.BytesIO(data), block)) == list(io.BytesIO(data))
