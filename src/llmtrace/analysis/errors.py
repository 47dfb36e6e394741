"""Exceptions raised by the analyzer; they hang off the package tree in :mod:`llmtrace.errors`.

``LLMTraceError``
    ``SourceError`` (llmtrace.errors) — a source cannot be read or parsed; names source and position.
        ``EmptySourceError`` — a source was read fine but holds no spans (empty file, no match).
    ``AnalysisError`` — the analyzer cannot proceed.
        ``SummaryError`` — a saved JSON summary has the wrong schema or version.

The CLI turns any ``LLMTraceError`` into one line on stderr and exit code 2.
"""

from __future__ import annotations

from llmtrace.errors import LLMTraceError, SourceError


class AnalysisError(LLMTraceError):
    """The analyzer cannot proceed (other than an unreadable source)."""


class EmptySourceError(SourceError):
    """The source was read but contained no spans (an empty file, a query with no match)."""


class SummaryError(AnalysisError):
    """A JSON summary passed to ``compare`` is not a summary this version understands."""


__all__ = ["AnalysisError", "EmptySourceError", "LLMTraceError", "SourceError", "SummaryError"]
