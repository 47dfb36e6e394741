"""JSON decoding: orjson when installed (3-4x faster on OTLP payloads), else the stdlib."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

JSONDecodeError = json.JSONDecodeError

try:  # pragma: no cover - depends on the environment
    import orjson

    def _orjson_loads(data: bytes | str) -> Any:
        return orjson.loads(data)

    loads: Callable[[bytes | str], Any] = _orjson_loads
    # RecursionError: the stdlib decoder's answer to JSON nested deeper than Python's stack.
    DecodeErrors: tuple[type[Exception], ...] = (orjson.JSONDecodeError, json.JSONDecodeError, RecursionError)
except ImportError:  # pragma: no cover
    loads = json.loads
    DecodeErrors = (json.JSONDecodeError, RecursionError)

#: What a decoder's RecursionError means to the reader of an error message.
TOO_DEEP = "nested too deep"


def error_position(exc: Exception) -> str:
    """``line:col`` of a decode error, where the decoder reports one."""
    lineno = getattr(exc, "lineno", None)
    colno = getattr(exc, "colno", None)
    if lineno is not None and colno is not None:
        return f"{lineno}:{colno}"
    pos = getattr(exc, "pos", None)
    return f"char {pos}" if pos is not None else "?"


def short_message(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return TOO_DEEP
    msg = getattr(exc, "msg", None) or str(exc)
    return msg.split(":", 1)[0] if ": line" in msg else msg


def iter_documents(text: str) -> Iterator[tuple[int, Any]]:
    """JSON values written back to back (whitespace or commas between), each with the
    offset it starts at: a saved streamed response, concatenated exports. A malformed one
    raises :class:`json.JSONDecodeError` (``pos`` is its offset in ``text``)."""
    decoder = json.JSONDecoder()
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n:
            return
        try:
            doc, end = decoder.raw_decode(text, pos)
        except RecursionError:
            raise json.JSONDecodeError(TOO_DEEP, text, pos) from None
        yield pos, doc
        pos = end
