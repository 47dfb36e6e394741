"""The exception tree of llmtrace, in one place.

``LLMTraceError``
    ├── ``ConfigError``      an unknown option or an invalid value (names the option and the allowed values)
    └── ``SourceError``      a trace source that cannot be read (names the source and the position)

Telemetry never raises into the host application: these are raised only from
explicit user calls (``instrument()`` with bad options, ``llmtrace analyze``).
"""

from __future__ import annotations


class LLMTraceError(Exception):
    """Base class of every error llmtrace raises on purpose."""


class ConfigError(LLMTraceError, ValueError):
    """An option or environment variable has an unknown name or an invalid value."""


class SourceError(LLMTraceError):
    """A trace source (file, Jaeger API) cannot be read or parsed."""

    def __init__(self, source: str, message: str, position: str | None = None) -> None:
        self.source = source
        self.position = position
        where = f"{source}:{position}" if position else source
        super().__init__(one_line(f"{where}: {message}"))


#: An error message is cut here: it quotes what it could not read, which may be anything.
MAX_MESSAGE_CHARS = 1000


def one_line(text: str) -> str:
    """*text* as one printable line: a message quoting a trace (an id, a service name) must not
    break the line, nor carry terminal control or bidi-override characters."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                       for c in text)
    return text if len(text) <= MAX_MESSAGE_CHARS else f"{text[:MAX_MESSAGE_CHARS]}... ({len(text)} characters)"
