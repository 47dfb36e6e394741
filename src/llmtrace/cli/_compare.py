"""``llmtrace compare BASE CURRENT``: the regression gate."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from typing import Any

from llmtrace.analysis.compare import check_summary, compare
from llmtrace.analysis.sources import is_url
from llmtrace.analysis.sources._json import DecodeErrors, loads
from llmtrace.analysis.summary import SCHEMA, to_json
from llmtrace.cli._analyze import load_and_analyze, write_text
from llmtrace.errors import LLMTraceError, SourceError

#: A summary is small; only a file that starts like one and is under this size is read as
#: a summary candidate (a multi-GB trace file is never slurped to find out).
_SUMMARY_MAX_BYTES = 64 * 1024 * 1024


def _as_summary(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    """A saved summary is used as is; anything else is analysed as a trace source."""
    if (
        not is_url(spec)
        and spec != "-"
        and os.path.isfile(spec)
        and os.path.getsize(spec) < _SUMMARY_MAX_BYTES
    ):
        with open(spec, "rb") as fh:
            head = fh.read(256)
            if head[:2] != b"\x1f\x8b":
                data = head + fh.read(4096)
                if SCHEMA.encode() in data:  # our writer puts "schema" first
                    fh.seek(0)
                    try:
                        doc = loads(fh.read())
                    except DecodeErrors as exc:
                        raise SourceError(spec, f"malformed JSON summary: {exc}") from None
                    return dict(check_summary(doc, spec))
                if data.lstrip()[:1] == b"{" and (summary := _resorted_summary(data + fh.read(), spec)) is not None:
                    return summary
    return to_json(load_and_analyze([spec], args, quiet=args.quiet))


def _resorted_summary(data: bytes, spec: str) -> dict[str, Any] | None:
    """A summary re-saved with sorted keys (``jq -S``, ``json.dumps(sort_keys=True)``) has its
    "schema" near the end; anything else that is not one is left to the trace readers."""
    if SCHEMA.encode() not in data:
        return None
    try:
        doc = loads(data)
    except DecodeErrors:
        return None  # e.g. JSON lines: a trace file
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return None
    return dict(check_summary(doc, spec))


def run_compare(args: argparse.Namespace) -> int:
    if args.where:
        from llmtrace.cli._cohort import run_cohorts

        return run_cohorts(args)
    if args.html:
        raise LLMTraceError("--html applies to cohorts (--where); the regression gate writes --json")
    if args.current is None:
        raise LLMTraceError("compare needs BASE and CURRENT (or --where SELECTION to compare cohorts)")
    base = _as_summary(args.base, args)
    current = _as_summary(args.current, args)
    rows = compare(base, current, threshold=args.threshold, alpha=args.alpha)
    if args.json:
        doc = {
            "schema": "llmtrace.compare",
            "schema_version": 1,
            "base": args.base,
            "current": args.current,
            "threshold": args.threshold,
            "alpha": args.alpha,
            "regression": any(r.regression for r in rows),
            "metrics": [asdict(r) for r in rows],
        }
        write_text(args.json, json.dumps(doc, indent=2) + "\n")
    if not args.quiet and args.json != "-":
        from llmtrace.analysis.report.terminal import render_compare

        print(render_compare(rows, args.base, args.current))
    return 1 if any(r.regression for r in rows) else 0
