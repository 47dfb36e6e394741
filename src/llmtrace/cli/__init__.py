"""``llmtrace`` command line: analyze, compare, export, load, demo, doctor.

A thin layer over :mod:`llmtrace.analysis` (and the demo/doctor modules, imported only
when their subcommand runs). Any error a user can cause — a missing file, malformed JSON,
an unreachable Jaeger — ends as one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from llmtrace.errors import LLMTraceError

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3

_DESCRIPTION = """\
Trace LLM inference servers and find out why requests are slow.

examples:
  llmtrace analyze llmtrace-traces.jsonl.gz                 # a file from the embedded exporter
  llmtrace analyze http://localhost:16686 --service vllm --since 15m --html report.html
  llmtrace analyze traces.jsonl --json summary.json         # versioned JSON for CI / compare
  llmtrace compare baseline.json summary.json               # exit 1 on a significant regression
  llmtrace compare traces.jsonl --where 'ttft>p95'          # what the slowest 5% have in common
  llmtrace export traces.jsonl --format perfetto -o t.json  # timeline for ui.perfetto.dev
  llmtrace load http://localhost:8000 --profile steps --qps 1:32 --slo ttft=500ms   # capacity
  llmtrace demo --duration-s 20 --html demo.html            # run the reference server traced
  llmtrace doctor                                           # NVML, where spans go, integrations
"""

_ANALYZE_EPILOG = """\
SOURCE is one or more of:
  FILE[.gz]            OTLP JSON lines (llmtrace's file exporter, the collector's file
                       exporter), one OTLP/JSON document, or a saved Jaeger response
                       (/api/v3/traces or legacy /api/traces); "-" reads stdin
  http(s)://HOST:16686 a Jaeger query service (v3 API, legacy API as fallback)

examples:
  llmtrace analyze traces.jsonl
  llmtrace analyze requests.jsonl engine.jsonl.gz --html report.html
  llmtrace analyze http://jaeger:16686 --service llm-api --since 2h --until 1h --limit 2000
  llmtrace analyze traces.jsonl --json - | jq .bottleneck

exit codes: 0 ok, 2 bad input (unreadable source, malformed data, no spans)
"""

_COMPARE_EPILOG = """\
Two modes.

Regression gate: `compare BASE CURRENT`. BASE and CURRENT are JSON summaries written by
`llmtrace analyze --json`, or trace sources (analysed on the fly, same forms as
`analyze`). A latency metric regresses when it is worse by more than --threshold and a
one-sided Mann-Whitney U test on the per-request samples gives p < --alpha. GPU idle
ratio regresses when it grows by more than 5 points.

Cohorts: `compare SOURCE... --where SELECTION [--where OTHER]`. The requests of the
trace source(s) (read together) are split into the selection and the rest (or OTHER),
and every attribute value — prompt-length bucket, cached share of the prompt, preempted,
batch size and waiting count at arrival, engine, model, LoRA, service — is ranked by how
over-represented it is in the selection (effect: share among the selected minus share
among the others, in points; lift: their ratio), followed by a structural diff of the
two cohorts (phases and engine steps per request: added, removed, longer, shorter).

SELECTION is clauses joined by "and": FIELD OP VALUE, OP one of > >= < <= = !=.
  numeric: ttft e2e queue tpot (seconds; 250ms, 2s, or a percentile p95),
           input_tokens output_tokens, start (+60s from the first arrival, or Unix seconds)
  text:    service model engine lora trace request finish   (= and != only)

examples:
  llmtrace compare main.json pr.json
  llmtrace compare main.json traces.jsonl.gz --threshold 0.05 --json delta.json
  llmtrace compare traces.jsonl --where 'ttft>p95'                    # slowest 5% vs the rest
  llmtrace compare traces.jsonl --where 'start<+60s' --where 'start>=+60s'   # two windows
  llmtrace compare a.jsonl b.jsonl --where service=api-a --where service=api-b --html c.html

