"""``llmtrace compare SOURCE... --where SELECTION [--where OTHER]``: what explains a cohort."""

from __future__ import annotations

import argparse
import json
import os

from llmtrace.analysis.cohort import compare_cohorts
from llmtrace.analysis.report.cohort import render_html, render_text, to_document
from llmtrace.analysis.selection import parse_selection
from llmtrace.analysis.sources import is_url
from llmtrace.analysis.summary import SCHEMA
from llmtrace.cli._analyze import load_traceset, write_text
from llmtrace.errors import LLMTraceError


def _is_summary(spec: str) -> bool:
    """A saved ``analyze --json`` summary (our writer puts "schema" first)."""
    if is_url(spec) or spec == "-" or not os.path.isfile(spec):
        return False
    with open(spec, "rb") as fh:
        return SCHEMA.encode() in fh.read(256)


def run_cohorts(args: argparse.Namespace) -> int:
    if len(args.where) > 2:
        raise LLMTraceError("--where is given once (the selection vs the rest) or twice (two cohorts)")
    # Parsed before anything is read: a typo fails at once, not after a long load.
    selection = parse_selection(args.where[0])
    other = parse_selection(args.where[1]) if len(args.where) == 2 else None
    sources = [args.base] + ([args.current] if args.current else [])
    for src in sources:
        if _is_summary(src):
            raise LLMTraceError(f"{src}: an analysis summary holds no requests to split; give --where trace sources")
    ts = load_traceset(sources, args, quiet=args.quiet)
    if not ts.requests:
        raise LLMTraceError(f"{', '.join(sources)}: no llm.request spans: nothing to split into cohorts")
    result = compare_cohorts(ts, selection, other)
    label = ", ".join(sources)
    if args.json:
        write_text(args.json, json.dumps(to_document(result, label), indent=2) + "\n")
    if args.html:
        write_text(args.html, render_html(result, label))
    if not args.quiet and args.json != "-":
        print(render_text(result, label))
    return 0
