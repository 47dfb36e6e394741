#!/usr/bin/env python3
"""Fuzz the trace readers with mutated real traces: every case must end in spans, a warning,
or one clear error line (an ``LLMTraceError``) — never another exception.

    python benchmarks/fuzz_readers.py                   # 10,000 file cases + 2,000 Jaeger API + carriers
    python benchmarks/fuzz_readers.py --cases 500 --start 20000
    python benchmarks/fuzz_readers.py --decoder generic # one decoder path (native | generic)
    python benchmarks/fuzz_readers.py --json            # one JSON line

The cases are tests/analysis/reader_fuzz.py's (seeded: case N is the same bytes everywhere);
the suite runs a few hundred of them (tests/analysis/test_fuzz_readers.py). The file cases go
through ``load_spans(path)``, the API cases through ``load_spans(url)`` against an
``httpx.MockTransport`` that answers with the mutated document, the carrier cases through
``propagation.extract``. Exit status 1 if any case escaped; each escape is printed with its
seed, so that ``--start SEED --cases 1`` replays it.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmtrace.analysis.sources import load_spans
from tests.analysis.reader_fuzz import carrier_case, case, jaeger_transport, outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=10_000, help="file cases (API cases: a fifth of it)")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--decoder", choices=["native", "generic"], default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.decoder:
        os.environ["LLMTRACE_ANALYSIS_DECODER"] = args.decoder
    logging.disable(logging.WARNING)  # every bad carrier is logged (once per site, and by OTel's parser)
    counts: dict[str, collections.Counter[str]] = {"file": collections.Counter(), "jaeger_api": collections.Counter(),
                                                   "carrier": collections.Counter()}
    escaped: list[str] = []
    started = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case"
        for seed in range(args.start, args.start + args.cases):
            the_case = case(seed)
            path.write_bytes(the_case.data)
            _run(counts["file"], escaped, the_case.name, lambda: load_spans(str(path)))
            if seed % 5 == 0:
                transport = jaeger_transport(the_case)
                _run(counts["jaeger_api"], escaped, the_case.name, lambda t=transport: load_spans(  # type: ignore[misc]
                    "http://jaeger.invalid:16686", transport=t, since_ns=0, until_ns=10**18))
            name, check = carrier_case(seed)
            _run(counts["carrier"], escaped, name, check)
    result = {"cases": {k: sum(v.values()) for k, v in counts.items()},
              "outcomes": {k: dict(v) for k, v in counts.items()}, "escaped": len(escaped),
              "cpu_s": round(time.process_time() - started, 1), "decoder": os.environ.get("LLMTRACE_ANALYSIS_DECODER",
                                                                                          "default")}
    for line in escaped:
        print(line, file=sys.stderr)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 1 if escaped else 0


def _run(counter: collections.Counter[str], escaped: list[str], name: str, read: object) -> None:
    try:
        counter[outcome(read)] += 1  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - an escape is the finding: report it, go on
        counter["escaped"] += 1
        where = traceback.extract_tb(exc.__traceback__)[-1]
        escaped.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]} ({where.filename}:{where.lineno})")


if __name__ == "__main__":
    sys.exit(main())