exit codes: 0 no regression (cohorts: done), 1 regression, 2 bad input or selection
"""


def _number(kind: Callable[[str], float], *, above: float | None = None, at_least: float | None = None,
            below: float | None = None) -> Callable[[str], Any]:
    """An argparse type: *kind* of the text, within the bounds, else a usage error saying which."""
    bounds = " and ".join(text for text in (f"> {above:g}" if above is not None else "",
                                            f">= {at_least:g}" if at_least is not None else "",
                                            f"< {below:g}" if below is not None else "") if text)

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number")
        if ((above is not None and not value > above) or (at_least is not None and not value >= at_least)
                or (below is not None and not value < below)):
            raise argparse.ArgumentTypeError(f"{text} is out of range: must be {bounds}")
        return value

    return parse


_POSITIVE_INT = _number(int, at_least=1)
_NON_NEGATIVE_INT = _number(int, at_least=0)


def _add_query_options(p: argparse.ArgumentParser, *, files_too: bool) -> None:
    """--service/--since/--until (which spans) and --limit/--api (how Jaeger is asked)."""
    where = "" if files_too else "Jaeger: "
    p.add_argument(
        "--service",
        action="append",
        metavar="NAME",
        help=f"{where}only traces touching this service (repeatable; Jaeger: default all services)",
    )
    p.add_argument("--since", metavar="TIME", help=f"{where}window start: 15m, 2h, 1d ago, RFC 3339 or Unix seconds")
    p.add_argument("--until", metavar="TIME", help=f"{where}window end (default: now)")
    p.add_argument(
        "--limit",
        type=_POSITIVE_INT,
        default=1000,
        metavar="N",
        help="traces per Jaeger query; full windows are split and re-fetched (default 1000)",
    )
    p.add_argument(
        "--api", choices=("auto", "v3", "legacy"), default="auto", help="Jaeger API (default auto)"
    )


def _add_analyze(sub: Any) -> None:
    p = sub.add_parser(
        "analyze",
        help="analyse traces from files or Jaeger",
        epilog=_ANALYZE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Critical path, phase breakdown, GPU idle gaps, bottleneck and anomalies.",
    )
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="trace file(s) or a Jaeger URL")
    _add_query_options(p, files_too=True)
    p.add_argument("--json", metavar="PATH", help='write the JSON summary ("-" for stdout)')
    p.add_argument("--html", metavar="PATH", help="write the self-contained HTML report")
    p.add_argument(
        "--overlap-allowance-ms",
        type=_number(float, at_least=0.0),
        default=0.0,
        metavar="MS",
        help="critical path: let a child overlap the next one by this much (default 0)",
    )
    p.add_argument(
        "--no-skew-adjust", action="store_true", help="do not shift cross-process children into parents"
    )
    p.add_argument("--anomalies", type=_NON_NEGATIVE_INT, default=5, metavar="N", help="anomalies shown in the report")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars, no report (files only)")
    p.set_defaults(func=_lazy("llmtrace.cli._analyze", "run_analyze"))


_EXPORT_EPILOG = """\
SOURCE is one trace file (same forms as `analyze`: OTLP JSON lines, an OTLP/JSON
document, a saved Jaeger response, .gz, "-" for stdin) or a Jaeger URL.

The output is Chrome Trace Event JSON; open it in https://ui.perfetto.dev or
chrome://tracing. One process per exporting service/process with a track per engine
(llm.step with its schedule/forward/sample/postprocess, llm.gc) and one for its
llm.engine windows; a process "llm requests" with a track per request (llm.request with
tokenize/queue/prefill/decode); flow arrows between each request and the steps that
served it (the steps' span links); counters per engine for running/waiting requests and
KV-cache usage, and per GPU for utilization, memory and power (from hw.gpu.* attributes).
Spans are written as they are read: memory stays bounded whatever the input's size.

examples:
  llmtrace export llmtrace-traces.jsonl.gz --format perfetto -o trace.json
  llmtrace export http://jaeger:16686 --service vllm --since 10m -o trace.json
  llmtrace export big.jsonl --no-args -o trace.json          # attributes left out: ~20% smaller

exit codes: 0 ok, 2 bad input (unreadable source, malformed data, no spans)
"""


def _add_export(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="convert traces to a Perfetto / chrome://tracing timeline",
        epilog=_EXPORT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write a trace source as a timeline: engines, steps, requests, flows and counters.",
    )
    p.add_argument("source", metavar="SOURCE", help="trace file or a Jaeger URL")
    p.add_argument("--format", choices=("perfetto",), default="perfetto",
                   help="perfetto: Chrome Trace Event JSON, read by Perfetto and chrome://tracing (default)")
    p.add_argument("-o", "--output", metavar="PATH", required=True, help='file to write ("-" for stdout)')
    p.add_argument("--no-args", action="store_true", help="leave span attributes out of the slices")
    _add_query_options(p, files_too=False)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no summary line")
    p.set_defaults(func=_lazy("llmtrace.cli._export", "run_export"))


def _add_compare(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="compare two runs; exit 1 on regression (CI gate)",
        epilog=_COMPARE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Per-metric deltas with a significance test, or what explains a cohort of requests.",
    )
    p.add_argument("base", metavar="BASE", help="baseline summary or trace source (cohorts: a trace source)")
    p.add_argument("current", metavar="CURRENT", nargs="?", help="current summary or trace source")
    p.add_argument("--where", action="append", metavar="SELECTION",
                   help="cohort mode: the requests to explain; a second --where is the cohort to compare against")
    p.add_argument("--html", metavar="PATH", help="cohort mode: write the comparison as a self-contained HTML page")
    p.add_argument(
        "--threshold", type=_number(float, at_least=0.0), default=0.10,
        help="relative worsening that fails (default 0.10)",
    )
    p.add_argument("--alpha", type=_number(float, above=0.0, below=1.0), default=0.05,
                   help="significance level (default 0.05)")
    p.add_argument("--json", metavar="PATH", help='write the comparison as JSON ("-" for stdout)')
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars, no table")
    p.set_defaults(func=_lazy("llmtrace.cli._compare", "run_compare"))


_DEMO_DESCRIPTION = """\
Trace a real (tiny) LLM server under load and show what the traces say — no GPU, no Docker.

It starts llmtrace's reference server on loopback — an OpenAI-compatible FastAPI front end and
a continuous-batching engine in its own process, running a random-weight GPT-2 with a KV-cache
budget small enough that the top load steps force preemption — instruments both with llmtrace,
and runs `llmtrace load` against it: QPS steps 1, 2, 4, 8, 16 (the last ones past what 2 cores
serve), long-tail prompt lengths, a few chaos clients. Every request is a CLIENT span above the
server's spans. Every span goes to an OTLP JSON lines file, --output (and also to an OTLP
collector when OTEL_EXPORTER_OTLP_ENDPOINT or LLMTRACE_ENDPOINT is set) — or, without
--output, where LLMTRACE_EXPORTER sends it when that is set. It prints the load report
(capacity under the SLO ttft=500ms,tpot=100ms, the knee), then the report of `llmtrace analyze`
on this run's spans in the file: latency, phase breakdown, critical path, GPU idle gaps, the
bottleneck, anomalies and the client-vs-server view per load step (with no file, the demo says
where they went)."""

_DEMO_EPILOG = """\
examples:
  llmtrace demo                                             # ~1 minute on 2 cores
  llmtrace demo --duration-s 10                             # a quick look
  llmtrace demo --duration-s 30 --concurrency 8 --html demo.html
  OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 llmtrace demo   # also to Jaeger via the collector
  LLMTRACE_EXPORTER=file:run.jsonl,otlp llmtrace demo              # appended to run.jsonl, and OTLP
  llmtrace analyze llmtrace-demo-traces.jsonl --json summary.json   # the traces again, later
