"""``llmtrace export SOURCE --format perfetto -o trace.json``: a trace source as a timeline.

Spans stream from the source to the output (bounded memory, whatever the input's size).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

from llmtrace.analysis._gc import paused_gc
from llmtrace.analysis.model import Span
from llmtrace.analysis.perfetto import ExportStats, write_chrome_trace
from llmtrace.analysis.sources import ReadStats, is_url
from llmtrace.analysis.sources.files import iter_file_batches
from llmtrace.analysis.sources.jaeger import JaegerSource
from llmtrace.analysis.sources.otlp import Interner
from llmtrace.cli._analyze import _window
from llmtrace.cli._progress import Progress
from llmtrace.errors import LLMTraceError

#: Interned strings kept at most while streaming a file (trace ids otherwise pile up).
_INTERN_LIMIT = 20_000
#: Span ids remembered to drop the second copy of a trace Jaeger returns for each of the
#: services it touches; cleared when full (a bounded, best-effort filter).
_SEEN_LIMIT = 500_000


def _file_batches(path: str, progress: Progress, warnings: list[str]) -> Iterator[list[Span]]:
    stats = ReadStats()
    intern = Interner()
    for batch in iter_file_batches(path, stats=stats, progress=progress, intern=intern):
        yield batch
        if len(intern.strings) > _INTERN_LIMIT:
            intern.strings.clear()
    warnings.extend(stats.warnings(path))


def _jaeger_batches(
    url: str, args: argparse.Namespace, progress: Progress, warnings: list[str]
) -> Iterator[list[Span]]:
    import time

    from llmtrace.analysis.sources import DEFAULT_LOOKBACK_NS

    since, until = _window(args)
    until = until if until is not None else time.time_ns()
    since = since if since is not None else until - DEFAULT_LOOKBACK_NS
    client = JaegerSource(url, api=args.api, limit=args.limit)
    seen: set[str] = set()
    batch: list[Span] = []
    try:
        for span in client.iter_spans(args.service, since, until, progress):
            if span.span_id in seen:
                continue
            if len(seen) >= _SEEN_LIMIT:
                seen.clear()
            seen.add(span.span_id)
            batch.append(span)
            if len(batch) >= 4096:
                yield batch
                batch = []
        yield batch
    finally:
        client.close()
    warnings.extend(client.stats.warnings(url) + client.warnings)


def _write(path: str, batches: Iterator[list[Span]], *, args: bool, source: str) -> ExportStats:
    if path == "-":
        return write_chrome_trace(batches, sys.stdout, args=args, source=source)
    try:
        with open(path, "w", encoding="utf-8") as fh:
            return write_chrome_trace(batches, fh, args=args, source=source)
    except BaseException as exc:
        if os.path.exists(path):
            os.remove(path)  # a half-written document is no timeline
        if isinstance(exc, OSError):
            raise LLMTraceError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def run_export(args: argparse.Namespace) -> int:
    src: str = args.source
    if not is_url(src) and (args.service or args.since or args.until):
        raise LLMTraceError("--service, --since and --until apply to a Jaeger URL; a file is exported whole")
    warnings: list[str] = []
    bar = Progress(
        f"exporting {src if len(src) <= 40 else '…' + src[-39:]}",
        enabled=False if args.quiet or args.output == "-" else None,
        unit="window" if is_url(src) else "bytes",
    )
    batches = _jaeger_batches(src, args, bar, warnings) if is_url(src) else _file_batches(src, bar, warnings)
    try:
        # Nothing made here is cyclic garbage (spans are freed by reference counting as
        # each batch is written): the collector's passes over every batch would be waste.
        with paused_gc():
            stats = _write(args.output, batches, args=not args.no_args, source=src)
    finally:
        bar.close()
    for w in warnings:
        print(f"llmtrace: warning: {w}", file=sys.stderr)
    if stats.spans == 0:
        raise LLMTraceError(f"{src}: no spans found (the output holds an empty timeline)")
    if not args.quiet and args.output != "-":
        print(
            f"wrote {args.output}: {stats.slices} slices, {stats.flows} step->request flows, {stats.counters} counter "
            f"samples, {stats.engines} engine(s) in {stats.processes - 1} process(es)"
            + (
                f"; {stats.unparented} spans whose parent never came are on their trace's track"
                if stats.unparented
                else ""
            )
            + (
                f"; {stats.adjusted} request phases outlasted their request (an abort): drawn inside it"
                if stats.adjusted
                else ""
            )
            + "\nopen it in https://ui.perfetto.dev or chrome://tracing",
            file=sys.stderr,
        )
    return 0
