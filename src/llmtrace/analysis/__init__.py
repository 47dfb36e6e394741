"""Trace analysis: why was a request slow, where does the GPU sit idle, what limits the server.

Pure functions over a normalised model (no OpenTelemetry SDK import)::

    from llmtrace.analysis import load, analyze, to_json
    ts = load("llmtrace-traces.jsonl.gz")          # or "http://jaeger:16686"
    result = analyze(ts)
    print(to_json(result)["bottleneck"]["class"])

See docs/analysis.md for the algorithms and the JSON schema.
"""

from __future__ import annotations

from typing import Any

from llmtrace._version import __version__
from llmtrace.analysis.build import build_traceset
from llmtrace.analysis.errors import AnalysisError, EmptySourceError, SourceError, SummaryError
from llmtrace.analysis.model import Span, Trace, TraceSet
from llmtrace.analysis.summary import SCHEMA_VERSION, Analysis, analyze, to_json


def load(spec: str, **kwargs: Any) -> TraceSet:
    """Read ``spec`` (file path, ``-`` or Jaeger URL) and build the joined trace model."""
    from llmtrace.analysis.sources import load_spans, new_engine_table

    table = kwargs.pop("table", None)
    table = table if table is not None else new_engine_table()
    loaded = load_spans(spec, table=table, **kwargs)
    return build_traceset(loaded.spans, warnings=loaded.warnings, table=table)


__all__ = [
    "SCHEMA_VERSION",
    "Analysis",
    "AnalysisError",
    "EmptySourceError",
    "SourceError",
    "Span",
    "SummaryError",
    "Trace",
    "TraceSet",
    "__version__",
    "analyze",
    "build_traceset",
    "load",
    "to_json",
]
