"""Engine-thread cost of step tracing, per step (budget: <= 20 µs).

A loop doing the llmtrace calls an engine makes each step — begin_step, four
phases, the batch of N requests, one token each, end_step — against the same
loop without them, in thread CPU time. Both ways of timing phases are measured:
``with step.phase(name):`` blocks and ``step.mark(name)`` boundaries. The span builder's work (on its own
thread, when the window closes) is reported separately.

    python benchmarks/bench_engine_step.py [--steps 2000] [--batch 16] [--repeat 5]
    python benchmarks/bench_engine_step.py --threads [--steps 4000] [--batch 16] [--repeat 3]

Each repeat times the bare loop and the traced loop back to back; the reported cost is
the median of the per-repeat differences (the spread is printed: this is a shared VM).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any


def _replace_oldest(engine: Any, ids: list[str], n: int) -> list[str]:
    """The oldest request finishes and a new one arrives: the batch changes (both loops rebuild
    the list; the traced one also ends and opens the records, as an engine does)."""
    done, ids = ids[0], [*ids[1:], f"n{n}"]
    if engine is not None:
        engine.tracker.finished(done, "length")
        engine.tracker.add(ids[-1])
    return ids


def run(steps: int, batch: int, traced: bool, marks: bool = False, report_builder: bool = False,
        churn: int = 0) -> tuple[float, float]:
    import llmtrace
    from llmtrace.lifecycle.builder import BUILDER

    engine = llmtrace.EngineTracer("bench") if traced else None
    ids = [f"r{i}" for i in range(batch)]
    if engine is not None:
        for rid in ids:
            engine.tracker.add(rid)
    sink = 0
    cpu_start = time.thread_time()
    start = time.perf_counter()
    for n in range(steps):
        if churn and n % churn == churn - 1:
            ids = _replace_oldest(engine, ids, n)
        if engine is None:
            sink += len(ids)
            continue
        step = engine.begin_step()
        if marks:  # the same phases through step.mark(): one call per boundary
            step.mark("schedule")
            sink += 1
            step.batch(ids, decode_tokens=batch, waiting=0, running=batch, kv_cache_usage=0.5)
            step.mark("forward")
            sink += 1
            step.mark("sample")
            sink += 1
            step.tokens()
            step.mark("postprocess")
            sink += 1
        else:
            with step.phase("schedule"):
                sink += 1
            step.batch(ids, decode_tokens=batch, waiting=0, running=batch, kv_cache_usage=0.5)
            with step.phase("forward"):
                sink += 1
            with step.phase("sample"):
                sink += 1
            step.tokens()
            with step.phase("postprocess"):
                sink += 1
        engine.end_step(step)
    elapsed = time.perf_counter() - start
    cpu = time.thread_time() - cpu_start
    if engine is not None and report_builder:
        built = time.perf_counter()
        engine.flush_window()
        BUILDER.flush(600)
        builder_us = (time.perf_counter() - built) / steps * 1e6
        print(f"span builder (its own thread, off the engine's path): {builder_us:.0f} µs per step "
              f"to build the step's spans ({4 + 1} spans and {batch} links)")
    return elapsed / steps * 1e6, cpu / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--churn", type=int, default=0, metavar="K",
                        help="every K steps one request finishes and another joins (0: the same batch "
                             "throughout). Continuous batching with outputs of L tokens at batch B changes "
                             "the batch about every L/B steps")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per step under valgrind instead (stable on a noisy host; slow)")
    parser.add_argument("--threads", action="store_true",
                        help="measure llmtrace's own threads instead: the span builder's and the file exporter's CPU "
                             "per step (windows of 200 steps written as OTLP/JSON, every window sampled)")
    parser.add_argument("--loop-only", choices=("with", "mark"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.instructions:
        count_instructions(args.batch, args.churn)
        return
    if args.threads:
        threads_per_step(args.steps, args.batch, args.repeat)
        return
    import llmtrace

    # One window holds every step: the timed loop measures the engine thread alone; the span
    # builder's work (on its own thread) is timed separately when the window is flushed.
    llmtrace.instrument(exporter="none", metrics=False, gpu="off", engine_window_steps=args.steps + 1,
                        engine_window_s=3600)
    if args.loop_only:  # one traced loop and nothing else, for count_instructions()
        run(args.steps, args.batch, traced=True, marks=args.loop_only == "mark", churn=args.churn)
        os._exit(0)  # skip the interpreter's teardown: its instructions would not cancel out
    for style, marks in (("with step.phase()", False), ("step.mark()", True)):
        costs = []
        for i in range(args.repeat):
            _, bare_cpu = run(args.steps, args.batch, traced=False, churn=args.churn)
            _, cpu = run(args.steps, args.batch, traced=True, marks=marks, report_builder=i == 0 and not marks,
                         churn=args.churn)
            costs.append(cpu - bare_cpu)
        costs.sort()
        print(f"engine thread, batch {args.batch}, churn {args.churn or 'none'}, phases by {style}: "
              f"{statistics.median(costs):.2f} µs CPU per "
              f"step for tracing (budget 20 µs; median of {args.repeat}, range {costs[0]:.2f}-{costs[-1]:.2f})")


def threads_per_step(steps: int, batch: int, repeat: int) -> None:
    """CPU per step of llmtrace's span builder and file exporter (``llmtrace.overhead_cpu_s()``, measured
    by those threads themselves): the engine step's cost off the engine's path, export included."""
    import tempfile

    import llmtrace

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["LLMTRACE_QUIET"] = "1"
        llmtrace.instrument(exporter=f"file:{os.path.join(tmp, 'spans.jsonl')}", metrics=False, gpu="off",
                            engine_window_steps=200, engine_window_s=3600)
        runs = []
        for _ in range(repeat + 1):  # the first: warm-up (imports, first-call caches)
            before = llmtrace.overhead_cpu_s()
            run(steps, batch, traced=True, marks=True)
            llmtrace.flush(600)
            after = llmtrace.overhead_cpu_s()
            runs.append({worker: (after[worker] - before[worker]) / steps * 1e6 for worker in after})
        llmtrace.shutdown()
    for worker in ("span_builder", "exporter"):
        values = sorted(r[worker] for r in runs[1:])
        print(f"batch {batch}: {worker} {statistics.median(values):.1f} µs CPU per step "
              f"(a step, four phases, {batch} links; median of {repeat}, range {values[0]:.1f}-{values[-1]:.1f})")


def count_instructions(batch: int, churn: int) -> None:
    """Instructions per step on the engine (main) thread: ``callgrind`` totals of runs of
    1,500 and 500 traced steps, differenced (start-up cancels out) and divided by 1,000 —
    stable where CPU time is not. The span builder's thread is left out, as in the CPU times."""
    import subprocess
    import sys

    from _callgrind import instructions_per_thread

    def total(steps: int, style: str) -> int:
        return instructions_per_thread([sys.executable, __file__, "--loop-only", style, "--steps", str(steps),
                                        "--batch", str(batch), "--churn", str(churn)])[1]  # 1: the main thread

    for style in ("with", "mark"):
        try:
            per_step = (total(1500, style) - total(500, style)) / 1000
        except subprocess.CalledProcessError as exc:  # an older llmtrace on PYTHONPATH: no step.mark()
            errors = [line for line in exc.stderr.splitlines() if "Error" in line] or ["see valgrind's output"]
            print(f"engine thread, batch {batch}, phases by {style}: failed ({errors[-1].strip()})")
            continue
        print(f"engine thread, batch {batch}, churn {churn or 'none'}, phases by {style}: "
              f"{per_step / 1000:.1f}k instructions per step "
              "(traced loop, including the loop itself)")


if __name__ == "__main__":
    main()
