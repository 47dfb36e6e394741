"""Public surface of llmtrace.analysis and the CLI's small helpers."""

from __future__ import annotations

import io

import pytest

from llmtrace import analysis
from llmtrace.cli._progress import Progress
from llmtrace.cli._timeparse import parse_time
from llmtrace.errors import LLMTraceError, SourceError


def test_all_names_exist_and_errors_hang_off_the_package_tree() -> None:
    """Every name in __all__ resolves; analysis errors are LLMTraceErrors (the CLI's exit-2 class)."""
    assert [] == [name for name in analysis.__all__ if not hasattr(analysis, name)]
    assert issubclass(analysis.SourceError, LLMTraceError)
    assert analysis.SourceError is SourceError
    assert issubclass(analysis.EmptySourceError, SourceError)
    assert issubclass(analysis.SummaryError, LLMTraceError)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_on_a_terminal_and_clears_its_line() -> None:
    """On a TTY the bar shows percent and bytes, and close() erases it."""
    out = _Tty()
    bar = Progress("reading x", stream=out)
    bar(512, 1024)
    bar(1024, 1024)
    bar.close()
    text = out.getvalue()
    assert "reading x [" in text and "100%" in text and "1.0 KB/1.0 KB" in text
    assert text.endswith("\r\033[K")


def test_progress_is_silent_off_a_terminal() -> None:
    """Piped stderr (CI logs) gets no progress output."""
    out = io.StringIO()
    bar = Progress("reading x", stream=out)
    bar(1, 2)
    bar.close()
    assert "" == out.getvalue()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("90s", 1_000 * 10**9 - 90 * 10**9),
        ("2h", 1_000 * 10**9 - 7200 * 10**9),
        ("1970-01-01T00:00:10Z", 10 * 10**9),
        ("12.5", 12_500_000_000),
    ],
)
def test_time_arguments(value: str, expected: int) -> None:
    """Durations count back from now; RFC 3339 and Unix seconds are absolute."""
    assert expected == parse_time(value, now_ns=1_000 * 10**9)
