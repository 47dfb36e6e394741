"""``llmtrace load``: options -> a LoadSpec -> run -> terminal / JSON / HTML report."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llmtrace.errors import LLMTraceError
from llmtrace.load.arrivals import (
    ARRIVALS,
    PROFILES,
    Burst,
    Lengths,
    assign_chaos,
    make_steps,
    parse_chaos_kinds,
    parse_levels,
    plan_open_loop,
)
from llmtrace.load.model import Slo, Step
from llmtrace.load.slo import parse_slo

if TYPE_CHECKING:  # the runner pulls in aiohttp: imported only when a load runs
    from llmtrace.load.runner import LoadSpec

DESCRIPTION = """\
Load an OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp, llmtrace's reference server)
and measure what it can take. Every request is a trace: a CLIENT span whose W3C traceparent
the server continues, so `llmtrace analyze` sees the client and the server in one trace.

Open loop (--qps): requests go out on a schedule drawn in advance (Poisson or constant), and
every latency counts from the request's intended send time, so a stalled server cannot hide
its latency (no coordinated omission). Closed loop (--concurrency): N clients, each sending
its next request when the last one ends.

profiles:
  steady     one rate or concurrency for --duration
  steps      one step per level for --step-duration each: --qps 1:64 doubles 1,2,4,...,64;
             --qps 1,2,8 or --concurrency 1:32 likewise. The report finds the capacity (the
             highest step whose p99 meets --slo) and the knee (where latency leaves its plateau)
  burst      steady --qps plus --burst-size requests at once every --burst-every seconds
  long-tail  steady arrivals; prompt and answer lengths log-normal (p99 ~10x the median)
  --chaos S  a share S of clients misbehave: hang up mid-stream, send malformed requests,
             read slowly (counted as chaos, never as server errors)
