"""``llmtrace analyze``: sources -> model -> analysis -> terminal / JSON / HTML."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from llmtrace.analysis.build import build_traceset
from llmtrace.analysis.model import Span, TraceSet
from llmtrace.analysis.sources import is_url, load_spans, new_engine_table
from llmtrace.analysis.summary import Analysis, analyze, to_json
from llmtrace.cli._progress import Progress
from llmtrace.cli._timeparse import parse_time
from llmtrace.errors import LLMTraceError


def _window(args: argparse.Namespace) -> tuple[int | None, int | None]:
    since_arg, until_arg = getattr(args, "since", None), getattr(args, "until", None)
    try:
        since = parse_time(since_arg) if since_arg else None
        until = parse_time(until_arg) if until_arg else None
    except ValueError as exc:
        raise LLMTraceError(str(exc)) from None
    if since is not None and until is not None and since >= until:
        raise LLMTraceError(f"--since ({since_arg}) is not before --until ({until_arg})")
    return since, until


def load_traceset(sources: list[str], args: argparse.Namespace, *, quiet: bool) -> TraceSet:
    """Read every source into one trace set (shared with ``compare``)."""
    since, until = _window(args)
    spans: list[Span] = []
    warnings: list[str] = []
    table = new_engine_table()  # engine-side spans as compiled columns (None without llmtrace-native)
    for src in sources:
        label = src if len(src) <= 40 else "…" + src[-39:]
        bar = Progress(
            f"{'fetching' if is_url(src) else 'reading'} {label}",
            enabled=False if quiet else None,
            unit="window" if is_url(src) else "bytes",
        )
        try:
            loaded = load_spans(
                src,
                services=getattr(args, "service", None),
                since_ns=since,
                until_ns=until,
                limit=getattr(args, "limit", 1000),
                api=getattr(args, "api", "auto"),
                progress=bar,
                table=table,
            )
        finally:
            bar.close()
        spans.extend(loaded.spans)
        warnings.extend(loaded.warnings)
    ts = build_traceset(spans, warnings=warnings, skew=not getattr(args, "no_skew_adjust", False), table=table)
    if not ts.requests and not ts.engines:
        note = "no llm.request or llm.step spans found: is this an llmtrace-instrumented service?"
        ts = dataclasses.replace(ts, warnings=(*ts.warnings, note))
    return ts


def load_and_analyze(sources: list[str], args: argparse.Namespace, *, quiet: bool) -> Analysis:
    """Read every source, build one trace set, analyse it (shared with ``compare``)."""
    ts = load_traceset(sources, args, quiet=quiet)
    allowance = int(getattr(args, "overlap_allowance_ms", 0.0) * 1e6)
    return analyze(ts, source=", ".join(sources), overlap_allowance_ns=allowance)


def write_text(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise LLMTraceError(f"cannot write {path}: {exc.strerror or exc}") from None


def run_analyze(args: argparse.Namespace) -> int:
    analysis = load_and_analyze(list(args.sources), args, quiet=args.quiet)
    summary: dict[str, Any] = to_json(analysis)
    for w in summary["source"]["warnings"]:
        print(f"llmtrace: warning: {w}", file=sys.stderr)
    if args.json:
        write_text(args.json, json.dumps(summary, indent=2, allow_nan=False) + "\n")
    if args.html:
        from llmtrace.analysis.report.html import render_html

        write_text(args.html, render_html(to_json(analysis, include_views=True)))
    if not args.quiet and args.json != "-":
        from llmtrace.analysis.report.terminal import render

        print(render(summary, max_anomalies=args.anomalies))
        for label, path in (("JSON", args.json), ("HTML", args.html)):
            if path:
                print(f"{label} report: {path}")
    return 0
