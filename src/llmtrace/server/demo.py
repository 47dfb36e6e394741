"""``llmtrace demo``: the reference server, traced, under ``llmtrace load`` — then the analysis.

1. instruments this process (spans where ``LLMTRACE_EXPORTER`` sends them when it is
   set, else to the ``--output`` file and to OTLP too when an endpoint is configured:
   :func:`demo_export`), starts the reference server on a free loopback port (API front
   end here, engine in its own process, which exports to the same places);
2. runs ``llmtrace load`` against it in this process: QPS steps from well below to past what
   the 2-core engine serves (so the report shows a capacity, a knee and the bottleneck
   moving), long-tail prompt lengths, most prompts opening with one of a few shared system
   prompts (prefix-cache hits), a few chaos clients; every request a CLIENT span above
   the server's SERVER span, into the same file;
3. prints the load report, stops the server (the engine flushes its spans), then runs
   ``llmtrace analyze`` on the file this run wrote — client and server joined — or says
   where the spans went when no file has them.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from llmtrace.config import resolve
from llmtrace.load.model import Chaos

#: Offered load per step, requests/s: the 2-core reference engine serves ~5-10/s, so the last
#: steps are past saturation.
DEMO_QPS = (1.0, 2.0, 4.0, 8.0, 16.0)
#: Share of chaos clients: hang-ups mid-stream and slow readers (malformed bodies are left to
#: `llmtrace load --chaos`: the demo's output is the analysis, not the server's log of junk).
CHAOS_SHARE = 0.04
CHAOS_KINDS = (Chaos.DISCONNECT, Chaos.SLOW_READER)
#: Median prompt/answer tokens, long-tailed, capped within the tiny model's 512 positions.
INPUT_TOKENS, OUTPUT_TOKENS = 48, 24
MAX_INPUT_TOKENS, MAX_OUTPUT_TOKENS = 300, 64
#: The demo's objectives: what the load report's goodput and capacity are measured against.
DEMO_SLO = "ttft=500ms,tpot=100ms"
DEFAULT_OUTPUT = "llmtrace-demo-traces.jsonl"
#: Shared system prompts: most requests open with one of a few (one prefix block each), as
#: an application's requests do, so the engine's prefix cache has hits to show and misses.
SYSTEM_PROMPTS, SYSTEM_PROMPT_SHARE, SYSTEM_PROMPT_TOKENS = 3, 0.75, 32
#: KV budget of the demo engine: 48 blocks of 16 tokens is less than 16 running requests
#: need at their longest, so the top steps force preemption. The modeled prefill cost per
#: computed prompt token (the reference engine recomputes every step) is what a hit saves.
DEMO_ENGINE = {"total_blocks": 48, "block_size": 16, "max_batch": 16, "prefill_token_delay_s": 0.0002}


def plan_demo(duration_s: float, max_requests: int | None, seed: int = 0) -> Any:
    """The demo's load: one QPS step per :data:`DEMO_QPS` level, *duration_s* in all."""
    from llmtrace.load.arrivals import Lengths, make_steps, plan_open_loop

    steps = make_steps(list(DEMO_QPS), duration_s / len(DEMO_QPS), closed_loop=False)
    lengths = Lengths(INPUT_TOKENS, OUTPUT_TOKENS, "long-tail", MAX_INPUT_TOKENS, MAX_OUTPUT_TOKENS)
    rng = random.Random(seed)
    planned = plan_open_loop(steps, lengths, rng=rng, chaos_share=CHAOS_SHARE, chaos_kinds=CHAOS_KINDS)
    planned = [replace(p, prefix_blocks=(rng.randrange(SYSTEM_PROMPTS),)) if rng.random() < SYSTEM_PROMPT_SHARE
               else p for p in planned]
    return steps, planned[:max_requests] if max_requests else planned


def _calibration() -> Any:
    """What each prompt piece costs in the reference server's own tokenizer (no probe requests,
    which would show up in the analysis as requests of their own)."""
    from llmtrace.load.prompts import LEAD, fit_calibration, piece_probes
    from llmtrace.server.app import TOKENIZER_CACHE
    from llmtrace.server.tiny_model import train_tokenizer

    tokenizer = train_tokenizer(cache_dir=TOKENIZER_CACHE)
    return fit_calibration(len(tokenizer.encode(LEAD)), [len(tokenizer.encode(text)) for text in piece_probes()])


def run_load_against(base_url: str, duration_s: float, max_requests: int | None, concurrency: int,
                     traces_file: str | None) -> dict[str, Any]:
    """``llmtrace load`` on the demo's plan, from a process of its own (this one serves the API,
    and a client sharing its event loop would measure itself); the load report's summary."""
    from llmtrace.load.client import Target
    from llmtrace.load.report import json_safe, summarize
    from llmtrace.load.runner import LoadSpec, run_load
    from llmtrace.load.slo import parse_slo
    from llmtrace.server.app import MODEL_NAME

    steps, planned = plan_demo(duration_s, max_requests)
    spec = LoadSpec(target=Target(base_url, model=MODEL_NAME, timeout_s=120.0), profile="steps", steps=steps,
                    planned=tuple(planned), max_connections=concurrency, traces_file=traces_file,
                    prefix_block_tokens=SYSTEM_PROMPT_TOKENS)
    run = run_load(spec, calibration=_calibration(), own_process=True)
    return dict(json_safe(summarize(run, parse_slo(DEMO_SLO))))


