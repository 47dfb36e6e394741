"""Exceptions raised by the analyzer. All derive from :class:`AnalysisError`.

``AnalysisError``
    ``SourceError`` — a source could not be read or parsed; names the source and a position.
        ``EmptySourceError`` — a source was read fine but holds no spans.
    ``SummaryError`` — a saved JSON summary has the wrong schema or version.

The CLI turns any ``AnalysisError`` into one line on stderr and exit code 2.
"""

from __future__ import annotations


class AnalysisError(Exception):
    """Base of every analyzer error."""


class SourceError(AnalysisError):
    """A trace source is unreadable: ``source`` is a path or URL, ``position`` where it failed."""

    def __init__(self, source: str, message: str, position: str | None = None) -> None:
        self.source = source
        self.position = position
        self.message = message
        where = f"{source}:{position}" if position else source
        super().__init__(f"{where}: {message}")


class EmptySourceError(SourceError):
    """The source was read but contained no spans (an empty file, a query with no match)."""


class SummaryError(AnalysisError):
    """A JSON summary passed to ``compare`` is not a summary this version understands."""
