"""Trace sources: files (OTLP JSON lines, OTLP/Jaeger documents, gzip) and the Jaeger API.

:func:`load_spans` is the one entry point: a path (``-`` for stdin) or an ``http(s)://``
Jaeger query URL in, spans and warnings out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmtrace.analysis._gc import paused_gc
from llmtrace.analysis._kernels import KERNELS
from llmtrace.analysis.engine_table import EngineTable, merge_in
from llmtrace.analysis.errors import EmptySourceError
from llmtrace.analysis.model import Span
from llmtrace.analysis.sources.files import ReadStats, iter_file_batches, iter_file_spans
from llmtrace.analysis.sources.jaeger import DEFAULT_LIMIT, JaegerSource

if TYPE_CHECKING:
    import httpx

#: Without --since, a Jaeger query looks back this far: long enough for a benchmark run,
#: short enough that one query does not page through a day of traces.
DEFAULT_LOOKBACK_NS = 3600 * 1_000_000_000


@dataclass
class Loaded:
    """Spans read from one source, with the warnings the read produced."""

    source: str
    spans: list[Span]
    warnings: list[str] = field(default_factory=list)


def new_engine_table() -> EngineTable | None:
    """An empty engine table for ``load_spans(table=...)``; ``None`` where the compiled
    kernels are not in use (every span is then a Python object)."""
    return KERNELS.new_engine_table()


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def load_spans(
    spec: str,
    *,
    services: list[str] | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
    limit: int = DEFAULT_LIMIT,
    api: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    transport: httpx.BaseTransport | None = None,
    table: EngineTable | None = None,
) -> Loaded:
    """Read every span from ``spec``; raise :class:`EmptySourceError` when there are none.

    For files, ``services``/``since_ns``/``until_ns`` filter the spans after reading (a trace
    is kept whole when its earliest span starts inside the window).

    ``table`` (:func:`new_engine_table`): engine-side spans of OTLP lines stay in it as
    columns instead of joining ``Loaded.spans``; pass it on to ``build_traceset``. Several
    reads may share one table (their spans then count as one read, in order).
    """
    if is_url(spec):
        until = until_ns if until_ns is not None else time.time_ns()
        since = since_ns if since_ns is not None else until - DEFAULT_LOOKBACK_NS
        client = JaegerSource(spec, api=api, limit=limit, transport=transport)
        try:
            spans = list(client.iter_spans(services, since, until, progress))
        finally:
            client.close()
        warnings = client.stats.warnings(spec) + client.warnings
        if table is not None:
            table.python_seen += len(spans)
    else:
        stats = ReadStats()
        spans = []
        seen = table.python_seen if table is not None else 0
        in_table = len(table) if table is not None else 0
        with paused_gc():
            for batch in iter_file_batches(spec, stats=stats, progress=progress, table=table):
                spans += batch
                if table is not None:
                    table.python_seen += len(batch)
        warnings = stats.warnings(spec)
        if table is not None and len(table) > in_table and (services or since_ns is not None or until_ns is not None):
            # Filters read whole traces: this read's table spans become Python spans again.
            placed = [(b - seen, s) for b, s in table.take_back(in_table)]
            spans = merge_in(spans, placed)
        spans = _filter(spans, services, since_ns, until_ns)
        if table is not None:
            table.python_seen = seen + len(spans)
        if not spans and table is not None and len(table) > in_table:
            return Loaded(spec, spans, warnings)
    if not spans:
        raise EmptySourceError(spec, "no spans found" + (" for the given filters" if services or since_ns else ""))
    return Loaded(spec, spans, warnings)


def _filter(spans: list[Span], services: list[str] | None, since_ns: int | None, until_ns: int | None) -> list[Span]:
    if not services and since_ns is None and until_ns is None:
        return spans
    first: dict[str, int] = {}
    keep_trace: set[str] = set()
    for s in spans:
        if s.start_ns < first.get(s.trace_id, s.start_ns + 1):
            first[s.trace_id] = s.start_ns
        if not services or s.service in services:
            keep_trace.add(s.trace_id)
    lo = since_ns if since_ns is not None else -1
    hi = until_ns if until_ns is not None else 1 << 127
    return [s for s in spans if s.trace_id in keep_trace and lo <= first[s.trace_id] <= hi]


__all__ = [
    "DEFAULT_LIMIT",
    "JaegerSource",
    "Loaded",
    "ReadStats",
    "is_url",
    "iter_file_spans",
    "load_spans",
    "new_engine_table",
]
