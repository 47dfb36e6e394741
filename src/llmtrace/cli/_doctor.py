"""``llmtrace doctor``: llmtrace's configuration resolved as ``instrument()`` would resolve
it, then the machine checked against it (:mod:`llmtrace.gpu.doctor`).

Exit status: 0, or 1 when spans go to an OTLP collector that does not accept a
connection (they would be dropped).
"""

from __future__ import annotations

import argparse
import json

from llmtrace.config import resolve
from llmtrace.gpu.doctor import collect, render


def run_doctor(args: argparse.Namespace) -> int:
    """Entry point of ``llmtrace doctor`` (``args.json``, ``args.endpoint``)."""
    endpoint = getattr(args, "endpoint", None)
    settings = resolve({"endpoint": endpoint} if endpoint else {})  # a bad variable: ConfigError, exit 2
    report = collect(endpoint, exporters=settings.exporters)
    if getattr(args, "json", False):
        print(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        print(render(report))
    collector = report["collector"]
    return 0 if collector is None or collector["reachable"] else 1