"""


def _add_load(sub: Any) -> None:
    from llmtrace.cli._load import add_load_parser

    add_load_parser(sub, _number).set_defaults(func=_lazy("llmtrace.cli._load", "run_load_command"))


def _add_demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the reference server traced, with load, then analyse",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_DEMO_DESCRIPTION,
        epilog=_DEMO_EPILOG,
    )
    p.add_argument(
        "--duration-s",
        type=_number(float, above=0.0),
        default=40.0,
        help="load duration in seconds (default 40: about a minute in all on 2 cores)",
    )
    p.add_argument("--requests", type=_POSITIVE_INT, default=None, help="stop after this many requests")
    p.add_argument("--concurrency", type=_POSITIVE_INT, default=32,
                   help="most requests in flight at once: the client's connection pool (default 32)")
    p.add_argument("--output", metavar="PATH", default=None,
                   help="trace file to write, OTLP JSON lines, replaced (default: the file of LLMTRACE_EXPORTER "
                        "when that is set, appended to; else llmtrace-demo-traces.jsonl)")
    p.add_argument("--no-analysis", action="store_true", help="only produce traces")
    p.add_argument("--html", metavar="PATH", help="write the HTML report")
    p.add_argument("--json", metavar="PATH", help="write the JSON summary")
    p.set_defaults(func=_lazy("llmtrace.server.demo", "run_demo"))


def _add_doctor(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="check NVML, where spans go (a file, or a reachable collector) and installed integrations",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  llmtrace doctor\n  llmtrace doctor --endpoint http://otel:4317 --json\n",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--endpoint", metavar="URL", help="OTLP endpoint to check (default: from the environment)")
    p.set_defaults(func=_lazy("llmtrace.cli._doctor", "run_doctor"))


def _lazy(module: str, attr: str) -> Callable[[argparse.Namespace], int]:
    """Import a subcommand's implementation only when it runs (demo pulls in a server)."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise LLMTraceError(f"`llmtrace {args.command}` is not available: {exc}") from None
        return int(fn(args) or 0)

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmtrace", description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    from llmtrace import _version

    parser.add_argument("--version", action="version", version=f"llmtrace {_version.__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_analyze(sub)
    _add_compare(sub)
    _add_load(sub)
    _add_export(sub)
    _add_demo(sub)
    _add_doctor(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit code (also when called from tests)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except LLMTraceError as exc:
        print(f"llmtrace: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("llmtrace: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        if args.debug:
            raise
        print(
            f"llmtrace: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


__all__ = ["build_parser", "main"]
