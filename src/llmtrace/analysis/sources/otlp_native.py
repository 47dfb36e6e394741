"""OTLP/JSON lines decoded by the compiled ``llmtrace-native`` module: the fastest path.

``native/`` (Rust, PyO3, ``serde_json``) parses a line into borrowed structs and builds the
:class:`~llmtrace.analysis.model.Span` tuples directly, with no Python object per JSON
value and no bytecode per span. It follows the typed path's contract (``otlp_typed.py``):
a line is converted exactly as the generic path converts it, or declined (``None``) and
read by the Python paths, which then produce the same spans, warnings and errors. It
declines more than the typed path does (``kvlistValue``/``bytesValue`` attributes, string
doubles, a value with several keys, non-string service names, duplicate JSON keys); those
lines go to the typed path.

The module is optional (:mod:`llmtrace.analysis._native` loads it): it is built from
``native/`` by ``pip install ./native`` (needs a Rust toolchain; ``.ci/run`` and ``make
setup`` do it when ``cargo`` is present). Without it :data:`AVAILABLE` is false and nothing
changes but speed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmtrace.analysis._native import native
from llmtrace.analysis.engine_table import EngineTable
from llmtrace.analysis.model import EMPTY_ATTRS, Link, Span, SpanKind, StatusCode
from llmtrace.analysis.sources.otlp import Interner

AVAILABLE = native is not None
_DECODER: Any = (
    native.Decoder(Span, Link, [SpanKind(i) for i in range(6)], [StatusCode(i) for i in range(3)], EMPTY_ATTRS)
    if native is not None
    else None
)
_decode: Callable[..., list[Span] | None] | None = _DECODER.spans_from_line if _DECODER is not None else None


def spans_from_line(data: bytes, intern: Interner, table: EngineTable | None = None) -> list[Span] | None:
    """The spans of one OTLP/JSON traces line, or ``None`` when a Python path must read it.
    With ``table``, engine-side spans go into it instead of the list."""
    assert _decode is not None, "llmtrace-native is not installed (check AVAILABLE first)"
    if table is None:
        return _decode(data, intern.strings)
    return _decode(data, intern.strings, table.native)


def new_table() -> EngineTable | None:
    """An empty engine table for ``load_spans(table=...)``; ``None`` without llmtrace-native."""
    return EngineTable(native.EngineTable(_DECODER)) if native is not None else None