replay (--replay FILE, times scaled by --speed):
  llmtrace traces  any file `llmtrace analyze` reads: llm.request start times and token counts
  Mooncake JSONL   {"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}
                   (shared hash_ids become shared prompt prefixes, 512 tokens a block)
  Azure CSV        TIMESTAMP,ContextTokens,GeneratedTokens
Prompts are synthetic words, sized to the token counts with a calibration against the
server's own usage.prompt_tokens; no real prompt text is read or sent.
"""

EPILOG = """\
examples:
  llmtrace load http://localhost:8000 --qps 4 --duration 60
  llmtrace load http://localhost:8000 --profile steps --qps 1:64 --step-duration 30 \\
      --slo ttft=500ms,tpot=50ms --html load.html
  llmtrace load http://localhost:8000 --concurrency 1:32 --profile steps --endpoint chat
  llmtrace load http://localhost:8000 --replay mooncake_trace.jsonl --speed 2 --json run.json
  llmtrace load http://localhost:8000 --qps 8 --chaos 0.05 --profile long-tail
  llmtrace load --slo ttft=500ms,tpot=50ms,e2e=10s --alerts deploy/prometheus/alerts.yml
  llmtrace analyze llmtrace-load-traces.jsonl server-traces.jsonl   # client + server, joined

spans go to llmtrace-load-traces.jsonl (or --traces PATH), or where LLMTRACE_EXPORTER /
OTEL_EXPORTER_OTLP_ENDPOINT send them. Ctrl-C ends the run with the report of what was measured.
exit codes: 0 done, 2 bad input or server unusable, 130 interrupted (the report is still written)
"""


def add_load_parser(sub: Any, number: Callable[..., Callable[[str], Any]]) -> argparse.ArgumentParser:
    """The ``load`` subcommand's options (*number* is the CLI's bounded-number argparse type)."""
    positive = number(float, above=0.0)
    count, whole = number(int, at_least=1), number(int, at_least=0)
    p: argparse.ArgumentParser = sub.add_parser(
        "load", help="load an OpenAI-compatible server, every request traced; capacity under an SLO",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", nargs="?", metavar="URL", help="the server's base URL, e.g. http://localhost:8000")
    what = p.add_argument_group("what to send")
    what.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                      help="/v1/completions or /v1/chat/completions (default completions)")
    what.add_argument("--model", help="model name to request (default: the first of GET /v1/models)")
    what.add_argument("--no-stream", action="store_true", help="non-streamed requests (no TTFT/TPOT then)")
    what.add_argument("--input-tokens", type=count, default=256, metavar="N", help="prompt length (default 256)")
    what.add_argument("--output-tokens", type=count, default=128, metavar="N", help="answer length (default 128)")
    what.add_argument("--lengths", choices=("uniform", "fixed", "long-tail"), default="uniform",
                      help="length distribution around those values (default uniform +-25%%)")
    what.add_argument("--ignore-eos", action="store_true",
                      help="ask for exactly --output-tokens (vLLM/SGLang ignore_eos)")
    what.add_argument("--no-calibrate", action="store_true",
                      help="assume 1 token per word instead of probing the server's tokenizer")
    when = p.add_argument_group("when to send")
    when.add_argument("--profile", choices=PROFILES, default="steady", help="load shape (default steady)")
    when.add_argument("--qps", metavar="LEVELS", help="open loop: requests/s; steps: 1,2,8 or 1:64 (doubling)")
    when.add_argument("--concurrency", metavar="LEVELS", help="closed loop: clients; steps: as --qps")
    when.add_argument("--arrival", choices=ARRIVALS, default="poisson", help="open-loop gaps (default poisson)")
    when.add_argument("--duration", type=positive, default=30.0, metavar="S",
                      help="seconds of load for steady/burst/long-tail (default 30)")
    when.add_argument("--step-duration", type=positive, default=20.0, metavar="S",
                      help="seconds per step of --profile steps (default 20)")
    when.add_argument("--burst-size", type=count, default=20, metavar="N", help="requests per burst (default 20)")
    when.add_argument("--burst-every", type=positive, default=10.0, metavar="S", help="seconds between bursts")
    when.add_argument("--chaos", type=number(float, at_least=0.0, below=1.0), default=0.0, metavar="SHARE",
                      help="share of misbehaving clients, e.g. 0.05 (default 0)")
    when.add_argument("--chaos-kinds", default="disconnect,malformed,slow-reader", metavar="KINDS",
                      help="what chaos clients do, taken in turn (default disconnect,malformed,slow-reader)")
    when.add_argument("--replay", metavar="FILE", help="arrival times and lengths from a trace file")
    when.add_argument("--replay-format", choices=("auto", "llmtrace", "mooncake", "azure"), default="auto")
    when.add_argument("--speed", type=positive, default=1.0, help="replay time scale: 2 is twice as fast")
    when.add_argument("--prefix-block-tokens", type=count, default=512, metavar="N",
                      help="tokens per shared prompt block of a replayed trace's hash_ids (default 512, "
                           "Mooncake's; set it to the block size the trace was recorded with)")
    when.add_argument("--seed", type=whole, default=0, help="random seed of schedule and prompts (default 0)")
    how = p.add_argument_group("how")
    how.add_argument("--timeout", type=positive, default=300.0, metavar="S", help="per request (default 300)")
    how.add_argument("--max-connections", type=whole, default=0, metavar="N",
                     help="connection pool size; 0 = one per request in flight (default)")
    how.add_argument("--processes", type=count, default=1, metavar="N",
                     help="worker processes sending the load (for rates one process cannot drive)")
    how.add_argument("--api-key", help="bearer token (default: $OPENAI_API_KEY)")
    out = p.add_argument_group("report")
    out.add_argument("--slo", metavar="SPEC", help="objectives for goodput and capacity: ttft=500ms,tpot=50ms,e2e=10s")
    out.add_argument("--json", metavar="PATH", help='write the JSON report ("-" for stdout)')
    out.add_argument("--html", metavar="PATH", help="write the HTML report with plots")
    out.add_argument("--alerts", metavar="PATH", help="write Prometheus alert rules for --slo (URL optional)")
    out.add_argument("--traces", metavar="PATH", help="trace file of the CLIENT spans (default "
                     "llmtrace-load-traces.jsonl, or where LLMTRACE_EXPORTER says)")
    out.add_argument("--no-traces", action="store_true", help="send untraced requests")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress, no terminal report")
    return p


def _spec(args: argparse.Namespace, url: str) -> LoadSpec:
    from llmtrace.load.client import Target
    from llmtrace.load.runner import LoadSpec
    target = Target(base_url=url.rstrip("/").removesuffix("/v1"), endpoint=args.endpoint, model=args.model or "",
                    stream=not args.no_stream, timeout_s=args.timeout, ignore_eos=args.ignore_eos,
                    api_key=args.api_key or os.environ.get("OPENAI_API_KEY"))
    kinds = parse_chaos_kinds(args.chaos_kinds)
    common: dict[str, Any] = {"target": target, "chaos_share": args.chaos, "chaos_kinds": kinds,
                              "max_connections": args.max_connections, "processes": args.processes,
                              "seed": args.seed, "calibrate": not args.no_calibrate, "traces": not args.no_traces,
                              "traces_file": args.traces, "prefix_block_tokens": args.prefix_block_tokens}
    rng = random.Random(args.seed)
    if args.replay:
        from llmtrace.load.replay import load_replay

        planned = assign_chaos(load_replay(args.replay, args.replay_format, args.speed), args.chaos, kinds)
        span = planned[-1].at_s + 1e-9
        return LoadSpec(profile="replay", steps=(Step(0, 0.0, span),), planned=tuple(planned), **common)
    lengths = Lengths(args.input_tokens, args.output_tokens,
                      "long-tail" if args.profile == "long-tail" else args.lengths)
    if args.qps is not None and args.concurrency is not None:
        raise LLMTraceError("give --qps (open loop) or --concurrency (closed loop), not both")
    closed = args.concurrency is not None
    levels = parse_levels(args.concurrency if closed else (args.qps or "1"), integer=closed)
    if args.profile != "steps" and len(levels) > 1:
        raise LLMTraceError(f"several levels ({args.concurrency if closed else args.qps}) need --profile steps")
    duration = args.step_duration if args.profile == "steps" else args.duration
    steps = make_steps(levels, duration, closed_loop=closed)
    if closed:
        return LoadSpec(profile=args.profile, steps=steps, lengths=lengths, **common)
    burst = Burst(args.burst_size, args.burst_every) if args.profile == "burst" else None
    planned = plan_open_loop(steps, lengths, rng=rng, arrival=args.arrival, burst=burst, chaos_share=args.chaos,
                             chaos_kinds=kinds)
    return LoadSpec(profile=args.profile, steps=steps, planned=tuple(planned), **common)


def _write(path: str, text: str) -> None:
    from llmtrace.cli._analyze import write_text

    write_text(path, text)


def run_load_command(args: argparse.Namespace) -> int:
    slo = parse_slo(args.slo) if args.slo else Slo()
    if args.alerts:
        from llmtrace.load.alerts import render_alerts

        if slo.empty:
            raise LLMTraceError("--alerts needs --slo (e.g. --slo ttft=500ms,tpot=50ms,e2e=10s)")
        _write(args.alerts, render_alerts(slo))
        if not args.url:
            print(f"alert rules for SLO {args.slo}: {args.alerts}", file=sys.stderr)
            return 0
    if not args.url:
        raise LLMTraceError("URL is required (the server's base URL, e.g. http://localhost:8000)")
    try:
        from llmtrace.load.runner import run_load
    except ImportError as exc:
        raise LLMTraceError(f"`llmtrace load` needs {exc.name}: pip install 'llmtrace[load]'") from None

    spec = _spec(args, args.url)
    planned = f"{len(spec.planned)} requests" if spec.planned is not None else "closed loop"
    if not args.quiet:
        print(f"llmtrace load: {spec.profile}, {len(spec.steps)} step(s), {planned}", file=sys.stderr)

    def announce(target: Any, calibration: Any) -> None:
        if not args.quiet:
            tokens = (f"{calibration.tokens_per_word:.2f} tokens/word" if calibration.measured
                      else "prompts not calibrated")
            print(f"  {target.base_url}{target.path} model {target.model or '(unnamed)'}; {tokens}", file=sys.stderr)

    run = run_load(spec, live=False if args.quiet else None, on_preflight=announce)
    return _report(run, slo, args)


def _report(run: Any, slo: Slo, args: argparse.Namespace) -> int:
    from llmtrace.load.report import json_safe, summarize

    summary = json_safe(summarize(run, slo))
    if args.json:
        _write(args.json, json.dumps(summary, indent=2, allow_nan=False) + "\n")
    if args.html:
        from llmtrace.load.html import render_html

        _write(args.html, render_html(summary))
    if not args.quiet and args.json != "-":
        from llmtrace.load.terminal import render

        print(render(summary))
        for label, path in (("JSON", args.json), ("HTML", args.html)):
            if path:
                print(f"{label} report: {path}")
    return 130 if run.interrupted and "Ctrl-C" in run.interrupted else 0