@dataclass(frozen=True)
class DemoExport:
    """Where the demo's spans go: the ``exporter`` option of both processes, the file the
    analysis reads (None: none has them) and whether the demo owns that file."""

    exporter: str
    file: str | None
    #: The demo's own file is replaced; a file the user named in LLMTRACE_EXPORTER is appended
    #: to (it may hold a service's traces), and only this run's traces in it are analysed.
    replace: bool
    endpoint: str | None = None

    def describe(self) -> str:
        """Where the spans go, in words: ``file /abs/x.jsonl and OTLP http://collector:4317``."""
        places = [self._place(item) for item in self.exporter.split(",") if item != "none"]
        return " and ".join(places) or "nowhere (LLMTRACE_EXPORTER=none)"

    def _place(self, item: str) -> str:
        if item.startswith("file:"):
            return f"file {item[5:]}"
        if item == "otlp":
            return f"OTLP {self.endpoint or '(the default endpoint)'}"
        return item


def demo_export(output: str | None, environ: Mapping[str, str]) -> DemoExport:
    """``--output`` names the file (the user's other exporters, e.g. ``otlp``, are kept); without
    it, ``LLMTRACE_EXPORTER`` is honoured as it stands; with neither, the demo's own file, and
    OTLP too when an endpoint is configured. Paths are made absolute for the engine process."""
    settings = resolve({}, environ)  # an invalid variable stops the demo here, before it starts
    if output is None and environ.get("LLMTRACE_EXPORTER"):
        exporters = [f"file:{os.path.abspath(item[5:])}" if item.startswith("file:") else item
                     for item in settings.exporters]
        path = os.path.abspath(settings.export_file) if settings.export_file else None
        return DemoExport(",".join(exporters) or "none", path, replace=False, endpoint=settings.endpoint)
    path = os.path.abspath(output or DEFAULT_OUTPUT)
    others = [item for item in settings.exporters if not item.startswith("file:")]
    return DemoExport(",".join([f"file:{path}", *others]), path, replace=True, endpoint=settings.endpoint)


def run_demo(args: argparse.Namespace) -> int:
    """Entry point of ``llmtrace demo`` (see ``llmtrace demo --help``)."""
    import llmtrace
    from llmtrace.load.terminal import render
    from llmtrace.server.app import create_app
    from llmtrace.server.runner import ServerThread

    export = demo_export(args.output, os.environ)
    if export.replace and export.file is not None and os.path.exists(export.file):
        os.remove(export.file)  # the analysis must see this run only
    started_ns = time.time_ns()
    os.environ.setdefault("LLMTRACE_QUIET", "1")
    llmtrace.instrument(exporter=export.exporter, service_name="llmtrace-demo", metrics_interval_s=5.0)
    levels = ", ".join(f"{q:g}" for q in DEMO_QPS)
    print(f"llmtrace demo: llmtrace load with QPS steps {levels} over ~{args.duration_s:.0f}s (long-tail prompts, "
          f"shared system prompts, a few chaos clients); traces -> {export.describe()}", file=sys.stderr)
    print("starting the reference server (API front end + engine process)...", file=sys.stderr)
    server = ServerThread(create_app(DEMO_ENGINE))
    base_url = server.start()
    try:
        summary = run_load_against(base_url, args.duration_s, args.requests, args.concurrency, export.file)
    finally:
        server.stop()  # the engine process flushes its spans before it exits
        llmtrace.flush(timeout_s=10.0)
    print(render(summary) + "\n")
    llmtrace.shutdown(timeout_s=10.0)
    return _analyse(export, args, started_ns)


def _analyse(export: DemoExport, args: argparse.Namespace, started_ns: int) -> int:
    """``llmtrace analyze`` on this run's traces in the file, or where they went instead."""
    if export.file is None:
        print(f"traces: sent to {export.describe()}; no file holds them, so there is nothing to analyse here "
              "(a Jaeger behind the collector: llmtrace analyze http://JAEGER:16686 --service llmtrace-demo; "
              "or add a file: --output demo.jsonl)")
        return 0
    # A file that also holds earlier traces: this run's start on.
    since = [] if export.replace else ["--since", f"{started_ns / 1e9:.6f}"]
    command = " ".join(["llmtrace analyze", export.file, *since])
    if args.no_analysis:
        print(f"traces: {export.file}\nanalyse them with: {command}")
        return 0
    from llmtrace.cli import build_parser

    argv = ["analyze", export.file, *since]
    for flag, value in (("--json", args.json), ("--html", args.html)):
        if value:
            argv += [flag, value]
    analyze_args = build_parser().parse_args(argv)
    code: int = analyze_args.func(analyze_args)
    print(f"\ntraces: {export.file}  ({command} --html report.html)")
    return code
