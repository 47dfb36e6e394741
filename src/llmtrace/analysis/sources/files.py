"""Trace files: OTLP JSON lines, a single OTLP/Jaeger JSON document, concatenated JSON
objects (a saved streamed ``/api/v3/traces`` response), each optionally gzipped.

Format detection reads the first line: if it is a complete JSON object the file is parsed
line by line (streaming, constant memory beyond the spans themselves — the file exporters
write one ``ExportTraceServiceRequest`` per line); otherwise the whole file is one document
or a sequence of concatenated documents. Lines holding metrics or logs (``resourceMetrics``,
``resourceLogs``) are skipped and counted. Metrics lines are expected — llmtrace's file
exporter writes its metrics into the trace file — so only logs lines (a collector file
exporter shared between pipelines) earn a warning.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from llmtrace.analysis._kernels import KERNELS
from llmtrace.analysis.engine_table import EngineTable
from llmtrace.analysis.errors import SourceError
from llmtrace.analysis.model import Span
from llmtrace.analysis.sources._json import DecodeErrors, error_position, iter_documents, loads, short_message
from llmtrace.analysis.sources.jaeger_json import spans_from_jaeger_legacy
from llmtrace.analysis.sources.otlp import Interner, document_kind, spans_from_otlp

ProgressFn = Callable[[int, int], None]
#: Skipped without a warning: llmtrace's own file holds its metrics between the spans.
_EXPECTED_SKIPS = frozenset({"metrics"})
_GZIP_MAGIC = b"\x1f\x8b"
_READ_ERRORS = (OSError, EOFError, zlib.error)


class ReadStats:
    """Counters a read leaves behind (documents skipped, by kind; unknown span kinds), and the
    warnings they make."""

    __slots__ = ("documents", "skipped", "spans", "unknown_kinds")

    def __init__(self) -> None:
        self.documents = 0
        self.spans = 0
        self.skipped: dict[str, int] = {}
        self.unknown_kinds: set[Any] = set()

    def warnings(self, source: str) -> list[str]:
        out = [f"{source}: skipped {n} {kind} document(s)"
               for kind, n in sorted(self.skipped.items()) if kind not in _EXPECTED_SKIPS]
        if self.unknown_kinds:
            kinds = ", ".join(sorted(map(str, self.unknown_kinds)))
            out.append(f"{source}: unknown span kind(s) {kinds} read as UNSPECIFIED")
        return out


def spans_from_document(doc: Any, *, source: str, position: str, intern: Interner, stats: ReadStats) -> list[Span]:
    """Dispatch one decoded JSON object on its shape (see :func:`document_kind`)."""
    kind = document_kind(doc)
    stats.documents += 1
    if kind == "otlp":
        return spans_from_otlp(doc, source=source, position=position, intern=intern)
    if kind == "jaeger_v3":
        return spans_from_otlp(doc["result"], source=source, position=position, intern=intern)
    if kind == "jaeger_legacy":
        return spans_from_jaeger_legacy(doc, source=source, position=position, intern=intern)
    if kind in ("metrics", "logs"):
        stats.skipped[kind] = stats.skipped.get(kind, 0) + 1
        return []
    if kind == "jaeger_error":
        err = doc["error"]
        code = err.get("httpCode", err.get("code")) if isinstance(err, dict) else None
        if code == 404:  # Jaeger's "no traces found" — an empty result, not a failure
            stats.skipped["empty-result"] = stats.skipped.get("empty-result", 0) + 1
            return []
        raise SourceError(source, f"Jaeger error response: {err}", position)
    keys = ", ".join(list(doc)[:4]) if isinstance(doc, dict) else type(doc).__name__
    raise SourceError(source, f"not an OTLP or Jaeger trace document (found: {keys or 'empty object'})", position)


LineDecoder = Callable[[bytes, Interner], list[Span] | None]


def decoder_name(source: str) -> str:
    """Which decoder reads OTLP lines first: ``native`` (the compiled kernels' decoder, where
    they are in use) or ``generic`` (the Python reader, which reads every line the compiled
    one declines). ``LLMTRACE_ANALYSIS_DECODER`` picks one for tests and benchmarks; asking
    for ``native`` where it is not in use is an error."""
    choice = os.environ.get("LLMTRACE_ANALYSIS_DECODER", "")
    if choice not in ("", "native", "generic"):
        raise SourceError(source, f"LLMTRACE_ANALYSIS_DECODER={choice!r}: use native or generic", "environment")
    if choice == "native" and not KERNELS.compiled:
        raise SourceError(source, "LLMTRACE_ANALYSIS_DECODER=native, but llmtrace-native is not in use (not "
                          "built: pip install ./native; or LLMTRACE_ANALYSIS_NATIVE=0; or built from another "
                          "version)", "environment")
    return "native" if KERNELS.compiled and choice != "generic" else "generic"


def line_decoder(source: str, table: EngineTable | None = None) -> LineDecoder | None:
    """The compiled decoder for OTLP lines (:func:`decoder_name`), putting engine-side spans
    into ``table`` when given; ``None``: every line takes the generic path."""
    if decoder_name(source) != "native":
        return None
    decode = KERNELS.decode_line

    def compiled(line: bytes, intern: Interner) -> list[Span] | None:
        return decode(line, intern.strings, table)

    return compiled


def _open(path: str) -> tuple[BinaryIO, BinaryIO, int]:
    """Return (decoded stream, raw stream for progress, raw size)."""
    if path == "-":
        raw: BinaryIO = sys.stdin.buffer
        size = 0
    else:
        raw = open(path, "rb")  # noqa: SIM115 - closed by the caller's finally
        try:
            size = os.fstat(raw.fileno()).st_size
        except OSError:
            size = 0
    peek = raw.peek(2)[:2] if isinstance(raw, io.BufferedReader) else b""
    if peek == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw), raw, size  # type: ignore[return-value]
    return raw, raw, size


_UTF8_BOM = b"\xef\xbb\xbf"


def iter_file_spans(path: str, *, stats: ReadStats | None = None, progress: ProgressFn | None = None) -> Iterator[Span]:
    """Stream the spans of a trace file; raise :class:`SourceError` on unreadable input."""
    for batch in iter_file_batches(path, stats=stats, progress=progress):
        yield from batch


def iter_file_batches(
    path: str,
    *,
    stats: ReadStats | None = None,
    progress: ProgressFn | None = None,
    table: EngineTable | None = None,
    intern: Interner | None = None,
) -> Iterator[list[Span]]:
    """Stream a trace file one document (one exporter batch) at a time; with ``table`` (and
    llmtrace-native in use), OTLP lines leave their engine-side spans in it instead (the
    caller keeps ``table.python_seen`` up to date with the spans it has taken).

    ``intern``: the string cache to use; a streaming reader that holds no spans passes its
    own and empties it now and then (it otherwise grows with every trace id read)."""
    stats = stats if stats is not None else ReadStats()
    intern = intern if intern is not None else Interner()
    try:
        stream, raw, size = _open(path)
    except OSError as exc:
        raise SourceError(path, exc.strerror or str(exc)) from None
    lineno = 0
    try:
        first = stream.readline().removeprefix(_UTF8_BOM)  # saved by Windows tools (PowerShell, Notepad)
        lineno = 1
        while first and not first.strip():
            first = stream.readline()
            lineno += 1
        if not first.strip():
            return
        try:
            first_doc = loads(first)
        except DecodeErrors:
            first_doc = None
        if isinstance(first_doc, dict):
            yield from _iter_lines(
                path,
                stream,
                raw=raw,
                size=size,
                first=first,
                first_doc=first_doc,
                lineno=lineno,
                intern=intern,
                stats=stats,
                progress=progress,
                table=table,
            )
        else:
            text = first + stream.read()
            if progress:
                progress(size, size)
            yield from _iter_concatenated(path, text, intern, stats)
    except _READ_ERRORS as exc:
        msg = (
            "truncated or corrupt gzip data"
            if not isinstance(exc, OSError) or "gzip" in str(exc).lower() or isinstance(exc, gzip.BadGzipFile)
            else (exc.strerror or str(exc))
        )
        raise SourceError(path, msg, f"line {lineno}") from None
    finally:
        stats.unknown_kinds |= intern.unknown_kinds
        if raw is not sys.stdin.buffer:
            raw.close()


def _iter_lines(
    path: str,
    stream: BinaryIO,
    *,
    raw: BinaryIO,
    size: int,
    first: bytes,
    first_doc: Any,
    lineno: int,
    intern: Interner,
    stats: ReadStats,
    progress: ProgressFn | None,
    table: EngineTable | None,
) -> Iterator[list[Span]]:
    # The compiled decoder reads OTLP lines straight into spans; a line it declines
    # (anything but plain OTLP traces, or input to report an error on) takes the generic
    # path below, which yields the same spans and raises the same errors. The first
    # line too (decoded once already to detect the format): with an engine table, its
    # engine spans must go where the rest of their engine's go.
    fast = line_decoder(path, table)
    spans = fast(first, intern) if fast is not None else None
    if spans is not None:
        stats.documents += 1
        yield spans
    else:
        yield spans_from_document(first_doc, source=path, position=f"line {lineno}", intern=intern, stats=stats)
    tick = 0
    # A plain file is cut into lines here (memchr over 4 MiB blocks): BufferedReader's
    # readline scans byte by byte, ~2,000 instructions per span on these ~100 kB lines.
    # Compressed streams keep readline, so a truncation is reported at the same line.
    lines: Iterator[bytes] = _split_lines(stream) if stream is raw and raw is not sys.stdin.buffer else stream
    for line in lines:
        lineno += 1
        if fast is not None:
            spans = fast(line, intern)
            if spans is not None:
                stats.documents += 1
                yield spans
                tick += 1
                if progress is not None and tick % 64 == 0:
                    progress(raw.tell() if size else 0, size)
                continue
        if not line.strip():
            continue
        try:
            doc = loads(line)
        except DecodeErrors as exc:
            if not line.endswith(b"\n"):
                raise SourceError(path, "truncated line (file cut off mid-write?)", f"line {lineno}") from None
            col = getattr(exc, "colno", None)
            pos = f"line {lineno}" + (f", column {col}" if col else "")
            raise SourceError(path, f"malformed JSON: {short_message(exc)}", pos) from None
        yield spans_from_document(doc, source=path, position=f"line {lineno}", intern=intern, stats=stats)
        tick += 1
        if progress is not None and tick % 64 == 0:
            progress(raw.tell() if size else 0, size)
    if progress is not None:
        progress(size, size)


def _split_lines(stream: BinaryIO, block: int = 1 << 22) -> Iterator[bytes]:
    """The lines of ``stream`` as ``for line in stream`` yields them (``\n`` kept)."""
    # A line cut by a block boundary is joined from its pieces alone: prepending the
    # remainder to the next block instead copied the whole file once more.
    pending: list[bytes] = []
    while True:
        chunk = stream.read(block)
        if not chunk:
            break
        find = chunk.find
        start = 0
        if pending:
            end = find(b"\n")
            if end < 0:  # a line longer than a block
                pending.append(chunk)
                continue
            pending.append(chunk[: end + 1])
            yield b"".join(pending)
            pending = []
            start = end + 1
        while True:
            end = find(b"\n", start)
            if end < 0:
                break
            yield chunk[start : end + 1]
            start = end + 1
        if start < len(chunk):
            pending.append(chunk[start:])
    if pending:
        yield b"".join(pending)


def _iter_concatenated(path: str, data: bytes, intern: Interner, stats: ReadStats) -> Iterator[list[Span]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(path, "not UTF-8 text", f"byte {exc.start}") from None
    count = 0
    try:
        for pos, doc in iter_documents(text):
            count += 1
            position = error_position_text(text, pos)
            yield spans_from_document(doc, source=path, position=position, intern=intern, stats=stats)
    except json.JSONDecodeError as exc:
        raise SourceError(path, f"malformed JSON: {exc.msg}", error_position_text(text, exc.pos)) from None
    if count == 0:
        raise SourceError(path, "no JSON document found", "line 1")


def error_position_text(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {col}"


__all__ = ["ReadStats", "error_position", "iter_file_batches", "iter_file_spans", "spans_from_document"]
