"""``llmtrace compare SOURCE... --where SELECTION [--where OTHER]``: what explains a cohort."""

from __future__ import annotations

import argparse
import json

from llmtrace.analysis.cohort import compare_cohorts
from llmtrace.analysis.report.cohort import render_html, render_text, to_document
from llmtrace.analysis.selection import parse_selection
from llmtrace.cli._analyze import load_traceset, write_text
from llmtrace.errors import LLMTraceError


def run_cohorts(args: argparse.Namespace) -> int:
    if len(args.where) > 2:
        raise LLMTraceError("--where is given once (the selection vs the rest) or twice (two cohorts)")
    # Parsed before anything is read: a typo fails at once, not after a long load.
    selection = parse_selection(args.where[0])
    other = parse_selection(args.where[1]) if len(args.where) == 2 else None
    sources = [args.base] + ([args.current] if args.current else [])
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
